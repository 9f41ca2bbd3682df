"""One run in a worker process, seen from the host (the parts of :mod:`.pool`
that live as long as a run).

:class:`Begun` is a program started in a worker, waiting for its host;
:class:`Remote` is its steps as :func:`~nous_sched.runtime.engine.drive`
calls them (frames to the worker, answers read back within the deadline,
the worker killed at it); :class:`Relay` sends a run's settles from the
thread that commits the call. What they reach in their
:class:`~nous_sched.runtime.pool.WorkerPool` is declared (:class:`Places`).
"""

from __future__ import annotations

import contextvars
import functools
import json
import math
import os
import select
import signal
import threading
import time
from typing import Any, NoReturn, Optional, Protocol, Sequence

from .._interrupts import LOCAL, deferred, leave
from ..errors import RunCodeError
from ..result import RunError
from . import Cancel, Host, Limits, PendingCall, RuntimeOutcome, worker
from ._handoffcore import HandoffCore
from ._relaycore import IDLE, SENT, RelayCore
from .engine import (
    CANCELLED,
    CLOCK_MARK,
    NOT_STEPPED,
    QUIET,
    Advance,
    Finish,
    Stopped,
    clip,
    cpu_message,
    drive,
    memory_message,
    names_keyed,
    timeout_message,
)
from .poolcore import FRESH, PoolCore
from .procio import CpuSpent, CpuWatch, Died, Expired, Garbled, NotStarted, Worker, ms, poll_seconds
from .wake import WakePolicy

__all__ = ["Begun", "Lost", "Places", "Relay", "Remote", "max_frame", "settle_frame"]

_MIB = 1024 * 1024
_KINDS_FROM_WORKER = frozenset({"exception", "timeout", "abort", "cpu_time"})
#: How often the host repeats the deadline (or cancel) signal until the worker
#: answers. The worker ignores a deadline signal that arrives before *its*
#: deadline, which is later than the host's by the run frame's transit, and one
#: that arrives before the run is armed: a single signal is easily lost.
RESIGNAL = 0.05
#: What a durable run's envelope may carry beside what :func:`max_frame`
#: counts: the clock values it read (``Date.now()``, ``Math.random()``), each
#: at most about 25 bytes of JSON, of which a durable run may read 100,000.
CLOCK_ALLOWANCE = 4 * _MIB
#: What one call costs an envelope beside its arguments: its id, its name (the
#: prelude cuts it at 1024 characters, each escaped in at most 6 bytes), its
#: call site (a durable run's), the brackets and commas.
_PER_CALL = 6 * 1024 + 64


class Places(Protocol):
    """What a run reaches in its :class:`~nous_sched.runtime.pool.WorkerPool`
    (whose comments say what each guards): its private state, shared inside
    this package only."""

    #: Seconds past a run's deadline (or its cancel) before its worker is killed (the pool's option).
    kill_grace: float
    _lock: threading.Lock
    _core: PoolCore
    _wake: WakePolicy

    def _cap(self, limits: Limits) -> int: ...

    def _acquire(
        self, ticket: int, need: int, limits: Limits, deadline: float, cancel: Optional[Cancel], domain: Any
    ) -> tuple[int, Worker]: ...

    def _release(self, wid: int, domain: Any, reusable: bool) -> None: ...

    def _drop(self, ticket: Optional[int]) -> None: ...

    def _orphaned(self, ticket: Optional[int]) -> None: ...

    def _share(self, ticket: int, limits: Limits, deadline: float, cancel: Optional[Cancel]) -> None: ...

    def _try_share(self, ticket: int) -> bool: ...

    def _give_share(self, ticket: Optional[int]) -> None: ...

    def _resume(self, ticket: Optional[int]) -> None: ...

    def _calm(self, ticket: Optional[int]) -> None: ...

    def _begun(self, ticket: int) -> None: ...


class Lost(Exception):
    """The worker died before the program's first answer (see ``Remote.start``)."""


class Begun:
    """A program started in a worker by :meth:`WorkerPool.begin`, waiting for its host."""

    def __init__(
        self,
        pool: Places,
        remote: Optional["Remote"],
        limits: Limits,
        deadline: float,
        cancel: Optional[Cancel],
        domain: Any,
        early: Optional[Finish] = None,
        ticket: Optional[int] = None,
    ) -> None:
        self._pool = pool
        self._ticket = ticket
        self._remote = remote
        self._limits = limits
        self._deadline = deadline
        self._cancel = cancel
        self._domain = domain
        self._early = early  # how it ended before it began (no worker in time, cancelled)

    def run(self, host: Host) -> RuntimeOutcome:
        """Drive the program to its end with ``host``, on the calling thread."""
        remote, self._remote = self._remote, None
        if remote is None:
            if self._early is None:
                raise RuntimeError("this run was already driven or abandoned")
            return runtime_outcome(self._early)
        try:
            finish = drive(remote, host, self._limits, self._deadline, self._cancel)
            remote.relay.close()  # before the worker goes back: no settle is written after this
            # After any abort (memory, stack, a tampered bridge) the worker is retired.
            reusable = remote.reusable and (finish.error is None or finish.error[0] not in ("abort", "cancelled"))
            self._pool._give_share(self._ticket)  # noqa: SLF001  (each step gives its own back; whatever path ended it)
            self._pool._release(remote.wid, self._domain, reusable)  # noqa: SLF001
            # It holds nothing now: the abandon() that follows every run (run_code's
            # wind-down) has nothing to drop, and wakes nothing for it.
            self._ticket = None
        except BaseException:
            # KeyboardInterrupt (or a host bug): the worker may be mid-step. Kill
            # it, replace it later, and let the exception go on at once.
            LOCAL.depth += 1
            try:
                remote.relay.close()
                self._pool._drop(self._ticket)  # noqa: SLF001
            finally:
                leave()
            raise
        return runtime_outcome(finish)

    def abandon(self) -> None:
        """Never drive it: its worker is killed (the answer it is writing will never
        be read) and replaced. Idempotent."""
        with deferred():
            remote, self._remote = self._remote, None
            if remote is not None:
                remote.relay.close()
            # (Also when run() was cut before its first step: the ticket
            # still holds the worker. After a run that ended, it holds nothing.)
            self._pool._drop(self._ticket)  # noqa: SLF001

    def __del__(self) -> None:
        # Never driven nor abandoned: an interrupt landed between begin()
        # returning it and the caller keeping it. Its worker goes, later if
        # the pool's lock is taken (this may run inside the garbage collector).
        remote = getattr(self, "_remote", None)
        if remote is not None:
            self._remote = None
            remote.relay.close()
            self._pool._orphaned(self._ticket)  # noqa: SLF001


def runtime_outcome(finish: Finish) -> RuntimeOutcome:
    error = None if finish.error is None else RunError(*finish.error)
    return RuntimeOutcome(finish.logs, result=finish.result, error=error)


def max_frame(limits: Limits) -> int:
    """The largest frame a worker may send for a run with ``limits``: what the
    run's limits let cross (see ``prelude.js``), never more than the engine's
    heap could hold as UTF-8 (twice its size), plus 1 MiB of envelope (error
    messages, a durable run's clock values). What crosses: the logs (each
    character escaped in at most 6 bytes, each line's quotes and comma), the
    result (sent as it is, at most 3 bytes a character), and at most
    ``max_calls`` + 1 calls (the prelude refuses the rest) whose arguments
    together are at most ``max_total_args_bytes`` characters (3 bytes each).
    A frame over it is refused at its header, before its body is read."""
    logs = 6 * limits.max_log_bytes + 3 * limits.max_log_lines
    calls = 3 * limits.max_total_args_bytes + (limits.max_calls + 1) * _PER_CALL
    crossing = logs + 3 * limits.max_output_bytes + calls
    return min(crossing, 2 * limits.memory_bytes) + _MIB


def settle_frame(batch: Sequence[Sequence[Any]]) -> bytes:
    """The ``S`` frame settling ``batch``: per call ``b"<id> <1|0> <bytes> "``,
    then its payload's bytes (see :mod:`.worker`)."""
    if len(batch) == 1:  # a lone call's (every sequential await): the frame made in one join
        item = batch[0]
        data = item[4].encode("utf-8", "surrogatepass")
        head = b"%d %d %d " % (item[0], item[3], len(data))
        return b"".join((worker.HEADER.pack(len(head) + len(data) + 1), worker.SETTLE, head, data))
    # A batch of short ASCII payloads (every JSON the crossing makes is ASCII):
    # one text, encoded once, its lengths those of the strs; else each in bytes.
    texts: list[str] = []
    for item in batch:
        payload = item[4]
        if len(payload) > _SHORT or not payload.isascii():
            return _settle_frame_bytes(batch)
        texts += (str(item[0]), " 1 " if item[3] else " 0 ", str(len(payload)), " ", payload)
    body = "".join(texts).encode()
    return b"".join((worker.HEADER.pack(len(body) + 1), worker.SETTLE, body))


def _settle_frame_bytes(batch: Sequence[Sequence[Any]]) -> bytes:
    """:func:`settle_frame`'s batch, each payload encoded on its own (a long or non-ASCII one)."""
    parts: list[bytes] = []
    for item in batch:
        data = item[4].encode("utf-8", "surrogatepass")
        parts += (b"%d %d %d " % (item[0], item[3], len(data)), data)
    return worker.frame(worker.SETTLE, *parts)


#: A payload longer than this goes by :func:`_settle_frame_bytes` (copied once less).
_SHORT = 4096


class _Deferred:
    """``with`` it: ``lock`` held inside a deferred step (an interrupt landing
    as the block ends is raised once the lock is let go)."""

    __slots__ = ("lock",)

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock

    def __enter__(self) -> None:
        LOCAL.depth += 1
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()
        leave()


#: What the host's driver handed back (Relay.back's kinds), and lend's "go on as before".
_RAISED = "raised"
_STEPPED = "stepped"
_TEXT = "text"
_OURS: Any = object()


class Relay(RelayCore):
    """A run's settles sent by the thread that commits the call: no hop
    through the thread that drives the run.

    :func:`~nous_sched.runtime.engine.drive`, with nothing committed to
    settle, asks the oldest outstanding call to call :meth:`kick` when it
    settles (``PendingCall.on_done``: a :class:`~nous_sched.Ticket` can) and,
    if it can, calls :meth:`settled`, which arms the relay and waits on the
    worker's pipe. Whichever thread publishes that call (the scheduler's
    driver as it commits; ``stop()`` releasing it) calls :meth:`kick`, which takes the committed prefix as it stands (the calls
    that commit while the worker works go in the next batch, which the
    driving thread sends as soon as it has read the answers), encodes it and
    writes the frame to the worker's pipe, then returns: the worker wakes,
    settles, answers, and the driving thread wakes once, to read the answers.

    **The committing thread never waits on the worker.** The write is
    non-blocking, into a pipe that is empty (the batch's first frame: the
    worker reads a frame whole before it answers), so any frame the pipe can
    hold goes in one write whatever the worker is doing, stuck or stopped.
    **A burst joins the batch in flight** (:meth:`more`): when the newest
    outstanding call commits before the driving thread has collected the
    batch, the calls behind the batch (all committed then) are written by
    the thread that commits it, as a frame of its own, only if it goes whole
    (at most ``PIPE_BUF`` bytes, which a pipe takes all or nothing); else
    they wait for the driving thread, as before. The worker settles the
    frames in order, and the driving thread reads one answer per call of the
    whole batch: a ``Promise.all`` whose last calls end while the worker
    settles its first ones is not held at the worker's first answer. Whatever it cannot finish (a frame larger than the
    pipe's buffer, a payload the worker must not get, an error), it hands to
    the driving thread: :attr:`handoff`, and a byte on the wake pipe; that
    thread sends the rest with the deadline and kill as any step's
    (:meth:`Remote.answers`). It never raises into the driver.

    On the main thread every hold of ``lock`` by the driving thread is a
    deferred step (:attr:`held`, :mod:`nous_sched._interrupts`): an interrupt
    landing as a ``with`` block ends, before its lock is let go, would leave
    the lock held for good, and the next kick, or ``close()``, waiting on it
    forever. A kick's holds are deferred steps wherever it runs (the thread
    that commits: the scheduler's driver; or ``stop()`` on any thread).

    Every decision (when a kick acts, what the driving thread collects) is
    the relay core's (:class:`~nous_sched.runtime._relaycore.RelayCore`, whose
    fields this shares: its invariants, per field, are written there and
    checked by a state machine test). ``lock`` guards them, the hand-off's
    :attr:`unsent` and the writes: a frame is written exactly when the
    driving thread is waiting for its answer, never after the run has moved
    on. (One exception: the driving thread arms without it, a single store
    made while the state is ``IDLE``, which no kick changes.)

    **The reader lent** (:meth:`lend`). With a host that can read for the
    run (``Host.attach_reader``: ``run_code``'s scheduler's driver), the
    driving thread lends that thread the worker's pipe and sleeps on the
    wake pipe alone: the driver reads each answer and, if it only starts
    tool calls, steps it (the engine's ``advance``, in the caller's
    contextvars) and arms the relay for the next call itself, so a
    sequential call wakes the driver, the tool thread, the driver and the
    worker, and no thread of the run's. Who reads is the hand-off core's
    decision (:class:`~nous_sched.runtime._handoffcore.HandoffCore`, under
    ``lock``): anything else (an end, a question, a stop, a split or
    garbled frame, the end of file, a kick's hand-off) goes back to the
    driving thread, which goes on as above, as do its deadline, a cancel
    and an interrupt, once any step the driver is in has ended. (The
    driver arms without the lock too, the same single store.)
    """

    __slots__ = (
        "remote",
        "lock",
        "held",
        "deferred",
        "main",
        "take",
        "unsent",
        "wake",
        "head",
        "hand",
        "advance",
        "context",
        "back",
        "texts",
        "woken",
        "waits",
        "follow",
        "reading",
        "behind",
        "frames",
    )

    def __init__(self, remote: "Remote") -> None:
        super().__init__()
        self.remote = remote
        self.lock = threading.Lock()
        # The lock as a deferred step, for the main thread (the one an interrupt can land on).
        self.deferred = _Deferred(self.lock)
        self.main = threading.main_thread().ident
        # What the driving thread holds the lock through: on the main thread a
        # deferred step; elsewhere the bare lock, at no cost.
        self.held: Any = self.deferred if threading.get_ident() == self.main else self.lock
        self.take: Any = None
        self.unsent: Optional[memoryview] = None  # what the write left, or None: the whole frame
        self.wake = (-1, -1)
        # The hand-off of the worker's reader to the host's driver (lend):
        # the head waited for (the driver moves it on as it steps), who reads
        # (hand, under lock), the step and the caller's context the driver
        # runs it in, and what the driver handed back (back: written by the
        # driver before its step ends, read by the run's thread once it has
        # collected the reader); texts: an answer read but not stepped.
        self.head: Any = None
        self.hand = HandoffCore()
        self.advance: Optional[Advance] = None
        self.context: Optional[contextvars.Context] = None
        self.back: Any = None
        self.texts: Optional[list[str]] = None
        self.woken: Any = None  # select.poll over the wake pipe alone, made with it
        self.waits = 0  # the run's waits so far: the first is never lent (see settled)
        # The newest call behind the batch sent, whose commit joins them all to it (on_done: more), or None.
        self.follow: Any = None
        # The host's driver has read the lone batch's answer and not yet collected the batch: nothing joins it.
        self.reading = False
        # The calls outstanding behind a batch (the taker's deque, read while the driving thread waits), or None.
        self.behind: Any = None
        self.frames = 1  # the frames the batch sent went in (more than one: joined in flight), until read

    def settled(
        self, take: Any, head: PendingCall, advance: Optional[Advance] = None, attach: Any = None
    ) -> Optional[list[Any]]:
        """Wait for ``head`` to commit and its batch to be sent; the batch
        (``[]``: the deadline came first, nothing sent). :class:`Stopped` on
        cancel or the worker's end before anything was sent. With
        ``advance`` and ``attach``, the host's driver may read and step the
        answers meanwhile (:meth:`lend`): ``None``, they were stepped."""
        remote = self.remote
        if self.wake[0] < 0:
            with deferred():  # a pipe made is a pipe close() closes
                r, w = self.wake = os.pipe()
                os.set_blocking(r, False)
                os.set_blocking(w, False)
                self.woken = select.poll()
                self.woken.register(r, select.POLLIN)
        if take is not self.take:  # (one taker a run: what it reads, looked up once)
            self.take = take
            self.behind = getattr(take, "outstanding", None)
        self.head = head
        # Armed without the lock: one store, made while the state is IDLE,
        # which no kick changes (a kick acts only once it reads ARMED, under
        # the lock). So a kick sees the relay armed or not, never half of it.
        self.arm()
        try:
            if head.done():  # published before the hook was set: no one else will kick
                self.kick()
            # The first wait is this thread's: a run whose first answer ends it
            # (most one-call runs) pays nothing for a lend it would not use.
            # With a CPU budget, this thread watches the worker's CPU itself.
            self.waits += 1
            if advance is not None and self.waits > 1 and remote.worker.cpu_watch is None:
                got = self.lend(advance, attach)
                if got is not _OURS:
                    return got  # type: ignore[no-any-return]
            return self._watch()
        finally:
            self.head.on_done(None)
            self.head = None
            if self.state is not IDLE:  # (once IDLE, as the answers' take leaves it, no kick changes it)
                with self.held:
                    self.release()

    def _watch(self) -> list[Any]:
        """:meth:`settled`'s wait on this thread: the worker's pipe and the wake pipe."""
        remote = self.remote
        while True:
            if self.state is SENT:  # (also as it begins: after a lend, its wake was read already)
                return self._taken()
            try:
                spoke = remote.worker.wait_readable(remote.deadline, remote.cancel, self.wake[0])
            except Expired:
                if self._disarm():
                    return []
                return self._taken()
            except Stopped:  # cancelled
                if self._disarm():
                    raise
                return self._taken()  # the answers' own wait sees the cancel
            if self.state is SENT:
                continue
            if spoke and self._disarm():
                # Answering nothing: its end of file, or a broken protocol.
                remote._answer()  # noqa: SLF001
                remote._broken()  # noqa: SLF001

    def lend(self, advance: Advance, attach: Any) -> Any:
        """Lend the worker's reader to the host's driver while this thread
        sleeps (:mod:`._handoffcore`): the driver reads each answer and
        steps it with ``advance`` (:meth:`_readable`), in the context this
        thread had. Back here at the driver's hand-back, the deadline, a
        cancel, an interrupt or a wake (a kick that could not finish): the
        batch whose answer the driver read but did not step (its text in
        :attr:`texts`); ``None``, the driver stepped the answers; what the
        step raised, raised; else ``_OURS``: this thread goes on as before."""
        self.advance = advance
        self.context = contextvars.copy_context()
        hand = self.hand
        with self.held:
            hand.attach()
        lent = False
        try:
            lent = attach(self.remote.worker.fd_out, self._readable, self._gone)
        finally:
            if not lent:
                with self.held:
                    hand.take_back("not lent")
        if lent:
            self._until_returned()
        with self.held:
            hand.collect()
        self.advance = self.context = None
        back, self.back = self.back, None
        if back is None:
            return _OURS
        kind, value = back
        if kind is _RAISED:
            raise value
        if kind is _STEPPED:
            return None
        batch, text = value
        self.texts = [text]
        return batch

    def _until_returned(self) -> None:
        """Sleep until the reader is back (the driver's hand-back), or take it
        back (the deadline, a cancel, an interrupt, a wake), waiting out a
        step the driver is in."""
        remote = self.remote
        hand = self.hand
        try:
            while True:
                reason = "woken"
                try:
                    self._sleep(remote.deadline, remote.cancel)
                except Expired:
                    reason = "deadline"
                except Stopped:
                    reason = "cancel"
                with self.held:
                    if hand.take_back(reason):
                        return
                while True:  # the driver steps: its end wakes this thread (bounded by the step)
                    self._sleep(math.inf, None)
                    with self.held:
                        if hand.take_back("woken"):
                            return
        except BaseException:  # an interrupt: the driver never reads again (after the step it is in)
            with deferred(), self.lock:
                hand.take_back("interrupt")
            raise

    def _sleep(self, until: float, cancel: Optional[Cancel]) -> None:
        """Until the wake pipe has a byte (read); :class:`Expired` past ``until``, :class:`Stopped` on cancel."""
        poll = self.woken.poll
        while True:
            timeout = poll_seconds(until, cancel)
            if poll(ms(timeout) if timeout != math.inf else None):
                try:
                    os.read(self.wake[0], 64)
                except BlockingIOError:
                    pass
                return

    def _readable(self) -> bool:
        """(The host's driver.) The worker's pipe has data: read and step it
        if the reader is the driver's; whether the driver keeps reading."""
        with self.lock:
            if not self.hand.readable():
                return False
        back: Optional[str] = "raised"
        try:
            assert self.context is not None
            back = self.context.run(self._step)
        except BaseException as exc:  # the run's thread raises it, as if it had stepped
            self.back = (_RAISED, exc)
        with self.lock:
            wake = self.hand.step_done(back)
            if wake:
                self._wake()
        return not wake

    def _gone(self) -> None:
        """(The host's driver, leaving: its scheduler stopped.) The reader goes back to the run's thread."""
        with self.lock:
            if self.hand.left():
                self._wake()

    def _step(self) -> Optional[str]:
        """(The host's driver, in the caller's context.) One answer read and
        stepped; ``None`` to go on reading, else why the run's thread takes over."""
        remote = self.remote
        w = remote.worker
        # The read under the lock, as a kick's write: close() (the run's end, or an interrupt
        # that did not wait for this step) releases the relay under it before the worker's
        # pipes are closed, so this never reads a descriptor closed, or reused, meanwhile.
        with self.lock:
            if self.state is not SENT or self.handoff or self.error is not None or len(self.batch) != 1:
                return "not a lone batch sent"  # (the worker spoke unasked: its end, a stop; or the run is over)
            if w.buf:
                return "bytes left"
            try:
                data = os.read(w.fd_out, 65536)
            except BlockingIOError:
                return None
            self.reading = True  # (its one answer is read: no call joins the batch now)
        if len(data) < 5 or worker.HEADER.unpack_from(data)[0] != len(data) - 4 or data[4:5] != worker.ENVELOPE:
            w.buf += data  # a stop, a split or garbled frame, the end of file: the run's thread reads it
            return "not a whole envelope"
        text = data[5:].decode("utf-8", "surrogatepass")
        with self.lock:
            batch, _ = self.taken()
            if self.follow is not None or self.reading:
                self._unfollow()
        remote.pool._give_share(remote.ticket)  # noqa: SLF001  (the kick's, as answers gives it back)
        assert self.advance is not None
        head = self.advance(text, batch)
        if head is NOT_STEPPED:
            self.back = (_TEXT, (batch, text))
            return "not stepped"
        if head is None:
            self.back = (_STEPPED, None)
            return "stepped"
        # The next wait, as settled begins it.
        self.head = head
        self.arm()
        if head.done():
            self.kick()
        return None

    def _disarm(self) -> bool:
        """Take the worker back from the kicks; whether no batch was taken."""
        with self.held:
            return self.disarm()

    def _taken(self) -> list[Any]:
        """The batch a kick took; what it raised, raised here."""
        with self.held:
            batch, error = self.taken()
            if self.follow is not None or self.reading:
                self._unfollow()
        if error is not None:
            raise error
        return batch

    def answers(self, batch: Sequence[Any]) -> list[str]:
        """The envelopes answering ``batch``, which :meth:`settled` sent (:meth:`Remote.answers`),
        or whose answer the host's driver read but did not step."""
        texts = self.texts
        if texts is not None:
            self.texts = None
            return texts
        return self.remote.answers(batch)

    def kick(self) -> None:
        """The head has committed (on the thread that published it): send the
        batch, or hand it to the driving thread. Never blocks, never raises."""
        try:
            # A deferred step only on the main thread, where an interrupt can land
            # (the scheduler's driver, the usual kicker, takes the bare lock).
            with self.deferred if threading.get_ident() == self.main else self.lock:
                if self.kicked(self.take, self._write):
                    self._wake()
                elif self.behind:  # (a lone call's kick, every sequential await: nothing behind it)
                    self._follow()
        except BaseException as exc:  # (an interrupt): the run's to raise
            with deferred(), self.lock:
                self.failed(exc)
                self._wake()

    def more(self) -> None:
        """(``on_done`` of the newest call behind the batch sent, on the thread
        that published it.) The calls behind the batch join it if the driving
        thread has not collected it yet (:meth:`RelayCore.joined`). Never
        blocks, never raises."""
        try:
            with self.deferred if threading.get_ident() == self.main else self.lock:
                self._follow()
        except BaseException as exc:  # (an interrupt): the run's to raise
            with deferred(), self.lock:
                self.failed(exc)
                self._wake()

    def _follow(self) -> None:
        """(Under ``lock``.) While a batch is sent and not collected, follow the
        newest outstanding call: once it commits (:meth:`more`), so has every
        call before it (commits are in order), and they join the batch in one
        frame. The calls of a burst that end while the worker settles its
        first frame go to the worker as the last of them commits, not after
        the driving thread has read that frame's answers (a round trip fewer);
        while some still run, nothing more is written (no wake-up of the
        worker, nor of the driving thread, per commit)."""
        take = self.take
        last_of: Any = getattr(take, "last", None)  # (engine._taker's: a bare taker is not followed)
        if last_of is None:
            return
        while self.state is SENT and not self.handoff and self.error is None and not self.reading:
            last = last_of()
            if last is None:
                return
            # The newest; once it is done, the oldest not yet: a pass publishes its commits
            # newest first, so the older ones of its pass are told just after.
            awaited = last if not last.done() else take.undone()
            if awaited is not None:
                self.follow = awaited
                if not awaited.on_done(self.more) or not awaited.done():
                    return  # (it tells when it is done; or it cannot, and the driving thread sends them)
                continue
            sent = len(self.batch)
            if self.joined(take, self._join, take.give_back):
                self._wake()
                return
            if len(self.batch) == sent:
                return  # they did not join (the frame could not go whole): the driving thread sends them
            self.frames += 1

    def _join(self, batch: list[Any]) -> bool:
        """Write ``batch``'s frame behind the one in flight if it goes whole now (a
        write of at most ``PIPE_BUF`` bytes into a pipe is all or nothing); whether it did."""
        remote = self.remote
        limit = remote.limits.memory_bytes
        for item in batch:
            if len(item[4]) > limit:
                return False  # the driving thread refuses it (Remote._check)
        data = settle_frame(batch)
        if len(data) > select.PIPE_BUF:
            return False
        try:
            return remote.worker.offer(data) == len(data)
        except OSError:  # the worker is gone: its end of file tells the driving thread
            return False

    def _unfollow(self) -> None:
        """(Under ``lock``.) The batch is collected: the call followed no longer joins it."""
        self.reading = False
        follow, self.follow = self.follow, None
        if follow is not None:
            follow.on_done(None)

    def _write(self, batch: list[Any]) -> bool:
        """Write ``batch``'s frame, or what the pipe takes of it (the rest in
        :attr:`unsent`); whether there is nothing left to do. Under ``lock``."""
        remote = self.remote
        if len(batch[0][4]) > remote.limits.memory_bytes:
            return False  # the driving thread refuses it (Remote._check)
        if not remote.pool._try_share(remote.ticket):  # noqa: SLF001
            return False  # every CPU share computes: the driving thread waits for one (never this thread)
        data = settle_frame(batch)
        try:
            n = remote.worker.offer(data)
        except OSError:  # the worker is gone: its end of file tells the driving thread
            return True
        if n == len(data):
            return True
        self.unsent = memoryview(data)[n:]
        return False

    def _wake(self) -> None:
        # Under ``lock``, which close() takes before it closes the pipe: never a stale descriptor.
        try:
            os.write(self.wake[1], b"!")
        except OSError:  # full (it is awake already) or closed
            pass

    def close(self) -> None:
        """The run is over: no kick acts again; the wake pipe is closed. Idempotent."""
        with deferred():
            with self.lock:
                self.release()
                self._unfollow()
                wake, self.wake = self.wake, (-1, -1)
            for fd in wake:
                if fd >= 0:
                    os.close(fd)


class Remote:
    """The engine's steps, run in a worker: what :func:`drive` calls in the host."""

    def __init__(
        self,
        pool: Places,
        wid: int,
        w: Worker,
        program: str,
        names: Any,
        limits: Limits,
        deadline: float,
        cancel: Optional[Cancel],
        ticket: int,
    ) -> None:
        self.pool = pool
        self.ticket = ticket  # the run's, in the pool: its place and its CPU share
        self.wid = wid
        self.worker = w
        self.program = program
        self.names = names
        self.limits = limits
        self.deadline = deadline
        self.until = deadline + pool.kill_grace
        self.cancel = cancel
        self.reusable = True
        self.unsent = False  # the run frame could not be sent by the kill deadline
        # A durable run's envelopes also carry the clock values it read (its host bounds their number).
        self.max_frame = max_frame(limits) + (CLOCK_ALLOWANCE if program.startswith(CLOCK_MARK) else 0)
        self.relay = Relay(self)
        #: (ticket, need, domain) while the run may still move to another
        #: worker: its first answer has not come, and it has not moved before.
        self.again: Optional[tuple[int, int, Any]] = None
        # Started again on another worker: its run frame carries the names' text whatever that
        # worker holds (a worker that did not hold what its frame named exits: see worker.py).
        self._retried = False
        self._starting = False

    def idle(self, head: Any, host: Host) -> None:
        """(:func:`drive`'s hook: the run first waits for a call.) Its start-up
        is over once the calls it made have begun: the replacement of the
        spare it took may start then."""
        pool, ticket = self.pool, self.ticket
        pool._calm(ticket)  # noqa: SLF001
        if not host.when_begun(functools.partial(pool._begun, ticket)):  # noqa: SLF001
            pool._begun(ticket)  # noqa: SLF001  (a host that cannot tell: SPARE_CALM alone, as before)

    def _compute(self) -> None:
        """Hold a CPU share for the step about to start (waiting for one, first
        come, first served, within the deadline and cancel): the step's
        answers give it back. :class:`Stopped` if none came; the worker, idle
        meanwhile mid-program, is then not reused."""
        try:
            self.pool._share(self.ticket, self.limits, self.deadline, self.cancel)  # noqa: SLF001
        except Stopped:
            self.reusable = False
            raise

    def send_run(self) -> None:
        """Send the run frame, holding a CPU share (which :meth:`start` gives
        back). :class:`~nous_sched.runtime.procio.NotStarted` if the worker is
        gone; :class:`Stopped` if no share came within the deadline."""
        self._compute()
        w = self.worker
        limits = self.limits
        # A worker's memory cap is set by its first run, for good: a later run
        # that needs less may use it, one that needs more gets another worker.
        cap = self.pool._cap(limits) if w.cap is None else 0  # noqa: SLF001
        # A CPU budget: the kernel's limit (RLIMIT_CPU) and the host's own look, both
        # the budget plus the grace the deadline has. The worker's limit cannot be raised again.
        cpu_limit = None if limits.cpu_time is None else limits.cpu_time + self.pool.kill_grace
        if cpu_limit is not None:
            self.reusable = False
            w.cpu_watch = CpuWatch.start(w.proc.pid, cpu_limit)
        # The names' text, made once per tool set, follows the JSON after a newline as it
        # is: neither side escapes, parses or copies it per name (worker.py's run). A worker
        # that holds it already (its fork server's, its last run's) is sent only its key.
        names, lazy, key = names_keyed(self.names)
        sent = key is None or key not in w.names_held or self._retried
        body = json.dumps(
            {
                "program": self.program,
                "names_lazy": lazy,
                "names_key": None if key is None else key.decode("ascii"),
                "limits": [getattr(limits, f) for f in worker.LIMIT_FIELDS],
                "remaining": max(self.deadline - time.monotonic(), 0.0),
                "memory_cap": cap,
                "cpu_limit": cpu_limit,
            }
        ).encode("utf-8", "surrogatepass")
        w.names_held = frozenset()  # (until the frame is sent: then it holds this run's only)
        try:
            w.send(worker.frame(worker.RUN, body, b"\n", names) if sent else worker.frame(worker.RUN, body), self.until)
        except BrokenPipeError:
            self.reusable = False
            self.pool._give_share(self.ticket)  # noqa: SLF001
            raise NotStarted from None
        except Expired:
            self.unsent = True  # a timeout, said by start() (inside drive)
            return
        if key is not None:
            w.names_held = frozenset((key,))
            if sent and len(names) >= worker.NAMES_OFFER_MIN:
                w.offer_names(key, names)  # (after the frame: the worker starts meanwhile)
        if cap:
            w.cap = cap
            with self.pool._lock:  # noqa: SLF001
                self.pool._core.set_cap(self.wid, cap)  # noqa: SLF001

    def start(self) -> str:
        """The first step: the answer to the run frame :meth:`send_run` sent.
        A worker that dies before it (killed, its fork server lost; not out
        of memory) has answered nothing and the host has served none of the
        program's calls: the program is started again on another worker,
        once, within the deadline."""
        self._starting = self.again is not None
        try:
            if self.unsent:
                return self._expired()
            return self._answer()
        except Lost:
            pass
        finally:
            self._starting = False
            self.pool._give_share(self.ticket)  # noqa: SLF001  (send_run's)
        return self._restart()

    def _restart(self) -> str:
        assert self.again is not None
        ticket, need, domain = self.again
        self.again = None
        self._retried = True
        pool = self.pool
        pool._release(self.wid, FRESH, False)  # noqa: SLF001
        try:
            self.wid, self.worker = pool._acquire(ticket, need, self.limits, self.deadline, self.cancel, domain)  # noqa: SLF001
        except RunCodeError as exc:
            raise Stopped("abort", f"no worker process could be started for the program: {exc}") from None
        self.reusable = True
        try:
            self.send_run()
        except NotStarted:
            raise Stopped("abort", "the worker process running the program died before it started") from None
        return self.start()

    def settle_many(self, batch: Sequence[Sequence[Any]]) -> list[str]:
        """Send ``batch`` (:func:`~nous_sched.runtime.engine.drive`'s items) in
        one settle frame; the worker's envelope for each, in order."""
        self._check(batch)
        self._compute()
        try:
            self._send_settles(settle_frame(batch))
            return self._answers(batch, self._spin())
        finally:
            self.pool._give_share(self.ticket)  # noqa: SLF001

    def _send_settles(self, data: "bytes | memoryview") -> None:
        """Write a settle frame (or its unsent rest); a dead worker or the
        deadline ends the run, as a stop of the engine's would."""
        try:
            self.worker.send(data, self.until)
        except BrokenPipeError:
            self._died()
        except Expired:
            self._expired()

    def answers(self, batch: Sequence[Sequence[Any]]) -> list[str]:
        """The envelopes answering ``batch``, which :attr:`relay` handed over:
        sent by the thread that committed it, or (a frame larger than the
        pipe holds, or a payload the worker must not get) finished here."""
        relay = self.relay
        try:
            if relay.handoff:
                relay.handoff = False
                rest, relay.unsent = relay.unsent, None
                self._check(batch)
                self._compute()  # (held already when the kick wrote part of the frame)
                self._send_settles(settle_frame(batch) if rest is None else rest)
            if len(batch) == 1:  # a lone call's answer (every sequential await): the batch's loop is not needed
                return [self._answer(1, 0.0, True)]
            if relay.frames > 1:  # joined in flight: its later frames' answers follow at once (see wake.py)
                relay.frames = 1
                return self._answers(batch, 0.0, ready=True, later=self._spin())
            return self._answers(batch, 0.0, ready=True)
        finally:
            self.pool._give_share(self.ticket)  # noqa: SLF001  (the kick's, or this thread's)

    def _check(self, batch: Sequence[Sequence[Any]]) -> None:
        # (drive's batches put a payload this large first, alone.)
        if len(batch[0][4]) > self.limits.memory_bytes:
            # It cannot fit in the program's memory (in-process, parsing it
            # fails the same way): never send it.
            raise Stopped("abort", memory_message(self.limits.memory_bytes))

    @property
    def max_payload(self) -> int:
        """The largest payload the worker may be sent (:meth:`_check`)."""
        return self.limits.memory_bytes

    def _answers(
        self, batch: Sequence[Sequence[Any]], spin: float, ready: bool = False, later: float = 0.0
    ) -> list[str]:
        """One answer per call of ``batch``: the worker writes them at once, so
        after the first, those already read are split off in one pass (a
        quiet step's is :data:`~.engine.QUIET` itself, not decoded). ``later``:
        how long to look busily for each later frame's (a batch joined in flight)."""
        texts: list[str] = []
        count = len(batch)
        envelopes = self.worker.envelopes
        try:
            while len(texts) < count:
                texts.append(self._answer(count - len(texts), spin, ready))
                spin = later  # the rest came with the first (or, joined, with a later frame)
                texts += envelopes(count - len(texts), self.max_frame, QUIET)
        except Stopped as stop:
            stop.steps = [*texts, *stop.steps]
            raise
        return texts

    def _answer(self, expected: int = 1, spin: float = 0.0, ready: bool = False) -> str:
        try:
            op, body = self._step(expected, spin, ready)
        except Expired:
            return self._expired()
        except Died:
            return self._died()
        except Garbled:
            return self._broken()
        except CpuSpent:
            return self._cpu_spent()
        except Stopped:
            self._kill()
            raise
        if op == worker.ENVELOPE:
            return body.decode("utf-8", "surrogatepass")
        if op == worker.STOPPED:
            raise self._stopped(body)
        return self._broken()

    def _step(self, expected: int = 1, spin: float = 0.0, ready: bool = False) -> tuple[bytes, bytes]:
        """The worker's answer; at the deadline, or on cancel, after a soft stop."""
        w = self.worker
        try:
            answer = w.receive(self.deadline, self.cancel, self.max_frame, spin, ready)
            if spin:
                self.pool._wake.answered(w.missed)  # noqa: SLF001
                w.missed = False
            return answer
        except Expired:
            # The deadline passed mid-step: the worker's engine stops now,
            # keeping its logs; the kill comes only if it has not by the grace.
            return self._stop_softly(self.until, signal.SIGUSR1, self.cancel)
        except Stopped:
            return self._cancel_softly(expected)

    def _spin(self) -> float:
        """How long to look for the next answer busily (see :mod:`.wake`)."""
        pool = self.pool
        return pool._wake.spin(len(pool._core.computing))  # noqa: SLF001  (shares in use, this run's too)

    def _stopped(self, body: bytes) -> Stopped:
        head, _, tail = body.partition(b"\n")
        try:
            stop = json.loads(head)
            kind, message, memory = stop["kind"], stop["message"], stop["memory"]
        except (ValueError, KeyError, TypeError):
            self._broken()
        if kind not in _KINDS_FROM_WORKER or not isinstance(message, str) or not isinstance(memory, bool):
            self._broken()
        if memory:
            self.reusable = False
        envelope = tail.decode("utf-8", "surrogatepass") or None
        return Stopped(kind, clip(message), envelope=envelope, memory=memory)

    def _stop_softly(self, until: float, sig: int, cancel: Optional[Cancel]) -> tuple[bytes, bytes]:
        """Signal the worker every :data:`RESIGNAL` seconds until it answers;
        :class:`Expired` at ``until`` or if it dies meanwhile. A worker
        parked (its share another run's for a slice) goes on first."""
        self.pool._resume(self.ticket)  # noqa: SLF001
        w = self.worker
        while True:
            w.signal(sig)
            try:
                return w.receive(min(until, time.monotonic() + RESIGNAL), cancel, self.max_frame)
            except Died:  # past the deadline, however it ended: a timeout
                raise Expired from None
            except Expired:
                if time.monotonic() >= until:
                    raise

    def _cancel_softly(self, expected: int = 1) -> NoReturn:
        """Cancelled mid-step: stop the engine (``SIGUSR2``) and keep the logs of
        the steps it was in (``expected`` answers, a batch's); kill the worker
        if it has not stopped within the grace."""
        self.reusable = False
        until = time.monotonic() + self.pool.kill_grace
        steps: list[str] = []
        envelope = None
        try:
            while len(steps) < expected:
                op, body = self._stop_softly(until, signal.SIGUSR2, None)
                if op == worker.ENVELOPE:
                    steps.append(body.decode("utf-8", "surrogatepass"))
                    continue
                if op == worker.STOPPED:
                    envelope = body.partition(b"\n")[2].decode("utf-8", "surrogatepass") or None
                break
        except (Expired, Died, Garbled):
            self._kill()
            raise Stopped("cancelled", CANCELLED, steps=steps) from None
        raise Stopped("cancelled", CANCELLED, envelope=envelope, steps=steps)

    def _kill(self) -> None:
        self.reusable = False
        self.worker.kill()

    def _expired(self) -> str:
        self._kill()
        raise Stopped(
            "timeout",
            timeout_message(
                self.limits.timeout,
                f"running JavaScript; its worker process was killed {self.pool.kill_grace:g}s later",
            ),
        )

    def _cpu_spent(self) -> NoReturn:
        self._kill()
        assert self.limits.cpu_time is not None
        limit = self.limits.cpu_time + self.pool.kill_grace
        raise Stopped(
            "cpu_time",
            cpu_message(
                self.limits.cpu_time, f"running JavaScript; its worker process was killed after {limit:g}s of CPU time"
            ),
        )

    def _died(self) -> str:
        self.reusable = False
        reason = self.worker.exit_reason()
        self.worker.kill()
        if self.limits.cpu_time is not None and self.worker.proc.returncode == -signal.SIGXCPU:
            # The kernel's RLIMIT_CPU: the engine's own stop could not run (one long native call).
            raise Stopped(
                "cpu_time",
                cpu_message(
                    self.limits.cpu_time, "running JavaScript; the kernel's CPU time limit ended its worker process"
                ),
            )
        if self._starting and self.worker.proc.returncode != worker.EXIT_MEMORY and time.monotonic() < self.deadline:
            raise Lost
        if self.worker.proc.returncode == worker.EXIT_MEMORY:
            raise Stopped("abort", memory_message(self.limits.memory_bytes, " (its worker process ran out of memory)"))
        raise Stopped("abort", f"the worker process running the program died ({reason})")

    def _broken(self) -> NoReturn:
        self._kill()
        raise Stopped("abort", "the worker process broke the protocol; it was killed")

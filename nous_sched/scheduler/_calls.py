"""What crosses the scheduler's queue, and what a call carries through it.

A submit is the call itself (:class:`Call`: one object per call on the hot
path), a batch a list of calls (one message for every call a program's step
started: :class:`Batch`); the others are small slotted messages
(:class:`Done`, :class:`Query`, :data:`STOP`). The driver
(:class:`~nous_sched.scheduler.Scheduler`) tells them apart by type. Each
started call has its :class:`Timeline`; a call with throttles takes their
places on its tool thread (:class:`Begin`). Also the words a program reads
when the scheduler, not the tool, ends a call.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import logging
import threading
import time
from typing import Any, Callable, Optional, Protocol, Sequence

from .. import _validators as v
from .._validators import require
from ..events import (
    ApprovalEvent,
    Event,
    SessionLog,
)
from ..gate._admitted import FAILED as FAILED  # re-exported: the scheduler's messages
from ..gate.dispatch import RunContext
from ..outcome import Outcome
from ..result.records import CallRecord, LaneState, made
from ..throttle import Hold
from ..tooling import Mode, Tool
from ._tool_threads import Task, Then

log = logging.getLogger("nous_sched")

__all__ = [
    "Ticket",
    "Call",
    "Batch",
    "Begin",
    "ThrottledBegin",
    "AlwaysBegin",
    "Done",
    "Query",
    "Reader",
    "WhenBegun",
    "told",
    "RunLog",
    "Timeline",
    "STOP",
    "GONE",
    "ABANDONED",
    "AWAIT_TIMEOUT",
    "NO_ANSWER",
    "FAILED",
    "DID_NOT_COMPLETE",
]

# What a program reads when the scheduler, not the tool, ends a call.
_TIMEOUT_MAX = threading.TIMEOUT_MAX

# Makes a ticket's gate, once, whichever of its waiters comes first (Ticket._wait).
_GATES = threading.Lock()

GONE = "code run is over; scheduler is gone"


ABANDONED = "code run is over; tool call abandoned"


AWAIT_TIMEOUT = "timed out waiting for the sub-call to commit"


NO_ANSWER = "the scheduler did not answer within {s:g}s (a concurrency_safe predicate may be stuck)"


DID_NOT_COMPLETE = "tool call did not complete"


class Ticket:
    """A handle on one submitted sub-call; pass it to :meth:`Scheduler.wait`.

    ``tool`` is the tool's name. ``seq`` is the call's submission index once
    the driver has accepted it, ``None`` before.
    """

    # One lock is a ticket's whole synchronization (a Future would be a
    # Condition over an RLock, per call), made by its first waiter: most of a
    # batch's tickets are taken once done() and never waited on, so they
    # never make one. ``_gate`` is None until then; a waiter makes it, held,
    # under _GATES, and only if ``_outcome`` is still None there. _publish
    # writes ``_outcome``, then (if _GATES is held: a waiter may be between
    # its look at ``_outcome`` and its store) waits for _GATES, and then
    # releases the gate if there is one: so either the waiter sees the
    # outcome and makes no gate, or the publish sees its gate, and a gate is
    # released once. A waiter acquires the gate and releases it at once, so
    # every waiter passes. That only one release ever publishes is the scheduler's
    # to ensure (_open, under its _lock: see Scheduler._deliver). ``_then`` is
    # what a runtime asked for with on_done.
    __slots__ = ("tool", "seq", "_outcome", "_gate", "_then")

    def __init__(self, tool: str) -> None:
        self.tool = tool
        self.seq: Optional[int] = None
        self._outcome: Optional[Outcome] = None
        self._then: Optional[Callable[[], None]] = None
        self._gate: Optional[threading.Lock] = None

    def done(self) -> bool:
        """True once the call has committed (or been released with an error)."""
        return self._outcome is not None

    def on_done(self, then: Optional[Callable[[], None]]) -> bool:
        """``then()`` is called once by whichever thread publishes the outcome,
        just after :meth:`done` turns true (the worker runtime writes the
        settle frame from there: ``runtime/pool.py``, the relay); it must
        neither block nor raise. ``None`` takes it back. Always ``True``: a
        ticket can tell (the runtime seam's ``PendingCall.on_done``). A ticket
        published before the call is not told: check :meth:`done` after."""
        self._then = then
        return True

    def _publish(self, outcome: Outcome) -> None:
        self._outcome = outcome
        if _GATES.locked():  # a waiter may be making this gate: read it once the waiter is done
            with _GATES:
                pass
        gate = self._gate
        if gate is not None:
            gate.release()
        then = self._then
        if then is not None:
            then()

    def _wait(self, timeout: float) -> Optional[Outcome]:
        """The outcome, or ``None`` after ``timeout`` seconds (-1: no limit)."""
        gate = self._gate
        if gate is None:
            with _GATES:
                gate = self._gate
                if gate is None:
                    outcome = self._outcome
                    if outcome is not None:  # published already: no gate is needed
                        return outcome
                    gate = threading.Lock()
                    gate.acquire()
                    self._gate = gate
        if gate.acquire(True, timeout):
            gate.release()
            return self._outcome
        return None

    def wait(self, timeout: Optional[float] = None) -> Optional[Outcome]:
        """The call's committed :class:`Outcome`, or ``None`` if ``timeout`` seconds pass first.

        ``timeout=None`` waits until the call commits or the scheduler
        releases it. Unlike :meth:`Scheduler.wait`, a timeout here says nothing
        about the scheduler: it is the runtime seam's ``PendingCall.wait``.

        :raises ConfigError: ``timeout`` is not ``None`` or a number of seconds
            from 0 to ``threading.TIMEOUT_MAX``.
        """
        # Once per call on the runtime's hot path: a float in range needs no further check.
        if timeout is None:
            return self._wait(-1)
        if not (type(timeout) is float and 0.0 <= timeout <= _TIMEOUT_MAX):
            require("Ticket.wait", "timeout", timeout, v.WAIT_SECONDS)
        # Published already (a batch's take, just after done()): the outcome, read as done() reads it.
        outcome = self._outcome
        if outcome is not None:
            return outcome
        return self._wait(timeout)

    def __repr__(self) -> str:
        return f"<Ticket {self.tool!r} seq={self.seq} done={self.done()}>"


class Driven(Protocol):
    """What :class:`Begin` and :class:`Batch` reach in their scheduler (a
    :class:`~nous_sched.scheduler.Scheduler`, whose comments say what each
    guards): its private state, shared inside this package only."""

    _records_lock: threading.Lock
    _stopping: bool
    _t0: float
    _timeout: float
    _throttle_waits: set[Hold]
    _batch: Optional["Batch"]
    _unbegun: int
    _on_begun: list[Callable[[], None]]

    def _record(self, record: Any) -> None: ...

    def _admit(self, calls: Sequence["Call"], message: Any) -> None: ...


class Timeline:
    """When one started call started, finished and committed (seconds since the epoch of its scheduler)."""

    __slots__ = (
        "seq",
        "tool",
        "mode",
        "started",
        "finished",
        "committed",
        "ok",
        "began",
        "reason",
        "throttled",
        "waiting_since",
    )

    def __init__(self, seq: int, tool: str, mode: Mode, started: float, reason: str = "") -> None:
        self.seq = seq
        self.tool = tool
        self.mode = mode
        self.reason = reason
        self.started = started
        self.finished: Optional[float] = None
        self.committed: Optional[float] = None
        self.ok: Optional[bool] = None
        self.began: Optional[float] = None
        self.throttled: Optional[float] = None
        self.waiting_since: Optional[float] = None  # perf_counter() as its throttles' wait began

    def record(self) -> CallRecord:
        return CallRecord(*self.row())

    def row(self) -> tuple[Any, ...]:
        """:meth:`record`'s fields as they stand now, in its order (a tuple of plain values)."""
        throttled = self.throttled
        if throttled is None and self.waiting_since is not None:
            # Still waiting: the run may end (its deadline) before the tool thread
            # wakes to stamp the wait, and its trail must still show the wait.
            throttled = time.perf_counter() - self.waiting_since
        return (
            self.seq,
            self.tool,
            self.mode,
            self.started,
            self.finished,
            self.committed,
            self.ok,
            self.began,
            self.reason,
            throttled,
        )


def told(thens: list[Callable[[], None]]) -> None:
    """Call each of ``thens`` (:meth:`~nous_sched.Scheduler.when_begun`'s), outside every lock; what one raises is logged."""
    for then in thens:
        try:
            then()
        except Exception:
            log.warning("a when_begun callback raised; ignoring it", exc_info=True)


class Begin:
    """Called by a tool thread as it takes up a call: stamps the call's
    ``began`` and answers True; answers False once the scheduler is stopping
    (the call is over before it began, and must not start). A tool that names
    throttles gets a :class:`ThrottledBegin`, which waits for their places
    first. :meth:`end` gives the places back once the tool has returned.

    Pickles (for executors that serialize tasks) as one that always answers
    True: in another process there is no scheduler to ask.
    """

    __slots__ = ("scheduler", "timeline")

    # Most calls' tools name no throttles: their Begin holds no places, and has
    # no per-call slots for them (run_call skips end() for them, on this).
    throttles: tuple[Any, ...] = ()

    def __init__(self, scheduler: "Driven", timeline: Timeline) -> None:
        self.scheduler = scheduler
        self.timeline = timeline

    def __call__(self) -> bool | str:
        scheduler = self.scheduler
        with scheduler._records_lock:  # noqa: SLF001
            if scheduler._stopping:  # noqa: SLF001
                self.end()
                return False
            self.timeline.began = time.perf_counter() - scheduler._t0  # noqa: SLF001
            scheduler._unbegun -= 1  # noqa: SLF001
            if scheduler._unbegun or not scheduler._on_begun:  # noqa: SLF001
                return True
            thens, scheduler._on_begun = scheduler._on_begun, []  # noqa: SLF001
        told(thens)
        return True

    def record_approval(self, approved: bool, reason: str, grant: str = "", granted: Any = None) -> None:
        """The approval step's sink (:data:`~nous_sched.gate.dispatch.approval_sink`) for this call."""
        timeline = self.timeline
        shown = None if granted is None else granted.as_dict()
        self.scheduler._record(ApprovalEvent(timeline.seq, timeline.tool, approved, reason, grant, shown))  # noqa: SLF001

    def end(self) -> None:
        """Give the throttles' places back (idempotent; any thread): none held here."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (AlwaysBegin, ())


class ThrottledBegin(Begin):
    """A :class:`Begin` for a tool that names throttles: first waits for their
    places (until ``deadline``, a ``time.monotonic()``; None: the scheduler's
    timeout), and answers the refusal's message when that wait failed.

    The wait is on the tool thread, so the driver never blocks on a throttle;
    stop() cancels it (``Scheduler._throttle_waits``).
    """

    __slots__ = ("throttles", "deadline", "hold")

    def __init__(self, scheduler: "Driven", timeline: Timeline, throttles: tuple[Any, ...], deadline: Any) -> None:
        super().__init__(scheduler, timeline)
        self.throttles = throttles
        self.deadline = deadline
        self.hold: Optional[Hold] = None

    def __call__(self) -> bool | str:
        refusal = self._wait_for_throttles()
        if refusal is not None:
            return refusal
        return super().__call__()

    def _wait_for_throttles(self) -> bool | str | None:
        """Take the throttles' places (None), or why not: False once the scheduler stops, else the message."""
        scheduler = self.scheduler
        hold = self.hold = Hold(self.throttles)
        timeline = self.timeline
        with scheduler._records_lock:  # noqa: SLF001
            if scheduler._stopping:  # noqa: SLF001
                return False
            scheduler._throttle_waits.add(hold)  # noqa: SLF001
            waiting_since = timeline.waiting_since = time.perf_counter()
        deadline = self.deadline if self.deadline is not None else time.monotonic() + scheduler._timeout  # noqa: SLF001
        try:
            refusal = hold.wait(deadline)
        finally:
            with scheduler._records_lock:  # noqa: SLF001
                scheduler._throttle_waits.discard(hold)  # noqa: SLF001
                timeline.throttled = time.perf_counter() - waiting_since
        if refusal is not None and refusal.startswith(ABANDONED):
            return False
        return refusal

    def end(self) -> None:
        """Give the throttles' places back (idempotent; any thread)."""
        if self.hold is not None:
            self.hold.release()


class AlwaysBegin:
    __slots__ = ()

    def __call__(self) -> bool:
        return True

    def end(self) -> None:
        pass


class Call:
    """One submitted call. Built by the submitting thread, then owned by the driver once queued."""

    __slots__ = (
        "ticket",
        "tool",
        "args",
        "logged",
        "run_ctx",
        "ctx",
        "seq",
        "mode",
        "future",
        "outcome",
        "timeline",
        "ran",
    )

    # Set by the driver, each before it is first read: seq and mode when it
    # accepts the call, timeline and future when it starts it, outcome and ran
    # when the tool has finished. (Unset, not None: one store fewer per call.)
    seq: int
    mode: Mode
    timeline: Timeline
    future: concurrent.futures.Future[Any] | Task  # the executor's, or the scheduler's own threads'
    outcome: Outcome
    ran: "Ran"  # what its task reported: the outcome, when it finished, its error kind and result size

    def __init__(
        self,
        ticket: Ticket,
        tool: Tool,
        args: dict[str, Any],
        logged: Any,
        run_ctx: Optional[RunContext],
        ctx: contextvars.Context,
    ) -> None:
        self.ticket = ticket
        self.tool = tool
        self.args = args  # the snapshot the tool gets
        self.logged = logged  # the snapshot the audit gets
        self.run_ctx = run_ctx
        self.ctx = ctx


#: What a call's task reports: its outcome, when it finished, the outcome's
#: error kind (None when ok, see events.OUTCOME_ERROR_KINDS) and its result's JSON size.
Ran = tuple[Outcome, float, Optional[str], int]


class Done(Then):
    """Call ``seq``'s tool has finished (put on any thread).

    ``result`` is what :func:`run_call` returned, or ``None`` when the task
    did not complete; then ``problem`` is the executor's future to look at,
    or the exception the task died of.

    It names the call by seq, not by the call itself: the call holds its
    future, so a callback holding the call would make every call a reference
    cycle, left for the garbage collector.
    """

    __slots__ = ("seq", "result", "problem", "put")

    # The driver queue's put, set by a task that returns this report to its tool
    # thread to put (a Then) rather than putting it itself.
    put: Callable[[Any], None]

    def __init__(self, seq: int, result: Optional[Ran], problem: Any = None) -> None:
        self.seq = seq
        self.result = result
        self.problem = problem

    def __call__(self) -> None:
        """Put this report on the driver's queue (a tool thread calls it as it goes idle: :class:`Then`)."""
        self.put(self)


class Reader:
    """A run's worker pipe the driver reads while the run waits
    (:meth:`~nous_sched.Scheduler.attach_reader`): the driver calls
    ``readable()`` whenever ``fd`` has data, until it answers False, or
    ``gone()`` if it stops first (the scheduler stopped)."""

    __slots__ = ("fd", "readable", "gone")

    def __init__(self, fd: int, readable: Callable[[], bool], gone: Callable[[], None]) -> None:
        self.fd = fd
        self.readable = readable
        self.gone = gone


class Batch:
    """Submits from one thread, held back, then admitted (their tickets join
    ``_open`` under one ``_lock``) or refused together, and queued as one
    message, when the batch ends."""

    __slots__ = ("scheduler", "owner", "calls")

    def __init__(self, scheduler: "Driven") -> None:
        self.scheduler = scheduler
        self.owner = threading.get_ident()
        self.calls: list[Call] = []

    def __enter__(self) -> Batch:
        if self.scheduler._batch is not None:  # noqa: SLF001
            raise RuntimeError("Scheduler batches do not nest")
        self.scheduler._batch = self  # noqa: SLF001
        return self

    def __exit__(self, *exc: object) -> None:
        scheduler = self.scheduler
        scheduler._batch = None  # noqa: SLF001
        calls = self.calls
        if not calls:
            return
        # Whatever interrupted the batch, its tickets are admitted or refused here.
        scheduler._admit(calls, calls)  # noqa: SLF001


class RunLog(SessionLog):
    """The session log a scheduler makes when it is given none.

    A :class:`SessionLog` to every reader; inside, it keeps the driver's audit
    records as they are (or held: ``nous_sched.result.records.made``) and
    makes each one's :class:`Event` when the log is first read (most runs'
    logs never are), in place, so every reader gets the
    same Event objects in append order. Its lock is its scheduler's
    ``_records_lock``, so a driver's pass appends to both under one lock
    (``Scheduler._write_pass``).
    """

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__()
        self._lock = lock
        self._made = 0  # every entry before this index is an Event

    def _keep(self, records: list[Any]) -> None:
        """Append audit records (each with ``as_event()``), in order, as one."""
        with self._lock:
            self._events += records

    @property
    def events(self) -> list[Event]:
        with self._lock:
            entries: list[Any] = self._events
            for i in range(self._made, len(entries)):
                entry = entries[i]
                if type(entry) is not Event:
                    entries[i] = made(entry).as_event()
            self._made = len(entries)
            return list(entries)


class WhenBegun:
    """Call ``then()`` once every call started so far has begun (:meth:`~nous_sched.Scheduler.when_begun`)."""

    __slots__ = ("then",)

    def __init__(self, then: Callable[[], None]) -> None:
        self.then = then


class Query:
    """Answer ``reply`` with the lane's state."""

    __slots__ = ("reply",)

    def __init__(self, reply: concurrent.futures.Future[LaneState]) -> None:
        self.reply = reply


class Stop:
    """Abandon the lane and exit."""

    __slots__ = ()


STOP = Stop()

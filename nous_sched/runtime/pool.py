"""The worker-process runtime: a pool of worker processes that run programs.

:class:`WorkerPool` is a :class:`~nous_sched.CodeRuntime`. By default each run
gets a worker process that has never run anything, uses it for its whole
length and discards it: no two callers ever share a process. The pool keeps
:attr:`WorkerPool.spares` fresh workers ready, forked by a fork server that
has loaded the engine (see :mod:`nous_sched.runtime.procio`). A spare is
handed out only once it has said hello, which it does once it is bounded
(namespaces, privileges, filter) and has prepared its first context: a run
that takes one sends it the program at once and waits for nothing of its
start-up. Spares are started by a thread of the pool's own, which reads
their hellos, and boot as ``SCHED_BATCH`` (never preempting a run's threads);
the spare a run took is replaced as soon as it is taken, and while runs find
no spare ready, more are kept booting side by side (up to twice
:attr:`WorkerPool.spares`: see :class:`~nous_sched.runtime.poolcore.PoolCore`). Reuse
is an explicit opt-in scoped to a trust domain (:meth:`WorkerPool.domain`):
a worker then serves further runs of that domain only.

The JavaScript runs in the worker; everything else stays in the host, on
the calling thread: :func:`~nous_sched.runtime.engine.drive` checks every
envelope the worker sends, keeps the logs within budget, hands calls to the
:class:`~nous_sched.runtime.Host` (scheduler, tools, approval, audit) and
sends back the outcomes, oldest first, every committed one in one frame.
When the calling thread has nothing to send it waits on the worker's pipe,
and the thread that commits the oldest call (the scheduler's driver) writes
the settle frame itself (:class:`_Relay`): one batch of steps is one pipe
round trip, with no hop through the calling thread, and no timer wakes
anything. ``run_code`` starts the program in its worker
(:meth:`WorkerPool.begin`) before it builds the run's scheduler, so the
worker compiles it and runs it to its first call meanwhile.

The deadline holds whatever the program does. The engine's own limit stops a
runaway program first (a soft stop: the worker drains the logs it still
held). If the worker has not answered by the deadline plus
:attr:`WorkerPool.kill_grace`, the host kills it with ``SIGKILL`` and
answers ``timeout`` with the logs of every step so far. A cancel stops the
program the same soft way first and kills only after the grace.

A worker that dies (a signal, the OOM killer, an engine crash) gives its run
an ``abort`` error with its logs. One that could not be started, or died
before the program's first answer (the host has then served none of its
calls), is replaced and the program started again, once, within the
deadline (not after running out of memory: that is the program's own).

An interrupt (``KeyboardInterrupt``) anywhere leaves the pool whole: every
place a run holds belongs to its ticket (:meth:`PoolCore.drop
<nous_sched.runtime.poolcore.PoolCore.drop>` gives them all back, whatever
step was cut), a :class:`Begun` lost before it ran gives its worker back as
it is collected, and the steps that must not be split run deferred
(:mod:`nous_sched._interrupts`). The pool's decisions live in
:mod:`nous_sched.runtime.poolcore` (pure), the processes and the frame
protocol in :mod:`nous_sched.runtime.procio`, when to look for an answer
busily in :mod:`nous_sched.runtime.wake`; this module joins them.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import weakref
from typing import Any, Deque, Hashable, NoReturn, Optional, Sequence

from .. import _validators as v
from .._interrupts import LOCAL, deferred, leave
from .._validators import require
from ..errors import RunCodeError
from ..result import RunError
from . import Cancel, CodeRuntime, Host, Limits, PendingCall, RuntimeOutcome, worker
from .engine import (
    CANCEL_POLL,
    CANCELLED,
    CLOCK_MARK,
    Finish,
    Stopped,
    clip,
    drive,
    memory_message,
    timeout_message,
)
from .poolcore import FRESH, WAIT, Closed, PoolCore
from .procio import Died, Expired, ForkServer, Garbled, NotStarted, StartTimeout, Worker, quickjs_origin
from .wake import CPUS, SPIN, SPIN_BACKOFF, SPIN_BACKOFF_MAX, WakePolicy

__all__ = ["Begun", "WorkerPool", "default_pool", "SPIN", "SPIN_BACKOFF", "SPIN_BACKOFF_MAX"]

_MIB = 1024 * 1024
_KINDS_FROM_WORKER = frozenset({"exception", "timeout", "abort"})
_numbers = itertools.count(1)
_tickets = itertools.count(1)
_START_METHODS = v.one_of(("forkserver", "spawn"))
_GRACE = v.Check("a number of seconds from 0 to 60", lambda x: v.WAIT_SECONDS.accepts(x) and x is not None and x <= 60)
_HEADROOM = v.int_at_least(16 * _MIB, "an int of at least 16 MiB (16777216)")
_ID = v.Check("an int from 1 to 2**31-1", lambda x: isinstance(x, int) and not isinstance(x, bool) and 0 < x < 2**31)
_SPARES = v.Check("an int of at least 0", lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= 0)
#: How often the host repeats the deadline (or cancel) signal until the worker
#: answers. The worker ignores a deadline signal that arrives before *its*
#: deadline, which is later than the host's by the run frame's transit, and one
#: that arrives before the run is armed: a single signal is easily lost.
RESIGNAL = 0.05
#: The default :attr:`WorkerPool.size`: the core count, at least this.
MIN_DEFAULT_SIZE = 8
_HAS_FORK_SERVER = sys.platform.startswith("linux") and hasattr(os, "pidfd_open")
#: Spares boot at the lowest priority (a run's own worker at the normal one).
_BACKGROUND_SPARES = True
#: Seconds the spares thread waits for more work before it exits.
SPARES_LINGER = 1.0
#: The most workers one fork server forks before it is replaced (its
#: children share its address layout: see ``procio.ForkServer``). The cost,
#: measured in ``benchmarks/bench_wall.py``: a new server every this many
#: workers (about 40 ms of CPU, off the runs' path when spares are kept).
SERVER_CHILDREN = 64
#: The wall's parts added for issue 34 that cost something, each switchable
#: off only so ``benchmarks/bench_wall.py`` can measure it against its
#: absence in one process (read when a pool is made): the task bound (see
#: ``oslimits``), a session per worker, and :data:`SERVER_CHILDREN` (0: a
#: fork server for the pool's whole life).
WALL: dict[str, Any] = {"task_bound": True, "own_session": True, "server_children": SERVER_CHILDREN}


class _Lost(Exception):
    """The worker died before the program's first answer (see ``_Remote.start``)."""


class _StartTimedOut(RunCodeError):
    """A worker said nothing within ``start_timeout``: another would cost as long."""


def default_size() -> int:
    """The default pool size on this machine: its core count, at least :data:`MIN_DEFAULT_SIZE`."""
    return max(MIN_DEFAULT_SIZE, CPUS)


class WorkerPool(CodeRuntime):
    """A pool of worker processes that run programs: the default runtime.

    Thread-safe: any number of threads may call :meth:`run` at once; each run
    gets a worker of its own, waiting (first come, first served) when all
    ``size`` places are taken. **Waiting for a free worker counts against the
    run's deadline**: a run that waits out its whole ``timeout`` in the queue
    returns ``timeout`` without starting.

    **A fresh process per run.** A run gets a worker that has never run
    anything, which is discarded after it. To let runs of one trust domain
    (one user, one tenant) reuse warm workers, run them through
    ``pool.domain(key)``: a worker that served ``key`` serves nothing else.

    :param size: most worker processes alive at once (spares included), so
        most runs at once. Default: the core count, at least 8
        (:func:`default_size`): programs beyond the cores only share them.
    :param spares: fresh workers kept ready (within ``size``; default 2),
        each replaced in the background as soon as a run takes it; while
        runs find none ready, up to twice as many are kept (within
        ``size``); :meth:`wait_for_spares` waits for ``spares`` of them.
    :param start_method: ``"forkserver"`` (default on Linux): workers are
        forked from one process that has loaded the engine (about a
        millisecond each); ``"spawn"``: each worker is a fresh interpreter
        (``python -I -S -B``, tens of milliseconds).
    :param runs_per_worker: most runs a worker serves within one trust domain.
    :param kill_grace: seconds past a run's deadline (or its cancel) before its
        worker is killed, giving the engine time to stop the program softly,
        with its last logs.
    :param memory_headroom: the OS limit on a worker's address space
        (``RLIMIT_AS``), set by its first run, is what it used before any run,
        plus that run's ``Limits.memory_bytes``, one copy of the largest
        message the host may send it, and this many bytes. A later run (of the
        same trust domain) that needs more gets another worker.
    :param start_timeout: seconds a new worker may take to say hello before
        the run ends with an ``abort`` error (not tried again: another would
        take as long).
    :param python: the interpreter to run workers with (default
        ``sys.executable``); set it when that is not a Python (an embedding
        server such as uWSGI).
    :param uid, gid: when the host runs as root, what the workers drop to
        (default 65534, ``nobody``).
    :param namespaces: put each worker in new namespaces where the kernel
        allows it (default true); :attr:`layers` says which are active.
    """

    language = "javascript"

    def __init__(
        self,
        size: Optional[int] = None,
        *,
        spares: int = 2,
        start_method: Optional[str] = None,
        runs_per_worker: int = 1000,
        kill_grace: float = 0.5,
        memory_headroom: int = 64 * _MIB,
        start_timeout: float = 10.0,
        python: Optional[str] = None,
        uid: int = 65534,
        gid: int = 65534,
        namespaces: bool = True,
    ) -> None:
        if size is None:
            size = default_size()
        if start_method is None:
            start_method = "forkserver" if _HAS_FORK_SERVER else "spawn"
        require("WorkerPool", "size", size, v.POSITIVE_INT)
        require("WorkerPool", "spares", spares, _SPARES)
        require("WorkerPool", "start_method", start_method, _START_METHODS)
        require("WorkerPool", "runs_per_worker", runs_per_worker, v.POSITIVE_INT)
        require("WorkerPool", "kill_grace", kill_grace, _GRACE)
        require("WorkerPool", "memory_headroom", memory_headroom, _HEADROOM)
        require("WorkerPool", "start_timeout", start_timeout, v.SECONDS)
        require("WorkerPool", "python", python, v.OPTIONAL_STR)
        require("WorkerPool", "uid", uid, _ID)
        require("WorkerPool", "gid", gid, _ID)
        require("WorkerPool", "namespaces", namespaces, v.BOOL)
        self.size = size
        self.spares = min(spares, size)
        self.start_method = start_method
        self.runs_per_worker = runs_per_worker
        self.kill_grace = float(kill_grace)
        self.memory_headroom = memory_headroom
        self.start_timeout = float(start_timeout)
        self.python = python or sys.executable
        self._options = {
            "uid": uid,
            "gid": gid,
            "namespaces": namespaces,
            "task_bound": WALL["task_bound"],
            "own_session": WALL["own_session"],
        }
        self._server_children = WALL["server_children"]
        self._reset()
        _POOLS.add(self)

    def _reset(self) -> None:
        # _lock guards _core, _workers, _server, _empty_dir and _spare_thread;
        # _cond (on _lock) is notified whenever the core's state changes.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._core = PoolCore(self.size, self.spares, self.runs_per_worker)
        self._workers: dict[int, Worker] = {}  # wid -> process, for every started worker
        self._server: Optional[ForkServer] = None
        self._retired: list[ForkServer] = []  # replaced fork servers, closed when their last child is gone
        self._server_lock = threading.Lock()  # held while the fork server starts
        self._successor: Optional[threading.Thread] = None  # starting the next fork server (_server_lock)
        self._spare_thread: Optional[threading.Thread] = None
        self._dying: list[tuple[int, Worker]] = []  # killed fork server children, not yet gone
        self._orphans: Deque[int] = collections.deque()  # tickets of runs lost before they ran
        self._reaping = 0  # taken from _dying by the spares thread, not yet gone
        self._spares_failed = False  # a spare could not start: leave starting to the runs
        self._empty_dir: Optional[str] = None
        self._owner = os.getpid()
        self._wake = WakePolicy()
        self.os_bounds: Optional[dict[str, Any]] = None

    # -- the runtime ---------------------------------------------------------

    def run(self, program: str, host: Host, limits: Limits) -> RuntimeOutcome:
        """Run ``program`` in a fresh worker; the calling thread drives it.

        :raises RunCodeError: the pool is closed. (A worker that could not be
            started is tried again once, then the run's ``abort`` error.)
        """
        return self.begin(program, host.names, limits, host.cancel).run(host)

    def begin(
        self,
        program: str,
        names: Sequence[str],
        limits: Limits,
        cancel: Optional[Cancel] = None,
        domain: Hashable = FRESH,
    ) -> "Begun":
        """Start ``program`` in a worker now, before the host that will serve its
        calls exists; :meth:`run` in two halves.

        The worker compiles and starts the program while the caller builds the
        host (``run_code`` builds the run's scheduler meanwhile). Then exactly
        one of :meth:`Begun.run` (with a host whose ``names`` are ``names`` and
        whose ``cancel`` is ``cancel``) or :meth:`Begun.abandon` must follow.
        The run's deadline counts from here. ``domain``: see :meth:`domain`.

        :raises RunCodeError: the pool is closed. (A worker that could not be
            started is tried again once, then the run's ``abort`` error.)
        """
        deadline = time.monotonic() + limits.timeout
        need = self._cap(limits)
        # Everything this run holds is the ticket's: whatever step an
        # interrupt cuts (a grant not yet stored, a worker half started),
        # dropping the ticket gives it all back.
        ticket = next(_tickets)
        try:
            return self._begin(ticket, program, names, limits, deadline, need, cancel, domain)
        except BaseException:
            LOCAL.depth += 1
            try:
                self._drop(ticket)
            finally:
                leave()
            raise

    def _begin(
        self,
        ticket: int,
        program: str,
        names: Sequence[str],
        limits: Limits,
        deadline: float,
        need: int,
        cancel: Optional[Cancel],
        domain: Hashable,
    ) -> "Begun":
        retried = False
        while True:
            try:
                wid, worker_ = self._acquire(ticket, need, limits, deadline, cancel, domain)
            except Stopped as stop:
                return Begun(self, None, limits, deadline, cancel, FRESH, Finish((), error=(stop.kind, stop.message)))
            except RunCodeError as exc:
                # No worker could be started (its fork server was lost, it was
                # killed as it booted): nothing of the program ran, so another
                # worker is tried, once; then it is the run's error, not the caller's.
                if self._core.closed:
                    raise
                if not retried and not isinstance(exc, _StartTimedOut) and time.monotonic() < deadline:
                    retried = True
                    continue
                message = f"no worker process could be started for the program: {exc}"
                return Begun(self, None, limits, deadline, cancel, FRESH, Finish((), error=("abort", message)))
            remote = _Remote(self, wid, worker_, program, names, limits, deadline, cancel)
            remote.again = (ticket, need, domain) if not retried else None
            try:
                remote.send_run()
            except NotStarted:
                self._release(wid, FRESH, False)
                continue  # the worker was dead before the run began: take another
            # The spare it took is replaced now, not when the run ends: a
            # replacement boots as SCHED_BATCH (it never preempts this run's
            # threads), and runs that follow each other find it ready sooner.
            if self.spares > 0:
                self._top_up()
            return Begun(self, remote, limits, deadline, cancel, domain, ticket=ticket)

    def _orphaned(self, ticket: Optional[int]) -> None:
        """A :class:`Begun` was lost before it ran (see ``Begun.__del__``): drop
        its ticket now if the pool's lock is free, else at the next hand-out."""
        if ticket is None:
            return
        self._orphans.append(ticket)
        if self._lock.acquire(blocking=False):  # (never wait: the collector may run under it)
            self._lock.release()
            self._drop_orphans()

    def _drop_orphans(self) -> None:
        while self._orphans:
            try:
                ticket = self._orphans.popleft()
            except IndexError:
                return
            self._drop(ticket)

    def _drop(self, ticket: Optional[int]) -> None:
        """Give back everything run ``ticket`` holds (see :meth:`PoolCore.drop`):
        its processes are killed and their places freed once they are gone.
        Idempotent; one deferred step."""
        if ticket is None:
            return
        with deferred():
            with self._lock:
                wids = self._core.drop(ticket)
                # (and any process whose place is gone: one an interrupt cut
                # off between its place and its process)
                wids += [wid for wid in self._workers if wid not in self._core.slots and wid not in wids]
                workers = [(wid, self._workers.pop(wid, None)) for wid in wids]
                self._cond.notify_all()
            for wid, w in workers:
                self._discard(wid, w)
            self._top_up()

    def domain(self, key: Hashable) -> "DomainRuntime":
        """A runtime that runs programs in this pool's workers, reusing warm
        workers between runs of trust domain ``key`` only (up to
        ``runs_per_worker`` runs each). Pass it as ``run_code(..., runtime=...)``.
        A worker that served ``key`` never serves another key or a run without
        one. Programs of one domain can then see traces of each other (the
        engine's state is fresh per run, the process is not): use one key per
        party that may see the other's programs and tool results."""
        if key is FRESH:
            raise TypeError("a trust domain key must not be None")
        hash(key)
        return DomainRuntime(self, key)

    @property
    def layers(self) -> dict[str, Any]:
        """Which protection layers the workers have (from the last worker's
        report; empty before the first worker started): see the README's
        security model."""
        return layers_of(self.os_bounds)

    def close(self) -> None:
        """Kill every worker and refuse new runs. Runs in flight end with ``abort``.
        Idempotent; called for every pool at interpreter exit."""
        with self._lock:
            wids = self._core.close()
            workers = [self._workers.pop(wid) for wid in wids if wid in self._workers]
            busy = {id(w) for w in workers if w.busy}
            self._cond.notify_all()
            empty, self._empty_dir = self._empty_dir, None
            server, self._server = self._server, None
            retired, self._retired = self._retired, []
            dying, self._dying = self._dying, []
        for _, w in dying:
            w.gone(0)
        for w in workers:
            if id(w) in busy:
                # Its run owns the pipes: it reads end-of-file, answers ``abort``
                # and closes them (closing them here could hand their numbers to
                # another open while that run still uses them).
                w.terminate()
            else:
                w.kill()
        for old in [server, *retired]:
            if old is not None:
                old.close()
        if empty is not None and self._owner == os.getpid():
            shutil.rmtree(empty, ignore_errors=True)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _cap(self, limits: Limits) -> int:
        # The engine's heap, one copy of the largest message the host sends
        # (the host refuses larger), and the interpreter's own growth.
        return 2 * limits.memory_bytes + self.memory_headroom

    def prestart(self, n: Optional[int] = None) -> None:
        """Start ``n`` fresh workers (default ``spares``, at least 1) now and wait
        for each to be ready (bounded, its context prepared), so the first runs
        find them ready.

        :raises RunCodeError: a worker could not start.
        """
        n = max(1, self.spares) if n is None else n
        with self._lock:
            if self._core.closed:
                raise RunCodeError("the worker pool is closed")
            room = min(n, self.size - len(self._core.slots))
            wids = [self._core._new(None) for _ in range(max(room, 0))]
        self._start_ready(wids)

    def wait_for_spares(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until :attr:`spares` fresh workers are
        idle and ready (each has said hello: bounded, its first context
        prepared), starting them if none are on their way; whether they are.
        False at once if the pool is closed or a spare could not start."""
        self._top_up()
        end = time.monotonic() + timeout
        with self._lock:
            while True:
                if self._core.spares_ready() >= self.spares:
                    return True
                left = end - time.monotonic()
                if left <= 0 or self._core.closed or self._spares_failed:
                    return False
                self._cond.wait(left)

    def pids(self) -> list[int]:
        """The process ids of the live workers (for monitoring and tests)."""
        with self._lock:
            return sorted(w.proc.pid for w in self._workers.values())

    def __repr__(self) -> str:
        return f"WorkerPool(size={self.size}, spares={self.spares}, start_method={self.start_method!r})"

    # -- workers ---------------------------------------------------------------

    def _acquire(
        self, ticket: int, need: int, limits: Limits, deadline: float, cancel: Optional[Cancel], domain: Any
    ) -> tuple[int, Worker]:
        """A worker for run ``ticket``, ready (it has said hello) and marked busy."""
        if self._orphans:
            self._drop_orphans()
        while True:
            wid, w, retire = self._place(ticket, need, limits, deadline, cancel, domain)
            if retire is not None:
                retire.kill()
            if w is None:
                w = self._start(wid)
                if w is None:
                    raise RunCodeError("the worker pool is closed")
            elif w.proc.poll() is not None:
                self._release(wid, FRESH, False)
                continue
            self._ready(wid, w, limits, deadline)
            if self._spares_failed:  # a worker started again: so may the spares
                with self._lock:
                    self._spares_failed = False
                self._top_up()
            return wid, w

    def _place(
        self, ticket: int, need: int, limits: Limits, deadline: float, cancel: Optional[Cancel], domain: Any
    ) -> tuple[int, Optional[Worker], Optional[Worker]]:
        """Wait (first come, first served) for the core to grant a place: the
        worker id, its process if it has one already, and a worker to kill first.
        Deferred (the core's state is never left half changed) but while it
        waits."""
        LOCAL.depth += 1
        try:
            with self._lock:
                try:
                    while True:
                        verdict, wid, retire = self._core.ask(ticket, domain, need)
                        if verdict != WAIT:
                            assert wid is not None
                            if self._core.changed():
                                # This run has left the head of the queue: the next
                                # one may now get a place, and nothing else may wake
                                # it (the notify that told it of this place may have
                                # found it awake, behind this run; it then slept again).
                                self._cond.notify_all()
                            w = self._workers.get(wid)
                            if w is not None:
                                w.busy = True
                            return wid, w, (self._workers.pop(retire, None) if retire is not None else None)
                        LOCAL.depth -= 1
                        try:
                            self._wait_for_place(ticket, limits, deadline, cancel)
                        finally:
                            LOCAL.depth += 1
                except Closed:
                    raise RunCodeError("the worker pool is closed") from None
                except BaseException:
                    self._core.leave(ticket)
                    self._cond.notify_all()
                    raise
        finally:
            leave()

    def _wait_for_place(self, ticket: int, limits: Limits, deadline: float, cancel: Optional[Cancel]) -> None:
        """One wait on the condition (lock held); :class:`Stopped` at the deadline or on cancel."""
        remaining = deadline - time.monotonic()
        if cancel is not None and cancel.is_set():
            raise Stopped("cancelled", CANCELLED)
        if remaining <= 0:
            raise Stopped("timeout", timeout_message(limits.timeout, "waiting for a free worker process"))
        self._cond.wait(min(remaining, CANCEL_POLL) if cancel is not None else remaining)

    def _ready(self, wid: int, w: Worker, limits: Limits, deadline: float) -> None:
        """Read the worker's hello, if not read yet; its place is given back on any failure."""
        try:
            if not w.ready:
                w.hello(min(deadline, time.monotonic() + self.start_timeout))
                self.os_bounds = w.os_bounds
        except StartTimeout:
            self._release(wid, FRESH, False)
            if time.monotonic() >= deadline:
                raise Stopped(
                    "timeout", timeout_message(limits.timeout, "waiting for a worker process to start")
                ) from None
            raise _StartTimedOut(
                f"a worker process did not start within {self.start_timeout:g}s ({self.python})"
            ) from None
        except BaseException:  # RunCodeError (it could not start), KeyboardInterrupt
            self._release(wid, FRESH, False)
            raise

    def _start(self, wid: int) -> Optional[Worker]:
        """Start the process for the place ``wid`` the core reserved for a run;
        ``None`` if the pool closed meanwhile. The place is given back on any
        failure, KeyboardInterrupt included, and no process or descriptor is
        left. The run reads the worker's hello itself (:meth:`_ready`)."""
        w = self._spawn(wid)
        return None if w is None else self._admit(wid, w)

    def _start_ready(self, wids: list[int], background: bool = False) -> None:
        """Start a spare for each place in ``wids`` and admit each once it is
        ready: it has said hello, so it is bounded and its context prepared
        (the worker prepares it before it says hello). The processes boot side
        by side (``background``: at the lowest priority until ready, see
        ``worker._boot_policy``). A place whose process could not start is
        given back, every place not yet started too, and the first error is
        raised."""
        booting: list[tuple[int, Worker]] = []
        try:
            for wid in list(wids):
                w = self._spawn(wid, background)
                wids.remove(wid)
                if w is not None:
                    booting.append((wid, w))
            while booting:
                wid, w = booting[0]
                try:
                    w.hello(time.monotonic() + self.start_timeout)
                except StartTimeout:
                    raise RunCodeError(
                        f"a worker process did not start within {self.start_timeout:g}s ({self.python})"
                    ) from None
                booting.pop(0)
                self.os_bounds = w.os_bounds
                self._admit(wid, w)
        except BaseException:
            with self._lock:
                for wid in wids + [b[0] for b in booting]:
                    self._core.started(wid, False)
                    self._workers.pop(wid, None)
                self._cond.notify_all()
            for _, w in booting:
                w.kill()
            raise

    def _spawn(self, wid: int, background: bool = False) -> Optional[Worker]:
        """The process for place ``wid``, booting, owned by the calling thread
        (``busy``: a close kills it but leaves its pipes to this thread);
        ``None`` if the pool closed meanwhile. On any failure the place is
        given back and nothing is left."""
        w: Optional[Worker] = None
        try:
            server = self._fork_server()
            with self._lock:
                cwd = self._empty_dir
            assert cwd is not None
            name = f"nous-sched-worker-{next(_numbers)}"
            # One deferred step: a process made is a process the pool knows
            # (an interrupt between would leave it running, holding its pipes).
            with deferred():
                w = Worker(name, self.python, cwd, server, self._options_for(cwd), background)
                with self._lock:
                    kill = wid not in self._core.slots
                    if not kill:
                        w.busy = True
                        self._workers[wid] = w
        except BaseException:
            with self._lock:
                self._core.started(wid, False)
                self._workers.pop(wid, None)
                self._cond.notify_all()
            if w is not None:
                w.kill()
            raise
        if kill:
            with self._lock:
                self._core.started(wid, False)
            w.kill()
            return None
        return w

    def _admit(self, wid: int, w: Worker) -> Optional[Worker]:
        """Tell the core the process for ``wid`` exists (a spare: is ready);
        ``None`` (and it is killed) if its place is gone meanwhile."""
        with self._lock:
            kill = self._core.started(wid, True) or wid not in self._core.slots
            if kill:
                self._workers.pop(wid, None)
            else:
                w.busy = self._core.slots[wid].state == "busy"
            self._cond.notify_all()
        if kill:
            w.kill()
            return None
        return w

    def _options_for(self, cwd: str) -> dict[str, Any]:
        return {**self._options, "root": cwd}

    def _fork_server(self) -> Optional[ForkServer]:
        """The fork server, held for one spawn (:meth:`ForkServer.hold`), or
        ``None`` for ``spawn``; started on first need, restarted if it died,
        replaced once it has forked ``SERVER_CHILDREN`` workers (its
        successor starts in the background a quarter of them before, so the
        spawns go on meanwhile). Also makes the workers' empty folder."""
        while True:
            with self._server_lock:
                with self._lock:
                    if self._core.closed:
                        raise RunCodeError("the worker pool is closed")
                    if self._empty_dir is None:
                        self._empty_dir = tempfile.mkdtemp(prefix="nous-sched-cwd-")
                        os.chmod(self._empty_dir, 0o755)  # a worker dropped to nobody may enter it
                    server, cwd = self._server, self._empty_dir
                if self.start_method != "forkserver":
                    return None
                if server is not None and server.alive() and server.hold():
                    if server.limit and server.spawned >= server.limit - server.limit // 4:
                        self._start_successor()
                    return server
                successor = self._successor
                if successor is None:
                    fresh = self._new_server(cwd)
                    if not fresh.hold() or not self._adopt(fresh):
                        fresh.close()
                        raise RunCodeError("the worker pool is closed")
                    return fresh
            successor.join(self.start_timeout + 5.0)  # (then it is adopted, or failed: look again)

    def _new_server(self, cwd: str) -> ForkServer:
        return ForkServer(
            self.python, quickjs_origin(), cwd, self._options_for(cwd), self.start_timeout, self._server_children
        )

    def _start_successor(self) -> None:
        """(``_server_lock`` held.) Start the current server's successor in the
        background, once: a thread of its own starts it and adopts it."""
        if self._successor is not None:
            return
        with self._lock:
            cwd = self._empty_dir
        assert cwd is not None

        def replace() -> None:
            try:
                fresh: Optional[ForkServer] = self._new_server(cwd)
            except Exception:  # (RunCodeError): the next spawn starts one itself, and says why
                fresh = None
            with self._server_lock:
                self._successor = None
                if fresh is not None and not self._adopt(fresh):
                    fresh.close()

        self._successor = threading.Thread(target=replace, name=f"nous-sched-forkserver-{id(self):x}", daemon=True)
        self._successor.start()

    def _adopt(self, server: ForkServer) -> bool:
        """Make ``server`` the one new workers are forked from; the one it
        replaces is retired, and closes once its last child is gone."""
        with self._lock:
            if self._core.closed:
                return False
            old, self._server = self._server, server
            if old is not None:
                self._retired = [s for s in self._retired if s.alive()] + [old]
        if old is not None:
            old.retire()
        return True

    def _release(self, wid: int, domain: Any, reusable: bool) -> None:
        """A run is over on worker ``wid``: keep it (its domain's, idle) or kill
        it. One deferred step."""
        LOCAL.depth += 1
        try:
            self._release_now(wid, domain, reusable)
        finally:
            leave()

    def _release_now(self, wid: int, domain: Any, reusable: bool) -> None:
        with self._lock:
            w = self._workers.get(wid)
            # (A run without a domain: its worker is killed, not told to tidy up.)
            keep = reusable and domain is not FRESH and w is not None and w.finish_run()
            keep = keep and self._core.release(wid, domain, reusable)
            if not keep:
                self._core.release(wid, domain, False)  # (the place is held until the process is gone)
                w = self._workers.pop(wid, None)
            elif w is not None:
                w.busy = False
                self._cond.notify_all()
        if not keep:
            self._discard(wid, w)
        self._top_up()

    def _discard(self, wid: int, w: Optional[Worker]) -> None:
        """Kill ``w``; its place is given back once it is gone. A fork server's
        child is waited for by the spares thread, off the run's thread."""
        later = False
        try:
            later = w is not None and w.discard()
        finally:
            with self._lock:
                if later and w is not None and not self._core.closed:
                    self._dying.append((wid, w))
                else:
                    self._core.dead(wid)
                    self._cond.notify_all()
        if later and w is not None and self._core.closed:
            w.gone(0)

    # -- spares ------------------------------------------------------------------

    def _top_up(self) -> None:
        """Have the spares thread start the spares the core wants and reap the
        discarded workers: wake it, or start it if there is none. Called when a
        run takes a spare and when a run ends (a spare boots as
        ``SCHED_BATCH``, so it never preempts the run: see
        ``worker._boot_policy``). One deferred step: a spares thread made is
        a spares thread started."""
        with deferred(), self._lock:
            if self._core.closed:
                return
            if self._spare_thread is not None:
                self._cond.notify_all()  # (it lingers, waiting on the condition)
                return
            wids = [] if self._spares_failed else self._core.want_spares()
            if not wids and not self._dying:
                return
            self._spare_thread = threading.Thread(
                target=self._keep_spares, args=(wids,), name=f"nous-sched-spares-{id(self):x}", daemon=True
            )
            self._spare_thread.start()

    def _keep_spares(self, wids: list[int]) -> None:
        """The spares thread: start fresh workers while the core wants them and
        reap the discarded ones; exit once there has been nothing to do for
        :data:`SPARES_LINGER` seconds (so a busy pool starts no thread per run,
        and no thread stays behind an idle one)."""
        try:
            while True:
                self._start_ready(wids, _BACKGROUND_SPARES)  # (it gives every place back if it fails)
                self._reap()
                with self._lock:
                    more = self._spares_work(time.monotonic() + SPARES_LINGER)
                    if more is None:
                        self._spare_thread = None
                        return
                    wids = more
        except Exception:  # (RunCodeError, OSError): a run that needs a worker will say why
            with self._lock:
                self._spares_failed = True
                self._spare_thread = None
                self._cond.notify_all()

    def _spares_work(self, until: float) -> Optional[list[int]]:
        """(With the lock held.) The places of the next spares to start, once
        there are some or a discarded worker to reap, waiting until ``until``;
        ``None`` when none came by then or the pool is closed."""
        while True:
            if self._core.closed or self._owner != os.getpid():
                return None
            wids = [] if self._spares_failed else self._core.want_spares()
            if wids or self._dying:
                return wids
            left = until - time.monotonic()
            if left <= 0:
                return None
            self._cond.wait(left)

    def _reap(self) -> None:
        """Wait for the killed workers to be gone; give their places back."""
        with self._lock:
            dying, self._dying = self._dying, []
            self._reaping += len(dying)
        for wid, w in dying:
            try:
                w.gone(2.0)
            finally:
                with self._lock:
                    self._reaping -= 1
                    self._core.dead(wid)
                    self._cond.notify_all()

    def _reaped(self, timeout: float) -> bool:
        """Wait up to ``timeout`` until every discarded worker is gone and its
        pidfd closed (the spares thread reaps them after their runs); whether
        they are. For tests that count processes and descriptors."""
        end = time.monotonic() + timeout
        with self._lock:
            while self._dying or self._reaping:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def _after_fork_in_child(self) -> None:
        # The workers belong to the parent: forget them (closing our copies of
        # their pipes) without killing them. The child starts its own on demand.
        for w in list(self._workers.values()):
            w.forget()
        for server in [self._server, *self._retired]:
            if server is not None:
                server.forget()
        self._reset()


class DomainRuntime(CodeRuntime):
    """A :class:`WorkerPool` seen by the runs of one trust domain (see
    :meth:`WorkerPool.domain`)."""

    language = "javascript"

    def __init__(self, pool: WorkerPool, key: Hashable) -> None:
        self.pool = pool
        self.key = key

    def run(self, program: str, host: Host, limits: Limits) -> RuntimeOutcome:
        return self.begin(program, host.names, limits, host.cancel).run(host)

    def begin(self, program: str, names: Sequence[str], limits: Limits, cancel: Optional[Cancel] = None) -> "Begun":
        return self.pool.begin(program, names, limits, cancel, domain=self.key)

    def __repr__(self) -> str:
        return f"{self.pool!r}.domain({self.key!r})"


def layers_of(bounds: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The README's table of layers, from a worker's report of its bounds."""
    if not bounds:
        return {}
    seccomp = bounds.get("seccomp")
    return {
        "seccomp_allow_list": bool(seccomp),
        "no_new_privs": bool(bounds.get("no_new_privs")),
        "unprivileged": bounds.get("dropped_to") is not None or os.geteuid() != 0,
        "capabilities_cleared": bool(bounds.get("capabilities_cleared")) or os.geteuid() != 0,
        "namespaces": tuple(bounds.get("namespaces") or ()),
        "empty_root": bool(bounds.get("empty_root")),
        "parent_death_signal": bool(bounds.get("pdeathsig")),
        "task_bound": bool(bounds.get("task_bound")),
        "own_session": bool(bounds.get("own_session")),
        "cpu_share": "session" if bounds.get("own_session") and bounds.get("autogroup") else "one thread",
        "address_space_limit": "RLIMIT_NOFILE" in bounds.get("rlimits", {}),
        "wall_clock_stop": bool(bounds.get("wall_clock_stop")),
    }


class Begun:
    """A program started in a worker by :meth:`WorkerPool.begin`, waiting for its host."""

    def __init__(
        self,
        pool: WorkerPool,
        remote: Optional["_Remote"],
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
            return _outcome(self._early)
        try:
            finish = drive(remote, host, self._limits, self._deadline, self._cancel)
            remote.relay.close()  # before the worker goes back: no settle is written after this
            # After any abort (memory, stack, a tampered bridge) the worker is retired.
            reusable = remote.reusable and (finish.error is None or finish.error[0] not in ("abort", "cancelled"))
            self._pool._release(remote.wid, self._domain, reusable)
        except BaseException:
            # KeyboardInterrupt (or a host bug): the worker may be mid-step. Kill
            # it, replace it later, and let the exception go on at once.
            LOCAL.depth += 1
            try:
                remote.relay.close()
                self._pool._drop(self._ticket)
            finally:
                leave()
            raise
        return _outcome(finish)

    def abandon(self) -> None:
        """Never drive it: its worker is killed (the answer it is writing will never
        be read) and replaced. Idempotent."""
        with deferred():
            remote, self._remote = self._remote, None
            if remote is not None:
                remote.relay.close()
            # (Also when run() was cut before its first step: the ticket
            # still holds the worker. After a run that ended, it holds nothing.)
            self._pool._drop(self._ticket)

    def __del__(self) -> None:
        # Never driven nor abandoned: an interrupt landed between begin()
        # returning it and the caller keeping it. Its worker goes, later if
        # the pool's lock is taken (this may run inside the garbage collector).
        remote = getattr(self, "_remote", None)
        if remote is not None:
            self._remote = None
            remote.relay.close()
            self._pool._orphaned(self._ticket)


def _outcome(finish: Finish) -> RuntimeOutcome:
    error = None if finish.error is None else RunError(*finish.error)
    return RuntimeOutcome(finish.logs, result=finish.result, error=error)


#: What a durable run's envelope may carry beside what :func:`max_frame`
#: counts: the clock values it read (``Date.now()``, ``Math.random()``), each
#: at most about 25 bytes of JSON, of which a durable run may read 100,000.
CLOCK_ALLOWANCE = 4 * _MIB
#: What one call costs an envelope beside its arguments: its id, its name (the
#: prelude cuts it at 1024 characters, each escaped in at most 6 bytes), its
#: call site (a durable run's), the brackets and commas.
_PER_CALL = 6 * 1024 + 64


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
    parts: list[bytes] = []
    for item in batch:
        data = item[4].encode("utf-8", "surrogatepass")
        parts += (b"%d %d %d " % (item[0], item[3], len(data)), data)
    return worker.frame(worker.SETTLE, *parts)


class _Relay:
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
    non-blocking, into a pipe that is empty (one frame is in flight at a
    time, and the worker reads a frame whole before it answers), so any
    frame the pipe can hold goes in one write whatever the worker is doing,
    stuck or stopped. Whatever it cannot finish (a frame larger than the
    pipe's buffer, a payload the worker must not get, an error), it hands to
    the driving thread: :attr:`handoff`, and a byte on the wake pipe; that
    thread sends the rest with the deadline and kill as any step's
    (:meth:`_Remote.answers`). It never raises into the driver.

    ``lock`` guards :attr:`state`, the batch, the hand-off fields and the
    writes. Only :data:`ARMED` lets a kick act: the driving thread sets it
    under the lock and takes it back (deadline, cancel, the worker's end of
    file) under the lock, so a frame is written exactly when the driving
    thread is waiting for its answer, never after the run has moved on.
    """

    ARMED = "armed"  # the worker is idle; the head's commit sends the next batch
    SENT = "sent"  # a kick took a batch (written, or handed off)
    IDLE = "idle"  # the driving thread's own: kicks do nothing

    def __init__(self, remote: "_Remote") -> None:
        self.remote = remote
        self.lock = threading.Lock()
        self.state = self.IDLE
        self.take: Any = None
        self.batch: list[Any] = []
        self.handoff = False  # the driving thread must finish the send
        self.unsent: Optional[memoryview] = None  # what the write left, or None: the whole frame
        self.error: Optional[BaseException] = None  # what the kick raised, for the driving thread
        self.wake = (-1, -1)

    def settled(self, take: Any, head: PendingCall) -> list[Any]:
        """Wait for ``head`` to commit and its batch to be sent; the batch
        (``[]``: the deadline came first, nothing sent). :class:`Stopped` on
        cancel or the worker's end before anything was sent."""
        remote = self.remote
        if self.wake[0] < 0:
            with deferred():  # a pipe made is a pipe close() closes
                r, w = self.wake = os.pipe()
                os.set_blocking(r, False)
                os.set_blocking(w, False)
        self.take = take
        with self.lock:
            self.state = self.ARMED
        try:
            if head.done():  # published before the hook was set: no one else will kick
                self.kick()
            while True:
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
                if self.state is self.SENT:
                    return self._taken()
                if spoke and self._disarm():
                    # Answering nothing: its end of file, or a broken protocol.
                    remote._answer()
                    remote._broken()
        finally:
            head.on_done(None)
            with self.lock:
                self.state = self.IDLE

    def _disarm(self) -> bool:
        """Take the worker back from the kicks; whether no batch was taken."""
        with self.lock:
            if self.state is self.ARMED:
                self.state = self.IDLE
                return True
            return False

    def _taken(self) -> list[Any]:
        """The batch a kick took; what it raised, raised here."""
        with self.lock:
            batch, self.batch = self.batch, []
            error, self.error = self.error, None
            self.state = self.IDLE
        if error is not None:
            self.handoff = False
            raise error
        return batch

    def answers(self, batch: Sequence[Any]) -> list[str]:
        """The envelopes answering ``batch``, which :meth:`settled` sent (:meth:`_Remote.answers`)."""
        return self.remote.answers(batch)

    def kick(self) -> None:
        """The head has committed (on the thread that published it): send the
        batch, or hand it to the driving thread. Never blocks, never raises."""
        try:
            with self.lock:
                if self.state is not self.ARMED:
                    return
                batch = self.take(None)
                if not batch:
                    return
                self.batch = batch
                self.state = self.SENT
                if self._write(batch):
                    return
                self.handoff = True
                self._wake()
        except BaseException as exc:  # (a payload the encoder refuses, MemoryError): the run's to raise
            with self.lock:
                self.error = exc
                self.handoff = True
                self.state = self.SENT
                self._wake()

    def _write(self, batch: list[Any]) -> bool:
        """Write ``batch``'s frame, or what the pipe takes of it (the rest in
        :attr:`unsent`); whether there is nothing left to do. Under ``lock``."""
        remote = self.remote
        if len(batch[0][4]) > remote.limits.memory_bytes:
            return False  # the driving thread refuses it (_Remote._check)
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
                self.state = self.IDLE
                wake, self.wake = self.wake, (-1, -1)
            for fd in wake:
                if fd >= 0:
                    os.close(fd)


class _Remote:
    """The engine's steps, run in a worker: what :func:`drive` calls in the host."""

    def __init__(
        self,
        pool: WorkerPool,
        wid: int,
        w: Worker,
        program: str,
        names: Any,
        limits: Limits,
        deadline: float,
        cancel: Optional[Cancel],
    ) -> None:
        self.pool = pool
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
        self.relay = _Relay(self)
        #: (ticket, need, domain) while the run may still move to another
        #: worker: its first answer has not come, and it has not moved before.
        self.again: Optional[tuple[int, int, Any]] = None
        self._starting = False

    def send_run(self) -> None:
        """Send the run frame. :class:`~nous_sched.runtime.procio.NotStarted` if the worker is gone."""
        w = self.worker
        limits = self.limits
        # A worker's memory cap is set by its first run, for good: a later run
        # that needs less may use it, one that needs more gets another worker.
        cap = self.pool._cap(limits) if w.cap is None else 0
        body = json.dumps(
            {
                "program": self.program,
                "names": list(self.names),
                "limits": [getattr(limits, f) for f in worker.LIMIT_FIELDS],
                "remaining": max(self.deadline - time.monotonic(), 0.0),
                "memory_cap": cap,
            }
        ).encode("utf-8", "surrogatepass")
        try:
            w.send(worker.frame(worker.RUN, body), self.until)
        except BrokenPipeError:
            self.reusable = False
            raise NotStarted from None
        except Expired:
            self.unsent = True  # a timeout, said by start() (inside drive)
            return
        if cap:
            w.cap = cap
            with self.pool._lock:
                self.pool._core.set_cap(self.wid, cap)

    def start(self) -> str:
        """The first step: the answer to the run frame :meth:`send_run` sent.
        A worker that dies before it (killed, its fork server lost; not out
        of memory) has answered nothing and the host has served none of the
        program's calls: the program is started again on another worker,
        once, within the deadline."""
        if self.unsent:
            return self._expired()
        self._starting = self.again is not None
        try:
            return self._answer()
        except _Lost:
            pass
        finally:
            self._starting = False
        return self._restart()

    def _restart(self) -> str:
        assert self.again is not None
        ticket, need, domain = self.again
        self.again = None
        pool = self.pool
        pool._release(self.wid, FRESH, False)
        try:
            self.wid, self.worker = pool._acquire(ticket, need, self.limits, self.deadline, self.cancel, domain)
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
        self._send_settles(settle_frame(batch))
        return self._answers(batch, self._spin())

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
        if relay.handoff:
            relay.handoff = False
            rest, relay.unsent = relay.unsent, None
            self._check(batch)
            self._send_settles(settle_frame(batch) if rest is None else rest)
        return self._answers(batch, 0.0, ready=True)

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

    def _answers(self, batch: Sequence[Sequence[Any]], spin: float, ready: bool = False) -> list[str]:
        """One answer per call of ``batch``: the worker writes them at once."""
        texts: list[str] = []
        try:
            for _ in batch:
                texts.append(self._answer(len(batch) - len(texts), spin, ready))
                spin = 0.0  # the rest came with the first
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
        try:
            return self._receive(spin, ready)
        except Expired:
            # The deadline passed mid-step: the worker's engine stops now,
            # keeping its logs; the kill comes only if it has not by the grace.
            return self._stop_softly(self.until, signal.SIGUSR1, self.cancel)
        except Stopped:
            return self._cancel_softly(expected)

    def _spin(self) -> float:
        """How long to look for the next answer busily (see :mod:`.wake`)."""
        pool = self.pool
        return pool._wake.spin(len(pool._core.slots) - len(pool._core.idle))

    def _receive(self, spin: float, ready: bool = False) -> tuple[bytes, bytes]:
        w = self.worker
        answer = w.receive(self.deadline, self.cancel, self.max_frame, spin, ready)
        if spin:
            self.pool._wake.answered(w.missed)
            w.missed = False
        return answer

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
        :class:`Expired` at ``until`` or if it dies meanwhile."""
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

    def _died(self) -> str:
        self.reusable = False
        reason = self.worker.exit_reason()
        self.worker.kill()
        if self._starting and self.worker.proc.returncode != worker.EXIT_MEMORY and time.monotonic() < self.deadline:
            raise _Lost
        if self.worker.proc.returncode == worker.EXIT_MEMORY:
            raise Stopped("abort", memory_message(self.limits.memory_bytes, " (its worker process ran out of memory)"))
        raise Stopped("abort", f"the worker process running the program died ({reason})")

    def _broken(self) -> NoReturn:
        self._kill()
        raise Stopped("abort", "the worker process broke the protocol; it was killed")


# -- every pool in the process -----------------------------------------------------

_POOLS: "weakref.WeakSet[WorkerPool]" = weakref.WeakSet()
_default: Optional[WorkerPool] = None
_default_lock = threading.Lock()


def default_pool() -> WorkerPool:
    """The process's default :class:`WorkerPool`, created on first use."""
    global _default
    pool = _default
    if pool is None:
        with _default_lock:
            if _default is None:
                _default = WorkerPool()
            pool = _default
    return pool


def _close_all() -> None:
    for pool in list(_POOLS):
        pool.close()


def _after_fork_in_child() -> None:
    global _default_lock
    _default_lock = threading.Lock()
    for pool in list(_POOLS):
        pool._after_fork_in_child()


atexit.register(_close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

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
the spare a run took is replaced once the run's start-up is over
(:data:`SPARE_CALM` after it first waits for a tool, and once the calls it
made by then have begun: :data:`SPARE_BEGUN_LIMIT`; or when it ends), or
at once when it took the last spare ready or runs wait; while runs find
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
the settle frame itself (:class:`Relay`): one batch of steps is one pipe
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

Places for waiting, shares for CPU: a run holds its worker (a *place*,
:attr:`WorkerPool.size` of them, bounded by memory) for its whole length,
but one of :attr:`WorkerPool.cpu_shares` *CPU shares* only while its worker
computes a step, from the frame that starts it until its answers are in;
the scheduler's driver never waits for one (when none is free, the run's
own thread waits for it, first come, first served, within the deadline).
A worker's start-up is CPU too: a run that would wait for a share, or
finds no spare ready, holds only a reserved place until it has a share;
then it takes a spare ready by then or starts its own process under it.

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
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import weakref
from typing import Any, Deque, Hashable, Optional, Sequence

from .. import _validators as v
from .._interrupts import LOCAL, Condition, deferred, leave
from .._validators import require
from ..errors import RunCodeError
from . import Cancel, CodeRuntime, Host, Limits, RuntimeOutcome
from ._remote import Begun, Remote
from .engine import (
    CANCEL_POLL,
    CANCELLED,
    Finish,
    Stopped,
    timeout_message,
)
from .poolcore import FRESH, WAIT, Closed, PoolCore
from .procio import ForkServer, NotStarted, StartTimeout, Worker, quickjs_origin
from .wake import CPUS, SPIN, SPIN_BACKOFF, SPIN_BACKOFF_MAX, WakePolicy

__all__ = ["Begun", "WorkerPool", "default_pool", "SPIN", "SPIN_BACKOFF", "SPIN_BACKOFF_MAX"]

_MIB = 1024 * 1024
_numbers = itertools.count(1)
_tickets = itertools.count(1)
_START_METHODS = v.one_of(("forkserver", "spawn"))
_GRACE = v.Check("a number of seconds from 0 to 60", lambda x: v.WAIT_SECONDS.accepts(x) and x is not None and x <= 60)
_HEADROOM = v.int_at_least(16 * _MIB, "an int of at least 16 MiB (16777216)")
_ID = v.Check("an int from 1 to 2**31-1", lambda x: isinstance(x, int) and not isinstance(x, bool) and 0 < x < 2**31)
_SPARES = v.Check("an int of at least 0", lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= 0)
#: The default :attr:`WorkerPool.size` (places: worker processes alive): twice
#: the core count, at least this. Places are bounded by memory, not CPU: a
#: fresh worker holds about 3.0 MiB of its own, a run's worker about 7 MB
#: plus its program's heap; a run waiting on a tool holds its place but no
#: CPU share (:func:`default_cpu_shares`).
MIN_DEFAULT_SIZE = 64
_HAS_FORK_SERVER = sys.platform.startswith("linux") and hasattr(os, "pidfd_open")
#: Spares boot at the lowest priority (a run's own worker at the normal one).
_BACKGROUND_SPARES = True
#: Seconds the spares thread waits for more work before it exits.
SPARES_LINGER = 1.0
#: Seconds after a run first waits for a tool before the spare it took is
#: replaced (when another spare was still ready: see ``PoolCore.hold``). A
#: spare's boot is about 4-5 ms of CPU: started as the run takes its spare,
#: it competes with the run's own start-up (the worker's first step, the
#: tool threads' hand-off) on a small machine; by this long into the wait
#: the run's calls have all begun (``benchmarks/bench_fanout_timeline.py``).
#: A run that ends sooner has its spare replaced as it ends.
SPARE_CALM = 0.001
#: ... and not before the calls the run has made by then have begun their
#: tools (``Host.when_begun``), so a wide fan-out's hand-off to its tool
#: threads does not compete with the boot; but at most this many seconds
#: past :data:`SPARE_CALM` (a call waiting for its throttle does not begin).
SPARE_BEGUN_LIMIT = 0.005
#: After a spare could not start (killed as it booted, its fork server lost),
#: the spares thread tries again this many seconds later, twice as long after
#: each further failure in a row, :data:`SPARES_RETRIES` times; then it leaves
#: starting to the runs until one starts a worker (an interpreter that cannot
#: start workers at all is not tried for ever).
SPARES_RETRY = 0.25
SPARES_RETRIES = 4
#: Seconds a step computes in its worker while runs wait for a CPU share
#: before it is parked (its worker stopped) and queued again behind them
#: (see ``PoolCore.park_due``). Long enough that a step of an honest
#: program (milliseconds) is never parked and the stops cost nothing
#: measurable (two signals a slice); short enough that a run queued behind
#: programs that spin gets a share within a slice per share in use.
SHARE_SLICE = 0.05
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


class _StartTimedOut(RunCodeError):
    """A worker said nothing within ``start_timeout``: another would cost as long."""


def default_size() -> int:
    """The default pool size (places) on this machine: twice its core count, at least :data:`MIN_DEFAULT_SIZE`."""
    return max(MIN_DEFAULT_SIZE, 2 * CPUS)


def default_cpu_shares() -> int:
    """The default :attr:`WorkerPool.cpu_shares` on this machine: its core count
    (the CPUs this process may run on)."""
    return CPUS


def _carry_names(old: ForkServer, fresh: ForkServer) -> None:
    """``fresh``, replacing ``old``, is offered the names texts ``old`` was
    sent: its children hold them, so a run of thousands of tools sends its
    key, not its text, from the first child on, as on ``old``'s."""
    for key, text in old.names_sent():
        fresh.offer_names(key, text)


class WorkerPool(CodeRuntime):
    """A pool of worker processes that run programs: the default runtime.

    Thread-safe: any number of threads may call :meth:`run` at once; each run
    gets a worker of its own, waiting (first come, first served) when all
    ``size`` places are taken. **Waiting for a free worker counts against the
    run's deadline**: a run that waits out its whole ``timeout`` in the queue
    returns ``timeout`` without starting.

    **Places for waiting, shares for CPU.** A run holds its *place* (its
    worker process) for its whole length, but one of the ``cpu_shares``
    *CPU shares* only while its worker computes: from the frame that starts
    a step (the run, or a batch of settled calls) until the step's answers
    are in. A run that waits on tools, approvals or throttles holds no
    share, so ``size`` (bounded by memory) can be far above the core count
    while at most ``cpu_shares`` programs compute at once. A run whose step
    finds every share taken waits for one, first come, first served, within
    its deadline and cancel (``timeout`` "waiting for a free CPU share").
    Starting a worker is computing too: a run that would wait for a share
    (or finds no spare ready) holds only a reserved place until it has one;
    then it takes a spare ready by then, or starts its worker process under
    the share. So a run that times out waiting for a share has cost no
    start-up, and the spares go to the runs whose turn has come
    (:meth:`shares` says how many compute and wait). **Shares are
    time-sliced**: a step that has computed for ``SHARE_SLICE`` (50 ms) while
    runs wait for a share is parked (its worker stopped) and queued again
    behind them, so programs that spin hold the shares a slice at a time;
    a parked run at its deadline, or cancelled, goes on at once to stop
    with its logs.

    **A fresh process per run.** A run gets a worker that has never run
    anything, which is discarded after it. To let runs of one trust domain
    (one user, one tenant) reuse warm workers, run them through
    ``pool.domain(key)``: a worker that served ``key`` serves nothing else.

    :param size: most worker processes alive at once (spares included), so
        most runs at once: the *places*. Default: twice the core count, at
        least 64 (``default_size``); a place costs memory (a fresh worker
        about 3.0 MiB of its own), not CPU.
    :param cpu_shares: most runs whose JavaScript computes at once. Default:
        the core count (``default_cpu_shares``).
    :param spares: fresh workers kept ready (within ``size``; default 2),
        each replaced in the background once the run that took it has
        started (at once if it was the last one ready); while
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
    :param uid: when the host runs as root, the user the workers drop to
        (default 65534, ``nobody``).
    :param gid: likewise, the group (default 65534, ``nobody``).
    :param namespaces: put each worker in new namespaces where the kernel
        allows it (default true): a mount namespace of its own, and IPC,
        network and UTS namespaces shared only with the other children of
        its fork server (``os_bounds["shared_namespaces"]``); :attr:`layers`
        says which are active.
    """

    language = "javascript"

    def __init__(
        self,
        size: Optional[int] = None,
        *,
        cpu_shares: Optional[int] = None,
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
        if cpu_shares is None:
            cpu_shares = default_cpu_shares()
        if start_method is None:
            start_method = "forkserver" if _HAS_FORK_SERVER else "spawn"
        require("WorkerPool", "size", size, v.POSITIVE_INT)
        require("WorkerPool", "cpu_shares", cpu_shares, v.POSITIVE_INT)
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
        self.cpu_shares = cpu_shares
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
        # _lock guards _core, _workers, _server, _empty_dir, _spare_thread,
        # _slicer and _share_waits; _cond (on _lock) is notified whenever the core's places
        # change; each run waiting for a CPU share waits on a condition of its
        # own (on _lock, in _share_waits), notified when it heads the queue
        # and a share is free. (The conditions are _interrupts': a Ctrl-C
        # landing in a run's wait leaves it holding _lock.)
        self._lock = threading.Lock()
        self._cond = Condition(self._lock)
        self._core = PoolCore(self.size, self.spares, self.runs_per_worker, cpu_shares=self.cpu_shares)
        self._share_waits: dict[Hashable, Condition] = {}
        # Runs queued for a place behind the head, each on its own condition:
        # a change wakes the head alone, not every queued run (each woken run
        # asked the core again: O(queued runs) wake-ups per change).
        self._place_waits: dict[Hashable, Condition] = {}
        self._workers: dict[int, Worker] = {}  # wid -> process, for every started worker
        self._server: Optional[ForkServer] = None
        self._retired: list[ForkServer] = []  # replaced fork servers, closed when their last child is gone
        self._server_lock = threading.Lock()  # held while the fork server starts
        self._successor: Optional[threading.Thread] = None  # starting the next fork server (_server_lock)
        self._spare_thread: Optional[threading.Thread] = None
        # Parks the step whose slice is over while runs wait for a share (see
        # _slice_shares): alive while the share queue is not empty.
        self._slicer: Optional[threading.Thread] = None
        # Runs whose held replacement is wanted from an instant on (see _calm): ticket -> monotonic time.
        self._calm_at: dict[int, float] = {}
        # The runs of _calm_at whose calls have not all begun: when the replacement starts anyway.
        self._unbegun: dict[int, float] = {}
        self._dying: list[tuple[int, Worker]] = []  # killed fork server children, not yet gone
        # Fork server children whose run is over, killed by the spares thread
        # (not on the run's thread: see _release_now), then gone like _dying's.
        self._killing: list[tuple[int, Worker]] = []
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
        one of ``Begun.run`` (with a host whose ``names`` are ``names`` and
        whose ``cancel`` is ``cancel``) or ``Begun.abandon`` must follow.
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
            remote = Remote(self, wid, worker_, program, names, limits, deadline, cancel, ticket)
            remote.again = (ticket, need, domain) if not retried else None
            try:
                remote.send_run()
            except NotStarted:
                self._release(wid, FRESH, False)
                continue  # the worker was dead before the run began: take another
            except Stopped as stop:  # no CPU share came within the deadline, or cancelled
                self._release(wid, FRESH, False)
                return Begun(self, None, limits, deadline, cancel, FRESH, Finish((), error=(stop.kind, stop.message)))
            # The spare it took is replaced now unless the run holds its
            # replacement back (another spare is ready; see _calm): then once
            # its start-up is over, not beside it.
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
                wids = self._core.drop(ticket)  # (its place, its share, its place in each queue)
                # (and any process whose place is gone: one an interrupt cut
                # off between its place and its process)
                wids += [wid for wid in self._workers if wid not in self._core.slots and wid not in wids]
                workers = [(wid, self._workers.pop(wid, None)) for wid in wids]
                self._notify()
                self._wake_share_head()
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
            self._notify()
            empty, self._empty_dir = self._empty_dir, None
            server, self._server = self._server, None
            retired, self._retired = self._retired, []
            dying, self._dying = self._dying, []
            killing, self._killing = self._killing, []
            for waiting in self._share_waits.values():
                waiting.notify_all()  # (a closed pool grants every share: they find their workers killed)
        for _, w in dying:
            w.gone(0)
        exiting = []
        for _, w in killing:
            if w.discard():
                exiting.append(w)
        for w in workers:
            if id(w) in busy:
                # Its run owns the pipes: it reads end-of-file, answers ``abort``
                # and closes them (closing them here could hand their numbers to
                # another open while that run still uses them).
                w.terminate()
            elif w.discard():  # killed, its pipes closed; a spawned worker is reaped here
                exiting.append(w)
        for w in exiting:
            # All killed before any is waited for, so their exits overlap, and
            # nothing asks the fork server for an exit status nobody reads.
            w.gone(5.0)
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
            wids = [self._core._new(None) for _ in range(max(room, 0))]  # noqa: SLF001
        self._start_ready(wids)

    def wait_for_spares(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until ``spares`` fresh workers are
        idle and ready (each has said hello: bounded, its first context
        prepared), starting them if none are on their way; whether they are.
        False at once if the pool is closed or a spare could not start.
        Replacements held back by runs in their start-up are started now."""
        with self._lock:
            self._core.release_holds()
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

    def shares(self) -> tuple[int, int]:
        """``(computing, waiting)``: the runs holding a CPU share now and the
        runs waiting for one, parked runs included (for monitoring and
        tests). A run waiting for its first share has no worker process of
        its own yet."""
        with self._lock:
            return len(self._core.computing), len(self._core.share_queue)

    def places(self) -> tuple[int, int]:
        """``(taken, waiting)``: the places of ``size`` taken now (by runs,
        spares and workers starting) and the runs queued for one, first come
        first served (for monitoring and tests)."""
        with self._lock:
            return len(self._core.slots), len(self._core.waiting)

    def pids(self) -> list[int]:
        """The process ids of the live workers (for monitoring and tests)."""
        with self._lock:
            return sorted(w.proc.pid for w in self._workers.values())

    def __repr__(self) -> str:
        return (
            f"WorkerPool(size={self.size}, cpu_shares={self.cpu_shares}, spares={self.spares}, "
            f"start_method={self.start_method!r})"
        )

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
            fresh = False
            if w is None:
                # A start-up is CPU: the run's own process is started once the
                # run holds a share, which it keeps into its first step (see
                # PoolCore), so a run that waits for one has started nothing;
                # a spare ready by then is taken instead.
                self._share_to_start(ticket, limits, deadline, cancel)
                wid, w = self._swap(ticket, wid)
                if w is None:
                    fresh = True
                    try:
                        w = self._start(wid)
                    except BaseException:
                        self._give_share(ticket)
                        raise
                    if w is None:
                        self._give_share(ticket)
                        raise RunCodeError("the worker pool is closed")
            if not fresh and w.proc.poll() is not None:
                self._release(wid, FRESH, False)
                self._give_share(ticket)  # (never held while it waits for a place)
                continue
            try:
                self._ready(wid, w, limits, deadline)
            except BaseException:
                self._give_share(ticket)  # (the place is given back already)
                raise
            if self._spares_failed:  # a worker started again: so may the spares
                with self._lock:
                    self._spares_failed = False
                self._top_up()
            return wid, w

    def _swap(self, ticket: int, wid: int) -> tuple[int, Optional[Worker]]:
        """Run ``ticket`` holds its share and the place ``wid`` reserved for its
        own process: a spare ready now instead (see :meth:`PoolCore.swap`),
        or ``wid`` and no process yet. One deferred step."""
        with deferred(), self._lock:
            spare = self._core.swap(ticket, wid)
            if spare is None:
                return wid, None
            w = self._workers[spare]
            w.busy = True
            self._notify()  # (the reserved place is free)
            return spare, w

    def _share_to_start(self, ticket: int, limits: Limits, deadline: float, cancel: Optional[Cancel]) -> None:
        """Wait for the CPU share that run ``ticket``'s start-up and first step
        compute under; its reserved place (no process yet) is given back if
        none came (:class:`Stopped`) or the wait was cut."""
        try:
            self._take_share(ticket, limits, deadline, cancel, False)
        except BaseException:
            self._drop(ticket)
            raise

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
                                # it (it sleeps on a condition of its own, which only
                                # a change at its turn notifies).
                                self._notify()
                            w = self._workers.get(wid)
                            if w is not None:
                                w.busy = True
                                # (Its replacement waits for this run's start-up, if a spare is still ready.)
                                self._core.hold(ticket, wid)
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
                    self._notify()
                    raise
        finally:
            leave()

    def _notify(self) -> None:
        """(Lock held.) Something changed: wake whatever waits on the pool's
        condition, and the run at the head of the place queue."""
        self._cond.notify_all()
        if self._core.closed:  # (the queue is cleared: every queued run must see it)
            for queued in self._place_waits.values():
                queued.notify()
            return
        head = self._core.queue_head()
        waiting = self._place_waits.get(head) if head is not None else None
        if waiting is not None:
            waiting.notify()

    def _wait_for_place(self, ticket: int, limits: Limits, deadline: float, cancel: Optional[Cancel]) -> None:
        """One wait on the condition (lock held); :class:`Stopped` at the deadline or on cancel."""
        remaining = deadline - time.monotonic()
        if cancel is not None and cancel.is_set():
            raise Stopped("cancelled", CANCELLED)
        if remaining <= 0:
            raise Stopped("timeout", timeout_message(limits.timeout, "waiting for a free worker process"))
        timeout = min(remaining, CANCEL_POLL) if cancel is not None else remaining
        if self._core.queue_head() in (None, ticket):
            self._cond.wait(timeout)
            return
        waiting = self._place_waits[ticket] = Condition(self._lock)
        try:
            waiting.wait(timeout)
        finally:
            del self._place_waits[ticket]

    # -- CPU shares ---------------------------------------------------------------

    def _share(self, ticket: int, limits: Limits, deadline: float, cancel: Optional[Cancel]) -> None:
        """Wait, first come first served, until run ``ticket`` holds a CPU share
        (at once if it holds one) for the step it is about to start in its
        worker, whose slice starts then (see ``SHARE_SLICE``).
        :class:`Stopped` at the deadline or on cancel. Deferred but while it
        waits; the queue is left whatever ends the wait."""
        self._take_share(ticket, limits, deadline, cancel, True)

    def _take_share(self, ticket: int, limits: Limits, deadline: float, cancel: Optional[Cancel], step: bool) -> None:
        """:meth:`_share`; for a start-up (not ``step``) no slice starts: its
        worker is not there to be parked yet."""
        LOCAL.depth += 1
        try:
            with self._lock:
                core = self._core
                if core.take_share(ticket, True):
                    if step:
                        core.slice_from(ticket, time.monotonic())
                    return
                waiting = Condition(self._lock)
                self._share_waits[ticket] = waiting
                if self._slicer is None and not core.closed:
                    self._slicer = threading.Thread(
                        target=self._slice_shares, name=f"nous-sched-slices-{id(self):x}", daemon=True
                    )
                    self._slicer.start()
                try:
                    while not core.take_share(ticket, True):
                        LOCAL.depth -= 1
                        try:
                            self._wait_for_share(waiting, limits, deadline, cancel)
                        finally:
                            LOCAL.depth += 1
                    if time.monotonic() >= deadline:
                        # Granted as the deadline passed (the runs ahead timed out
                        # together): a start-up or a step now would only be stopped.
                        core.give_share(ticket)
                        raise Stopped("timeout", timeout_message(limits.timeout, "waiting for a free CPU share"))
                    if step:
                        core.slice_from(ticket, time.monotonic())
                except BaseException:
                    core.leave_shares(ticket)
                    raise
                finally:
                    del self._share_waits[ticket]
                    self._wake_share_head()  # (the next run, if a share is still free)
        finally:
            leave()

    def _wait_for_share(self, waiting: Condition, limits: Limits, deadline: float, cancel: Optional[Cancel]) -> None:
        """One wait for a share (lock held); :class:`Stopped` at the deadline or on cancel."""
        remaining = deadline - time.monotonic()
        if cancel is not None and cancel.is_set():
            raise Stopped("cancelled", CANCELLED)
        if remaining <= 0:
            raise Stopped("timeout", timeout_message(limits.timeout, "waiting for a free CPU share"))
        waiting.wait(min(remaining, CANCEL_POLL) if cancel is not None else remaining)

    def _try_share(self, ticket: int) -> bool:
        """Whether run ``ticket`` holds a CPU share now, without waiting (the
        relay's kick, on the scheduler's driver thread: when false, the run's
        own thread waits for one); its step's slice starts then."""
        with self._lock:
            core = self._core
            if not core.take_share(ticket, False):
                return False
            core.slice_from(ticket, time.monotonic())
            return True

    def _give_share(self, ticket: Optional[int]) -> None:
        """Run ``ticket``'s step is over: its share (if it holds one) is free,
        and its worker goes on if it was parked. Idempotent; one deferred step."""
        if ticket is None:
            return
        with deferred(), self._lock:
            if self._core.give_share(ticket):
                self._park(ticket, False)
            self._wake_share_head()

    def _resume(self, ticket: Optional[int]) -> None:
        """Run ``ticket``'s worker is to stop softly (its deadline, a cancel):
        if it is parked, it goes on now, outside the shares, so that it can;
        either way this step is not parked again (its stop is never cut).
        One deferred step."""
        if ticket is None:
            return
        with deferred(), self._lock:
            if self._core.unpark(ticket):
                self._park(ticket, False)
                self._wake_share_head()

    def _wake_share_head(self) -> None:
        """(Lock held.) Give the free shares to the runs at the head of the
        queue: a parked run's worker goes on; a waiting run's thread is woken
        (it takes its share itself)."""
        core = self._core
        while core.parked:
            resumed = core.resume_head(time.monotonic())
            if resumed is None:
                break
            self._park(resumed, False)
        head = core.share_head()
        if head is not None:
            waiting = self._share_waits.get(head)  # (None: it is awake, and asks again)
            if waiting is not None:
                waiting.notify()

    def _park(self, ticket: Hashable, parked: bool) -> None:
        """(Lock held.) Stop run ``ticket``'s worker, or let it go on (see
        ``Worker.park``); nothing if it has none now."""
        wid = self._core.place_of(ticket)
        w = self._workers.get(wid) if wid is not None else None
        if w is not None:
            w.park(parked)

    def _slice_shares(self) -> None:
        """The slicer thread: while runs wait for a CPU share, park each step
        whose slice is over (``PoolCore.park_due``) and give its share to the
        head of the queue; exit once no run waits (the next wait starts it
        again). It wakes once a slice per share in use at most, and never
        while no run waits."""
        with self._lock:
            core = self._core
            while not core.closed and core.share_queue and self._owner == os.getpid():
                now = time.monotonic()
                run, due = core.park_due(now, SHARE_SLICE)
                if run is not None:
                    self._park(run, True)
                    self._wake_share_head()
                    continue
                # (No slice to end: every share is a start-up's, or one is
                # free for a thread about to take it. Look again a slice on.)
                self._cond.wait(min(due - now, SHARE_SLICE))
            self._slicer = None

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
                self._notify()
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
                self._notify()
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
            self._notify()
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
                    if server is not None and server.retired:  # (replaced for its count, not lost)
                        _carry_names(server, fresh)
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
            cwd, old = self._empty_dir, self._server
        assert cwd is not None

        def replace() -> None:
            try:
                fresh: Optional[ForkServer] = self._new_server(cwd)
            except Exception:  # (RunCodeError): the next spawn starts one itself, and says why
                fresh = None
            if fresh is not None and old is not None:
                _carry_names(old, fresh)
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
        later = False
        with self._lock:
            w = self._workers.get(wid)
            # (A run without a domain: its worker is killed, not told to tidy up.)
            keep = reusable and domain is not FRESH and w is not None and w.finish_run()
            keep = keep and self._core.release(wid, domain, reusable)
            if not keep:
                self._core.release(wid, domain, False)  # (the place is held until the process is gone)
                w = self._workers.pop(wid, None)
                # A fork server's child is killed by the spares thread, which
                # reaps it anyway: the signal, the pipes' close and the dying
                # process's wake-up are off the run's path (its run is over:
                # the host reads and writes its pipes no more, and its place
                # stays taken until it is gone).
                later = w is not None and w.forked and not self._core.closed
                if later and w is not None:
                    self._killing.append((wid, w))
            elif w is not None:
                w.busy = False
                self._notify()
        if not keep and not later:
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
                    self._notify()
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
                # (It lingers, waiting on the condition.) Woken only for work
                # it would find: a run that holds its replacement back, the
                # usual one-shot run, would wake it at its start for nothing,
                # and the wake-up takes a CPU and the GIL while the run's
                # worker computes its first step.
                if self._dying or self._killing or (self._core.spares_wanted() and not self._spares_failed):
                    self._notify()
                return
            wids = [] if self._spares_failed else self._core.want_spares()
            if not wids and not self._dying and not self._killing and not self._calm_at:
                return
            self._spare_thread = threading.Thread(
                target=self._keep_spares, args=(wids,), name=f"nous-sched-spares-{id(self):x}", daemon=True
            )
            self._spare_thread.start()

    def _calm(self, ticket: Optional[int]) -> None:
        """Run ``ticket`` first waits for a tool: the replacement it held back
        (``PoolCore.hold``) is started :data:`SPARE_CALM` seconds later by the
        spares thread, or as the run ends if that is sooner; and not before
        :meth:`_begun` (the run's calls have begun), or :data:`SPARE_BEGUN_LIMIT`
        later. One deferred step."""
        if ticket is None:
            return
        with deferred(), self._lock:
            if ticket not in self._core.held:
                return
            if SPARE_CALM > 0:
                now = time.monotonic()
                self._calm_at[ticket] = now + SPARE_CALM
                self._unbegun[ticket] = now + SPARE_CALM + SPARE_BEGUN_LIMIT
            else:
                self._core.calm(ticket)
            if self._spare_thread is not None:
                self._notify()  # (it lingers: it waits until the hold's time now)
                return
        self._top_up()

    def _begun(self, ticket: int) -> None:
        """Run ``ticket``'s calls have begun (its host's ``when_begun``, on the
        thread that began the last): its replacement may start at its time. One
        deferred step, which neither blocks (the pool's lock is held briefly) nor raises."""
        with deferred(), self._lock:
            if self._unbegun.pop(ticket, None) is not None and self._spare_thread is not None:
                self._notify()  # (it lingers: the hold's time may have come already)

    def _calms_due(self, now: float) -> float:
        """(With the lock held.) Let go the holds whose time has come (and those
        of runs over); when the next one is due (``inf``: none waits)."""
        due = math.inf
        held = self._core.held
        unbegun = self._unbegun
        for ticket, at in list(self._calm_at.items()):
            if ticket in held and at <= now:
                at = unbegun.get(ticket, at)  # (its calls not all begun: not before they have, or the limit)
            if at <= now or ticket not in held:
                del self._calm_at[ticket]
                unbegun.pop(ticket, None)
                self._core.calm(ticket)
            else:
                due = min(due, at)
        return due

    def _keep_spares(self, wids: list[int]) -> None:
        """The spares thread: start fresh workers while the core wants them and
        reap the discarded ones; exit once there has been nothing to do for
        :data:`SPARES_LINGER` seconds (so a busy pool starts no thread per run,
        and no thread stays behind an idle one). A spare lost as it booted is
        replaced after :data:`SPARES_RETRY` (see there)."""
        failures = 0
        try:
            while True:
                self._kill_released()  # (first: a process whose run is over goes before one boots)
                try:
                    self._start_ready(wids, _BACKGROUND_SPARES)  # (it gives every place back if it fails)
                    failures = 0
                except Exception:
                    failures += 1
                    if failures > SPARES_RETRIES:
                        raise
                    wids = []
                    self._pause(SPARES_RETRY * 2 ** (failures - 1))
                self._reap()
                with self._lock:
                    more = self._spares_work(time.monotonic() + SPARES_LINGER)
                    if more is None:
                        self._spare_thread = None
                    servers = [self._server, *self._retired] if more is None else []
                if more is None:
                    for server in servers:
                        if server is not None:
                            server.nudge()  # (the workers reaped here, reaped by their server too)
                    return
                wids = more
        except Exception:  # (RunCodeError, OSError): a run that needs a worker will say why
            with self._lock:
                self._spares_failed = True
                self._spare_thread = None
                self._notify()

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` (less if the pool closes meanwhile)."""
        end = time.monotonic() + seconds
        with self._lock:
            while not self._core.closed:
                left = end - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)

    def _spares_work(self, until: float) -> Optional[list[int]]:
        """(With the lock held.) The places of the next spares to start, once
        there are some or a discarded worker to reap, waiting until ``until``;
        ``None`` when none came by then or the pool is closed."""
        while True:
            if self._core.closed or self._owner != os.getpid():
                return None
            now = time.monotonic()
            due = self._calms_due(now) if self._calm_at else math.inf
            wids = [] if self._spares_failed else self._core.want_spares()
            if wids or self._dying or self._killing:
                return wids
            left = (until if due == math.inf else due) - now
            if left <= 0:
                if due == math.inf:
                    return None
                continue
            self._cond.wait(left)

    def _kill_released(self) -> None:
        """(The spares thread.) Kill the workers whose run is over (see
        :meth:`_release_now`); :meth:`_reap` waits for them to be gone."""
        with self._lock:
            killing, self._killing = self._killing, []
            self._reaping += len(killing)
        for wid, w in killing:
            try:
                self._discard(wid, w)
            finally:
                with self._lock:
                    self._reaping -= 1

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
                    self._notify()

    def _reaped(self, timeout: float) -> bool:
        """Wait up to ``timeout`` until every discarded worker is gone and its
        pidfd closed (the spares thread reaps them after their runs); whether
        they are. For tests that count processes and descriptors."""
        end = time.monotonic() + timeout
        with self._lock:
            while self._dying or self._killing or self._reaping:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def _after_fork_in_child(self) -> None:
        # The workers belong to the parent: forget them (closing our copies of
        # their pipes) without killing them. The child starts its own on demand.
        for w in [*self._workers.values(), *(w for _, w in self._killing)]:
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
        pool._after_fork_in_child()  # noqa: SLF001


atexit.register(_close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

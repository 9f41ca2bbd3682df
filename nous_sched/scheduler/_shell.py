"""The scheduler: one driver thread that orders a program's tool sub-calls.

A program is a batch of tool calls written as code, and nothing in it says how
those calls may interleave. The :class:`Scheduler` decides, conservatively:

* **One driver thread owns every decision.** Classify, start and commit all
  happen on one thread, named ``nous-sched-driver-<n>`` while it drives this
  scheduler, which reads commands from a queue. The ordering itself is a pure
  :class:`~nous_sched.scheduler.lane.Lane` that no other thread touches, so it needs no
  lock: the driver is the lock. The thread is borrowed, warm, from the
  process's driver threads (:mod:`nous_sched.scheduler._driver_threads`) for the
  scheduler's whole life and given back when it stops; :meth:`Scheduler.stop`
  returns only once the driver is done with this scheduler for good, so a
  run starts no thread of its own.
* **Commits are strictly in submission order.** A call that finishes early
  waits for its predecessors, so a caller observes one deterministic order
  however the work raced.
* **Exclusive by default.** A call runs beside others only if its tool's
  ``concurrency_safe(args)`` returns exactly ``True``
  (:func:`~nous_sched.concurrency_mode`). An exclusive call waits until
  everything before it has committed, runs alone, and holds the barrier through
  its own commit, so nothing starts or commits inside its window.
* **At most ``max_parallel`` calls run at once**; more queue, they never fail.
* **Tools run on an executor**: by default the process's shared tool threads
  (:mod:`nous_sched.scheduler._tool_threads`: warm, so a run starts no thread of its
  own; bounded per process, idle ones retire; this scheduler still runs at
  most ``max_parallel`` of its calls at once), or any
  ``concurrent.futures.Executor`` you pass (shared, never shut down here).
  The submitting thread's ``contextvars`` are visible inside the tool, and
  only there: each call runs in its own copy of them.
* **Failure is data.** A failed call commits an :class:`~nous_sched.Outcome`
  holding two strings; the traceback goes to the ``nous_sched`` logger.
* **Every wait is bounded** by ``timeout`` (the run's deadline), and
  :meth:`Scheduler.stop` releases every caller, even when a tool or predicate
  never returns.

Thread-safety: every public method may be called from any thread.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import itertools
import logging
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any, Callable, ContextManager, Optional, Sequence

from .. import _validators as v
from .._interrupts import deferred
from .._options import OPTIONAL_SESSION_LOG
from .._slots import maker
from .._validators import require
from ..crossing import snapshot, snapshot_text
from ..errors import ToolError
from ..events import (
    ApprovalEvent,
    Event,
    SessionLog,
    ToolCallEvent,
    ToolOutcomeEvent,
    freeze,
    frozen_later,
    tool_call_event,
    tool_outcome_event,
)
from ..gate.dispatch import CallInfo, Dispatch, RunContext, approval_sink, current_call, direct_dispatch
from ..outcome import Outcome
from ..result.records import CallRecord, LaneState
from ..throttle._throttle import _Hold
from ..tooling import PARALLEL, Mode, Tool, concurrency_mode, exclusive_reason
from . import _driver_threads, _tool_threads
from ._tool_threads import Task, Then, ToolThreads
from .lane import COMMIT, START, Lane

__all__ = ["Scheduler", "Ticket"]

log = logging.getLogger("nous_sched")

DEFAULT_MAX_PARALLEL = 10
DEFAULT_TIMEOUT = 120.0
_STOP_JOIN = 2.0

_ids = itertools.count(1)
_TIMEOUT_MAX = threading.TIMEOUT_MAX

# What a program reads when the scheduler, not the tool, ends a call.
GONE = "code run is over; scheduler is gone"
ABANDONED = "code run is over; tool call abandoned"
AWAIT_TIMEOUT = "timed out waiting for the sub-call to commit"
NO_ANSWER = "the scheduler did not answer within {s:g}s (a concurrency_safe predicate may be stuck)"
FAILED = "tool call failed"
DID_NOT_COMPLETE = "tool call did not complete"


class Ticket:
    """A handle on one submitted sub-call; pass it to :meth:`Scheduler.wait`.

    ``tool`` is the tool's name. ``seq`` is the call's submission index once
    the driver has accepted it, ``None`` before.
    """

    # One lock is a ticket's whole synchronization (a Future would be a
    # Condition over an RLock, per call). ``_gate`` is held from birth and
    # released once, by _publish, after ``_outcome`` is written; a waiter
    # acquires it and releases it at once, so every waiter passes. That only
    # one release ever publishes is the scheduler's to ensure (_open, under its
    # _lock: see Scheduler._deliver). ``_then`` is what a runtime asked for
    # with on_done.
    __slots__ = ("tool", "seq", "_outcome", "_gate", "_then")

    def __init__(self, tool: str) -> None:
        self.tool = tool
        self.seq: Optional[int] = None
        self._outcome: Optional[Outcome] = None
        self._then: Optional[Callable[[], None]] = None
        gate = self._gate = threading.Lock()
        gate.acquire()

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
        self._gate.release()
        then = self._then
        if then is not None:
            then()

    def _wait(self, timeout: float) -> Optional[Outcome]:
        """The outcome, or ``None`` after ``timeout`` seconds (-1: no limit)."""
        gate = self._gate
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
        return self._wait(timeout)

    def __repr__(self) -> str:
        return f"<Ticket {self.tool!r} seq={self.seq} done={self.done()}>"


# -- what crosses the driver's queue ---------------------------------------------
#
# A submit is the call itself (one object per call on the hot path), a batch a
# list of calls (one message for every call a program's step started); the
# others are small slotted messages. The driver tells them apart by type.


class _Timeline:
    """When one started call started, finished and committed (seconds since the epoch of its scheduler)."""

    __slots__ = ("seq", "tool", "mode", "started", "finished", "committed", "ok", "began", "reason", "throttled")

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

    def record(self) -> CallRecord:
        return CallRecord(
            self.seq,
            self.tool,
            self.mode,
            self.started,
            self.finished,
            self.committed,
            self.ok,
            self.began,
            self.reason,
            self.throttled,
        )


class _Begin:
    """Called by a tool thread as it takes up a call: waits for the places of
    the tool's throttles (if it names any), then stamps the call's ``began``
    and answers True; answers False once the scheduler is stopping (the call
    is over before it began, and must not start), or the refusal's message
    when the throttles' wait failed (the run's deadline passed). :meth:`end`
    gives the places back once the tool has returned.

    The wait is on the tool thread, so the driver never blocks on a throttle;
    stop() cancels it (``Scheduler._throttle_waits``).

    Pickles (for executors that serialize tasks) as one that always answers
    True: in another process there is no scheduler to ask.
    """

    __slots__ = ("scheduler", "timeline", "throttles", "deadline", "hold")

    def __init__(
        self, scheduler: "Scheduler", timeline: _Timeline, throttles: tuple[Any, ...] = (), deadline: Any = None
    ) -> None:
        self.scheduler = scheduler
        self.timeline = timeline
        self.throttles = throttles
        self.deadline = deadline
        self.hold: Optional[_Hold] = None

    def __call__(self) -> bool | str:
        scheduler = self.scheduler
        if self.throttles:
            refusal = self._wait_for_throttles()
            if refusal is not None:
                return refusal
        with scheduler._records_lock:
            if scheduler._stopping:
                self.end()
                return False
            self.timeline.began = time.perf_counter() - scheduler._t0
        return True

    def record_approval(self, approved: bool, reason: str) -> None:
        """The approval step's sink (:data:`~nous_sched.gate.dispatch.approval_sink`) for this call."""
        timeline = self.timeline
        self.scheduler._record(ApprovalEvent(timeline.seq, timeline.tool, approved, reason))

    def _wait_for_throttles(self) -> bool | str | None:
        """Take the throttles' places (None), or why not: False once the scheduler stops, else the message."""
        scheduler = self.scheduler
        hold = self.hold = _Hold(self.throttles)
        waiting_since = time.perf_counter()
        with scheduler._records_lock:
            if scheduler._stopping:
                return False
            scheduler._throttle_waits.add(hold)
        deadline = self.deadline if self.deadline is not None else time.monotonic() + scheduler._timeout
        try:
            refusal = hold.wait(deadline)
        finally:
            with scheduler._records_lock:
                scheduler._throttle_waits.discard(hold)
                self.timeline.throttled = time.perf_counter() - waiting_since
        if refusal is not None and refusal.startswith(ABANDONED):
            return False
        return refusal

    def end(self) -> None:
        """Give the throttles' places back (idempotent; any thread)."""
        if self.hold is not None:
            self.hold.release()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_AlwaysBegin, ())


class _AlwaysBegin:
    __slots__ = ()

    def __call__(self) -> bool:
        return True

    def end(self) -> None:
        pass


class _Call:
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
    timeline: _Timeline
    future: concurrent.futures.Future[Any] | Task  # the executor's, or the scheduler's own threads'
    outcome: Outcome
    ran: "_Ran"  # what its task reported: the outcome, when it finished, its error kind and result size

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
_Ran = tuple[Outcome, float, Optional[str], int]


class _Done(Then):
    """Call ``seq``'s tool has finished (put on any thread).

    ``result`` is what :func:`_run_call` returned, or ``None`` when the task
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

    def __init__(self, seq: int, result: Optional[_Ran], problem: Any = None) -> None:
        self.seq = seq
        self.result = result
        self.problem = problem

    def __call__(self) -> None:
        """Put this report on the driver's queue (a tool thread calls it as it goes idle: :class:`Then`)."""
        self.put(self)


class _Batch:
    """Submits from one thread, held back, then admitted (their tickets join
    ``_open`` under one ``_lock``) or refused together, and queued as one
    message, when the batch ends."""

    __slots__ = ("scheduler", "owner", "calls")

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.owner = threading.get_ident()
        self.calls: list[_Call] = []

    def __enter__(self) -> _Batch:
        if self.scheduler._batch is not None:
            raise RuntimeError("Scheduler batches do not nest")
        self.scheduler._batch = self
        return self

    def __exit__(self, *exc: object) -> None:
        scheduler = self.scheduler
        scheduler._batch = None
        calls = self.calls
        if not calls:
            return
        # Whatever interrupted the batch, its tickets are admitted or refused here.
        scheduler._admit(calls, calls)


class _RunLog(SessionLog):
    """The session log a scheduler makes when it is given none.

    A :class:`SessionLog` to every reader; inside, it keeps the driver's audit
    records as they are and makes each one's :class:`Event` when the log is
    first read (most runs' logs never are), in place, so every reader gets the
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
                    entries[i] = entry.as_event()
            self._made = len(entries)
            return list(entries)


class _Query:
    """Answer ``reply`` with the lane's state."""

    __slots__ = ("reply",)

    def __init__(self, reply: concurrent.futures.Future[LaneState]) -> None:
        self.reply = reply


class _Stop:
    """Abandon the lane and exit."""

    __slots__ = ()


_STOP = _Stop()


_OPTIONAL_SESSION_LOG = OPTIONAL_SESSION_LOG
_NAMED = v.Check("a tool: an object with a str `name`", lambda tool: isinstance(getattr(tool, "name", None), str))
_TICKET = v.instance_of(Ticket, "a Ticket from Scheduler.submit()")


class Scheduler:
    """The scheduler for one program run. See the module docstring for guarantees.

    :param dispatch: ``dispatch(tool, args, run_ctx)`` runs one call on an
        executor thread; :func:`~nous_sched.direct_dispatch` by default.
    :param session_log: a :class:`~nous_sched.SessionLog` that receives the
        audit records (:meth:`audit_events`): one ``tool_call`` event per
        started call, its ``approval`` decisions and its ``tool_outcome``; a
        fresh one by default.
    :param max_parallel: the ceiling on calls running at once (positive int).
    :param call_id: prefix of event ids, ``"<call_id>:code:<seq>"``.
    :param executor: where tools run. Yours is shared and never shut down;
        without one, the process's shared tool threads (named
        ``nous-sched-tool-<k>``; :mod:`nous_sched.scheduler._tool_threads`), which
        outlive the scheduler, warm for the next run, and retire when idle.
    :param timeout: the bound, in seconds, on every wait (the run's deadline).
    :param observer: ``observer(record: CallRecord, phase)`` is called on the
        driver at ``"start"`` and ``"commit"``; it must be quick and must not
        wait on the scheduler (it may call :meth:`stop`). Whatever it raises,
        ``KeyboardInterrupt`` and ``SystemExit`` included, is logged and
        ignored: the scheduler goes on.
    :raises ConfigError: naming the bad option.

    Use as a context manager, or call :meth:`stop` when the run is over.
    """

    # Fields shared across threads, and what guards each. Every other field is
    # either set in __init__ and never written again, or owned by the driver
    # thread alone (the lane, _finished, each _Call once it is
    # queued): the driver is the lock. _tool_threads (the process's shared
    # set, or None with a caller's executor) is set in __init__ and guards
    # itself.
    #
    #   _queue          SimpleQueue, thread-safe by itself. Any thread puts;
    #                   only the driver gets. Queries are put under _lock, so
    #                   none lands after the driver's last drain (_exited). A
    #                   submit is put after its ticket joined _open under _lock,
    #                   so if it lands after that drain, the driver's last act
    #                   (releasing all of _open) has released its ticket.
    #   _batch          the open _Batch or None: written only by the thread
    #                   that owns the batch, which alone appends to it; any
    #                   other submitting thread sees a batch that is not its own.
    #   _lock guards    _open      tickets queued and not yet released (submit
    #                              adds, a batch's when it ends; the driver
    #                              and stop() release). Taking
    #                              a ticket out of _open is the right to publish
    #                              its outcome: each ticket is published once.
    #                   _closed    no more submits: set by stop() or the exiting driver
    #                   _exited    the driver took its last message
    #                   _wedged_by the ticket whose unanswered full-timeout wait
    #                              condemned the scheduler (callers write it; it
    #                              is wedged while that ticket's seq is None)
    #   _records_lock   _events, _trail and every _Timeline's fields: the driver
    #                   writes them (a pass's worth at once, see _drive), any
    #                   thread copies them out; a tool thread writes its call's
    #                   `began` and `throttled`, and appends ApprovalEvents.
    #   guards also     _throttle_waits (the _Holds of calls waiting for their
    #                   throttles' places: added by a tool thread only while not
    #                   _stopping, cancelled by whoever sets _stopping)
    #   guards also     _stopping (set by stop() and the exiting driver; read by a
    #                   tool thread as it takes up a call, _Begin, which stamps
    #                   `began`: so no call begins after the scheduler stops)
    #   _final          the lane's last state, written by the driver before it
    #                   sets _exited (under _lock), read only after that.
    #   _driver         the thread driving this scheduler: written once, by
    #                   that thread as it takes the scheduler up; read by stop()
    #                   (is the caller the driver?), None until then.
    #   _wake           the driver's wake-up (_driver_threads.drive), taken
    #                   (set None) under _lock by whoever puts the first
    #                   message, who calls it just after the put.
    #   _driven         a Lock held from __init__ until the driver is done with
    #                   this scheduler for good (released by _driver_threads
    #                   after _drive_loop returned): what stop() waits on.
    #   Ticket.seq      written once by the driver when it accepts the call; read
    #                   anywhere (None: not yet accepted).
    #   Ticket._outcome written once, before Ticket._gate is released (_publish).

    def __init__(
        self,
        dispatch: Dispatch = direct_dispatch,
        session_log: Optional[SessionLog] = None,
        max_parallel: int = DEFAULT_MAX_PARALLEL,
        call_id: Optional[str] = None,
        executor: Optional[concurrent.futures.Executor] = None,
        timeout: float = DEFAULT_TIMEOUT,
        observer: Optional[Callable[[CallRecord, str], Any]] = None,
    ) -> None:
        require("Scheduler", "dispatch", dispatch, v.DISPATCH)
        require("Scheduler", "session_log", session_log, _OPTIONAL_SESSION_LOG)
        require("Scheduler", "max_parallel", max_parallel, v.POSITIVE_INT)
        require("Scheduler", "call_id", call_id, v.OPTIONAL_STR)
        require("Scheduler", "executor", executor, v.EXECUTOR)
        require("Scheduler", "timeout", timeout, v.SECONDS)
        require("Scheduler", "observer", observer, v.OPTIONAL_CALLABLE)

        self._dispatch = dispatch
        # The run log's lock is _records_lock: a pass writes both lists under it at once.
        self._records_lock = threading.Lock()
        self._session_log = _RunLog(self._records_lock) if session_log is None else session_log
        self._max_parallel = max_parallel
        self._call_id = call_id
        self._executor = executor
        # Without an executor, tools run on the process's shared tool threads (warm: no thread per run).
        self._tool_threads: Optional[ToolThreads] = _tool_threads.shared() if executor is None else None
        self._timeout = float(timeout)
        self._observer = observer
        # run_code's hooks for a run's event stream, set before the first submit,
        # read only by the driver: each start (its record, audit id, the tool's
        # own arguments before the tool has them, the tool), and each commit
        # (its record, outcome and error kind: the tool_outcome record's).
        self._on_start: Optional[Callable[[CallRecord, str, Any, Any], Any]] = None
        self._on_outcome: Optional[Callable[[CallRecord, Outcome, Optional[str]], Any]] = None
        self._n = next(_ids)
        self._t0 = time.perf_counter()
        # SimpleQueue: the C queue from `queue`, without Queue's task tracking we never use.
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._batch: Optional[_Batch] = None

        self._lock = threading.Lock()
        self._open: set[Ticket] = set()
        self._closed = False
        self._exited = False
        self._wedged_by: Optional[Ticket] = None

        self._stopping = False
        self._events: list[Any] = []  # audit records: ToolCallEvent, ApprovalEvent, ToolOutcomeEvent
        # The seqs whose tool_outcome stop() wrote for a driver that did not
        # wind down in time (under _records_lock); the driver writes none of them.
        self._sealed: Optional[set[int]] = None
        self._trail: list[_Timeline] = []
        self._throttle_waits: set[_Hold] = set()

        self._final: Optional[LaneState] = None
        self._lane: Lane[_Call] = Lane(max_parallel)  # driver-owned from here on
        self._finished: list[_Call] = []  # driver-owned: calls whose `finished` the next pass stamps

        # The driver: a thread borrowed from the process's warm driver threads
        # for this scheduler's life (_driver_threads), named after it
        # meanwhile. It sets _driver to itself as it takes this scheduler up,
        # and releases _driven once it is done with it for good.
        self._name = f"nous-sched-driver-{self._n}"
        self._driver: Optional[threading.Thread] = None
        driven = self._driven = threading.Lock()
        driven.acquire()
        self._drivers = _driver_threads.shared()
        # Called (under _lock, exactly once: whoever takes it sets None) right
        # after the first message is put, so a warm driver wakes once, for it.
        self._wake: Optional[Callable[[], None]] = None
        try:
            self._wake = self._drivers.drive(self._drive_loop, self._name, driven)
        except BaseException:
            # A KeyboardInterrupt can land while a driver is started for it;
            # the caller never gets this scheduler to stop, so stop it here.
            self._queue.put(_STOP)
            if self._wake is not None:
                self._wake()
            raise

    # -- public API ------------------------------------------------------

    @property
    def max_parallel(self) -> int:
        return self._max_parallel

    @property
    def call_id(self) -> Optional[str]:
        return self._call_id

    def submit(self, tool: Tool, args: Mapping[str, Any], run_ctx: Optional[RunContext] = None) -> Ticket:
        """Queue one call of ``tool`` with ``args``; returns at once.

        ``args`` must be a mapping; it is snapshotted here, on the calling
        thread (:func:`~nous_sched.snapshot`), into the tool's copy and the
        audit's own immutable copy, and the calling thread's
        ``contextvars`` are captured for the tool. Calls are ordered by the
        order their ``submit`` reached the driver.

        :raises ConfigError: ``tool`` has no str ``name``, ``args`` is not a
            mapping, or has no JSON form (:class:`~nous_sched.SnapshotError`,
            naming the path).

        After :meth:`stop` the ticket is already released with
        ``"code run is over; scheduler is gone"``.
        """
        name = getattr(tool, "name", None)
        if not isinstance(name, str):  # once per call: only a failing check is run
            v.fail("Scheduler.submit", "tool", tool, _NAMED.expected)
        if type(args) is not dict:  # once per call: an exact dict needs no check
            require("Scheduler.submit", "args", args, v.MAPPING)
        return self.submit_snapshot(tool, name, snapshot(args), run_ctx)

    # -- the runtime port: what a run's host asks of its scheduler --------

    def watch(
        self,
        on_start: Optional[Callable[[CallRecord, str, Any, Any], Any]] = None,
        on_outcome: Optional[Callable[[CallRecord, Outcome, Optional[str]], Any]] = None,
    ) -> None:
        """Hooks for a run's event stream, set before the first submit and
        called on the driver thread, in commit order: ``on_start(record,
        event_id, args, tool)`` as each call starts (its record, audit id, the
        tool's own arguments before the tool has them, the tool), and
        ``on_outcome(record, outcome, kind)`` as each commits (its record,
        outcome and error kind: its ``tool_outcome`` audit record's). What a
        hook raises is logged, never raised into the run."""
        self._on_start = on_start
        self._on_outcome = on_outcome

    def submit_snapshot(
        self,
        tool: Tool,
        name: str,
        dispatched: dict[str, Any],
        run_ctx: Optional[RunContext] = None,
        text: Optional[str] = None,
    ) -> Ticket:
        """:meth:`submit` for arguments that are already a snapshot no one else
        holds (a runtime's, parsed from the program's JSON text under the
        snapshot rules by the gate): the tool gets them as they are, and the
        audit its own frozen copy of them; ``text``, the JSON text they were
        parsed from, is that copy, frozen on first read (``events.frozen_later``)."""
        # The audit's own copy, before the tool can touch `dispatched`.
        logged = freeze(dispatched) if text is None else frozen_later(text)
        ticket = Ticket(name)
        call = _Call(ticket, tool, dispatched, logged, run_ctx, contextvars.copy_context())
        batch = self._batch
        if batch is not None and batch.owner == threading.get_ident():
            batch.calls.append(call)  # admitted (or refused) with the rest when the batch ends
            return ticket
        self._admit((call,), call)
        return ticket

    def _admit(self, calls: Sequence["_Call"], message: Any) -> None:
        """Open the tickets of ``calls`` and put ``message`` (the calls, one
        or a batch) on the driver's queue; or, if the scheduler refuses new
        calls, publish each ticket's refusal instead."""
        tickets = [call.ticket for call in calls]
        with self._lock:
            refusal = self._refusal()
            if refusal is None:
                self._open.update(tickets)
                wake, self._wake = self._wake, None
        if refusal is None:
            self._queue.put(message)
            if wake is not None:
                wake()
        else:
            for ticket in tickets:
                ticket._publish(Outcome.failure(ticket.tool, refusal))

    def _refusal(self) -> Optional[str]:
        """Why a submit is refused now, or None (under _lock)."""
        if self._closed:
            return GONE
        if self._wedged_by is not None and self._wedged_by.seq is None:
            return NO_ANSWER.format(s=self._timeout)
        return None

    def batch(self) -> ContextManager[object]:
        """``with scheduler.batch():`` the calling thread's submits reach the
        driver as one message, in order, when the block ends (a runtime
        submits every call one step of a program started); a submit refused
        (the scheduler stopped) is released then too. Batches do not nest
        (``RuntimeError``). Wait on no ticket inside the block: its call has
        not reached the driver yet, so the wait would wait for nothing."""
        return _Batch(self)

    def wait(self, ticket: Ticket, timeout: Optional[float] = None) -> Outcome:
        """Block until ``ticket``'s call commits; return its :class:`Outcome`.

        Never raises for a failed call. Waits at most ``timeout`` seconds (the
        scheduler's own ``timeout`` by default); then the outcome is an error
        ``"timed out waiting for the sub-call to commit"``, or, if the driver
        never even accepted the call, ``"the scheduler did not answer ..."``.
        After such a silence lasting the scheduler's whole ``timeout``, later
        submits fail the same way at once, until the driver accepts that call.

        :raises ConfigError: ``ticket`` is not a :class:`Ticket`, or
            ``timeout`` is not ``None`` or a number of seconds from 0 to
            ``threading.TIMEOUT_MAX``.
        """
        if type(ticket) is not Ticket:  # once per call: an exact Ticket needs no check
            require("Scheduler.wait", "ticket", ticket, _TICKET)
        if timeout is not None:
            require("Scheduler.wait", "timeout", timeout, v.WAIT_SECONDS)
        limit = self._timeout if timeout is None else timeout
        outcome = ticket._wait(limit)
        if outcome is not None:
            return outcome
        if ticket.seq is None:
            # Only a full-timeout silence condemns the scheduler; a short poll does not.
            if limit >= self._timeout:
                with self._lock:
                    self._wedged_by = ticket
            return Outcome.failure(ticket.tool, NO_ANSWER.format(s=limit))
        return Outcome.failure(ticket.tool, AWAIT_TIMEOUT)

    def call(self, tool: Tool, args: Mapping[str, Any], run_ctx: Optional[RunContext] = None) -> Outcome:
        """``wait(submit(tool, args, run_ctx))``: a ``dispatch``-shaped callable routing through this scheduler."""
        return self.wait(self.submit(tool, args, run_ctx))

    def session_log(self) -> SessionLog:
        """The session log that receives this scheduler's audit records (:meth:`audit_events`)."""
        return self._session_log

    def logged_events(self) -> list[ToolCallEvent]:
        """Every ``tool_call`` event so far, in submission order.

        Never waits for the driver. After :meth:`stop` this is the complete,
        final list.
        """
        with self._records_lock:
            return [e for e in self._events if type(e) is ToolCallEvent]

    def audit_events(self) -> list[Any]:
        """Every audit record so far, in the order written: each started call's
        ``tool_call`` (:class:`~nous_sched.ToolCallEvent`), the ``approval``
        decisions made for it (:class:`~nous_sched.ApprovalEvent`, as they are
        made) and its ``tool_outcome`` (:class:`~nous_sched.ToolOutcomeEvent`,
        when it commits, in submission order; or ``abandoned`` when the
        scheduler stops while it runs). The same records, as
        :class:`~nous_sched.Event`, went to the session log.

        Never waits for the driver. After :meth:`stop` this is the complete list.
        """
        with self._records_lock:
            return list(self._events)

    def trail(self) -> list[CallRecord]:
        """The timeline of every started call, in submission order. Never waits for the driver."""
        with self._records_lock:
            return [timeline.record() for timeline in self._trail]

    def lane_state(self, timeout: Optional[float] = None) -> Optional[LaneState]:
        """A consistent view of pending, in-flight and committed calls, read on the driver.

        Waits at most ``timeout`` seconds (the scheduler's own ``timeout`` by
        default) for the driver to answer, and returns ``None`` if it does not
        (it is stuck in a ``concurrency_safe`` predicate). Once the scheduler has
        stopped, the lane's final state, at once.

        :raises ConfigError: ``timeout`` is not ``None`` or a number of seconds
            from 0 to ``threading.TIMEOUT_MAX``.
        """
        require("Scheduler.lane_state", "timeout", timeout, v.WAIT_SECONDS)
        reply: concurrent.futures.Future[LaneState] = concurrent.futures.Future()
        wake = None
        with self._lock:
            exited = self._exited
            if not exited:
                self._queue.put(_Query(reply))
                wake, self._wake = self._wake, None
        if wake is not None:
            wake()
        if exited:
            return self._final
        try:
            return reply.result(self._timeout if timeout is None else timeout)
        except concurrent.futures.TimeoutError:
            return None

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stop the scheduler. Idempotent; returns within ``timeout`` seconds.

        ``timeout`` bounds the wait for the driver to wind down: a healthy one
        answers in microseconds, so the default is the smaller of 2 s and the
        scheduler's own timeout; a driver stuck in a predicate is left to
        wind down when the predicate returns. When ``stop()`` has waited the
        driver out, the driver is done with this scheduler for good: its
        thread is back idle among the process's driver threads and never
        touches this scheduler again.

        Queued calls are released with ``"code run is over; tool call
        abandoned"`` and never start; running ones get the same error (their
        threads finish on their own: Python cannot kill a thread); calls that
        had finished but not yet committed get their real outcome, in order.
        Callers blocked in :meth:`wait` return at once. The driver, on its way
        out, takes back from the shared tool threads every call of this
        scheduler that no thread has taken up yet, also when the first
        ``stop()`` comes from an observer (which returns at once, before the
        driver winds down); the threads themselves stay, for other runs. A
        caller's executor is left alone.

        :raises ConfigError: ``timeout`` is not ``None`` or a number of seconds
            from 0 to ``threading.TIMEOUT_MAX``.
        """
        require("Scheduler.stop", "timeout", timeout, v.WAIT_SECONDS)
        limit = min(self._timeout, _STOP_JOIN) if timeout is None else timeout
        with deferred():  # (Ctrl-C: a stop begun is a stop the driver hears)
            self._begin_stop()
        if threading.current_thread() is self._driver:
            return  # an observer stopping its own scheduler: the driver winds down after this callback
        if not self._wait_driver(limit):
            self._seal()
            log.warning(
                "%s did not stop within %.3gs (a tool's concurrency_safe predicate may be stuck); "
                "its callers are released and its thread will leave it when the predicate returns",
                self._name,
                limit,
            )
        self._release_open(ABANDONED)

    def _begin_stop(self) -> None:
        with self._records_lock:
            self._stopping = True  # from here on no call begins (_Begin)
            waits = list(self._throttle_waits)
        for hold in waits:  # their places go back now, not when the deadline passes
            hold.cancel()
        with self._lock:
            first = not self._closed
            self._closed = True
            wake, self._wake = self._wake, None
        if first:
            self._queue.put(_STOP)
        if wake is not None:
            wake()

    def _seal(self) -> None:
        """The driver did not stop in time (an observer or a predicate holds
        it): write an ``abandoned`` tool_outcome for every started call that
        has none yet, so the audit is complete when stop() returns, and keep
        the driver from writing another for them."""
        with self._records_lock:
            if self._sealed is not None:
                return
            started = {e.seq: e.name for e in self._events if type(e) is ToolCallEvent}
            for e in self._events:
                if type(e) is ToolOutcomeEvent:
                    started.pop(e.seq, None)
            error = {"kind": "abandoned", "message": ABANDONED}
            records: list[Any] = [
                tool_outcome_event(seq, name, False, error, 0) for seq, name in sorted(started.items())
            ]
            self._events += records
            self._sealed = set(started)
            run_log = self._session_log
            kept = type(run_log) is _RunLog
            if kept:
                run_log._events += records
        if records and not kept:
            self._log_records(records)

    def _unsealed(self, records: list[Any]) -> list[Any]:
        """(Under _records_lock, once stop() has sealed the audit.) ``records``
        less the outcomes stop() wrote already."""
        sealed = self._sealed
        assert sealed is not None
        return [r for r in records if type(r) is not ToolOutcomeEvent or r.seq not in sealed]

    def _wait_driver(self, timeout: float) -> bool:
        """True once the driver is done with this scheduler for good (it
        never touches it again), waiting at most ``timeout`` seconds; False
        while it still drives it."""
        if self._drivers.forked_away:
            return True  # a scheduler inherited across a fork: no driver of it runs in this process
        driven = self._driven
        if driven.acquire(True, timeout):
            driven.release()
            return True
        return False

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        with self._lock:
            state = "stopped" if self._closed else "running"
        return f"<Scheduler {self._name} {state} max_parallel={self._max_parallel}>"

    def _release_open(self, message: str) -> None:
        """Release every ticket not yet delivered with ``message`` (any thread)."""
        with self._lock:
            leftovers, self._open = list(self._open), set()
        for ticket in leftovers:
            ticket._publish(Outcome.failure(ticket.tool, message))

    # -- the driver ---------------------------------------------------------

    def _drive_loop(self) -> None:
        self._driver = threading.current_thread()
        get = self._queue.get
        empty = self._queue.empty
        handle = self._handle
        drive = self._drive
        try:
            while True:
                msg = get()
                # Take everything already queued before driving, so a burst of
                # completions commits in one pass. (Only this thread gets, so a
                # queue that is not empty answers get() at once; asking is
                # cheaper than get_nowait's exception at the end of every burst.)
                while True:
                    if msg is _STOP:
                        return
                    handle(msg)
                    if empty():
                        break
                    msg = get()
                drive()
        except BaseException:
            log.critical("%s crashed; releasing every caller", self._name, exc_info=True)
            raise
        finally:
            self._wind_down()

    def _handle(self, msg: Any) -> None:
        kind = type(msg)
        if kind is _Done:
            call = self._lane.finished(msg.seq)
            if call is None:  # an abandoned call's tool returned: its outcome is already delivered
                return
            result = msg.result
            ran = result if result is not None else self._collect(call, msg.problem)
            call.outcome = ran[0]
            call.ran = ran
            # Stamped (ran[1]) with the pass's other records, under one lock (_drive).
            self._finished.append(call)
        elif kind is _Call:
            self._accept(msg)
        elif kind is list:
            for call in msg:
                self._accept(call)
        elif kind is _Query:
            msg.reply.set_result(self._lane.state())

    def _accept(self, call: _Call) -> None:
        # Classification runs here, on the dispatched snapshot, in submission order.
        call.mode = call.ctx.run(concurrency_mode, call.tool, call.args)
        call.seq = call.ticket.seq = self._lane.accept(call, call.mode)

    def _drive(self) -> None:
        """One pass: every action the lane allows now, in its order, the
        bookkeeping batched. The audit records, the trail and the stamps of
        the whole pass are written under one ``_records_lock``, before any tool
        of the pass is handed over (so a tool's approval records come after
        its ``tool_call``); then, with no observer and no outcome hook (the
        common case), the tools are handed over, and every committed ticket
        is published after one ``_lock``, newest first, so a caller waiting on
        the oldest wakes once, to find the rest published too. With either
        hook, each action's hand-over, publish and callbacks go in the lane's
        order, as the hooks expect."""
        step = self._lane.step
        action = step()
        finished = self._finished
        if action is None and not finished:
            return
        records: list[Any] = []  # the pass's audit records, in the lane's order
        started: list[tuple[_Call, ToolCallEvent]] = []
        committed: list[tuple[_Call, float]] = []  # each with when it committed
        # (START or COMMIT, the call, its audit record): kept only for the hooks.
        actions: Optional[list[tuple[str, _Call, Any]]] = (
            None if self._observer is None and self._on_outcome is None and self._on_start is None else []
        )
        t0 = self._t0
        perf_counter = time.perf_counter
        record: Any
        while action is not None:
            kind, call = action
            if kind is START:
                record = self._started(call, perf_counter() - t0)
                started.append((call, record))
            else:
                ran = call.ran
                record = self._outcome_record(call, call.outcome, ran[2], ran[3])
                committed.append((call, perf_counter() - t0))
            records.append(record)
            if actions is not None:
                actions.append((kind, call, record))
            action = step()
        self._write_pass(records, started, committed)
        if actions is not None:
            self._act_in_order(actions)
            return
        for call, record in started:
            self._hand_over(call, record.id)
        if committed:
            self._publish_newest_first(committed)

    def _write_pass(
        self, records: list[Any], started: list[tuple[_Call, Any]], committed: list[tuple[_Call, float]]
    ) -> None:
        """A pass's audit records, trail and stamps under one ``_records_lock``, and the run's own log with
        them (under the same lock: see :class:`_RunLog`); a session log of the caller's gets them after."""
        finished = self._finished
        with self._records_lock:
            for call in finished:
                call.timeline.finished = call.ran[1]
            for call, at in committed:
                timeline = call.timeline
                timeline.committed = at
                timeline.ok = call.outcome.ok
            if self._sealed is not None:
                records = self._unsealed(records)
            self._events += records
            trail = self._trail
            for call, _ in started:
                trail.append(call.timeline)
            run_log = self._session_log
            kept = type(run_log) is _RunLog
            if kept:  # under the same lock (its own): its Events are made when it is read
                run_log._events += records
        finished.clear()
        if records and not kept:
            self._log_records(records)

    def _act_in_order(self, actions: list[tuple[str, _Call, Any]]) -> None:
        """With an observer or an outcome hook: each action's hand-over, publish and callbacks, in the lane's order."""
        for kind, call, record in actions:
            if kind is START:
                if self._on_start is not None:
                    self._tell_start(call, record.id)
                self._notify(call.timeline, START)
                self._hand_over(call, record.id)
            else:
                self._deliver(call.ticket, call.outcome)
                self._notify(call.timeline, COMMIT)
                if self._on_outcome is not None:
                    self._tell_outcome(call.timeline, call.outcome, call.ran[2])

    def _publish_newest_first(self, committed: list[tuple[_Call, float]]) -> None:
        """Publish a pass's commits after one ``_lock``, newest first (see :meth:`_drive`)."""
        if len(committed) == 1:
            call = committed[0][0]
            self._deliver(call.ticket, call.outcome)
            return
        tickets = {call.ticket for call, _ in committed}
        with self._lock:  # set operations in C: the lock is held for no Python loop
            mine = tickets & self._open  # the rest stop() already released, from a driver that stopped answering
            self._open -= mine
        for call, _ in reversed(committed):
            if call.ticket in mine:
                call.ticket._publish(call.outcome)

    def _started(self, call: _Call, now: float) -> ToolCallEvent:
        """The ``tool_call`` record of a call the lane starts now; its timeline is ``call.timeline``."""
        seq = call.seq
        name = call.tool.name
        mode = call.mode
        event = tool_call_event(
            f"{self._call_id}:code:{seq}" if self._call_id is not None else f"code:{seq}",
            name,
            call.logged,
            mode,
            seq,
        )
        call.timeline = _Timeline(seq, name, mode, now, "" if mode == PARALLEL else exclusive_reason(call.tool, mode))
        return event

    def _hand_over(self, call: _Call, event_id: str) -> None:
        """Hand a started call (its ``tool_call`` record's id) to the tool threads, or the caller's executor."""
        seq = call.seq
        timeline = call.timeline
        info = _call_info(event_id, timeline.tool, seq, call.mode, call.run_ctx)
        tool = call.tool
        begin = (
            _Begin(self, timeline, tool.throttles, getattr(call.run_ctx, "deadline", None))
            if getattr(tool, "throttles", None)
            else _Begin(self, timeline)
        )
        put = self._queue.put
        threads = self._tool_threads
        try:
            if threads is not None:
                # Our own threads: the task reports back itself, with no future.
                # What it cannot report (cancelled before it ran) happens only
                # when the lane is abandoned, and needs no report.
                call.future = threads.submit(
                    _run_reporting,
                    put,
                    seq,
                    call.ctx,
                    self._dispatch,
                    tool,
                    call.args,
                    call.run_ctx,
                    info,
                    self._t0,
                    begin,
                )
                return
            assert self._executor is not None
            future = self._executor.submit(
                _InContext(call.ctx), _run_call, self._dispatch, tool, call.args, call.run_ctx, info, self._t0, begin
            )
        except Exception:
            log.error("code-mode sub-call %s could not be handed to the executor", info.id, exc_info=True)
            future = concurrent.futures.Future()
            future.set_exception(RuntimeError("executor refused the call"))
        call.future = future

        # A caller's executor may cancel a task (its shutdown(cancel_futures=True))
        # before it runs: only the future's callback hears of that.
        def done(future: concurrent.futures.Future[Any]) -> None:
            put(_Done(seq, None, future))

        future.add_done_callback(done)

    def _collect(self, call: _Call, problem: Any) -> _Ran:
        """The outcome of a call whose task did not return: ``problem`` is its
        executor's future, or the exception it died of."""
        if isinstance(problem, concurrent.futures.Future):
            # One look at the settled future (each accessor takes its lock).
            try:
                result: _Ran = problem.result(0)
                return result
            except BaseException as exc:  # CancelledError, or whatever the executor raised
                problem = None if problem.cancelled() else exc
        log.warning("code-mode sub-call %s (tool %r) did not complete: %r", call.seq, call.tool.name, problem)
        return Outcome.failure(call.tool.name, DID_NOT_COMPLETE), time.perf_counter() - self._t0, "did_not_complete", 0

    def _commit(self, call: _Call) -> None:
        """Commit one call on its own (a settled call of an abandoned lane; a pass batches, :meth:`_drive`)."""
        outcome = call.outcome
        timeline = call.timeline
        committed = time.perf_counter() - self._t0
        with self._records_lock:
            timeline.committed = committed
            timeline.ok = outcome.ok
        ran = call.ran
        self._record(self._outcome_record(call, outcome, ran[2], ran[3]))
        self._deliver(call.ticket, outcome)
        self._notify(timeline, COMMIT)
        if self._on_outcome is not None:
            self._tell_outcome(timeline, outcome, ran[2])

    def _record(self, record: Any) -> None:
        """Add one audit record to the run's list and the session log (any thread)."""
        with self._records_lock:
            if self._sealed is not None and not self._unsealed([record]):
                return
            self._events.append(record)
        self._log_records([record])

    def _log_records(self, records: list[Any]) -> None:
        """Append audit records to the session log, as Events (any thread)."""
        session_log = self._session_log
        if type(session_log) is _RunLog:
            session_log._keep(records)  # its Events are made when it is read
        else:
            append = session_log.append
            for record in records:
                append(record.as_event())

    def _outcome_record(self, call: _Call, outcome: Outcome, kind: Optional[str], size: int) -> ToolOutcomeEvent:
        error = None
        if not outcome.ok:
            message = outcome.error.message if outcome.error is not None else FAILED
            error = {"kind": kind or "tool_error", "message": message}
        return tool_outcome_event(call.seq, call.tool.name, outcome.ok, error, size)

    def _deliver(self, ticket: Ticket, outcome: Outcome) -> None:
        with self._lock:
            if ticket not in self._open:
                return  # stop() already released it, from a driver that stopped answering
            self._open.remove(ticket)
        ticket._publish(outcome)

    def _notify(self, timeline: _Timeline, phase: str) -> None:
        if self._observer is None:
            return
        try:
            self._observer(timeline.record(), phase)
        except BaseException:  # even KeyboardInterrupt: raised by the observer's own code, not a signal
            log.warning("scheduler observer raised; ignoring it", exc_info=True)

    def _tell_start(self, call: _Call, event_id: str) -> None:
        assert self._on_start is not None
        try:
            self._on_start(call.timeline.record(), event_id, call.args, call.tool)
        except Exception:
            log.warning("scheduler start hook raised; ignoring it", exc_info=True)

    def _tell_outcome(self, timeline: _Timeline, outcome: Outcome, kind: Optional[str]) -> None:
        assert self._on_outcome is not None
        try:
            self._on_outcome(timeline.record(), outcome, kind)
        except Exception:
            log.warning("scheduler outcome hook raised; ignoring it", exc_info=True)

    def _wind_down(self) -> None:
        """The driver's last act, whether it was stopped or crashed."""
        with self._records_lock:
            self._stopping = True
            waits = list(self._throttle_waits)
        for hold in waits:
            hold.cancel()
        with self._lock:
            self._closed = True
        try:
            self._abandon()
        finally:
            # The shared tool threads stay (warm, for the next run); this
            # scheduler's calls that had not started were cancelled above.
            final = self._final = self._lane.state()
            with self._lock:
                self._exited = True
            # Submits and queries that raced stop() into the queue; no query comes after
            # _exited, and a submit that does has its ticket released just below.
            while True:
                try:
                    msg = self._queue.get_nowait()
                except queue.Empty:
                    break
                if type(msg) is _Call:
                    self._deliver(msg.ticket, Outcome.failure(msg.ticket.tool, GONE))
                elif type(msg) is list:
                    for call in msg:
                        self._deliver(call.ticket, Outcome.failure(call.ticket.tool, GONE))
                elif type(msg) is _Query:
                    msg.reply.set_result(final)
            self._release_open(GONE)

    def _abandon(self) -> None:
        # Same order as the original: queued calls, then running ones, then the
        # finished-but-uncommitted ones with their real outcome, by seq.
        with self._records_lock:
            for call in self._finished:
                call.timeline.finished = call.ran[1]
        self._finished.clear()
        abandoned = self._lane.abandon()
        for call in abandoned.queued:
            self._deliver(call.ticket, Outcome.failure(call.tool.name, ABANDONED))
        for call in abandoned.running:
            # No future only if the driver crashed while starting this call.
            future = getattr(call, "future", None)
            if future is not None:
                future.cancel()  # taken back if no thread has taken it up; else it finishes on its own
            abandoned_outcome = Outcome.failure(call.tool.name, ABANDONED)
            if getattr(call, "timeline", None) is not None:  # it started: its tool_call is in the audit
                self._record(self._outcome_record(call, abandoned_outcome, "abandoned", 0))
            self._deliver(call.ticket, abandoned_outcome)
        for call in abandoned.settled:
            self._commit(call)


# CallInfo(id, tool, seq, mode, run_ctx): the driver makes one per call.
_call_info = maker(CallInfo, "id", "tool", "seq", "mode", "run_ctx")


class _InContext:
    """What the executor is handed in place of ``ctx.run``: ``fn(*args)`` inside ``ctx``.

    Unlike ``ctx.run`` it pickles, for executors that serialize their tasks
    (Dask, even with ``processes=False``; process pools). It pickles *without*
    the context: a ``contextvars.Context`` cannot be pickled, and its values
    would mean nothing in another process. There, tools see a copy of the
    worker thread's own context, made for the call (what it sets is gone
    after it); ``current_call`` is still set, by ``_run_call``.
    """

    __slots__ = ("ctx",)

    def __init__(self, ctx: Optional[contextvars.Context]) -> None:
        self.ctx = ctx

    def __call__(self, fn: Callable[..., Any], /, *args: Any) -> Any:
        # Unpickled (no context): a copy of the worker thread's own, so what the
        # call sets is gone after it, as with a submitter's (see _run_begun).
        ctx = self.ctx if self.ctx is not None else contextvars.copy_context()
        return ctx.run(fn, *args)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_InContext, (None,))

    def __repr__(self) -> str:
        return "nous_sched.call"  # Dask names tasks after it: one stable prefix, not an address


def _run_reporting(put: Callable[[Any], None], seq: int, ctx: contextvars.Context, *args: Any) -> "_Done":
    """On a tool thread of the scheduler's own pool: run call ``seq`` in
    ``ctx`` (:func:`_run_call`), then tell the driver, whatever happened."""
    try:
        result = ctx.run(_run_call, *args)
    except BaseException as exc:  # escaped _run_call's `except Exception`: the task died
        put(_Done(seq, None, exc))
        raise
    done = _Done(seq, result)
    done.put = put
    return done  # its thread puts it once it has parked: the driver it wakes finds the GIL free sooner


def _run_call(
    dispatch: Dispatch,
    tool: Tool,
    args: dict[str, Any],
    run_ctx: Optional[RunContext],
    info: CallInfo,
    t0: float,
    begin: Optional[Callable[[], bool | str]] = None,
) -> _Ran:
    """Run one call on an executor thread; always returns an Outcome, never raises.

    ``begin()`` is asked first: False means the scheduler stopped before this
    thread took the call up (a saturated shared executor), and it never starts;
    a str is why its throttles refused it. A ``begin`` with an ``end()`` is
    told when the tool has returned (its throttles' places go back).
    """
    name = tool.name
    if begin is not None:
        verdict = begin()
        if verdict is not True:
            if isinstance(verdict, str):  # its throttles refused it (the deadline came first)
                return Outcome.failure(name, verdict), time.perf_counter() - t0, "throttled", 0
            return Outcome.failure(name, ABANDONED), time.perf_counter() - t0, "abandoned", 0
    try:
        result, kind, size = _run_begun(dispatch, tool, args, run_ctx, info, begin)
        return result, time.perf_counter() - t0, kind, size
    finally:
        end = getattr(begin, "end", None)
        if end is not None:
            end()


def _run_begun(
    dispatch: Dispatch, tool: Tool, args: dict[str, Any], run_ctx: Optional[RunContext], info: CallInfo, begin: Any
) -> tuple[Outcome, Optional[str], int]:
    """The tool's own part of :func:`_run_call`: its outcome, error kind (None: ok) and result size.

    It runs in the call's own context, a copy made for it alone (the
    submitter's, or the executor thread's: :class:`_InContext`), which no
    code runs in after it: what it sets here needs no reset (two fewer
    context copies per call)."""
    name = tool.name
    current_call.set(info)
    approval_sink.set(getattr(begin, "record_approval", None))
    try:
        return _outcome_of(dispatch(tool, args, run_ctx), name, info)
    except ToolError as exc:
        return Outcome.failure(name, _safe_str(exc)), getattr(exc, "kind", "tool_error"), 0
    except Exception as exc:
        log.warning("code-mode sub-call %s (tool %r) raised", info.id, name, exc_info=True)
        return Outcome.failure(name, _safe_str(exc)), "tool_error", 0


def _outcome_of(value: Any, name: str, info: CallInfo) -> tuple[Outcome, Optional[str], int]:
    """What dispatch returned as an Outcome, its error kind (None: ok) and the result's JSON size."""
    if isinstance(value, Outcome):
        if not value.ok:
            message = value.error.message if value.error is not None else FAILED
            return Outcome.failure(name, message), "tool_error", 0
        value = value.value
    try:
        # The copy, the program's text and the audit's size, in one go (the text is not made again).
        snapped, text, size = snapshot_text(value)
    except Exception as exc:
        log.error("code-mode sub-call %s (tool %r) returned a value that is not JSON: %s", info.id, name, exc)
        return Outcome.failure(name, f"tool returned a value that is not JSON: {exc}"), "invalid_result", 0
    return Outcome.crossed(snapped, text), None, size


def _safe_str(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        return FAILED
    return text if text else FAILED

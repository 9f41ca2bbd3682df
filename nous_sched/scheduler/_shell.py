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
  run starts no thread of its own. A driver with nothing to do (no call
  queued, running or uncommitted, no message) sleeps parked, and ``stop()``
  takes it back without waking it: it does the driver's last act itself,
  on the lane the driver handed over idle, so a run's end wakes no thread.
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
  (``nous_sched.scheduler._tool_threads``: warm, so a run starts no thread of its
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
import os
import queue
import select
import threading
import time
from collections.abc import Mapping
from typing import Any, Callable, ContextManager, Optional, Sequence

from .. import _validators as v
from .._interrupts import LOCAL, deferred, leave
from .._options import OPTIONAL_SESSION_LOG
from .._validators import require
from ..crossing import snapshot
from ..events import (
    SessionLog,
    ToolCallEvent,
    ToolOutcomeEvent,
    freeze,
    frozen_later,
)
from ..gate.dispatch import CallInfo, Dispatch, RunContext, direct_dispatch
from ..outcome import Outcome
from ..result.records import CallRecord, LaneState, made
from ..throttle import Hold
from ..tooling import PARALLEL, Tool, concurrency_mode, exclusive_reason
from . import _driver_threads, _tool_threads
from ._calls import (
    ABANDONED,
    AWAIT_TIMEOUT,
    DID_NOT_COMPLETE,
    FAILED,
    GONE,
    NO_ANSWER,
    STOP,
    Batch,
    Begin,
    Call,
    Done,
    Query,
    Ran,
    Reader,
    RunLog,
    ThrottledBegin,
    Ticket,
    Timeline,
    WhenBegun,
    told,
)
from ._running import InContext, run_call, run_reporting
from ._tool_threads import ToolThreads
from .lane import COMMIT, START, Lane

__all__ = ["Scheduler", "DEFAULT_MAX_PARALLEL", "DEFAULT_TIMEOUT"]

log = logging.getLogger("nous_sched")

DEFAULT_MAX_PARALLEL = 10
DEFAULT_TIMEOUT = 120.0
_STOP_JOIN = 2.0

_ids = itertools.count(1)
_TIMEOUT_MAX = threading.TIMEOUT_MAX


_OPTIONAL_SESSION_LOG = OPTIONAL_SESSION_LOG
_NAMED = v.Check("a tool: an object with a str `name`", lambda tool: isinstance(getattr(tool, "name", None), str))
_TICKET = v.instance_of(Ticket, "a Ticket from Scheduler.submit()")


def _nonblocking_pipe() -> tuple[int, int]:
    """A pipe whose ends never block (one system call where ``pipe2`` exists, not three)."""
    pipe2 = getattr(os, "pipe2", None)
    if pipe2 is not None:
        r, w = pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        return r, w
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    return r, w


def _reporter(put: Callable[[Any], None], seq: int) -> Callable[[concurrent.futures.Future[Any]], None]:
    """The done-callback of call ``seq``'s executor future: its :class:`Done` on the driver's queue."""

    def done(future: concurrent.futures.Future[Any]) -> None:
        put(Done(seq, None, future))

    return done


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
        ``nous-sched-tool-<k>``; ``nous_sched.scheduler._tool_threads``), which
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
    # thread alone (the lane, _finished, each Call once it is
    # queued): the driver is the lock. _tool_threads (the process's shared
    # set, or None with a caller's executor) is set in __init__ and guards
    # itself.
    #
    #   _queue          SimpleQueue, thread-safe by itself. Any thread puts
    #                   (_put); only the driver gets. Queries are put under _lock, so
    #                   none lands after the driver's last drain (_exited). A
    #                   submit is put after its ticket joined _open under _lock,
    #                   so if it lands after that drain, the driver's last act
    #                   (releasing all of _open) has released its ticket.
    #   _batch          the open Batch or None: written only by the thread
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
    #   _records_lock   _events, _trail and every Timeline's fields: the driver
    #                   writes them (a pass's worth at once, see _drive), any
    #                   thread copies them out; a tool thread writes its call's
    #                   `began` and `throttled`, and appends ApprovalEvents.
    #   guards also     _throttle_waits (the Holds of calls waiting for their
    #                   throttles' places: added by a tool thread only while not
    #                   _stopping, cancelled by whoever sets _stopping)
    #   guards also     _stopping (set by stop() and the exiting driver; read by a
    #                   tool thread as it takes up a call, Begin, which stamps
    #                   `began`: so no call begins after the scheduler stops)
    #   guards also     _unbegun (the calls handed to a tool and not yet begun:
    #                   the driver counts each as its pass starts it, Begin
    #                   as it stamps `began`, the driver again for one that
    #                   finished without beginning) and _on_begun (when_begun's
    #                   callbacks waiting for _unbegun to reach 0: added by the
    #                   driver, taken by whoever brings it to 0 or sets _stopping)
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
    #   _parked         True while the driver, with nothing to do (its queue
    #                   empty, its lane idle, no reader), sleeps parked out
    #                   of _drive_loop (_driver_threads.PARK), not in the
    #                   queue's get: set by the driver under _park_lock
    #                   before it looks at the queue a last time; a put reads
    #                   it after putting, then (under _park_lock) the one
    #                   that sets it False resumes the driver, or stop()
    #                   takes the driver back without waking it (_take_back).
    #   _polling        True while the driver sleeps in poll (a run's Reader
    #                   attached), not in the queue's get: written by the
    #                   driver alone, set before it looks at the queue a last
    #                   time; a put reads it after putting and then pokes.
    #   _poke_lock      guards _pokes (the poke pipe: (read, write), or None
    #                   before the first Reader and after the driver exits):
    #                   a poke writes, the exiting driver closes, never a
    #                   stale descriptor.
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
        if dispatch is not direct_dispatch:  # (the default: its shape is known, and reading it costs each run)
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
        self._session_log = RunLog(self._records_lock) if session_log is None else session_log
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
        self._on_start: Optional[Callable[[CallRecord, ToolCallEvent, Any, Any], Any]] = None
        self._on_outcome: Optional[Callable[[CallRecord, ToolOutcomeEvent, Outcome], Any]] = None
        self._n = next(_ids)
        self._t0 = time.perf_counter()
        # SimpleQueue: the C queue from `queue`, without Queue's task tracking we never use.
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # While a run has attached its worker's pipe (attach_reader) the driver
        # sleeps in poll over it and the poke pipe, which a put writes then.
        self._polling = False
        self._poke_lock = threading.Lock()
        self._pokes: Optional[tuple[int, int]] = None
        self._poller: Any = None  # the driver's: select.poll over the poke pipe and the reader's fd
        self._reader: Optional[Reader] = None  # driver-owned
        self._batch: Optional[Batch] = None

        self._lock = threading.Lock()
        self._open: set[Ticket] = set()
        self._closed = False
        self._exited = False
        self._wedged_by: Optional[Ticket] = None

        self._stopping = False
        # The audit: ToolCallEvent, ApprovalEvent, ToolOutcomeEvent records, each
        # record the driver writes held until first read (records.made: a tuple
        # of its type and arguments) while no hook sees it as it is written;
        # every entry before _made is a record.
        self._events: list[Any] = []
        self._made = 0
        # The seqs whose tool_outcome stop() wrote for a driver that did not
        # wind down in time (under _records_lock); the driver writes none of them.
        self._sealed: Optional[set[int]] = None
        # Each started call's Timeline, in seq order (its index is its seq); once
        # committed, its row (Timeline.row: final then), see _write_pass.
        self._trail: list[Any] = []
        self._throttle_waits: set[Hold] = set()
        self._unbegun = 0
        self._on_begun: list[Callable[[], None]] = []

        self._final: Optional[LaneState] = None
        self._lane: Lane[Call] = Lane(max_parallel)  # driver-owned from here on
        self._finished: list[Call] = []  # driver-owned: calls whose `finished` the next pass stamps

        # The driver: a thread borrowed from the process's warm driver threads
        # for this scheduler's life (_driver_threads), named after it
        # meanwhile. It sets _driver to itself as it takes this scheduler up,
        # and releases _driven once it is done with it for good.
        self._name = f"nous-sched-driver-{self._n}"
        self._driver: Optional[threading.Thread] = None
        driven = self._driven = threading.Lock()
        driven.acquire()
        self._drivers = _driver_threads.shared()
        self._parked = False
        self._park_lock = threading.Lock()
        # Called (under _lock, exactly once: whoever takes it sets None) right
        # after the first message is put, so a warm driver wakes once, for it.
        self._wake: Optional[Callable[[], None]] = None
        self._driving: Optional[_driver_threads.Driving] = None
        try:
            self._wake = self._driving = self._drivers.drive(self._drive_loop, self._name, driven)
            self._driver = self._driving.thread
        except BaseException:
            # A KeyboardInterrupt can land while a driver is started for it;
            # the caller never gets this scheduler to stop, so stop it here.
            self._put(STOP)
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
        on_start: Optional[Callable[[CallRecord, ToolCallEvent, Any, Any], Any]] = None,
        on_outcome: Optional[Callable[[CallRecord, ToolOutcomeEvent, Outcome], Any]] = None,
    ) -> None:
        """Hooks for a run's event stream, set before the first submit and
        called on the driver thread, in commit order: ``on_start(record,
        event, args, tool)`` as each call starts (its :class:`CallRecord`, its
        ``tool_call`` audit record, the tool's own arguments before the tool
        has them, the tool), and ``on_outcome(record, event, outcome)`` as each
        commits (its :class:`CallRecord`, its ``tool_outcome`` audit record,
        the :class:`Outcome` the program gets). The audit records are the ones
        the run keeps: the hooks add no record of their own. What a hook raises
        is logged, never raised into the run."""
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
        call = Call(ticket, tool, dispatched, logged, run_ctx, contextvars.copy_context())
        batch = self._batch
        if batch is not None and batch.owner == threading.get_ident():
            batch.calls.append(call)  # admitted (or refused) with the rest when the batch ends
            return ticket
        self._admit((call,), call)
        return ticket

    def _admit(self, calls: Sequence["Call"], message: Any) -> None:
        """Open the tickets of ``calls`` and put ``message`` (the calls, one
        or a batch) on the driver's queue; or, if the scheduler refuses new
        calls, publish each ticket's refusal instead."""
        # Only the first message wakes the driver, and an interrupt between
        # taking the wake and calling it would leave the driver asleep for
        # good (stop() would find no wake to call): that one is deferred.
        first = self._wake is not None
        if first:
            LOCAL.depth += 1
        try:
            with self._lock:
                refusal = self._refusal() if self._closed or self._wedged_by is not None else None
                if refusal is None:
                    if len(calls) == 1:  # a lone call (every sequential await): no list, one add
                        self._open.add(calls[0].ticket)
                    else:
                        self._open.update([call.ticket for call in calls])
                    wake, self._wake = self._wake, None
            if refusal is None:
                self._put(message)
                if wake is not None:
                    wake()
            else:
                for call in calls:
                    ticket = call.ticket
                    ticket._publish(Outcome.failure(ticket.tool, refusal))  # noqa: SLF001
        finally:
            if first:
                leave()

    def _put(self, msg: Any) -> None:
        """Put ``msg`` on the driver's queue (any thread); poke the driver if it sleeps in poll."""
        self._queue.put(msg)
        if self._polling:  # (read after the put: see _sleep)
            self._poke()
        elif self._parked:  # (read after the put: see _park)
            self._unpark()

    def _unpark(self) -> None:
        # A deferred step: an interrupt between taking the park and resuming
        # would leave the driver parked for good.
        LOCAL.depth += 1
        try:
            with self._park_lock:
                resume = self._parked
                self._parked = False
            if resume:
                assert self._driving is not None  # (_park parks only once it is set)
                self._driving.resume()
        finally:
            leave()

    def _park(self) -> bool:
        """(The driver, nothing to do.) Whether it may park: no message came
        meanwhile (else it goes on), and its resume is known (a driver
        started for this scheduler may run before ``drive`` has returned it,
        or an interrupt may have cut ``drive`` short: it waits in ``get``)."""
        if self._driving is None:
            return False
        with self._park_lock:
            # Set before the last look at the queue, and a put reads it after
            # putting: either this look sees the message, or its put resumes.
            self._parked = True
            if self._queue.empty():
                return True
            self._parked = False
            return False

    def _take_back(self) -> bool:
        """(stop(), after closing.) If the driver is parked with its queue
        empty (its lane idle), or was never woken, do its last act here and
        give its thread back idle without waking it; whether that was done.
        Else the driver hears STOP as before."""
        driving = self._driving
        if driving is None or self._drivers.forked_away:
            return False
        with self._lock:
            never_woken = self._wake is not None and driving.warm
            if never_woken:
                self._wake = None
        if not never_woken:
            with self._park_lock:
                if not (self._parked and self._queue.empty()):
                    return False
                self._parked = False  # from here on, no put resumes it
        try:
            self._wind_down()
        finally:
            self._drivers.take_back(driving)
        return True

    def _poke(self) -> None:
        # A deferred step: an interrupt landing as the lock is let go must not leave it held.
        LOCAL.depth += 1
        try:
            with self._poke_lock:
                pokes = self._pokes
                if pokes is not None:
                    try:
                        os.write(pokes[1], b"!")
                    except OSError:  # full: the driver is awake already
                        pass
        finally:
            leave()

    def attach_reader(self, fd: int, readable: Callable[[], bool], gone: Callable[[], None]) -> bool:
        """Let the driver read a run's worker while the run waits (the worker
        runtime's hand-off, ``nous_sched.runtime._handoffcore``): from its
        next sleep on, the driver sleeps in ``poll`` over ``fd`` and its own
        queue, and whenever ``fd`` has data it calls ``readable()`` (on the
        driver thread, between its passes, never during one) until that
        answers False; then it drops ``fd``. If the scheduler stops first,
        the driver calls ``gone()`` instead, once, as it winds down (it must
        neither block nor raise). One reader at a time: a later one
        replaces it. False if the scheduler has stopped (nothing will call
        either)."""
        with deferred():  # (Ctrl-C on the main thread: never the lock left held, nor a reader half given)
            with self._lock:
                if self._closed:
                    return False
                self._put(Reader(fd, readable, gone))
                wake, self._wake = self._wake, None
            if wake is not None:
                wake()
        return True

    def when_begun(self, then: Callable[[], None]) -> None:
        """Call ``then()`` once, when every call submitted before this one has
        begun its tool (its thread has taken it up: what ``began`` stamps), or
        will not begin (refused, cancelled, its run over), or the scheduler
        stops, whichever comes first. Calls the scheduler holds back
        (``max_parallel``, an exclusive call) are not waited for: only those it
        has handed to a tool. ``then`` is called by the thread that brings this
        about (a tool thread, the driver, the one that stops the scheduler, or
        this one when it has stopped already): it must neither block nor raise
        (what it raises is logged). A runtime does its background work then
        (the worker pool starts the replacement of the spare a run took): when
        the run's calls have begun, no start-up of the run's competes with it.

        :raises ConfigError: ``then`` is not callable.
        """
        require("Scheduler.when_begun", "then", then, v.CALLABLE)
        with deferred():  # (Ctrl-C on the main thread: never the lock left held, nor the ask half made)
            with self._lock:
                closed = self._closed
                if not closed:
                    self._put(WhenBegun(then))
                    wake, self._wake = self._wake, None
            if closed:
                told([then])
            elif wake is not None:
                wake()

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
        return Batch(self)

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
        outcome = ticket._wait(limit)  # noqa: SLF001
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
            return [e for e in self._made_events() if type(e) is ToolCallEvent]

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
            return list(self._made_events())

    def audit_entries(self) -> list[Any]:
        """:meth:`audit_events` as the scheduler holds them: each a record, or
        one not made yet, held as a tuple of its type and arguments
        (``nous_sched.result.records.made`` makes it). Never waits for the driver."""
        with self._records_lock:
            return list(self._events)

    def _made_events(self) -> list[Any]:
        """(Under _records_lock.) ``_events``, every held entry made its record, in place,
        so every reader gets the same records."""
        events = self._events
        for i in range(self._made, len(events)):
            entry = events[i]
            if type(entry) is tuple:
                events[i] = made(entry)
        self._made = len(events)
        return events

    def trail(self) -> list[CallRecord]:
        """The timeline of every started call, in submission order. Never waits for the driver."""
        with self._records_lock:
            return [CallRecord(*entry) if type(entry) is tuple else entry.record() for entry in self._trail]

    def trail_rows(self) -> list[tuple[Any, ...]]:
        """:meth:`trail` as each record's fields, in :class:`CallRecord`'s order: the
        same values, as tuples (``CallRecord(*row)`` is the record). Never waits for the driver."""
        with self._records_lock:
            return [entry if type(entry) is tuple else entry.row() for entry in self._trail]

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
                self._put(Query(reply))
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

    def _stop_beginning(self) -> None:
        """From here on no call begins (Begin); the calls waiting for their throttles'
        places give them back now, not when the deadline passes; when_begun's callbacks are told."""
        with self._records_lock:
            self._stopping = True
            waits = list(self._throttle_waits)
            thens, self._on_begun = self._on_begun, []
        for hold in waits:
            hold.cancel()
        told(thens)

    def _begin_stop(self) -> None:
        self._stop_beginning()
        with self._lock:
            first = not self._closed
            self._closed = True
        if first and threading.current_thread() is not self._driver and self._take_back():
            return  # the driver had nothing to do: its last act is done, here, and its thread idle
        with self._lock:
            wake, self._wake = self._wake, None
        if first:
            self._put(STOP)
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
            events = self._made_events()
            started = {e.seq: e.tool for e in events if type(e) is ToolCallEvent}
            for e in events:
                if type(e) is ToolOutcomeEvent:
                    started.pop(e.seq, None)
            error = {"kind": "abandoned", "message": ABANDONED}
            records: list[Any] = [ToolOutcomeEvent(seq, name, False, error, 0) for seq, name in sorted(started.items())]
            self._events += records
            self._sealed = set(started)
            run_log = self._session_log
            kept = type(run_log) is RunLog
            if kept:
                run_log._events += records  # noqa: SLF001
        if records and not kept:
            self._log_records(records)

    def _unsealed(self, records: list[Any]) -> list[Any]:
        """(Under _records_lock, once stop() has sealed the audit.) ``records``
        less the outcomes stop() wrote already."""
        sealed = self._sealed
        assert sealed is not None
        return [
            r
            for r in records
            if not (
                (type(r) is ToolOutcomeEvent and r.seq in sealed)
                or (type(r) is tuple and r[0] == ToolOutcomeEvent.type and r[1] in sealed)
            )
        ]

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
            ticket._publish(Outcome.failure(ticket.tool, message))  # noqa: SLF001

    # -- the driver ---------------------------------------------------------

    def _drive_loop(self) -> Any:
        """The driver: every message, in order, until STOP; returns
        ``_driver_threads.PARK`` to sleep parked when it has nothing to do
        (called again when a put resumes it)."""
        self._driver = threading.current_thread()
        get = self._queue.get
        empty = self._queue.empty
        handle = self._handle
        drive = self._drive
        lane = self._lane
        finished = lane.finished
        collected = self._finished.append
        parked = False
        try:
            while True:
                if empty():
                    if self._reader is not None:
                        self._sleep()
                        continue
                    # Nothing to do until the next message: sleep out of this
                    # loop, so that stop() can take the thread back unwoken.
                    if lane.idle() and not self._finished and self._park():
                        parked = True
                        return _driver_threads.PARK
                msg = get()
                # Take everything already queued before driving, so a burst of
                # completions commits in one pass. (Only this thread gets, so a
                # queue that is not empty answers get() at once; asking is
                # cheaper than get_nowait's exception at the end of every burst.)
                while True:
                    # A tool's report, every call's last message, handled here
                    # (_handle's, written out: a call fewer per call).
                    if type(msg) is Done:
                        call = finished(msg.seq)
                        if call is not None:  # (None: an abandoned call's tool returned; its outcome is delivered)
                            result = msg.result
                            ran = result if result is not None else self._collect(call, msg.problem)
                            call.outcome = ran[0]
                            call.ran = ran
                            # Stamped (ran[1]) with the pass's other records, under one lock (_drive).
                            collected(call)
                    elif msg is STOP:
                        return
                    else:
                        handle(msg)
                    if empty():
                        break
                    msg = get()
                drive()
        except BaseException:
            log.critical("%s crashed; releasing every caller", self._name, exc_info=True)
            raise
        finally:
            if not parked:
                self._wind_down()

    def _handle(self, msg: Any) -> None:
        """Every message but a tool's report (:class:`Done`, handled in :meth:`_drive_loop`) and STOP."""
        kind = type(msg)
        if kind is Call:
            self._accept(msg)
        elif kind is list:
            # A batch (a Promise.all's thousand calls): _accept's, written out.
            accept = self._lane.accept
            for call in msg:
                call.mode = mode = call.ctx.run(concurrency_mode, call.tool, call.args)
                call.seq = call.ticket.seq = accept(call, mode)
        elif kind is Query:
            msg.reply.set_result(self._lane.state())
        elif kind is Reader:
            self._attach(msg)
        elif kind is WhenBegun:
            # The calls queued before it start first (it asks about them too);
            # none once stop() has begun: it queues STOP after this, and no
            # pass may start a call after that (the tool threads may be retired).
            if not self._stopping:
                self._drive()
            with self._records_lock:
                if self._unbegun and not self._stopping:
                    self._on_begun.append(msg.then)
                    return
            told([msg.then])

    def _attach(self, reader: Reader) -> None:
        """A run's worker pipe to read while the queue is empty (see :meth:`attach_reader`)."""
        poller = self._poller
        if poller is None:
            r, w = _nonblocking_pipe()
            with self._poke_lock:
                self._pokes = (r, w)
            poller = self._poller = select.poll()
            poller.register(r, select.POLLIN)
        if self._reader is not None:
            poller.unregister(self._reader.fd)
        self._reader = reader
        poller.register(reader.fd, select.POLLIN)

    def _sleep(self) -> None:
        """Sleep until the queue has a message or the reader's pipe has data (then read it)."""
        reader = self._reader
        assert reader is not None and self._pokes is not None
        # The flag is set before the last look at the queue, and a put reads
        # it after putting: either this look sees the message, or its put pokes.
        self._polling = True
        try:
            if not self._queue.empty():
                return
            ready = self._poller.poll()
        finally:
            self._polling = False
        poke = self._pokes[0]
        for fd, _ in ready:
            if fd == poke:
                try:
                    os.read(poke, 4096)
                except BlockingIOError:
                    pass
            elif fd == reader.fd and self._reader is reader and not reader.readable():
                self._poller.unregister(fd)
                self._reader = None

    def _accept(self, call: Call) -> None:
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
        now = self._lane.steps()
        finished = self._finished
        if not now and not finished:
            return
        records: list[Any] = []  # the pass's audit records (or held: records.made), in the lane's order
        started: list[Call] = []
        ids: list[str] = []  # each started call's tool_call record's id (a list beside it: no tuple per call)
        committed: list[Call] = []
        # (START or COMMIT, the call, its audit record): kept only for the hooks.
        actions: Optional[list[tuple[str, Call, Any]]] = (
            None if self._observer is None and self._on_outcome is None and self._on_start is None else []
        )
        # Held while no one sees a record as it is written: no hook, and the run's own
        # log (which makes its Events when read); most runs' audits are never read.
        held = actions is None and type(self._session_log) is RunLog
        # One stamp for the pass: its starts and commits are all decided here, and
        # none is handed over or published before its records are written below.
        at = time.perf_counter() - self._t0
        # Each started call's tool_call record (held: see records.made) and its Timeline.
        prefix = f"{self._call_id}:code:" if self._call_id is not None else "code:"
        call_type = ToolCallEvent.type
        outcome_type = ToolOutcomeEvent.type
        record: Any
        for kind, call in now:
            if kind is START:
                seq = call.seq
                name = call.tool.name
                mode = call.mode
                event_id = prefix + str(seq)
                record = (
                    (call_type, event_id, name, call.logged, mode, seq)
                    if held
                    else ToolCallEvent(event_id, name, call.logged, mode, seq)
                )
                reason = "" if mode == PARALLEL else exclusive_reason(call.tool, mode)
                call.timeline = Timeline(seq, name, mode, at, reason)
                started.append(call)
                ids.append(event_id)
            else:
                ran = call.ran
                outcome = call.outcome
                if held and outcome.ok and not outcome.blobs:
                    record = (outcome_type, call.seq, call.tool.name, True, None, ran[3])
                else:
                    record = self._outcome_record(call, outcome, ran[2], ran[3])
                committed.append(call)
            records.append(record)
            if actions is not None:
                actions.append((kind, call, record))
        self._write_pass(records, started, committed, at)
        if actions is not None:
            self._act_in_order(actions)
            return
        if started:
            self._hand_over(started, ids)
        if committed:
            if len(committed) == 1:  # (a lone commit: nothing to order)
                call = committed[0]
                self._deliver(call.ticket, call.outcome)
            else:
                self._publish_newest_first(committed)

    def _write_pass(self, records: list[Any], started: list[Call], committed: list[Call], at: float) -> None:
        """A pass's audit records, trail and stamps (``at``: its commits') under one ``_records_lock``, and
        the run's own log with them (under the same lock: see :class:`RunLog`); a session log of the caller's
        gets them after."""
        finished = self._finished
        thens: list[Callable[[], None]] = []
        with self._records_lock:
            for call in finished:
                timeline = call.timeline
                timeline.finished = call.ran[1]
                if timeline.began is None:  # over without beginning (refused, cancelled): never will
                    self._unbegun -= 1
            self._unbegun += len(started)
            if not self._unbegun and self._on_begun:
                thens, self._on_begun = self._on_begun, []
            trail = self._trail
            for call in committed:
                timeline = call.timeline
                timeline.committed = at
                timeline.ok = call.outcome.ok
                # Final now: the trail keeps its row, a tuple of plain values that
                # the garbage collector stops tracking, instead of the Timeline,
                # which a run of many calls held to its end, promoted to the
                # oldest generation (and so to the full collections it brings on).
                seq = call.seq
                if seq < len(trail) and trail[seq] is timeline:
                    trail[seq] = timeline.row()
            if self._sealed is not None:
                records = self._unsealed(records)
            self._events += records
            for call in started:
                trail.append(call.timeline)
            run_log = self._session_log
            kept = type(run_log) is RunLog
            if kept:  # under the same lock (its own): its Events are made when it is read
                run_log._events += records  # noqa: SLF001
        finished.clear()
        if records and not kept:
            self._log_records(records)
        if thens:
            told(thens)

    def _act_in_order(self, actions: list[tuple[str, Call, Any]]) -> None:
        """With an observer or an outcome hook: each action's hand-over, publish and callbacks, in the lane's order."""
        for kind, call, record in actions:
            if kind is START:
                if self._on_start is not None:
                    self._tell_start(call, record)
                self._notify(call.timeline, START)
                self._hand_over((call,), (record.id,))
            else:
                self._deliver(call.ticket, call.outcome)
                self._notify(call.timeline, COMMIT)
                if self._on_outcome is not None:
                    self._tell_outcome(call.timeline, record, call.outcome)

    def _publish_newest_first(self, committed: list[Call]) -> None:
        """Publish a pass's commits (more than one) after one ``_lock``, newest first (see :meth:`_drive`)."""
        tickets = {call.ticket for call in committed}
        with self._lock:  # set operations in C: the lock is held for no Python loop
            mine = tickets & self._open  # the rest stop() already released, from a driver that stopped answering
            self._open -= mine
        for call in reversed(committed):
            if call.ticket in mine:
                call.ticket._publish(call.outcome)  # noqa: SLF001

    def _hand_over(self, calls: Sequence[Call], ids: Sequence[str]) -> None:
        """Hand started calls (each with its ``tool_call`` record's id, in ``ids``), in order, to the tool
        threads, or the caller's executor (one frame for a pass's starts: a fan-out's fifty)."""
        put = self._put
        threads = self._tool_threads
        submit = threads.submit if threads is not None else None
        dispatch = self._dispatch
        t0 = self._t0
        for call, event_id in zip(calls, ids, strict=True):
            seq = call.seq
            timeline = call.timeline
            tool = call.tool
            run_ctx = call.run_ctx
            info = CallInfo(event_id, timeline.tool, seq, call.mode, run_ctx)
            begin = (
                ThrottledBegin(self, timeline, tool.throttles, getattr(run_ctx, "deadline", None))
                if getattr(tool, "throttles", None)
                else Begin(self, timeline)
            )
            try:
                if submit is not None:
                    # Our own threads: the task reports back itself, with no future.
                    # What it cannot report (cancelled before it ran) happens only
                    # when the lane is abandoned, and needs no report.
                    call.future = submit(
                        run_reporting, put, seq, call.ctx, dispatch, tool, call.args, run_ctx, info, t0, begin
                    )
                    continue
                assert self._executor is not None
                future = self._executor.submit(
                    InContext(call.ctx), run_call, dispatch, tool, call.args, run_ctx, info, t0, begin
                )
            except Exception:
                log.error("code-mode sub-call %s could not be handed to the executor", info.id, exc_info=True)
                future = concurrent.futures.Future()
                future.set_exception(RuntimeError("executor refused the call"))
            call.future = future
            # A caller's executor may cancel a task (its shutdown(cancel_futures=True))
            # before it runs: only the future's callback hears of that.
            future.add_done_callback(_reporter(put, seq))

    def _collect(self, call: Call, problem: Any) -> Ran:
        """The outcome of a call whose task did not return: ``problem`` is its
        executor's future, or the exception it died of."""
        if isinstance(problem, concurrent.futures.Future):
            # One look at the settled future (each accessor takes its lock).
            try:
                result: Ran = problem.result(0)
                return result
            except BaseException as exc:  # CancelledError, or whatever the executor raised
                problem = None if problem.cancelled() else exc
        log.warning("code-mode sub-call %s (tool %r) did not complete: %r", call.seq, call.tool.name, problem)
        return Outcome.failure(call.tool.name, DID_NOT_COMPLETE), time.perf_counter() - self._t0, "did_not_complete", 0

    def _commit(self, call: Call) -> None:
        """Commit one call on its own (a settled call of an abandoned lane; a pass batches, :meth:`_drive`)."""
        outcome = call.outcome
        timeline = call.timeline
        committed = time.perf_counter() - self._t0
        with self._records_lock:
            timeline.committed = committed
            timeline.ok = outcome.ok
        ran = call.ran
        record = self._outcome_record(call, outcome, ran[2], ran[3])
        self._record(record)
        self._deliver(call.ticket, outcome)
        self._notify(timeline, COMMIT)
        if self._on_outcome is not None:
            self._tell_outcome(timeline, record, outcome)

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
        if type(session_log) is RunLog:
            session_log._keep(records)  # its Events are made when it is read  # noqa: SLF001
        else:
            append = session_log.append
            for record in records:
                append(record.as_event())

    def _outcome_record(self, call: Call, outcome: Outcome, kind: Optional[str], size: int) -> ToolOutcomeEvent:
        error = None
        if not outcome.ok:
            message = outcome.error.message if outcome.error is not None else FAILED
            error = {"kind": kind or "tool_error", "message": message}
        blobs = outcome.blobs
        if blobs:  # what the run kept on the host: ids and sizes, never the bytes
            return ToolOutcomeEvent(call.seq, call.tool.name, True, None, size, tuple((b.id, b.size) for b in blobs))
        return ToolOutcomeEvent(call.seq, call.tool.name, outcome.ok, error, size)

    def _deliver(self, ticket: Ticket, outcome: Outcome) -> None:
        with self._lock:
            if ticket not in self._open:
                return  # stop() already released it, from a driver that stopped answering
            self._open.remove(ticket)
        ticket._publish(outcome)  # noqa: SLF001

    def _notify(self, timeline: Timeline, phase: str) -> None:
        if self._observer is None:
            return
        try:
            self._observer(timeline.record(), phase)
        except BaseException:  # even KeyboardInterrupt: raised by the observer's own code, not a signal
            log.warning("scheduler observer raised; ignoring it", exc_info=True)

    def _tell_start(self, call: Call, event: ToolCallEvent) -> None:
        assert self._on_start is not None
        try:
            self._on_start(call.timeline.record(), event, call.args, call.tool)
        except Exception:
            log.warning("scheduler start hook raised; ignoring it", exc_info=True)

    def _tell_outcome(self, timeline: Timeline, event: ToolOutcomeEvent, outcome: Outcome) -> None:
        assert self._on_outcome is not None
        try:
            self._on_outcome(timeline.record(), event, outcome)
        except Exception:
            log.warning("scheduler outcome hook raised; ignoring it", exc_info=True)

    def _wind_down(self) -> None:
        """The driver's last act, whether it was stopped or crashed."""
        self._stop_beginning()
        with self._lock:
            self._closed = True
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.gone()
        with self._poke_lock:  # (no poke writes to a closed, or reused, descriptor)
            pokes, self._pokes = self._pokes, None
        if pokes is not None:
            for fd in pokes:
                os.close(fd)
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
            # Whoever winds down is the queue's one reader by now (the driver, or
            # stop() having taken it back): a queue that is not empty answers
            # get at once, and asking is cheaper than raising queue.Empty.
            empty = self._queue.empty
            get = self._queue.get_nowait
            while not empty():
                msg = get()
                if type(msg) is Call:
                    self._deliver(msg.ticket, Outcome.failure(msg.ticket.tool, GONE))
                elif type(msg) is list:
                    for call in msg:
                        self._deliver(call.ticket, Outcome.failure(call.ticket.tool, GONE))
                elif type(msg) is Query:
                    msg.reply.set_result(final)
                elif type(msg) is Reader:
                    msg.gone()
                elif type(msg) is WhenBegun:
                    told([msg.then])
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

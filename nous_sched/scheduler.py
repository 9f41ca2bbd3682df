"""One driver lane that orders a program's tool sub-calls.

A program is a batch of tool calls written as code, and nothing in it says how
those calls may interleave. The :class:`Scheduler` decides, conservatively:

* **One driver thread owns every decision.** Classify, start and commit all
  happen on the thread ``nous-sched-driver-<n>``, which reads commands from a
  queue. Pending calls, the in-flight set and the commit cursor are touched by
  no other thread, so they need no lock: the driver is the lock.
* **Commits are strictly in submission order.** A call that finishes early
  waits for its predecessors, so a caller observes one deterministic order
  however the work raced.
* **Exclusive by default.** A call runs beside others only if its tool's
  ``concurrency_safe(args)`` returns exactly ``True``
  (:func:`~nous_sched.tool.concurrency_mode`). An exclusive call waits until
  everything before it has committed, runs alone, and holds the barrier through
  its own commit, so nothing starts or commits inside its window.
* **At most ``max_parallel`` calls run at once**; more queue, they never fail.
* **Tools run on an executor**: a private ``ThreadPoolExecutor`` by default, or
  any ``concurrent.futures.Executor`` you pass (shared, never shut down here).
  The submitting thread's ``contextvars`` are visible inside the tool.
* **Failure is data.** A failed call commits an :class:`~nous_sched.Outcome`
  holding two strings; the traceback goes to the ``nous_sched`` logger.
* **Every wait is bounded** by ``timeout`` (the run's deadline), and
  :meth:`Scheduler.stop` releases every caller, even when a tool or predicate
  never returns.

Thread-safety: every public method may be called from any thread.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextvars
import itertools
import logging
import queue
import threading
import time
from typing import Any, Callable, Optional

from . import _validators as v
from ._validators import require
from .dispatch import CallInfo, current_call, direct_dispatch
from .errors import ToolError
from .events import SessionLog, ToolCallEvent
from .outcome import Outcome
from .records import CallRecord, LaneState
from .snapshot import snapshot
from .tool import EXCLUSIVE, concurrency_mode

__all__ = ["Scheduler", "Ticket"]

log = logging.getLogger("nous_sched")

DEFAULT_MAX_PARALLEL = 10
DEFAULT_TIMEOUT = 120.0
_STOP_JOIN = 2.0

_ids = itertools.count(1)

# What a program reads when the lane, not the tool, ends a call.
GONE = "code run is over; scheduler is gone"
ABANDONED = "code run is over; tool call abandoned"
AWAIT_TIMEOUT = "timed out waiting for the sub-call to commit"
NO_ANSWER = "the scheduler did not answer within {s:g}s (a concurrency_safe predicate may be stuck)"
FAILED = "tool call failed"
DID_NOT_COMPLETE = "tool call did not complete"

# Driver commands. Tuples, not classes: one is built per sub-call on the hot path.
_SUBMIT, _DONE, _QUERY, _STOP = range(4)


class Ticket:
    """A handle on one submitted sub-call; pass it to :meth:`Scheduler.wait`.

    ``tool`` is the tool's name. ``seq`` is the call's submission index once
    the driver has accepted it, ``None`` before.
    """

    __slots__ = ("tool", "seq", "_future")

    def __init__(self, tool: str) -> None:
        self.tool = tool
        self.seq: Optional[int] = None
        self._future: concurrent.futures.Future = concurrent.futures.Future()

    def done(self) -> bool:
        """True once the call has committed (or been released with an error)."""
        return self._future.done()

    def wait(self, timeout: Optional[float] = None) -> Optional[Outcome]:
        """The call's committed :class:`Outcome`, or ``None`` if ``timeout`` seconds pass first.

        ``timeout=None`` waits until the call commits or the scheduler
        releases it. Unlike :meth:`Scheduler.wait`, a timeout here says nothing
        about the lane: it is the runtime seam's ``PendingCall.wait``.
        """
        require("Ticket.wait", "timeout", timeout, v.WAIT_SECONDS)
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            return None

    def __repr__(self) -> str:
        return f"<Ticket {self.tool!r} seq={self.seq} done={self.done()}>"


class _Entry:
    """Driver-private record of one accepted call."""

    __slots__ = ("seq", "ticket", "tool", "args", "logged", "run_ctx", "ctx", "mode", "future", "outcome", "record")

    def __init__(self, seq, ticket, tool, args, logged, run_ctx, ctx):
        self.seq = seq
        self.ticket = ticket
        self.tool = tool
        self.args = args
        self.logged = logged
        self.run_ctx = run_ctx
        self.ctx = ctx
        self.mode = EXCLUSIVE
        self.future = None
        self.outcome: Optional[Outcome] = None
        self.record: Optional[list] = None


_OPTIONAL_SESSION_LOG = v.optional(v.instance_of(SessionLog, "a nous_sched.SessionLog"))
_NAMED = v.Check("a tool: an object with a str `name`", lambda tool: isinstance(getattr(tool, "name", None), str))
_TICKET = v.instance_of(Ticket, "a Ticket from Scheduler.submit()")


def _release(ticket: Ticket, outcome: Outcome) -> None:
    try:
        ticket._future.set_result(outcome)
    except concurrent.futures.InvalidStateError:
        pass  # stop() already released it, from a lane that stopped answering


class Scheduler:
    """The lane for one program run. See the module docstring for guarantees.

    :param dispatch: ``dispatch(tool, args, run_ctx)`` runs one call on an
        executor thread; :func:`~nous_sched.direct_dispatch` by default.
    :param context: a :class:`~nous_sched.SessionLog` that receives one
        ``tool_call`` event per started call; a fresh one by default.
    :param max_parallel: the ceiling on calls running at once (positive int).
    :param call_id: prefix of event ids, ``"<call_id>:code:<seq>"``.
    :param executor: where tools run. Yours is shared and never shut down;
        without one the scheduler owns a ``ThreadPoolExecutor`` of
        ``max_parallel`` threads and shuts it down in :meth:`stop`.
    :param timeout: the bound, in seconds, on every wait (the run's deadline).
    :param observer: ``observer(record: CallRecord, phase)`` is called on the
        driver at ``"start"`` and ``"commit"``; it must be quick and must not
        call back into the scheduler. Its exceptions are logged and ignored.
    :raises ConfigError: naming the bad option.

    Use as a context manager, or call :meth:`stop` when the run is over.
    """

    def __init__(
        self,
        dispatch: Callable[[Any, dict, Any], Any] = direct_dispatch,
        context: Optional[SessionLog] = None,
        max_parallel: int = DEFAULT_MAX_PARALLEL,
        call_id: Optional[str] = None,
        executor: Optional[concurrent.futures.Executor] = None,
        timeout: float = DEFAULT_TIMEOUT,
        observer: Optional[Callable[[CallRecord, str], Any]] = None,
    ) -> None:
        require("Scheduler", "dispatch", dispatch, v.DISPATCH)
        require("Scheduler", "context", context, _OPTIONAL_SESSION_LOG)
        require("Scheduler", "max_parallel", max_parallel, v.POSITIVE_INT)
        require("Scheduler", "call_id", call_id, v.OPTIONAL_STR)
        require("Scheduler", "executor", executor, v.EXECUTOR)
        require("Scheduler", "timeout", timeout, v.SECONDS)
        require("Scheduler", "observer", observer, v.OPTIONAL_CALLABLE)
        if context is None:
            context = SessionLog()

        self._dispatch = dispatch
        self._context = context
        self._max_parallel = max_parallel
        self._call_id = call_id
        self._executor = executor
        self._owns_executor = executor is None
        self._timeout = float(timeout)
        self._observer = observer
        self._n = next(_ids)
        self._t0 = time.perf_counter()
        # SimpleQueue: the C queue from `queue`, without Queue's task tracking we never use.
        self._queue: queue.SimpleQueue = queue.SimpleQueue()

        # Shared with stop(), which must release callers even if the driver is
        # stuck inside a user predicate: the only state not owned by the driver.
        self._open_lock = threading.Lock()
        self._open: set[Ticket] = set()
        self._closed = False
        self._wedged = False
        self._stuck = False  # stop() gave up waiting for the driver

        # Driver-owned from here on.
        self._pending: collections.deque[_Entry] = collections.deque()
        self._inflight: dict[int, _Entry] = {}
        self._settled: dict[int, _Entry] = {}
        self._cursor = 0
        self._exclusive: Optional[int] = None
        self._next_seq = 0
        self._events: list[ToolCallEvent] = []
        self._trail: list[list] = []
        self._still_running = 0

        self._driver = threading.Thread(target=self._drive_loop, name=f"nous-sched-driver-{self._n}", daemon=True)
        self._driver.start()

    # -- public API ------------------------------------------------------

    snapshot = staticmethod(snapshot)
    concurrency_mode = staticmethod(concurrency_mode)

    @property
    def max_parallel(self) -> int:
        return self._max_parallel

    @property
    def call_id(self) -> Optional[str]:
        return self._call_id

    @property
    def epoch(self) -> float:
        """The ``time.perf_counter()`` value that :class:`CallRecord` times count from."""
        return self._t0

    def submit(self, tool: Any, args: Any, run_ctx: Any = None) -> Ticket:
        """Queue one call of ``tool`` with ``args``; returns at once.

        ``args`` must be a mapping; it is snapshotted twice, here, on the
        calling thread (:func:`~nous_sched.snapshot`), and the calling thread's
        ``contextvars`` are captured for the tool. Calls are ordered by the
        order their ``submit`` reached the driver.

        :raises ConfigError: ``args`` is not a mapping, or has no JSON form
            (:class:`~nous_sched.SnapshotError`, naming the path).

        After :meth:`stop` the ticket is already released with
        ``"code run is over; scheduler is gone"``.
        """
        require("Scheduler.submit", "tool", tool, _NAMED)
        require("Scheduler.submit", "args", args, v.MAPPING)
        name = tool.name
        dispatched = snapshot(args)
        logged = snapshot(args)
        ticket = Ticket(name)
        with self._open_lock:
            if self._closed or self._wedged:
                message = NO_ANSWER.format(s=self._timeout) if self._wedged and not self._closed else GONE
                _release(ticket, Outcome.failure(name, message))
                return ticket
            self._open.add(ticket)
        self._queue.put((_SUBMIT, ticket, tool, dispatched, logged, run_ctx, contextvars.copy_context()))
        return ticket

    def wait(self, ticket: Ticket, timeout: Optional[float] = None) -> Outcome:
        """Block until ``ticket``'s call commits; return its :class:`Outcome`.

        Never raises for a failed call. Waits at most ``timeout`` seconds (the
        scheduler's own ``timeout`` by default); then the outcome is an error
        ``"timed out waiting for the sub-call to commit"``, or, if the driver
        never even accepted the call, ``"the scheduler did not answer ..."``.
        After such a silence lasting the scheduler's whole ``timeout``, later
        submits fail the same way at once, until the driver answers again.
        """
        require("Scheduler.wait", "ticket", ticket, _TICKET)
        require("Scheduler.wait", "timeout", timeout, v.WAIT_SECONDS)
        limit = self._timeout if timeout is None else timeout
        try:
            return ticket._future.result(limit)
        except concurrent.futures.TimeoutError:
            if ticket.seq is None and not ticket.done():
                # Only a full-timeout silence condemns the lane; a short poll does not.
                if limit >= self._timeout:
                    self._wedged = True
                return Outcome.failure(ticket.tool, NO_ANSWER.format(s=limit))
            return Outcome.failure(ticket.tool, AWAIT_TIMEOUT)

    def call(self, tool: Any, args: Any, run_ctx: Any = None) -> Outcome:
        """``wait(submit(tool, args, run_ctx))``."""
        return self.wait(self.submit(tool, args, run_ctx))

    def dispatch_fun(self) -> Callable[[Any, Any, Any], Outcome]:
        """A ``(tool, args, run_ctx) -> Outcome`` callable routing through this lane."""
        return self.call

    def context(self) -> SessionLog:
        """The session log that receives this lane's ``tool_call`` events."""
        return self._context

    def logged_events(self) -> list[ToolCallEvent]:
        """Every ``tool_call`` event so far, in submission order.

        After :meth:`stop` this is the complete, final list.
        """
        return self._read(lambda: list(self._events))

    def trail(self) -> list[CallRecord]:
        """The timeline of every started call, in submission order."""
        return self._read(lambda: [CallRecord(*r) for r in self._trail])

    def lane_state(self) -> LaneState:
        """A consistent view of pending, in-flight and committed calls."""
        return self._read(self._state)

    def stop(self, timeout: Optional[float] = None) -> None:
        """End the lane. Idempotent; returns within ``timeout`` seconds.

        ``timeout`` bounds the wait for the driver to wind down: a healthy one
        answers in microseconds, so the default is the smaller of 2 s and the
        scheduler's own timeout; a driver stuck in a predicate is left to exit
        when the predicate returns.

        Queued calls are released with ``"code run is over; tool call
        abandoned"`` and never start; running ones get the same error (their
        threads finish on their own: Python cannot kill a thread); calls that
        had finished but not yet committed get their real outcome, in order.
        Callers blocked in :meth:`wait` return at once. A private executor is
        shut down; a caller's executor is left alone.
        """
        require("Scheduler.stop", "timeout", timeout, v.WAIT_SECONDS)
        limit = min(self._timeout, _STOP_JOIN) if timeout is None else timeout
        with self._open_lock:
            first = not self._closed
            self._closed = True
        if first:
            self._queue.put((_STOP,))
        if threading.current_thread() is self._driver:
            return  # an observer stopping its own lane: the driver exits after this callback
        self._driver.join(limit)
        if self._driver.is_alive():
            self._stuck = True
            log.warning(
                "%s did not stop within %.3gs (a tool's concurrency_safe predicate may be stuck); "
                "its callers are released and the thread will exit when the predicate returns",
                self._driver.name,
                limit,
            )
        self._release_open(ABANDONED)
        if first and self._owns_executor and self._executor is not None:
            # Joining workers is only safe when none is stuck in a tool.
            self._executor.shutdown(wait=self._still_running == 0 and not self._driver.is_alive(), cancel_futures=True)

    def __enter__(self) -> "Scheduler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self._closed else "running"
        return f"<Scheduler {self._driver.name} {state} max_parallel={self._max_parallel}>"

    def _release_open(self, message: str) -> None:
        """Release every ticket not yet delivered with ``message`` (any thread)."""
        with self._open_lock:
            leftovers, self._open = list(self._open), set()
        for ticket in leftovers:
            _release(ticket, Outcome.failure(ticket.tool, message))

    # -- reading driver state from other threads --------------------------

    def _read(self, fn: Callable[[], Any]) -> Any:
        if not self._driver.is_alive() or self._stuck:
            # Exited: the state is final. Stuck in a predicate after stop(): it
            # writes nothing more until the predicate returns, so read it as is.
            return fn()
        reply: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((_QUERY, fn, reply))
        try:
            return reply.result(self._timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"{self._driver.name} did not answer within {self._timeout:g}s") from None
        except concurrent.futures.CancelledError:
            return fn()  # it stopped before answering: the state is final now

    # -- the driver ---------------------------------------------------------

    def _drive_loop(self) -> None:
        get = self._queue.get
        get_nowait = self._queue.get_nowait
        try:
            while True:
                msg = get()
                # Take everything already queued before driving, so a burst of
                # completions commits in one pass.
                while True:
                    if msg[0] == _STOP:
                        self._terminate()
                        return
                    self._handle(msg)
                    try:
                        msg = get_nowait()
                    except queue.Empty:
                        break
                self._drive()
        except BaseException:
            log.critical("%s crashed; releasing every caller", self._driver.name, exc_info=True)
            with self._open_lock:
                self._closed = True
            self._terminate()
            self._release_open(GONE)
            raise
        finally:
            self._drain_after_stop()  # submits and queries that raced stop() into the queue

    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == _DONE:
            entry = self._inflight.pop(msg[1])
            entry.outcome, finished = self._collect(entry, msg[2])
            entry.record[4] = finished
            self._settled[entry.seq] = entry
        elif kind == _SUBMIT:
            _, ticket, tool, dispatched, logged, run_ctx, ctx = msg
            entry = _Entry(self._next_seq, ticket, tool, dispatched, logged, run_ctx, ctx)
            self._next_seq += 1
            # Classification runs here, on the dispatched snapshot, in submission order.
            entry.mode = ctx.run(concurrency_mode, tool, dispatched)
            ticket.seq = entry.seq
            if self._wedged:
                self._wedged = False  # it answered after all
            self._pending.append(entry)
        elif kind == _QUERY:
            _, fn, reply = msg
            try:
                reply.set_result(fn())
            except BaseException as exc:  # a query must never take the driver down
                reply.set_exception(exc)

    def _drive(self) -> None:
        pending, settled = self._pending, self._settled
        while True:
            if self._cursor in settled:
                self._commit(settled.pop(self._cursor))
            elif pending and self._startable(pending[0]):
                self._start(pending.popleft())
            else:
                return

    def _startable(self, head: _Entry) -> bool:
        if self._exclusive is not None:
            return False
        if head.mode == EXCLUSIVE:
            return not self._inflight and self._cursor == head.seq
        return len(self._inflight) < self._max_parallel

    def _start(self, entry: _Entry) -> None:
        seq = entry.seq
        if entry.mode == EXCLUSIVE:
            self._exclusive = seq
        event = ToolCallEvent(
            id=f"{self._call_id}:code:{seq}" if self._call_id is not None else f"code:{seq}",
            name=entry.tool.name,
            arguments=entry.logged,
            mode=entry.mode,
            seq=seq,
        )
        self._events.append(event)
        self._context.append(event.as_event())
        entry.record = [seq, entry.tool.name, entry.mode, time.perf_counter() - self._t0, None, None, None]
        self._trail.append(entry.record)
        self._inflight[seq] = entry
        self._notify(entry, "start")
        info = CallInfo(event.id, entry.tool.name, seq, entry.mode, entry.run_ctx)
        try:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    self._max_parallel, thread_name_prefix=f"nous-sched-tool-{self._n}"
                )
            future = self._executor.submit(
                _InContext(entry.ctx), _run_call, self._dispatch, entry.tool, entry.args, entry.run_ctx, info, self._t0
            )
        except Exception:
            log.error("code-mode sub-call %s could not be handed to the executor", event.id, exc_info=True)
            future = concurrent.futures.Future()
            future.set_exception(RuntimeError("executor refused the call"))
        entry.future = future
        put = self._queue.put
        future.add_done_callback(lambda f, seq=seq: put((_DONE, seq, f)))

    def _collect(self, entry: _Entry, future: concurrent.futures.Future) -> tuple[Outcome, float]:
        # One look at the settled future (each accessor takes its lock).
        try:
            return future.result(0)
        except BaseException as exc:  # CancelledError, or whatever the executor raised
            problem = None if future.cancelled() else exc
        log.warning("code-mode sub-call %s (tool %r) did not complete: %r", entry.seq, entry.tool.name, problem)
        return Outcome.failure(entry.tool.name, DID_NOT_COMPLETE), time.perf_counter() - self._t0

    def _commit(self, entry: _Entry) -> None:
        seq = entry.seq
        self._cursor = seq + 1
        if self._exclusive == seq:
            self._exclusive = None
        entry.record[5] = time.perf_counter() - self._t0
        entry.record[6] = entry.outcome.ok
        self._deliver(entry, entry.outcome)
        self._notify(entry, "commit")

    def _deliver(self, entry: _Entry, outcome: Outcome) -> None:
        ticket = entry.ticket
        with self._open_lock:
            self._open.discard(ticket)
        _release(ticket, outcome)

    def _notify(self, entry: _Entry, phase: str) -> None:
        if self._observer is None:
            return
        try:
            self._observer(CallRecord(*entry.record), phase)
        except Exception:
            log.warning("scheduler observer raised; ignoring it", exc_info=True)

    def _state(self) -> LaneState:
        return LaneState(
            pending=tuple(e.seq for e in self._pending),
            inflight=tuple(sorted(self._inflight)),
            settled=tuple(sorted(self._settled)),
            cursor=self._cursor,
            exclusive=self._exclusive,
            submitted=self._next_seq,
            stopped=self._closed,
        )

    def _terminate(self) -> None:
        # Same order as the original: queued calls, then running ones, then the
        # finished-but-uncommitted ones with their real outcome, by seq.
        while self._pending:
            entry = self._pending.popleft()
            self._deliver(entry, Outcome.failure(entry.tool.name, ABANDONED))
        for seq in sorted(self._inflight):
            entry = self._inflight.pop(seq)
            if entry.future is not None and not entry.future.cancel():
                self._still_running += 1
            self._deliver(entry, Outcome.failure(entry.tool.name, ABANDONED))
        for seq in sorted(self._settled):
            self._commit(self._settled.pop(seq))  # every settled seq is past the cursor
        self._exclusive = None

    def _drain_after_stop(self) -> None:
        while True:
            try:
                msg = self._queue.get_nowait()
            except queue.Empty:
                return
            if msg[0] == _SUBMIT:
                _release(msg[1], Outcome.failure(msg[1].tool, GONE))
            elif msg[0] == _QUERY:
                msg[2].cancel()


class _InContext:
    """What the executor is handed in place of ``ctx.run``: ``fn(*args)`` inside ``ctx``.

    Unlike ``ctx.run`` it pickles, for executors that serialize their tasks
    (Dask, even with ``processes=False``; process pools). It pickles *without*
    the context: a ``contextvars.Context`` cannot be pickled, and its values
    would mean nothing in another process. There, tools see the worker's own
    context; ``current_call`` is still set, by ``_run_call``.
    """

    __slots__ = ("ctx",)

    def __init__(self, ctx: Optional[contextvars.Context]) -> None:
        self.ctx = ctx

    def __call__(self, fn: Callable, /, *args: Any) -> Any:
        if self.ctx is None:
            return fn(*args)
        return self.ctx.run(fn, *args)

    def __reduce__(self) -> tuple:
        return (_InContext, (None,))

    def __repr__(self) -> str:
        return "nous_sched.call"  # Dask names tasks after it: one stable prefix, not an address


def _run_call(
    dispatch: Callable, tool: Any, args: dict, run_ctx: Any, info: CallInfo, t0: float
) -> tuple[Outcome, float]:
    """Run one call on an executor thread; always returns an Outcome, never raises."""
    name = tool.name
    token = current_call.set(info)
    try:
        value = dispatch(tool, args, run_ctx)
        if isinstance(value, Outcome) and not value.ok:
            message = value.error.message if value.error is not None else FAILED
            result = Outcome.failure(name, message)
        else:
            if isinstance(value, Outcome):
                value = value.value
            try:
                result = Outcome.success(snapshot(value))
            except Exception as exc:
                log.error("code-mode sub-call %s (tool %r) returned a value that is not JSON: %s", info.id, name, exc)
                result = Outcome.failure(name, f"tool returned a value that is not JSON: {exc}")
    except ToolError as exc:
        result = Outcome.failure(name, _safe_str(exc))
    except Exception as exc:
        log.warning("code-mode sub-call %s (tool %r) raised", info.id, name, exc_info=True)
        result = Outcome.failure(name, _safe_str(exc))
    finally:
        current_call.reset(token)
    return result, time.perf_counter() - t0


def _safe_str(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        return FAILED
    return text if text else FAILED

"""Running one call on a tool thread: the task the driver hands over.

:func:`run_reporting` runs :func:`run_call` in the call's own ``contextvars``
copy and reports a :class:`~nous_sched.scheduler._calls.Done` to the driver's
queue; :class:`InContext` is what a caller's executor is handed instead of
``ctx.run`` (it pickles without the context, so a process or Dask executor
can take it).
"""

from __future__ import annotations

import contextvars
import logging
import time
from typing import Any, Callable, Optional

from ..gate._admitted import run_admitted
from ..gate.dispatch import CallInfo, Dispatch, RunContext
from ..outcome import Outcome
from ..tooling import Tool
from ._calls import ABANDONED, Done, Ran

__all__ = ["InContext", "run_call", "run_reporting"]


log = logging.getLogger("nous_sched")


class InContext:
    """What the executor is handed in place of ``ctx.run``: ``fn(*args)`` inside ``ctx``.

    Unlike ``ctx.run`` it pickles, for executors that serialize their tasks
    (Dask, even with ``processes=False``; process pools). It pickles *without*
    the context: a ``contextvars.Context`` cannot be pickled, and its values
    would mean nothing in another process. There, tools see a copy of the
    worker thread's own context, made for the call (what it sets is gone
    after it); ``current_call`` is still set, by ``run_call``.
    """

    __slots__ = ("ctx",)

    def __init__(self, ctx: Optional[contextvars.Context]) -> None:
        self.ctx = ctx

    def __call__(self, fn: Callable[..., Any], /, *args: Any) -> Any:
        # Unpickled (no context): a copy of the worker thread's own, so what the
        # call sets is gone after it, as with a submitter's (see run_call).
        ctx = self.ctx if self.ctx is not None else contextvars.copy_context()
        return ctx.run(fn, *args)

    def __reduce__(self) -> tuple[Any, ...]:
        return (InContext, (None,))

    def __repr__(self) -> str:
        return "nous_sched.call"  # Dask names tasks after it: one stable prefix, not an address


def run_reporting(
    put: Callable[[Any], None],
    seq: int,
    ctx: contextvars.Context,
    dispatch: Dispatch,
    tool: Tool,
    args: dict[str, Any],
    run_ctx: Optional[RunContext],
    info: CallInfo,
    t0: float,
    begin: Optional[Callable[[], bool | str]],
) -> "Done":
    """On a tool thread of the scheduler's own pool: run call ``seq`` in
    ``ctx`` (:func:`run_call`), then tell the driver, whatever happened."""
    # run_call's arguments named, not gathered (*args): no tuple made twice per call.
    try:
        result = ctx.run(run_call, dispatch, tool, args, run_ctx, info, t0, begin)
    except BaseException as exc:  # escaped run_call's `except Exception`: the task died
        put(Done(seq, None, exc))
        raise
    done = Done(seq, result)
    done.put = put
    return done  # its thread puts it once it has parked: the driver it wakes finds the GIL free sooner


def run_call(
    dispatch: Dispatch,
    tool: Tool,
    args: dict[str, Any],
    run_ctx: Optional[RunContext],
    info: CallInfo,
    t0: float,
    begin: Optional[Callable[[], bool | str]] = None,
) -> Ran:
    """Run one call on an executor thread; always returns an Outcome, never raises.

    ``begin()`` is asked first: False means the scheduler stopped before this
    thread took the call up (a saturated shared executor), and it never starts;
    a str is why its throttles refused it. A ``begin`` with an ``end()`` is
    told when the tool has returned (its throttles' places go back).
    """
    if begin is not None:
        verdict = begin()
        if verdict is not True:
            if isinstance(verdict, str):  # its throttles refused it (the deadline came first)
                return Outcome.failure(tool.name, verdict), time.perf_counter() - t0, "throttled", 0
            return Outcome.failure(tool.name, ABANDONED), time.perf_counter() - t0, "abandoned", 0
    try:
        # Runs in the call's own context, a copy made for it alone (the submitter's,
        # or the executor thread's: InContext), which no code runs in after it:
        # what run_admitted sets there needs no reset (two fewer context copies per call).
        outcome, kind, size, raised = run_admitted(
            dispatch, tool, args, run_ctx, info, getattr(begin, "record_approval", None)
        )
        if raised is not None:
            log.warning("code-mode sub-call %s (tool %r) raised", info.id, tool.name, exc_info=raised)
        return outcome, time.perf_counter() - t0, kind, size
    finally:
        # A Begin with no throttles holds no places (its end() does nothing): not asked.
        if begin is not None and getattr(begin, "throttles", True):
            end = getattr(begin, "end", None)
            if end is not None:
                end()

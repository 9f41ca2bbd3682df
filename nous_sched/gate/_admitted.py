"""Private: the one way to run a call the gate admitted (:mod:`nous_sched.gate`).

The scheduler runs each of a program's sub-calls with :func:`run_admitted`
(on a tool thread) and :func:`~nous_sched.call_tool` runs a model's direct
call with it, so the two agree on what a tool's behaviour becomes
(tests/test_admitted.py runs each behaviour both ways):

* a value is the call's result: its snapshot and JSON text
  (:func:`~nous_sched.crossing.snapshot_text`), and the text's UTF-8 size;
  in a run with a blob store (``RunContext.blobs``), a result over its limit
  has its big parts held there and handles in their place (``nous_sched.blobs``);
* an :class:`~nous_sched.Outcome` is unwrapped: a failed one fails the call
  with its message (error kind ``"tool_error"``);
* a value that is not JSON fails the call, ``"tool returned a value that is
  not JSON: ..."`` (``"invalid_result"``);
* a :class:`~nous_sched.ToolError` fails the call with its message, and its
  ``kind`` when it has one (the approval step's refusals:
  ``"denied"``, ``"run_over"``); else ``"tool_error"``; so does a
  :class:`~nous_sched.RunCodeError` (the ``run_code`` tool called without
  a program);
* any other exception fails the call as well, with its message
  (``"tool_error"``), and is handed back as the fourth member: the scheduler
  logs it (the program reads the failure), ``call_tool`` raises it to its
  host once the call is audited.

Who decides whether the call needs approval is :func:`~nous_sched.gate.dispatch.needs_approval`,
asked by the dispatch (:func:`~nous_sched.gate.dispatch.approve`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..crossing import snapshot_text
from ..errors import RunCodeError, ToolError
from ..outcome import Outcome
from .dispatch import CallInfo, Dispatch, RunContext, approval_sink, current_call

if TYPE_CHECKING:  # as in dispatch: only the name, for the types
    from ..tooling import Tool

log = logging.getLogger("nous_sched")

#: The message of a failure that says nothing (a failed Outcome without an
#: error, an exception whose text is empty or cannot be made).
FAILED = "tool call failed"
TOOL_ERROR = "tool_error"
INVALID_RESULT = "invalid_result"

#: What running an admitted call gives: its outcome, its error kind (None when
#: ok, see events.OUTCOME_ERROR_KINDS), its result's JSON size in UTF-8 (0 for
#: a failure), and the exception other than a ToolError it raised, if any.
Ran = tuple[Outcome, Optional[str], int, Optional[Exception]]


def run_admitted(
    dispatch: Dispatch,
    tool: Tool,
    args: dict[str, Any],
    run_ctx: Optional[RunContext],
    info: CallInfo,
    sink: Optional[Callable[..., None]],
) -> Ran:
    """Run the admitted call ``dispatch(tool, args, run_ctx)``; never raises an :class:`Exception`.

    It sets :data:`~nous_sched.gate.dispatch.current_call` to ``info`` and
    :data:`~nous_sched.gate.dispatch.approval_sink` to ``sink`` in the current
    context and leaves them set: call it in a context made for this call
    alone (``contextvars.copy_context().run``), which no code runs in after it.
    """
    current_call.set(info)
    approval_sink.set(sink)
    name = tool.name
    try:
        value = dispatch(tool, args, run_ctx)
    except (ToolError, RunCodeError) as exc:
        return Outcome.failure(name, message_of(exc)), getattr(exc, "kind", TOOL_ERROR), 0, None
    except Exception as exc:
        return Outcome.failure(name, message_of(exc)), TOOL_ERROR, 0, exc
    if isinstance(value, Outcome):
        if not value.ok:
            message = value.error.message if value.error is not None else FAILED
            return Outcome.failure(name, message), TOOL_ERROR, 0, None
        value = value.value
    try:
        # The copy, the program's text and the audit's size, in one go (the text is not made again).
        snapped, text, size = snapshot_text(value)
    except Exception as exc:
        log.error("sub-call %s (tool %r) returned a value that is not JSON: %s", info.id, name, exc)
        return Outcome.failure(name, f"tool returned a value that is not JSON: {exc}"), INVALID_RESULT, 0, None
    blobs = getattr(run_ctx, "blobs", None)  # (a caller's own run_ctx need not have one)
    if blobs is not None and len(text) > blobs.limit:  # too big to cross whole: its big parts stay here
        return Outcome.held(*blobs.hold(snapped, text)), None, size, None
    return Outcome.crossed(snapped, text), None, size, None


def message_of(exc: BaseException) -> str:
    """``str(exc)``, or :data:`FAILED` when that is empty or raises."""
    try:
        text = str(exc)
    except Exception:
        return FAILED
    return text if text else FAILED

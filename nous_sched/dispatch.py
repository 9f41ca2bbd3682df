"""The dispatch seam: how one sub-call reaches its tool.

The scheduler calls ``dispatch(tool, args, run_ctx)`` on an executor thread.
:func:`direct_dispatch`, the default, is the last step of the gate
(:mod:`nous_sched.gate`): it refuses a call whose run is over, applies
per-call approval (:func:`approve`), and then calls ``tool.function(args)``. Replace it to add hooks, retries or remote
execution; it keeps the same contract: return a JSON-shaped value (or an
:class:`~nous_sched.Outcome`), or raise to fail the call.
"""

from __future__ import annotations

import contextvars
import copy
import time
from typing import Any, Callable, Optional

import attrs

from .errors import ToolError
from .outcome import quote_name

__all__ = ["RunContext", "ApprovalRequest", "CallInfo", "direct_dispatch", "current_call", "approve", "RUN_OVER"]


@attrs.frozen
class ApprovalRequest:
    """What an approval handler is asked about one call.

    ``tool`` and ``arguments`` are the real name and arguments: ``arguments``
    is the handler's own copy, so changing it changes neither what runs nor
    the audit. ``description`` is the *run's* description, the sentence the
    model wrote for this prompt and the audit log (``""`` when the caller
    gave none); ``call_id`` is the call's audit event id; ``tool_description``
    is the tool's own description. A durable run's pending request also has
    ``seq``, ``site`` and ``committed`` (:mod:`nous_sched.durable`).
    """

    tool: str
    arguments: Any
    description: str = ""
    call_id: str = ""
    tool_description: str = ""
    #: Durable runs only (:mod:`nous_sched.durable`): the call's number in the
    #: program, its call site ``"line:col"``, and the calls committed before it.
    seq: Optional[int] = None
    site: str = ""
    committed: tuple[Any, ...] = ()


@attrs.frozen
class RunContext:
    """Per-run state handed to every dispatch.

    ``approval_handler(request) -> bool`` is asked once per call of a tool that
    requires approval, on the executor thread running that call; ``True``
    approves, anything else rejects. With no handler such a call is refused
    (default deny). ``deps`` is yours: tools reach it through
    :data:`current_call`.

    ``deadline`` is the ``time.monotonic()`` instant at which the run is over
    (``None`` outside :func:`~nous_sched.run_code`). No tool starts after it,
    and no approval is acted on after it; nothing kills a tool still running
    then, so a tool that waits on something slow should bound its wait by
    it, as the MCP tools do. ``description`` is the run's description, which
    every :class:`ApprovalRequest` carries.
    """

    approval_handler: Optional[Callable[[ApprovalRequest], Any]] = None
    deps: Any = None
    require_approval: frozenset[str] = frozenset()
    deadline: Optional[float] = None
    description: str = ""


@attrs.frozen
class CallInfo:
    """Which sub-call the current thread is running (see :data:`current_call`)."""

    id: str
    tool: str
    seq: int
    mode: str
    run_ctx: Any = None


#: Set inside every sub-call: the call's :class:`CallInfo`. ``None`` outside.
current_call: contextvars.ContextVar[Optional[CallInfo]] = contextvars.ContextVar(
    "nous_sched.current_call", default=None
)


def _approval_required(tool: Any, run_ctx: Any) -> bool:
    if getattr(tool, "requires_approval", False):
        return True
    return getattr(tool, "name", None) in getattr(run_ctx, "require_approval", ())


#: What a call that would start after its run's deadline fails with.
RUN_OVER = "code run is over; the call was not started"


def run_over(run_ctx: Any) -> bool:
    """True once ``run_ctx``'s deadline has passed (never without one)."""
    deadline = getattr(run_ctx, "deadline", None)
    return deadline is not None and time.monotonic() >= deadline


def approve(tool: Any, args: dict[str, Any], run_ctx: Any) -> None:
    """The approval step of the gate: return if the call may run, else raise :class:`ToolError`.

    Refused when the run is over (before asking, and again after the
    handler answers: an approval that comes too late starts nothing), when
    the tool needs approval and there is no handler, and when the handler
    returns anything but ``True`` (or raises). The handler gets its own copy
    of the arguments (:class:`ApprovalRequest`).
    """
    if run_over(run_ctx):
        raise ToolError(RUN_OVER, tool.name)
    if not _approval_required(tool, run_ctx):
        return
    handler = getattr(run_ctx, "approval_handler", None)
    if handler is None:
        raise ToolError(
            f"tool {quote_name(tool.name)} requires approval and no approval handler is configured", tool.name
        )
    info = current_call.get()
    request = ApprovalRequest(
        tool.name,
        copy.deepcopy(args),
        description=getattr(run_ctx, "description", "") or "",
        call_id=info.id if info is not None else "",
        tool_description=getattr(tool, "description", ""),
    )
    if handler(request) is not True:
        raise ToolError(f"tool {quote_name(tool.name)} was rejected by the approval handler", tool.name)
    if run_over(run_ctx):
        raise ToolError(RUN_OVER + " (its approval came after the deadline)", tool.name)


def direct_dispatch(tool: Any, args: dict[str, Any], run_ctx: Any) -> Any:
    """The gate's last step: :func:`approve`, then run ``tool.function(args)``.

    Raises :class:`ToolError` when the run is over, or approval is required
    and there is no handler, or the handler does not return ``True``.
    """
    approve(tool, args, run_ctx)
    return tool.function(args)

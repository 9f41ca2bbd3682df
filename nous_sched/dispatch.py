"""The dispatch seam: how one sub-call reaches its tool.

The scheduler calls ``dispatch(tool, args, run_ctx)`` on an executor thread.
:func:`direct_dispatch`, the default, applies per-sub-call approval and then
calls ``tool.function(args)``. Replace it to add hooks, retries or remote
execution; it keeps the same contract: return a JSON-shaped value (or an
:class:`~nous_sched.Outcome`), or raise to fail the call.
"""

from __future__ import annotations

import contextvars
from typing import Any, Callable, Optional

import attrs

from .errors import ToolError
from .outcome import quote_name

__all__ = ["RunContext", "ApprovalRequest", "CallInfo", "direct_dispatch", "current_call"]


@attrs.frozen
class ApprovalRequest:
    """What an approval handler is asked: the real tool name and arguments."""

    tool: str
    arguments: Any
    description: str = ""


@attrs.frozen
class RunContext:
    """Per-run state handed to every dispatch.

    ``approval_handler(request) -> bool`` is asked once per call of a tool that
    requires approval, on the executor thread running that call; ``True``
    approves, anything else rejects. With no handler such a call is refused
    (default deny). ``deps`` is yours: tools reach it through
    :data:`current_call`.

    ``deadline`` is the ``time.monotonic()`` instant at which the run is over
    (``None`` outside :func:`~nous_sched.run_code`). Nothing kills a tool
    still running then, so a tool that waits on something slow should bound
    its wait by it, as the MCP tools do.
    """

    approval_handler: Optional[Callable[[ApprovalRequest], Any]] = None
    deps: Any = None
    require_approval: frozenset[str] = frozenset()
    deadline: Optional[float] = None


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


def direct_dispatch(tool: Any, args: dict[str, Any], run_ctx: Any) -> Any:
    """Approve if needed, then run ``tool.function(args)``.

    Raises :class:`ToolError` when approval is required and there is no
    handler, or the handler does not return ``True``.
    """
    if _approval_required(tool, run_ctx):
        handler = getattr(run_ctx, "approval_handler", None)
        if handler is None:
            raise ToolError(
                f"tool {quote_name(tool.name)} requires approval and no approval handler is configured", tool.name
            )
        if handler(ApprovalRequest(tool.name, args, getattr(tool, "description", ""))) is not True:
            raise ToolError(f"tool {quote_name(tool.name)} was rejected by the approval handler", tool.name)
    return tool.function(args)

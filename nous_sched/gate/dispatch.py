"""The dispatch seam: how one sub-call reaches its tool.

The scheduler calls ``dispatch(tool, args, run_ctx)`` on an executor thread.
:func:`direct_dispatch`, the default, is the last step of the gate
(:mod:`nous_sched.gate`): it refuses a call whose run is over, applies
per-call approval (``approve``), and then calls ``tool.function(args)``. Replace it to add hooks, retries or remote
execution; it keeps the same contract: return a JSON-shaped value (or an
:class:`~nous_sched.Outcome`), or raise to fail the call.
"""

from __future__ import annotations

import contextvars
import copy
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Collection, Optional

import attrs

from .._slots import record
from ..errors import ToolError
from ..outcome import quote_name
from ..tooling import BOUND_MARKER, redact, secrets_of, with_bound
from . import approval_text
from .grants import Grant, Grants, Held, answer_of

if TYPE_CHECKING:  # tool.py is above this module: only its name, for the types
    from ..tooling import Tool

log = logging.getLogger("nous_sched")

__all__ = [
    "RunContext",
    "ApprovalRequest",
    "CallInfo",
    "Dispatch",
    "direct_dispatch",
    "current_call",
    "approve",
    "live_event",
    "RUN_OVER",
    "Refused",
    "approval_sink",
    "needs_approval",
]


@attrs.frozen
class ApprovalRequest:
    """What an approval handler is asked about one call.

    ``tool`` and ``arguments`` are the real name and arguments: ``arguments``
    is the handler's own copy, so changing it changes neither what runs nor
    the audit. ``description`` is the *run's* description, the sentence the
    model wrote for this prompt and the audit log (``""`` when the caller
    gave none); ``call_id`` is the call's audit event id; ``tool_description``
    is the tool's own description. A durable run's pending request also has
    ``seq``, ``site`` and ``committed`` (``nous_sched.durable``). ``coming``
    says, in words, what else the program is about to do with this tool (its
    static summary: how many more calls, in a loop or not), ``""`` when
    unknown; the question shows it, escaped. The answer may be ``True``,
    ``False`` or a :class:`~nous_sched.Grant` (this call and later ones:
    ``nous_sched.gate.grants``).
    """

    tool: str
    arguments: Any
    description: str = ""
    call_id: str = ""
    tool_description: str = ""
    #: Durable runs only (``nous_sched.durable``): the call's number in the
    #: program, its call site ``"line:col"``, and the calls committed before it.
    seq: Optional[int] = None
    site: str = ""
    committed: tuple[Any, ...] = ()
    #: The run's program reviewed (``run_code(review=...)``): its static summary
    #: (a :class:`~nous_sched.ProgramSummary`), on every request of such a run;
    #: and ``code``, the whole program, on the review's own question (``tool`` "").
    program: Any = None
    code: Optional[str] = None
    coming: str = ""

    def question(self) -> str:
        """This call as a person should read it before approving it: the same text
        ``serve-mcp`` asks with (``nous_sched.gate.approval_text.question``: every
        argument key shown, each value clipped on its own with its size stated,
        the description labelled as the program's words, nothing left that can
        act on a terminal)."""
        return approval_text.question(self)


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
    it, as the MCP tools do (what such a tool returns or raises once the
    deadline has passed never reaches the program: the run is a ``timeout``).
    ``description`` is the run's description, which
    every :class:`ApprovalRequest` carries. ``live`` is the run's event stream
    (``nous_sched.live.EventStream``) when it was started with
    :func:`~nous_sched.start_run`, else ``None``: see ``live_event``.
    ``grants`` holds the grants the run's approval answers made
    (``nous_sched.gate.grants.Grants``), its own: one per run, gone with it.
    ``coming(tool_name) -> str``, when set, says what the program's static
    summary has coming for that tool: each :class:`ApprovalRequest`'s
    ``coming`` (a ``coming`` that raises gives ``""``).
    ``blobs`` is the run's :class:`~nous_sched.BlobStore` (``None``:
    results cross whole, as for a direct :func:`~nous_sched.call_tool`).
    """

    approval_handler: Optional[Callable[[ApprovalRequest], Any]] = None
    deps: Any = None
    require_approval: frozenset[str] = frozenset()
    deadline: Optional[float] = None
    description: str = ""
    live: Any = None
    #: The run's ``bind`` (``run_code(..., bind=...)``): what each :class:`~nous_sched.Bind` of a tool's
    #: ``bound`` is filled from. Never in a ``repr``.
    bind: Optional[Mapping[str, Any]] = attrs.field(default=None, repr=False)
    #: The program's static summary when the run was reviewed (``run_code(review=...)``):
    #: each approval request carries it (:attr:`ApprovalRequest.program`).
    program: Any = None
    grants: Any = attrs.field(factory=Grants, eq=False, repr=False)  # a Grants
    coming: Optional[Callable[[str], str]] = None
    blobs: Any = None


@record
class CallInfo:
    """Which sub-call the current thread is running (see :data:`current_call`)."""

    id: str
    tool: str
    seq: int
    mode: str
    run_ctx: Optional[RunContext] = None


#: The dispatch seam: ``dispatch(tool, args, run_ctx)`` returns the tool's value
#: (or an :class:`~nous_sched.Outcome`), or raises to fail the call.
Dispatch = Callable[["Tool", dict[str, Any], Optional[RunContext]], Any]

#: Set inside every sub-call: the call's :class:`CallInfo`. ``None`` outside.
current_call: contextvars.ContextVar[Optional[CallInfo]] = contextvars.ContextVar(
    "nous_sched.current_call", default=None
)


def needs_approval(tool: Tool, names: Collection[str] = (), categories: Collection[str] = ()) -> bool:
    """The one approval rule: a call of ``tool`` needs approval when the tool
    says so (its ``requires_approval``), or its name is in ``names``, or its
    ``category`` is in ``categories``.

    A permission policy is applied once, at a run's door (or
    :func:`~nous_sched.call_tool`'s): its ``require_approval`` and
    ``approval_categories`` become the run's
    :attr:`RunContext.require_approval`, the names of the granted tools it
    gates (:func:`nous_sched.gate.policy.approval_names`). Every later question
    (the approval step, ``approve``; a durable run's; the live ``call``
    event's ``approval``) asks this rule with those names.
    """
    if getattr(tool, "requires_approval", False):
        return True
    return getattr(tool, "name", None) in names or getattr(tool, "category", None) in categories


#: What a call that would start after its run's deadline fails with.
RUN_OVER = "code run is over; the call was not started"


def run_over(run_ctx: Optional[RunContext]) -> bool:
    """True once ``run_ctx``'s deadline has passed (never without one)."""
    deadline = getattr(run_ctx, "deadline", None)
    return deadline is not None and time.monotonic() >= deadline


def live_event(run_ctx: Any, kind: str, seq: Optional[int], data: dict[str, Any]) -> None:
    """Tell the people watching the run (its event stream, ``run_ctx.live``) that
    ``kind`` happened; nothing when the run has no stream. The live events'
    own, independent of the audit: ``"approval"`` (asked, then approved or
    rejected: ``approve``). Never raises."""
    live = getattr(run_ctx, "live", None)
    if live is not None:
        live.emit(kind, seq, data)


def _approval_event(
    run_ctx: Any,
    info: Optional[CallInfo],
    tool: str,
    state: str,
    request: Optional[ApprovalRequest] = None,
    grant: str = "",
    granted: Optional[Grant] = None,
) -> None:
    if getattr(run_ctx, "live", None) is None:
        return
    seq = info.seq if info is not None else None
    call_id = info.id if info is not None else ""
    data: dict[str, Any] = {"tool": tool, "call_id": call_id, "state": state}
    if request is not None:  # asked: what the person deciding reads
        data["question"] = request.question()
    if grant:
        data["grant"] = grant
    if granted is not None:
        data["granted"] = granted.as_dict()
    live_event(run_ctx, "approval", seq, data)


class Refused(ToolError):
    """A :class:`ToolError` from the gate's own approval step; ``kind`` names why
    (``"denied"`` or ``"run_over"``), for the call's ``tool_outcome`` audit record."""

    def __init__(self, message: str, tool: str, kind: str) -> None:
        super().__init__(message, tool)
        self.kind = kind


#: Set by the scheduler around each call it runs in this process:
#: ``sink(approved, reason)`` records an approval decision in the run's audit
#: (an ``approval`` event) as it is made; a decision that makes or spends a
#: grant is ``sink(approved, reason, grant=id, granted=Grant or None)``. ``None`` elsewhere (a call run in
#: another process by a serializing executor: its decision is not recorded).
approval_sink: contextvars.ContextVar[Optional[Callable[..., None]]] = contextvars.ContextVar(
    "nous_sched.approval_sink", default=None
)

APPROVED = "approved by the approval handler"
REJECTED = "rejected by the approval handler"
NO_HANDLER = "no approval handler is configured"


def _decided(approved: bool, reason: str, grant: str = "", granted: Optional[Grant] = None) -> None:
    sink = approval_sink.get()
    if sink is not None:
        if grant:  # only then the keywords: a sink of two arguments still records every other decision
            sink(approved, reason, grant=grant, granted=granted)
        else:
            sink(approved, reason)


#: Why a call a grant covered was approved (``{id}``: the grant's).
COVERED = "covered by grant {id} ({what}), made by the answer to call #{seq}"


def _ask(
    handler: Callable[[ApprovalRequest], Any], request: ApprovalRequest, run_ctx: Any, info: Any
) -> tuple[bool, str, Optional[Held]]:
    """The handler's answer, recorded: approved, why not, and the grant it made.
    A handler that raises rejects: the call fails with the exception's message
    (a :class:`ToolError`'s as it is). A :class:`~nous_sched.Grant` approves
    and is held by the run; one whose ``matching`` this call does not meet, or
    an answer of any other type, rejects (fail safe), the reason naming it."""
    try:
        answer = handler(request)
    except Exception as exc:
        _decided(False, f"the approval handler raised {type(exc).__name__}")
        log.warning("the approval handler raised for tool %r", request.tool, exc_info=True)
        raise Refused(str(exc) or f"the approval handler raised {type(exc).__name__}", request.tool, "denied") from exc
    approved, grant, malformed = answer_of(answer)
    why = ""  # what the program reads after "rejected by the approval handler": a grant's own refusal only
    if grant is not None:
        why = grant.refusal(request.arguments) or ""
        approved = not why
    grants = getattr(run_ctx, "grants", None)
    if grant is None or not approved or grants is None:
        _decided(approved, APPROVED if approved else (why or malformed or REJECTED))
        return approved, why, None
    held = grants.add(grant, request.tool, info.seq if info is not None else 0)
    _decided(True, f"{APPROVED}, granting {grant.describe()}", grant=held.id, granted=grant)
    return True, "", held


def _asked(
    handler: Callable[[ApprovalRequest], Any], request: ApprovalRequest, run_ctx: Any, info: Any
) -> tuple[bool, str]:
    """The handler's answer (``True`` or a grant), recorded in the audit and told to
    the run's stream as it is asked and decided. A handler that raises
    rejects: the call fails with the exception's message."""
    _approval_event(run_ctx, info, request.tool, "asked", request)
    approved, why, held = False, "", None
    try:
        approved, why, held = _ask(handler, request, run_ctx, info)
    finally:
        if held is not None:
            _approval_event(run_ctx, info, request.tool, "approved", grant=held.id, granted=held.grant)
        else:
            _approval_event(run_ctx, info, request.tool, "approved" if approved else "rejected")
    return approved, why


def _covered(tool: Tool, args: dict[str, Any], run_ctx: Any, info: Any) -> bool:
    """Spend a grant the run holds on this call, recorded and told; whether one covered it."""
    held = run_ctx.grants.cover(tool.name, args)
    if held is None:
        return False
    reason = COVERED.format(id=held.id, what=held.grant.describe(), seq=held.id[1:])
    _decided(True, reason, grant=held.id)
    _approval_event(run_ctx, info, tool.name, "covered", grant=held.id)
    return True


def approve(tool: Tool, args: dict[str, Any], run_ctx: Optional[RunContext]) -> None:
    """The approval step of the gate: return if the call may run, else raise :class:`ToolError`.

    Refused when the run is over (before asking, and again after the
    handler answers: an approval that comes too late starts nothing), when
    the tool needs approval and there is no handler, and when the handler
    returns anything but ``True`` (or raises). The handler gets its own copy
    of the arguments (:class:`ApprovalRequest`). Each decision on a tool that
    needs approval is recorded in the run's audit as an ``approval`` event
    (:class:`~nous_sched.events.ApprovalEvent`) as it is made.
    """
    deadline = getattr(run_ctx, "deadline", None)  # run_over(run_ctx), written out: it runs before every call
    if deadline is not None and time.monotonic() >= deadline:
        raise Refused(RUN_OVER, tool.name, "run_over")
    if not needs_approval(tool, getattr(run_ctx, "require_approval", ())):
        return
    handler = getattr(run_ctx, "approval_handler", None)
    if handler is None:
        _decided(False, NO_HANDLER)
        raise Refused(
            f"tool {quote_name(tool.name)} requires approval and no approval handler is configured",
            tool.name,
            "denied",
        )
    info = current_call.get()
    hidden = _bound_here.get()
    if hidden:  # asked from inside a tool that holds its bound values: the question shows markers
        args = {k: BOUND_MARKER if k in hidden else value for k, value in args.items()}
    grants = getattr(run_ctx, "grants", None)
    if grants is None:  # a RunContext-like object of the caller's own: every call asks
        _ask_one(tool, args, handler, run_ctx, info)
    else:
        seq = info.seq if info is not None else 0
        with grants.turn(tool.name, seq, getattr(run_ctx, "deadline", None)) as had:
            if not had:
                raise Refused(RUN_OVER, tool.name, "run_over")
            if not _covered(tool, args, run_ctx, info):
                _ask_one(tool, args, handler, run_ctx, info)
    if run_over(run_ctx):
        raise Refused(RUN_OVER + " (its approval came after the deadline)", tool.name, "run_over")


def _ask_one(tool: Tool, args: dict[str, Any], handler: Any, run_ctx: Any, info: Any) -> None:
    request = ApprovalRequest(
        tool.name,
        copy.deepcopy(args),
        description=getattr(run_ctx, "description", "") or "",
        call_id=info.id if info is not None else "",
        tool_description=getattr(tool, "description", ""),
        program=getattr(run_ctx, "program", None),
        coming=coming_for(run_ctx, tool.name),
    )
    approved, why = _asked(handler, request, run_ctx, info)
    if not approved:
        detail = f": {why}" if why else ""
        raise Refused(f"tool {quote_name(tool.name)} was rejected by the approval handler{detail}", tool.name, "denied")


def coming_for(run_ctx: Any, tool: str) -> str:
    """What ``run_ctx.coming`` says is coming for ``tool`` (``""``: nothing known, or it failed)."""
    coming = getattr(run_ctx, "coming", None)
    if coming is None:
        return ""
    try:
        said = coming(tool)
    except Exception:  # what is coming is shown to help; it never decides a call
        log.warning("the run's `coming` raised for tool %r", tool, exc_info=True)
        return ""
    return said if isinstance(said, str) else ""


def direct_dispatch(tool: Tool, args: dict[str, Any], run_ctx: Optional[RunContext]) -> Any:
    """The gate's last step: ``approve``, then run ``tool.function(args)``.

    Raises :class:`ToolError` when the run is over, or approval is required
    and there is no handler, or the handler does not return ``True``.

    A tool with bound arguments (``Tool.bound``) gets them here, after
    approval (which saw ``"[bound]"`` in their place), each :class:`~nous_sched.Bind`
    filled from ``run_ctx.bind``; an exception it raises whose message holds a
    bound string (or its JSON or ``repr`` spelling) is raised again, of the
    same type when it can be made from its message (else as a
    :class:`ToolError`), with ``"[bound]"`` in its place (``nous_sched.tooling._bound``).
    A dispatch of your own that calls ``tool.function`` itself should call this
    one instead, or the tool gets the markers.
    """
    approve(tool, args, run_ctx)
    if not getattr(tool, "bound", None):
        return tool.function(args)
    bound_args = with_bound(tool, args, getattr(run_ctx, "bind", None))
    # A tool that asks for approval itself (a framework switch's nested tool) asks with the markers.
    hidden = _bound_here.set(frozenset(tool.bound))
    try:
        return tool.function(bound_args)
    except Exception as exc:
        raise _redacted(exc, bound_args, tool) from None
    finally:
        _bound_here.reset(hidden)


#: The bound argument names of the tool running in this context: :func:`approve` shows them as markers.
_bound_here: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "nous_sched.bound_here", default=frozenset()
)


def _redacted(exc: Exception, bound_args: dict[str, Any], tool: Any) -> Exception:
    """``exc``, or a :class:`ToolError` saying it without the bound values when its message holds one."""
    try:
        text = str(exc)
    except Exception:
        return exc
    spellings = secrets_of({name: bound_args[name] for name in tool.bound})
    said = redact(text, spellings)
    if said == text:
        return exc
    if not isinstance(exc, ToolError):
        try:  # the same kind of exception when it can be made from the message alone
            again = type(exc)(said)
            if str(again) == said:
                return again
        except Exception:
            pass
    return ToolError(said, tool=tool.name)

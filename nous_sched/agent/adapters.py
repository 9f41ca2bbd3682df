"""Hand tools (``run_code`` above all) to real agent loops.

Each function renders one :class:`~nous_sched.Tool` in a provider's tool
format; :func:`call_tool` runs a model's tool call and returns the text to send
back, so a loop needs no knowledge of nous_sched beyond these two.
"""

from __future__ import annotations

import contextvars
import copy
import json
import secrets
from collections.abc import Mapping
from functools import partial
from typing import Any, Callable, Optional

from .. import _tracing
from .. import _validators as v
from .._options import OPTIONAL_LIMITS, OPTIONAL_POLICY, OPTIONAL_SESSION_LOG
from .._run.runner import check_binds
from .._text import machine_text
from ..errors import ConfigError
from ..events import ApprovalEvent, SessionLog, ToolCallEvent, ToolOutcomeEvent
from ..gate import Admitted, Gate
from ..gate._admitted import run_admitted
from ..gate.dispatch import ApprovalRequest, CallInfo, RunContext, direct_dispatch
from ..gate.policy import PermissionPolicy, approval_names, partition
from ..limits import Limits
from ..outcome import clamp
from ..tooling import EXCLUSIVE, Tool, caller_parameters
from ._run_code_tool import WithContextUpdate

__all__ = ["openai_tool", "anthropic_tool", "call_tool", "OPENAI_APIS"]


#: The OpenAI APIs :func:`openai_tool` writes for.
OPENAI_APIS = ("chat", "responses")
_API = v.one_of(OPENAI_APIS)
_TOOL = v.instance_of(Tool, "a nous_sched.Tool")
_OPTIONAL_LIMITS = OPTIONAL_LIMITS
_OPTIONAL_POLICY = OPTIONAL_POLICY
_OPTIONAL_SESSION_LOG = OPTIONAL_SESSION_LOG


def _schema(tool: Tool) -> dict[str, Any]:
    # A fresh copy each time: callers may edit what they get. Both providers
    # require an object schema at the top; one without a `type` gets it.
    parameters = caller_parameters(tool)  # without its bound arguments: the host supplies them
    if parameters is None:
        return {"type": "object", "properties": {}}
    schema = copy.deepcopy(dict(parameters))
    schema.setdefault("type", "object")
    return schema


def openai_tool(tool: Tool, api: str = "chat", *, strict: bool = False) -> dict[str, Any]:
    """The tool as an entry of an OpenAI request's ``tools``.

    ``api="chat"`` (Chat Completions) nests the function:
    ``{"type": "function", "function": {"name", "description", "parameters"}}``.
    ``api="responses"`` (the Responses API) is flat:
    ``{"type": "function", "name", "description", "parameters", "strict"}``,
    plus ``output_schema`` when the tool declares ``returns``; ``strict`` is
    always written there, because that API takes an absent one as ``true``.
    ``strict=True`` asks for structured-output adherence, which OpenAI grants
    only to schemas in its strict subset (every property required,
    ``additionalProperties: false``): the schema is not rewritten to fit.

    :raises ConfigError: ``api`` is not one of ``OPENAI_APIS``.
    """
    v.require("openai_tool", "api", api, _API)
    v.require("openai_tool", "strict", strict, v.BOOL)
    if api == "responses":
        shape: dict[str, Any] = {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": _schema(tool),
            "strict": strict,
        }
        if tool.returns is not None:
            shape["output_schema"] = copy.deepcopy(dict(tool.returns))
        return shape
    function: dict[str, Any] = {"name": tool.name, "description": tool.description, "parameters": _schema(tool)}
    if strict:
        function["strict"] = True
    return {"type": "function", "function": function}


def anthropic_tool(tool: Tool) -> dict[str, Any]:
    """The tool as an entry of an Anthropic Messages API request's ``tools``: ``{"name", "description", "input_schema"}``."""
    return {"name": tool.name, "description": tool.description, "input_schema": _schema(tool)}


def call_tool(
    tool: Tool,
    arguments: Any,
    session_log: Optional[SessionLog] = None,
    *,
    policy: Optional[PermissionPolicy] = None,
    approval_handler: Optional[Callable[[ApprovalRequest], Any]] = None,
    deps: Any = None,
    description: Optional[str] = None,
    limits: Optional[Limits] = None,
    call_id: Optional[str] = None,
    bind: Optional[Mapping[str, Any]] = None,
) -> str:
    """Run a model's direct call of ``tool`` on its ``arguments`` (a JSON string,
    bytes or a dict) and return the JSON text to send back as the tool result
    (strict JSON: a lone surrogate in it is U+FFFD, ``nous_sched._text``, so
    it encodes for any model API).

    The call passes the same gate as a program's sub-call
    (``nous_sched.gate``): ``policy`` (a denied tool is refused), the
    argument rules and the tool's JSON Schema, ``limits`` (one call's
    ``max_args_bytes``), then approval: a tool that needs approval (its own
    ``requires_approval``, or the policy's) asks ``approval_handler`` with an
    :class:`~nous_sched.ApprovalRequest` carrying ``description`` and the
    call's id, and is refused without one. A refusal is answered with the very
    message a sub-call gets. With ``session_log`` the call is audited as a
    sub-call is: a ``tool_call`` event (``source="direct"``, id ``call_id``
    or a random ``"direct-…"``) before the tool runs, or a ``tool_refused``
    event.

    A :class:`~nous_sched.WithContextUpdate` result has its audit
    events appended to ``session_log`` (when given) and only its value returned.

    The admitted call runs as a program's sub-call does (one way,
    ``nous_sched.gate._admitted``: the same outcome, error kinds and messages,
    and the same ``tool_outcome`` record and result size), in a copy of the
    caller's context. A model's mistake is answered, not raised, so the loop
    can send it back and the model can correct itself: arguments that are not
    JSON or not an object, a refusal, a :class:`~nous_sched.RunCodeError`
    (``run_code`` called without a program or a description), a
    :class:`~nous_sched.ToolError`, a failed :class:`~nous_sched.Outcome` and
    a result that is not JSON all return ``{"error": "<message>"}``. Any other
    exception a tool raises is the host's problem and propagates, once the
    call's ``tool_outcome`` (a ``tool_error``) is in ``session_log``.

    The call is the model's: a tool whose ``callers`` leave out ``"model"``
    (``Tool(callers={"code"})``) is refused, naming the rule. A tool with
    bound arguments (``Tool.bound``) is offered and checked without them, and
    gets them, each :class:`~nous_sched.Bind` filled from ``bind`` (a
    :class:`~nous_sched.ConfigError` naming it when ``bind`` lacks one).

    :raises ConfigError: a bad option, named in the message.
    """
    v.require("call_tool", "tool", tool, _TOOL)
    v.require("call_tool", "session_log", session_log, _OPTIONAL_SESSION_LOG)
    v.require("call_tool", "policy", policy, _OPTIONAL_POLICY)
    v.require("call_tool", "approval_handler", approval_handler, v.OPTIONAL_CALLABLE)
    v.require("call_tool", "description", description, v.OPTIONAL_STR)
    v.require("call_tool", "limits", limits, _OPTIONAL_LIMITS)
    v.require("call_tool", "call_id", call_id, v.OPTIONAL_STR)
    if bind is not None and not (isinstance(bind, Mapping) and all(isinstance(k, str) for k in bind)):
        raise ConfigError(
            f"call_tool: `bind` must be None or a mapping of names (str) to values, got a {type(bind).__name__}"
        )
    check_binds([tool], bind, "call_tool")
    granted, denied = partition([tool], policy, "call_tool")
    audit = session_log.append if session_log is not None else None
    gate = Gate(
        granted, denied, limits if limits is not None else Limits(), None, audit, source="direct", caller="model"
    )
    if isinstance(arguments, (bytes, bytearray)):
        try:
            arguments = bytes(arguments).decode("utf-8")
        except UnicodeDecodeError as exc:
            return _error(gate.refuse(tool.name, f"the arguments are not valid UTF-8 ({exc}); send one JSON object"))
    if isinstance(arguments, str):
        admitted = gate.admit_json(tool.name, arguments)
    else:
        admitted = gate.admit(tool.name, arguments)
    if not isinstance(admitted, Admitted):
        assert admitted.error is not None
        return _error(admitted.error.message)
    args = admitted.args
    event_id = call_id if call_id is not None else "direct-" + secrets.token_urlsafe(6)
    run_ctx = RunContext(
        approval_handler=approval_handler,
        deps=deps,
        require_approval=approval_names(policy, [tool]),
        description=description or "",
        bind=bind,
    )
    if session_log is not None:
        event = ToolCallEvent(id=event_id, tool=tool.name, arguments=args, mode=EXCLUSIVE, seq=0, source="direct")
        session_log.append(event.as_event())
    info = CallInfo(event_id, tool.name, 0, EXCLUSIVE, run_ctx)
    sink = None if session_log is None else partial(_log_approval, session_log, tool.name)
    # Its own copy of the arguments (the audit holds them), in a context of its own, as a sub-call's.
    outcome, kind, size, raised = contextvars.copy_context().run(
        run_admitted, partial(_dispatched, session_log, event_id), tool, copy.deepcopy(args), run_ctx, info, sink
    )
    if session_log is not None:
        failed = None if outcome.error is None else {"kind": kind, "message": outcome.error.message}
        session_log.append(ToolOutcomeEvent(0, tool.name, outcome.ok, failed, size).as_event())
    if raised is not None:
        raise raised
    if outcome.error is not None:
        return _error(outcome.error.message)
    return machine_text(json.dumps(outcome.value, ensure_ascii=False))


def _log_approval(
    session_log: SessionLog, tool: str, approved: bool, reason: str, grant: str = "", granted: Any = None
) -> None:
    shown = None if granted is None else granted.as_dict()
    session_log.append(ApprovalEvent(0, tool, approved, reason, grant, shown).as_event())


def _dispatched(
    session_log: Optional[SessionLog], call_id: str, tool: Tool, args: dict[str, Any], run_ctx: Optional[RunContext]
) -> Any:
    """:func:`direct_dispatch` in the call's span (when tracing: a run_code run's spans nest
    under it), with a :class:`WithContextUpdate` result's audit events added to ``session_log``
    and only its value kept."""
    tracing = _tracing.active()
    if tracing is None:
        value = direct_dispatch(tool, args, run_ctx)
    else:
        value = tracing.call(tool.name, call_id, lambda: direct_dispatch(tool, args, run_ctx))
    if isinstance(value, WithContextUpdate):
        if session_log is not None:
            value.update.apply_to(session_log)
        value = value.value
    return value


def _error(message: str) -> str:
    return machine_text(json.dumps({"error": clamp(message)}, ensure_ascii=False))

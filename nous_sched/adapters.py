"""Hand tools (``run_code`` above all) to real agent loops.

Each function renders one :class:`~nous_sched.Tool` in a provider's tool
format; :func:`call_tool` runs a model's tool call and returns the text to send
back, so a loop needs no knowledge of nous_sched beyond these two.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Optional

from . import _validators as v
from .agent import WithContextUpdate
from .errors import RunCodeError, ToolError
from .events import SessionLog
from .outcome import clamp
from .tool import Tool

__all__ = ["openai_tool", "anthropic_tool", "call_tool", "OPENAI_APIS"]


#: The OpenAI APIs :func:`openai_tool` writes for.
OPENAI_APIS = ("chat", "responses")
_API = v.one_of(OPENAI_APIS)


def _schema(tool: Tool) -> dict[str, Any]:
    # A fresh copy each time: callers may edit what they get. Both providers
    # require an object schema at the top; one without a `type` gets it.
    if tool.parameters is None:
        return {"type": "object", "properties": {}}
    schema = copy.deepcopy(dict(tool.parameters))
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

    :raises ConfigError: ``api`` is not one of :data:`OPENAI_APIS`.
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


def call_tool(tool: Tool, arguments: Any, session_log: Optional[SessionLog] = None) -> str:
    """Run ``tool`` on a model's ``arguments`` (a JSON string, bytes or a dict) and
    return the JSON text to send back as the tool result.

    A :class:`~nous_sched.WithContextUpdate` result has its audit
    events appended to ``session_log`` (when given) and only its value returned.

    A model's mistake is answered, not raised, so the loop can send it back
    and the model can correct itself: arguments that are not JSON or not an
    object, a :class:`~nous_sched.RunCodeError` (``run_code`` called without
    a program or a description) and a :class:`~nous_sched.ToolError` all
    return ``{"error": "<message>"}``. Any other exception a tool raises is
    the host's problem and propagates.
    """
    if isinstance(arguments, (str, bytes, bytearray)):
        try:
            arguments = json.loads(arguments)
        except ValueError as exc:
            return _error(f"the arguments are not valid JSON ({exc}); send one JSON object")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return _error(f"the arguments must be a JSON object, got {type(arguments).__name__}")
    try:
        value = tool.function(arguments)
    except (RunCodeError, ToolError) as exc:
        return _error(str(exc))
    if isinstance(value, WithContextUpdate):
        if session_log is not None:
            value.update.apply_to(session_log)
        value = value.value
    return json.dumps(value, ensure_ascii=False)


def _error(message: str) -> str:
    return json.dumps({"error": clamp(message)}, ensure_ascii=False)

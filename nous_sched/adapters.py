"""Hand tools (``run_code`` above all) to real agent loops.

Each function renders one :class:`~nous_sched.Tool` in a provider's tool
format; :func:`call_tool` runs a model's tool call and returns the text to send
back, so a loop needs no knowledge of nous_sched beyond these two.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Optional

from .agent import WithContextUpdate
from .events import SessionLog
from .tool import Tool

__all__ = ["openai_tool", "anthropic_tool", "call_tool"]


def _schema(tool: Tool) -> dict[str, Any]:
    # A fresh copy each time: callers may edit what they get.
    if tool.parameters is None:
        return {"type": "object", "properties": {}}
    return copy.deepcopy(dict(tool.parameters))


def openai_tool(tool: Tool) -> dict[str, Any]:
    """OpenAI Chat Completions / Responses ``tools`` entry (``type: function``)."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": _schema(tool),
        },
    }


def anthropic_tool(tool: Tool) -> dict[str, Any]:
    """Anthropic Messages API ``tools`` entry."""
    return {"name": tool.name, "description": tool.description, "input_schema": _schema(tool)}


def call_tool(tool: Tool, arguments: Any, session_log: Optional[SessionLog] = None) -> str:
    """Run ``tool`` on a model's ``arguments`` (a JSON string or a dict) and
    return the JSON text to send back as the tool result.

    A :class:`~nous_sched.WithContextUpdate` result has its audit
    events appended to ``session_log`` (when given) and only its value returned.
    """
    args = json.loads(arguments) if isinstance(arguments, (str, bytes)) else arguments
    value = tool.function(args if args is not None else {})
    if isinstance(value, WithContextUpdate):
        if session_log is not None:
            value.update.apply_to(session_log)
        value = value.value
    return json.dumps(value, ensure_ascii=False)

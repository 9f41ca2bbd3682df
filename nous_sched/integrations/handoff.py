"""Adapters out: any :class:`~nous_sched.Tool`, ``run_code_tool(...)`` above all, handed to a framework.

=====================================  ==========================================  ==================
function                               gives                                       extra
=====================================  ==========================================  ==================
:func:`to_langchain`                   a LangChain ``StructuredTool``              ``langchain``
:func:`to_openai_agents`               an OpenAI Agents SDK ``FunctionTool``       ``openai-agents``
:func:`to_pydantic_ai`                 a pydantic-ai ``Tool``                      ``pydantic-ai``
=====================================  ==========================================  ==================

Each is the tool in that framework's own conventions: its name, its
description (``run_code``'s carries the SDK of the tools it may call) and its
JSON Schema as the parameters, and an ``async`` call, which is what the three
frameworks' agents await. A call runs through :func:`~nous_sched.acall_tool`:
on a thread of its own, through the same gate as every direct call (policy,
schema, approval, audit in ``session_log``), and cancelling the awaiting task
cancels the run. LangChain's tool also has the synchronous form
(:func:`~nous_sched.call_tool`), for ``invoke``.

A model's mistake never raises into the framework: arguments that are not
JSON, a missing ``description`` or ``code``, arguments that fail the schema,
a refused call, a failed tool, are all answered as the tool's result, the
JSON text ``{"error": "<message>"}``, which the framework shows the model so
it can correct itself. ``call_options`` are :func:`~nous_sched.call_tool`'s
(``policy``, ``approval_handler``, ``deps``, ``description``, ``limits``).
"""

from __future__ import annotations

import json
from typing import Any, Optional

from .. import _validators as v
from ..agent.adapters import call_tool
from ..agent.aio import acall_tool
from ..events import SessionLog
from ..tooling import Tool, caller_parameters
from ._common import require

__all__ = ["to_langchain", "to_openai_agents", "to_pydantic_ai"]

_TOOL = v.instance_of(Tool, "a nous_sched.Tool (run_code_tool(...), function_tool(...), Tool(...))")
_OPTIONAL_SESSION_LOG = v.optional(v.instance_of(SessionLog, "a nous_sched.SessionLog"))
_CALL_OPTIONS = ("policy", "approval_handler", "deps", "description", "limits", "bind")


def _checked(adapter: str, tool: Any, session_log: Any, call_options: dict[str, Any]) -> dict[str, Any]:
    v.require(adapter, "tool", tool, _TOOL)
    v.require(adapter, "session_log", session_log, _OPTIONAL_SESSION_LOG)
    for name in call_options:
        if name not in _CALL_OPTIONS:
            v.unknown(adapter, name, _CALL_OPTIONS, "call_tool")
    return call_options


def _schema(tool: Tool) -> dict[str, Any]:
    # Without its bound arguments (the host supplies them); the framework's own copy.
    schema: dict[str, Any] = json.loads(json.dumps(caller_parameters(tool)))
    return schema


def to_langchain(tool: Tool, *, session_log: Optional[SessionLog] = None, **call_options: Any) -> Any:
    """``tool`` as a LangChain ``StructuredTool`` (``ainvoke`` on a thread, ``invoke`` on the caller's).

    :raises ConfigError: ``langchain-core`` is not installed (pip install -e '.[langchain]'),
        ``tool`` is not a :class:`~nous_sched.Tool`, or an option :func:`~nous_sched.call_tool` does not take.
    """
    options = _checked("to_langchain", tool, session_log, call_options)
    tools = require("langchain_core.tools", "langchain", "to_langchain")

    async def coroutine(**arguments: Any) -> str:
        return await acall_tool(tool, arguments, session_log, **options)

    def func(**arguments: Any) -> str:
        return call_tool(tool, arguments, session_log, **options)

    return tools.StructuredTool(
        name=tool.name,
        description=tool.description or tool.name,
        args_schema=_schema(tool),
        func=func,
        coroutine=coroutine,
    )


def to_openai_agents(tool: Tool, *, session_log: Optional[SessionLog] = None, **call_options: Any) -> Any:
    """``tool`` as an OpenAI Agents SDK ``FunctionTool``; the model's raw JSON arguments go to the gate.

    Not strict (``strict_json_schema=False``): the schema is the tool's own, and a
    model that leaves out a required argument is answered, not refused by the API.

    :raises ConfigError: ``openai-agents`` is not installed (pip install -e '.[openai-agents]'),
        ``tool`` is not a :class:`~nous_sched.Tool`, or an option :func:`~nous_sched.call_tool` does not take.
    """
    options = _checked("to_openai_agents", tool, session_log, call_options)
    agents = require("agents", "openai-agents", "to_openai_agents")

    async def on_invoke_tool(ctx: Any, input_json: str) -> str:
        return await acall_tool(tool, input_json if input_json else "{}", session_log, **options)

    return agents.FunctionTool(
        name=tool.name,
        description=tool.description or tool.name,
        params_json_schema=_schema(tool),
        on_invoke_tool=on_invoke_tool,
        strict_json_schema=False,
    )


def to_pydantic_ai(tool: Tool, *, session_log: Optional[SessionLog] = None, **call_options: Any) -> Any:
    """``tool`` as a pydantic-ai ``Tool`` (``Tool.from_schema``); ``sequential`` unless the tool
    may always run in parallel, as pydantic-ai's own flag means.

    :raises ConfigError: ``pydantic-ai`` is not installed (pip install -e '.[pydantic-ai]'),
        ``tool`` is not a :class:`~nous_sched.Tool`, or an option :func:`~nous_sched.call_tool` does not take.
    """
    options = _checked("to_pydantic_ai", tool, session_log, call_options)
    pydantic_ai = require("pydantic_ai", "pydantic-ai", "to_pydantic_ai")

    async def function(**arguments: Any) -> str:
        return await acall_tool(tool, arguments, session_log, **options)

    return pydantic_ai.Tool.from_schema(
        function=function,
        name=tool.name,
        description=tool.description or tool.name,
        json_schema=_schema(tool),
        sequential=tool.concurrency_safe is None,
    )

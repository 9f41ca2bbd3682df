"""OpenAI Agents SDK function tools (``agents.FunctionTool``, as ``@function_tool`` makes them).

The parameters are the tool's ``params_json_schema``; its
``output_json_schema``, when it has one, becomes ``returns``. A call goes
through the tool's own ``on_invoke_tool`` (its argument validation, context
injection and failure policy), awaited on the tool's thread, as a call made
by a *program* (``caller.type == "program"``), which is what a nous_sched
sub-call is. The tool's context object is the run's ``deps`` (see
:class:`~nous_sched.RunContext`).

Flags: ``needs_approval=True`` means approval; a per-call approval callable
cannot be asked here, so it means every call asks. A tool whose
``allowed_callers`` leaves out ``"programmatic"`` is refused, and so is one
with input or output guardrails (only the SDK's runner runs them).

Errors follow the tool's failure policy: by default the SDK turns an
exception into an error *string* returned as the tool's result (except for a
tool with an output schema, which raises); build the tool with
``failure_error_function=None`` to have every failure reach the program as a
:class:`~nous_sched.ToolError`.

Code Mode for an agent (the other direction), one line:
``agent = code_mode(agent, approval_handler=ask)`` (:func:`code_mode`).
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Optional, Sequence

from ..errors import ConfigError, ToolError
from ..gate.dispatch import current_call
from ..throttle import Throttle
from ..tooling import Tool
from ..tooling._pydantic import jsonable
from ._common import Predicate, build, require, return_schema

__all__ = ["from_openai_agents", "code_mode"]

_ADAPTER = "from_openai_agents"


def from_openai_agents(
    tool: Any,
    *,
    name: Optional[str] = None,
    concurrency_safe: Predicate = None,
    requires_approval: Optional[bool] = None,
    category: str = "read",
    throttles: Sequence[Throttle] = (),
    bound: Any = None,
    callers: Any = None,
) -> Tool:
    """A :class:`~nous_sched.Tool` that runs the Agents SDK function tool ``tool``.

    :raises ConfigError: ``openai-agents`` is not installed (``pip install -e
        '.[openai-agents]'``), ``tool`` is not a ``FunctionTool``, or
        it cannot be honoured outside the SDK's runner (see the module docstring).
    """
    agents = require("agents", "openai-agents", _ADAPTER)
    tool_context = require("agents.tool_context", "openai-agents", _ADAPTER)
    calls = require("openai.types.responses", "openai-agents", _ADAPTER)
    if not isinstance(tool, agents.FunctionTool):
        raise ConfigError(f"{_ADAPTER}: expected an agents.FunctionTool, got {type(tool).__name__}")
    allowed = tool.allowed_callers
    if allowed is not None and "programmatic" not in allowed:
        raise ConfigError(
            f"{_ADAPTER}: tool {tool.name!r} allows only {sorted(allowed)} callers; a program calling it would "
            "break that promise (add 'programmatic' to allowed_callers)"
        )
    if callers is None and allowed is not None:  # the SDK's word: "programmatic" is code, "direct" the model
        callers = {"code"} | ({"model"} if "direct" in allowed else set())
    if tool.tool_input_guardrails or tool.tool_output_guardrails:
        raise ConfigError(
            f"{_ADAPTER}: tool {tool.name!r} has tool guardrails, which only the Agents SDK's runner runs; "
            "nous_sched would skip them"
        )
    needs_approval = tool.needs_approval is not False

    def function(args: dict[str, Any]) -> Any:
        from ..tooling._async import run_coroutine  # asyncio only once a call needs it

        call = current_call.get()
        call_id = call.id if call is not None else f"{tool.name}-direct"
        arguments = json.dumps(args, ensure_ascii=False)
        context = tool_context.ToolContext(
            context=getattr(getattr(call, "run_ctx", None), "deps", None),
            tool_name=tool.name,
            tool_call_id=call_id,
            tool_arguments=arguments,
            tool_call=calls.ResponseFunctionToolCall(
                type="function_call",
                call_id=call_id,
                name=tool.name,
                arguments=arguments,
                caller={"type": "program", "caller_id": call_id.rsplit(":code:", 1)[0]},
            ),
        )
        try:
            output = run_coroutine(lambda: tool.on_invoke_tool(context, arguments))
        except agents.exceptions.ModelBehaviorError as exc:  # arguments that do not fit the function
            raise ToolError(str(exc)) from None
        return jsonable(output)

    return build(
        adapter=_ADAPTER,
        name=name,
        default_name=tool.name,
        function=function,
        description=tool.description,
        parameters=tool.params_json_schema,
        returns=tool.output_json_schema or return_schema(_wrapped_function(tool)),
        concurrency_safe=concurrency_safe,
        derived_concurrency_safe=None,
        requires_approval=requires_approval,
        derived_requires_approval=needs_approval,
        category=category,
        throttles=throttles,
        bound=bound,
        callers=callers,
    )


def _wrapped_function(tool: Any) -> Any:
    """The Python function a ``@function_tool`` wraps, when this version of the
    SDK lets it be found (for its return annotation); ``None`` otherwise."""
    try:
        invoke = tool.on_invoke_tool
        impl = getattr(invoke, "_invoke_tool_impl", invoke)
        return inspect.getclosurevars(impl).nonlocals.get("the_func")
    except Exception:
        return None


def code_mode(agent: Any, **options: Any) -> Any:
    """A copy of the Agents SDK ``agent`` whose model sees one ``run_code`` tool in place of its tools.

    Every turn, the agent's enabled function tools and the tools of its
    ``mcp_servers`` (connected as usual, ``async with server``) are listed as
    the SDK lists them, and ``run_code`` is offered over them; hosted tools
    (web search, ...) and tools whose ``allowed_callers`` leave out
    ``"programmatic"`` stay the model's own. Each nested call runs the real
    tool's ``on_invoke_tool`` on the agent's event loop with a ``ToolContext``
    made from the run's ``RunContextWrapper`` (its ``context``, usage, agent
    and run config) for that call: its ``tool_call_id`` is the call's audit
    id and its ``tool_call`` says a program called it (``caller.type ==
    "program"``). ``needs_approval=True`` asks ``approval_handler`` on every
    call; a ``needs_approval`` function is asked first, and asks the handler
    when it says so; without a handler such a call is refused. An MCP tool
    runs side by side with others when its server marks it ``readOnlyHint``;
    every other tool is exclusive unless ``concurrency_safe`` says otherwise.

    Options: ``approval_handler``, ``concurrency_safe`` and
    ``requires_approval`` (mappings of tool names to overrides),
    ``session_log`` (the audit), ``policy``, ``budget``, ``output_budget`` and
    any other :func:`~nous_sched.run_code` option.

    :raises ConfigError: ``openai-agents`` is not installed, ``agent`` is not
        an ``agents.Agent``, a bad option, or a function tool with tool
        guardrails (only the SDK's runner runs them).
    """
    require("agents", "openai-agents", "code_mode")
    from ._openai_agents_code_mode import code_mode as make

    return make(agent, **options)

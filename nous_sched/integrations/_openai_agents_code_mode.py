"""``code_mode(agent)``: the Agents SDK's side (imported only once the SDK is wanted).

See :func:`nous_sched.integrations.openai_agents.code_mode` for what it promises.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Any, Optional

from agents import Agent, FunctionTool
from agents.exceptions import ModelBehaviorError
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall
from openai.types.responses.response_function_tool_call import CallerProgram

from ..errors import ConfigError, ToolError
from ..gate.dispatch import approve, current_call
from ..tooling import Tool
from ..tooling._pydantic import jsonable
from ._code_mode import CodeModeOptions, asking, bridge, schema_text

__all__ = ["code_mode"]

_ADAPTER = "code_mode"


@dataclasses.dataclass
class CodeModeAgent(Agent[Any]):
    """An :class:`agents.Agent` whose function tools and MCP servers' tools are reached through ``run_code``."""

    code_mode: Optional[CodeModeOptions] = None

    async def get_all_tools(self, run_context: Any) -> list[Any]:
        tools = await super().get_all_tools(run_context)
        options = self.code_mode
        assert options is not None, "made by code_mode()"
        mcp = await self._mcp_tools(run_context)
        nested: list[Tool] = []
        offered: list[Any] = []
        for tool in tools:
            programmable = isinstance(tool, FunctionTool) and _programmable(tool)
            if programmable:
                nested.append(_nested(options, tool, mcp.get(tool.name)))
            # Hosted tools (web search, ...), what a program may not call, and what callers= offers the model.
            if not programmable or options.offered_directly(tool.name):
                offered.append(tool)
        return [*offered, _run_code(options, nested)]

    async def _mcp_tools(self, run_context: Any) -> dict[str, bool]:
        """The MCP servers' tools, each with whether its server marks it read-only (``readOnlyHint``)."""
        found: dict[str, bool] = {}
        for server in self.mcp_servers:
            for tool in await server.list_tools(run_context, self):
                annotations = tool.annotations
                found[tool.name] = annotations is not None and getattr(annotations, "read_only_hint", None) is True
        return found


def code_mode(agent: Any, **options: Any) -> CodeModeAgent:
    """See :func:`nous_sched.integrations.openai_agents.code_mode`."""
    if not isinstance(agent, Agent):
        raise ConfigError(f"{_ADAPTER}: expected an agents.Agent, got {type(agent).__name__}")
    checked = CodeModeOptions(
        _ADAPTER,
        approval_handler=options.pop("approval_handler", None),
        concurrency_safe=options.pop("concurrency_safe", None),
        requires_approval=options.pop("requires_approval", None),
        session_log=options.pop("session_log", None),
        policy=options.pop("policy", None),
        budget=options.pop("budget", _default("budget")),
        output_budget=options.pop("output_budget", _default("output_budget")),
        run_options=options,
    )
    for tool in agent.tools:
        if isinstance(tool, FunctionTool) and (tool.tool_input_guardrails or tool.tool_output_guardrails):
            raise ConfigError(
                f"{_ADAPTER}: tool {tool.name!r} has tool guardrails, which only the Agents SDK's runner runs "
                "on a model's call; a program's call would skip them"
            )
    fields = {f.name: getattr(agent, f.name) for f in dataclasses.fields(agent) if f.init}
    return CodeModeAgent(**fields, code_mode=checked)


def _default(name: str) -> Any:
    from ..agent import run_code_tool

    return inspect.signature(run_code_tool).parameters[name].default


def _programmable(tool: Any) -> bool:
    callers = tool.allowed_callers
    return callers is None or "programmatic" in callers


def _run_code(options: CodeModeOptions, nested: list[Tool]) -> Any:
    code = options.run_code_tool(nested)

    async def on_invoke_tool(ctx: Any, input_json: str) -> str:
        return await options.arun(nested, ctx, input_json if input_json else "{}")

    return FunctionTool(
        name=code.name,
        description=code.description,
        params_json_schema=json.loads(json.dumps(code.parameters)),
        on_invoke_tool=on_invoke_tool,
        strict_json_schema=False,
    )


def _nested(options: CodeModeOptions, tool: Any, read_only: Optional[bool]) -> Tool:
    """``read_only``: ``None`` for a function tool, else whether the MCP tool is read-only."""
    approval = tool.needs_approval
    name = tool.name

    def function(args: dict[str, Any]) -> Any:
        way = bridge()
        info = current_call.get()
        assert info is not None, "bridge() found the call"
        arguments = json.dumps(args, ensure_ascii=False)
        outer = way.context
        nested = ToolContext.from_agent_context(
            outer,
            info.id,
            ResponseFunctionToolCall(
                type="function_call",
                call_id=info.id,
                name=name,
                arguments=arguments,
                caller=CallerProgram(type="program", caller_id=str(getattr(outer, "tool_call_id", ""))),
            ),
            getattr(outer, "agent", None),
            run_config=getattr(outer, "run_config", None),
        )
        if callable(approval) and way.run(lambda: _awaited(approval(nested, args, info.id))):
            approve(
                asking(name, tool.description), args, info.run_ctx
            )  # asks the handler now, as the SDK would ask its user
        try:
            output = way.run(lambda: tool.on_invoke_tool(nested, arguments))
        except ModelBehaviorError as exc:  # arguments that do not fit the function
            raise ToolError(str(exc)) from None
        return jsonable(output) if read_only is None else _mcp_value(output)

    return options.tool(
        name=name,
        description=tool.description,
        parameters=tool.params_json_schema,
        returns=tool.output_json_schema,
        function=function,
        safe=read_only is True,
        gated=approval is True,
    )


def _mcp_value(output: Any) -> Any:
    """An MCP tool's output as the SDK renders it for a model (JSON text, or text blocks) as a value."""
    if isinstance(output, list):
        return [_mcp_value(item) for item in output]
    if isinstance(output, dict) and output.get("type") == "text":
        output = output.get("text")
    return schema_text(output)


async def _awaited(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value

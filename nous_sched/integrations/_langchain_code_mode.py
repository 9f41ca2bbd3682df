"""``CodeModeMiddleware``: LangChain's side (imported only once ``langchain`` is wanted).

See :class:`nous_sched.integrations.langchain.CodeModeMiddleware` for what it promises.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from langchain.agents.middleware import AgentMiddleware, HumanInTheLoopMiddleware
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, StructuredTool
from langchain_core.utils.function_calling import convert_to_openai_function

from .. import sdk
from ..agent import RUN_CODE_NAME
from ..agent.adapters import call_tool
from ..errors import ConfigError, ToolError
from ..events import SessionLog
from ..gate.dispatch import ApprovalRequest, approve, current_call
from ..gate.policy import PermissionPolicy
from ..result.budget import DEFAULT_OUTPUT_BUDGET
from ..tooling import Tool
from ._code_mode import Bridge, CodeModeOptions, Overrides, asking, bridge, schema_text

__all__ = ["CodeModeMiddleware"]

_ADAPTER = "CodeModeMiddleware"


class CodeModeMiddleware(AgentMiddleware):
    """See :class:`nous_sched.integrations.langchain.CodeModeMiddleware`."""

    def __init__(
        self,
        *,
        interrupt_on: Any = None,
        approval_handler: Optional[Callable[[ApprovalRequest], Any]] = None,
        concurrency_safe: Overrides = None,
        requires_approval: Overrides = None,
        session_log: Optional[SessionLog] = None,
        policy: Optional[PermissionPolicy] = None,
        budget: Optional[int] = sdk.DEFAULT_BUDGET,
        output_budget: Optional[int] = DEFAULT_OUTPUT_BUDGET,
        **run_options: Any,
    ) -> None:
        super().__init__()
        self._options = CodeModeOptions(
            _ADAPTER,
            approval_handler=approval_handler,
            concurrency_safe=concurrency_safe,
            requires_approval=requires_approval,
            session_log=session_log,
            policy=policy,
            budget=budget,
            output_budget=output_budget,
            run_options=run_options,
        )
        self._gated = _gated(interrupt_on)
        # Registered with the agent's tool node, so a model's run_code call reaches wrap_tool_call.
        self.tools = [_placeholder(self._options.run_code_tool([]))]

    # -- what the model is offered ----------------------------------------------------------------

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return handler(self._offer(request))

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return await handler(self._offer(request))

    def _offer(self, request: Any) -> Any:
        mine = [t for t in request.tools if isinstance(t, BaseTool) and t.name != RUN_CODE_NAME]
        others = [t for t in request.tools if not isinstance(t, BaseTool)]  # a provider's own tools stay the model's
        code = self._options.run_code_tool(self._nested(mine))
        # A tool the model may call itself (callers= holding "model") stays offered beside run_code.
        direct = [t for t in mine if self._options.offered_directly(t.name)]
        return request.override(tools=[*others, *direct, _placeholder(code)])

    # -- a model's run_code call ------------------------------------------------------------------

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        if request.tool_call["name"] != RUN_CODE_NAME:
            return handler(request)
        tools = self._nested(self._agent_tools(request))
        code = self._options.run_code_tool(tools, context=(request, handler))
        text = call_tool(code, request.tool_call["args"], self._options.session_log)
        return ToolMessage(content=text, name=RUN_CODE_NAME, tool_call_id=request.tool_call["id"])

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        if request.tool_call["name"] != RUN_CODE_NAME:
            return await handler(request)
        tools = self._nested(self._agent_tools(request))
        text = await self._options.arun(tools, (request, handler), request.tool_call["args"])
        return ToolMessage(content=text, name=RUN_CODE_NAME, tool_call_id=request.tool_call["id"])

    def _agent_tools(self, request: Any) -> list[Any]:
        runtime_tools = getattr(request.runtime, "tools", None) or []
        return [t for t in runtime_tools if isinstance(t, BaseTool) and t.name != RUN_CODE_NAME]

    def _nested(self, tools: list[Any]) -> list[Tool]:
        return [
            self._options.tool(
                name=tool.name,
                description=tool.description,
                # What LangChain sends a model: injected arguments (runtime, state, store) left out.
                parameters=convert_to_openai_function(tool).get("parameters"),
                returns=None,
                function=_nested_call(tool, self._gated.get(tool.name, _NOT_GATED)),
                safe=(tool.metadata or {}).get("readOnlyHint") is True,
                gated=self._gated.get(tool.name, _NOT_GATED) is None,
            )
            for tool in tools
        ]


_NOT_GATED = object()


def _gated(interrupt_on: Any) -> dict[str, Any]:
    """The tools LangChain's human-in-the-loop settings gate, each with its ``when`` predicate
    (``None``: every call asks)."""
    if interrupt_on is None:
        return {}
    if isinstance(interrupt_on, HumanInTheLoopMiddleware):
        interrupt_on = interrupt_on.interrupt_on
    if not isinstance(interrupt_on, dict) or not all(isinstance(k, str) for k in interrupt_on):
        raise ConfigError(
            f"{_ADAPTER}: `interrupt_on` must be a HumanInTheLoopMiddleware or its interrupt_on mapping "
            f"(tool name to True, False or an InterruptOnConfig), got {type(interrupt_on).__name__}"
        )
    gated = {}
    for name, config in interrupt_on.items():
        if config:
            gated[name] = config.get("when") if isinstance(config, dict) else None
    return gated


def _placeholder(code: Tool) -> Any:
    """``run_code`` as the model and the tool node see it; wrap_tool_call runs it, never this function."""

    def unreachable(**arguments: Any) -> str:
        raise ToolError("run_code runs in CodeModeMiddleware.wrap_tool_call; is the middleware installed?")

    return StructuredTool(
        name=code.name, description=code.description, args_schema=dict(code.parameters or {}), func=unreachable
    )


def _nested_call(tool: Any, when: Any) -> Callable[[dict[str, Any]], Any]:
    """The nested call of ``tool``; ``when``: the HITL predicate that decides per call whether it asks."""
    name = tool.name

    def function(args: dict[str, Any]) -> Any:
        way = bridge()
        info = current_call.get()
        assert info is not None, "bridge() found the call"
        request, handler = way.context
        runtime = request.runtime
        if dataclasses.is_dataclass(runtime) and not isinstance(runtime, type):
            runtime = dataclasses.replace(runtime, tool_call_id=info.id)
        nested = request.override(
            tool_call={"name": name, "args": args, "id": info.id, "type": "tool_call"}, tool=tool, runtime=runtime
        )
        if callable(when) and when(nested):
            approve(asking(name, tool.description), args, info.run_ctx)  # asks the handler now, or refuses
        # The agent's own tool node runs it: argument parsing, injected state, store and runtime, errors.
        message = _through(way, handler, nested)
        if not isinstance(message, ToolMessage):
            raise ToolError(
                f"tool {name!r} returned a {type(message).__name__}, which only the agent's graph can apply"
            )
        if message.status == "error":
            raise ToolError(str(message.content))
        return schema_text(message.content)

    return function


def _through(way: Bridge, handler: Callable[[Any], Any], request: Any) -> Any:
    if way.loop is None:
        return handler(request)
    return way.run(lambda: handler(request))

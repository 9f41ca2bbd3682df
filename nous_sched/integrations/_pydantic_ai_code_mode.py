"""``CodeModeToolset`` and ``CodeMode``: pydantic-ai's side (imported only once pydantic-ai is wanted).

See :mod:`nous_sched.integrations.pydantic_ai` for what they promise.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from typing import Any, Callable, Optional

import pydantic
import pydantic_core
from pydantic_ai import ToolReturn
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelRetry, ToolFailed
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, CombinedToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from .. import sdk
from ..agent import RUN_CODE_NAME
from ..errors import ConfigError, ToolError
from ..events import SessionLog
from ..gate.dispatch import ApprovalRequest, approve, current_call
from ..gate.policy import PermissionPolicy
from ..result.budget import DEFAULT_OUTPUT_BUDGET
from ..tooling import Tool
from ..tooling._pydantic import jsonable, validation_message
from ._code_mode import CodeModeOptions, Overrides, asking, bridge

__all__ = ["CodeModeToolset", "CodeMode"]

_ADAPTER = "CodeModeToolset"
_ANY_ARGS = pydantic_core.SchemaValidator(pydantic_core.core_schema.dict_schema())


class CodeModeToolset(AbstractToolset[Any]):
    """See :class:`nous_sched.integrations.pydantic_ai.CodeModeToolset`."""

    def __init__(
        self,
        *toolsets: Any,
        id: Optional[str] = None,
        approval_handler: Optional[Callable[[ApprovalRequest], Any]] = None,
        concurrency_safe: Overrides = None,
        requires_approval: Overrides = None,
        session_log: Optional[SessionLog] = None,
        policy: Optional[PermissionPolicy] = None,
        budget: Optional[int] = sdk.DEFAULT_BUDGET,
        output_budget: Optional[int] = DEFAULT_OUTPUT_BUDGET,
        max_retries: int = 1,
        **run_options: Any,
    ) -> None:
        for toolset in toolsets:
            if not isinstance(toolset, AbstractToolset):
                raise ConfigError(
                    f"{_ADAPTER}: expected pydantic-ai toolsets (FunctionToolset, MCPToolset, ...), "
                    f"got {type(toolset).__name__}"
                )
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
        self._inner: Any = toolsets[0] if len(toolsets) == 1 else CombinedToolset(list(toolsets))
        self._id = id
        self._max_retries = max_retries

    @property
    def id(self) -> Optional[str]:
        return self._id

    async def __aenter__(self) -> CodeModeToolset:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *args: Any) -> Optional[bool]:
        return await self._inner.__aexit__(*args)  # type: ignore[no-any-return]

    async def for_run(self, ctx: Any) -> Any:
        return self._with(await self._inner.for_run(ctx))

    async def for_run_step(self, ctx: Any) -> Any:
        return self._with(await self._inner.for_run_step(ctx))

    def _with(self, inner: Any) -> CodeModeToolset:
        if inner is self._inner:
            return self
        other = copy.copy(self)
        other._inner = inner  # noqa: SLF001 (this class's own copy)
        return other

    async def get_instructions(self, ctx: Any) -> Any:
        return await self._inner.get_instructions(ctx)

    async def get_tools(self, ctx: Any) -> dict[str, Any]:
        inner = await self._inner.get_tools(ctx)
        code = self._options.run_code_tool(self._tools(inner))
        definition = ToolDefinition(
            name=code.name,
            description=code.description,
            parameters_json_schema=dict(code.parameters or {}),
            # Two programs at once would each order only their own calls.
            sequential=True,
        )
        # A tool the model may call itself (callers= holding "model") is offered beside run_code.
        direct = {name: found for name, found in inner.items() if self._options.offered_directly(name)}
        return {
            **direct,
            code.name: ToolsetTool(
                toolset=self, tool_def=definition, max_retries=self._max_retries, args_validator=_ANY_ARGS
            ),
        }

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
        if name != RUN_CODE_NAME and self._options.offered_directly(name):  # the model's own call of it
            return await self._inner.call_tool(name, tool_args, ctx, tool)
        return await self._options.arun(await self.nested_tools(ctx), ctx, tool_args)

    async def nested_tools(self, ctx: Any) -> list[Tool]:
        """The tools a program may call in the run of ``ctx``, as :class:`~nous_sched.Tool` values
        (their modes and approval as the switch set them)."""
        return self._tools(await self._inner.get_tools(ctx))

    def _tools(self, inner: dict[str, Any]) -> list[Tool]:
        tools = []
        for name, found in inner.items():
            definition = found.tool_def
            if definition.kind == "external":  # the caller runs it, outside the agent: no program can
                continue
            tools.append(
                self._options.tool(
                    name=name,
                    description=definition.description,
                    parameters=definition.parameters_json_schema,
                    returns=definition.return_schema,
                    function=self._nested(name, found),
                    safe=_safe(definition),
                    gated=definition.kind == "unapproved",
                )
            )
        return tools

    def _nested(self, name: str, found: Any) -> Callable[[dict[str, Any]], Any]:
        inner = self._inner

        def function(args: dict[str, Any]) -> Any:
            way = bridge()
            info = current_call.get()
            assert info is not None, "bridge() found the call"
            gated = found.tool_def.kind == "unapproved" or self._options.requires_approval.get(name, False)

            async def call(approved: bool) -> Any:
                try:
                    validated = found.args_validator.validate_python(args)
                except pydantic.ValidationError as exc:
                    raise ToolError(validation_message(exc)) from None
                ctx = dataclasses.replace(
                    way.context, tool_name=name, tool_call_id=info.id, retry=0, tool_call_approved=approved
                )
                if found.args_validator_func is not None:
                    checked = found.args_validator_func(ctx, **validated)
                    if inspect.isawaitable(checked):
                        await checked
                return await inner.call_tool(name, validated, ctx, found)

            try:
                try:
                    output = way.run(lambda: call(gated))
                except ApprovalRequired:
                    # The tool (or an ApprovalRequiredToolset) asks now: the run's handler answers.
                    approve(asking(name, found.tool_def.description), args, info.run_ctx)
                    output = way.run(lambda: call(True))
            except (ModelRetry, ToolFailed) as exc:
                raise ToolError(str(getattr(exc, "message", exc))) from None
            except ApprovalRequired:
                raise ToolError(f"tool {name!r} asked for approval again after it was approved") from None
            except CallDeferred:
                raise ToolError(
                    f"tool {name!r} deferred its call to the caller, which a program cannot wait for"
                ) from None
            return jsonable(output.return_value if isinstance(output, ToolReturn) else output)

        return function


def _safe(definition: Any) -> bool:
    """pydantic-ai runs a tool beside others unless it is ``sequential``; an MCP tool only
    when its server says it reads and does not write (``readOnlyHint``)."""
    if definition.sequential:
        return False
    metadata = definition.metadata or {}
    if "annotations" in metadata:  # an MCP tool: its server's word, not pydantic-ai's default
        annotations = metadata["annotations"] or {}
        return annotations.get("readOnlyHint") is True
    return True


@dataclasses.dataclass(init=False)
class CodeMode(AbstractCapability[Any]):
    """See :class:`nous_sched.integrations.pydantic_ai.CodeMode`."""

    options: dict[str, Any]

    def __init__(self, **options: Any) -> None:
        CodeModeToolset(**options)  # every option checked where the agent is built
        self.options = options

    def get_wrapper_toolset(self, toolset: Any) -> Any:
        return CodeModeToolset(toolset, **self.options)

"""pydantic-ai tools (``pydantic_ai.Tool``, or a plain function as pydantic-ai would wrap it).

The parameters are the tool's ``tool_def.parameters_json_schema`` and its
return schema becomes ``returns``. A call validates the arguments with the
tool's own pydantic validator and calls the function, on the tool's thread
(an ``async`` one to completion there). ``ModelRetry`` and ``ToolFailed``
raised by the function become a :class:`~nous_sched.ToolError` with their
message, for the program to act on.

Flags: ``sequential=True`` means exclusive; every other pydantic-ai tool runs
side by side with others, as pydantic-ai runs it, so it gets a predicate that
is always true. ``requires_approval=True`` means approval. A tool that takes
a ``RunContext``, or has a ``prepare`` or ``args_validator`` function (which
need one), is refused: only an agent run can supply the context.

Code Mode for a pydantic-ai agent (the other direction: the agent's tools
reached from a program), one line::

    agent = Agent(model, tools=[...], toolsets=[mcp], capabilities=[CodeMode(approval_handler=ask)])
    # or over chosen toolsets:
    agent = Agent(model, toolsets=[CodeModeToolset(FunctionToolset([...]), mcp, approval_handler=ask)])

``CodeModeToolset(*toolsets, ...)`` is a pydantic-ai toolset that offers one
tool, ``run_code``, over the tools of ``toolsets`` (function toolsets,
``MCPToolset`` servers, any toolset), listed afresh at each step; the
``CodeMode(...)`` capability wraps the agent's own assembled toolset (its
``tools=``, ``@agent.tool`` functions and ``toolsets=``) in one. Entering it
enters the wrapped toolsets (an MCP server's connection). Each nested call
validates its arguments with the tool's own validator and calls the tool
through its toolset with the *current* run's ``RunContext`` (its ``deps``,
usage, model, messages), with ``tool_name`` and ``tool_call_id`` (the call's
audit id) of the nested call, on the agent's event loop; the tool runs as
it would for the model. Its flags: ``sequential`` means exclusive and other
function tools run side by side, as pydantic-ai runs them; an MCP tool runs
side by side only when its server marks it ``readOnlyHint``. A tool that
requires approval (``requires_approval=True``, an ``ApprovalRequiredToolset``,
or a tool raising ``ApprovalRequired``) asks ``approval_handler`` on every
call, and is refused without one; approved, it runs with
``tool_call_approved=True``. ``ModelRetry`` and ``ToolFailed`` reach the
program as a :class:`~nous_sched.ToolError`; an external (deferred) tool is
not offered, as a program cannot wait for its caller.

Options: ``concurrency_safe`` and ``requires_approval``, mappings of tool
names to overrides (``True``/``False``, or a predicate for
``concurrency_safe``); ``approval_handler``; ``session_log`` (the audit);
``policy``, ``budget`` and ``output_budget`` as in
:func:`~nous_sched.run_code_tool`; ``id`` and ``max_retries`` (of
``run_code``) as pydantic-ai's; any other :func:`~nous_sched.run_code`
option (``timeout``, ``max_parallel``, ``runtime``...). A bad one is a
:class:`~nous_sched.ConfigError` where the toolset is built.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ..errors import ConfigError, ToolError
from ..throttle import Throttle
from ..tooling import Tool, always_safe
from ..tooling._pydantic import jsonable, validation_message
from ._common import Predicate, build, require

if TYPE_CHECKING:  # made on first use (module __getattr__ below): they subclass pydantic-ai's classes
    from ._pydantic_ai_code_mode import CodeMode, CodeModeToolset

__all__ = ["from_pydantic_ai", "CodeModeToolset", "CodeMode"]

_ADAPTER = "from_pydantic_ai"


def from_pydantic_ai(
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
    """A :class:`~nous_sched.Tool` that runs the pydantic-ai tool ``tool`` (a ``Tool`` or a plain function).

    :raises ConfigError: ``pydantic-ai`` is not installed (``pip install -e
        '.[pydantic-ai]'``), or ``tool`` needs an agent run (see the
        module docstring).
    """
    pydantic_ai = require("pydantic_ai", "pydantic-ai", _ADAPTER)
    pydantic = require("pydantic", "pydantic-ai", _ADAPTER)
    if not isinstance(tool, pydantic_ai.Tool):
        if not callable(tool):
            raise ConfigError(f"{_ADAPTER}: expected a pydantic_ai.Tool or a function, got {type(tool).__name__}")
        tool = pydantic_ai.Tool(tool)
    needs_a_run = (
        (tool.takes_ctx, "takes a RunContext"),
        (tool.prepare, "has a prepare function"),
        (tool.args_validator, "has an args_validator"),
    )
    for needed, what in needs_a_run:
        if needed:
            raise ConfigError(
                f"{_ADAPTER}: tool {tool.name!r} {what}, which only a pydantic-ai agent run can supply or run"
            )
    definition = tool.tool_def
    schema = tool.function_schema
    retry = (pydantic_ai.ModelRetry, pydantic_ai.exceptions.ToolFailed)

    def function(args: dict[str, Any]) -> Any:
        from ..tooling._async import run_coroutine  # asyncio only once a call needs it

        try:
            validated = schema.validator.validate_python(args)
        except pydantic.ValidationError as exc:
            raise ToolError(validation_message(exc)) from None
        try:
            if schema.is_async or schema.positional_fields or schema.var_positional_field:
                output = run_coroutine(lambda: schema.call(validated, None))
            else:
                output = schema.function(**validated)
                if inspect.isawaitable(output):
                    output = run_coroutine(lambda: output)
        except retry as exc:
            raise ToolError(str(getattr(exc, "message", exc))) from None
        return jsonable(output.return_value if isinstance(output, pydantic_ai.ToolReturn) else output)

    return build(
        adapter=_ADAPTER,
        name=name,
        default_name=definition.name,
        function=function,
        description=definition.description,
        parameters=definition.parameters_json_schema,
        returns=definition.return_schema,
        concurrency_safe=concurrency_safe,
        derived_concurrency_safe=None if definition.sequential else always_safe,
        requires_approval=requires_approval,
        derived_requires_approval=bool(tool.requires_approval),
        category=category,
        throttles=throttles,
        bound=bound,
        callers=callers,
    )


def __getattr__(name: str) -> Any:
    # CodeModeToolset and CodeMode subclass pydantic-ai's own classes: made when first asked for.
    if name in ("CodeModeToolset", "CodeMode"):
        require("pydantic_ai", "pydantic-ai", name)
        from . import _pydantic_ai_code_mode

        return getattr(_pydantic_ai_code_mode, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

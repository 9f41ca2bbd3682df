"""LangChain tools (``langchain_core.tools.BaseTool``: ``@tool`` functions, ``StructuredTool``, subclasses).

The parameters are the JSON Schema LangChain itself sends a model
(``convert_to_openai_function``); a call goes through the tool's own
``invoke``, so its argument parsing, callbacks and error handling all apply.
A tool that only has a coroutine runs it with ``ainvoke`` on the tool's
thread. A ``ToolException`` or a pydantic validation error becomes a
:class:`~nous_sched.ToolError` with its message. LangChain has no flag for
concurrency or approval: the defaults are exclusive and no approval. The
return annotation of the tool's function (``-> int``) becomes ``returns``.

Code Mode for an agent (the other direction: the agent's tools reached from
a program), one line: ``create_agent(model, tools,
middleware=[CodeModeMiddleware(approval_handler=ask)])``.

``CodeModeMiddleware(...)`` (needs the ``langchain`` package, v1) is an
agent middleware: at each model call the model is offered ``run_code`` in
place of the agent's tools (a provider's own tools, given as dicts, stay),
its description carrying their SDK. A ``run_code`` call runs the program,
and each nested call goes through the agent's own tool node (the handler
``wrap_tool_call`` is given) as a tool call of its own, id the call's audit
id: the real tool runs with its argument parsing and its injected arguments
(``ToolRuntime`` with that id, ``InjectedState``, ``InjectedStore``, the
run's context and config). A ``ToolMessage`` with ``status="error"``, or a
tool's exception, fails the call with its message; a tool that returns a
``Command`` fails it too (only the agent's graph can apply one). Text that
is JSON reaches the program as the value.

The tools of LangChain's human-in-the-loop settings (``interrupt_on``, the
mapping ``HumanInTheLoopMiddleware`` takes, or that middleware itself) ask
``approval_handler`` on every call here (or, for one with a ``when``
predicate, on each call it picks: it gets the nested call's
``ToolCallRequest``), and are refused without one; the reviewer's other
decisions (edit, respond) have no counterpart inside a program.
LangChain has no flag for concurrency: a tool is exclusive unless its
``metadata`` says ``readOnlyHint: True`` (as ``langchain-mcp-adapters``
copies an MCP tool's annotations) or ``concurrency_safe`` says so. Other
options: ``requires_approval``, ``session_log``, ``policy``, ``budget``,
``output_budget`` and any :func:`~nous_sched.run_code` option, checked where
the middleware is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

from ..errors import ConfigError, ToolError
from ..throttle import Throttle
from ..tooling import Tool
from ..tooling._pydantic import is_validation_error, jsonable, validation_message
from ._common import Predicate, build, require, return_schema

if TYPE_CHECKING:  # made on first use (module __getattr__ below): it subclasses langchain's AgentMiddleware
    from ._langchain_code_mode import CodeModeMiddleware

__all__ = ["from_langchain", "CodeModeMiddleware"]

_ADAPTER = "from_langchain"


def from_langchain(
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
    """A :class:`~nous_sched.Tool` that runs the LangChain tool ``tool``.

    :raises ConfigError: ``langchain-core`` is not installed (``pip install -e
        '.[langchain]'``), or ``tool`` is not a LangChain ``BaseTool``.
    """
    tools = require("langchain_core.tools", "langchain", _ADAPTER)
    calling = require("langchain_core.utils.function_calling", "langchain", _ADAPTER)
    if not isinstance(tool, tools.BaseTool):
        raise ConfigError(f"{_ADAPTER}: expected a langchain_core BaseTool, got {type(tool).__name__}")
    spec = calling.convert_to_openai_function(tool)
    async_only = getattr(tool, "func", True) is None and getattr(tool, "coroutine", None) is not None

    def function(args: dict[str, Any]) -> Any:
        from ..tooling._async import run_coroutine  # asyncio only once a call needs it

        try:
            if async_only:
                output = run_coroutine(lambda: tool.ainvoke(args))
            else:
                output = tool.invoke(args)
        except tools.ToolException as exc:
            raise ToolError(str(exc)) from None
        except Exception as exc:
            if is_validation_error(exc):
                raise ToolError(validation_message(exc)) from None
            raise
        return jsonable(output)

    return build(
        adapter=_ADAPTER,
        name=name,
        default_name=tool.name,
        function=function,
        description=tool.description,
        parameters=spec.get("parameters") or {"type": "object", "properties": {}},
        # LangChain keeps no output schema; the function's return annotation is one.
        returns=return_schema(getattr(tool, "func", None) or getattr(tool, "coroutine", None)),
        concurrency_safe=concurrency_safe,
        derived_concurrency_safe=None,
        requires_approval=requires_approval,
        derived_requires_approval=False,
        category=category,
        throttles=throttles,
        bound=bound,
        callers=callers,
    )


def __getattr__(name: str) -> Any:
    if name == "CodeModeMiddleware":
        require("langchain.agents.middleware", "langchain", name)
        from . import _langchain_code_mode

        return _langchain_code_mode.CodeModeMiddleware
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

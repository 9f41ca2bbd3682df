"""LangChain tools (``langchain_core.tools.BaseTool``: ``@tool`` functions, ``StructuredTool``, subclasses).

The parameters are the JSON Schema LangChain itself sends a model
(``convert_to_openai_function``); a call goes through the tool's own
``invoke``, so its argument parsing, callbacks and error handling all apply.
A tool that only has a coroutine runs it with ``ainvoke`` on the tool's
thread. A ``ToolException`` or a pydantic validation error becomes a
:class:`~nous_sched.ToolError` with its message. LangChain has no flag for
concurrency or approval: the defaults are exclusive and no approval. The
return annotation of the tool's function (``-> int``) becomes ``returns``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from .._pydantic import is_validation_error, jsonable, validation_message
from ..errors import ConfigError, ToolError
from ..throttle import Throttle
from ..tool import Tool
from ._common import Predicate, build, require, return_schema

__all__ = ["from_langchain"]

_ADAPTER = "from_langchain"


def from_langchain(
    tool: Any,
    *,
    name: Optional[str] = None,
    concurrency_safe: Predicate = None,
    requires_approval: Optional[bool] = None,
    category: str = "read",
    throttles: Sequence[Throttle] = (),
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
        from .._async import run_coroutine  # asyncio only once a call needs it

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
    )

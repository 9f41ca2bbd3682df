"""LlamaIndex tools (``llama_index.core.tools``: ``FunctionTool`` and other ``BaseTool`` subclasses).

The parameters are the tool's ``metadata.get_parameters_dict()``, what
LlamaIndex sends a model. A call passes the arguments as keywords to the
tool's ``call`` (``acall`` on the tool's thread for an async function). The
result is the tool output's ``raw_output`` as JSON where it has a JSON form,
else its text ``content``; an output marked ``is_error`` becomes a
:class:`~nous_sched.ToolError`. LlamaIndex has no flag for concurrency or
approval: the defaults are exclusive and no approval. A tool that needs a
workflow ``Context`` cannot get one here and is refused.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional, Sequence

from ..errors import ConfigError, ToolError
from ..throttle import Throttle
from ..tooling import Tool
from ..tooling._pydantic import is_validation_error, jsonable, validation_message
from ._common import Predicate, build, require

__all__ = ["from_llamaindex"]

_ADAPTER = "from_llamaindex"


def from_llamaindex(
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
    """A :class:`~nous_sched.Tool` that runs the LlamaIndex tool ``tool``.

    :raises ConfigError: ``llama-index-core`` is not installed (``pip install -e
        '.[llamaindex]'``), ``tool`` is not a LlamaIndex tool, or it
        needs a workflow ``Context``.
    """
    types = require("llama_index.core.tools.types", "llamaindex", _ADAPTER)
    if not isinstance(tool, types.BaseTool):
        raise ConfigError(f"{_ADAPTER}: expected a llama_index.core BaseTool, got {type(tool).__name__}")
    metadata = tool.metadata
    if getattr(tool, "requires_context", False):
        raise ConfigError(
            f"{_ADAPTER}: tool {metadata.name!r} takes a workflow Context, which only a LlamaIndex workflow "
            "can supply; wrap a function without it"
        )
    is_async = inspect.iscoroutinefunction(getattr(tool, "real_fn", None)) and isinstance(tool, types.AsyncBaseTool)

    def function(args: dict[str, Any]) -> Any:
        from ..tooling._async import run_coroutine  # asyncio only once a call needs it

        try:
            output = run_coroutine(lambda: tool.acall(**args)) if is_async else tool(**args)
        except Exception as exc:
            if is_validation_error(exc):
                raise ToolError(validation_message(exc)) from None
            raise
        if getattr(output, "is_error", False):
            raise ToolError(str(output.content))
        value = jsonable(output.raw_output)
        return value if _is_json_shaped(value) else output.content

    return build(
        adapter=_ADAPTER,
        name=name,
        default_name=metadata.name,
        function=function,
        description=metadata.description,
        parameters=metadata.get_parameters_dict(),
        returns=None,
        concurrency_safe=concurrency_safe,
        derived_concurrency_safe=None,
        requires_approval=requires_approval,
        derived_requires_approval=False,
        category=category,
        throttles=throttles,
        bound=bound,
        callers=callers,
    )


def _is_json_shaped(value: Any) -> bool:
    from ..crossing import snapshot
    from ..errors import SnapshotError

    try:
        snapshot(value)
    except SnapshotError:
        return False
    return True

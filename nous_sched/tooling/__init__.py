"""What a tool is, and a tool made from a Python function.

:class:`Tool` and :func:`concurrency_mode` (``_tool.py``); :func:`function_tool`
(``_function_tool.py``: the hints, the docstring through ``_docstring.py``,
pydantic through ``_pydantic.py`` when installed, ``async`` functions
through ``_async.py``). ``Tool``, ``PARALLEL``, ``EXCLUSIVE``, ``concurrency_mode`` and
``function_tool`` are also ``nous_sched.<name>``; the rest are this package's door for the library's other packages (the
adapters build tools with them, the MCP spec converts its throttles); ``_bound.py``: bound
arguments (:class:`Bind`, what a caller sees, what the tool gets).
"""

from ._bound import (
    BOUND_MARKER,
    MIN_REDACTED_CHARS,
    Bind,
    caller_parameters,
    marked,
    missing_binds,
    passed_bound,
    redact,
    secrets_of,
    with_bound,
)
from ._function_tool import always_safe, function_tool, no_return_type, stdlib_schema
from ._tool import (
    CALLERS,
    EXCLUSIVE,
    NO_PREDICATE,
    PARALLEL,
    PREDICATE_SAID_NO,
    THROTTLES,
    Mode,
    Tool,
    as_throttles,
    concurrency_mode,
    exclusive_reason,
)

__all__ = [
    "EXCLUSIVE",
    "Mode",
    "NO_PREDICATE",
    "PARALLEL",
    "PREDICATE_SAID_NO",
    "THROTTLES",
    "Tool",
    "always_safe",
    "as_throttles",
    "concurrency_mode",
    "BOUND_MARKER",
    "MIN_REDACTED_CHARS",
    "Bind",
    "CALLERS",
    "caller_parameters",
    "marked",
    "missing_binds",
    "passed_bound",
    "redact",
    "secrets_of",
    "with_bound",
    "exclusive_reason",
    "function_tool",
    "no_return_type",
    "stdlib_schema",
]

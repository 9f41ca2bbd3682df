"""What a tool is, and a tool made from a Python function.

:class:`Tool` and :func:`concurrency_mode` (``_tool.py``); :func:`function_tool`
(``_function_tool.py``: the hints, the docstring through ``_docstring.py``,
pydantic through ``_pydantic.py`` when installed, ``async`` functions
through ``_async.py``). Every name here is also ``nous_sched.<name>``.
"""

from ._function_tool import function_tool
from ._tool import (
    EXCLUSIVE,
    NO_PREDICATE,
    PARALLEL,
    PREDICATE_SAID_NO,
    THROTTLES,
    Mode,
    Tool,
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
    "concurrency_mode",
    "exclusive_reason",
    "function_tool",
]

"""The SDK a program reads, and the answers to what it asks about tools.

:func:`render` writes the declarations (TypeScript or Python) within a
budget, by :data:`STEPS` (``_steps.py``; the declarations themselves:
``_render.py``); :class:`ToolIndex` describes and searches a tool set
(``_tool_search.py``: BM25F ranking by words; ``_tool_groups.py``: names
grouped by namespace or prefix); ``discovery.py`` answers a program's
``sdk.describe``/``sdk.search`` and names the closest tools to an unknown one.
"""

from ._render import (
    DEFAULT_BUDGET,
    DISCOVERY_GLOBAL,
    ERROR_CLASS,
    GLOBAL,
    MAX_QUERY_CHARS,
    MAX_QUERY_WORDS,
    MIN_BUDGET,
    SEARCH_ARG_CHARS,
    SEARCH_ARGS,
    STEPS,
    ToolIndex,
    coerce_language,
    json_schema_to_type,
    languages,
)
from ._steps import BUDGET_RULE, RANKED_NAMES, RANKING_RULE, fitted, render, step_of

__all__ = [
    "BUDGET_RULE",
    "DEFAULT_BUDGET",
    "DISCOVERY_GLOBAL",
    "ERROR_CLASS",
    "GLOBAL",
    "MAX_QUERY_CHARS",
    "MAX_QUERY_WORDS",
    "MIN_BUDGET",
    "RANKED_NAMES",
    "RANKING_RULE",
    "SEARCH_ARG_CHARS",
    "SEARCH_ARGS",
    "STEPS",
    "ToolIndex",
    "coerce_language",
    "fitted",
    "json_schema_to_type",
    "languages",
    "render",
    "step_of",
]

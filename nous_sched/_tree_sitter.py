"""The one tree-sitter TypeScript parser of a process (the ``typescript`` and ``review`` extras' parser).

The TypeScript stripper (``runtime/_typescript.py``) and the review's static
summary (``review/_summary.py``) both read programs with tree-sitter's
TypeScript grammar. tree-sitter's ``Parser`` and ``QueryCursor`` are not
safe to share between threads, and building them costs (the grammar is
loaded, each query compiled), so this module builds them once, on first use
(most plain JavaScript programs never need them), and :func:`parse` uses
them under one lock: runs start, and reviews are made, on many threads at
once. The trees it returns are read by the callers without the lock (a
tree is not shared with the parser).
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["parse"]

_LOCK = threading.Lock()  # guards _parser and _cursors, and every use of them
_parser: Any = None
_cursors: dict[str, Any] = {}  # a query's source -> its cursor


def parse(data: bytes, query: str) -> tuple[Any, dict[str, list[Any]]]:
    """The tree of ``data`` (UTF-8 TypeScript, or JavaScript) and the captures of ``query`` (a
    tree-sitter query's source, compiled once) in it, by capture name. Thread-safe."""
    global _parser
    with _LOCK:
        if _parser is None:
            import tree_sitter
            import tree_sitter_typescript

            _parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_typescript.language_typescript()))
        cursor = _cursors.get(query)
        if cursor is None:
            import tree_sitter

            cursor = _cursors[query] = tree_sitter.QueryCursor(tree_sitter.Query(_parser.language, query))
        root = _parser.parse(data).root_node
        return root, dict(cursor.captures(root))

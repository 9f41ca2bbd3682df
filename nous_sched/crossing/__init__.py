"""What may cross between a program, the scheduler and a tool: the snapshot rules.

Every value and JSON text that crosses obeys one set of rules (no NaN or
Infinity, safe integers, depth 200): :func:`snapshot` copies a value,
:func:`loads` parses a text, :func:`check` checks a parsed value,
:func:`dumps` and :func:`snapshot_text` write a result's one JSON text,
:func:`text_bytes` its UTF-8 bytes as a model reads them, and
:func:`describe_path` is the one spelling of a path in any message
(``_snapshot.py``; ``_fastjson.py``: the same answers through ``orjson``
when it is installed). ``nous_sched.snapshot`` is the function.
"""

from ._snapshot import (
    MAX_DEPTH,
    MAX_SAFE_INTEGER,
    check,
    describe_path,
    dumps,
    loads,
    safe_int,
    snapshot,
    snapshot_text,
    text_bytes,
)

__all__ = [
    "MAX_DEPTH",
    "MAX_SAFE_INTEGER",
    "check",
    "describe_path",
    "dumps",
    "loads",
    "safe_int",
    "snapshot",
    "snapshot_text",
    "text_bytes",
]

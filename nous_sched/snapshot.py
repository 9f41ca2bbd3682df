"""JSON-shaped snapshots of values that cross the scheduler.

Every sub-call's arguments are snapshotted twice at submission (one copy is
dispatched to the tool, one is written to the audit log) and every tool result
once, so neither a tool nor a program can reach the other side through a live
object, and the audit record cannot drift from what ran.

The rules, applied recursively; the output shares no container with the input:

==========================================  ===========================================
input                                       snapshot
==========================================  ===========================================
``None``, ``bool``, ``int``, ``str``        itself
finite ``float``                            itself
``dict`` / any ``Mapping``                  a new ``dict``; ``str`` keys kept, ``int``,
                                            ``float``, ``bool`` and ``None`` keys
                                            spelled as JSON spells them (``1`` →
                                            ``"1"``, ``True`` → ``"true"``); two keys
                                            that spell the same are refused
``list``, ``tuple``                         a new ``list``
``set``, ``frozenset``                      a ``list`` sorted by each element's JSON
                                            text, so the order is reproducible
``enum.Enum``                               the snapshot of its ``.value``
``datetime``, ``date``, ``time``            ``isoformat()``
``uuid.UUID``, ``pathlib.PurePath``         ``str(value)``
==========================================  ===========================================

Everything else is refused with :class:`~nous_sched.errors.SnapshotError`,
whose message names the path (``$.items[2].when``) and the type: NaN and the
infinities (JSON cannot spell them, and ``null`` would change their meaning),
``bytes`` (decode or base64 them first: which is the tool's choice), other key
types, functions, arbitrary objects, cycles, and nesting deeper than
:data:`MAX_DEPTH`. Refusing is deliberate: a ``repr`` string would leak
addresses and type names into a program, and silently dropping a value would
make the audit record lie.
"""

from __future__ import annotations

import datetime
import enum
import json
import math
import pathlib
import uuid
from collections.abc import Mapping
from typing import Any

from .errors import SnapshotError

__all__ = ["snapshot", "MAX_DEPTH"]

MAX_DEPTH = 200

_AS_STR = (uuid.UUID, pathlib.PurePath)
_ISO = (datetime.datetime, datetime.date, datetime.time)


def snapshot(value: Any) -> Any:
    """Return an independent JSON-shaped copy of ``value`` (rules above).

    Raises :class:`SnapshotError` naming the path of the first value that has
    no JSON form. Thread-safe: it only reads ``value``.
    """
    return _snap(value, "$", 0, set())


def _snap(value: Any, path: str, depth: int, active: set[int]) -> Any:
    # Exact-type fast path first: almost every value that crosses is one of these.
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        if math.isfinite(value):
            return value
        raise SnapshotError(f"{path}: {value!r} is not JSON (JSON has no NaN or Infinity)")
    if depth >= MAX_DEPTH:
        raise SnapshotError(f"{path}: nested deeper than {MAX_DEPTH} levels")
    if kind is dict or kind is list or kind is tuple or isinstance(value, (Mapping, list, tuple, set, frozenset)):
        marker = id(value)
        if marker in active:
            raise SnapshotError(f"{path}: cyclic reference (a container that contains itself)")
        active.add(marker)
        try:
            return _container(value, path, depth + 1, active)
        finally:
            active.discard(marker)
    if isinstance(value, enum.Enum):
        return _snap(value.value, path, depth + 1, active)
    # Subclasses are copied down to the base type, by content: an overridden
    # __str__ or __int__ must not change what the tool or the log sees.
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, float):
        return _snap(float(value), path, depth, active)
    if isinstance(value, _ISO):
        return value.isoformat()
    if isinstance(value, _AS_STR):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raise SnapshotError(f"{path}: bytes are not JSON; decode them to str or base64-encode them first")
    raise SnapshotError(f"{path}: a value of type {kind.__name__} is not JSON")


def _container(value: Any, path: str, depth: int, active: set[int]) -> Any:
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            name = _key(key, path)
            if name in out:
                raise SnapshotError(f"{path}: two keys both spell {name!r} in JSON (e.g. 1 and '1'); keep one")
            out[name] = _snap(item, f"{path}.{name}" if name.isidentifier() else f"{path}[{name!r}]", depth, active)
        return out
    if isinstance(value, (set, frozenset)):
        items = [_snap(item, f"{path}[*]", depth, active) for item in value]
        return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))
    return [_snap(item, f"{path}[{i}]", depth, active) for i, item in enumerate(value)]


def _key(key: Any, path: str) -> str:
    if isinstance(key, enum.Enum):  # before str: a (str, Enum) key is its value, as it is as a value
        key = key.value
    if isinstance(key, str):
        return str.__str__(key)
    if key is None or isinstance(key, (bool, int)) or (isinstance(key, float) and math.isfinite(key)):
        return json.dumps(key)
    raise SnapshotError(f"{path}: a key of type {type(key).__name__} is not JSON (keys must be strings)")

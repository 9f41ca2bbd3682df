"""JSON-shaped snapshots of values that cross the scheduler.

Every sub-call's arguments are snapshotted twice at submission (one copy is
dispatched to the tool, one is written to the audit log) and every tool result
once, so neither a tool nor a program can reach the other side through a live
object, and the audit record cannot drift from what ran.

The rules, applied recursively; the output shares no container with the input:

==========================================  ===========================================
input                                       snapshot
==========================================  ===========================================
``None``, ``bool``, ``str``                 itself
``int`` within ±(2**53 - 1)                 itself (JavaScript's safe integers)
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
integers beyond ±(2**53 - 1), JavaScript's safe integers (a program's numbers
are doubles: ``2**53 + 1`` would arrive as ``2**53``, a 5000-digit int as
``Infinity``, and a program's ``2**60`` is written ``1152921504606847000``,
which is not ``2**60``; send such a number as a string, or as a float when
an approximation will do), ``bytes`` (decode or
base64 them first: which is the tool's choice), other key types, functions,
arbitrary objects, cycles, and nesting deeper than :data:`MAX_DEPTH`.
Refusing is deliberate: a ``repr`` string would leak addresses and type names
into a program, and silently dropping a value would make the audit record lie.

**JSON text** that crosses (a program's arguments, its result) is parsed by
:func:`loads` under the same rules, whatever the text holds: ``1e400``
(which Python reads as ``inf``), ``NaN``, a 5000-digit integer or nesting
a thousand levels deep are a :class:`SnapshotError`, never a ``ValueError``
or a ``RecursionError``. :func:`check` applies the rules to a value that is
already JSON-shaped (what ``json.loads`` returns), without copying it: a
fast path that parses JSON text itself must pass its value through
:func:`check` (or parse with :func:`loads`).

These are the only refusal rules; every crossing, in either direction, goes
through one of these three functions.
"""

from __future__ import annotations

import datetime
import enum
import json
import math
import pathlib
import uuid
from collections.abc import Mapping
from typing import Any, Optional

from .errors import SnapshotError

__all__ = ["snapshot", "loads", "check", "MAX_DEPTH", "MAX_SAFE_INTEGER", "safe_int"]

MAX_DEPTH = 200

_AS_STR = (uuid.UUID, pathlib.PurePath)
_ISO = (datetime.datetime, datetime.date, datetime.time)


#: The largest int that crosses: JavaScript's ``Number.MAX_SAFE_INTEGER``,
#: past which two ints share one double.
MAX_SAFE_INTEGER = 2**53 - 1
#: What a refusal message shows of a path at most: a path a thousand levels
#: deep would otherwise make the message itself unbounded.
_MAX_PATH = 160


def safe_int(value: int) -> bool:
    """True when ``value`` is within ±``MAX_SAFE_INTEGER``, so it crosses to JavaScript and back unchanged."""
    return -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER


def snapshot(value: Any) -> Any:
    """Return an independent JSON-shaped copy of ``value`` (rules above).

    Raises :class:`SnapshotError` naming the path of the first value that has
    no JSON form; never another exception for the value's shape (not even
    ``RecursionError``). Thread-safe: it only reads ``value``.
    """
    try:
        return _fast(value, 0)
    except (_Slow, RecursionError):
        pass  # the full walk below copies it, or names the path of what it refuses
    try:
        return _snap(value, "$", 0, set())
    except RecursionError:  # a deep value met an already deep stack: still the value's fault
        raise SnapshotError(f"$: nested too deep to copy (the limit is {MAX_DEPTH} levels)") from None


def loads(text: str) -> Any:
    """Parse JSON ``text`` under the rules above: the value, or :class:`SnapshotError`.

    Refuses what ``json.loads`` alone would let through (``1e400`` as ``inf``,
    ``NaN``, ``Infinity``, unsafe integers, nesting past :data:`MAX_DEPTH`)
    and turns what it would raise (a ``ValueError`` for a 5000-digit integer
    or bad text, a ``RecursionError`` for deep nesting) into the same error.
    Thread-safe.
    """
    try:
        value = _decode(text)
    except RecursionError:
        raise SnapshotError(f"$: nested deeper than {MAX_DEPTH} levels") from None
    except _Constant as exc:
        raise SnapshotError(f"$: {exc.args[0]} is not JSON (JSON has no NaN or Infinity)") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):  # CPython's digit limit for int()
            raise SnapshotError(f"$: an integer with thousands of digits {_INEXACT}") from None
        raise SnapshotError(f"not valid JSON ({exc})") from None
    check(value)
    return value


def check(value: Any) -> None:
    """Raise :class:`SnapshotError` unless the JSON-shaped ``value`` obeys the rules above.

    ``value`` is what ``json.loads`` returns (dicts, lists, str, int, float,
    bool, None); nothing is copied. The message names the path.
    """
    try:
        _fast_check(value, 0)
        return
    except (_Slow, RecursionError):
        pass
    bad = _check(value, 0)
    if bad is not None:
        where, why = bad
        raise SnapshotError(f"{_show_path('$' + ''.join(reversed(where)))}: {why}")


class _Constant(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _Constant(name)


_decode = json.JSONDecoder(parse_constant=_refuse_constant).decode
_INEXACT = (
    "cannot cross exactly: a program's numbers are doubles, whose safe integers end at "
    "±(2**53 - 1); send it as a string"
)


def _check(value: Any, depth: int) -> Optional[tuple[list[str], str]]:
    # Returns (path parts, innermost first; why) for the first bad value: the
    # path is only built on the way back up from a refusal.
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return None
    if kind is int:
        return (
            None
            if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER
            else ([], f"the integer {_show_int(value)} {_INEXACT}")
        )
    if kind is float:
        return None if math.isfinite(value) else ([], f"{value!r} is not JSON (JSON has no NaN or Infinity)")
    if depth >= MAX_DEPTH:
        return ([], f"nested deeper than {MAX_DEPTH} levels")
    if kind is dict:
        for key, item in value.items():
            if type(item) is str:
                continue
            bad = _check(item, depth + 1)
            if bad is not None:
                bad[0].append(f".{key}" if key.isidentifier() else f"[{key!r}]")
                return bad
        return None
    if kind is list:
        for i, item in enumerate(value):
            if type(item) is str:
                continue
            bad = _check(item, depth + 1)
            if bad is not None:
                bad[0].append(f"[{i}]")
                return bad
        return None
    return ([], f"a value of type {kind.__name__} is not JSON")


def _show_int(value: int) -> str:
    digits = abs(value).bit_length() * 30103 // 100000 + 1  # about log10(2) per bit
    if digits <= 40:
        return str(value)
    return f"of about {digits} digits"


def _show_path(path: str) -> str:
    if len(path) <= _MAX_PATH:
        return path
    return path[: _MAX_PATH // 2] + " … " + path[-_MAX_PATH // 2 :]


class _Slow(Exception):
    """The fast path met something only the full walk may judge."""


_SLOW = _Slow()
_isfinite = math.isfinite


def _fast(value: Any, depth: int) -> Any:
    # The common shapes (exact dicts with str keys, lists, tuples, and plain
    # scalars), copied with no path kept and no cycle set: anything else, and
    # anything the rules would refuse, is _Slow, and the full walk (_snap)
    # starts over, to copy it or to name the path of what it refuses. Nesting
    # is bounded by MAX_DEPTH here too, so a cycle ends as _Slow.
    kind = type(value)
    if kind is dict:
        if depth >= MAX_DEPTH:
            raise _SLOW
        depth += 1
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _SLOW
            kind = type(item)
            if kind is str or kind is bool or item is None:
                out[key] = item
            elif kind is int:
                if not -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                    raise _SLOW
                out[key] = item
            elif kind is float:
                if not _isfinite(item):
                    raise _SLOW
                out[key] = item
            else:
                out[key] = _fast(item, depth)
        return out
    if kind is list or kind is tuple:
        if depth >= MAX_DEPTH:
            raise _SLOW
        depth += 1
        items: list[Any] = []
        append = items.append
        for item in value:
            kind = type(item)
            if kind is str or kind is bool or item is None:
                append(item)
            elif kind is int:
                if not -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                    raise _SLOW
                append(item)
            elif kind is float:
                if not _isfinite(item):
                    raise _SLOW
                append(item)
            else:
                append(_fast(item, depth))
        return items
    if kind is str or kind is bool or value is None:
        return value
    if kind is int and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        return value
    if kind is float and _isfinite(value):
        return value
    raise _SLOW


def _fast_check(value: Any, depth: int) -> None:
    # check()'s fast path, as _fast is snapshot()'s: parsed JSON's exact types,
    # scalars inline; anything the rules would refuse is _Slow, and _check
    # walks again to name the path.
    kind = type(value)
    if kind is dict:
        items: Any = value.values()
    elif kind is list:
        items = value
    else:
        if not (
            kind is str
            or kind is bool
            or value is None
            or (kind is int and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER)
            or (kind is float and _isfinite(value))
        ):
            raise _SLOW
        return
    if depth >= MAX_DEPTH:
        raise _SLOW
    depth += 1
    for item in items:
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is int:
            if not -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                raise _SLOW
        elif kind is float:
            if not _isfinite(item):
                raise _SLOW
        else:
            _fast_check(item, depth)


def _snap(value: Any, path: str, depth: int, active: set[int]) -> Any:
    # Exact-type fast path first: almost every value that crosses is one of these.
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return value
        raise SnapshotError(f"{_show_path(path)}: the integer {_show_int(value)} {_INEXACT}")
    if kind is float:
        if math.isfinite(value):
            return value
        raise SnapshotError(f"{_show_path(path)}: {value!r} is not JSON (JSON has no NaN or Infinity)")
    if depth >= MAX_DEPTH:
        raise SnapshotError(f"{_show_path(path)}: nested deeper than {MAX_DEPTH} levels")
    if kind is dict or kind is list or kind is tuple or isinstance(value, (Mapping, list, tuple, set, frozenset)):
        marker = id(value)
        if marker in active:
            raise SnapshotError(f"{_show_path(path)}: cyclic reference (a container that contains itself)")
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
        return _snap(int.__int__(value), path, depth, active)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, float):
        return _snap(float(value), path, depth, active)
    if isinstance(value, _ISO):
        return value.isoformat()
    if isinstance(value, _AS_STR):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raise SnapshotError(f"{_show_path(path)}: bytes are not JSON; decode them to str or base64-encode them first")
    raise SnapshotError(f"{_show_path(path)}: a value of type {kind.__name__} is not JSON")


def _container(value: Any, path: str, depth: int, active: set[int]) -> Any:
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            name = _key(key, path)
            if name in out:
                raise SnapshotError(
                    f"{_show_path(path)}: two keys both spell {name!r} in JSON (e.g. 1 and '1'); keep one"
                )
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
    raise SnapshotError(f"{_show_path(path)}: a key of type {type(key).__name__} is not JSON (keys must be strings)")

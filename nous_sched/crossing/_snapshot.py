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
whose message names the path (``$.items[2].when``, ``$["odd key"]``: the
spelling :func:`describe_path` gives every message, schema errors' too) and the type: NaN and the
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
through one of these three functions (or :func:`snapshot_text`, which is
:func:`snapshot` with the copy's JSON text, :func:`dumps`, the one spelling
in which a value crosses to a program).

**Where the rules live.** One walk (``_walk``) applies them, driven by one
table of what may cross per function (``_SNAPSHOT``: what :func:`snapshot`
copies; ``_JSON``: the strict subset :func:`check` accepts): a rule per exact
type, then ``_BY_KIND`` for subclasses and the types that are converted. The
scalars that cross as themselves (``str``, ``bool``, ``None``, safe ``int``,
finite ``float``) are the one test written inline where the walk meets an
item (a function call per item would cost a third of the walk). Paths are
built only on the way back up from a refusal, and a cycle is found only then,
on the refused path (a cycle always ends as nesting too deep), so a value
that crosses pays for neither. :func:`check` has one fast path, ``_obeys``,
which copies nothing and only answers "obeys" or "ask the walk";
``tests/test_hot_path.py`` pins it to the walk by a property test. With
``orjson`` installed (the ``speed`` extra), :func:`snapshot_text` and
:func:`loads` first ask ``_fastjson``, which answers as the walk would or
leaves the value to it; ``tests/test_fast_json.py`` pins both, with
``orjson`` and with it hidden.
"""

from __future__ import annotations

import datetime
import enum
import json
import json.encoder
import math
import pathlib
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Optional, Union

from ..errors import SnapshotError
from . import _fastjson

__all__ = [
    "snapshot",
    "snapshot_text",
    "dumps",
    "text_bytes",
    "loads",
    "check",
    "describe_path",
    "MAX_DEPTH",
    "MAX_SAFE_INTEGER",
    "safe_int",
]

MAX_DEPTH = 200

#: The largest int that crosses: JavaScript's ``Number.MAX_SAFE_INTEGER``,
#: past which two ints share one double.
MAX_SAFE_INTEGER = 2**53 - 1
#: What a refusal message shows of a path at most: a path a thousand levels
#: deep would otherwise make the message itself unbounded.
_MAX_PATH = 160

_M = MAX_SAFE_INTEGER  # short, for the inline tests in the walk's loops
_isfinite = math.isfinite


def safe_int(value: int) -> bool:
    """True when ``value`` is within ±``MAX_SAFE_INTEGER``, so it crosses to JavaScript and back unchanged."""
    return -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER


def describe_path(parts: Iterable[Union[str, int]]) -> str:
    """The path of a value inside a JSON value, as a program writes it: ``$.items[2]["odd key"]``.

    ``parts`` are the keys (``str``) and indexes (``int``) from the root down.
    This is the one spelling of a path: a snapshot refusal and a schema error
    name the same place the same way.
    """
    return "$" + "".join(map(_step, parts))


def _step(part: Union[str, int]) -> str:
    if isinstance(part, int):
        return f"[{part}]"
    if part.isidentifier() and part.isascii():
        return f".{part}"
    return f"[{json.dumps(part, ensure_ascii=False)}]"


def snapshot(value: Any) -> Any:
    """Return an independent JSON-shaped copy of ``value`` (rules above).

    Raises :class:`SnapshotError` naming the path of the first value that has
    no JSON form; never another exception for the value's shape (not even
    ``RecursionError``). Thread-safe: it only reads ``value``.
    """
    try:
        # Straight to the rule of the value's type (one call fewer for a small value); _walk for the rest.
        return _SNAPSHOT.get(type(value), _walk)(value, 0, _SNAPSHOT)
    except _Refused as refused:
        raise SnapshotError(refused.message()) from None
    except RecursionError:  # a deep value met an already deep stack: still the value's fault
        raise SnapshotError(f"$: nested too deep to copy (the limit is {MAX_DEPTH} levels)") from None


def snapshot_text(value: Any) -> tuple[Any, str, int]:
    """:func:`snapshot` of ``value``, with its JSON text: ``(copy, text, size)``.

    ``text`` is :func:`dumps` of the copy, what a program receives; ``size``
    is the UTF-8 size of the same text with nothing escaped
    (``ensure_ascii=False``), what the audit records. Raises as
    :func:`snapshot` does. With ``orjson`` installed (the ``speed`` extra)
    the three come from one encode, one parse and one comparison with
    ``value``, all in C, and are the same as without it (``_fastjson``);
    without it, from the walk and one encode. Thread-safe: it only reads ``value``.
    """
    # A tool that returns nothing (or a flag), the commonest result: its triple is a constant.
    if value is None:
        return None, "null", 4
    if value is True:
        return True, "true", 4
    if value is False:
        return False, "false", 5
    if type(value) is int and -_M <= value <= _M:  # a count or an id: crosses as itself, spelled as JSON spells it
        text = int.__repr__(value)
        return value, text, len(text)
    fast = _fastjson.encode(value, dumps)
    if fast is not _fastjson.UNSURE:
        return fast  # type: ignore[no-any-return]
    copy = snapshot(value)
    text = dumps(copy)
    if "\\u" not in text:  # nothing was escaped to ASCII: the two spellings are one
        return copy, text, len(text)
    return copy, text, len(_dumps_unescaped(copy).encode("utf-8", "surrogatepass"))


def text_bytes(value: Any) -> int:
    """The UTF-8 bytes of ``json.dumps(value, ensure_ascii=False)``, a lone
    surrogate counted as its 6-byte ``\\udXXX`` escape: the size of the text a
    model reads, in the output budget's unit (``nous_sched.result.budget.size``),
    for a ``value`` that obeys the rules above (what :func:`loads` returns,
    in dicts and lists of one's own). With ``orjson`` installed it is counted
    on orjson's UTF-8 text (``_fastjson``), with the same answer."""
    fast = _fastjson.spaced_bytes(value)
    if fast is not _fastjson.UNSURE:
        return fast  # type: ignore[no-any-return]
    text = json.dumps(value, ensure_ascii=False)
    return len(text) if text.isascii() else len(text.encode("utf-8", "backslashreplace"))


def _compact_encoder(ensure_ascii: bool) -> Callable[[Any], str]:
    # The C encoder made once (JSONEncoder.encode builds one per call), compact,
    # refusing NaN and Infinity, no cycle check: it only ever encodes a snapshot.
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has it
        return json.JSONEncoder(
            ensure_ascii=ensure_ascii, allow_nan=False, separators=(",", ":"), check_circular=False
        ).encode
    spell = json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring
    chunks = make(None, None, spell, None, ":", ",", False, False, False)
    join = "".join

    def encode(value: Any) -> str:
        return join(chunks(value, 0))

    return encode


#: ``dumps(snapshot)``: its compact ASCII JSON text, the one spelling in which a
#: value crosses to a program (non-ASCII, lone surrogates, NUL and DEL
#: escaped), as ``runtime/engine.py`` writes it too (a test pins the two).
dumps = _compact_encoder(ensure_ascii=True)
_dumps_unescaped = _compact_encoder(ensure_ascii=False)


def loads(text: str) -> Any:
    """Parse JSON ``text`` under the rules above: the value, or :class:`SnapshotError`.

    Refuses what ``json.loads`` alone would let through (``1e400`` as ``inf``,
    ``NaN``, ``Infinity``, unsafe integers, nesting past :data:`MAX_DEPTH`)
    and turns what it would raise (a ``ValueError`` for a 5000-digit integer
    or bad text, a ``RecursionError`` for deep nesting) into the same error.
    Thread-safe. With ``orjson`` installed (the ``speed`` extra) most texts
    are parsed by it instead, with the same result (``_fastjson``).
    """
    if type(text) is str:
        fast = _fastjson.parse(text)
        if fast is not _fastjson.UNSURE:
            return fast
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
        if _obeys(value, 0):
            return
    except RecursionError:
        pass  # the walk below names the path, or says the value is too deep
    try:
        _walk(value, 0, _JSON)
    except _Refused as refused:
        raise SnapshotError(refused.message()) from None
    except RecursionError:
        raise SnapshotError(f"$: nested too deep to check (the limit is {MAX_DEPTH} levels)") from None


class _Constant(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _Constant(name)


_decode = json.JSONDecoder(parse_constant=_refuse_constant).decode
_INEXACT = (
    "cannot cross exactly: a program's numbers are doubles, whose safe integers end at "
    "±(2**53 - 1); send it as a string"
)
_CYCLE = "cyclic reference (a container that contains itself)"


# --- the walk ------------------------------------------------------------------------------


class _Refused(Exception):
    """A value the rules refuse. The path is built on the way back up, innermost part first.

    ``trail`` holds the value at each level of a refusal for nesting (the
    refused container first): a cycle is one container met twice on it.
    """

    def __init__(self, why: str, deep: Any = None) -> None:
        super().__init__(why)
        self.why = why
        self.parts: list[str] = []
        self.trail: Optional[list[Any]] = None if deep is None else [deep]

    def at(self, part: str, container: Any) -> _Refused:
        self.parts.append(part)
        if self.trail is not None:
            self.trail.append(container)
        return self

    def message(self) -> str:
        parts, why = self.parts[::-1], self.why
        if self.trail is not None:
            cut = _first_repeat(self.trail[::-1])
            if cut is not None:
                parts, why = parts[:cut], _CYCLE
        return f"{_show_path('$' + ''.join(parts))}: {why}"


def _first_repeat(values: list[Any]) -> Optional[int]:
    seen: set[int] = set()
    for i, value in enumerate(values):
        if id(value) in seen:
            return i
        seen.add(id(value))
    return None


_Rule = Callable[[Any, int, "_Table"], Any]


class _Table(dict[type, _Rule]):
    """A table of what may cross: a rule per exact type, and ``other`` for every type it does not name."""

    def __init__(self, rules: dict[type, _Rule], other: _Rule) -> None:
        super().__init__(rules)
        self.other = other

    def __missing__(self, kind: type) -> _Rule:
        return self.other


def _walk(value: Any, depth: int, rules: _Table) -> Any:
    kind = type(value)
    # As themselves (the first rows of the table): tested inline here and in both loops.
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        if -_M <= value <= _M:
            return value
        raise _Refused(f"the integer {_show_int(value)} {_INEXACT}")
    if kind is float:
        if _isfinite(value):
            return value
        raise _Refused(f"{value!r} is not JSON (JSON has no NaN or Infinity)")
    return rules[kind](value, depth, rules)


def _deeper(value: Any, depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise _Refused(f"nested deeper than {MAX_DEPTH} levels", value)


def _object(value: dict[Any, Any], depth: int, rules: _Table) -> Any:
    # An exact dict: an item whose key is a str and whose value crosses as
    # itself costs one inline test; anything else goes through the table.
    if depth >= MAX_DEPTH:  # inline: this walk's hottest call
        _deeper(value, depth)
    out = {}
    for key, item in value.items():
        if type(key) is not str:
            return _mapping(value, depth, rules)  # keys to spell as JSON: start over, checking each
        kind = type(item)
        if (
            kind is str
            or kind is bool
            or item is None
            or (kind is int and -_M <= item <= _M)
            or (kind is float and _isfinite(item))
        ):
            out[key] = item
            continue
        try:
            out[key] = rules[kind](item, depth + 1, rules)
        except _Refused as refused:
            raise refused.at(_step(key), value) from None
    return out


def _array(value: Any, depth: int, rules: _Table) -> list[Any]:
    # A list or a tuple (or a subclass of either): a new list, the same inline test per item.
    if depth >= MAX_DEPTH:  # inline: this walk's hottest call
        _deeper(value, depth)
    out: list[Any] = []
    append = out.append
    for item in value:
        kind = type(item)
        if (
            kind is str
            or kind is bool
            or item is None
            or (kind is int and -_M <= item <= _M)
            or (kind is float and _isfinite(item))
        ):
            append(item)
            continue
        try:
            append(rules[kind](item, depth + 1, rules))
        except _Refused as refused:
            raise refused.at(f"[{len(out)}]", value) from None  # every earlier item is in out
    return out


def _mapping(value: Mapping[Any, Any], depth: int, rules: _Table) -> dict[str, Any]:
    # Any Mapping, keys spelled as JSON spells them; two that spell the same are refused.
    _deeper(value, depth)
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = _key(key)
        if name in out:
            raise _Refused(f"two keys both spell {name!r} in JSON (e.g. 1 and '1'); keep one")
        try:
            out[name] = _walk(item, depth + 1, rules)
        except _Refused as refused:
            raise refused.at(_step(name), value) from None
    return out


def _set(value: Any, depth: int, rules: _Table) -> list[Any]:
    # Sorted by each element's JSON text, so the order is reproducible.
    _deeper(value, depth)
    items = []
    for item in value:
        try:
            items.append(_walk(item, depth + 1, rules))
        except _Refused as refused:
            raise refused.at("[*]", value) from None
    return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))


def _key(key: Any) -> str:
    if isinstance(key, enum.Enum):  # before str: a (str, Enum) key is its value, as it is as a value
        key = key.value
    if isinstance(key, str):
        return str.__str__(key)
    if key is None or isinstance(key, (bool, int)) or (isinstance(key, float) and math.isfinite(key)):
        return json.dumps(key)
    raise _Refused(f"a key of type {type(key).__name__} is not JSON (keys must be strings)")


def _enum(value: enum.Enum, depth: int, rules: _Table) -> Any:
    try:
        return _walk(value.value, depth + 1, rules)
    except _Refused as refused:
        raise refused.at("", value) from None  # the same path: the member stands for its value


def _bytes(value: Any, depth: int, rules: _Table) -> Any:
    raise _Refused("bytes are not JSON; decode them to str or base64-encode them first")


def _not_json(value: Any, depth: int, rules: _Table) -> Any:
    _deeper(value, depth)
    raise _Refused(f"a value of type {type(value).__name__} is not JSON")


# Subclasses are copied down to the base type, by content: an overridden
# __str__ or __int__ must not change what the tool or the log sees.
_BY_KIND: tuple[tuple[Any, _Rule], ...] = (
    (Mapping, _mapping),
    ((list, tuple), _array),
    ((set, frozenset), _set),
    (enum.Enum, _enum),
    (int, lambda value, depth, rules: _walk(int.__int__(value), depth, rules)),
    (str, lambda value, depth, rules: str.__str__(value)),
    (float, lambda value, depth, rules: _walk(float(value), depth, rules)),
    ((datetime.datetime, datetime.date, datetime.time), lambda value, depth, rules: value.isoformat()),
    ((uuid.UUID, pathlib.PurePath), lambda value, depth, rules: str(value)),
    ((bytes, bytearray, memoryview), _bytes),
)


def _by_kind(value: Any, depth: int, rules: _Table) -> Any:
    _deeper(value, depth)
    for kinds, rule in _BY_KIND:
        if isinstance(value, kinds):
            return rule(value, depth, rules)
    raise _Refused(f"a value of type {type(value).__name__} is not JSON")


#: What snapshot() copies: a rule per exact type (the scalars that cross as
#: themselves are _walk's first rows), then every other type by kind.
_SNAPSHOT = _Table(
    {int: _walk, float: _walk, dict: _object, list: _array, tuple: _array, set: _set, frozenset: _set},
    other=_by_kind,
)
#: What check() accepts: what json.loads returns, and nothing else.
_JSON = _Table({int: _walk, float: _walk, dict: _object, list: _array}, other=_not_json)


def _obeys(value: Any, depth: int) -> bool:
    # check()'s fast path: True when the parsed JSON value obeys the rules,
    # False when the walk must look (to name the path); it copies nothing.
    kind = type(value)
    if kind is dict:
        items: Iterable[Any] = value.values()
    elif kind is list:
        items = value
    else:
        return False  # a scalar at the top: the walk judges it, as cheaply
    if depth >= MAX_DEPTH:
        return False
    for item in items:
        kind = type(item)
        if (
            kind is str
            or kind is bool
            or item is None
            or (kind is int and -_M <= item <= _M)
            or (kind is float and _isfinite(item))
        ):
            continue
        if not _obeys(item, depth + 1):
            return False
    return True


def _show_int(value: int) -> str:
    digits = abs(value).bit_length() * 30103 // 100000 + 1  # about log10(2) per bit
    if digits <= 40:
        return str(value)
    return f"of about {digits} digits"


def _show_path(path: str) -> str:
    if len(path) <= _MAX_PATH:
        return path
    return path[: _MAX_PATH // 2] + " … " + path[-_MAX_PATH // 2 :]

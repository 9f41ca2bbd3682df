"""Private: the optional fast path of :mod:`nous_sched.crossing`, through ``orjson`` when it is installed.

``pip install -e '.[speed]'`` installs ``orjson``; it is imported on
first use, never at ``import nous_sched``. It changes no answer: each function
here returns what :mod:`nous_sched.crossing`'s own walk would, or
:data:`UNSURE`, and then the walk answers (refusals, with their paths, always
come from the walk). ``tests/test_fast_json.py`` pins both functions to the
walk by property tests, with ``orjson`` and with it hidden.

Why each answer is the walk's (orjson's rules are not the snapshot rules):

* **One encode, then proof.** A value is encoded once by orjson (in C,
  holding the GIL: a consistent snapshot, however the tool's threads go on),
  the text is parsed back into the copy, and the copy must equal the value
  all the way down (``==``, in C). Whatever orjson wrote in a way of its own
  fails that: a NaN or an infinity (written ``null``), an ``orjson.Fragment``
  (raw text), a ``uuid.UUID`` or a plain ``enum`` member (not equal to their
  text), a tuple (not equal to a list).
* **Types.** ``OPT_PASSTHROUGH_SUBCLASS``, ``_DATETIME`` and ``_DATACLASS``
  make orjson refuse every subclass, date and dataclass (no ``default``):
  an overridden ``__eq__`` or ``__str__`` never takes part.
* **Keys.** orjson refuses a key that is not exactly a ``str``, so no two
  keys can spell the same.
* **Integers.** ``OPT_STRICT_INTEGER`` refuses any beyond ±(2**53 - 1).
  A parsed value is encoded again so, strictly: orjson reads an integer
  beyond 2**64 as a float, which it then writes with an exponent, and any
  number it writes with one (1e16 or more) goes to the walk, which tells an
  int from a float.
* **Depth.** orjson encodes at most 254 nested containers: a value is
  encoded inside 54 lists of our own (taken off the text after), so it
  passes only within 200 levels; a parsed value too.
* **NaN and Infinity in text.** orjson refuses ``NaN``, ``Infinity`` and
  ``1e400`` (which Python reads as ``inf``); so does it a lone surrogate
  escape, and any text it cannot parse: the walk words the refusal.
* **Spelling.** The program receives compact ASCII JSON spelled by the
  standard library (a float as ``repr`` writes it, non-ASCII and DEL as
  ``\\u`` escapes), and the audit its unescaped UTF-8 size. orjson spells
  floats under ``1e-4`` or with an exponent otherwise (``0.00001`` for
  ``1e-05``): a text with a digit before ``e+`` or ``e-`` (orjson signs
  every exponent) or with ``0.0000`` anywhere goes to the walk. Its text is
  the program's as it is when it is ASCII with no DEL; else the standard
  library spells the copy. Control characters both escape alike.
* **A model's bytes** (:func:`spaced_bytes`): counted on orjson's UTF-8
  text, for a value that already obeys the rules (a run's answer).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

__all__ = ["UNSURE", "available", "encode", "parse", "spaced_bytes", "reset"]

#: What a function here answers when the walk must.
UNSURE: Any = object()

#: The nesting orjson encodes (it refuses a 255th level), less our 200:
#: the copy is checked inside this many lists of our own.
_PAD = 54

_DIGITS = frozenset(b"0123456789")
_EXP = frozenset(b"eE")

#: Text of at most this many characters nests at most 200 levels (each takes
#: two brackets): its value needs no check inside our lists.
_SHALLOW = 2 * 200 + 1
#: Exact types that hold nothing: their text needs no depth check.
_SCALARS = frozenset({type(None), bool, int, float, str})
_pads = threading.local()  # each thread's own _PAD nested lists (_dumps_padded)

_orjson: Any = None
_options = 0
_resolved = False


def _load() -> Any:
    global _orjson, _options, _resolved
    if not _resolved:
        module: Any
        try:
            import orjson as module
        except ImportError:
            module = None
        if module is not None:
            _options = (
                module.OPT_STRICT_INTEGER
                | module.OPT_PASSTHROUGH_SUBCLASS
                | module.OPT_PASSTHROUGH_DATETIME
                | module.OPT_PASSTHROUGH_DATACLASS
            )
        _orjson, _resolved = module, True
    return _orjson


def available() -> bool:
    """True when ``orjson`` is importable (and not hidden): the fast path is on."""
    return _load() is not None


def reset() -> None:
    """Forget whether ``orjson`` was found: the next use imports it again (the
    tests hide it through ``sys.modules`` to run the path without it)."""
    global _orjson, _resolved
    _orjson, _resolved = None, False


def encode(value: Any, ascii_text: Callable[[Any], str]) -> Any:
    """``(copy, text, size)`` as the walk would make them, or :data:`UNSURE`.

    ``copy`` is the snapshot of ``value``, ``text`` its compact ASCII JSON
    (``ascii_text(copy)``, the standard library's spelling), ``size`` the
    UTF-8 bytes of the same text unescaped (``ensure_ascii=False``).
    """
    orjson = _load()
    if orjson is None:
        return UNSURE
    try:
        # One encode (in C, holding the GIL: a consistent snapshot), inside our own lists.
        if type(value) in _SCALARS:  # nothing nested: no need of our lists
            out = orjson.dumps(value, option=_options)
        else:
            out = _dumps_padded(orjson, value)[_PAD:-_PAD]
        if _respelled(out):
            return UNSURE
        copy = orjson.loads(out)
    except (TypeError, ValueError):  # orjson's errors are both
        return UNSURE
    try:
        # Equal all the way down (compared in C): nothing was a NaN or an infinity
        # (written null), a Fragment, a tuple, a UUID, or an enum member not equal to its value.
        if copy != value:
            return UNSURE
    except Exception:  # an enum member's own __eq__ may raise anything: the walk will judge it
        return UNSURE
    if out.isascii() and out.find(b"\x7f") < 0:  # (find: `in` on bytes raises and clears a TypeError inside)
        text = out.decode("ascii")
    else:
        text = ascii_text(copy)
    return copy, text, len(out)


def _dumps_padded(orjson: Any, value: Any) -> bytes:
    """``orjson.dumps`` of ``value`` inside :data:`_PAD` lists of our own.

    The lists are made once per thread and reused (54 fresh lists per value
    were most of a small value's cost, and fed the garbage collector): the
    innermost holds ``value`` only during the encode, which runs no Python
    code (no ``default``), so nothing else can see or change them meanwhile.
    """
    try:
        outer, inner = _pads.chain
    except AttributeError:  # this thread's first value
        inner = outer = [None]
        for _ in range(_PAD - 1):
            outer = [outer]
        _pads.chain = (outer, inner)
    inner[0] = value
    try:
        return orjson.dumps(outer, option=_options)  # type: ignore[no-any-return]
    finally:
        inner[0] = None


def _large(out: bytes) -> bool:
    """True when orjson's text may hold a number of 1e16 or more: one with an
    exponent, which orjson always signs (``1e+16``). ``+`` is rare in JSON
    text, so this is a ``memchr`` (in a string too, e.g. ``"C++"``: the
    characters before tell)."""
    at = out.find(b"+")
    while at > 1:
        if out[at - 1] in _EXP and out[at - 2] in _DIGITS:
            return True
        at = out.find(b"+", at + 1)
    return False


def _respelled(out: bytes) -> bool:
    """True when orjson's text may hold a float it spells otherwise than ``repr``:
    one of 1e16 or more, or under 1e-4 (``0.00001`` or ``1e-09``, which ``repr`` spells ``1e-05``, ``1e-09``)."""
    if _large(out) or out.find(b"0.0000") >= 0:
        return True
    at = out.find(b"e-")
    while at > 0:
        if out[at - 1] in _DIGITS:
            return True
        at = out.find(b"e-", at + 2)
    return False


def parse(text: str) -> Any:
    """``json.loads(text)`` when the result obeys the snapshot rules, else :data:`UNSURE`."""
    # Every call's arguments pass here: the module's orjson read without a call once resolved,
    # and _large asked only of text that holds a "+" (its own first step, a memchr).
    orjson = _orjson if _resolved else _load()
    if orjson is None:
        return UNSURE
    try:
        value = orjson.loads(text)  # refuses NaN, Infinity, 1e400 and lone surrogates: the walk words it
        # Encoded again, strictly and inside our own lists: within 200 levels and no integer
        # beyond 2**53 - 1. Beyond 2**64 orjson read it as a float, as it reads 1e20: text with
        # a number of 1e16 or more goes to the walk, which tells an int from a float.
        again = orjson.dumps(value, option=_options) if len(text) <= _SHALLOW else _dumps_padded(orjson, value)
        if again.find(b"+") >= 0 and _large(again):
            return UNSURE
    except (TypeError, ValueError):
        return UNSURE
    return value


def spaced_bytes(value: Any) -> Any:
    """The UTF-8 bytes of ``json.dumps(value, ensure_ascii=False)`` (``", "``
    and ``": "`` between items) for a value that obeys the snapshot rules, or
    :data:`UNSURE` (a lone surrogate, which orjson refuses, among them).

    Counted on orjson's compact text, UTF-8 as it comes: its bytes, plus one space per
    separator (:func:`_separators`, one ``translate`` and two counts, when no
    string holds an escape, a ``,`` or a ``:``; else :func:`_separators_by_indent`).
    """
    orjson = _load()
    if orjson is None:
        return UNSURE
    try:
        compact = orjson.dumps(value, option=_options)
        if _respelled(compact):
            return UNSURE
        separators = _separators(compact)
        if separators is None:
            separators = _separators_by_indent(orjson, value, compact)
    except (TypeError, ValueError):
        return UNSURE
    if separators is UNSURE:
        return UNSURE
    return len(compact) + separators


#: Every byte but ``"``, ``,`` and ``:``: what :func:`_separators` deletes.
_NOT_MARKS = bytes(b for b in range(256) if b not in b'",:')


def _separators(compact: bytes) -> Any:
    """The ``,`` and ``:`` between items of orjson's compact text, or ``None``
    when a string may hold one. With no backslash in the text (nothing
    escaped) a ``"`` only opens or closes a string, and between two strings
    there is always a separator; so with everything but ``"``, ``,`` and
    ``:`` deleted, a string that holds no separator is ``""``, and when every
    quote is in such a pair, every separator left is one between items. Each
    step is one pass in C (``memchr``, ``translate``, ``count``)."""
    if b"\\" in compact:
        return None
    marks = compact.translate(None, _NOT_MARKS)
    quotes = marks.count(b'"')
    if marks.count(b'""') * 2 != quotes:
        return None
    return len(marks) - quotes


def _separators_by_indent(orjson: Any, value: Any, compact: bytes) -> Any:
    """The separators between items, for text whose strings may hold ``,``
    or ``:`` (or :data:`UNSURE`). A key's colon is a ``":`` whose quote
    closes a string: with no escaped quote in the text, a quote that opens a
    string follows ``[``, ``{``, ``,`` or ``:`` (or starts the text), so text
    where one of those comes before a ``":`` goes to the walk. A comma between
    items is a ``,`` followed by a newline in the indented text (no string
    holds a raw newline)."""
    if b'\\"' in compact or _opens_with_colon(compact):
        return UNSURE
    indented = orjson.dumps(value, option=_options | orjson.OPT_INDENT_2)
    return compact.count(b'":') + indented.count(b",\n")


def _opens_with_colon(compact: bytes) -> bool:
    # A string that may begin with ":" (its opening quote would look like a key's closing one).
    if compact.startswith(b'":'):
        return True
    return any(mark in compact for mark in (b'[":', b'{":', b',":', b':":'))

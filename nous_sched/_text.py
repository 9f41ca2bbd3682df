r"""Private: text a program wrote, made inert before the host shows it to a person.

A program (or the model behind it) writes descriptions, tool names, log
lines and results; the host prints some of them to a terminal and writes some
to log records and files. Each of those would act on what reads it if written
raw: a newline forges a log line, ESC drives the terminal, a bidi control or
a tag character (U+E0000-U+E007F, which most terminals show as nothing) hides
or reorders text, a lone surrogate cannot even be encoded. So:

* :func:`inert` writes every control character but newline and tab (C0, DEL,
  C1), the line and paragraph separators, every Unicode format character
  (category Cf: bidi controls, U+061C, zero-width characters, the tag block)
  and lone surrogates as escapes (``\x1b``, ``\r``, ``\u202e``,
  ``\U000e0041``, ``\ud800``);
* :func:`one_line` does that and escapes newline and tab too, for a log
  record or anything else that must stay one line;
* :func:`json_inert` does it to JSON text with JSON's own escapes, so the
  result is the same JSON value.

The format characters are listed here, not looked up per character: a test
checks the list against :mod:`unicodedata` of the running Python.
"""

from __future__ import annotations

import re

__all__ = ["inert", "one_line", "json_inert", "escape_surrogates"]

# Category Cf as of Unicode 16 (the whole tag block, unassigned ones too).
_FORMAT = (
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e007f"
)
# C0 but newline and tab, DEL, C1; line/paragraph separators; format characters; lone surrogates.
_UNSAFE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029{_FORMAT}\ud800-\udfff]")
_UNSAFE_LINE = re.compile(f"[\x00-\x1f\x7f-\x9f\u2028\u2029{_FORMAT}\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: "re.Match[str]") -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def inert(text: str) -> str:
    """``text`` with every character that could act on a terminal written as an escape; newline and tab kept."""
    return _UNSAFE.sub(_escape, text)


def one_line(text: str) -> str:
    """:func:`inert`, with newline and tab escaped too: one line, for a log record."""
    return _UNSAFE_LINE.sub(_escape, text)


def _json_escape(match: "re.Match[str]") -> str:
    code = ord(match.group())
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_inert(text: str) -> str:
    """JSON text (from ``json.dumps``) with what :func:`inert` escapes written
    as JSON escapes (``\\u202e``, a surrogate pair for the tag characters):
    the same JSON value, still valid JSON. Newline and tab (only ever
    whitespace between tokens here) are kept."""
    return _UNSAFE.sub(_json_escape, text)


def escape_surrogates(text: str) -> str:
    """JSON text with each raw lone surrogate written as its JSON escape
    (``\\ud800``): the same JSON value, now encodable as UTF-8."""
    if text.isascii():
        return text
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)

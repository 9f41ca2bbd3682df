r"""Private: the rules for a string on its way out of the library, one per kind of output.

A program (or the model behind it) writes descriptions, tool names, log
lines, arguments and results; any string is data, and every place a value
leaves the library writes it by one of these rules, so none raises, stalls
or dies on what a program chose. Three kinds of output:

* **What a person reads** (the CLI's human output, ``approvals list``, the
  approval question, the records of the ``nous_sched`` logger): each of those would act on
  what reads it if written raw: a newline forges a log line, ESC drives the
  terminal, a bidi control or a tag character (U+E0000-U+E007F, which most
  terminals show as nothing) hides or reorders text, a lone surrogate cannot
  even be encoded. :func:`inert` writes every control character but newline
  and tab (C0, DEL, C1), the line and paragraph separators, every Unicode
  format character (category Cf: bidi controls, U+061C, zero-width
  characters, the tag block) and lone surrogates as escapes (``\x1b``,
  ``\r``, ``\u202e``, ``\U000e0041``, ``\ud800``); :func:`one_line` does that
  and escapes newline and tab too, for a log record or anything else that
  must stay one line (:func:`nous_sched.gate.approval_text.inert_line` is
  :func:`one_line`). Every record of the library's logger,
  ``nous_sched``, passes :class:`InertRecords`, installed on it when this
  module is imported (the package imports it): its message made
  :func:`one_line`, its traceback :func:`inert`, whatever a handler does.
* **JSON text the library writes** (``--json``, ``--events``, a
  :class:`~nous_sched.RunEvent`'s ``to_json`` and so the SSE stream, the
  audit log file): :func:`machine_json`. Strict JSON, as I-JSON (RFC 7493)
  defines it, so any decoder accepts it, and valid UTF-8: a lone surrogate
  (which is no character, and which strict decoders refuse even as an
  escape) becomes U+FFFD, a non-finite number ``null`` (as JavaScript's
  ``JSON.stringify`` writes it); every other string is the same value, with
  what :func:`inert` escapes written as JSON's own escapes (``\u202e``, a
  surrogate pair for a tag character), so the text is inert on a terminal too.
* **Values handed to another library that encodes them** (serve-mcp's
  results, notifications and questions, which the MCP SDK writes to stdio or
  HTTP; OpenTelemetry span attributes): :func:`machine_value` and
  :func:`machine_text`, the same rule on the value: each lone surrogate
  becomes U+FFFD, nothing else changes (the encoder escapes what JSON needs).

The format characters are listed here, not looked up per character: a test
checks the list against :mod:`unicodedata` of the running Python.
"""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Any

__all__ = [
    "inert",
    "one_line",
    "json_inert",
    "machine_json",
    "machine_text",
    "machine_value",
    "InertRecords",
    "REPLACEMENT",
]

#: What a lone surrogate becomes in machine output.
REPLACEMENT = "\ufffd"

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


def machine_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD: encodable as UTF-8,
    and accepted by a strict JSON decoder once encoded. ``text`` itself when it holds none."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return _SURROGATE.sub(REPLACEMENT, text)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _dumps(value: Any, options: dict[str, Any]) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, **options)
    except ValueError as exc:
        if "Out of range float" not in str(exc):
            raise
    return json.dumps(_finite(value), ensure_ascii=False, allow_nan=False, **options)


def machine_json(value: Any, **options: Any) -> str:
    """``value`` as strict JSON text (``json.dumps`` ``options``: ``indent``,
    ``default``...): lone surrogates as U+FFFD, non-finite numbers as ``null``,
    and what :func:`inert` escapes as JSON escapes. See the module docstring."""
    return json_inert(machine_text(_dumps(value, options)))


def machine_value(value: Any) -> Any:
    """A JSON value with each lone surrogate in its strings and keys replaced by
    U+FFFD, for an encoder that refuses them; ``value`` itself when it holds none
    (the common case costs one ``json.dumps``)."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    if text.isascii() or _SURROGATE.search(text) is None:
        return value
    return json.loads(_SURROGATE.sub(REPLACEMENT, text))


class InertRecords(logging.Filter):
    """A logging filter: the record's message made :func:`one_line` (its
    arguments merged in first), its traceback text :func:`inert`. Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: logging reports it as it always does
            return True
        record.msg, record.args = one_line(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = inert(logging.Formatter().formatException(record.exc_info))
        return True


_LOGGER = logging.getLogger("nous_sched")
if not any(isinstance(f, InertRecords) for f in _LOGGER.filters):
    _LOGGER.addFilter(InertRecords())

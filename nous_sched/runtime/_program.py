"""A program as a model writes it, made runnable on the first try.

Three forms models write are accepted, each with every line and column kept
where the model wrote it (an error points into the model's own text):

* **Markdown fences.** A program whose first non-blank line opens a fence
  (```` ```js ````, ```` ```ts ````, ...) has that line, its closing fence and
  anything after it blanked.
* **TypeScript.** Type syntax is replaced by spaces (:mod:`._typescript`);
  what has a value at run time (``enum``, ``namespace``, decorators) is a
  ``SyntaxError`` that says what to write instead.
* **A last expression.** A program whose last top-level statement is an
  expression gives that expression's value when it ends without a ``return``
  (a REPL's rule; a ``return`` that runs still wins): ``E;`` becomes
  ``return (E);``. The ``return (`` goes after the statement before ``E``
  when ``E`` starts on a line of its own, so nothing on ``E``'s lines moves;
  otherwise the columns of ``E``'s first line move, and :meth:`Source.locate`
  moves every position in an error message back.

**Cost.** Parsing a 1,000-line program takes milliseconds, so a plain
JavaScript program is not parsed when a scan of its last line shows it ends
in a top-level ``return`` and it has no ``>(`` (a generic call such as
``f<T>(x)`` is valid JavaScript, a comparison, and would not fail to
compile). Every other TypeScript construct fails to compile as JavaScript:
such a program is parsed after QuickJS reports its ``SyntaxError`` (before
anything of it ran) and run again (:func:`run`).
"""

from __future__ import annotations

import re
from typing import Callable, Iterator, Optional

from ..result import RunError
from . import RuntimeOutcome
from ._typescript import Refused, strip

__all__ = ["Source", "prepare", "run"]

_RETURN = b"return ("
#: A program up to this long is parsed whole when it may need the parser
#: (tens of microseconds); a longer one only at its end (:func:`_tail`).
_WHOLE_CHARS = 2048
_TAIL_CHARS = 16384
_TAIL_TRIES = 4
_AT = re.compile(r"<input>:(\d+):(\d+)")


class Source:
    """One program: ``original`` as written, ``text`` as it runs, ``parsed`` when
    tree-sitter has read it, ``refused`` a ``SyntaxError`` message when it
    cannot run, ``shifts`` the ``(line, column, n)`` places where ``n``
    characters were inserted (1-based)."""

    __slots__ = ("original", "text", "parsed", "refused", "shifts")

    def __init__(
        self,
        original: str,
        text: str,
        parsed: bool = False,
        refused: Optional[str] = None,
        shifts: tuple[tuple[int, int, int], ...] = (),
    ) -> None:
        self.original = original
        self.text = text
        self.parsed = parsed
        self.refused = refused
        self.shifts = shifts

    def locate(self, message: str) -> str:
        """``message`` with each ``<input>:line:column`` said about :attr:`original`."""
        if not self.shifts or "<input>:" not in message:
            return message
        return _AT.sub(self._moved, message)

    def _moved(self, found: "re.Match[str]") -> str:
        line, column = int(found.group(1)), int(found.group(2))
        for at_line, at_column, n in self.shifts:
            if line == at_line and column >= at_column:
                column = max(column - n, at_column)
        return f"<input>:{line}:{column}"


def prepare(code: str) -> Source:
    """``code`` made runnable: fences off, and parsed only when the cheap
    checks say it may need to be (see the module docstring)."""
    text = unfence(code)
    if ">(" in text and _generic_call(text):
        return _parsed(code, text)
    if _ends_in_return(text):
        return Source(code, text)
    if len(text) <= _WHOLE_CHARS:
        return _parsed(code, text)
    return _tail(code, text)


def run(
    source: Source,
    first: Callable[[str], RuntimeOutcome],
    again: Callable[[str], RuntimeOutcome],
    untouched: Callable[[], bool],
) -> tuple[RuntimeOutcome, Source]:
    """Run ``source`` with ``first``; when it was not parsed and QuickJS
    reported a ``SyntaxError`` before anything crossed (``untouched()``: no
    call, no log line), parse it and run it once more with ``again`` if that
    changed it. The outcome, and the source that ran."""
    if source.refused is not None:
        return _refusal(source.refused), source
    outcome = first(source.text)
    error = getattr(outcome, "error", None)  # (run_code refuses what is no RuntimeOutcome)
    if source.parsed or not isinstance(error, RunError) or error.kind != "exception":
        return outcome, source
    if not error.message.startswith("SyntaxError"):
        return outcome, source
    if outcome.logs or not untouched():  # it ran: a SyntaxError it threw itself
        return outcome, source
    # From the model's text again: the first try may have rewritten its last statement already.
    second = _parsed(source.original, unfence(source.original))
    if second.refused is not None:
        return _refusal(second.refused), second
    if second.text == source.text:
        return outcome, source
    return again(second.text), second


def _refusal(message: str) -> RuntimeOutcome:
    return RuntimeOutcome((), error=RunError("exception", message))


def _parsed(original: str, text: str) -> Source:
    try:
        stripped = strip(text)
    except Refused as refused:
        return Source(
            original, text, True, f"SyntaxError: {refused.message}\n    at <input>:{refused.line}:{refused.column}"
        )
    if stripped.last is None or not stripped.clean:
        return Source(original, stripped.text, True)
    return _rewritten(original, stripped.data, stripped.last, True)


def _tail(original: str, text: str) -> Source:
    """A long program's last statement, found by parsing only its end: from
    the start of one of its last lines that may start a statement, tried
    latest first. A suffix that starts inside a bracket, string, template or
    comment leaves something unclosed or unopened and does not parse clean,
    so the first clean one starts at the top level. TypeScript in it, or no
    clean suffix, sends the whole program to the parser."""
    for split in _statement_starts(text):
        try:
            stripped = strip(text[split:])
        except Refused:
            break
        if stripped.changed:
            break
        if not stripped.clean:
            continue
        if stripped.last is None:
            return Source(original, text)  # (not parsed: TypeScript elsewhere still fails to compile, then is)
        prefix = text[:split].encode("utf-8", "surrogatepass")
        start, end, semicolon, previous = stripped.last
        offset = len(prefix)
        last = (start + offset, end + offset, semicolon, None if previous is None else previous + offset)
        return _rewritten(original, prefix + stripped.data, last, False)
    return _parsed(original, text)


def _statement_starts(text: str) -> Iterator[int]:
    """The starts of the last lines (within :data:`_TAIL_CHARS`) that begin, at
    column 0, with what may begin a statement; at most :data:`_TAIL_TRIES`."""
    floor = max(len(text) - _TAIL_CHARS, 0)
    end = len(text)
    tries = 0
    while tries < _TAIL_TRIES:
        newline = text.rfind("\n", floor, end)
        if newline < 0:
            return
        start = newline + 1
        if start < len(text) and (text[start].isalpha() or text[start] in "_$(['\"`!"):
            tries += 1
            yield start
        end = newline


def _rewritten(original: str, data: bytes, last: tuple[int, int, bool, Optional[int]], parsed: bool) -> Source:
    """``data`` (UTF-8) with its last statement, an expression ``E``, made ``return (E)``.

    In UTF-8 bytes, as tree-sitter's offsets and QuickJS's columns are."""
    start, end, semicolon, previous = last
    out = data[: end - 1] + b")" + data[end:] if semicolon else data[:end] + b")" + data[end:]
    if previous is not None and b"\n" in out[previous:start]:
        # After the statement before: `E`'s own lines keep their columns.
        out = out[:previous] + b";" + _RETURN + out[previous:]
        return Source(original, out.decode("utf-8", "surrogatepass"), parsed)
    line = out.count(b"\n", 0, start) + 1
    column = start - (out.rfind(b"\n", 0, start) + 1) + 1
    out = out[:start] + _RETURN + out[start:]
    return Source(original, out.decode("utf-8", "surrogatepass"), parsed, shifts=((line, column, len(_RETURN)),))


def unfence(code: str) -> str:
    """``code`` without the Markdown fence around it, each fence line (and
    anything after the closing one) blanked so every other line keeps its number."""
    first = 0
    while first < len(code) and code[first].isspace():  # (not lstrip: a long program is not copied)
        first += 1
    if not code.startswith("```", first):
        return code
    lines = code.split("\n")
    opening = next(i for i, line in enumerate(lines) if line.strip())
    closing = next((i for i in range(len(lines) - 1, opening, -1) if lines[i].strip().startswith("```")), None)
    kept = lines[opening + 1 : closing] if closing is not None else lines[opening + 1 :]
    blank = len(lines) - opening - 1 - len(kept)
    return "\n".join([""] * (opening + 1) + kept + [""] * blank)


def _generic_call(text: str) -> bool:
    """Whether ``text`` has a ``>(`` that is not an arrow's ``=>(``."""
    at = text.find(">(")
    while at >= 0:
        if at == 0 or text[at - 1] != "=":
            return True
        at = text.find(">(", at + 2)
    return False


def _ends_in_return(text: str) -> bool:
    """Whether the program's last line is a whole top-level ``return``
    statement: it starts with ``return``, and closes no bracket it did not open,
    outside strings, with no comment or template that might span lines. A
    conservative check: False sends the program to the parser."""
    end = len(text)
    while end and text[end - 1].isspace():  # (not rstrip: a long program is not copied)
        end -= 1
    if end == 0:
        return True
    line = text[text.rfind("\n", 0, end) + 1 : end].strip()
    if not line.startswith("return") or (len(line) > 6 and (line[6].isalnum() or line[6] in "_$\\")):
        return False
    if "`" in line or "/*" in line or "*/" in line:
        return False
    return _balanced(line[6:])


def _balanced(line: str) -> bool:
    depth = 0
    quote = ""
    i = 0
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "/" and line.startswith("//", i):
            break
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                return False
        i += 1
    return depth == 0 and not quote

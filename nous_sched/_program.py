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
from typing import Callable, Optional

from ._typescript import Refused, strip
from .result import RunError
from .runtime import RuntimeOutcome

__all__ = ["Source", "prepare", "run"]

_RETURN = b"return ("
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
    if ">(" in text and _generic_call(text) or not _ends_in_return(text):
        return _parsed(code, text)
    return Source(code, text)


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
    second = _parsed(source.original, source.text)
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
    # In UTF-8 bytes, as tree-sitter's offsets and QuickJS's columns are.
    out = stripped.data
    start, end, semicolon, previous = stripped.last
    out = out[: end - 1] + b")" + out[end:] if semicolon else out[:end] + b")" + out[end:]
    if previous is not None and b"\n" in out[previous:start]:
        # After the statement before: `E`'s own lines keep their columns.
        out = out[:previous] + b";" + _RETURN + out[previous:]
        return Source(original, out.decode("utf-8", "surrogatepass"), True)
    line = out.count(b"\n", 0, start) + 1
    column = start - (out.rfind(b"\n", 0, start) + 1) + 1
    out = out[:start] + _RETURN + out[start:]
    return Source(original, out.decode("utf-8", "surrogatepass"), True, shifts=((line, column, len(_RETURN)),))


def unfence(code: str) -> str:
    """``code`` without the Markdown fence around it, each fence line (and
    anything after the closing one) blanked so every other line keeps its number."""
    head = code.lstrip()
    if not head.startswith("```"):
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
    end = len(text.rstrip())
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

"""A syntax error told in terms of what the program wrote.

The engine compiles a program as the body of a wrapper function
(:mod:`.engine`), so a program that ends too early (a truncated model output:
``return [1, 2``) makes QuickJS report the wrapper's closing ``}`` on a line
past the program's end. :func:`explain` rewrites such a report: it scans the
program (strings, template literals, comments and, by the usual heuristic,
regular expressions skipped) and names the bracket left open and where it
opened, or says the program ended in the middle of an expression. Reports
inside the program are returned unchanged.
"""

from __future__ import annotations

import re
from typing import Optional

__all__ = ["explain", "unclosed"]

_AT = re.compile(r"at <input>:(\d+):(\d+)")
_CLOSERS = {"(": ")", "[": "]", "{": "}"}
# After one of these (or at the start), a `/` begins a regular expression, not a division.
_BEFORE_REGEX = set("(,=:[!&|?{};+-*%<>~^")
_REGEX_KEYWORDS = ("return", "typeof", "case", "yield", "await", "in", "of", "void", "delete", "throw", "new")


def explain(message: str, program: str) -> str:
    """``message`` (``"SyntaxError: ...\\n    at <input>:L:C"``) said about ``program`` itself."""
    found = _AT.search(message)
    lines = program.split("\n")
    if found is None or int(found.group(1)) <= len(lines):
        return message
    end = f"<input>:{len(lines)}:{len(lines[-1]) + 1}"
    scanner = _Scanner(program)
    scanner.run()
    if scanner.extra is not None:
        bracket, line, column = scanner.extra
        return f"SyntaxError: the {bracket!r} at <input>:{line}:{column} closes a bracket the program never opened"
    if not scanner.stack:
        return f"SyntaxError: the program ends in the middle of a statement or expression\n    at {end}"
    opened = scanner.stack[-1]
    bracket, line, column = opened
    return (
        f"SyntaxError: the program ends before the {bracket!r} opened at <input>:{line}:{column} is closed "
        f"(expected {_CLOSERS[bracket]!r})\n    at {end}"
    )


def unclosed(program: str) -> Optional[tuple[str, int, int]]:
    """The innermost bracket ``program`` leaves open, with its line and column (1-based), or ``None``."""
    scanner = _Scanner(program)
    scanner.run()
    return scanner.stack[-1] if scanner.stack else None


class _Scanner:
    """Brackets outside strings, comments and regular expressions; template
    literals' ``${...}`` count as code."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.stack: list[tuple[str, int, int]] = []
        self.templates: list[int] = []  # stack depths at which a template's ${ opened
        self.last = ""  # the last significant character, for the regex heuristic
        self.extra: Optional[tuple[str, int, int]] = None  # the first closer with nothing open

    def where(self, index: int) -> tuple[int, int]:
        line = self.text.count("\n", 0, index) + 1
        return line, index - (self.text.rfind("\n", 0, index) + 1) + 1

    def run(self) -> None:
        text = self.text
        while self.i < len(text):
            self.step(text[self.i])

    def step(self, ch: str) -> None:
        text, i = self.text, self.i
        if ch in "\"'":
            self.i = _skip_string(text, i + 1, ch)
        elif ch == "`":
            self.template(i + 1)
        elif text.startswith("//", i):
            end = text.find("\n", i)
            self.i = len(text) if end < 0 else end
            return
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            self.i = len(text) if end < 0 else end + 2
            return
        elif ch == "/" and self.regex_may_start():
            self.i = _skip_regex(text, i + 1)
        else:
            self.i = i + 1
            self.bracket(ch, i)  # may move self.i on: back into a template's text
        if not ch.isspace():
            self.last = ch

    def bracket(self, ch: str, i: int) -> None:
        if ch in _CLOSERS:
            self.stack.append((ch, *self.where(i)))
        elif ch in ")]}" and not self.stack:
            if self.extra is None:
                self.extra = (ch, *self.where(i))
        elif ch in ")]}":
            if ch == "}" and self.templates and self.templates[-1] == len(self.stack):
                self.templates.pop()
                self.stack.pop()
                self.template(i + 1)  # back inside the template literal
                return
            self.stack.pop()

    def template(self, start: int) -> None:
        """Skip template text from ``start`` to its closing backtick or its next ``${``."""
        text, j = self.text, start
        while j < len(text):
            if text[j] == "\\":
                j += 2
                continue
            if text[j] == "`":
                self.i = j + 1
                return
            if text.startswith("${", j):
                self.stack.append(("{", *self.where(j + 1)))
                self.templates.append(len(self.stack))
                self.i = j + 2
                return
            j += 1
        self.i = len(text)

    def regex_may_start(self) -> bool:
        if not self.last or self.last in _BEFORE_REGEX:
            return True
        before = self.text[: self.i].rstrip()
        return before.endswith(_REGEX_KEYWORDS) and not before[-1:].isdigit()


def _skip_string(text: str, j: int, quote: str) -> int:
    while j < len(text) and text[j] not in (quote, "\n"):
        j += 2 if text[j] == "\\" else 1
    return j + 1


def _skip_regex(text: str, j: int) -> int:
    in_class = False
    while j < len(text) and text[j] != "\n":
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        if ch == "[":
            in_class = True
        elif ch == "]":
            in_class = False
        elif ch == "/" and not in_class:
            return j + 1
        j += 1
    return j

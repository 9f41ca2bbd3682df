"""The approval question a person reads: one renderer for every place that asks.

:func:`question` turns one :class:`~nous_sched.ApprovalRequest` into text.
``serve-mcp``'s elicitation question is this text, ``nous-sched run --ask``
asks it on the terminal, ``nous-sched approvals list`` and a suspended run's
output show each pending call with it (and the run's description with
:func:`description_line`), and so is
:meth:`ApprovalRequest.question <nous_sched.ApprovalRequest.question>`, the
library's default for an approval handler that shows the call to a person.
What a caller may rely on:

* every top-level argument key is shown, one per line, in the order the
  program gave them; each key and each value (as JSON) is clipped *on its
  own* to :data:`KEY_CHARS` / :data:`VALUE_CHARS` characters, and a clipped
  one says its full size, so a long first value cannot push a later one (the
  ``path`` of a ``write_file``) out of sight;
* the run's description is labelled as the program's own words, unverified,
  and kept on one line; so is what is coming (``ApprovalRequest.coming``,
  the program's static summary), labelled as such;
* no character the program chose can act on a terminal or fake a line of
  ours: control characters (newline and tab too), Unicode format characters
  (bidi controls, U+061C, the tag block), line and paragraph separators and
  lone surrogates are written as escapes (``\\n``, ``\\u202e``, ``\\udc00``):
  :func:`inert_line` is the library's one rule for a line a person reads,
  :func:`nous_sched._text.one_line`.

Pure functions; imports nothing from the rest of the library but that rule.
"""

from __future__ import annotations

import json
from typing import Any

from .._text import one_line

__all__ = [
    "question",
    "description_line",
    "coming_line",
    "inert_line",
    "clipped",
    "arguments",
    "KEY_CHARS",
    "VALUE_CHARS",
    "DESCRIPTION_CHARS",
    "program_question",
    "program_lines",
    "CODE_CHARS",
    "SUMMARY_LINES",
]

#: Characters of each argument key shown before it is clipped.
KEY_CHARS = 80
#: Characters of each argument value (its JSON text) shown before it is clipped.
VALUE_CHARS = 300
#: Characters of the program's description shown before it is clipped.
DESCRIPTION_CHARS = 500
#: Characters of the tool's name shown before it is clipped.
NAME_CHARS = 120
#: Characters of a reviewed program's code shown in its question before it is clipped.
CODE_CHARS = 4000
#: Lines of a program's summary shown at most (each clipped to :data:`VALUE_CHARS`).
SUMMARY_LINES = 24


def inert_line(text: str) -> str:
    """``text`` on one line, with every character that could act on a terminal
    written as an escape (:func:`nous_sched._text.one_line`)."""
    if text.isprintable():  # the common case: nothing to escape (isprintable is False for all it escapes)
        return text
    return one_line(text)


def _clip(text: str, limit: int) -> str:
    """``text`` made inert and clipped to ``limit`` characters, saying its full size when clipped."""
    if len(text) <= limit:
        return inert_line(text)
    return f"{inert_line(text[:limit])}… (clipped; {len(text):,} characters in all)"


def clipped(text: str, limit: int = VALUE_CHARS) -> dict[str, Any]:
    """``{"text", "chars", "clipped"}``: ``text`` made inert (:func:`inert_line`)
    and clipped to ``limit`` characters as the question clips a value, its full
    length in ``chars``."""
    return {"text": _clip(text, limit), "chars": len(text), "clipped": len(text) > limit}


def arguments(args: Any) -> list[dict[str, Any]]:
    """The arguments as the question shows them, one row per top-level key in
    the program's order: ``{"key", "value", "chars", "clipped"}``, ``key`` and
    ``value`` (the value's JSON text) each clipped on its own and inert,
    ``chars`` the value's full JSON length. A non-object is one row with key ``""``."""
    if not isinstance(args, dict):
        return [_row("", args)]
    return [_row(key, value) for key, value in args.items()]


def _row(key: Any, value: Any) -> dict[str, Any]:
    text = _json(value)
    return {
        "key": _clip(str(key), KEY_CHARS),
        "value": _clip(text, VALUE_CHARS),
        "chars": len(text),
        "clipped": len(text) > VALUE_CHARS,
    }


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):  # a cycle, say: still show something
        return repr(value)


def _argument_lines(arguments: Any) -> list[str]:
    if not isinstance(arguments, dict):
        return [f"Arguments: {_clip(_json(arguments), VALUE_CHARS)}"]
    if not arguments:
        return ["Arguments: none"]
    lines = [f"Arguments ({len(arguments)}; each clipped on its own):"]
    for key, value in arguments.items():
        lines.append(f"  {_clip(_json(str(key)), KEY_CHARS)}: {_clip(_json(value), VALUE_CHARS)}")
    return lines


def question(request: Any) -> str:
    """The approval question for ``request`` (an :class:`~nous_sched.ApprovalRequest`, or any
    object with ``tool``, ``arguments`` and ``description``); see the module docstring.
    A request with ``code`` is a reviewed program's own question (:func:`program_question`);
    one with ``program`` (a reviewed run's call) also says what the program as a whole does."""
    code = getattr(request, "code", None)
    program = getattr(request, "program", None)
    if isinstance(code, str):
        return program_question(code, getattr(request, "description", ""), program)
    tool = _clip(_json(str(getattr(request, "tool", ""))), NAME_CHARS)
    lines = [f"A program wants to call the tool {tool}.", *_argument_lines(getattr(request, "arguments", None))]
    description = getattr(request, "description", "")
    if isinstance(description, str) and description:
        lines.append(description_line(description))
    coming = getattr(request, "coming", "")
    if isinstance(coming, str) and coming:
        lines.append(coming_line(coming))
    if program is not None:
        lines.append("What the program as a whole does (its text, read before it ran):")
        lines.extend(program_lines(program))
    return "\n".join(lines)


def program_lines(summary: Any) -> list[str]:
    """``summary`` (a :class:`~nous_sched.ProgramSummary`) as indented lines, each
    made inert and clipped, at most :data:`SUMMARY_LINES` of them."""
    try:
        described = [str(line) for line in summary.describe()]
    except Exception:  # (a summary that cannot describe itself still leaves a question)
        described = ["(the summary could not be shown)"]
    lines = [f"  {_clip(line, VALUE_CHARS)}" for line in described[:SUMMARY_LINES]]
    if len(described) > SUMMARY_LINES:
        lines.append(f"  … ({len(described) - SUMMARY_LINES} more lines)")
    return lines


def program_question(code: str, description: Any, summary: Any) -> str:
    """The question a reviewed program asks as a whole (``ReviewDecision.ask()``):
    its summary, its description (the program's own words) and its code, each
    line of the code made inert and the code clipped to :data:`CODE_CHARS`."""
    lines = ["A program asks to run. What its text says it will do:"]
    if summary is not None:
        lines.extend(program_lines(summary))
    if isinstance(description, str) and description:
        lines.append(description_line(description))
    shown = code[:CODE_CHARS]
    lines.append(f"Its code ({len(code):,} characters{'; clipped' if len(code) > CODE_CHARS else ''}):")
    lines.extend(f"  | {inert_line(line)}" for line in shown.split("\n"))
    if len(code) > CODE_CHARS:
        lines.append(f"  … (clipped; {len(code):,} characters in all)")
    return "\n".join(lines)


def coming_line(coming: str) -> str:
    """What the program's static summary says is coming (``ApprovalRequest.coming``)
    as :func:`question` shows it: labelled, on one line, clipped to :data:`DESCRIPTION_CHARS`."""
    return f"Coming, per the program's static summary: {_clip(coming, DESCRIPTION_CHARS)}"


def description_line(description: str) -> str:
    """The run's description as :func:`question` shows it: labelled as the
    program's own words, unverified, on one line, clipped to :data:`DESCRIPTION_CHARS`."""
    return f"The program's own words, unverified: {_clip(description, DESCRIPTION_CHARS)}"

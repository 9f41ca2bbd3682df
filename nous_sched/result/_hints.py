"""Hints: what a run that succeeded probably did not mean, and the fix, in words the model reads.

A run can end without an error and still not do what its author meant. The
sandbox (``prelude.js``) reports, with the program's result, what it saw:
the program returned nothing (``undefined``), which calls it left pending
when it ended, and which parts of its result it converted by the one rule
for values JSON cannot hold:

========================  =====================================================
a ``Map``                 an object (every key a string), else a list of
                          ``[key, value]`` pairs
a ``Set``                 an array
a ``Date``                its ISO string (an invalid one: ``null``)
a typed array,            an array of numbers
``ArrayBuffer``
a ``BigInt``              its decimal string
``NaN``, ``Infinity``     ``null``
``undefined``             ``null`` in an array; dropped from an object
a function, symbol or     ``null`` in an array; dropped from an object
``Promise``
a cycle                   ``null`` where the value refers back to itself
a class instance          its own fields (an ``Error``: its name and message)
========================  =====================================================

The same rule applies to each value a program logs (its notes follow the line
in brackets). A value of more than 2,048 values is written by ``JSON.stringify``
and walked only when its text shows a value the rule converts otherwise (a
``{}``, a ``null``, a typed array's ``{"0":``, or an error): its values are
the rule's all the same, but its dates, dropped ``undefined`` fields and
class instances go unnoted.

The host adds what it saw itself: a tool that returned an empty
result where its earlier calls in the run returned data. :func:`hints`
turns all of it into one ``hint`` string, each part naming the fix in one
sentence, at most :data:`MAX_HINT_CHARS` characters: the model reads it in
:meth:`~nous_sched.RunResult.for_model` and the usage ledger counts it
(:attr:`~nous_sched.result.usage.Usage.hint_bytes`).
"""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

from .._text import one_line

__all__ = ["MAX_HINT_CHARS", "Seen", "hints"]

#: The most characters a run's hint takes.
MAX_HINT_CHARS = 600
_MAX_PARTS = 8
_MAX_PART_CHARS = 200

NOTHING_RETURNED = (
    "The program returned nothing (undefined): end it with `return <value>` "
    "(or an expression as its last statement) to give a result."
)


class Seen:
    """What the host saw of a run's tool results: which tools returned data,
    and the first empty result from a tool after data (:meth:`observe`)."""

    __slots__ = ("data", "empty")

    def __init__(self) -> None:
        self.data: set[str] = set()
        self.empty: Optional[tuple[str, Optional[int]]] = None

    def observe(self, tool: str, seq: Optional[int], value: Any) -> None:
        """One ok result of ``tool`` (sequence number ``seq``) the program received."""
        if value is None or value == [] or value == {} or value == "":
            if tool in self.data and self.empty is None:
                self.empty = (tool, seq)
        else:
            self.data.add(tool)


def hints(main: Any, seen: Seen, logs: Sequence[str], failed: bool) -> str:
    """The run's hint ("" for none): ``main`` the program's end as the sandbox
    reported it (untrusted: checked here), ``seen`` the host's, ``logs`` the
    run's log lines, ``failed`` whether the run ended with an error (then only
    what the host saw is said)."""
    parts: list[str] = []
    if not failed and isinstance(main, dict):
        parts.extend(_from_sandbox(main, bool(logs)))
    if seen.empty is not None:
        tool, seq = seen.empty
        call = f" (call {seq})" if isinstance(seq, int) else ""
        parts.append(
            f"{_tool(tool)} returned an empty result{call} where its earlier calls returned data: "
            "check that call's arguments (a misspelled name, or a value taken from the wrong result)."
        )
    text = " ".join(parts)
    return text if len(text) <= MAX_HINT_CHARS else text[: MAX_HINT_CHARS - 1] + "…"


def _from_sandbox(main: dict[str, Any], logged: bool) -> list[str]:
    parts: list[str] = []
    pending = _strings(main.get("pending"))
    if pending:
        names = ", ".join(dict.fromkeys(_tool(n) for n in pending))
        parts.append(
            f"The program ended while {names} was still running, its result never awaited: "
            "write `await` before the call (or await Promise.all([...]) of the calls)."
        )
    if main.get("none") is True and not logged:
        parts.append(NOTHING_RETURNED)
    notes = _strings(main.get("notes"))
    if notes:
        noted = main.get("noted")
        more = noted - len(notes) if type(noted) is int and noted > len(notes) else 0
        tail = f"; and {more} more" if more else ""
        parts.append(
            "The result was converted to JSON by the rule for values JSON cannot hold: "
            + "; ".join(notes)
            + tail
            + ". Return plain objects, arrays, strings and numbers to get exactly what you return."
        )
    return parts


def _strings(value: Any) -> list[str]:
    if not isinstance(value, list):
        return []
    return [one_line(v[:_MAX_PART_CHARS]) for v in value[:_MAX_PARTS] if isinstance(v, str)]


def _tool(name: str) -> str:
    name = one_line(name[:100])
    if name.startswith("sdk."):
        return f"`{name}(...)`"
    if name.isidentifier() and name.isascii():
        return f"`tools.{name}(...)`"
    return f"`tools[{json.dumps(name)}](...)`"

"""Errors that name their cause: each run error told with what to change.

The engine says what happened (``the program exceeded its 30s deadline
(waiting for a tool call)``); the model needs what to do next. :func:`told`
adds it, by the error's kind and what the run knows:

* a ``ReferenceError`` for a name that is one of the run's tools, or one of
  ``sdk``'s functions, says how to call it (``await tools.x({...})``,
  ``await sdk.search("words")``);
* a deadline reached while the program waited says what it waited for: a
  tool still running, the places of a throttle (by name), or an approval;
* every other kind ends with one sentence saying what to change
  (:data:`FIXES`).
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Iterable, Mapping, Optional, Sequence

from .._text import one_line
from ..events import ApprovalEvent
from .records import CallRecord

__all__ = ["FIXES", "told"]

#: What to change, by ``error.kind`` (an ``exception`` is the program's own
#: error, its message already says what; a ``timeout`` waiting for something
#: says what instead).
FIXES: Mapping[str, str] = {
    "timeout": "Look for a loop that never ends, or do less work in one run (fewer or smaller calls).",
    "abort": "Use less memory or recursion: process results in pieces, return only what is needed, "
    "and write deep recursion as a loop.",
    "invalid_output": "Return plain data: objects, arrays, strings, numbers, booleans and null.",
    "output_limit": "Return less: only the fields needed, fewer items, or a summary.",
    "cancelled": "The caller cancelled the run; nothing in the program needs to change.",
    "replay_diverged": "Run the program again from the start (without resuming).",
    "cpu_time": "Compute less in JavaScript: look for a loop that never ends, and leave heavy work to tools.",
}
_NOT_DEFINED = re.compile(r"^ReferenceError: '?([A-Za-z_$][\w$]*)'? is not defined")
_SDK = ("describe", "search")
_TOOLS_TYPOS = ("tool", "Tools", "TOOLS", "functions", "api")


def told(
    kind: str,
    message: str,
    names: Sequence[str],
    trail: Sequence[CallRecord] = (),
    events: Iterable[Any] = (),
    throttles: Optional[Mapping[str, Sequence[Any]]] = None,
    approvals: frozenset[str] = frozenset(),
) -> str:
    """``message`` of an error of ``kind`` with what to change added.
    ``names``: the run's tools; ``trail``, ``events``: its started calls and
    audit events; ``throttles``: the names of each tool's throttles;
    ``approvals``: the tools whose calls need an approval."""
    if kind == "exception":
        return _reference(message, names)
    if kind == "timeout" and "(waiting for a tool call)" in message:
        waited = _waited_for(trail, events, throttles or {}, approvals)
        if waited:
            return message.replace("(waiting for a tool call)", f"(waiting for {waited})") + ". " + _WAIT_FIX
    if kind == "timeout" and "(running JavaScript)" in message and _refused_at_deadline(trail, message):
        waited = _waited_for(trail, events, throttles or {}, approvals)
        if waited.startswith("a place in throttle"):
            return message.replace("(running JavaScript)", f"(waiting for {waited})") + ". " + _WAIT_FIX
    fix = FIXES.get(kind)
    return message if fix is None or fix in message else message + ". " + fix


_WAIT_FIX = "Make fewer or smaller calls, or ask for a longer timeout."
_DEADLINE = re.compile(r"exceeded its ([0-9.]+)s deadline")


def _refused_at_deadline(trail: Sequence[CallRecord], message: str) -> bool:
    """Whether the run's last call was refused by its throttles as the deadline passed (the program
    was handling that refusal when it was stopped): then what it waited for is the story."""
    found = _DEADLINE.search(message)
    if found is None or not trail or any(r.committed is None for r in trail):
        return False
    last = max(trail, key=lambda r: (r.committed or 0.0, r.seq))
    deadline = float(found.group(1))
    return last.began is None and last.throttled is not None and (last.committed or 0.0) >= deadline - 0.5


def _reference(message: str, names: Sequence[str]) -> str:
    found = _NOT_DEFINED.match(message)
    if found is None:
        return message
    name = found.group(1)
    if name in names:
        how = f"`{name}` is a tool: call it as `await tools.{name}({{...}})`."
    elif name in _SDK:
        how = f"`{name}` is an SDK function: call it as `await sdk.{name}(...)`."
    elif name in _TOOLS_TYPOS:
        how = "The tools are the global `tools`: call one as `await tools.<name>({...})`."
    else:
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.8)
        if not close:
            return message
        how = f"Did you mean the tool `{close[0]}`? Call it as `await tools.{close[0]}({{...}})`."
    head, sep, rest = message.partition("\n")
    return head + "; " + how + sep + rest


def _waited_for(
    trail: Sequence[CallRecord],
    events: Iterable[Any],
    throttles: Mapping[str, Sequence[Any]],
    approvals: frozenset[str],
) -> str:
    """What the oldest call still open at the deadline was waiting for, or ""."""
    open_calls = [r for r in trail if r.committed is None]
    if open_calls:
        record = min(open_calls, key=lambda r: r.seq)
    else:  # the answer came as the deadline passed: the last one
        done = [r for r in trail if r.committed is not None]
        if not done:
            return ""
        record = max(done, key=lambda r: (r.committed, r.seq))
    tool = one_line(record.tool[:100])
    if (
        record.began is None
        and (record.throttled is not None or record.committed is None)
        and throttles.get(record.tool)
    ):
        named = ", ".join(repr(one_line(str(getattr(n, "name", n))[:100])) for n in throttles[record.tool])
        trouble = "; ".join(
            dict.fromkeys(t for n in throttles[record.tool] if (t := getattr(n, "redis_trouble", None)))
        )
        said = f" ({one_line(trouble[:300])})" if trouble else ""
        return f"a place in throttle {named} before tool {tool!r} (call {record.seq}){said}"
    decided = {e.seq for e in events if type(e) is ApprovalEvent}
    if record.tool in approvals and record.seq not in decided:
        return f"an approval of tool {tool!r} (call {record.seq})"
    if record.began is None:
        return f"a free tool thread to run tool {tool!r} (call {record.seq})"
    return f"tool {tool!r} (call {record.seq}) to return"

"""Grants: one approval answer that approves more than the call it was asked about.

An approval handler answers a call with ``True`` (this call), ``False``
(refused), or a :class:`Grant`: this call, and later calls to the *same tool*
in the *same run*, chosen by

* ``calls=N``: ``N`` calls in all, this one counted (``Grant(calls=40)`` on the
  first of 40 writes approves the 40; the 41st asks again);
* ``matching={"table": "orders"}``: every call whose arguments hold each
  listed key with a value equal, as JSON, to the one given (``1`` and ``1.0``
  are one JSON number, ``1`` and ``true`` are not); the call asked about
  must match, or the answer is malformed and refuses;
* both: at most ``N`` calls that match;
* neither (``Grant()``): every call to the tool in this run.

What a caller may rely on (tests/test_grants.py):

* a grant never outlives its run: the next run asks again, and a grant is
  never shared between runs, however they share a handler;
* a grant covers exactly what it says: the ``N+1``-th call asks again, so do
  calls to another tool and calls whose arguments do not match;
* while a question about a tool waits for its answer, the run's other calls
  to that tool wait for it too (so one answer can cover them), then take
  their turns lowest ``seq`` first; calls to other tools are not held;
* a bad grant is a :class:`~nous_sched.ConfigError` naming the option
  (``Grant(calls=0)``), raised in the handler, so the call is refused; an
  answer that is not ``True``, ``False`` or a :class:`Grant` refuses with a
  reason naming what it was;
* the audit's ``approval`` record of the granting call carries ``grant`` (its
  id, ``"g<seq>"``, the granting call's seq) and ``granted`` (what it grants,
  :meth:`Grant.as_dict`); the record of every call it covers carries the
  same ``grant`` id and a reason naming it.

A durable run (``nous_sched.durable``) keeps its grants across suspensions
(sealed in the suspension's record), so one suspension's answer covers the
later calls of the resumed run without suspending again.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Optional

import attrs

from .. import _validators as v
from ..errors import ConfigError

__all__ = ["Grant", "Grants", "Held", "grant_id", "answer_of", "requested", "canonical", "MAX_CALLS", "MAX_KEYS"]

#: The most calls one grant may count (``calls``).
MAX_CALLS = 1_000_000
#: The most argument keys one ``matching`` constraint may list.
MAX_KEYS = 32


def canonical(value: Any) -> str:
    """``value`` as JSON text, one spelling per JSON value (keys sorted, no spaces):
    what ``matching`` compares. :raises ValueError: not JSON (NaN, a cycle, a set...)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _json_number_equal(value: Any) -> Any:
    # One JSON number, one value: 1.0 is 1 (JavaScript writes it so), True stays true.
    if type(value) is float and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _json_number_equal(x) for k, x in value.items()}
    if isinstance(value, list):
        return [_json_number_equal(x) for x in value]
    return value


def _key_text(value: Any) -> str:
    return canonical(_json_number_equal(value))


def _calls_ok(value: Any) -> bool:
    return value is None or (type(value) is int and 1 <= value <= MAX_CALLS)


def _matching_ok(value: Any) -> bool:
    if value is None:
        return True
    if not isinstance(value, Mapping) or not 1 <= len(value) <= MAX_KEYS:
        return False
    if not all(isinstance(k, str) and k for k in value):
        return False
    try:
        canonical(dict(value))
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def _frozen_matching(value: Any) -> Optional[Mapping[str, Any]]:
    if value is None or not _matching_ok(value):
        return value  # type: ignore[no-any-return]  # the validator refuses it
    return json.loads(canonical(dict(value)))  # type: ignore[no-any-return]  # a copy of its own, JSON only


CALLS = v.Check(f"None or an int from 1 to {MAX_CALLS:,} (the calls in all, this one counted)", _calls_ok)
MATCHING = v.Check(
    f"None or a mapping of 1 to {MAX_KEYS} non-empty str argument keys to JSON values",
    _matching_ok,
)


@attrs.frozen(eq=True, hash=False)
class Grant:
    """An approval answer that approves this call and later calls to the same tool
    in the same run: ``calls`` (in all, this one counted), those whose arguments
    match ``matching``, both, or (neither) every call; see ``nous_sched.gate.grants``.
    ``by`` says who granted it, for the audit (``""``: the approval handler).

    :raises ConfigError: a bad ``calls``, ``matching`` or ``by``, named.
    """

    calls: Optional[int] = attrs.field(default=None, validator=CALLS)
    matching: Optional[Mapping[str, Any]] = attrs.field(default=None, converter=_frozen_matching, validator=MATCHING)
    by: str = attrs.field(default="", validator=v.STR)

    def as_dict(self) -> dict[str, Any]:
        """JSON-shaped: ``{"calls", "matching", "by"}`` (``None`` for what is not limited)."""
        matching = None if self.matching is None else json.loads(canonical(dict(self.matching)))
        return {"calls": self.calls, "matching": matching, "by": self.by}

    @classmethod
    def from_dict(cls, data: Any) -> Grant:
        """The grant :meth:`as_dict` wrote. :raises ConfigError: not one."""
        if not isinstance(data, Mapping) or not set(data) <= {"calls", "matching", "by"}:
            v.fail("Grant", "from_dict", data, "a mapping with keys calls, matching, by")
        return cls(calls=data.get("calls"), matching=data.get("matching"), by=data.get("by", ""))

    def refusal(self, arguments: Any) -> Optional[str]:
        """Why this grant cannot answer a call with ``arguments`` (its ``matching``
        does not hold for them), or ``None`` when it can."""
        for key, wanted in (self.matching or {}).items():
            if not isinstance(arguments, Mapping) or key not in arguments:
                return f"the grant's `matching` names the argument {key!r}, which this call does not have"
            try:
                if _key_text(arguments[key]) != _key_text(wanted):
                    return f"the grant's `matching` wants {key!r} equal to {v.shown(wanted)}; this call's differs"
            except (TypeError, ValueError, RecursionError):
                return f"this call's argument {key!r} is not JSON"
        return None

    def describe(self) -> str:
        """What it grants, in words (for a reason in the audit, or a question): each
        key and value as ASCII JSON, clipped to ``SHOWN_CHARS`` characters."""
        parts = []
        if self.calls is not None:
            parts.append(f"{self.calls} call{'s' if self.calls != 1 else ''} in all")
        if self.matching:
            shown = ", ".join(f"{_shown(k)}={_shown(x)}" for k, x in self.matching.items())
            parts.append(f"the calls whose arguments match {shown}")
        return " of ".join(parts) if parts else "every call in this run"


#: Characters of each key and value :meth:`Grant.describe` shows before it is clipped.
SHOWN_CHARS = 80


def _shown(value: Any) -> str:
    # ASCII JSON: nothing a person's terminal would act on; clipped, so a reason stays short.
    text = json.dumps(_json_number_equal(value), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + f"... ({len(text):,} characters)"


def grant_id(seq: Optional[int]) -> str:
    """The id of the grant made by the answer to call ``seq`` (``"g<seq>"``)."""
    return f"g{seq if seq is not None else 0}"


def answer_of(answer: Any) -> tuple[bool, Optional[Grant], str]:
    """A handler's answer as ``(approved, grant or None, why not)``: ``True`` and a
    :class:`Grant` approve; ``False``/``None`` refuse; anything else refuses, the
    reason naming what it was (fail safe: a malformed answer denies)."""
    if answer is True:
        return True, None, ""
    if isinstance(answer, Grant):
        return True, answer, ""
    if answer is False or answer is None:
        return False, None, ""
    return False, None, f"the approval handler answered {v.shown(answer)}, not True, False or a nous_sched.Grant"


def requested(asked: Any, arguments: Any, by: str = "") -> Grant | str:
    """The grant a page or form asks for, for a call with ``arguments``: ``{"calls": N}``
    (N calls in all), ``{"match": [KEY, ...]}`` (the calls whose ``KEY`` arguments
    equal this call's), both, or ``{"all": true}`` alone (every call to the tool in
    the run); or, as a str, why it cannot be made (the caller refuses: fail safe)."""
    if not isinstance(asked, Mapping) or not asked or not set(asked) <= {"calls", "match", "all"}:
        return "`grant` must be {calls}, {match} (a list of argument names), both, or {all: true}"
    keys, every = asked.get("match"), asked.get("all")
    if every is not None and (every is not True or len(asked) != 1):
        return "`grant.all` must be true, and alone"
    matching = None
    if keys is not None:
        if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
            return "`grant.match` must be a list of argument names"
        if not isinstance(arguments, Mapping) or any(k not in arguments for k in keys):
            return "`grant.match` names an argument this call does not have"
        matching = {k: arguments[k] for k in keys}
    if every is None and asked.get("calls") is None and matching is None:
        return "`grant.calls` must be a number of calls"
    try:
        return Grant(calls=asked.get("calls"), matching=matching, by=by)
    except ConfigError as exc:
        return str(exc)


@attrs.define
class Held:
    """A grant the run holds: its ``id``, ``tool``, the ``grant``, and the calls it has covered (``used``)."""

    id: str
    tool: str
    grant: Grant
    used: int = 1

    def covers(self, tool: str, arguments: Any) -> bool:
        if tool != self.tool or (self.grant.calls is not None and self.used >= self.grant.calls):
            return False
        return self.grant.refusal(arguments) is None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "tool": self.tool, "grant": self.grant.as_dict(), "used": self.used}


class Grants:
    """The grants one run holds: made by its approval answers, gone with the run.

    Thread-safe. :meth:`turn` is the per-tool turn a call takes before it is
    covered or asks (see the module docstring), :meth:`cover` spends a held
    grant on a call, :meth:`add` holds a new one.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._held: list[Held] = []
        self._asking: set[str] = set()
        self._waiting: dict[str, set[int]] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        return (Grants, ())  # pickled (a call run in another process): none held there, it asks

    @contextmanager
    def turn(self, tool: str, seq: int, deadline: Optional[float]) -> Iterator[bool]:
        """Wait for this call's turn at ``tool``'s questions: yields True once no
        question about ``tool`` is out and no lower ``seq`` waits, False when
        ``deadline`` (``time.monotonic()``) passes first."""
        had = False
        with self._cond:
            waiting = self._waiting.setdefault(tool, set())
            waiting.add(seq)
            try:
                while tool in self._asking or min(waiting) != seq:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        break
                    self._cond.wait(remaining)
                else:
                    self._asking.add(tool)
                    had = True
            finally:
                waiting.discard(seq)
                self._cond.notify_all()
        try:
            yield had
        finally:
            if had:
                with self._cond:
                    self._asking.discard(tool)
                    self._cond.notify_all()

    def cover(self, tool: str, arguments: Any) -> Optional[Held]:
        """Spend the first held grant that covers a call of ``tool`` with ``arguments``; which, or None."""
        with self._cond:
            for held in self._held:
                if held.covers(tool, arguments):
                    held.used += 1
                    return held
        return None

    def add(self, grant: Grant, tool: str, seq: Optional[int]) -> Held:
        """Hold ``grant``, made by the answer to call ``seq`` of ``tool`` (which it covers: counted)."""
        held = Held(grant_id(seq), tool, grant)
        with self._cond:
            self._held.append(held)
        return held

    def state(self) -> list[dict[str, Any]]:
        """The grants held, JSON-shaped (a durable run's suspension keeps them)."""
        with self._cond:
            return [h.as_dict() for h in self._held]

    def restore(self, state: Any) -> None:
        """Hold again what :meth:`state` wrote; an entry of any other shape is dropped
        (its calls ask again)."""
        for entry in state if isinstance(state, list) else ():
            try:
                held = Held(str(entry["id"]), str(entry["tool"]), Grant.from_dict(entry["grant"]), _used(entry["used"]))
            except Exception:  # fail safe: a grant that cannot be read covers nothing
                continue
            with self._cond:
                self._held.append(held)


def _used(value: Any) -> int:
    if type(value) is not int or value < 1:
        raise ValueError(value)
    return value

"""The usage ledger: where a run's characters went.

Every value that crosses into a program and every answer that goes back to a
model costs context. :class:`Usage`, on every :class:`~nous_sched.RunResult`,
says how much: for each sub-call the size of the result the program received,
and for the run what the model got back and what the output budget
(:mod:`nous_sched.budget`) took off. The same numbers are in the live events
(:mod:`nous_sched.live`: each ``commit``'s ``chars``, the ``end`` event's
``usage``) and in the OpenTelemetry run span (:mod:`nous_sched.otel`).

Sizes are characters: of a sub-call's result, its compact JSON text as the
program receives it (non-ASCII characters escaped as ``\\uXXXX``, as it
crosses into the sandbox); of the model's answer, ``json.dumps(answer,
ensure_ascii=False)``, as the adapters send it.
"""

from __future__ import annotations

from typing import Any, Optional

import attrs

__all__ = ["CallUsage", "Usage"]


@attrs.frozen
class CallUsage:
    """One sub-call the program received an answer to.

    ``seq`` is the call's sequence number (``None`` for a call the gate
    refused before it started); ``chars`` the size of the result (or the
    ``{tool, message}`` error) the program received; ``ok`` whether it was a
    result.
    """

    seq: Optional[int]
    tool: str
    chars: int
    ok: bool

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "tool": self.tool, "chars": self.chars, "ok": self.ok}


@attrs.frozen
class Usage:
    """A run's ledger. ``calls`` in the order the program received them
    (sequence order for started calls).

    ``answer_chars`` is the size of the model-facing answer before any budget
    (:meth:`~nous_sched.RunResult.to_dict`), ``model_chars`` what the model
    got (:meth:`~nous_sched.RunResult.for_model`), and ``cut_chars`` their
    difference: what the output budget took off (0 without one, or when the
    answer fit).
    """

    calls: tuple[CallUsage, ...] = ()
    answer_chars: int = 0
    model_chars: int = 0
    #: The characters of the answer's ``hint`` (:mod:`nous_sched._hints`), counted in both sizes above.
    hint_chars: int = 0

    @property
    def received_chars(self) -> int:
        """Everything the program received from its sub-calls."""
        return sum(c.chars for c in self.calls)

    @property
    def cut_chars(self) -> int:
        return self.answer_chars - self.model_chars

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": [c.as_dict() for c in self.calls],
            "received_chars": self.received_chars,
            "answer_chars": self.answer_chars,
            "model_chars": self.model_chars,
            "cut_chars": self.cut_chars,
            "hint_chars": self.hint_chars,
        }

"""The usage ledger: where a run's context went.

Every value that crosses into a program and every answer that goes back to a
model costs context. :class:`Usage`, on every :class:`~nous_sched.RunResult`,
says how much: for each sub-call the size of the result the program received,
and for the run what the model got back and what the output budget
(:mod:`nous_sched.result.budget`) took off. The same numbers are in the live events
(:mod:`nous_sched.live`: each ``commit``'s ``chars``, the ``end`` event's
``usage``) and in the OpenTelemetry run span (:mod:`nous_sched.otel`).

Sizes: of a sub-call's result (``chars``), the characters of its compact
JSON text as the program receives it (non-ASCII characters escaped as
``\\uXXXX``, as it crosses into the sandbox: ASCII, so as many bytes); of
the model's answer (``answer_bytes``, ``model_bytes``, ``cut_bytes``), the
bytes of the UTF-8 of ``json.dumps(answer, ensure_ascii=False)``, as the
adapters send it, the output budget's unit (:mod:`nous_sched.result.budget`: bytes
bound what a model pays, characters do not).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Optional

import attrs

from .._slots import LATER, record

if TYPE_CHECKING:  # mypy's attrs plugin knows attrs' own decorator (attrs.evolve, attrs.fields), not record
    from attrs import frozen as _made
else:  # the same class, its __init__ the record's (nous_sched._slots)
    from .._slots import record as _made

__all__ = ["CallUsage", "Usage", "calls_later"]


@record  # (one per call: made as the run ends)
class CallUsage:
    """One sub-call the program received an answer to.

    ``seq`` is the call's sequence number among the calls that started (a
    call denied approval started: it has one; ``None`` for a call the gate
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


class _Ledger:
    """A run's ledger rows, ``(seq, tool, chars, ok)`` each, held by :class:`Usage` until its ``calls`` are read."""

    # Tuples of plain values, which the garbage collector stops tracking: a run's
    # thousand calls keep no thousand records alive for it to look at.
    __slots__ = ("rows",)

    def __init__(self, rows: tuple[tuple[Any, ...], ...]) -> None:
        self.rows = rows

    def build(self) -> tuple["CallUsage", ...]:
        return tuple(CallUsage(*row) for row in self.rows)


def calls_later(rows: Iterable[tuple[Optional[int], str, int, bool]]) -> tuple[CallUsage, ...]:
    """:attr:`Usage.calls` for the ledger ``rows`` (``(seq, tool, chars, ok)`` each, copied
    now), made into :class:`CallUsage` records on first read: a reader cannot tell."""
    return _Ledger(tuple(rows))  # type: ignore[return-value]  # held: read, it is the records' tuple


@_made
class Usage:
    """A run's ledger. ``calls`` in the order the program received them
    (sequence order for started calls): every call the program made, each
    once, refusals included.

    A durable run (``approval_store=``, ``nous_sched.durable``) keeps the
    same ledger as a plain run of the same program with the same decisions:
    a resumed run's ``calls`` are the whole program's, the ones replayed from
    before its suspensions and those held at a suspension included, numbered
    as if it had never suspended (so its ``seq`` are not the ``seq`` of its
    suspension's pending calls, which count refusals too).

    ``answer_bytes`` is the size in bytes (UTF-8, ``nous_sched.result.budget.size``)
    of the model-facing answer before any budget
    (:meth:`~nous_sched.RunResult.to_dict`), ``model_bytes`` what the model
    got (:meth:`~nous_sched.RunResult.for_model`), and ``cut_bytes`` their
    difference: what the output budget took off (0 without one, or when the
    answer fit).

    ``held_bytes`` is what stayed on the host instead of crossing: the UTF-8
    bytes of the JSON text of every part of a result the run kept as a blob
    (``nous_sched.blobs``; the program received its handle, counted in
    ``calls``); ``read_chars`` the characters the program read of them with
    ``blobs.read`` (not in ``received_chars``, which counts sub-calls only).
    """

    calls: tuple[CallUsage, ...] = attrs.field(default=(), metadata={LATER: (_Ledger, _Ledger.build)})
    answer_bytes: int = 0
    model_bytes: int = 0
    #: The bytes of the answer's ``hint`` (``nous_sched.result._hints``), counted in both sizes above.
    hint_bytes: int = 0
    held_bytes: int = 0
    read_chars: int = 0

    @property
    def received_chars(self) -> int:
        """Everything the program received from its sub-calls."""
        return sum(c.chars for c in self.calls)

    @property
    def cut_bytes(self) -> int:
        return self.answer_bytes - self.model_bytes

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": [c.as_dict() for c in self.calls],
            "received_chars": self.received_chars,
            "answer_bytes": self.answer_bytes,
            "model_bytes": self.model_bytes,
            "cut_bytes": self.cut_bytes,
            "hint_bytes": self.hint_bytes,
            "held_bytes": self.held_bytes,
            "read_chars": self.read_chars,
        }

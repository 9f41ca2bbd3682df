"""The result of running one program: data, whatever happened."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

import attrs

from .. import _validators as v
from .._slots import LATER
from ..events import ApprovalEvent, ContextUpdate, Event, ToolCallEvent, ToolOutcomeEvent, ToolRefusedEvent
from .records import CallRecord, HeldAudit, HeldTrail
from .usage import Usage

if TYPE_CHECKING:  # mypy's attrs plugin knows attrs' own decorator (attrs.evolve, attrs.fields), not record
    from attrs import frozen as _made
else:  # the same class, its __init__ the record's (nous_sched._slots)
    from .._slots import record as _made

__all__ = ["RunResult", "RunError", "ERROR_KINDS"]

#: Every ``error.kind`` a run can end with.
ERROR_KINDS = (
    "exception",
    "timeout",
    "abort",
    "invalid_output",
    "output_limit",
    "cancelled",
    "replay_diverged",
    "cpu_time",
    "review_denied",
)


@attrs.frozen
class RunError:
    """Why a run failed. ``kind`` is one of :data:`ERROR_KINDS`:

    * ``exception`` - the program threw (or awaited something nothing will
      ever settle, or had a syntax error); ``message`` is ``"Name: message"``
      with the program's stack when it has one.
    * ``timeout`` - the run's deadline passed (a runaway loop, a hung tool).
    * ``abort`` - the engine stopped the program: memory or stack limit, or
      the worker process running it died (a signal, the OOM killer, a crash),
      or no worker process could be started for it (tried twice).
    * ``invalid_output`` - the returned value has no JSON form: a function or
      a symbol, a getter that throws, or a number the host cannot hold (a
      ``Map``, ``BigInt``, cycle and the like are converted instead, and the
      ``hint`` says so: ``nous_sched.result._hints``).
    * ``output_limit`` - the returned value's JSON exceeds the byte limit.
    * ``cancelled`` - the caller cancelled the run (``run_code(cancel=...)``).
    * ``replay_diverged`` - a resumed run (:func:`nous_sched.resume`) made a
      call other than the one its ledger recorded, or was given other tools
      than the run that suspended; nothing was run.
    * ``cpu_time`` - the program used its CPU budget (``Limits.cpu_time``:
      its JavaScript's own time, waits not counted) before the deadline.
    * ``review_denied`` - the run's reviewer (``run_code(review=...)``)
      denied the program before it started, or failed (raised, did not
      answer in time, answered something else: it fails closed); ``message``
      is its reason; nothing was run.
    """

    kind: str = attrs.field(validator=v.one_of(ERROR_KINDS))
    message: str = attrs.field(validator=v.STR)

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message}


@_made
class RunResult:
    """What a run produced. Logs are kept whether it succeeded or not.

    ``events`` is the audit trail, in the order written: one ``tool_call``
    (:class:`~nous_sched.ToolCallEvent`) per started sub-call, each approval
    decision (:class:`~nous_sched.ApprovalEvent`) and each started call's
    ``tool_outcome`` (:class:`~nous_sched.ToolOutcomeEvent`: ok, or the
    error's kind and message, and the result's size); :attr:`calls` is its
    ``tool_call`` records alone, in submission order. ``refused`` the calls the gate refused before they
    started (``nous_sched.gate``), and ``trail`` the timeline of the
    started calls; none of them is part of what the model reads
    (:meth:`to_dict`). ``error.message`` is at most 4000 characters plus a
    truncation marker.

    ``usage`` is the run's ledger (:class:`~nous_sched.result.usage.Usage`): what each
    sub-call's result cost the program, what the model got and what the
    output budget cut. ``budgeted`` is the model-facing answer cut to the
    run's ``output_budget`` (``nous_sched.result.budget``), when it had one and
    the answer did not fit; :meth:`for_model` returns it.
    """

    logs: tuple[str, ...] = ()
    result: Any = None
    error: Optional[RunError] = None
    events: tuple[Union[ToolCallEvent, ApprovalEvent, ToolOutcomeEvent], ...] = attrs.field(
        default=(), metadata={LATER: (HeldAudit, HeldAudit.build)}
    )
    trail: tuple[CallRecord, ...] = attrs.field(default=(), metadata={LATER: (HeldTrail, HeldTrail.build)})
    elapsed: float = 0.0
    refused: tuple[ToolRefusedEvent, ...] = ()
    usage: Usage = Usage()
    budgeted: Optional[dict[str, Any]] = attrs.field(default=None, eq=False, repr=False)

    @property
    def calls(self) -> tuple[ToolCallEvent, ...]:
        """The ``tool_call`` records of ``events``: one per started sub-call, in submission order."""
        return tuple(e for e in self.events if type(e) is ToolCallEvent)

    #: A durable run that suspended for approval: a :class:`~nous_sched.Suspension` (see ``nous_sched.durable``).
    suspended: Any = None
    #: The run's ``state`` events (its program's state operations, ``run_code(state=...)``), then a
    #: durable run's audit events: ``suspended``, ``approval``, ``resumed``.
    audit: tuple[Event, ...] = ()
    #: What the run probably did not mean, and the fix ("" for nothing):
    #: see ``nous_sched.result._hints``. In :meth:`to_dict` as ``"hint"`` when set.
    hint: str = ""

    @property
    def ok(self) -> bool:
        """True when the run finished without an error (a suspended run has not finished)."""
        return self.error is None and self.suspended is None

    def to_dict(self) -> dict[str, Any]:
        """The model-facing shape: ``{"logs", "result"}`` or ``{"logs", "error": {kind, message}}``,
        with ``"hint"`` (:attr:`hint`) when the run has one."""
        if self.suspended is not None:
            return {"logs": list(self.logs), "suspended": self.suspended.as_dict()}
        answer: dict[str, Any] = (
            {"logs": list(self.logs), "result": self.result}
            if self.error is None
            else {"logs": list(self.logs), "error": self.error.as_dict()}
        )
        if self.hint:
            answer["hint"] = self.hint
        return answer

    def for_model(self) -> dict[str, Any]:
        """What the model reads: :meth:`to_dict`, cut to the run's output budget when it had one."""
        return self.budgeted if self.budgeted is not None else self.to_dict()

    def context_update(self) -> ContextUpdate:
        """The audit events (started calls, then refused ones) as ``log_event`` operations for the caller's own log."""
        return ContextUpdate.log_events((*self.events, *self.refused))

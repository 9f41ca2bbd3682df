"""Timeline values: what a call did when (CallRecord), and the lane at one instant (LaneState).

Both are frozen values built by the scheduler; nothing here knows about threads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Optional

import attrs

from .._slots import record
from ..events import ToolCallEvent, ToolOutcomeEvent

__all__ = ["CallRecord", "LaneState", "trail_later", "audit_later", "made"]


@record  # (one per call: made as the run ends)
class CallRecord:
    """Timeline of one started call, in seconds since the scheduler started.

    ``started`` is when the scheduler handed the call to the executor (and
    wrote its audit event); ``began`` when a tool thread actually took it up,
    ``None`` if none ever did (an executor saturated by other work until the
    run was over: such a call never runs). ``finished`` and ``committed`` are
    ``None`` for a call abandoned at stop. ``reason`` says why an exclusive
    call ran exclusive (the tool's ``exclusive_reason``, e.g. ``"untrusted
    server"``, or what its ``concurrency_safe`` predicate did); ``""`` for a
    parallel call.


    ``throttled`` is how many seconds the call waited for the places of its
    tool's throttles (:class:`~nous_sched.Throttle`), after a thread took it
    up and before ``began``: ``began - started - throttled`` is the wait for
    a thread. ``None`` when its tool names no throttle.
    """

    if TYPE_CHECKING:  # what attrs.asdict and attrs.fields ask of an attrs class (record makes one)
        __attrs_attrs__: ClassVar[Any]

    seq: int
    tool: str
    mode: str
    started: float
    finished: Optional[float] = None
    committed: Optional[float] = None
    ok: Optional[bool] = None
    began: Optional[float] = None
    reason: str = ""
    throttled: Optional[float] = None


class HeldTrail:
    """A run's trail as rows, one per started call (:meth:`CallRecord`'s fields in its
    order), held by :class:`~nous_sched.RunResult` until its ``trail`` is read."""

    # Tuples of plain values, which the garbage collector stops tracking.
    __slots__ = ("rows",)

    def __init__(self, rows: tuple[tuple[Any, ...], ...]) -> None:
        self.rows = rows

    def build(self) -> tuple[CallRecord, ...]:
        return tuple(CallRecord(*row) for row in self.rows)


def trail_later(rows: Any) -> tuple[CallRecord, ...]:
    """``RunResult.trail`` for ``rows`` (each :class:`CallRecord`'s fields in its order,
    copied now), made into records on first read: a reader cannot tell."""
    return HeldTrail(tuple(rows))  # type: ignore[return-value]  # held: read, it is the records' tuple


def made(entry: Any) -> Any:
    """An audit entry as its record: a *held* entry, a tuple of the record's ``type``
    (``"tool_call"`` or ``"tool_outcome"``) and then the arguments it is made with, is made
    now (a new record each time); a record is itself."""
    return _HELD[entry[0]](*entry[1:]) if type(entry) is tuple else entry


# By its type's name, not its class: a held entry of plain values (a tool_call's
# arguments are held as text: events.frozen_later) is one the garbage collector
# stops tracking at its first look, though the run keeps it to its end.
_HELD = {ToolCallEvent.type: ToolCallEvent, ToolOutcomeEvent.type: ToolOutcomeEvent}


class HeldAudit:
    """A run's audit records as the scheduler holds them (each a record, or held:
    :func:`made`), held by :class:`~nous_sched.RunResult` until its ``events`` is read."""

    __slots__ = ("entries",)

    def __init__(self, entries: tuple[Any, ...]) -> None:
        self.entries = entries

    def build(self) -> tuple[Any, ...]:
        return tuple(made(entry) for entry in self.entries)


def audit_later(entries: Any) -> tuple[Any, ...]:
    """``RunResult.events`` for ``entries`` (records, or held: :func:`made`; copied now),
    each held one made into its record on first read: a reader cannot tell."""
    return HeldAudit(tuple(entries))  # type: ignore[return-value]  # held: read, it is the records' tuple


@attrs.frozen
class LaneState:
    """A consistent view of the lane, read on the driver (for tests and progress)."""

    pending: tuple[int, ...]
    inflight: tuple[int, ...]
    settled: tuple[int, ...]
    cursor: int
    exclusive: Optional[int]
    submitted: int
    stopped: bool

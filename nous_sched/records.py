"""Timeline values: what a call did when (CallRecord), and the lane at one instant (LaneState).

Both are frozen values built by the scheduler; nothing here knows about threads.
"""

from __future__ import annotations

from typing import Optional

import attrs

__all__ = ["CallRecord", "LaneState"]


@attrs.frozen
class CallRecord:
    """Timeline of one started call, in seconds since the scheduler started.

    ``finished`` and ``committed`` are ``None`` for a call abandoned at stop.
    """

    seq: int
    tool: str
    mode: str
    started: float
    finished: Optional[float] = None
    committed: Optional[float] = None
    ok: Optional[bool] = None


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

"""A scheduler's trail keeps a committed call as its row, not its Timeline.

A committed call's :class:`~nous_sched.scheduler.Timeline` is final, so the
trail keeps its row (``Timeline.row``: plain values in a tuple, which the
garbage collector stops tracking) and lets the Timeline go; a run of many
calls no longer holds one tracked object per call to its end. Readers
cannot tell: ``trail()`` and ``trail_rows()`` give the same records and rows,
mid-run (committed calls beside running ones) and after.
"""

from __future__ import annotations

import gc
import threading
from typing import Any

from nous_sched import CallRecord, Scheduler, Tool, run_code
from nous_sched.scheduler._calls import Timeline
from nous_sched.tooling import PARALLEL


def _live_timelines() -> int:
    return sum(1 for o in gc.get_objects() if type(o) is Timeline)


def test_a_run_holds_no_timeline_of_a_committed_call():
    # Sequential awaits: every earlier call has committed when the next one runs.
    seen: list[int] = []
    baseline = _live_timelines()

    def count(args: dict[str, Any]) -> int:
        seen.append(_live_timelines() - baseline)
        return int(args["i"])

    tool = Tool("count", count, concurrency_safe=lambda args: True)
    result = run_code(
        "let s = 0; for (let i = 0; i < 40; i++) s += await tools.count({i}); return s;",
        [tool],
        description="sums forty counts",
    )
    assert result.ok, result.error
    assert result.result == sum(range(40))
    assert len(seen) == 40
    # Before: the trail held every Timeline, so the 40th call saw all 40.
    assert max(seen) <= 3, seen
    assert [r.seq for r in result.trail] == list(range(40))
    assert all(r.ok and r.committed is not None and r.finished is not None for r in result.trail)


def test_trail_mid_run_gives_committed_rows_beside_running_timelines():
    release = threading.Event()
    started = threading.Event()

    def hold(args: dict[str, Any]) -> int:
        started.set()
        release.wait(10)
        return 1

    quick = Tool("quick", lambda args: 0, concurrency_safe=lambda args: True)
    slow = Tool("slow", hold, concurrency_safe=lambda args: True)
    scheduler = Scheduler(max_parallel=4)
    try:
        first = scheduler.submit(quick, {})
        assert scheduler.wait(first, timeout=10) is not None
        second = scheduler.submit(slow, {})
        assert started.wait(10)
        # The first call committed (a row in the trail), the second still runs (its Timeline).
        mid = scheduler.trail()
        rows = scheduler.trail_rows()
        assert [r.seq for r in mid] == [0, 1]
        assert all(type(r) is CallRecord for r in mid)
        assert [CallRecord(*row) for row in rows] == mid
        assert mid[0].ok is True and mid[0].committed is not None and mid[0].mode == PARALLEL
        assert mid[1].committed is None and mid[1].ok is None and mid[1].tool == "slow"
        release.set()
        assert scheduler.wait(second, timeout=10) is not None
        done = scheduler.trail()
        assert done[0] == mid[0]  # a committed call's record does not change
        assert done[1].committed is not None and done[1].ok is True
        assert [CallRecord(*row) for row in scheduler.trail_rows()] == done
    finally:
        release.set()
        scheduler.stop()

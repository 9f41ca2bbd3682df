"""Thread hygiene: a stopped Scheduler leaves no thread of its own behind: its
driver went back idle to the shared driver threads, and no tool thread is busy."""

from __future__ import annotations

import concurrent.futures
import threading
import time

from nous_sched import Scheduler, Tool
from nous_sched.scheduler import _driver_threads
from nous_sched.scheduler._tool_threads import retire_shared

PREFIX = "nous-sched"


def _ours():
    return [t for t in threading.enumerate() if t.name.startswith(PREFIX)]


def test_a_thousand_schedulers_leave_no_threads_behind():
    before = {t.name for t in _ours()}
    shared = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="test-shared-pool")
    safe = Tool("safe", lambda args: args["i"], concurrency_safe=lambda args: True)
    plain = Tool("plain", lambda args: args["i"])
    made = 0
    try:
        for batch in range(20):
            lanes = []
            for j in range(50):
                i = batch * 50 + j
                executor = shared if i % 3 == 0 else None  # some share the caller's executor
                lanes.append((i, Scheduler(executor=executor, max_parallel=1 + i % 4, timeout=30)))
                made += 1
            for i, s in lanes:
                if i % 2 == 0:  # half of them run one call
                    outcome = s.call(safe if i % 4 == 0 else plain, {"i": i})
                    assert outcome.value == i, outcome
            for _, s in lanes:
                s.stop()
        assert made == 1000
        # The shared executor is still usable: stop() left it alone.
        assert shared.submit(lambda: "still here").result(10) == "still here"
    finally:
        shared.shutdown(wait=True)

    # The shared tool and driver threads stay warm for the next run; retired,
    # every one exits unless a tool is still running on it, or it still drives
    # a scheduler (either would be a leak).
    assert retire_shared() == []
    assert _driver_threads.retire_shared() == []
    deadline = time.monotonic() + 10
    for t in _ours():
        t.join(max(0.0, deadline - time.monotonic()))
    alive = _ours()
    assert not alive, (
        f"{len(alive)} nous-sched thread(s) still alive: {sorted(t.name for t in alive)}"
        f" (alive before this test: {sorted(before)})"
    )

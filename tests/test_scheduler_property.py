"""Property: whatever the mix of calls, the ceiling and the finish order, the lane
commits in submission order, never exceeds ``max_parallel`` and lets nothing
into an exclusive call's [start, commit] window.

The finish order is drawn and enforced without sleeps: every call blocks on its
own gate; a controller thread opens the gates in the drawn order, but only for
calls that have started (a call may not be able to start until others commit),
waiting on a condition when none of the remaining ones has.
"""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from nous_sched import Scheduler, Tool

WAIT = 10.0


@st.composite
def scenarios(draw):
    n = draw(st.integers(min_value=1, max_value=10))
    safe = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    max_parallel = draw(st.integers(min_value=1, max_value=6))
    finish_order = draw(st.permutations(range(n)))
    return safe, max_parallel, finish_order


@settings(max_examples=60, deadline=None)
@given(scenarios())
def test_commit_order_ceiling_and_exclusive_windows(scenario):
    safe, max_parallel, finish_order = scenario
    n = len(safe)
    cond = threading.Condition()
    started = [False] * n
    gates = [threading.Event() for _ in range(n)]
    load = {"now": 0, "max": 0}
    phases: list[tuple[str, int]] = []  # appended on the driver thread only

    def run(args):
        i = args["i"]
        with cond:
            load["now"] += 1
            load["max"] = max(load["max"], load["now"])
            started[i] = True
            cond.notify_all()
        try:
            if not gates[i].wait(WAIT):
                raise RuntimeError(f"gate {i} never opened")
        finally:
            with cond:
                load["now"] -= 1
        return i

    def observer(record, phase):
        phases.append((phase, record.seq))

    tools = {True: Tool("safe", run, concurrency_safe=lambda args: True), False: Tool("excl", run)}
    controller_error: list[BaseException] = []
    released: list[int] = []

    def controller():
        try:
            remaining = list(finish_order)
            while remaining:
                with cond:
                    if not cond.wait_for(lambda: any(started[i] for i in remaining), WAIT):
                        raise AssertionError(f"none of {remaining} started; released {released}")
                    pick = next(i for i in remaining if started[i])
                remaining.remove(pick)
                released.append(pick)
                gates[pick].set()
        except BaseException as exc:  # reported by the test thread
            controller_error.append(exc)

    s = Scheduler(max_parallel=max_parallel, observer=observer, timeout=30)
    thread = threading.Thread(target=controller, name="property-controller")
    try:
        tickets = [s.submit(tools[safe[i]], {"i": i}) for i in range(n)]
        thread.start()
        outcomes = [s.wait(t) for t in tickets]
        thread.join(WAIT)
        assert not controller_error, controller_error
        assert [o.value for o in outcomes] == list(range(n)), outcomes
        trail = s.trail()
    finally:
        for gate in gates:
            gate.set()
        s.stop()
        thread.join(WAIT)
    # After stop() the driver has exited: `phases` is complete.

    # 1. Commits in submission order, by the observer and by the trail.
    assert [seq for phase, seq in phases if phase == "commit"] == list(range(n))
    assert [r.seq for r in trail] == list(range(n))
    committed = [r.committed for r in trail]
    assert committed == sorted(committed)
    assert all(r.started <= r.finished <= r.committed for r in trail)
    assert [r.mode for r in trail] == ["parallel" if x else "exclusive" for x in safe]

    # 2. The ceiling: inside the tools, and by the trail's [started, finished) intervals.
    assert load["max"] <= max_parallel
    points = sorted([(r.started, 1) for r in trail] + [(r.finished, -1) for r in trail], key=lambda p: (p[0], p[1]))
    running = peak = 0
    for _, delta in points:
        running += delta
        peak = max(peak, running)
    assert peak <= max_parallel

    # 3. Exclusive windows: by the observer's event order...
    for e in (i for i in range(n) if not safe[i]):
        start, commit = phases.index(("start", e)), phases.index(("commit", e))
        assert commit == start + 1, f"something happened inside exclusive {e}'s window: {phases}"
        before = phases[:start]
        assert all(("commit", c) in before for c in range(e)), f"{e} started before its predecessors committed"
        assert not any(seq > e for _, seq in before), f"a later call started before exclusive {e}"
    # ... and by the trail's timestamps.
    for e in (r for r in trail if r.mode == "exclusive"):
        for c in trail:
            if c.seq != e.seq:
                assert c.committed <= e.started or c.started >= e.committed, (e, c)

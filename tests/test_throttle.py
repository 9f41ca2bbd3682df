"""Throttles (nous_sched/throttle/_throttle.py, the pure core nous_sched/throttle/_arbiter.py).

The pure arbiter is driven with a clock the test holds (FIFO, all or none,
rate windows, and a hypothesis state machine of random requests, releases
and cancels over three limits); the threads are driven by real runs: 8 runs
of 20 calls through one ``max_running=3`` throttle, the deadline passing
while a call waits, a stopped run giving its places back, a raising tool
giving its place back, two throttles on one tool under a random schedule.
The Redis half is in tests/test_throttle_redis.py.
"""

from __future__ import annotations

import math
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import nous_sched
from nous_sched import ConfigError, QuickJSRuntime, Throttle, Tool, function_tool, run_code
from nous_sched.throttle import DEADLINE_PASSED
from nous_sched.throttle._arbiter import Arbiter, Limit, Request

WAIT = 30.0


def eventually(condition, what: str, timeout: float = WAIT) -> None:
    """Poll ``condition`` (a state query, not an ordering device) until true or fail."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        pause.wait(0.002)


class Peak:
    """Counts calls inside a tool at once; ``peak`` is the most ever seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0
        self.calls = 0

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.calls += 1
            self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


# -- the pure core --------------------------------------------------------------


def test_waiters_are_granted_first_come_first_served():
    arbiter: Arbiter[int] = Arbiter()
    limit = Limit(max_running=1)
    holder = Request([limit], -1)
    assert arbiter.request(holder, 0.0) == [holder]
    waiters = [Request([limit], i) for i in range(5)]
    for w in waiters:
        assert arbiter.request(w, 0.0) == []
    assert limit.waiting == 5
    order = []
    current = holder
    for _ in range(5):
        (granted,) = arbiter.release(current, 0.0)
        order.append(granted.item)
        current = granted
    assert order == [0, 1, 2, 3, 4]
    assert limit.running == 1 and limit.waiting == 0


def test_a_request_takes_all_its_places_or_none():
    arbiter: Arbiter[str] = Arbiter()
    a, b = Limit(max_running=1), Limit(max_running=1)
    holder = Request([a], "holder")
    arbiter.request(holder, 0.0)
    both = Request([a, b], "both")
    assert arbiter.request(both, 0.0) == []
    assert b.running == 0  # free, but not taken while `a` is not
    # A later request for `b` alone does not overtake the earlier one waiting for it.
    only_b = Request([b], "only b")
    assert arbiter.request(only_b, 0.0) == []
    assert arbiter.release(holder, 0.0) == [both]
    assert (a.running, b.running) == (1, 1)
    assert arbiter.release(both, 0.0) == [only_b]


def test_a_later_request_on_other_limits_is_not_held_up():
    arbiter: Arbiter[str] = Arbiter()
    a, b = Limit(max_running=1), Limit(max_running=1)
    arbiter.request(Request([a], "holder"), 0.0)
    assert arbiter.request(Request([a], "waits"), 0.0) == []
    other = Request([b], "other")
    assert arbiter.request(other, 0.0) == [other]


def test_cancelling_a_waiter_lets_the_next_through():
    arbiter: Arbiter[str] = Arbiter()
    a, b = Limit(max_running=1), Limit(max_running=1)
    arbiter.request(Request([a], "holder"), 0.0)
    blocked = Request([a, b], "blocked")
    arbiter.request(blocked, 0.0)
    behind = Request([b], "behind")
    assert arbiter.request(behind, 0.0) == []
    assert arbiter.cancel(blocked, 0.0) == [behind]
    assert blocked.state == "cancelled"
    assert arbiter.cancel(blocked, 0.0) == []  # idempotent


def test_per_second_window_with_an_injected_clock():
    arbiter: Arbiter[int] = Arbiter()
    limit = Limit(per_second=2)
    granted_at: dict[int, float] = {}
    queued = [Request([limit], i) for i in range(5)]

    def settle(now, granted):
        for r in granted:
            granted_at[r.item] = now
            arbiter.release(r, now)  # finished at once: only the rate holds them back

    for r in queued:
        settle(0.0, arbiter.request(r, 0.0))
    assert sorted(granted_at) == [0, 1]
    assert arbiter.wake == pytest.approx(1.0)
    settle(0.999, arbiter.grant(0.999))
    assert sorted(granted_at) == [0, 1]
    settle(1.0, arbiter.grant(1.0))
    assert sorted(granted_at) == [0, 1, 2, 3]
    settle(2.0, arbiter.grant(2.0))
    assert granted_at == {0: 0.0, 1: 0.0, 2: 1.0, 3: 1.0, 4: 2.0}
    assert arbiter.wake == math.inf


def test_burst_sets_the_window():
    limit = Limit(per_second=10, burst=5)
    assert limit.window == pytest.approx(0.5)
    for _ in range(5):
        assert limit.opens_at(0.0) is None
        limit.take(0.0)
    assert limit.opens_at(0.1) == pytest.approx(0.5)
    assert limit.opens_at(0.5) is None


def test_fractional_rates_allow_one_start_per_window():
    limit = Limit(per_second=0.5)
    assert (limit.burst, limit.window) == (1, 2.0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["request", "release", "cancel", "tick"]),
            st.lists(st.integers(0, 2), min_size=1, max_size=3),
            st.integers(0, 50),
        ),
        max_size=60,
    )
)
def test_random_schedules_never_exceed_a_limit_and_always_drain(ops):
    """Random requests over three limits (two counted, one rated): bounds hold
    after every step, and releasing whatever is granted grants everyone in the end
    (no deadlock, no starvation)."""
    limits = [Limit(max_running=1), Limit(max_running=2), Limit(max_running=2, per_second=3)]
    arbiter: Arbiter[int] = Arbiter()
    held: list[Request[int]] = []
    now = 0.0
    made = 0

    def take(granted):
        held.extend(granted)
        for limit in limits:
            assert limit.running <= limit.max_running

    for op, picks, n in ops:
        if op == "request":
            request = Request([limits[i] for i in picks], made)
            made += 1
            take(arbiter.request(request, now))
        elif op == "release" and held:
            take(arbiter.release(held.pop(n % len(held)), now))
        elif op == "cancel" and arbiter.waiting():
            waiting = arbiter.waiting()
            take(arbiter.cancel(waiting[n % len(waiting)], now))
        elif op == "tick":
            now += n / 10
            take(arbiter.grant(now))
        _check_eager(arbiter, limits, now)
    # Drain: release everything held, jumping the clock past rate windows.
    for _ in range(1000):
        if not held and not arbiter.waiting():
            break
        if held:
            take(arbiter.release(held.pop(0), now))
        else:
            now = max(now, arbiter.wake)
            take(arbiter.grant(now))
    assert not arbiter.waiting() and not held
    assert all(limit.running == 0 and limit.waiting == 0 for limit in limits)


def _check_eager(arbiter, limits, now) -> None:
    """Every waiting request waits for a reason: a full limit, or an earlier waiter on one of its limits."""
    seen: set = set()
    for request in arbiter.waiting():
        blocked = any(limit in seen for limit in request.limits) or any(
            limit.opens_at(now) is not None for limit in request.limits
        )
        assert blocked, "a request that could go was left waiting"
        seen.update(request.limits)


class FifoPerLimit(RuleBasedStateMachine):
    """Per limit, grants come in the order requests arrived (among requests naming that limit)."""

    def __init__(self) -> None:
        super().__init__()
        self.limits = [Limit(max_running=1), Limit(max_running=2)]
        self.arbiter: Arbiter[int] = Arbiter()
        self.held: list[Request[int]] = []
        self.arrivals: list[Request[int]] = []
        self.grants: list[Request[int]] = []

    def _took(self, granted) -> None:
        self.held.extend(granted)
        self.grants.extend(granted)

    @rule(picks=st.lists(st.integers(0, 1), min_size=1, max_size=2))
    def request(self, picks):
        request = Request([self.limits[i] for i in picks], len(self.arrivals))
        self.arrivals.append(request)
        self._took(self.arbiter.request(request, 0.0))

    @rule(n=st.integers(0, 10))
    def release(self, n):
        if self.held:
            self._took(self.arbiter.release(self.held.pop(n % len(self.held)), 0.0))

    @invariant()
    def fifo_per_limit(self):
        for limit in self.limits:
            order = [r.item for r in self.grants if limit in r.limits]
            assert order == sorted(order)


TestFifoPerLimit = FifoPerLimit.TestCase
TestFifoPerLimit.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


# -- options ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, option",
    [
        ({}, "max_running"),
        ({"max_running": 0}, "max_running"),
        ({"max_running": True}, "max_running"),
        ({"per_second": 0}, "per_second"),
        ({"per_second": float("nan")}, "per_second"),
        ({"per_second": 1, "burst": 0}, "burst"),
        ({"max_running": 1, "burst": 2}, "burst"),
        ({"max_running": 1, "redis_url": 5}, "redis_url"),
        ({"max_running": 1, "lease": 0}, "lease"),
    ],
)
def test_bad_options_name_themselves(options, option):
    with pytest.raises(ConfigError, match=f"`{option}`"):
        Throttle("db", **options)


def test_bad_throttles_on_a_tool_are_refused():
    with pytest.raises(ConfigError, match="`throttles`"):
        Tool("q", lambda a: 1, throttles=["db"])
    with pytest.raises(ConfigError, match="`name`"):
        Throttle("", max_running=1)


def test_throttle_is_public():
    assert nous_sched.Throttle is Throttle and "Throttle" in nous_sched.__all__


# -- real runs ---------------------------------------------------------------------

FAN_OUT = "return (await Promise.all([...Array(N).keys()].map(i => tools.q({i})))).length"


def test_eight_runs_of_twenty_calls_peak_at_exactly_three():
    db = Throttle("db", max_running=3)
    peak = Peak()
    # The first three calls meet at a barrier: the peak reaches 3 however the threads race.
    meet = threading.Barrier(3)
    first = threading.Semaphore(3)

    def q(args):
        peak.enter()
        try:
            if first.acquire(blocking=False):
                meet.wait(WAIT)
            return args["i"]
        finally:
            peak.leave()

    tool = Tool("q", q, throttles=(db,), concurrency_safe=lambda a: True)
    results = []

    def run():
        results.append(
            run_code(FAN_OUT.replace("N", "20"), [tool], runtime=QuickJSRuntime(), timeout=60, description="test")
        )

    threads = [threading.Thread(target=run, name=f"nous-sched-test-run-{i}") for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert [r.error for r in results] == [None] * 8
    assert [r.result for r in results] == [20] * 8
    assert peak.calls == 160
    assert peak.peak == 3
    assert (db.running, db.waiting) == (0, 0)
    throttled = [rec.throttled for r in results for rec in r.trail]
    assert all(t is not None and t >= 0 for t in throttled)


def test_waiters_start_in_the_order_they_came_across_runs():
    db = Throttle("db", max_running=1)
    release = threading.Event()
    order = []

    def hold(args):
        release.wait(WAIT)
        return 0

    def q(args):
        order.append(args["i"])
        return args["i"]

    holder = Tool("hold", hold, throttles=(db,))
    queued = Tool("q", q, throttles=(db,))
    runs = []
    threads = [
        threading.Thread(
            target=lambda: runs.append(
                run_code(
                    "return await tools.hold({})", [holder], runtime=QuickJSRuntime(), timeout=60, description="test"
                )
            )
        )
    ]
    threads[0].start()
    eventually(lambda: db.running == 1, "the holder to take the place")
    for i in range(5):
        code = f"return await tools.q({{i: {i}}})"
        thread = threading.Thread(
            target=lambda c=code: runs.append(
                run_code(c, [queued], runtime=QuickJSRuntime(), timeout=60, description="test")
            )
        )
        threads.append(thread)
        thread.start()
        eventually(lambda n=i + 1: db.waiting == n, f"{i + 1} waiters")
    release.set()
    for t in threads:
        t.join(WAIT)
    assert order == [0, 1, 2, 3, 4]
    assert all(r.error is None for r in runs)


def test_the_deadline_passing_while_a_call_waits_fails_it():
    db = Throttle("db", max_running=1)
    release = threading.Event()
    holder = Tool("hold", lambda a: release.wait(WAIT) and 0, throttles=(db,))
    queued = Tool("q", lambda a: 1, throttles=(db,))
    done = []
    thread = threading.Thread(
        target=lambda: done.append(
            run_code("return await tools.hold({})", [holder], runtime=QuickJSRuntime(), timeout=60, description="test")
        )
    )
    thread.start()
    try:
        eventually(lambda: db.running == 1, "the holder to take the place")
        started = time.monotonic()
        result = run_code(
            "try { await tools.q({}) } catch (e) { return e.message }",
            [queued],
            runtime=QuickJSRuntime(),
            timeout=1.0,
            description="test",
        )
        waited = time.monotonic() - started
        # The refusal comes as the run's deadline passes: the run is over, and its program never
        # sees it (no catch turns it into a value: engine.drive, tests/test_deadline_race.py).
        assert result.error is not None and result.error.kind == "timeout", result.result
        assert "(waiting for a place in throttle 'db' before tool 'q' (call 0))" in result.error.message
        assert waited < 20
        eventually(lambda: db.waiting == 0, "the waiter to leave")
        # The trail is read as the run ends, perhaps before the tool thread wakes from its wait:
        # the record shows the wait from its start (test_a_calls_record_shows_its_throttle_wait...).
        assert result.trail[0].began is None and result.trail[0].throttled is not None
    finally:
        release.set()
        thread.join(WAIT)
    assert done[0].error is None


def test_a_calls_record_shows_its_throttle_wait_while_the_wait_lasts(make_scheduler):
    # A run that ends (its deadline, a cancel) reads its trail at once, maybe before the
    # tool thread wakes from the wait to stamp it: the record says so from the wait's start.
    db = Throttle("db", max_running=1)
    release = threading.Event()
    holding, waiting = make_scheduler(), make_scheduler()
    hold = holding.submit(Tool("hold", lambda a: release.wait(WAIT) and 0, throttles=(db,)), {})
    eventually(lambda: db.running == 1, "the holder to take the place")
    ticket = waiting.submit(Tool("q", lambda a: 1, throttles=(db,)), {})
    eventually(lambda: db.waiting == 1, "the call to wait for its place")
    (first,) = waiting.trail()
    assert first.began is None and first.throttled is not None and first.throttled >= 0
    (second,) = waiting.trail()
    assert second.throttled >= first.throttled  # how long it has waited so far
    release.set()
    assert holding.wait(hold).ok and waiting.wait(ticket).ok
    (done,) = waiting.trail()
    assert done.began is not None and done.throttled is not None and done.throttled >= second.throttled


def test_the_wait_is_bounded_by_the_runs_deadline_on_a_scheduler(make_scheduler):
    db = Throttle("db", max_running=1)
    release = threading.Event()
    holding, waiting = make_scheduler(), make_scheduler()  # two runs: commits in one do not wait for the other
    hold = holding.submit(Tool("hold", lambda a: release.wait(WAIT) and 0, throttles=(db,)), {})
    eventually(lambda: db.running == 1, "the holder to take the place")
    ctx = nous_sched.RunContext(deadline=time.monotonic() + 0.3)
    started = time.monotonic()
    outcome = waiting.wait(waiting.submit(Tool("q", lambda a: 1, throttles=(db,)), {}, ctx))
    assert not outcome.ok and outcome.error.message == DEADLINE_PASSED.format(names="'db'")
    assert 0.25 <= time.monotonic() - started < 20
    assert db.waiting == 0 and db.running == 1
    (record,) = waiting.trail()
    assert record.began is None and record.throttled >= 0.25
    release.set()
    assert holding.wait(hold).ok
    assert db.running == 0


def test_a_stopped_run_gives_back_the_places_it_waits_for_at_once():
    db = Throttle("db", max_running=1)
    release = threading.Event()
    holder = Tool("hold", lambda a: release.wait(WAIT) and 0, throttles=(db,))
    queued = Tool("q", lambda a: 1, throttles=(db,), concurrency_safe=lambda a: True)
    cancel = threading.Event()
    results = []
    holder_thread = threading.Thread(
        target=lambda: results.append(
            run_code("return await tools.hold({})", [holder], runtime=QuickJSRuntime(), timeout=60, description="test")
        )
    )
    holder_thread.start()
    try:
        eventually(lambda: db.running == 1, "the holder to take the place")
        waiter_thread = threading.Thread(
            target=lambda: results.append(
                run_code(
                    "await Promise.all([tools.q({}), tools.q({}), tools.q({})])",
                    [queued],
                    runtime=QuickJSRuntime(),
                    timeout=60,
                    cancel=cancel,
                    description="test",
                )
            )
        )
        waiter_thread.start()
        eventually(lambda: db.waiting == 3, "three waiters")
        cancel.set()
        waiter_thread.join(WAIT)
        assert results[-1].error.kind == "cancelled"
        assert db.waiting == 0  # gone at once, with the run, not at its deadline
        assert all(r.began is None for r in results[-1].trail)
    finally:
        release.set()
        holder_thread.join(WAIT)
    assert db.running == 0


def test_a_raising_tool_gives_its_place_back():
    db = Throttle("db", max_running=1)

    def boom(args):
        raise RuntimeError("down")

    tool = Tool("boom", boom, throttles=(db,), concurrency_safe=lambda a: True)
    result = run_code(
        "const r = await Promise.allSettled([1, 2, 3].map(() => tools.boom({}))); return r.map(x => x.status)",
        [tool],
        runtime=QuickJSRuntime(),
        timeout=30,
        description="test",
    )
    assert result.result == ["rejected"] * 3
    assert (db.running, db.waiting) == (0, 0)


def test_an_exclusive_tool_stays_exclusive_and_max_parallel_still_bounds_a_run():
    db = Throttle("db", max_running=10)
    peak = Peak()
    inside_exclusive = []

    def q(args):
        peak.enter()
        try:
            time.sleep(0.002)  # work, to give overlaps a chance to show
            return 0
        finally:
            peak.leave()

    def solo(args):
        inside_exclusive.append(peak.now)
        return 0

    q_tool = Tool("q", q, throttles=(db,), concurrency_safe=lambda a: True)
    solo_tool = Tool("solo", solo, throttles=(db,))
    result = run_code(
        "const a = [...Array(12).keys()].map(() => tools.q({})); a.push(tools.solo({}));"
        "for (let i = 0; i < 12; i++) a.push(tools.q({})); await Promise.all(a); return a.length",
        [q_tool, solo_tool],
        runtime=QuickJSRuntime(),
        timeout=60,
        max_parallel=2,
        description="test",
    )
    assert result.error is None and result.result == 25
    assert peak.peak <= 2
    assert inside_exclusive == [0]


def test_throttles_on_function_tool_and_the_records():
    db = Throttle("db", max_running=2, per_second=1000)

    @function_tool(throttles=[db])
    def lookup(key: str) -> str:
        return key.upper()

    assert lookup.throttles == (db,)
    result = run_code(
        "return await tools.lookup({key: 'a'})", [lookup], runtime=QuickJSRuntime(), timeout=30, description="test"
    )
    assert result.result == "A"
    (record,) = result.trail
    assert record.throttled is not None and record.began >= record.started + record.throttled - 1e-6
    plain = run_code("return 1", [], runtime=QuickJSRuntime(), timeout=30, description="test")
    assert plain.trail == ()
    unthrottled = run_code(
        "return await tools.x({})", [Tool("x", lambda a: 1)], runtime=QuickJSRuntime(), timeout=30, description="test"
    )
    assert unthrottled.trail[0].throttled is None


def test_per_second_holds_on_the_real_clock():
    rate = Throttle("api", per_second=20, burst=5)  # at most 5 starts in any 0.25 s
    starts: list[float] = []
    lock = threading.Lock()

    def q(args):
        with lock:
            starts.append(time.monotonic())
        return 0

    tool = Tool("q", q, throttles=(rate,), concurrency_safe=lambda a: True)
    result = run_code(FAN_OUT.replace("N", "15"), [tool], runtime=QuickJSRuntime(), timeout=60, description="test")
    assert result.error is None and result.result == 15
    starts.sort()
    # 15 starts at 5 per 0.25 s window need at least two full windows.
    assert starts[-1] - starts[0] >= 0.45
    for i in range(len(starts) - 5):
        assert starts[i + 5] - starts[i] >= 0.25 - 0.02  # the tool stamps a moment after the grant


@settings(max_examples=8, deadline=None)
@given(
    plans=st.lists(
        st.lists(st.tuples(st.sampled_from(["a", "b", "ab", "ba"]), st.integers(0, 3)), min_size=1, max_size=8),
        min_size=2,
        max_size=4,
    )
)
def test_two_throttles_on_one_tool_never_deadlock(plans):
    """Runs mixing tools throttled by A, B, A+B and B+A, with random work, all finish within bounds."""
    a, b = Throttle("a", max_running=1), Throttle("b", max_running=2)
    peaks = {"a": Peak(), "b": Peak()}

    def work(names):
        def fn(args):
            for name in names:
                peaks[name].enter()
            try:
                time.sleep(args["ms"] / 1000)
                return 0
            finally:
                for name in names:
                    peaks[name].leave()

        return fn

    tools = [
        Tool(
            kind,
            work(sorted(set(kind))),
            throttles=tuple({"a": a, "b": b}[c] for c in kind),
            concurrency_safe=lambda x: True,
        )
        for kind in ("a", "b", "ab", "ba")
    ]
    results = []

    def run(plan):
        calls = ", ".join(f"tools.{kind}({{ms: {ms}}})" for kind, ms in plan)
        results.append(
            run_code(
                f"await Promise.all([{calls}]); return 1",
                tools,
                runtime=QuickJSRuntime(),
                timeout=60,
                description="test",
            )
        )

    threads = [threading.Thread(target=run, args=(plan,)) for plan in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert [r.error for r in results] == [None] * len(plans)
    assert peaks["a"].peak <= 1 and peaks["b"].peak <= 2
    assert (a.running, a.waiting, b.running, b.waiting) == (0, 0, 0, 0)


# -- what shows ------------------------------------------------------------------


def test_the_timeline_shows_the_throttle_wait_apart_from_the_thread_wait():
    from nous_sched import CallRecord
    from nous_sched.cli.render import format_trail

    trail = [
        CallRecord(0, "q", "parallel", 0.0, 1.0, 1.0, True, 0.5, throttled=0.25),  # thread 0-0.25, throttle 0.25-0.5
        CallRecord(1, "x", "parallel", 0.0, 1.0, 1.0, True, 0.0),  # no throttle
    ]
    lines = format_trail(trail, width=20)
    bar = lines[1].split("|")[1]
    assert bar == "-----~~~~~##########"
    assert lines[2].split("|")[1] == "#" * 20
    assert lines[-1] == "~ waiting for a throttle's place"
    assert "~" not in "".join(format_trail(trail[1:], width=20))


def test_the_cli_timeline_of_a_throttled_run():
    from nous_sched.cli.render import format_trail

    db = Throttle("db", max_running=1)
    release = threading.Event()
    hold = Tool("hold", lambda a: release.wait(WAIT) and 0, throttles=(db,))
    thread = threading.Thread(
        target=lambda: run_code("await tools.hold({})", [hold], runtime=QuickJSRuntime(), description="test")
    )
    thread.start()
    try:
        eventually(lambda: db.running == 1, "the holder")
        waiting = threading.Thread(
            target=lambda: out.append(
                run_code(
                    "return await tools.q({})",
                    [Tool("q", lambda a: 1, throttles=(db,))],
                    runtime=QuickJSRuntime(),
                    description="test",
                )
            )
        )
        out: list = []
        waiting.start()
        eventually(lambda: db.waiting == 1, "the waiter")
        started = time.monotonic()
        eventually(lambda: time.monotonic() - started > 0.1, "a visible wait")  # the wait to draw
        release.set()
        waiting.join(WAIT)
    finally:
        release.set()
        thread.join(WAIT)
    (result,) = out
    assert result.trail[0].throttled >= 0.1
    rows = [line for line in format_trail(result.trail, span=result.elapsed) if line.endswith("|")]
    assert "~" in rows[0].split("|")[1]


def test_otel_spans_carry_the_throttle_wait():
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from nous_sched.otel import ATTR_THROTTLED, THROTTLED_EVENT, traced_run_code

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    db = Throttle("db", max_running=1)
    tools = [Tool("q", lambda a: 1, throttles=(db,)), Tool("x", lambda a: 2)]
    result = traced_run_code(
        "return [await tools.q({}), await tools.x({})]",
        tools,
        tracer=provider.get_tracer("t"),
        runtime=QuickJSRuntime(),
        description="test",
    )
    provider.shutdown()
    assert result.result == [1, 2]
    spans = {s.name: s for s in exporter.get_finished_spans()}
    q, x = spans["execute_tool q"], spans["execute_tool x"]
    assert q.attributes[ATTR_THROTTLED] == result.trail[0].throttled
    assert [e.name for e in q.events][0] == THROTTLED_EVENT
    assert ATTR_THROTTLED not in x.attributes


def test_hold_counts_work_outside_a_run_against_the_same_limit():
    db = Throttle("db", max_running=1)
    with db.hold():
        assert db.running == 1
        with pytest.raises(TimeoutError, match="no place in throttle 'db' within 0.05s"):
            with db.hold(timeout=0.05):
                pass
        assert db.waiting == 0
    assert db.running == 0
    with pytest.raises(ConfigError, match="`timeout`"):
        db.hold(timeout=-1)


def test_a_hold_cancelled_before_it_asks_never_queues():
    from nous_sched.throttle import STOPPED, Hold

    db = Throttle("db", max_running=1)
    hold = Hold((db,))
    hold.cancel()
    assert hold.wait(None) == STOPPED.format(names="'db'")
    assert (db.running, db.waiting) == (0, 0)

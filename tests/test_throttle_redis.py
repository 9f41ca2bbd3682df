"""Throttles across processes through a real Redis server (the ``redis_url`` fixture).

Two processes share one ``max_running=2`` throttle: the peak, counted in Redis
by the tools themselves, is at most 2. A process killed with SIGKILL while
holding the only place: the place comes back once its lease runs out, not
before. In one process: the Redis throttle bounds runs on threads too, and
the run's deadline bounds the wait for a lease.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from nous_sched import QuickJSRuntime, Throttle, Tool, run_code

redis = pytest.importorskip("redis")

ROOT = Path(__file__).resolve().parent.parent
WAIT = 60.0

CHILD = textwrap.dedent(
    """
    import sys, time, redis
    from nous_sched import QuickJSRuntime, Throttle, Tool, run_code

    url, name, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    r = redis.Redis.from_url(url)
    if mode == "fanout":
        throttle = Throttle(name, max_running=2, redis_url=url)

        def q(args):
            r.rpush(name + ":seen", r.incr(name + ":now"))  # how many ran at once, as this one began
            try:
                time.sleep(0.05)  # the call's work
                return args["i"]
            finally:
                r.decr(name + ":now")

        tool = Tool("q", q, throttles=(throttle,), concurrency_safe=lambda a: True)
        # Both processes start their runs together (a state polled in Redis), so their calls overlap.
        r.incr(name + ":ready")
        while int(r.get(name + ":ready")) < 2:
            time.sleep(0.002)
        code = "return (await Promise.all([...Array(12).keys()].map(i => tools.q({i})))).length"
        result = run_code(code, [tool], runtime=QuickJSRuntime(), timeout=120, description="test")
        print(result.result, result.error)
    else:
        throttle = Throttle(name, max_running=1, redis_url=url, lease=1.5)

        def hold(args):
            r.set(name + ":holding", 1)
            time.sleep(3600)  # killed before this returns

        run_code("await tools.hold({})", [Tool("hold", hold, throttles=(throttle,))], runtime=QuickJSRuntime(), timeout=3600, description="test")
    """
)


def _child(url: str, name: str, mode: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, url, name, mode],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def eventually(condition, what: str, timeout: float = WAIT) -> None:
    """Poll ``condition`` (a state query, not an ordering device) until true or fail."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        pause.wait(0.01)


def test_two_processes_share_one_limit(redis_url):
    name = "fleet-" + uuid.uuid4().hex
    children = [_child(redis_url, name, "fanout") for _ in range(2)]
    outputs = [child.communicate(timeout=180) for child in children]
    assert [child.returncode for child in children] == [0, 0], outputs
    assert [out.split() for out, _ in outputs] == [["12", "None"], ["12", "None"]], outputs
    seen = [int(x) for x in redis.Redis.from_url(redis_url).lrange(name + ":seen", 0, -1)]
    assert len(seen) == 24
    assert max(seen) <= 2


def test_a_killed_holders_place_comes_back_after_its_lease(redis_url):
    name = "killed-" + uuid.uuid4().hex
    r = redis.Redis.from_url(redis_url)
    child = _child(redis_url, name, "hold")
    try:
        eventually(lambda: r.get(name + ":holding") is not None or child.poll() is not None, "the child to hold")
        assert child.poll() is None, child.communicate()
        os.kill(child.pid, signal.SIGKILL)
        killed = time.monotonic()
        child.wait(WAIT)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    throttle = Throttle(name, max_running=1, redis_url=redis_url, lease=1.5)
    assert r.zcard(f"nous_sched:throttle:{{{name}}}:running") == 1  # the dead process's lease is still there
    result = run_code(
        "return await tools.q({})",
        [Tool("q", lambda a: "mine", throttles=(throttle,))],
        runtime=QuickJSRuntime(),
        timeout=WAIT,
        description="test",
    )
    came_back = time.monotonic() - killed
    assert result.error is None and result.result == "mine"
    # Renewed every 0.5 s, the lease had at least about 1 s left when the holder died.
    assert result.trail[0].throttled >= 0.5
    assert came_back < 1.5 + 20  # the lease, with room for a loaded machine


def test_a_redis_throttle_bounds_runs_in_one_process(redis_url):
    name = "local-" + uuid.uuid4().hex
    throttle = Throttle(name, max_running=2, redis_url=redis_url)
    now = [0]
    seen = []
    lock = threading.Lock()

    def q(args):
        with lock:
            now[0] += 1
            seen.append(now[0])
        time.sleep(0.005)  # the call's work
        with lock:
            now[0] -= 1
        return args["i"]

    tool = Tool("q", q, throttles=(throttle,), concurrency_safe=lambda a: True)
    results = []
    code = "return (await Promise.all([...Array(10).keys()].map(i => tools.q({i})))).length"
    threads = [
        threading.Thread(
            target=lambda: results.append(
                run_code(code, [tool], runtime=QuickJSRuntime(), timeout=WAIT, description="test")
            )
        )
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 2)
    assert [r.result for r in results] == [10, 10, 10]
    assert max(seen) <= 2 and len(seen) == 30
    assert redis.Redis.from_url(redis_url).zcard(f"nous_sched:throttle:{{{name}}}:running") == 0


def test_the_deadline_bounds_a_wait_for_a_lease(redis_url):
    name = "deadline-" + uuid.uuid4().hex
    r = redis.Redis.from_url(redis_url)
    # Another process's place, as a lease in Redis that is good for a minute.
    now_ms = int(r.time()[0]) * 1000
    r.zadd(f"nous_sched:throttle:{{{name}}}:running", {"someone-else": now_ms + 60_000})
    throttle = Throttle(name, max_running=1, redis_url=redis_url)
    result = run_code(
        "try { await tools.q({}); return 'ran' } catch (e) { return e.message }",
        [Tool("q", lambda a: 1, throttles=(throttle,))],
        runtime=QuickJSRuntime(),
        timeout=1.0,
        description="test",
    )
    assert result.result != "ran"
    assert (throttle.running, throttle.waiting) == (0, 0)


def test_per_second_in_redis(redis_url):
    name = "rate-" + uuid.uuid4().hex
    throttle = Throttle(name, per_second=10, burst=3, redis_url=redis_url)  # 3 starts per 0.3 s
    starts = []
    lock = threading.Lock()

    def q(args):
        with lock:
            starts.append(time.monotonic())
        return 0

    tool = Tool("q", q, throttles=(throttle,), concurrency_safe=lambda a: True)
    result = run_code(
        "return (await Promise.all([...Array(9).keys()].map(i => tools.q({i})))).length",
        [tool],
        runtime=QuickJSRuntime(),
        timeout=WAIT,
        description="test",
    )
    assert result.result == 9
    starts.sort()
    assert starts[-1] - starts[0] >= 0.55  # 9 starts at 3 per 0.3 s: at least two windows


def test_a_live_holder_keeps_its_place_past_the_lease(redis_url):
    """The holder renews: a second Throttle object for the same name (another process, as far
    as Redis knows) gets no place while the first holds it, for three times the lease."""
    name = "renewed-" + uuid.uuid4().hex
    first = Throttle(name, max_running=1, redis_url=redis_url, lease=0.4)
    second = Throttle(name, max_running=1, redis_url=redis_url, lease=0.4)
    with first.hold():
        with pytest.raises(TimeoutError):
            with second.hold(timeout=1.2):
                pass
    with second.hold(timeout=WAIT):
        assert second.running == 1


def test_an_unreachable_redis_fails_the_call_at_its_deadline_and_holds_nothing():
    throttle = Throttle("nowhere", max_running=1, redis_url="redis://127.0.0.1:1/0")
    result = run_code(
        "try { await tools.q({}); return 'ran' } catch (e) { return e.message }",
        [Tool("q", lambda a: 1, throttles=(throttle,))],
        runtime=QuickJSRuntime(),
        timeout=1.0,
        description="test",
    )
    assert result.result != "ran"
    assert (throttle.running, throttle.waiting) == (0, 0)

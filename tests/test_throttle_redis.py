"""Throttles across processes through a real Redis server (the ``redis_url`` fixture).

Two processes share one ``max_running=2`` throttle: the peak, counted in Redis
by the tools themselves, is at most 2. A process killed with SIGKILL while
holding the only place: the place comes back once its lease runs out, not
before. In one process: the Redis throttle bounds runs on threads too, and
the run's deadline bounds the wait for a lease. Under faults (issue 43): a
server stopped (SIGSTOP), killed and restarted, behind a proxy that delays
its replies or silences its connections: never over the limit, places back
here within a second of the run's end, one log line per throttle per
interval, the messages naming Redis; one name, one limit; the manual's (docs/throttles.rst)
Redis example against a started server and a dead one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
from procs import stop
from redis_server import redis_process

from nous_sched import ConfigError, QuickJSRuntime, RedisApprovalStore, Throttle, Tool, run_code

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


# -- Faults: a Redis that is stopped, killed and restarted, slow, or silent on some connections -----------------

TROUBLE = ("did not answer within", "could not be reached")


class DelayProxy:
    """A TCP proxy in front of a real Redis: the server's replies reach the client ``delay`` seconds late;
    :meth:`stall` makes every connection open now silent for good (new ones work)."""

    def __init__(self, port: int, delay: float = 0.0) -> None:
        self.target = ("127.0.0.1", port)
        self.delay = delay
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.stalled: set[socket.socket] = set()
        self.silent = False  # every connection, new ones too, silent
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, name="nous-sched-test-proxy", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, 0.0, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, self.delay, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, delay: float, watched: socket.socket | None) -> None:
        lag = threading.Event()
        try:
            while data := src.recv(65536):
                lag.wait(delay)  # a slow network: this reply arrives late
                with self.lock:
                    if watched in self.stalled or (watched is not None and self.silent):
                        continue  # silent: the bytes are swallowed, the socket stays open
                dst.sendall(data)
        except OSError:
            pass

    def stall(self) -> None:
        with self.lock:
            self.stalled.update(self.sockets)

    def close(self) -> None:
        self.listener.close()
        with self.lock:
            for s in self.sockets:
                s.close()


def _fanout(throttle: Throttle, n: int, timeout: float, go: threading.Event | None = None, state=None):
    """Run ``n`` parallel calls of a tool under ``throttle``; (result, {peak calls at once, calls begun})."""
    state = {"now": 0, "peak": 0, "begun": 0} if state is None else state
    lock = threading.Lock()

    def q(args):
        with lock:
            state["now"] += 1
            state["begun"] += 1
            state["peak"] = max(state["peak"], state["now"])
        try:
            if go is not None:
                go.wait(WAIT)
            return args["i"]
        finally:
            with lock:
                state["now"] -= 1

    tool = Tool("q", q, throttles=(throttle,), concurrency_safe=lambda a: True)
    code = (
        f"const r = await Promise.allSettled([...Array({n}).keys()].map(i => tools.q({{i}})));"
        "return r.map(x => x.status == 'fulfilled' ? x.value : String(x.reason.message || x.reason))"
    )
    result = run_code(code, [tool], runtime=QuickJSRuntime(), timeout=timeout, description="test")
    return result, state


def _said(caplog, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "nous_sched" and repr(name) in r.getMessage()]


def _message(result) -> str:
    return result.error.message if result.error is not None else json.dumps(result.result)


def test_a_stopped_redis_is_waited_on_named_logged_once_and_gives_places_back(caplog):
    caplog.set_level(logging.WARNING, logger="nous_sched")
    name = "stopped-" + uuid.uuid4().hex
    with redis_process() as server:
        throttle = Throttle(name, max_running=2, redis_url=server.url)
        go = threading.Event()
        results = []
        state = {"now": 0, "peak": 0, "begun": 0}
        runner = threading.Thread(target=lambda: results.append(_fanout(throttle, 6, 4.0, go, state)))
        runner.start()
        eventually(lambda: state["begun"] == 2, "two calls to hold their places")
        server.signal(signal.SIGSTOP)  # silent: the sockets stay open, nothing answers
        go.set()  # the holders return: their places come back here; the waiters try Redis
        runner.join(WAIT)
        # Given back here at once (the Redis give-back may time out meanwhile): within a second of the run's end.
        eventually(lambda: (throttle.running, throttle.waiting) == (0, 0), "the places to come back", timeout=1.0)
        ((result, state),) = results
        assert state["peak"] <= 2 and state["begun"] == 2
        message = _message(result)
        assert f"Redis at 127.0.0.1:{server.port} did not answer within 0.5 s" in message, message
        said = _said(caplog, name)
        assert len(said) == 1 and said[0].exc_info is None, [r.getMessage() for r in said]
        server.signal(signal.SIGCONT)
        result, state = _fanout(throttle, 6, timeout=WAIT)
        assert result.result == list(range(6)) and state["peak"] <= 2


def test_a_killed_and_restarted_redis_is_waited_for(caplog):
    caplog.set_level(logging.WARNING, logger="nous_sched")
    name = "restarted-" + uuid.uuid4().hex
    with redis_process() as server:
        throttle = Throttle(name, max_running=2, redis_url=server.url, lease=1.5)
        go = threading.Event()
        results = []
        state = {"now": 0, "peak": 0, "begun": 0}
        runner = threading.Thread(target=lambda: results.append(_fanout(throttle, 8, WAIT, go, state)))
        runner.start()
        eventually(lambda: state["begun"] == 2 and throttle.waiting == 6, "two holders and six waiters")
        server.kill()
        go.set()  # the holders return while the server is gone: their places come back here at once
        eventually(lambda: throttle.redis_trouble is not None, "a try to fail")
        assert throttle.running <= 2
        server.start()
        runner.join(WAIT)
        ((result, state),) = results
        assert result.result == list(range(8)), _message(result)
        assert state["peak"] <= 2
        assert throttle.redis_trouble is None
        troubles = [r for r in _said(caplog, name) if any(t in r.getMessage() for t in TROUBLE)]
        assert 1 <= len(troubles) <= 2 and all(r.exc_info is None for r in troubles)  # at most one per server fault
        assert f"Redis at 127.0.0.1:{server.port}" in troubles[0].getMessage()


def test_slow_replies_within_the_timeout_still_throttle():
    name = "slow-" + uuid.uuid4().hex
    with redis_process() as server:
        proxy = DelayProxy(server.port, delay=0.1)
        try:
            throttle = Throttle(name, max_running=2, redis_url=proxy.url)
            result, state = _fanout(throttle, 6, timeout=WAIT)
            assert result.result == list(range(6)), _message(result)
            assert state["peak"] <= 2
        finally:
            proxy.close()


def test_replies_slower_than_the_timeout_are_an_error_naming_redis(caplog):
    caplog.set_level(logging.WARNING, logger="nous_sched")
    name = "too-slow-" + uuid.uuid4().hex
    with redis_process() as server:
        proxy = DelayProxy(server.port, delay=1.0)
        try:
            throttle = Throttle(name, max_running=2, redis_url=proxy.url)
            result, state = _fanout(throttle, 6, timeout=3.0)
            message = _message(result)
            assert f"Redis at 127.0.0.1:{proxy.port} did not answer within 0.5 s" in message, message
            assert state["begun"] == 0
            eventually(lambda: (throttle.running, throttle.waiting) == (0, 0), "the places to come back", timeout=1.0)
            assert len(_said(caplog, name)) == 1
        finally:
            proxy.close()


def test_a_stalled_connection_does_not_stop_renewals():
    """The holder's connections go silent (new ones work): the lease thread times out, renews on a new
    connection, and another holder (direct to the server) never gets the place for three leases."""
    name = "stalled-" + uuid.uuid4().hex
    with redis_process() as server:
        proxy = DelayProxy(server.port)
        try:
            holder = Throttle(name, max_running=1, redis_url=proxy.url, lease=2.0)
            other = Throttle(name, max_running=1, redis_url=server.url, lease=2.0)
            with holder.hold(timeout=WAIT):
                proxy.stall()
                with pytest.raises(TimeoutError):
                    with other.hold(timeout=6.0):
                        pass
            with other.hold(timeout=WAIT):
                assert other.running == 1
        finally:
            proxy.close()


def test_one_name_one_limit(redis_url):
    name = "one-limit-" + uuid.uuid4().hex
    fleet = Throttle(name, max_running=2, redis_url=redis_url)
    mine = Throttle(name, max_running=40, redis_url=redis_url)
    with fleet.hold(timeout=WAIT):
        pass
    with pytest.raises(ConfigError, match=r"`max_running` gives max_running=40.*max_running=2"):
        with mine.hold(timeout=WAIT):
            pass
    result, state = _fanout(mine, 3, timeout=WAIT)
    assert state["begun"] == 0 and "max_running=2" in _message(result)
    assert (mine.running, mine.waiting) == (0, 0)
    rate = Throttle(name, max_running=2, per_second=5, redis_url=redis_url)
    with pytest.raises(ConfigError, match="per_second"):
        with rate.hold(timeout=WAIT):
            pass


def test_an_unreachable_redis_is_named_in_the_runs_timeout(caplog):
    caplog.set_level(logging.WARNING, logger="nous_sched")
    name = "nowhere-" + uuid.uuid4().hex
    throttle = Throttle(name, max_running=1, redis_url="redis://:secret@127.0.0.1:1/0")
    result = run_code(
        "await tools.q({}); return 'ran'",
        [Tool("q", lambda a: 1, throttles=(throttle,))],
        runtime=QuickJSRuntime(),
        timeout=1.5,
        description="test",
    )
    assert result.error is not None and result.result is None
    assert "Redis at 127.0.0.1:1 could not be reached" in result.error.message, result.error.message
    assert "secret" not in result.error.message
    said = _said(caplog, name)
    assert len(said) == 1 and said[0].exc_info is None and "secret" not in said[0].getMessage()


def test_an_approval_stores_client_has_the_same_timeouts():
    with redis_process() as server:
        store = RedisApprovalStore(server.url)
        assert store.suspensions() == []
        server.signal(signal.SIGSTOP)
        try:
            with pytest.raises(redis.exceptions.TimeoutError, match=f"127.0.0.1:{server.port}"):
                store.suspensions()  # an error naming the server, not a hang
        finally:
            server.signal(signal.SIGCONT)
        assert store.suspensions() == []


def _readme_redis_example() -> str:
    text = (ROOT / "docs" / "throttles.rst").read_text(encoding="utf-8")
    blocks = [b for b in text.split(".. code-block:: python")[1:] if 'Throttle("search-api"' in b.split("\n\n\n")[0]]
    assert len(blocks) == 1
    lines = []
    for line in blocks[0].split("\n")[1:]:
        if line.strip() and not line.startswith("   "):
            break
        lines.append(line)
    return textwrap.dedent("\n".join(lines))


def _run_example(url: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, REDIS_URL=url, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-c", _readme_redis_example()], env=env, capture_output=True, text=True, timeout=WAIT
    )


def test_the_readmes_redis_example_runs_against_a_started_server(redis_url):
    done = _run_example(redis_url)
    assert (done.returncode, done.stdout) == (0, "{'hits': []}\n"), done.stderr


def test_the_readmes_redis_example_against_a_dead_server_says_so_once():
    with redis_process() as server:
        url = server.url
    done = _run_example(url)  # the server is gone: nothing listens there
    assert done.returncode == 0, done.stderr
    assert f"Redis at 127.0.0.1:{server.port} could not be reached" in done.stdout, done.stdout
    said = [line for line in done.stderr.splitlines() if "search-api" in line]
    assert len(said) == 1 and "Traceback" not in done.stderr, done.stderr


def test_a_lease_that_runs_out_unrenewed_is_logged_as_lost_once(caplog):
    """Every connection of the holder goes silent: renewals fail, and once the lease has run out by
    this process's clock it is lost (said once, never renewed again: the server may give it away)."""
    caplog.set_level(logging.WARNING, logger="nous_sched")
    name = "lost-" + uuid.uuid4().hex
    with redis_process() as server:
        proxy = DelayProxy(server.port)
        try:
            holder = Throttle(name, max_running=1, redis_url=proxy.url, lease=1.0)
            with holder.hold(timeout=WAIT):
                proxy.silent = True
                proxy.stall()
                eventually(lambda: any("lease lost" in r.getMessage() for r in _said(caplog, name)), "the loss")
            lost = [r for r in _said(caplog, name) if "lease lost" in r.getMessage()]
            assert len(lost) == 1 and lost[0].exc_info is None
            assert f"Redis at 127.0.0.1:{proxy.port} did not answer within 0.5 s" in lost[0].getMessage()
        finally:
            proxy.close()


def test_a_refusal_at_the_deadline_is_told_as_the_wait_not_as_javascript():
    """The throttle refused the call as the deadline passed and the program was stopped while it
    handled that refusal: the message says what the call waited for, naming Redis."""
    from nous_sched.result._explain import told
    from nous_sched.result.records import CallRecord

    throttle = Throttle("search-api", max_running=1, redis_url="redis://127.0.0.1:1/0")
    throttle._redis.trouble = "Redis at 127.0.0.1:1 could not be reached"
    refused = CallRecord(0, "search", "parallel", 0.01, 4.99, 5.0, False, None, "", 4.98)
    message = "the program exceeded its 5s deadline (running JavaScript) and was stopped"
    said = told("timeout", message, ["search"], [refused], (), {"search": [throttle]})
    assert said.startswith(
        "the program exceeded its 5s deadline (waiting for a place in throttle 'search-api' before tool "
        "'search' (call 0) (Redis at 127.0.0.1:1 could not be reached)) and was stopped"
    ), said
    early = CallRecord(0, "search", "parallel", 0.01, 1.0, 1.0, False, None, "", 0.99)  # then JavaScript ran on
    assert "(running JavaScript)" in told("timeout", message, ["search"], [early], (), {"search": [throttle]})


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "0.5", True, None])
def test_redis_timeout_is_checked(bad):
    with pytest.raises(ConfigError, match="redis_timeout"):
        Throttle("checked", max_running=1, redis_url="redis://127.0.0.1:1/0", redis_timeout=bad)


# The restart window: a server killed and started again (no persistence) has lost every lease.
HOLDER = textwrap.dedent(
    """
    import sys, time, redis
    from nous_sched import QuickJSRuntime, Throttle, Tool, run_code

    url, name, lease = sys.argv[1], sys.argv[2], float(sys.argv[3])
    r = redis.Redis.from_url(url)
    throttle = Throttle(name, max_running=1, redis_url=url, lease=lease)

    def hold(args):
        r.set(name + ":holding", 1)
        time.sleep(3600)  # killed before this returns

    run_code("await tools.hold({})", [Tool("hold", hold, throttles=(throttle,))], runtime=QuickJSRuntime(), timeout=3600, description="test")
    """
)


def _running(url: str, name: str) -> int:
    return int(redis.Redis.from_url(url, socket_timeout=5).zcard(f"nous_sched:throttle:{{{name}}}:running"))


@dataclasses.dataclass
class HeldElsewhere:
    server: Any  # the test's own redis-server (tests/redis_server.py's RedisProcess)
    child: subprocess.Popen[str]  # the process holding the place (HOLDER)
    mine: Throttle  # this process's Throttle of the same name, refused once: it has seen the server
    name: str


@pytest.fixture
def held_elsewhere() -> Iterator[Callable[[str, float], HeldElsewhere]]:
    """``start(name, lease)``: a redis-server of the test's own; another process holding the only place
    of throttle ``name`` (``max_running=1``, ``lease``); this process's Throttle of that name refused
    once (so it knows the server's run id). The child is killed and the server stopped after the test."""
    with contextlib.ExitStack() as stack:

        def start(name: str, lease: float) -> HeldElsewhere:
            server = stack.enter_context(redis_process())
            r = redis.Redis.from_url(server.url)
            env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
            child = subprocess.Popen(
                [sys.executable, "-c", HOLDER, server.url, name, str(lease)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            stack.callback(_end, child)
            eventually(lambda: r.get(name + ":holding") is not None or child.poll() is not None, "the child to hold")
            assert child.poll() is None, child.communicate()
            mine = Throttle(name, max_running=1, redis_url=server.url, lease=lease)
            with pytest.raises(TimeoutError):  # full: and this process now knows the server's run id
                with mine.hold(timeout=0.3):
                    pass
            return HeldElsewhere(server, child, mine, name)

        yield start


def _end(child: subprocess.Popen[str]) -> None:
    if child.poll() is None:
        child.send_signal(signal.SIGCONT)
        child.kill()
    child.wait(WAIT)
    for pipe in (child.stdout, child.stderr):
        if pipe is not None:
            pipe.close()


def test_a_restarted_redis_hands_out_no_place_until_another_process_holding_one_registers_it_again(
    caplog, held_elsewhere
):
    """Another process holds the only place; the server restarts and forgets it. This process, which
    saw the server before, declares the restart: no place for a lease after the server started, while
    the holder's renewal registers its place again; then the place is still the holder's. It comes
    back only once the holder is killed (after its lease). Logged once, naming Redis and the restart."""
    caplog.set_level(logging.WARNING, logger="nous_sched")
    lease = 3.0  # renewed every second: room for a loaded machine within the grace
    held = held_elsewhere("restart-held-" + uuid.uuid4().hex, lease)
    server, child, mine, name = held.server, held.child, held.mine, held.name
    server.kill()
    server.start()
    assert _running(server.url, name) == 0  # the restarted server forgot the holder's place
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        with mine.hold(timeout=2 * lease + 2):
            pytest.fail("a place was handed out while another process held the only one")
    assert time.monotonic() - began >= 2 * lease
    assert _running(server.url, name) == 1  # the holder's place, registered again
    said = [x.getMessage() for x in _said(caplog, name) if "restarted" in x.getMessage()]
    assert len(said) == 1, said
    assert f"Redis at 127.0.0.1:{server.port} restarted" in said[0] and "register them again" in said[0]
    child.kill()
    child.wait(WAIT)
    with mine.hold(timeout=WAIT):  # the dead holder's place comes back after its lease
        assert mine.running == 1


def test_calls_running_through_a_restart_keep_their_places_and_no_run_is_over_the_limit():
    """Two calls hold the two places and keep running while the server is killed and started again;
    six wait. The waiters get no place in the grace, nor after it (the holders registered theirs
    again), until the holders return; every call runs, never more than two at once."""
    name = "restart-running-" + uuid.uuid4().hex
    with redis_process() as server:
        throttle = Throttle(name, max_running=2, redis_url=server.url, lease=3.0)
        go = threading.Event()
        results = []
        state = {"now": 0, "peak": 0, "begun": 0}
        runner = threading.Thread(target=lambda: results.append(_fanout(throttle, 8, WAIT, go, state)))
        runner.start()
        try:
            eventually(lambda: state["begun"] == 2 and throttle.waiting == 6, "two holders and six waiters")
            server.kill()
            server.start()
            eventually(lambda: _running(server.url, name) == 2, "the holders to register their places again")
            born = redis.Redis.from_url(server.url).hgetall(f"nous_sched:throttle:{{{name}}}:born")
            until = int(born[b"until"])

            def grace_over() -> bool:
                now = redis.Redis.from_url(server.url).time()
                return now[0] * 1000 + now[1] // 1000 > until + 1000

            eventually(grace_over, "the grace to end")
            assert state["begun"] == 2 and _running(server.url, name) == 2  # nobody got in meanwhile
        finally:
            go.set()
            runner.join(WAIT)
        ((result, state),) = results
        assert result.result == list(range(8)), _message(result)
        assert state["peak"] <= 2


def test_a_holder_stalled_past_its_lease_through_a_restart_does_not_register_its_place_again(held_elsewhere):
    """The holder's whole process stops (SIGSTOP) for longer than its lease while the server restarts;
    let go on within the restart's grace, its renewal finds the lease ran out by its own clock: it is
    lost (logged), never registered again, so the place is free once the grace ends."""
    lease = 2.0
    held = held_elsewhere("restart-stalled-" + uuid.uuid4().hex, lease)
    server, child, mine, name = held.server, held.child, held.mine, held.name
    try:
        stop(child.pid)  # every thread: its renewer too (stopped from here, not some time after)
        time.sleep(lease + 0.5)  # its lease runs out, by its own clock too
        server.kill()
        server.start()
        child.send_signal(signal.SIGCONT)  # in the grace: a renewal now would register the place again
        with mine.hold(timeout=WAIT):
            assert _running(server.url, name) == 1 and mine.running == 1  # the place is this one's
    finally:
        child.send_signal(signal.SIGCONT)
        child.kill()
        _, err = child.communicate(timeout=WAIT)
    assert "lease lost" in err and "this process was stalled" in err, err[-2000:]


# What the restart guard costs: a take reads the server's run id (INFO) only where it must.


def _infos(r: Any) -> int:
    return int(r.info("commandstats").get("cmdstat_info", {}).get("calls", 0))


def test_takes_read_the_servers_run_id_once_per_third_of_a_lease():
    """INFO builds a page of text: forty takes in a row read it once, plus once per third of the lease
    that passes (before, every take read it: forty)."""
    lease = 30.0
    with redis_process() as server:
        r = redis.Redis.from_url(server.url)
        throttle = Throttle("run-id-" + uuid.uuid4().hex, max_running=2, redis_url=server.url, lease=lease)
        before = _infos(r)
        began = time.monotonic()
        for _ in range(40):
            with throttle.hold(timeout=WAIT):
                pass
        elapsed = time.monotonic() - began
        read = _infos(r) - before - 1  # (the count's own first INFO is counted by the second)
    assert 1 <= read <= 2 + int(elapsed // (lease / 3)), (read, elapsed)


def test_a_config_recording_another_servers_run_id_is_a_restart(caplog):
    """A server restarted from an older snapshot: the throttle's data comes back recording the old
    server's run id. The first take that reads the run id declares the restart, though this process
    never saw the old server: no place in the grace, and every take reads the run id until it ends."""
    caplog.set_level(logging.WARNING, logger="nous_sched")
    name = "snapshot-" + uuid.uuid4().hex
    with redis_process() as server:
        r = redis.Redis.from_url(server.url)
        config = f"nous_sched:throttle:{{{name}}}:config"
        r.hset(config, mapping={"max_running": 1, "burst": 0, "window_ms": 0, "run": "0" * 40, "checked": 0})
        throttle = Throttle(name, max_running=1, redis_url=server.url, lease=60.0)  # a grace of a minute
        with pytest.raises(TimeoutError):
            with throttle.hold(timeout=0.5):
                pytest.fail("a place was handed out in a restart's grace")
        assert int(r.hget(f"nous_sched:throttle:{{{name}}}:born", "until")) > 0
        assert r.hget(config, "run") is None  # dropped: takes read the run id again until the grace ends
        assert _running(server.url, name) == 0
    said = [x.getMessage() for x in _said(caplog, name) if "restarted" in x.getMessage()]
    assert said and f"Redis at 127.0.0.1:{server.port} restarted" in said[0], said

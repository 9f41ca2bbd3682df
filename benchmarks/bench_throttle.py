"""Throttles: what a call pays for one, uncontended, in process and through Redis.

* In process: take a place in a ``Throttle(max_running=4)`` and give it back
  (``with throttle.hold():``, what the tool thread does around every
  throttled call), in microseconds
  per call, beside a bare ``threading.Lock`` acquire and release. Target: at
  most 5 us per call.
* Through the scheduler: ``Scheduler.call`` of a no-op tool with the
  throttle against the same tool without it (report).
* With ``redis_url``: taking a lease (one EVALSHA) and giving it back (one
  ZREM) against one PING round trip to the same server (report: about two
  round trips, one each way). Needs ``redis-server`` on PATH (started here on
  loopback) or ``--redis-url``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from typing import Any, Iterator, Optional

import _common as c

from nous_sched import Scheduler, Throttle, Tool

TARGET_US = 5.0


def hold_loop(n: int, throttle: Throttle) -> float:
    hold = throttle.hold
    t0 = time.perf_counter()
    for _ in range(n):
        with hold():
            pass
    return time.perf_counter() - t0


def lock_loop(n: int) -> float:
    lock = threading.Lock()
    t0 = time.perf_counter()
    for _ in range(n):
        lock.acquire()
        lock.release()
    return time.perf_counter() - t0


def call_loop(n: int, tool: Tool) -> float:
    with Scheduler(max_parallel=4, timeout=60) as sched:
        call = sched.call
        t0 = time.perf_counter()
        for _ in range(n):
            out = call(tool, {})
        dt = time.perf_counter() - t0
    assert out.ok, out
    return dt


def ping_loop(n: int, client: Any) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        client.ping()
    return time.perf_counter() - t0


@contextlib.contextmanager
def redis_url(given: str) -> Iterator[Optional[str]]:
    if given:
        yield given
        return
    if shutil.which("redis-server") is None:
        yield None
        return
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from redis_server import redis_server

    with redis_server() as url:
        yield url


def main() -> int:
    opts = c.options(
        __doc__.splitlines()[0],
        default_reps=6,
        quick_reps=2,
        add_arguments=lambda p: p.add_argument("--redis-url", default="", help="a Redis server to use"),
    )
    n = 5_000 if opts.quick else 50_000
    throttle = Throttle("bench", max_running=4)

    def in_process() -> list[c.Row]:
        hold_loop(500, throttle), lock_loop(500)
        s = c.interleave(opts.reps, lambda: hold_loop(n, throttle), lambda: lock_loop(n))
        ours, base = s
        return [
            c.ours_vs(
                f"throttle: {n:,} uncontended take-and-give-back, in process",
                ours,
                base,
                s,
                scale=1e6 / n,
                unit="us/call",
                base_name="Lock acquire+release",
                target=c.value_at_most(TARGET_US, "us/call"),
            )
        ]

    def scheduled() -> list[c.Row]:
        k = n // 10
        plain = Tool("noop", lambda args: None, concurrency_safe=lambda args: True)
        throttled = Tool("noop", lambda args: None, concurrency_safe=lambda args: True, throttles=(throttle,))
        call_loop(200, plain), call_loop(200, throttled)
        s = c.interleave(opts.reps, lambda: call_loop(k, throttled), lambda: call_loop(k, plain))
        ours, base = s
        return [
            c.ours_vs(
                f"throttle: {k:,} Scheduler.call of a throttled no-op",
                ours,
                base,
                s,
                scale=1e6 / k,
                unit="us/call",
                base_name="the same tool unthrottled",
            )
        ]

    def through_redis() -> list[c.Row]:
        with redis_url(opts.args.redis_url) as url:
            if url is None:
                return [c.skip_row("throttle: with redis_url", "no redis-server on PATH and no --redis-url")]
            try:
                import redis
            except ImportError:
                return [c.skip_row("throttle: with redis_url", "pip install -e '.[redis]'")]
            client = redis.Redis.from_url(url)
            shared = Throttle("bench-" + str(os.getpid()), max_running=4, redis_url=url)
            k = n // 25
            hold_loop(100, shared), ping_loop(100, client)
            s = c.interleave(opts.reps, lambda: hold_loop(k, shared), lambda: ping_loop(k, client))
            ours, base = s
            return [
                c.ours_vs(
                    f"throttle: {k:,} uncontended leases through Redis",
                    ours,
                    base,
                    s,
                    scale=1e6 / k,
                    unit="us/call",
                    base_name="one PING round trip",
                    note="a lease taken (EVALSHA) and given back (ZREM): two round trips",
                )
            ]

    return c.run(
        "throttles (uncontended: the cost a call pays for its places)",
        [("in process", in_process), ("scheduled", scheduled), ("redis", through_redis)],
        opts,
    )


if __name__ == "__main__":
    sys.exit(main())

"""1. The lane: what one call costs through a Scheduler, against a raw executor round trip.

N no-op, concurrency-safe calls submitted and awaited one by one
(``Scheduler.call``) against ``executor.submit(f).result()`` on the *same*
``ThreadPoolExecutor(10)``, in microseconds per call. Target: ratio at most
2.0. Beside it, a driver thread that only relays (no bookkeeping: what keeping
a driver thread in the path costs by itself), and the same total from 8
submitting threads sharing one scheduler against 8 threads sharing the
executor (throughput, reported).
"""

from __future__ import annotations

import concurrent.futures
import queue
import sys
import threading
import time
from functools import partial
from typing import Any, Callable

import _common as c

from nous_sched import Scheduler, Tool

TARGET = 2.0
THREADS = 8


def noop(args: dict[str, Any]) -> None:
    return None


TOOL = Tool("noop", noop, concurrency_safe=lambda args: True)


def lane_loop(n: int, executor: concurrent.futures.Executor) -> float:
    # One scheduler per sample, made outside the timed loop.
    with Scheduler(executor=executor, max_parallel=10, timeout=60) as sched:
        call = sched.call
        t0 = time.perf_counter()
        for _ in range(n):
            out = call(TOOL, {})
        dt = time.perf_counter() - t0
    assert out.ok, out
    return dt


def raw_loop(n: int, executor: concurrent.futures.Executor) -> float:
    submit = executor.submit
    t0 = time.perf_counter()
    for _ in range(n):
        submit(noop, {}).result()
    return time.perf_counter() - t0


def relay_loop(n: int, executor: concurrent.futures.Executor) -> float:
    """Caller -> SimpleQueue -> driver -> executor -> driver -> caller, nothing else."""
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    put = q.put

    def relay_back(reply: concurrent.futures.Future[None], f: concurrent.futures.Future[None]) -> None:
        put((1, reply, f))

    def drive() -> None:
        while True:
            msg = q.get()
            if msg is None:
                return
            if msg[0] == 0:
                reply = msg[1]
                executor.submit(noop, {}).add_done_callback(partial(relay_back, reply))
            else:
                msg[1].set_result(msg[2].result())

    driver = threading.Thread(target=drive, name="bench-relay")
    driver.start()
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            reply: concurrent.futures.Future[None] = concurrent.futures.Future()
            put((0, reply))
            reply.result()
        return time.perf_counter() - t0
    finally:
        put(None)
        driver.join()


def from_threads(n: int, work: Callable[[int], Any]) -> float:
    per = n // THREADS
    start = threading.Barrier(THREADS + 1)

    def body() -> None:
        start.wait()
        work(per)

    ts = [threading.Thread(target=body, name=f"bench-caller-{i}") for i in range(THREADS)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=6, quick_reps=2)
    n = 2_000 if opts.quick else 20_000
    executor = concurrent.futures.ThreadPoolExecutor(10, thread_name_prefix="bench-lane")

    def sequential() -> list[c.Row]:
        lane_loop(200, executor), raw_loop(200, executor)  # warm both paths
        s = c.interleave(
            opts.reps, lambda: lane_loop(n, executor), lambda: raw_loop(n, executor), lambda: relay_loop(n, executor)
        )
        lane, raw, relay = s
        us = 1e6 / n
        return [
            c.ours_vs(
                f"lane: {n:,} sequential no-op calls",
                lane,
                raw,
                s,
                scale=us,
                unit="us/call",
                base_name="executor.submit().result()",
                target=c.ratio_at_most(TARGET),
            ),
            c.ours_vs(
                "  floor: a driver thread that only relays",
                relay,
                raw,
                s,
                scale=us,
                unit="us/call",
                base_name="executor",
                note="caller -> queue -> driver -> executor -> driver -> caller, no bookkeeping: "
                "what keeping one driver thread in the path costs by itself",
            ),
        ]

    def threaded() -> list[c.Row]:
        def lane_sample() -> float:
            with Scheduler(executor=executor, max_parallel=10, timeout=60) as sched:

                def work(k: int) -> None:
                    call = sched.call
                    for _ in range(k):
                        call(TOOL, {})

                return from_threads(n, work)

        def raw_sample() -> float:
            return from_threads(n, lambda k: raw_loop(k, executor))

        s = c.interleave(opts.reps, lane_sample, raw_sample)
        total = (n // THREADS) * THREADS
        lane, raw = ([total / x / 1000 for x in xs] for xs in s)
        return [
            c.ours_vs(
                f"lane: {total:,} calls from {THREADS} threads",
                lane,
                raw,
                s,
                unit="k calls/s",
                base_name="executor",
                target="report (throughput: higher is better)",
            )
        ]

    try:
        return c.run(
            "1. the lane (one Scheduler, shared ThreadPoolExecutor(10))",
            [("lane: sequential", sequential), ("lane: threads", threaded)],
            opts,
        )
    finally:
        executor.shutdown()


if __name__ == "__main__":
    sys.exit(main())

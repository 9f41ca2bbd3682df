"""1. Lane overhead: what one sub-call costs through the Scheduler.

N no-op, concurrency-safe sub-calls are submitted and awaited one by one
(``scheduler.call``) against ``executor.submit(f).result()`` on the *same*
executor. Target: ratio at most 2.0. Then the same total work from 8
submitting threads sharing one scheduler, against 8 threads sharing the
executor: throughput, reported.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time

import _common as c

from nous_sched import Scheduler, Tool

TARGET = 2.0


def noop(args: dict) -> None:
    return None


TOOL = Tool("noop", noop, concurrency_safe=lambda args: True)


def one_by_one(n: int, executor: concurrent.futures.Executor, sched: Scheduler) -> tuple[float, float]:
    def ours() -> float:
        call = sched.call
        t0 = time.perf_counter()
        for _ in range(n):
            out = call(TOOL, {})
        dt = time.perf_counter() - t0
        assert out.ok, out
        return dt

    def base() -> float:
        submit = executor.submit
        t0 = time.perf_counter()
        for _ in range(n):
            submit(noop, {}).result()
        return time.perf_counter() - t0

    return ours, base


def relay_floor(n: int, executor: concurrent.futures.Executor) -> float:
    """The same calls through a driver thread that does nothing but relay.

    Caller -> SimpleQueue -> driver -> executor -> driver -> caller, with no
    bookkeeping at all: the floor of any design that keeps a driver thread in
    the path, against which the scheduler's own work can be read.
    """
    q: queue.SimpleQueue = queue.SimpleQueue()
    put = q.put

    def drive() -> None:
        while True:
            msg = q.get()
            if msg is None:
                return
            if msg[0] == 0:
                reply = msg[1]
                executor.submit(noop, {}).add_done_callback(lambda f, reply=reply: put((1, reply, f)))
            else:
                msg[1].set_result(msg[2].result())

    driver = threading.Thread(target=drive, name="bench-relay")
    driver.start()
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            reply = concurrent.futures.Future()
            put((0, reply))
            reply.result()
        return time.perf_counter() - t0
    finally:
        put(None)
        driver.join()


def threaded(n: int, threads: int, executor: concurrent.futures.Executor, sched: Scheduler):
    per = n // threads

    def fan(work) -> float:
        start = threading.Barrier(threads + 1)

        def body():
            start.wait()
            work(per)

        ts = [threading.Thread(target=body) for _ in range(threads)]
        for t in ts:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in ts:
            t.join()
        return time.perf_counter() - t0

    def ours_work(k: int) -> None:
        call = sched.call
        for _ in range(k):
            call(TOOL, {})

    def base_work(k: int) -> None:
        submit = executor.submit
        for _ in range(k):
            submit(noop, {}).result()

    return (lambda: fan(ours_work)), (lambda: fan(base_work)), per * threads


def main() -> None:
    opts = c.options(__doc__.splitlines()[0], default_reps=5)
    n = 2_000 if opts.quick else 20_000
    rows = []
    with concurrent.futures.ThreadPoolExecutor(10, thread_name_prefix="bench-lane") as executor:
        # Warm both paths (thread creation, imports, caches) outside the timing.
        with Scheduler(executor=executor, max_parallel=10, timeout=60) as sched:
            for _ in range(200):
                sched.call(TOOL, {})
                executor.submit(noop, {}).result()

        # One scheduler per repetition, created outside the timed loop.
        def ours_sample() -> float:
            with Scheduler(executor=executor, max_parallel=10, timeout=60) as sched:
                return one_by_one(n, executor, sched)[0]()

        def base_sample() -> float:
            return one_by_one(n, executor, None)[1]()

        ours, base, floor = c.interleave(opts.reps, ours_sample, base_sample, lambda: relay_floor(n, executor))
        us = 1e6 / n
        o, b = c.Stats.of([x * us for x in ours]), c.Stats.of([x * us for x in base])
        ratio = o.median / b.median
        f = c.Stats.of([x * us for x in floor])
        rows.append(
            c.Row(
                f"lane: {n:,} sequential no-op calls",
                o,
                b,
                unit="us/call",
                target=f"ratio <= {TARGET}",
                status=c.check(ratio <= TARGET),
                base_name="executor.submit().result()",
            )
        )
        rows.append(
            c.Row(
                "  floor: a driver thread that only relays",
                f,
                b,
                unit="us/call",
                target="report",
                status="INFO",
                base_name="executor",
                note="caller -> queue -> driver -> executor -> driver -> caller, no bookkeeping: "
                "what keeping a driver thread in the path costs by itself",
            )
        )

        threads = 8

        def ours_threaded() -> float:
            with Scheduler(executor=executor, max_parallel=10, timeout=60) as sched:
                return threaded(n, threads, executor, sched)[0]()

        def base_threaded() -> float:
            return threaded(n, threads, executor, None)[1]()

        ours_t, base_t = c.interleave(opts.reps, ours_threaded, base_threaded)
        total = (n // threads) * threads
        o_thr = c.Stats.of([total / x / 1000 for x in ours_t])
        b_thr = c.Stats.of([total / x / 1000 for x in base_t])
        rows.append(
            c.Row(
                f"lane: {total:,} calls from {threads} threads",
                o_thr,
                b_thr,
                unit="k calls/s",
                target="report (ratio = throughput ratio)",
                status="INFO",
                base_name="executor",
            )
        )
    c.emit("1. lane overhead (one scheduler, shared ThreadPoolExecutor(10))", rows, opts)


if __name__ == "__main__":
    main()

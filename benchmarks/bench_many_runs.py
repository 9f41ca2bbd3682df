"""8. Many runs at once: run_code under a request-handler load.

R runs from 16 threads (as request handlers would), each a program that fans
out 10 calls of a 2 ms tool (``time.sleep``) with ``Promise.all`` and sums
the results. Reported: runs per second, p50/p99 latency of one run, and the
threads and child processes alive afterwards, which must equal those before
(target).

Baseline, same process, same 16 threads: each "run" is plain Python fanning
the same 10 calls out on its own ``ThreadPoolExecutor(10)`` (run_code's
default: the process's shared tool threads, warm across runs). Beside it,
run_code with one shared executor passed in, the set-up a server would use.
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading
import time
from typing import Any, Callable, Optional

import _common as c

from nous_sched import Tool, run_code

HANDLERS = 16
FAN = 10
SLEEP = 0.002
SHARED_PREFIX = "bench-shared"
# nous_sched's own shared tool threads (every run given no executor): warm
# between runs, bounded per process, idle ones exit after a while. Like the
# caller's shared pool, they are counted apart, and checked against the bound.
TOOL_PREFIX = "nous-sched-tool-"
TOOL_BOUND = 256
# Its warm driver threads, idle between runs (a run borrows one for its
# scheduler's life): counted apart too; one still named nous-sched-driver-<n>
# after the runs would be a scheduler left running, and is counted.
IDLE_DRIVER_PREFIX = "nous-sched-idle-driver-"

PROGRAM = f"""
const parts = await Promise.all(Array.from({{ length: {FAN} }}, (_, i) => tools.work({{ i }})));
return parts.reduce((a, b) => a + b, 0);
"""
EXPECTED = FAN * (FAN - 1) // 2


def work(args: dict[str, Any]) -> Any:
    time.sleep(SLEEP)
    return args["i"]


TOOL = Tool("work", work, concurrency_safe=lambda args: True)


def _shared_threads() -> int:
    # The shared pools grow on demand up to their size: that is the caller's
    # pool (or nous_sched's shared tool threads) doing its job, not a thread
    # left behind by a run.
    return sum(1 for t in threading.enumerate() if t.name.startswith((SHARED_PREFIX, TOOL_PREFIX, IDLE_DRIVER_PREFIX)))


def tool_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith(TOOL_PREFIX))


def counts() -> tuple[int, int, int]:
    """(Python threads, OS threads, child processes), the shared pool's threads excluded."""
    shared = _shared_threads()
    return threading.active_count() - shared, c.os_threads() - shared, len(c.child_pids())


def python_run() -> float:
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(FAN) as pool:
        total = sum(pool.map(work, [{"i": i} for i in range(FAN)]))
    dt = time.perf_counter() - t0
    assert total == EXPECTED
    return dt


def phase(runs: int, one: Callable[[], float], record: list[dict[str, Any]]) -> float:
    """``runs`` calls of ``one`` from HANDLERS threads; returns runs/s, records the details."""
    before = counts()
    with concurrent.futures.ThreadPoolExecutor(HANDLERS, thread_name_prefix="bench-handler") as handlers:
        t0 = time.perf_counter()
        latencies = list(handlers.map(lambda _: one(), range(runs)))
        wall = time.perf_counter() - t0
    # Threads that were joined may take a moment to leave the OS's list.
    deadline = time.monotonic() + 2.0
    while counts() != before and time.monotonic() < deadline:
        time.sleep(0.01)
    record.append(
        {"p50": c.percentile(latencies, 50), "p99": c.percentile(latencies, 99), "counts": (before, counts())}
    )
    return runs / wall


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=5, quick_reps=2)
    runs = 48 if opts.quick else 200

    def section(rc: c.RuntimeChoice) -> list[c.Row]:
        shared = concurrent.futures.ThreadPoolExecutor(32, thread_name_prefix=SHARED_PREFIX)

        def ours(executor: Optional[concurrent.futures.Executor] = None) -> float:
            t0 = time.perf_counter()
            r = run_code(PROGRAM, [TOOL], runtime=rc.runtime, timeout=60, executor=executor, description="test")
            dt = time.perf_counter() - t0
            assert r.ok and r.result == EXPECTED, r.error
            return dt

        rec: dict[str, list[dict[str, Any]]] = {"ours": [], "base": [], "shared": []}
        try:
            for key, one in (("ours", ours), ("base", python_run), ("shared", lambda: ours(shared))):
                phase(HANDLERS, one, [])  # warm-up
            s = c.interleave(
                opts.reps,
                lambda: phase(runs, ours, rec["ours"]),
                lambda: phase(runs, python_run, rec["base"]),
                lambda: phase(runs, lambda: ours(shared), rec["shared"]),
            )
        finally:
            shared.shutdown(wait=True)

        def field(key: str, name: str) -> list[float]:
            return [r[name] for r in rec[key]]

        ms = 1000.0
        leaks = [r["counts"] for r in rec["ours"] + rec["shared"] if r["counts"][0] != r["counts"][1]]
        tools = tool_threads()
        (py0, os0, kids0), (py1, os1, kids1) = rec["ours"][0]["counts"]
        base_name = "python, pool per run"
        return [
            c.ours_vs(
                f"{runs} runs from {HANDLERS} threads: throughput [{rc.name}]",
                s[0],
                s[1],
                s,
                unit="runs/s",
                base_name=base_name,
                target="report (higher is better)",
            ),
            c.ours_vs(
                "  latency p50", field("ours", "p50"), field("base", "p50"), s, scale=ms, unit="ms", base_name=base_name
            ),
            c.ours_vs(
                "  latency p99", field("ours", "p99"), field("base", "p99"), s, scale=ms, unit="ms", base_name=base_name
            ),
            c.Row(
                "  threads and processes after == before",
                None,
                target="equal (python, OS threads, child processes)",
                status=c.check(not leaks and tools <= TOOL_BOUND),
                regime=s.regime,
                note=f"before/after: py {py0}/{py1}, os {os0}/{os1}, children {kids0}/{kids1}"
                + f"; shared tool threads (counted apart) {tools} <= {TOOL_BOUND}"
                + (f"; leaks {leaks}" if leaks else ""),
            ),
            c.ours_vs(
                "  shared executor: throughput",
                s[2],
                s[1],
                s,
                unit="runs/s",
                base_name=base_name,
                target="report (higher is better)",
            ),
            c.ours_vs(
                "  shared executor: latency p99",
                field("shared", "p99"),
                field("base", "p99"),
                s,
                scale=ms,
                unit="ms",
                base_name=base_name,
            ),
        ]

    return c.run(
        f"8. many runs at once ({runs} runs, {HANDLERS} handler threads, {FAN} x 2 ms calls each)",
        c.per_runtime(opts, "many runs", section),
        opts,
    )


if __name__ == "__main__":
    sys.exit(main())

"""2. run_code against the floor: sequential awaits and Promise.all, per call.

A program making N sequential ``await tools.noop({})``, and one awaiting
``Promise.all`` over M calls, run end to end by ``run_code`` (its private
the shared tool threads, ``max_parallel`` 10), against the same program run by the minimal
bridge in ``_floor.py`` (fresh context, JSON outbox, one thread hop per call
on a fresh ``ThreadPoolExecutor(10)``, oldest call settled first): what any
bridge with these semantics must pay. Targets: sequential at most 2.0x the
floor, ``Promise.all`` over 1,000 calls at most 2.0x (issue 23's targets,
in both hand-off regimes). Beside each, the same calls made from
Python through a ``Scheduler`` (what the lane alone costs).
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Callable

import _common as c
import _floor

from nous_sched import Limits, Scheduler, Tool, run_code

TARGET_SEQUENTIAL = 2.0
TARGET_ALL = 2.0

SEQUENTIAL = "for (let i = 0; i < {n}; i++) await tools.noop({{}});\nreturn {n};"
PROMISE_ALL = "const r = await Promise.all(Array.from({{ length: {n} }}, () => tools.noop({{}})));\nreturn r.length;"


def noop(args: dict[str, Any]) -> None:
    return None


TOOL = Tool("noop", noop, concurrency_safe=lambda args: True)
FLOOR_TOOLS = {"noop": noop}


def ours(runtime: Any, program: str, n: int) -> float:
    code = program.format(n=n)
    t0 = time.perf_counter()
    r = run_code(code, [TOOL], runtime=runtime, limits=Limits(timeout=300, max_calls=n + 1), description="test")
    dt = time.perf_counter() - t0
    assert r.ok and r.result == n, r.error
    return dt


def floor(program: str, n: int) -> float:
    code = program.format(n=n)
    t0 = time.perf_counter()
    result = _floor.run(code, FLOOR_TOOLS)
    dt = time.perf_counter() - t0
    assert result == n, result
    return dt


def lane_sequential(n: int) -> float:
    t0 = time.perf_counter()
    with Scheduler(max_parallel=10, timeout=300) as sched:
        call = sched.call
        for _ in range(n):
            out = call(TOOL, {})
    dt = time.perf_counter() - t0
    assert out.ok, out
    return dt


def lane_fanout(n: int) -> float:
    t0 = time.perf_counter()
    with Scheduler(max_parallel=10, timeout=300) as sched:
        tickets = [sched.submit(TOOL, {}) for _ in range(n)]
        outs = [sched.wait(t) for t in tickets]
    dt = time.perf_counter() - t0
    assert all(o.ok for o in outs)
    return dt


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=5, quick_reps=2)
    n = 1_000 if opts.quick else 10_000
    m = 1_000
    batch = 1 if opts.quick else 3  # Promise.all over 1,000 is short: each sample is a median of `batch` runs

    def section(rc: c.RuntimeChoice) -> list[c.Row]:
        rt = rc.runtime
        warm: tuple[Callable[[], float], ...] = (
            lambda: ours(rt, SEQUENTIAL, 100),
            lambda: floor(SEQUENTIAL, 100),
            lambda: lane_sequential(100),
        )
        for fn in warm:
            fn()  # warm-up: imports, first-use costs, a warm pool where the runtime has one
        used = c.Usage([], []), c.Usage([], [])
        s = c.interleave(
            opts.reps,
            c.with_usage(lambda: ours(rt, SEQUENTIAL, n), used[0]),
            c.with_usage(lambda: floor(SEQUENTIAL, n), used[1]),
            lambda: lane_sequential(n),
        )
        us = 1e6 / n
        rows = [
            c.ours_vs(
                f"run_code: {n:,} sequential awaits [{rc.name}]",
                s[0],
                s[1],
                s,
                scale=us,
                unit="us/call",
                base_name="floor",
                target=c.ratio_at_most(TARGET_SEQUENTIAL),
            ),
            c.ours_vs(
                "  beside: the same calls via Scheduler.call",
                s[0],
                s[2],
                s,
                scale=us,
                unit="us/call",
                base_name="lane alone",
                note="a Python loop of Scheduler.call (scheduler made and stopped in the clock): "
                "the ratio is what the JavaScript bridge adds on top of the lane",
            ),
            c.ours_vs(
                "  CPU time per call (all threads)",
                used[0].cpu,
                used[1].cpu,
                s,
                scale=us,
                unit="us/call",
                base_name="floor",
                note="getrusage: what a call costs the process in CPU, whichever thread spends it",
            ),
            c.ours_vs(
                "  voluntary context switches per call",
                used[0].switches,
                used[1].switches,
                s,
                scale=1 / n,
                unit="/call",
                base_name="floor",
                note="a thread blocking, process-wide: each thread hand-off costs at least one",
            ),
        ]

        def med(fn: Callable[[], float]) -> float:
            return float(statistics.median(fn() for _ in range(batch)))

        a = c.interleave(
            opts.reps,
            lambda: med(lambda: ours(rt, PROMISE_ALL, m)),
            lambda: med(lambda: floor(PROMISE_ALL, m)),
            lambda: med(lambda: lane_fanout(m)),
        )
        usm = 1e6 / m
        rows += [
            c.ours_vs(
                f"run_code: Promise.all over {m:,} calls [{rc.name}]",
                a[0],
                a[1],
                a,
                scale=usm,
                unit="us/call",
                base_name="floor",
                target=c.ratio_at_most(TARGET_ALL),
            ),
            c.ours_vs(
                "  beside: submit all, wait each via Scheduler",
                a[0],
                a[2],
                a,
                scale=usm,
                unit="us/call",
                base_name="lane alone",
            ),
        ]
        return rows

    return c.run(
        "2. run_code against the floor (tool = no-op, concurrency-safe)",
        c.per_runtime(opts, "run_code vs floor", section),
        opts,
    )


if __name__ == "__main__":
    sys.exit(main())

"""4. Start-up: a whole run of a program that makes one tool call.

``run_code("return await tools.noop({});", [noop])`` end to end (sandbox with
its limits and prelude, a Scheduler and its driver thread, the run's private
executor and its one thread, the call, stop, the RunResult), against the
floor doing the same (``_floor.py``: a fresh context, its prelude, one call on
a fresh ``ThreadPoolExecutor(10)``). Each sample is the median of a batch of
runs. Target: median under 2 ms. Beside it: the same with one shared
executor on both sides (no thread started per run), an empty run against a
bare ``quickjs.Context()``, the CPU each run cost the host and its child
processes (a worker runtime's fork server and workers, the reaped ones
included: it moves less with the machine's load than the wall time), and a
Scheduler made and stopped on its own.
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
import time
from typing import Any, Callable, Optional

import _common as c
import _floor
import quickjs

from nous_sched import Scheduler, Tool, run_code

TARGET_MS = 2.0
ONE_CALL = "return await tools.noop({});"


def noop(args: dict[str, Any]) -> Any:
    return 1


TOOL = Tool("noop", noop, concurrency_safe=lambda args: True)
FLOOR_TOOLS = {"noop": noop}


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=7, quick_reps=2)
    per = 30 if opts.quick else 150
    ms = 1000.0
    shared = concurrent.futures.ThreadPoolExecutor(10, thread_name_prefix="bench-shared")

    def batch(fn: Callable[[], Any]) -> float:
        return c.median_of(fn, per)

    def section(rc: c.RuntimeChoice) -> list[c.Row]:
        rt = rc.runtime

        def one_call(executor: Optional[concurrent.futures.Executor] = None) -> None:
            r = run_code(ONE_CALL, [TOOL], runtime=rt, executor=executor, description="test")
            assert r.ok and r.result == 1, r.error

        def floor_one_call(executor: Optional[concurrent.futures.Executor] = None) -> None:
            assert _floor.run(ONE_CALL, FLOOR_TOOLS, executor) == 1

        def empty() -> None:
            r = run_code("", runtime=rt, description="test")
            assert r.ok, r.error

        def bare_context() -> None:
            ctx = quickjs.Context()
            del ctx

        fns = (
            one_call,
            floor_one_call,
            lambda: one_call(shared),
            lambda: floor_one_call(shared),
            empty,
            bare_context,
        )
        for fn in fns:
            c.median_of(fn, 10)  # warm-up
        s = c.interleave(opts.reps, *[(lambda fn=fn: batch(fn)) for fn in fns])
        cpu: tuple[list[float], list[float]] = ([], [])

        def cpu_of(fn: Callable[[], Any], into: list[float]) -> float:
            before = c.tree_cpu(os.getpid())
            for _ in range(per):
                fn()
            time.sleep(0.3)  # the discarded workers are gone, their CPU reaped into the fork server's
            into.append((c.tree_cpu(os.getpid()) - before) / per)
            return into[-1]

        c.interleave(opts.reps, lambda: cpu_of(one_call, cpu[0]), lambda: cpu_of(floor_one_call, cpu[1]))
        return [
            c.Row(
                f"start-up: a run with one tool call [{rc.name}]",
                c.Stats.of([x * ms for x in s[0]]),
                c.Stats.of([x * ms for x in s[1]]),
                unit="ms",
                base_name="floor",
                target=c.value_below(TARGET_MS, "ms"),
                ratio=c.ratios(s[0], s[1]),
                regime=s.regime,
                cpu=s.cpu(0, [x * ms for x in s[0]]),
                base_cpu=s.cpu(1, [x * ms for x in s[1]]),
                load=s.load,
                note="run_code end to end, its call on the shared tool threads (warm); "
                "the floor makes a fresh ThreadPoolExecutor(10) per run",
            ),
            c.ours_vs(
                "  same, one shared executor",
                s[2],
                s[3],
                s,
                scale=ms,
                unit="ms",
                base_name="floor, shared",
                note="run_code(..., executor=<one ThreadPoolExecutor(10)>): no thread started per run",
            ),
            c.Row(
                "  CPU per run (host + its child processes)",
                c.Stats.of([x * ms for x in cpu[0]]),
                c.Stats.of([x * ms for x in cpu[1]]),
                unit="ms",
                base_name="floor",
                note=f"from /proc, {per} runs back to back per sample: the host's and its descendants' "
                "CPU time, the reaped workers' included (not the kernel's threads, which free a worker's namespaces)",
            ),
            c.ours_vs(
                "  an empty run: run_code('')",
                s[4],
                s[5],
                s,
                scale=ms,
                unit="ms",
                base_name="bare quickjs.Context()",
            ),
        ]

    def scheduler_alone() -> list[c.Row]:
        def sched() -> None:
            Scheduler(timeout=30).stop()

        def bare_context() -> None:
            ctx = quickjs.Context()
            del ctx

        s = c.interleave(opts.reps, lambda: batch(sched), lambda: batch(bare_context))
        return [
            c.ours_vs(
                "piece: Scheduler() + stop() (driver thread)",
                s[0],
                s[1],
                s,
                scale=ms,
                unit="ms",
                base_name="bare quickjs.Context()",
            )
        ]

    try:
        return c.run(
            f"4. start-up (median of {per} runs per sample)",
            c.per_runtime(opts, "start-up", section) + [("piece: Scheduler", scheduler_alone)],
            opts,
        )
    finally:
        shared.shutdown()


if __name__ == "__main__":
    sys.exit(main())

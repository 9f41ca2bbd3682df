"""When a spare is replaced: once the taking run has started, against as it is taken; paired, run by run.

A probe you run by hand, for the worker fan-out row (50 x 5 ms at 50 wide)
and the pool's spare policy (``PoolCore.hold``, ``pool.SPARE_CALM``). One
``WorkerPool``; each pair of runs, in a random order, is one run whose
spare's replacement waits for its start-up (``held``: the pool as it is) and
one whose replacement starts as the spare is taken (``at the take``: the
pool's core told to hold nothing, the policy before). Pairs in one process,
so the machine's load drifts alike for both; the paired difference's median
is the figure. Wall times only: the boot's CPU is the same either way (it
moves within the runs, see ``bench_concurrency.py`` for CPU per run).

    python benchmarks/bench_spare_calm.py [--pairs 300] [--gap 0.015 | --gap -1]
        [--calm SECONDS] [--program fanout|one-call|no-call]

``--gap -1``: between runs, a fresh ``ThreadPoolExecutor(50)`` fans the 50
sleeps out, as ``bench_fanout.py`` interleaves its baseline.

``--baseline calm``: the other run of each pair is held too, but only for
``SPARE_CALM`` after its first wait, not also until its calls have begun
(``pool.SPARE_BEGUN_LIMIT`` 0: the policy before 0.10.0).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import random
import statistics
import sys
import time
from typing import Any

from nous_sched import Tool, WorkerPool, run_code
from nous_sched.runtime import pool as pool_module

WIDE = 50
SLEEP = 0.005
PROGRAMS = {
    "fanout": (
        f"const parts = await Promise.all(Array.from({{ length: {WIDE} }}, (_, i) => tools.sleepy({{ i }})));\n"
        "return parts.reduce((a, b) => a + b, 0);"
    ),
    "one-call": "return await tools.sleepy({});",
    "no-call": "return 1;",
}


def sleepy(args: dict[str, Any]) -> int:
    time.sleep(SLEEP)
    return 1


TOOL = Tool("sleepy", sleepy, concurrency_safe=lambda args: True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--gap", type=float, default=0.015, help="seconds between runs; -1: a bare pool's fan-out")
    parser.add_argument("--calm", type=float, default=None, help="pool.SPARE_CALM for the held runs")
    parser.add_argument("--program", choices=sorted(PROGRAMS), default="fanout")
    parser.add_argument("--baseline", choices=["take", "calm"], default="take", help="the other run of each pair")
    args = parser.parse_args()
    if args.calm is not None:
        pool_module.SPARE_CALM = args.calm
    program = PROGRAMS[args.program]
    pool = WorkerPool()
    core: Any = pool._core  # noqa: SLF001  (a probe: the policy switched per run)
    hold = core.hold
    limit = pool_module.SPARE_BEGUN_LIMIT

    def one(held: bool) -> float:
        if args.baseline == "calm":
            pool_module.SPARE_BEGUN_LIMIT = limit if held else 0.0
        else:
            core.hold = hold if held else (lambda run, wid: False)
        if args.gap >= 0:
            time.sleep(args.gap)
        else:
            with concurrent.futures.ThreadPoolExecutor(WIDE) as ex:
                sum(f.result() for f in [ex.submit(sleepy, {}) for _ in range(WIDE)])
        t0 = time.perf_counter()
        r = run_code(program, [TOOL], runtime=pool, max_parallel=WIDE, timeout=60, description="spare calm")
        assert r.ok, r.error
        return (time.perf_counter() - t0) * 1e3

    walls: dict[bool, list[float]] = {True: [], False: []}
    try:
        for _ in range(4):
            one(True)
            one(False)
        for _ in range(args.pairs):
            order = [True, False]
            random.shuffle(order)
            for held in order:
                walls[held].append(one(held))
    finally:
        pool.close()

    def q(v: list[float]) -> str:
        q1, q2, q3 = statistics.quantiles(v, n=4)
        return f"{q2:.2f} ms (q1-q3 {q1:.2f}-{q3:.2f})"

    diff = statistics.median(a - b for a, b in zip(walls[True], walls[False]))
    print(
        f"{args.program}, calm={pool_module.SPARE_CALM:g}, gap={args.gap:g}, {args.pairs} pairs: "
        f"held {q(walls[True])}; {'at the take' if args.baseline == 'take' else 'calm only'} {q(walls[False])}; "
        f"paired difference, median {diff:+.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

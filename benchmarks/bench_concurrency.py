"""12. Concurrent runs: CPU per run at 1, 16, 64 and 256 runs at once.

K threads each run ``run_code`` back to back (so K runs are live at once:
starting, waiting for a worker or a share, calling their tools), the same
program as ``bench_many_runs.py`` (10 calls of a 2 ms tool under
``Promise.all``). Reported per level: CPU per run (this process and every
descendant: the host's threads, the fork server, the workers) and wall per
run, against the same figures at one run at a time, measured in the same
repetition. The levels run in rotating, alternating order, so background
load lands on all of them alike.

The target is the issue's: CPU per run flat with concurrency. A level that
costs more CPU per run is per-run work that grows with the number of live
runs (scans over every run, bookkeeping, lock convoys, collections of many
objects).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

import _common as c

from nous_sched import Tool, run_code

FAN = 10
SLEEP = 0.002
LEVELS = (1, 16, 64, 256)
PROGRAM = f"""
const parts = await Promise.all(Array.from({{ length: {FAN} }}, (_, i) => tools.work({{ i }})));
return parts.reduce((a, b) => a + b, 0);
"""
EXPECTED = FAN * (FAN - 1) // 2


def work(args: dict[str, Any]) -> Any:
    time.sleep(SLEEP)
    return args["i"]


TOOL = Tool("work", work, concurrency_safe=lambda args: True)


def level(runtime: Any, k: int, total: int, cpu_out: list[float]) -> float:
    """``total`` runs from ``k`` threads at once; returns wall seconds per run, records CPU seconds per run."""
    per = max(1, total // k)
    errors: list[str] = []
    start = threading.Barrier(k + 1)

    def worker() -> None:
        start.wait()
        for _ in range(per):
            r = run_code(PROGRAM, [TOOL], runtime=runtime, timeout=120, description="concurrency benchmark")
            if not (r.ok and r.result == EXPECTED):
                errors.append(repr(r.error))

    threads = [threading.Thread(target=worker, name=f"bench-concurrent-{i}") for i in range(k)]
    for t in threads:
        t.start()
    me = os.getpid()
    c0, w0 = c.tree_cpu(me), time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    w1, c1 = time.perf_counter(), c.tree_cpu(me)
    if errors:
        raise RuntimeError(f"{len(errors)} of {k * per} runs failed at {k} at once: {errors[0]}")
    cpu_out.append((c1 - c0) / (k * per))
    return (w1 - w0) / (k * per)


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=3, quick_reps=2)
    total = 64 if opts.quick else 256
    levels = (1, 16, 64) if opts.quick else LEVELS

    def section(rc: c.RuntimeChoice) -> list[c.Row]:
        cpu: dict[int, list[float]] = {k: [] for k in levels}

        def bind(k: int) -> Callable[[], float]:
            return lambda: level(rc.runtime, k, total, cpu[k])

        for k in levels:  # warm-up: workers, tool threads, the tool set's derived values
            level(rc.runtime, k, min(total, 2 * k), [])
        s = c.interleave(opts.reps, *(bind(k) for k in levels))
        ms = 1000.0
        rows = []
        for i, k in enumerate(levels):
            rows.append(
                c.Row(
                    f"{k} runs at once: CPU per run [{rc.name}]",
                    c.Stats.of([x * ms for x in cpu[k]]),
                    c.Stats.of([x * ms for x in cpu[levels[0]]]),
                    unit="ms CPU",
                    base_name=f"{levels[0]} at once",
                    target=c.ratio_at_most(1.25, "flat") if k == levels[-1] else "report",
                    ratio=c.ratios(cpu[k], cpu[levels[0]]),
                    regime=s.regime,
                    load=s.load,
                    note=f"{total} runs from {k} threads, {FAN} x {SLEEP * 1000:g} ms calls each",
                )
            )
            rows.append(
                c.ours_vs(
                    f"  {k} runs at once: wall per run [{rc.name}]",
                    s[i],
                    s[0],
                    s,
                    scale=ms,
                    unit="ms",
                    base_name=f"{levels[0]} at once",
                )
            )
        return rows

    return c.run(
        f"12. concurrent runs: CPU per run at {', '.join(map(str, levels))} at once ({FAN} x 2 ms calls each)",
        c.per_runtime(opts, "concurrency", section),
        opts,
    )


if __name__ == "__main__":
    sys.exit(main())

"""6. Scaling: is the cost of one call the same at 10, 1,000 and 50,000 calls in a run?

A program making N sequential ``await tools.noop({})`` through ``run_code``.
The per-call cost at N is the *marginal* one, (t(N) - t(1)) / (N - 1), so the
run's start-up is not spread over the calls: at 10 calls each sample is the
difference of two batch medians. Baseline: the per-call cost at 1,000 calls,
measured in the same repetitions. Target: flat, each at most 1.25x the
1,000-call cost (a super-linear path, like a list walked per call, shows up
at 50,000). Beside them, the floor's per-call cost at each N.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Callable

import _common as c
import _floor

from nous_sched import Limits, Tool, run_code

TARGET = 1.25
SEQUENTIAL = "for (let i = 0; i < {n}; i++) await tools.noop({{}});\nreturn {n};"


def noop(args: dict[str, Any]) -> None:
    return None


TOOL = Tool("noop", noop, concurrency_safe=lambda args: True)
FLOOR_TOOLS = {"noop": noop}


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=4, quick_reps=2)
    small, mid, large = 10, 1_000, (2_000 if opts.quick else 50_000)
    batch = 10 if opts.quick else 40

    def section(rc: c.RuntimeChoice) -> list[c.Row]:
        rt = rc.runtime

        def ours(n: int) -> float:
            t0 = time.perf_counter()
            r = run_code(
                SEQUENTIAL.format(n=n),
                [TOOL],
                runtime=rt,
                limits=Limits(timeout=600, max_calls=n + 1),
                description="test",
            )
            dt = time.perf_counter() - t0
            assert r.ok and r.result == n, r.error
            return dt

        def floor(n: int) -> float:
            t0 = time.perf_counter()
            assert _floor.run(SEQUENTIAL.format(n=n), FLOOR_TOOLS) == n
            return time.perf_counter() - t0

        def per_call(run: Callable[[int], float], n: int) -> float:
            """Microseconds per call at ``n``: (t(n) - t(1)) / (n - 1), t(1) measured beside it."""
            k = batch if n <= 100 else 3
            ones: list[float] = []
            ns: list[float] = []
            for _ in range(k):
                ones.append(run(1))
                if n <= 100 or not ns:
                    ns.append(run(n))
            return float(statistics.median(ns) - statistics.median(ones)) / (n - 1) * 1e6

        for n in (1, small, mid):
            ours(n), floor(n)  # warm-up
        s = c.interleave(
            opts.reps,
            lambda: per_call(ours, small),
            lambda: per_call(ours, mid),
            lambda: per_call(ours, large),
            lambda: per_call(floor, small),
            lambda: per_call(floor, mid),
            lambda: per_call(floor, large),
        )
        note = "marginal: (t(N) - t(1)) / (N - 1), so start-up is not spread over the calls"
        return [
            c.ours_vs(
                f"per-call cost at {small} calls [{rc.name}]",
                s[0],
                s[1],
                s,
                unit="us/call",
                base_name=f"at {mid:,}",
                target=c.ratio_at_most(TARGET, "(flat)"),
                note=note,
            ),
            c.ours_vs(
                f"per-call cost at {large:,} calls [{rc.name}]",
                s[2],
                s[1],
                s,
                unit="us/call",
                base_name=f"at {mid:,}",
                target=c.ratio_at_most(TARGET, "(flat)"),
            ),
            c.ours_vs(f"  the floor at {small}", s[3], s[4], s, unit="us/call", base_name=f"floor at {mid:,}"),
            c.ours_vs(f"  the floor at {large:,}", s[5], s[4], s, unit="us/call", base_name=f"floor at {mid:,}"),
            c.ours_vs(f"  run_code at {mid:,} vs the floor", s[1], s[4], s, unit="us/call", base_name="floor"),
        ]

    return c.run(
        "6. scaling: per-call cost against the number of calls in a run",
        c.per_runtime(opts, "scaling", section),
        opts,
    )


if __name__ == "__main__":
    sys.exit(main())

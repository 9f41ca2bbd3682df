"""4. Run start-up: creating and tearing down a run for an empty program.

``run_code("")`` end to end (QuickJS context with limits and the prelude, a
Scheduler and its driver thread, stop, the RunResult) against a bare
``quickjs.Context()`` created and dropped. Target: median under 2 ms. The
breakdown rows time the pieces on their own.
"""

from __future__ import annotations

import json
import time

import _common as c
import quickjs

from nous_sched import Limits, Scheduler, run_code
from nous_sched.runtime.quickjs import _PRELUDE

TARGET_MS = 2.0


def batch(fn, k: int) -> list[float]:
    out = []
    for _ in range(k):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def empty_run() -> None:
    r = run_code("")
    assert r.ok, r.error


def bare_context() -> None:
    ctx = quickjs.Context()
    del ctx


def context_with_prelude() -> None:
    limits = Limits()
    ctx = quickjs.Context()
    ctx.set_memory_limit(limits.memory_bytes)
    ctx.set_max_stack_size(limits.stack_bytes)
    ctx.set_time_limit(30)
    bridge = ctx.eval(
        _PRELUDE.replace("__NAMES__", json.dumps([]))
        .replace("__MAX_LOG_UNITS__", str(limits.max_log_bytes))
        .replace("__MAX_OUTPUT_UNITS__", str(limits.max_output_bytes))
    )
    del bridge
    del ctx


def scheduler_only() -> None:
    s = Scheduler(timeout=30)
    s.stop()


def pool_of_ten() -> None:
    # What a run that fans out to max_parallel calls adds: its private pool
    # starts one thread per concurrent call (each start waits for the thread
    # to boot) and stop() joins them.
    import concurrent.futures
    import threading

    gate = threading.Barrier(10)
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        for _ in range(10):
            pool.submit(gate.wait)


def main() -> None:
    opts = c.options(__doc__.splitlines()[0], default_reps=9, quick_reps=3)
    per = 50 if opts.quick else 200
    for fn in (empty_run, bare_context, context_with_prelude, scheduler_only, pool_of_ten):
        batch(fn, 20)  # warm-up

    # Each repetition is a batch of `per` runs; its sample is the batch median.
    import statistics

    fns = (empty_run, bare_context, context_with_prelude, scheduler_only)
    samples = c.interleave(opts.reps, *[(lambda f=f: statistics.median(batch(f, per))) for f in fns])
    pools = c.interleave(opts.reps, lambda: statistics.median(batch(pool_of_ten, max(10, per // 10))))[0]
    ms = 1000.0
    run, bare, prelude, sched = (c.Stats.of([x * ms for x in s]) for s in samples)
    rows = [
        c.Row(
            "run start-up: run_code('') end to end",
            run,
            bare,
            unit="ms",
            target=f"median < {TARGET_MS} ms",
            status=c.check(run.median < TARGET_MS),
            base_name="bare quickjs.Context()",
        ),
        c.Row("  piece: Context + limits + prelude eval", prelude, bare, unit="ms", base_name="bare Context"),
        c.Row("  piece: Scheduler() + stop() (driver thread)", sched, bare, unit="ms", base_name="bare Context"),
        c.Row(
            "  not in an empty run: 10 pool threads",
            c.Stats.of([x * ms for x in pools]),
            run,
            unit="ms",
            base_name="empty run",
            note="a run's private executor starts a thread per concurrent call (max_parallel 10) and joins them at stop; "
            "an empty run never creates it; pass executor= to share one",
        ),
    ]
    c.emit(f"4. run start-up (median of {per} per repetition)", rows, opts)


if __name__ == "__main__":
    main()

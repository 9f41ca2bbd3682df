"""7. Memory and threads per concurrent run.

Runs are started from handler threads, each a program blocked in one tool
call (the tool waits on an event), so they are all alive at once: first a
lead of 50, then K more. The process's proportional set size (PSS, from
``/proc/self/smaps_rollup``, which walks the page tables) plus
that of its child processes (a runtime that runs programs in workers), and
its OS threads, are read after each; per live run is the increment over the
K, divided by K.

Baseline, alternating with it: the same, each handler thread making the same
blocked call on a ``ThreadPoolExecutor(10)`` of its own (a plain Python run
with a private pool; ``run_code``'s blocked call holds one of the shared tool
threads). Target: at most 0.15 MiB
per concurrent run for the in-process runtime.
"""

from __future__ import annotations

import concurrent.futures
import faulthandler
import sys
import threading
import time
from typing import Any, Callable

import _common as c

from nous_sched import Tool, WorkerPool, run_code

TARGET_MIB = 0.15
LEAD = 50
# The worker runtime holds one process per live run: fewer runs, on a pool
# sized to hold them all (the default pool's 32 workers would make the rest wait).
WORKER_LEAD = 10
WORKER_K = 20


def live_phase(k: int, start_one: Callable[[Callable[[Any], int]], None], lead: int = LEAD) -> tuple[float, float]:
    """Memory (MiB) and OS threads per live run: the increment from ``LEAD`` to ``LEAD + k`` runs alive.

    Measured from a lead of runs already alive, not from none: the first runs
    after an earlier phase find memory that phase left (RSS even drops as they
    start), and the first runs in a fresh process pay one-time growth; past
    the lead, each run adds what it costs (checked: the increment is the same
    from 50 to 100, 200 and 300 runs).
    """
    entered = threading.Semaphore(0)
    release = threading.Event()

    def block(args: Any) -> int:
        entered.release()
        release.wait(60)
        return 1

    def start(n: int) -> None:
        for _ in range(n):
            t = threading.Thread(target=start_one, args=(block,), name=f"bench-handler-{len(handlers)}")
            t.start()
            handlers.append(t)
        for _ in range(n):
            if not entered.acquire(timeout=60):
                faulthandler.dump_traceback(sys.stderr)  # where every thread waits: the why of a stuck run
                raise RuntimeError("a run never reached its tool call")
        time.sleep(0.05)  # let every thread settle into its wait

    def memory() -> float:
        return c.pss_mib("self") + sum(c.pss_mib(p) for p in c.child_pids())

    handlers: list[threading.Thread] = []
    c.trim_heap()
    try:
        start(lead)
        mem0, threads0 = memory(), c.os_threads()
        start(k)
        mem1, threads1 = memory(), c.os_threads()
    finally:
        release.set()
        for t in handlers:
            t.join()
    return (mem1 - mem0) / k, (threads1 - threads0) / k


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=6, quick_reps=2)
    k = 30 if opts.quick else 100

    def python_run(block: Callable[[Any], int]) -> None:
        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            assert pool.submit(block, {}).result() == 1

    def section(rc: c.RuntimeChoice) -> list[c.Row]:
        return _section(rc, opts, k, python_run)

    return c.run(
        f"7. memory and threads per concurrent run ({LEAD} + {k} runs alive at once; worker {WORKER_LEAD} + {WORKER_K})",
        c.per_runtime(opts, "memory", section),
        opts,
    )


def _section(rc: c.RuntimeChoice, opts: Any, k: int, python_run: Callable[[Callable[[Any], int]], None]) -> list[c.Row]:
    runtime = rc.runtime
    lead = LEAD
    if rc.name == "worker":
        lead, k = WORKER_LEAD, WORKER_K
        runtime = WorkerPool(size=lead + k + 5)
    try:

        def ours_run(block: Callable[[Any], int]) -> None:
            t = Tool("block", block, concurrency_safe=lambda args: True)
            r = run_code("return await tools.block({});", [t], runtime=runtime, timeout=60, description="test")
            assert r.ok and r.result == 1, r.error

        live_phase(5, ours_run, lead)  # warm-up: imports, first-use caches, workers started
        live_phase(5, python_run, lead)
        results: dict[str, list[tuple[float, float]]] = {"ours": [], "base": []}

        def sample(key: str, fn: Callable[[Callable[[Any], int]], None]) -> float:
            results[key].append(live_phase(k, fn, lead))
            return results[key][-1][0]

        s = c.interleave(opts.reps, lambda: sample("ours", ours_run), lambda: sample("base", python_run))
        threads_o = [t for _, t in results["ours"]]
        threads_b = [t for _, t in results["base"]]
        target = c.value_at_most(TARGET_MIB, "MiB") if rc.name == "in-process" else "report"
        return [
            c.ours_vs(
                f"memory per concurrent run [{rc.name}]",
                s[0],
                s[1],
                s,
                unit="MiB",
                base_name="python, pool per run",
                target=target,
                note=f"PSS (own + child processes') from {lead} to {lead + k} runs alive, divided by {k}",
            ),
            c.ours_vs(
                "  threads per live run", threads_o, threads_b, s, unit="threads", base_name="python, pool per run"
            ),
        ]
    finally:
        if runtime is not rc.runtime:
            runtime.close()


if __name__ == "__main__":
    sys.exit(main())

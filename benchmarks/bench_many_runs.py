"""5. Many runs at once: run_code under a request-handler load.

200 runs from 16 threads (as request handlers would), each run a program that
fans out 10 calls of a 2 ms tool (``time.sleep``) with ``Promise.all`` and sums
the results. Reported: throughput, p50/p99 latency of one run, the peak RSS
during the phase, and the threads alive afterwards, which must equal those
before (target).

Baseline, same process, same 16 threads: each "run" is plain Python fanning
the same 10 calls out on its own ``ThreadPoolExecutor(10)`` (run_code's
default is a private pool per run too). An extra row runs run_code with one
shared executor passed in, the set-up a server would use.
"""

from __future__ import annotations

import concurrent.futures
import os
import resource
import threading
import time

import _common as c

from nous_sched import Tool, run_code

RUNS = 200
HANDLERS = 16
FAN = 10
SLEEP = 0.002

PROGRAM = f"""
const calls = [];
for (let i = 0; i < {FAN}; i++) calls.push(tools.work({{ i }}));
const parts = await Promise.all(calls);
return parts.reduce((a, b) => a + b, 0);
"""
EXPECTED = FAN * (FAN - 1) // 2


def work(args: dict) -> int:
    time.sleep(SLEEP)
    return args["i"]


TOOL = Tool("work", work, concurrency_safe=lambda args: True)


SHARED_PREFIX = "shared-tools"


def _shared_pool_threads() -> int:
    # The shared pool grows on demand up to its size: that is the caller's
    # pool doing its job, not a thread left behind by a run.
    return sum(1 for t in threading.enumerate() if t.name.startswith(SHARED_PREFIX))


def py_threads() -> int:
    return threading.active_count() - _shared_pool_threads()


def os_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task")) - _shared_pool_threads()
    except OSError:
        return -1


def reset_peak_rss() -> bool:
    """Reset VmHWM (Linux >= 4.0): write 5 to clear_refs. False if not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mib() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one_run_code(executor=None) -> float:
    t0 = time.perf_counter()
    r = run_code(PROGRAM, [TOOL], timeout=60, executor=executor)
    dt = time.perf_counter() - t0
    assert r.ok and r.result == EXPECTED, r.error
    return dt


def one_python() -> float:
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(FAN) as pool:
        total = sum(pool.map(work, [{"i": i} for i in range(FAN)]))
    dt = time.perf_counter() - t0
    assert total == EXPECTED
    return dt


def phase(runs: int, one) -> dict:
    """``runs`` calls of ``one`` from HANDLERS threads; wall, latencies, peak RSS, threads."""
    before_py, before_os = py_threads(), os_threads()
    reset = reset_peak_rss()
    with concurrent.futures.ThreadPoolExecutor(HANDLERS, thread_name_prefix="handler") as handlers:
        t0 = time.perf_counter()
        latencies = list(handlers.map(lambda _: one(), range(runs)))
        wall = time.perf_counter() - t0
    # Allow daemon threads a moment to finish exiting after their join.
    deadline = time.monotonic() + 2.0
    while (py_threads() != before_py or os_threads() != before_os) and time.monotonic() < deadline:
        time.sleep(0.01)
    return {
        "wall": wall,
        "throughput": runs / wall,
        "p50": c.percentile(latencies, 50),
        "p99": c.percentile(latencies, 99),
        "rss": peak_rss_mib(),
        "rss_reset": reset,
        "threads": (before_py, py_threads(), before_os, os_threads()),
    }


def main() -> None:
    opts = c.options(__doc__.splitlines()[0], default_reps=5, quick_reps=2)
    runs = 64 if opts.quick else RUNS
    shared = concurrent.futures.ThreadPoolExecutor(32, thread_name_prefix=SHARED_PREFIX)
    phase(16, one_run_code)  # warm-up
    phase(16, one_python)
    phase(16, lambda: one_run_code(shared))

    results = {"ours": [], "base": [], "shared": []}
    fns = {
        "ours": lambda: phase(runs, one_run_code),
        "base": lambda: phase(runs, one_python),
        "shared": lambda: phase(runs, lambda: one_run_code(shared)),
    }
    keys = list(fns)
    for rep in range(opts.reps):
        for k in keys if rep % 2 == 0 else keys[::-1]:
            results[k].append(fns[k]())
    shared.shutdown(wait=True)

    def stats(k, field, scale=1.0):
        return c.Stats.of([r[field] * scale for r in results[k]])

    ms = 1000.0
    leaks = [
        r["threads"]
        for r in results["ours"] + results["shared"]
        if r["threads"][0] != r["threads"][1] or r["threads"][2] != r["threads"][3]
    ]
    first = results["ours"][0]["threads"]
    rows = [
        c.Row(
            f"{runs} runs / {HANDLERS} threads: throughput",
            stats("ours", "throughput"),
            stats("base", "throughput"),
            unit="runs/s",
            target="report (ratio = throughput ratio)",
            base_name="py pool/run",
        ),
        c.Row("  latency p50", stats("ours", "p50", ms), stats("base", "p50", ms), unit="ms", base_name="py pool/run"),
        c.Row("  latency p99", stats("ours", "p99", ms), stats("base", "p99", ms), unit="ms", base_name="py pool/run"),
        c.Row(
            "  peak RSS during phase",
            stats("ours", "rss"),
            stats("base", "rss"),
            unit="MiB",
            base_name="py pool/run",
            note="" if results["ours"][0]["rss_reset"] else "VmHWM could not be reset: process peak",
        ),
        c.Row(
            "  threads alive after == before",
            None,
            None,
            target="equal (python and OS threads)",
            status=c.check(not leaks),
            note=f"before/after: py {first[0]}/{first[1]}, os {first[2]}/{first[3]}"
            + (f"; leaks {leaks}" if leaks else ""),
        ),
        c.Row(
            "  shared executor: throughput",
            stats("shared", "throughput"),
            stats("base", "throughput"),
            unit="runs/s",
            target="report (ratio = throughput ratio)",
            base_name="py pool/run",
        ),
        c.Row(
            "  shared executor: latency p99",
            stats("shared", "p99", ms),
            stats("base", "p99", ms),
            unit="ms",
            base_name="py pool/run",
        ),
    ]
    c.emit(f"5. many runs at once ({runs} runs, {HANDLERS} handler threads, {FAN} x 2 ms calls each)", rows, opts)


if __name__ == "__main__":
    main()

"""Runtimes: the worker-process runtime beside the in-process one, in one run.

Every row is ``run_code`` end to end on the worker runtime (a warm
``WorkerPool``, the default) against the same on the in-process
``QuickJSRuntime``, the two measured back to back in every repetition:

* per-call cost of 10,000 sequential awaits of a no-op tool. Target: the
  worker runtime's ratio at most 1.3 (one pipe round trip per call on top of
  the in-process path);
* warm start-up, a run with one tool call (each sample the median of a batch
  of runs). Target: the worker runtime under 1.5 ms. Beside it the same with
  one shared executor (no tool thread started per run), and the runtime
  alone: ``runtime.run(program, host, limits)`` with a host that answers the
  call at once (no scheduler, no thread), what the runtime itself costs;
* runs per second from 16 threads, each run one tool call (a throughput: the
  ratio is worker over in-process, higher is better). Reported.
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading
import time

import _common as c

from nous_sched import Limits, Outcome, QuickJSRuntime, Tool, WorkerPool, run_code
from nous_sched.runtime import Host, PendingCall

PER_CALL_TARGET = 1.3
STARTUP_TARGET_MS = 1.5
ONE_CALL = "return await tools.noop({});"
THREADS = 16


def noop(args: dict) -> int:
    return 1


TOOL = Tool("noop", noop, concurrency_safe=lambda args: True)
ONE = Outcome.success(1)


class _Answered(PendingCall):
    """A PendingCall whose outcome is already there."""

    def wait(self, timeout: float) -> Outcome:
        return ONE


class _Host(Host):
    """The least a Host can be: every call answered at once, on this thread."""

    names = ("noop",)
    cancel = None

    def call_json(self, name: str, text: str) -> _Answered:
        return _Answered()


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=7, quick_reps=2)
    n_calls = 2_000 if opts.quick else 10_000
    batch = 30 if opts.quick else 150
    per_thread = 10 if opts.quick else 40
    worker = WorkerPool(size=2 * THREADS)
    worker.prestart(THREADS)
    in_process = QuickJSRuntime()
    sequential = f"let s = 0; for (let i = 0; i < {n_calls}; i++) s += await tools.noop({{}}); return s;"

    def per_call(rt) -> float:
        t0 = time.perf_counter()
        r = run_code(
            sequential, [TOOL], runtime=rt, limits=Limits(timeout=300, max_calls=n_calls + 1), description="test"
        )
        elapsed = time.perf_counter() - t0
        assert r.ok and r.result == n_calls, r.error
        return elapsed / n_calls

    shared = concurrent.futures.ThreadPoolExecutor(10, thread_name_prefix="bench-shared")
    limits = Limits()

    def one_call(rt, executor=None) -> None:
        r = run_code(ONE_CALL, [TOOL], runtime=rt, executor=executor, description="test")
        assert r.ok and r.result == 1, r.error

    def runtime_alone(rt) -> None:
        out = rt.run(ONE_CALL, _Host(), limits)
        assert out.error is None and out.result == 1, out.error

    def runs_per_second(rt) -> float:
        start = threading.Barrier(THREADS + 1)
        failures: list = []

        def client() -> None:
            start.wait()
            for _ in range(per_thread):
                r = run_code(ONE_CALL, [TOOL], runtime=rt, description="test")
                if not (r.ok and r.result == 1):
                    failures.append(r.error)

        threads = [threading.Thread(target=client, name=f"bench-client-{i}") for i in range(THREADS)]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        assert not failures, failures[:3]
        return THREADS * per_thread / elapsed

    def section_per_call() -> list[c.Row]:
        per_call(worker), per_call(in_process)  # warm-up
        s = c.interleave(opts.reps, lambda: per_call(worker), lambda: per_call(in_process))
        return [
            c.ours_vs(
                f"per call, {n_calls:,} sequential awaits [worker vs in-process]",
                s[0],
                s[1],
                s,
                scale=1e6,
                unit="us",
                base_name="in-process",
                target=c.ratio_at_most(PER_CALL_TARGET),
                note="run_code end to end, per call; the worker runtime adds one pipe round trip per call",
            )
        ]

    def section_startup() -> list[c.Row]:
        for rt in (worker, in_process):
            c.median_of(lambda rt=rt: one_call(rt), 20)  # warm-up
        s = c.interleave(
            opts.reps,
            lambda: c.median_of(lambda: one_call(worker), batch),
            lambda: c.median_of(lambda: one_call(in_process), batch),
            lambda: c.median_of(lambda: one_call(worker, shared), batch),
            lambda: c.median_of(lambda: one_call(in_process, shared), batch),
            lambda: c.median_of(lambda: runtime_alone(worker), batch),
            lambda: c.median_of(lambda: runtime_alone(in_process), batch),
        )
        return [
            c.ours_vs(
                "warm start-up, a run with one tool call [worker vs in-process]",
                s[0],
                s[1],
                s,
                scale=1e3,
                unit="ms",
                base_name="in-process",
                target=c.value_below(STARTUP_TARGET_MS, "ms"),
                note=f"median of {batch} runs per sample; a warm worker from the pool, its scheduler made per run, "
                "its call on the shared tool threads",
            ),
            c.ours_vs(
                "  same, one shared executor",
                s[2],
                s[3],
                s,
                scale=1e3,
                unit="ms",
                base_name="in-process",
                note="run_code(..., executor=<one ThreadPoolExecutor(10)>): no tool thread started per run",
            ),
            c.ours_vs(
                "  the runtime alone: run() with a host that answers at once",
                s[4],
                s[5],
                s,
                scale=1e3,
                unit="ms",
                base_name="in-process",
                note="runtime.run(program, host, limits): no scheduler, no thread; the worker's context is "
                "prepared while it waits between runs",
            ),
        ]

    def section_throughput() -> list[c.Row]:
        runs_per_second(worker), runs_per_second(in_process)  # warm-up
        s = c.interleave(opts.reps, lambda: runs_per_second(worker), lambda: runs_per_second(in_process))
        return [
            c.ours_vs(
                f"runs/s from {THREADS} threads, one tool call each [worker vs in-process]",
                s[0],
                s[1],
                s,
                unit="runs/s",
                base_name="in-process",
                note=f"{THREADS} threads x {per_thread} runs per sample; higher is better, so is the ratio",
            )
        ]

    try:
        return c.run(
            "runtimes: worker processes beside in-process",
            [
                ("per call", section_per_call),
                ("start-up", section_startup),
                ("throughput", section_throughput),
            ],
            opts,
        )
    finally:
        worker.close()
        shared.shutdown()


if __name__ == "__main__":
    sys.exit(main())

"""14. The wall: what a fresh worker per run costs.

Rows, each measured in the same process against its baseline, alternating
which goes first:

* warm start-up of a run with one tool call on a fresh worker (spares ready,
  forked from the pool's fork server), against the same run reusing a warm
  worker of one trust domain (``pool.domain(key)``, the old default).
  Target: median at most 2.0 ms.
* runs per second from 16 threads with a fresh worker per run, against the
  reuse mode. Target: at least 0.8x (as time per run: at most 1.25x). Beside
  it, the CPU each run cost the host and the pool's processes (the fork
  server, the workers, and, through the fork server's reaped children, the
  workers already gone), fresh against reuse;
* one cancel (a program cancelled while it loops), end to end, with workers
  forked from the fork server, against workers started as fresh interpreters
  (``start_method="spawn"``, which every cancel used to pay for with a
  replacement worker); beside it, the CPU the host and the pool's processes
  spent per cancel (from ``/proc``).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Any, Callable

import _common as c

from nous_sched import Tool, WorkerPool, run_code

TARGET_MS = 2.0
ONE_CALL = "return await tools.noop({});"
TOOL = Tool("noop", lambda args: 1, concurrency_safe=lambda args: True)


def _tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and its live descendants (from /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / tick
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as fh:
                    todo += [int(k) for k in fh.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def main() -> int:
    opts = c.options(
        __doc__.splitlines()[0],
        default_reps=5,
        quick_reps=2,
        add_arguments=lambda p: p.add_argument(
            "--sections", default="", help="comma-separated: start-up, throughput, cancel (default: all)"
        ),
    )
    per = 15 if opts.quick else 40
    threads, each = 16, (5 if opts.quick else 20)
    ms = 1000.0
    pool = WorkerPool(size=8)
    spawned = WorkerPool(size=8, start_method="spawn")
    reuse = pool.domain("bench")
    pool.prestart()
    spawned.prestart()

    def one(rt: Any) -> None:
        r = run_code(ONE_CALL, [TOOL], runtime=rt, description="test")
        assert r.ok and r.result == 1, r.error

    ready = getattr(pool, "wait_for_spares", None)  # (older copies of the package have none)

    def startup(rt: Any) -> float:
        samples = []
        for _ in range(per):
            time.sleep(0.15)  # the spares are ready again (started in the background)
            if ready is not None:
                assert ready(30.0), "the spares are ready"
            t0 = time.perf_counter()
            one(rt)
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    run_cpu: dict[str, list[float]] = {"fresh": [], "reuse": []}

    def per_run(rt: Any, key: str = "") -> float:
        barrier = threading.Barrier(threads + 1)

        def work() -> None:
            barrier.wait()
            for _ in range(each):
                one(rt)

        ts = [threading.Thread(target=work) for _ in range(threads)]
        for t in ts:
            t.start()
        barrier.wait()
        cpu0 = _tree_cpu(os.getpid())
        t0 = time.perf_counter()
        for t in ts:
            t.join()
        took = (time.perf_counter() - t0) / (threads * each)
        if key:
            time.sleep(0.3)  # the last discarded workers are gone (their CPU reaped into the fork server's)
            run_cpu[key].append((_tree_cpu(os.getpid()) - cpu0) / (threads * each))
        return took

    cpu: dict[str, list[float]] = {"forkserver": [], "spawn": []}

    def cancels(p: WorkerPool, key: str) -> Callable[[], float]:
        def sample() -> float:
            n = 10 if opts.quick else 25
            total = 0.0
            cpu0 = _tree_cpu(os.getpid())
            for _ in range(n):
                cancel = threading.Event()
                mark = Tool("mark", lambda a, cancel=cancel: threading.Timer(0.01, cancel.set).start())
                t0 = time.perf_counter()
                r = run_code(
                    "await tools.mark({}); for (;;) {}",
                    [mark],
                    runtime=p,
                    cancel=cancel,
                    timeout=30,
                    description="test",
                )
                total += time.perf_counter() - t0 - 0.01
                assert r.error is not None and r.error.kind == "cancelled", r.error
            time.sleep(0.3)  # the replacements have started
            cpu[key].append((_tree_cpu(os.getpid()) - cpu0) / n)
            return total / n

        return sample

    def section_startup() -> list[c.Row]:
        for rt in (pool, reuse):
            startup(rt)
        s = c.interleave(opts.reps, lambda: startup(pool), lambda: startup(reuse))
        return [
            c.ours_vs(
                "wall: warm start-up, one tool call, fresh worker (spares ready)",
                s[0],
                s[1],
                s,
                scale=ms,
                unit="ms",
                base_name="reusing a warm worker (domain)",
                target=c.value_at_most(TARGET_MS, "ms"),
                note="run_code end to end; the fresh worker was forked by the pool's fork server",
            )
        ]

    def section_throughput() -> list[c.Row]:
        per_run(pool)
        s = c.interleave(opts.reps, lambda: per_run(pool, "fresh"), lambda: per_run(reuse, "reuse"))
        return [
            c.ours_vs(
                f"wall: time per run, {threads} threads, fresh worker per run",
                s[0],
                s[1],
                s,
                scale=ms,
                unit="ms",
                base_name="reusing warm workers (domain)",
                target=c.ratio_at_most(1.25, "(runs/s >= 0.8x reuse)"),
                note=f"size 8; runs/s fresh {1 / statistics.median(s[0]):.0f}, reuse {1 / statistics.median(s[1]):.0f}",
            ),
            c.Row(
                "  CPU per run, 16 threads (host + pool processes)",
                c.Stats.of([x * ms for x in run_cpu["fresh"]]),
                c.Stats.of([x * ms for x in run_cpu["reuse"]]),
                unit="ms",
                base_name="reuse",
                note="from /proc: the host's and its descendants' CPU time, the reaped workers' included; "
                "not the kernel's own threads (a worker's namespaces are freed by a kernel worker)",
            ),
        ]

    def section_cancel() -> list[c.Row]:
        s = c.interleave(opts.reps, cancels(pool, "forkserver"), cancels(spawned, "spawn"))
        return [
            c.ours_vs(
                "wall: one cancel, 10 ms into a loop, to the result",
                s[0],
                s[1],
                s,
                scale=ms,
                unit="ms",
                base_name="workers as fresh interpreters (spawn)",
                note="soft stop first (logs kept), then the worker is discarded and a spare started",
            ),
            c.Row(
                "  CPU per cancel (host + pool processes)",
                c.Stats.of([x * ms for x in cpu["forkserver"]]),
                c.Stats.of([x * ms for x in cpu["spawn"]]),
                unit="ms",
                base_name="spawn",
                note="from /proc, the host's and its live descendants' CPU time",
            ),
        ]

    sections = [("start-up", section_startup), ("throughput", section_throughput), ("cancel", section_cancel)]
    chosen = {x.strip() for x in opts.args.sections.split(",") if x.strip()}
    try:
        return c.run("14. the wall: fresh workers", [x for x in sections if not chosen or x[0] in chosen], opts)
    finally:
        pool.close()
        spawned.close()


if __name__ == "__main__":
    raise SystemExit(main())

"""The tool threads alone: a burst of 50 tasks that each sleep 5 ms, warm, against a warm ``ThreadPoolExecutor(50)``.

A probe you run by hand, for the worker fan-out row (50 x 5 ms at 50 wide):
how much of a run's fan-out the executor itself costs, with no sandbox, no
scheduler and no gate. One process; each round runs one burst on the tool
threads (``ToolThreads``, a set of its own, warmed by five bursts; each task
reports its end through a ``Then``, as the scheduler's task does) and one on
a warm ``ThreadPoolExecutor(50)``, in alternating order. For each, medians over
the rounds of:

* the wall from the first submit to the last task's report (ideal: 5 ms);
* the first task's start after the first submit, the spread of the starts
  (first to last), and of the ends;
* the executor's threads' context switches per task (``/proc``: voluntary
  and involuntary; a task's least is two: it sleeps in its tool, then
  parks) and CPU per task (``schedstat``), which move little with the load.

Run by hand::

    python benchmarks/bench_tool_burst.py [--rounds 60] [--gap 0.01]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import threading
import time
from typing import Any, Callable

from bench_fanout_timeline import per_thread as thread_usage  # (each thread's CPU ns and context switches)

from nous_sched.scheduler._tool_threads import Then, ToolThreads

WIDE = 50
SLEEP = 0.005
COLUMNS = ("wall ms", "first start ms", "starts' spread ms", "ends' spread ms", "switches/task", "CPU us/task")


def per_thread(tids: set[int]) -> tuple[int, int]:
    """(context switches, CPU ns) of the threads ``tids`` (those still there), from /proc."""
    usage = [each for tid, each in thread_usage().items() if tid in tids]
    return sum(switches for _, switches in usage), sum(cpu for cpu, _ in usage)


class Burst:
    """One kind of executor's bursts, and the threads that ran their tasks."""

    def __init__(self, name: str, run: Callable[["Burst"], float]) -> None:
        self.name = name
        self.run = run
        self.tids: set[int] = set()
        self.began: list[float] = []
        self.ended: list[float] = []
        self.rows: list[tuple[float, ...]] = []

    def task(self) -> None:
        self.tids.add(threading.get_native_id())
        self.began.append(time.perf_counter())
        time.sleep(SLEEP)
        self.ended.append(time.perf_counter())

    def once(self, keep: bool) -> None:
        self.began.clear()
        self.ended.clear()
        s0, c0 = per_thread(self.tids)
        t0 = self.run(self)
        t1 = time.perf_counter()
        s1, c1 = per_thread(self.tids)
        if keep:
            began, ended = self.began, self.ended
            self.rows.append(
                (
                    (t1 - t0) * 1e3,
                    (min(began) - t0) * 1e3,
                    (max(began) - min(began)) * 1e3,
                    (max(ended) - min(ended)) * 1e3,
                    (s1 - s0) / WIDE,
                    (c1 - c0) / 1e3 / WIDE,
                )
            )


class _Report(Then):
    __slots__ = ("done",)

    def __init__(self, done: Callable[[], None]) -> None:
        self.done = done

    def __call__(self) -> None:
        self.done()


def tool_threads(threads: ToolThreads) -> Callable[[Burst], float]:
    def run(b: Burst) -> float:
        left = [WIDE]
        lock = threading.Lock()
        all_done = threading.Event()

        def done() -> None:
            with lock:
                left[0] -= 1
                if not left[0]:
                    all_done.set()

        def task() -> Any:
            b.task()
            return _Report(done)

        t0 = time.perf_counter()
        for _ in range(WIDE):
            threads.submit(task)
        all_done.wait()
        return t0

    return run


def thread_pool(pool: concurrent.futures.ThreadPoolExecutor) -> Callable[[Burst], float]:
    def run(b: Burst) -> float:
        t0 = time.perf_counter()
        futures = [pool.submit(b.task) for _ in range(WIDE)]
        for f in futures:
            f.result()
        return t0

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--gap", type=float, default=0.01, help="seconds between bursts")
    args = parser.parse_args()
    threads = ToolThreads(prefix="nous-sched-burst")
    pool = concurrent.futures.ThreadPoolExecutor(WIDE)
    bursts = [Burst("ToolThreads", tool_threads(threads)), Burst("ThreadPoolExecutor(50)", thread_pool(pool))]
    try:
        for _ in range(5):
            for b in bursts:
                b.once(False)
        for i in range(args.rounds):
            for b in bursts if i % 2 == 0 else bursts[::-1]:
                time.sleep(args.gap)
                b.once(True)
    finally:
        threads.shutdown(wait=True)
        pool.shutdown(wait=True)
    print(f"# a burst of {WIDE} tasks of a {SLEEP * 1e3:g} ms sleep, warm: median over {args.rounds} rounds")
    print(f"  {'':24}" + "".join(f"{c:>19}" for c in COLUMNS))
    for b in bursts:
        print(
            f"  {b.name:24}" + "".join(f"{statistics.median(r[i] for r in b.rows):19.3f}" for i in range(len(COLUMNS)))
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

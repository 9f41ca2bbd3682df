"""Where a 50-wide fan-out's time goes: counts beside the wall time, per run.

``await Promise.all`` of 50 calls of a tool that sleeps 5 ms, ``max_parallel``
50, after three warm-up runs, each run timed from the ``run_code`` call:

* the shared tool threads after the warm-up (members, idle) and how many
  each run started (none: warm, and enough for 50 wide);
* when the first call began, after ``run_code`` was called (the run's
  start-up: a worker taken, the program started, its 50 calls handed over);
* the spread of the 50 calls' starts (the hand-off of one batch to 50 threads);
* from the last tool's end to ``run_code``'s return (commit, the settles sent
  back, the worker's steps, the result);
* the ``S`` frames that carried the 50 settles back to the worker (how many
  completions were batched together).

Run by hand::

    python benchmarks/bench_fanout_probe.py worker|in-process [--runs 5]
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading
import time
from typing import Any

from nous_sched import QuickJSRuntime, Tool, WorkerPool, run_code
from nous_sched.runtime import _remote
from nous_sched.scheduler import _tool_threads

WIDE = 50
SLEEP = 0.005
PROGRAM = (
    f"const parts = await Promise.all(Array.from({{ length: {WIDE} }}, (_, i) => tools.sleepy({{ i }})));\n"
    "return parts.reduce((a, b) => a + b, 0);"
)
began: list[float] = []
ended: list[float] = []
frames: list[int] = []
started = [0]


def sleepy(args: dict[str, Any]) -> Any:
    began.append(time.perf_counter())
    time.sleep(SLEEP)
    ended.append(time.perf_counter())
    return args["i"]


TOOL = Tool("sleepy", sleepy, concurrency_safe=lambda args: True)


def _count() -> None:
    """Count the settle frames and the tool threads started (wrapping, for this probe only)."""
    settle_frame = _remote.settle_frame

    def counting(batch: Any) -> bytes:
        frames.append(len(batch))
        return settle_frame(batch)

    _remote.settle_frame = counting
    start = threading.Thread.start

    def counted(self: threading.Thread) -> None:
        if self.name.startswith(_tool_threads.PREFIX):
            started[0] += 1
        start(self)

    threading.Thread.start = counted  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runtime", choices=["worker", "in-process"])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    _count()
    runtime: Any = WorkerPool() if args.runtime == "worker" else QuickJSRuntime()
    try:
        for _ in range(3):
            run_code(PROGRAM, [TOOL], runtime=runtime, max_parallel=WIDE, timeout=60, description="warm-up")
        members, idle = _tool_threads.shared().counts()
        print(f"# {args.runtime}: after the warm-up, tool threads {members} ({idle} idle), {started[0]} started so far")
        for _ in range(args.runs):
            began.clear()
            ended.clear()
            frames.clear()
            started[0] = 0
            t0 = time.perf_counter()
            r = run_code(PROGRAM, [TOOL], runtime=runtime, max_parallel=WIDE, timeout=60, description="fan-out")
            wall = time.perf_counter() - t0
            assert r.ok, r.error
            first, last = min(began), max(began)
            sizes = collections.Counter(frames).most_common(4)
            print(
                f"wall {wall * 1e3:.2f} ms ({wall / SLEEP:.2f}x ideal); first call began {(first - t0) * 1e3:.2f} ms"
                f" after run_code; starts spread {(last - first) * 1e3:.2f} ms; last tool's end to return"
                f" {(t0 + wall - max(ended)) * 1e3:.2f} ms; tool threads started {started[0]};"
                f" {len(frames)} settle frames carried {sum(frames)} settles (sizes: {sizes})"
            )
    finally:
        if isinstance(runtime, WorkerPool):
            runtime.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What each microsecond of a call's Python after its tool returns costs a 50-wide fan-out.

A probe you run by hand, for the worker fan-out row (50 x 5 ms at 50 wide).
As the 50 tools end together (within about a millisecond), every thread
that has something to do then (each tool thread's own end of its call, the
scheduler's driver committing, the run's thread reading the worker's
answers) waits for the GIL: the ends spread wider than the starts, and the
last call commits late. Two parts:

* **The slope.** The same run (``await Promise.all`` of 50 calls of a tool
  that sleeps 5 ms, ``max_parallel`` 50), with the tool holding the GIL a
  few microseconds more after its sleep (a busy loop of 0, 5, 10, 20 us),
  in alternating order, one process: the median wall of each, and the
  slope, microseconds of wall per microsecond of each call's Python after
  its tool (least squares over the medians). What a microsecond taken out
  of a call's end (the gate's ``run_admitted`` after the tool, the
  scheduler's ``run_call``, ``run_reporting``, ``Done``, the tool thread's
  park) is worth, with the load the machine has.
* **The tail in place.** Where that Python goes, call by call, with nothing
  to contend with: 200 sequential calls of a tool that returns at once
  (in-process runtime), each stamped as its tool returns, as
  ``run_admitted`` returns (the gate: the result's snapshot and text, its
  ``Outcome``), as ``run_call`` returns, as ``run_reporting`` returns its
  ``Done``, as the tool thread calls that ``Done`` (its report to the
  driver, once the thread has parked on the idle stack), and as the thread
  goes to sleep. Medians; each stamp's wrapper costs some 0.2-0.4 us of
  its own, counted in the step it ends.

Run by hand::

    python benchmarks/bench_fanout_tail.py [--rounds 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from typing import Any, Callable

import nous_sched.scheduler._calls as calls
import nous_sched.scheduler._running as running
import nous_sched.scheduler._shell as shell
import nous_sched.scheduler._tool_threads as tool_threads
from nous_sched import QuickJSRuntime, Tool, WorkerPool, run_code

WIDE = 50
SLEEP = 0.005
EXTRA_US = (0.0, 5.0, 10.0, 20.0)
FANOUT = (
    f"const parts = await Promise.all(Array.from({{ length: {WIDE} }}, (_, i) => tools.sleepy({{ i }})));\n"
    "return parts.reduce((a, b) => a + b, 0);"
)
SEQUENTIAL = "let s = 0;\nfor (let i = 0; i < 200; i++) { s += await tools.noop({ i }); }\nreturn s;"

extra = [0.0]  # seconds the tool busies itself after its sleep (or before it: --before), holding the GIL
before = [False]


def busy() -> None:
    more = extra[0]
    if more:
        end = time.perf_counter() + more
        while time.perf_counter() < end:
            pass


def sleepy(args: dict[str, Any]) -> Any:
    if before[0]:
        busy()
    time.sleep(SLEEP)
    if not before[0]:
        busy()
    return args["i"]


def slope(rounds: int) -> None:
    tool = Tool("sleepy", sleepy, concurrency_safe=lambda args: True)
    pool = WorkerPool()
    walls: dict[float, list[float]] = {us: [] for us in EXTRA_US}
    try:
        for _ in range(3):
            run_code(FANOUT, [tool], runtime=pool, max_parallel=WIDE, timeout=60, description="fan-out")
        for k in range(rounds):
            for us in EXTRA_US if k % 2 else EXTRA_US[::-1]:
                extra[0] = us / 1e6
                t0 = time.perf_counter()
                r = run_code(FANOUT, [tool], runtime=pool, max_parallel=WIDE, timeout=60, description="fan-out")
                walls[us].append((time.perf_counter() - t0) * 1e3)
                assert r.ok, r.error
    finally:
        extra[0] = 0.0
        pool.close()
    where = "before" if before[0] else "after"
    print(f"# the slope: {WIDE} x {SLEEP * 1e3:g} ms at {WIDE} wide [worker], median over {rounds} rounds")
    medians = {us: statistics.median(walls[us]) for us in EXTRA_US}
    for us in EXTRA_US:
        print(f"  +{us:4.0f} us {where} each tool's sleep    wall {medians[us]:6.2f} ms")
    mean_x = statistics.mean(EXTRA_US)
    mean_y = statistics.mean(medians.values())
    fitted = sum((x - mean_x) * (medians[x] - mean_y) for x in EXTRA_US) / sum((x - mean_x) ** 2 for x in EXTRA_US)
    print(f"  slope: {fitted * 1e3:.0f} us of wall per us of each call's Python {where} its tool")


def tail(runs: int) -> None:
    returned: dict[int, float] = {}
    stamps: dict[str, list[float]] = {}
    mine = threading.local()

    def noop(args: dict[str, Any]) -> Any:
        returned[args["i"]] = time.perf_counter()
        return args["i"]

    def stamping(fn: Callable[..., Any], step: str) -> Callable[..., Any]:
        def wrapped(*args: Any) -> Any:
            out = fn(*args)
            stamps.setdefault(step, []).append(time.perf_counter())
            return out

        return wrapped

    saved = (running.run_admitted, running.run_call, shell.run_reporting, calls.Done.__call__)
    saved_wait = tool_threads.ToolThreads._wait
    running.run_admitted = stamping(running.run_admitted, "run_admitted")
    running.run_call = stamping(running.run_call, "run_call")
    shell.run_reporting = stamping(running.run_reporting, "run_reporting")
    report = calls.Done.__call__

    def told(self: Any) -> None:
        mine.told = time.perf_counter()
        stamps.setdefault("Done called", []).append(mine.told)
        report(self)

    def wait(self: Any, slot: Any) -> Any:
        if getattr(mine, "told", None) is not None:
            stamps.setdefault("asleep", []).append(time.perf_counter())
            mine.told = None
        return saved_wait(self, slot)

    calls.Done.__call__ = told  # type: ignore[method-assign]
    tool_threads.ToolThreads._wait = wait  # type: ignore[method-assign]
    tool = Tool("noop", noop, concurrency_safe=lambda args: True)
    runtime = QuickJSRuntime()
    steps = ("run_admitted", "run_call", "run_reporting", "Done called", "asleep")
    lengths: dict[str, list[float]] = {step: [] for step in steps}
    try:
        for k in range(runs + 2):
            returned.clear()
            stamps.clear()
            r = run_code(SEQUENTIAL, [tool], runtime=runtime, timeout=60, description="sequential")
            assert r.ok, r.error
            if k < 2:
                continue  # warm-up
            for i in range(200):
                prev = returned[i]
                for step in steps:
                    at = stamps[step][i]
                    lengths[step].append((at - prev) * 1e6)
                    prev = at
    finally:
        running.run_admitted, running.run_call, shell.run_reporting, calls.Done.__call__ = saved  # type: ignore[method-assign]
        tool_threads.ToolThreads._wait = saved_wait  # type: ignore[method-assign]
    print(f"# the tail in place: {runs} runs of 200 sequential calls [in-process], median us from the step before")
    print(
        f"  {'tool returned -> run_admitted returned':44} {statistics.median(lengths['run_admitted']):6.2f}  (the gate)"
    )
    print(f"  {'-> run_call returned':44} {statistics.median(lengths['run_call']):6.2f}")
    print(f"  {'-> run_reporting returned (its Done)':44} {statistics.median(lengths['run_reporting']):6.2f}")
    print(f"  {'-> Done called (the thread parked)':44} {statistics.median(lengths['Done called']):6.2f}")
    print(f"  {'-> the thread asleep (reported)':44} {statistics.median(lengths['asleep']):6.2f}")
    total = sum(statistics.median(v) for v in lengths.values())
    print(f"  {'total (medians summed)':44} {total:6.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument(
        "--before", action="store_true", help="the slope of a call's Python before its tool (the starts' chain)"
    )
    args = parser.parse_args()
    before[0] = args.before
    tail(10)
    slope(args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())

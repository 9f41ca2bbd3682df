"""Soak: many concurrent runs, then check that nothing leaked.

16 threads share a bounded queue of ``RUNS`` (300) ``run_code`` runs; each run
fans out ``FAN_OUT`` (10) tool calls: 9 parallel-safe calls that simulate a
millisecond of I/O and one exclusive call, with every 7th run ending in a
thrown error and every 11th catching a failing sub-call. Asserted:

* every result is exactly right (values, order, logs, error kinds) and every
  run's audit has ``FAN_OUT`` events with seqs 0..9 and unique ids;
* no ``nous-sched-*`` thread is alive afterwards, and the process's thread set
  is back to its baseline once the threads the soak started are joined;
* open file descriptors end within ``FD_SLACK`` (+5) of the baseline;
* with the worker runtime (a pool of its own, closed at the end), every
  worker process it started is gone;
* RSS (``VmRSS`` in ``/proc/self/status``) grows by less than
  ``RSS_BOUND_MIB`` (50 MiB) between the end of a ``WARMUP``-run (60) warm-up
  phase and the end of the soak.

Bounded at 300 runs (a few seconds on 2 idle cores, well under 60 s loaded),
once per runtime.
There is no custom marker (conftest.py is not ours): deselect it with
``-k "not soak"``.
"""

from __future__ import annotations

import gc
import importlib
import os
import queue
import threading
import time

import pytest
from procs import children

from nous_sched import Limits, Tool, ToolError, WorkerPool, run_code
from nous_sched.scheduler import _driver_threads
from nous_sched.scheduler._tool_threads import retire_shared

# Imported up front: the quickjs package starts a process-lifetime worker thread on import,
# which is not a leak and must be part of the thread baseline.
importlib.import_module("nous_sched.runtime.quickjs")

# Every test runs against both runtimes (conftest.py `runtime`).
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("runtime")]

THREADS = 16
RUNS = 300
WARMUP = 60
FAN_OUT = 10
FD_SLACK = 5
RSS_BOUND_MIB = 50
JOIN = 10.0

PROGRAM = """
const run = %d;
const calls = [];
for (let i = 0; i < 9; i++) calls.push(tools.fetch({run, i}));
calls.push(tools.record({run}));
let values;
if (run %% 11 === 0) {
  values = await Promise.all(calls.map((p) => p.catch((e) => [e.tool, e.message])));
} else {
  values = await Promise.all(calls);
}
console.log("run " + run + " done");
if (run %% 7 === 0) throw new Error("planned failure in run " + run);
return values;
"""


def _fetch(args: dict) -> dict:
    time.sleep(0.001)  # simulated I/O
    run, i = args["run"], args["i"]
    if run % 11 == 0 and i == 4:
        raise ToolError(f"fetch {i} of run {run} failed")
    return {"run": run, "i": i, "sq": i * i}


def _record(args: dict) -> str:
    return f"recorded {args['run']}"


TOOLS = [
    Tool("fetch", _fetch, concurrency_safe=lambda args: True),
    Tool("record", _record),
]


def _expected(run: int):
    values = [{"run": run, "i": i, "sq": i * i} for i in range(9)] + [f"recorded {run}"]
    if run % 11 == 0:
        values[4] = ["fetch", f"fetch 4 of run {run} failed"]
    return values


def _check(run: int, result) -> None:
    assert result.logs == (f"run {run} done",), (run, result.logs)
    if run % 7 == 0:
        assert result.error is not None and result.error.kind == "exception", (run, result.error)
        assert result.error.message.startswith(f"Error: planned failure in run {run}")
    else:
        assert result.error is None, (run, result.error)
        assert result.result == _expected(run), run
    events = result.calls
    assert [e.seq for e in events] == list(range(FAN_OUT)), run
    assert len({e.id for e in events}) == FAN_OUT
    assert [e.tool for e in events] == ["fetch"] * 9 + ["record"]
    assert [e.mode for e in events] == ["parallel"] * 9 + ["exclusive"]


def _soak(runs: range, runtime) -> None:
    work: queue.SimpleQueue = queue.SimpleQueue()
    for run in runs:
        work.put(run)
    failures: list = []
    checked = []
    start = threading.Barrier(THREADS)

    def worker() -> None:
        start.wait()
        while True:
            try:
                run = work.get_nowait()
            except queue.Empty:
                return
            try:
                result = run_code(
                    PROGRAM % run,
                    TOOLS,
                    limits=Limits(timeout=30),
                    call_id=f"soak-{run}",
                    runtime=runtime,
                    description="test",
                )
                _check(run, result)
                checked.append(run)
            except BaseException as exc:  # reported below, on the test's thread
                failures.append((run, exc))

    workers = [threading.Thread(target=worker, name=f"soak-worker-{k}") for k in range(THREADS)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(100)
        assert not t.is_alive(), "a soak worker never finished"
    assert not failures, failures[:3]
    assert sorted(checked) == list(runs)


def _rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _join_new_threads(baseline: set[threading.Thread]) -> None:
    # The shared tool and driver threads stay warm between runs: retired, each
    # exits unless a tool still runs on it or it still drives a scheduler (a
    # leak, caught below).
    retire_shared(0)  # joined just below
    _driver_threads.retire_shared(0)
    for t in set(threading.enumerate()) - baseline:
        if t is not threading.current_thread():
            t.join(JOIN)


def test_soak_concurrent_runs_leak_nothing(runtime):
    gc.collect()
    baseline_threads = set(threading.enumerate())
    baseline_fds = _fds()
    baseline_children = children()
    # The worker runtime gets a pool of its own, so closing it can be checked.
    runtime = WorkerPool(size=THREADS) if isinstance(runtime, WorkerPool) else runtime

    _soak(range(WARMUP), runtime)
    _join_new_threads(baseline_threads)
    gc.collect()
    rss_warm = _rss_bytes()

    _soak(range(WARMUP, RUNS), runtime)
    _join_new_threads(baseline_threads)
    gc.collect()
    rss_end = _rss_bytes()
    if isinstance(runtime, WorkerPool):
        assert runtime.pids(), "the soak ran without worker processes"
        runtime.close()
        assert not runtime.pids()
        assert children() <= baseline_children, "worker processes outlived their pool"

    leftover = sorted(t.name for t in set(threading.enumerate()) - baseline_threads)
    assert not leftover, f"threads left behind: {leftover}"
    assert not [t.name for t in threading.enumerate() if t.name.startswith("nous-sched-")]
    assert _fds() <= baseline_fds + FD_SLACK
    growth_mib = (rss_end - rss_warm) / (1024 * 1024)
    assert growth_mib < RSS_BOUND_MIB, f"RSS grew {growth_mib:.1f} MiB after warm-up"

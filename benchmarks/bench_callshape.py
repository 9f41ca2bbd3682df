"""A call's shape: what one sequential tool call costs, in load-independent figures.

``for (...) await tools.noop({})`` run by ``run_code`` on the worker runtime
and in-process, beside the minimal bridge (``_floor.py``), each repetition
in its own order (forward, then reversed). Per call, for each:

* **wall** and **CPU**: the host's (``getrusage``, every thread) and, for
  the worker runtime, the worker processes' (``/proc``: the fork server's
  reaped children, the one-shot workers, included), so the row is the whole
  machine's work, not the calling thread's;
* **blocks**: voluntary context switches per call, per thread (the run's
  own thread, the scheduler's driver, the tool thread, the worker process;
  the worker sampled from ``/proc`` while it lives). A thread blocks once
  for each time it must be woken, so this counts the wake-ups a call's shape
  makes, the extra ones included: a thread woken while another holds the
  GIL blocks again to take it;
* with ``--callgrind``, **instructions per call** of the host process (every
  thread; the worker is not traced), from two runs of different lengths
  under ``valgrind --tool=callgrind`` (start-up cancels out): the figure
  that does not move with the machine's load.

Run by hand (not part of ``run_all.py``)::

    python benchmarks/bench_callshape.py [--calls 3000] [--reps 4] [--callgrind]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

import _floor

from nous_sched import Limits, QuickJSRuntime, Tool, WorkerPool, run_code

PROGRAM = "for (let i = 0; i < {n}; i++) await tools.noop({{}});\nreturn {n};"
_TICK = os.sysconf("SC_CLK_TCK")


def noop(args: dict[str, Any]) -> None:
    return None


TOOL = Tool("noop", noop, concurrency_safe=lambda args: True)


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(entry))
    return kids


def descendants() -> list[int]:
    kids = _children()
    out: list[int] = []
    todo = [os.getpid()]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def proc_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and of its children it has reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / _TICK


def proc_blocks(pid: int) -> int:
    """Voluntary context switches of every thread of ``pid``."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        total += int(line.split()[1])
    except OSError:
        pass
    return total


def thread_blocks() -> dict[int, int]:
    out: dict[int, int] = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        out[int(task)] = int(line.split()[1])
        except OSError:
            pass
    return out


def role(name: str) -> str:
    if name == "MainThread":
        return "run"
    if "driver" in name:
        return "driver"
    if "tool" in name or name.startswith("floor-"):
        return "tool"
    return "other"


class Sampler:
    """The most recent blocks of each descendant process, read every ``period``
    seconds while a run goes: a one-shot worker's are gone once it exits."""

    def __init__(self, period: float = 0.02) -> None:
        self.period = period
        self.seen: dict[int, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="bench-sampler", daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(self.period):
            for pid in descendants():
                blocks = proc_blocks(pid)
                if blocks:
                    self.seen[pid] = max(blocks, self.seen.get(pid, 0))

    def __enter__(self) -> "Sampler":
        self.seen = {pid: proc_blocks(pid) for pid in descendants()}
        self.base = dict(self.seen)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def blocks(self) -> int:
        return sum(v - self.base.get(pid, 0) for pid, v in self.seen.items())


def measure(fn: Callable[[], Any], n: int, processes: bool) -> dict[str, float]:
    names = {t.native_id: t.name for t in threading.enumerate()}
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    kids0 = {pid: proc_cpu(pid) for pid in descendants()}
    tb0 = thread_blocks()
    sampler = Sampler() if processes else None
    t0 = time.perf_counter()
    if sampler is not None:
        with sampler:
            fn()
    else:
        fn()
    wall = time.perf_counter() - t0
    tb1 = thread_blocks()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    kids1 = {pid: proc_cpu(pid) for pid in descendants()}
    names.update({t.native_id: t.name for t in threading.enumerate()})
    host = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    workers = sum(v - kids0.get(pid, 0.0) for pid, v in kids1.items()) if processes else 0.0
    row = {"wall": wall / n * 1e6, "host_cpu": host / n * 1e6, "worker_cpu": workers / n * 1e6}
    row["cpu"] = row["host_cpu"] + row["worker_cpu"]
    roles: dict[str, float] = {"run": 0.0, "driver": 0.0, "tool": 0.0}
    for tid, v in tb1.items():
        name = names.get(tid, "?")
        if name == "bench-sampler":
            continue
        key = role(name)
        roles[key] = roles.get(key, 0.0) + (v - tb0.get(tid, 0)) / n
    row.update({f"blocks_{k}": v for k, v in roles.items()})
    row["blocks_worker"] = sampler.blocks() / n if sampler is not None else 0.0
    return row


def table(rows: dict[str, list[dict[str, float]]]) -> str:
    cols = ["wall", "host_cpu", "worker_cpu", "cpu", "blocks_run", "blocks_driver", "blocks_tool", "blocks_worker"]
    floor_cpu = statistics.median(r["cpu"] for r in rows["floor"]) if "floor" in rows else None
    lines = [f"{'row':8s} " + " ".join(f"{c:>19s}" for c in cols) + "   cpu/floor"]
    for label, samples in rows.items():
        cells = []
        for c in cols:
            values = [r[c] for r in samples]
            cells.append(f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})")
        ratio = ""
        if floor_cpu:
            ratio = f"{statistics.median(r['cpu'] for r in samples) / floor_cpu:6.2f}x"
        lines.append(f"{label:8s} " + " ".join(f"{cell:>19s}" for cell in cells) + "   " + ratio)
    return "\n".join(lines)


def run_rows(n: int, reps: int, which: list[str]) -> dict[str, list[dict[str, float]]]:
    pool = WorkerPool()
    inproc = QuickJSRuntime()
    code = PROGRAM.format(n=n)
    limits = Limits(timeout=600, max_calls=n + 1)

    def ours(runtime: Any) -> Callable[[], None]:
        def go() -> None:
            r = run_code(code, [TOOL], runtime=runtime, limits=limits, description="the call-shape benchmark")
            assert r.ok and r.result == n, r.error

        return go

    # The floor's executor outlives its runs here, so its thread's blocks are counted.
    floor_pool = concurrent.futures.ThreadPoolExecutor(10, thread_name_prefix="floor-tool")

    def floor() -> None:
        assert _floor.run(code, {"noop": noop}, floor_pool) == n

    fns = {"worker": (ours(pool), True), "inproc": (ours(inproc), False), "floor": (floor, False)}
    try:
        for label in which:
            fns[label][0]()  # warm
        rows: dict[str, list[dict[str, float]]] = {label: [] for label in which}
        for rep in range(reps):
            order = which if rep % 2 == 0 else list(reversed(which))
            for label in order:
                fn, processes = fns[label]
                rows[label].append(measure(fn, n, processes))
        return rows
    finally:
        pool.close()
        floor_pool.shutdown()


_CALLGRIND_CHILD = """
import json, sys, time
from nous_sched import Limits, Tool, WorkerPool, QuickJSRuntime, run_code
n, rt = int(sys.argv[1]), sys.argv[2]
code = "for (let i = 0; i < %d; i++) await tools.noop({});\\nreturn %d;" % (n, n)
if rt == "engine":  # the worker's own step, without its pipes (and the host's envelope check)
    from nous_sched.runtime import engine
    eng = engine.Engine(code, ["noop"], Limits(timeout=900, max_calls=n + 1), time.monotonic() + 900)
    text = eng.start()
    while True:
        calls = engine._checked(text)["calls"]
        if not calls:
            break
        text = eng.settle_many([(calls[0][0], None, None, True, "null")])[0]
    sys.exit(0)
if rt == "floorstep":  # the minimal bridge's step: run the jobs, drain, settle
    sys.path.insert(0, sys.argv[3])
    import _floor, quickjs
    ctx = quickjs.Context()
    ctx.eval(_floor.PRELUDE)
    drain, settle = ctx.get("__drain"), ctx.get("__settle")
    ctx.eval("__run(async function program() {" + code + "\\n});")
    while True:
        while ctx.execute_pending_job():
            pass
        calls = json.loads(drain())[1]
        if not calls:
            break
        settle(calls[0][0], True, "null")
    sys.exit(0)
tool = Tool("noop", lambda args: None, concurrency_safe=lambda args: True)
runtime = WorkerPool() if rt == "worker" else QuickJSRuntime()
run_code("return 1", [tool], runtime=runtime, description="warm")
r = run_code(code, [tool], runtime=runtime, limits=Limits(timeout=900, max_calls=n + 1), description="callgrind")
assert r.ok, r.error
if rt == "worker":
    runtime.close()
"""


def callgrind(runtime: str, small: int = 200, large: int = 1200) -> int:
    """Host instructions per call (every thread), from two runs under callgrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind is not installed")
    counts = []
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "child.py")
        with open(script, "w") as f:
            f.write(_CALLGRIND_CHILD)
        for n in (small, large):
            out = os.path.join(tmp, f"cg.{n}")
            here = os.path.dirname(os.path.abspath(__file__))
            proc = subprocess.run(
                [
                    valgrind,
                    "--tool=callgrind",
                    f"--callgrind-out-file={out}",
                    sys.executable,
                    script,
                    str(n),
                    runtime,
                    here,
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            line = next(x for x in proc.stderr.splitlines() if "Collected" in x)
            counts.append(int(line.split(":")[1].strip().replace(",", "")))
    return (counts[1] - counts[0]) // (large - small)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--rows", default="worker,inproc,floor")
    parser.add_argument("--callgrind", action="store_true", help="also host instructions per call (slow)")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"# {args.calls} sequential calls, {args.reps} repetitions; load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("# per call: wall and CPU in us (median (min-max)), blocks = voluntary context switches per call")
    print(table(run_rows(args.calls, max(args.reps, 2), args.rows.split(","))))
    if args.callgrind:
        for runtime in ("worker", "inproc"):
            print(f"host instructions per call [{runtime}]: {callgrind(runtime):,}", flush=True)
        for step in ("engine", "floorstep"):
            print(f"instructions per step [{step}]: {callgrind(step, 1000, 6000):,}", flush=True)
    print(f"# load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

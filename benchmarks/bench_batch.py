"""A batched call's shape: where each microsecond of a ``Promise.all`` call goes, per thread.

``await Promise.all(Array.from({length: N}, () => tools.noop({})))`` run by
``run_code`` on the worker runtime, beside the minimal bridge (``_floor.py``,
its own executor), each repetition in its own order (forward, then reversed).
Per call:

* **CPU per thread** of the host (``/proc/self/task/*/schedstat``, ns,
  grouped by role: the run's thread, the scheduler's driver, the tool
  threads, the rest) and of the worker processes (``/proc``, the fork
  server's reaped children included), beside wall time;
* with ``--callgrind``, **instructions per call per thread** of the host,
  from one valgrind run (``--separate-threads=yes``) that dumps after a run
  of ``SMALL`` calls and after one of ``LARGE`` (start-up cancels out in the
  difference), the floor's the same way. Callgrind numbers threads by the
  lowest free slot as they start; the child logs each thread's start and end
  so the report names each slot's role. The worker process is not traced
  here: ``bench_workerstep.py --promise-all --batch K`` gives its instructions
  per call with settles batched as the host sends them.

Run by hand (not part of ``run_all.py``)::

    python benchmarks/bench_batch.py [--calls 1000] [--reps 6] [--runs 8] [--callgrind]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

import _floor
from bench_callshape import descendants, proc_cpu

from nous_sched import Limits, Tool, WorkerPool, run_code

PROGRAM = "const r = await Promise.all(Array.from({{ length: {n} }}, () => tools.noop({{}})));\nreturn r.length;"
SMALL, LARGE = 200, 1200


def noop(args: dict[str, Any]) -> None:
    return None


TOOL = Tool("noop", noop, concurrency_safe=lambda args: True)


def role(name: str) -> str:
    if name == "MainThread":
        return "run"
    if "driver" in name:
        return "driver"
    if "tool" in name or name.startswith("floor-"):
        return "tool"
    return "other"


def thread_cpu() -> dict[int, int]:
    """ns of CPU of each thread of this process."""
    out: dict[int, int] = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/schedstat") as f:
                out[int(task)] = int(f.read().split()[0])
        except OSError:
            pass
    return out


def measure(fn: Callable[[], Any], n: int, processes: bool, runs: int) -> dict[str, float]:
    """Per call figures of ``runs`` runs of ``n`` calls (the workers' CPU comes in clock ticks)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    kids0 = {pid: proc_cpu(pid) for pid in descendants()} if processes else {}
    c0 = thread_cpu()
    t0 = time.perf_counter()
    for _ in range(runs):
        fn()
    n *= runs
    wall = time.perf_counter() - t0
    c1 = thread_cpu()
    kids1 = {pid: proc_cpu(pid) for pid in descendants()} if processes else {}
    names.update({t.native_id: t.name for t in threading.enumerate()})
    row: dict[str, float] = {"wall": wall / n * 1e6, "run": 0.0, "driver": 0.0, "tool": 0.0, "other": 0.0}
    for tid, ns in c1.items():
        row[role(names.get(tid, "?"))] += (ns - c0.get(tid, 0)) / 1e3 / n
    row["host"] = row["run"] + row["driver"] + row["tool"] + row["other"]
    row["worker"] = sum(v - kids0.get(pid, 0.0) for pid, v in kids1.items()) / n * 1e6 if processes else 0.0
    row["cpu"] = row["host"] + row["worker"]
    return row


COLS = ["wall", "cpu", "host", "run", "driver", "tool", "other", "worker"]


def table(rows: dict[str, list[dict[str, float]]]) -> str:
    floor_cpu = statistics.median(r["cpu"] for r in rows["floor"]) if "floor" in rows else None
    lines = [f"{'row':8s} " + " ".join(f"{c:>19s}" for c in COLS) + "   cpu/floor"]
    for label, samples in rows.items():
        cells = []
        for c in COLS:
            values = [r[c] for r in samples]
            cells.append(f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})")
        ratio = f"{statistics.median(r['cpu'] for r in samples) / floor_cpu:6.2f}x" if floor_cpu else ""
        lines.append(f"{label:8s} " + " ".join(f"{cell:>19s}" for cell in cells) + "   " + ratio)
    return "\n".join(lines)


def run_rows(n: int, reps: int, runs: int) -> dict[str, list[dict[str, float]]]:
    pool = WorkerPool()
    code = PROGRAM.format(n=n)
    limits = Limits(timeout=600, max_calls=n + 1)
    floor_pool = concurrent.futures.ThreadPoolExecutor(10, thread_name_prefix="floor-tool")

    def ours() -> None:
        r = run_code(code, [TOOL], runtime=pool, limits=limits, description="the batch benchmark")
        assert r.ok and r.result == n, r.error

    def floor() -> None:
        assert _floor.run(code, {"noop": noop}, floor_pool) == n

    fns = {"worker": (ours, True), "floor": (floor, False)}
    try:
        for fn, _ in fns.values():
            fn()
            fn()
        rows: dict[str, list[dict[str, float]]] = {label: [] for label in fns}
        for rep in range(reps):
            for label in fns if rep % 2 == 0 else reversed(list(fns)):
                fn, processes = fns[label]
                rows[label].append(measure(fn, n, processes, runs))
        return rows
    finally:
        pool.close()
        floor_pool.shutdown()


# -- under callgrind -------------------------------------------------------------------


def phases(log_path: str) -> None:
    """Runs under valgrind: each side, a run of SMALL then one of LARGE, a dump after each."""
    # (what, name, native id, the process's threads then): threads that are not
    # Python's (a library's) hold callgrind slots too, seen in the thread list.
    events: list[tuple[str, str, int, list[int]]] = [("start", "MainThread", threading.get_native_id(), [])]

    def tasks() -> list[int]:
        return [int(t) for t in os.listdir("/proc/self/task")]

    lock = threading.Lock()
    inner = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def logged(self: threading.Thread) -> None:
        with lock:
            events.append(("start", self.name, threading.get_native_id(), tasks()))
        try:
            inner(self)
        finally:
            with lock:
                events.append(("end", self.name, threading.get_native_id(), tasks()))

    threading.Thread._bootstrap_inner = logged  # type: ignore[attr-defined]
    pool = WorkerPool()
    floor_pool = concurrent.futures.ThreadPoolExecutor(10, thread_name_prefix="floor-tool")

    def dump(label: str) -> None:
        with lock:
            events.append(("dump", label, 0, tasks()))
        subprocess.run(["callgrind_control", "--dump=" + label, str(os.getpid())], capture_output=True, check=True)

    def ours(n: int) -> None:
        r = run_code(
            PROGRAM.format(n=n), [TOOL], runtime=pool, limits=Limits(timeout=900, max_calls=n + 1), description="cg"
        )
        assert r.ok and r.result == n, r.error

    def floor(n: int) -> None:
        assert _floor.run(PROGRAM.format(n=n), {"noop": noop}, floor_pool) == n

    for side, go in (("ours", ours), ("floor", floor)):
        go(20)
        go(20)
        dump(f"{side}-warm")
        for n in (SMALL, LARGE):
            go(n)
            dump(f"{side}-{n}")
    pool.close()
    floor_pool.shutdown()
    with open(log_path, "w") as f:
        json.dump(events, f)


def slots(events: list[list[Any]]) -> dict[int, str]:
    """Callgrind's thread number -> the role of the threads that held it ("mixed" if not one)."""
    held: dict[int, str] = {}
    live: dict[int, int] = {}

    def start(ident: int, name: str) -> None:
        slot = 1
        while slot in live:
            slot += 1
        live[slot] = ident
        held[slot] = role(name) if slot not in held or held[slot] == role(name) else "mixed"

    for kind, name, ident, alive in events:
        if alive:
            for slot, who in list(live.items()):  # ended unseen (not Python's)
                if who not in alive and who != ident:
                    del live[slot]
            for other in sorted(set(alive) - set(live.values()) - {ident}):  # started unseen
                start(other, "native")
        if kind == "start":
            start(ident, name)
        elif kind == "end":
            for slot, who in list(live.items()):
                if who == ident:
                    del live[slot]
    return held


def callgrind_counts(prefix: str) -> dict[tuple[str, int], int]:
    """(dump label, callgrind thread) -> instructions."""
    found: dict[tuple[str, int], int] = {}
    folder, base = os.path.split(prefix)
    for name in os.listdir(folder):
        if not name.startswith(base):
            continue
        label, thread, total = None, None, None
        with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith(("desc: Trigger: Client Request: ", "desc: Trigger: dump ")):
                    label = line.split()[-1]
                elif line.startswith("thread:"):
                    thread = int(line.split()[1])
                elif line.startswith(("totals:", "summary:")):
                    total = int(line.split()[1])
        if label is not None and thread is not None and total is not None:
            found[(label, thread)] = total
    return found


def callgrind() -> str:
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        raise SystemExit("valgrind is not installed")
    with tempfile.TemporaryDirectory() as d:
        prefix = os.path.join(d, "callgrind.out")
        log = os.path.join(d, "threads.json")
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={prefix}"]
        cmd += ["--trace-children=no", sys.executable, os.path.abspath(__file__), "--phases", log]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3000)
        if proc.returncode != 0:
            raise RuntimeError(f"valgrind exit {proc.returncode}: " + proc.stderr.strip()[-800:])
        got = callgrind_counts(prefix)
        with open(log) as f:
            roles = slots(json.load(f))
    lines = [f"host instructions per call, per thread ((run of {LARGE} - run of {SMALL}) / {LARGE - SMALL})"]
    for side in ("ours", "floor"):
        by_role: dict[str, float] = collections.defaultdict(float)
        for (label, thread), total in got.items():
            if label == f"{side}-{LARGE}":
                small = got.get((f"{side}-{SMALL}", thread), 0)
                by_role[roles.get(thread, "?")] += (total - small) / (LARGE - SMALL)
        cells = ", ".join(f"{r} {v / 1e3:.1f}k" for r, v in sorted(by_role.items(), key=lambda kv: -kv[1]))
        lines.append(f"  {side:6s} total {sum(by_role.values()) / 1e3:.1f}k: {cells}")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--phases":
        phases(sys.argv[2])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--runs", type=int, default=8, help="runs per sample (a worker's CPU is read in 10 ms ticks)")
    parser.add_argument("--callgrind", action="store_true", help="also host instructions per call per thread (slow)")
    parser.add_argument("--no-cpu", action="store_true", help="only the instructions")
    args = parser.parse_args()
    load = os.getloadavg()
    print(
        f"# Promise.all over {args.calls} calls, {args.reps} samples of {args.runs} runs; load {load[0]:.2f} {load[1]:.2f}"
    )
    if not args.no_cpu:
        print("# per call, us: wall, CPU (host + worker), host by thread role (schedstat), worker processes")
        print(table(run_rows(args.calls, max(args.reps, 2), args.runs)))
    if args.callgrind:
        print(callgrind(), flush=True)
    print(f"# load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

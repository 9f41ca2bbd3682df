"""Reliability under faults: issue 43's items 1, 2, 7 and 8, measured from outside.

Not a ratio table: each experiment counts what callers got. Run by hand::

    python benchmarks/bench_reliability.py                 # all four, default sizes
    python benchmarks/bench_reliability.py interrupts forkserver --interrupts 1000 --seconds 60
    PYTHONPATH=/other/copy python benchmarks/bench_reliability.py   # another copy, for before/after

1. ``interrupts``: a Ctrl-C (``SIGINT`` to the main thread) at a random
   moment of each of N short fan-out runs (tests/_interrupt_fuzz.py), then:
   places left busy, zombies, processes the pool does not know, descriptors
   against the baseline, and whether the next run works. ``--signal SIGTERM``
   sends that signal instead, its handler raising ``SystemExit`` (gunicorn's
   and Celery's workers).
2. ``forkserver``: 8 threads running short programs while the pool's fork
   server is killed every 2 s: runs exact, runs with an error (data), runs
   that raised.
7. ``io`` / ``cpu``: 64 runs at once on the default pool with a 5 s
   deadline, each waiting 1 s on a tool (no CPU), then each spinning 0.3 s
   of CPU: how many finish, and the wall time.
8. ``kills``: 8 threads of load while a random worker is killed (``SIGKILL``)
   every 50 ms: runs that raised, runs lost (abort); spares ready 5 s after,
   against a control run without kills.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")

PROGRAM = "const r = await Promise.all([1, 2, 3].map(i => tools.echo({i}))); return r.length"


def interrupts(args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, os.path.join(TESTS, "_interrupt_fuzz.py"), str(args.interrupts), "7", args.signal],
        capture_output=True,
        text=True,
        timeout=3600,
        env=env,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["fds_leaked"] = out["fds"] - out["base_fds"]
    out["processes_unknown"] = out["processes"] - out["workers"]
    return out


def _load(pool: Any, seconds: float, threads: int, fault: Callable[[], None], every: float) -> dict[str, Any]:
    from nous_sched import Tool, run_code

    tools = [Tool("echo", lambda a: a["i"])]
    counts: collections.Counter[str] = collections.Counter()
    raised: collections.Counter[str] = collections.Counter()
    errors: collections.Counter[str] = collections.Counter()
    stop = threading.Event()
    lock = threading.Lock()

    def one() -> None:
        while not stop.is_set():
            try:
                r = run_code(PROGRAM, tools, runtime=pool, timeout=10, description="load")
            except Exception as exc:
                with lock:
                    raised[f"{type(exc).__name__}: {str(exc)[:200]}"] += 1
                continue
            with lock:
                if r.result == 3:
                    counts["exact"] += 1
                else:
                    counts["error"] += 1
                    errors[f"{r.error.kind}: {r.error.message[:200]}" if r.error else "wrong"] += 1

    ts = [threading.Thread(target=one) for _ in range(threads)]
    for t in ts:
        t.start()
    end = time.monotonic() + seconds
    faults = 0
    while time.monotonic() < end:
        time.sleep(every)
        try:
            fault()
            faults += 1
        except (ProcessLookupError, AttributeError, IndexError):
            pass
    stop.set()
    for t in ts:
        t.join(60)
    return {
        "faults": faults,
        "runs": sum(counts.values()) + sum(raised.values()),
        **counts,
        "raised": sum(raised.values()),
        "raised_as": dict(raised),
        "errors_as": dict(errors),
    }


def forkserver(args: argparse.Namespace) -> dict[str, Any]:
    from nous_sched import WorkerPool

    pool = WorkerPool()

    def kill() -> None:
        os.kill(pool._server.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]

    try:
        return _load(pool, args.seconds, 8, kill, 2.0)
    finally:
        pool.close()


def kills(args: argparse.Namespace) -> dict[str, Any]:
    from nous_sched import WorkerPool

    out = {}
    for label, faulty in (("control", False), ("kills", True)):
        pool = WorkerPool()
        rng = random.Random(8)

        def kill(pool: Any = pool, faulty: bool = faulty) -> None:
            if faulty:
                os.kill(rng.choice(pool.pids()), signal.SIGKILL)

        try:
            row = _load(pool, args.seconds, 8, kill, 0.05)
            time.sleep(5.0)
            with pool._lock:
                row["spares_ready_after"] = pool._core.spares_ready()
            out[label] = row
        finally:
            pool.close()
    return out


def _many(program: str, tools: list[Any]) -> dict[str, Any]:
    from nous_sched import run_code

    results: list[Any] = []
    lock = threading.Lock()

    def one() -> None:
        r = run_code(program, tools, timeout=5, description="many")
        with lock:
            results.append(r)

    t0 = time.monotonic()
    ts = [threading.Thread(target=one) for _ in range(64)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    wall = time.monotonic() - t0
    why = collections.Counter(r.error.message[:80] for r in results if r.error is not None)
    return {"finished": sum(r.error is None for r in results), "of": 64, "wall_s": round(wall, 2), "errors": dict(why)}


def io(args: argparse.Namespace) -> dict[str, Any]:
    from nous_sched import Tool

    return _many("return await tools.wait({})", [Tool("wait", lambda a: time.sleep(1.0))])


def cpu(args: argparse.Namespace) -> dict[str, Any]:
    # (0.3 s of CPU in the engine: a loop calibrated once, on the caller's thread.)
    from nous_sched import QuickJSRuntime, run_code

    n = args.loop
    if not n:
        n = 1_000_000
        t0 = time.process_time()
        run_code(
            f"let s = 0; for (let i = 0; i < {n}; i++) s += i; return s", runtime=QuickJSRuntime(), description="c"
        )
        n = int(n * 0.3 / max(time.process_time() - t0, 1e-3))
    return {"loop": n, **_many(f"let s = 0; for (let i = 0; i < {n}; i++) s += i; return 1", [])}


EXPERIMENTS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "interrupts": interrupts,
    "forkserver": forkserver,
    "io": io,
    "cpu": cpu,
    "kills": kills,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("only", nargs="*", choices=[[], *EXPERIMENTS], default=[])
    parser.add_argument("--interrupts", type=int, default=1000)
    parser.add_argument(
        "--signal", default="SIGINT", help="the interrupts' signal (SIGTERM: its handler raises SystemExit)"
    )
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--loop", type=int, default=0, help="the cpu runs' loop count (default: 0.3 s, calibrated)")
    args = parser.parse_args()
    for name in args.only or list(EXPERIMENTS):
        print(f"{name}: {json.dumps(EXPERIMENTS[name](args), sort_keys=True)}", flush=True)


if __name__ == "__main__":
    main()

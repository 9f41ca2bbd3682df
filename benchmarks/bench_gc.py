"""The garbage collector's share of a ``Promise.all`` run: collections, their time, and what they promote.

``await Promise.all(Array.from({length: N}, () => tools.noop({})))`` run by
``run_code`` on the worker runtime, ``--runs`` times after three warm runs.
Per call:

* **collections** by generation and thread (``gc.callbacks``), and the
  microseconds they took (wall time inside the collector: a full collection
  walks every tracked object of the process, so its cost is the process's,
  not the run's, and it comes every eleventh collection of the middle
  generation);
* with ``--promoted``, a second pass: the objects each middle-generation
  collection moved to the oldest generation, by type, per run (what a run
  holds long enough to outlive two collections).

Run by hand (not part of ``run_all.py``); compare a base and a branch in
alternating order::

    python benchmarks/bench_gc.py [--calls 1000] [--runs 60] [--promoted]
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import threading
import time
from typing import Any

from nous_sched import Limits, Tool, WorkerPool, run_code

PROGRAM = "const r = await Promise.all(Array.from({{ length: {n} }}, () => tools.noop({{}})));\nreturn r.length;"
TOOL = Tool("noop", lambda args: None, concurrency_safe=lambda args: True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--promoted", action="store_true", help="also what each run promotes (slow)")
    args = parser.parse_args()
    n = args.calls
    pool = WorkerPool()

    def go() -> None:
        r = run_code(
            PROGRAM.format(n=n), [TOOL], runtime=pool, limits=Limits(timeout=900, max_calls=n + 1), description="gc"
        )
        assert r.ok and r.result == n, r.error

    load = os.getloadavg()
    print(f"# Promise.all over {n} calls, {args.runs} runs; load {load[0]:.2f} {load[1]:.2f}")
    try:
        for _ in range(3):
            go()
        stats: dict[tuple[int, str], list[float]] = collections.defaultdict(lambda: [0, 0.0])
        began: dict[str, float] = {}

        def timed(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                began["t"] = time.perf_counter()
            else:
                row = stats[
                    (info["generation"], "run" if threading.current_thread() is threading.main_thread() else "other")
                ]
                row[0] += 1
                row[1] += time.perf_counter() - began["t"]

        gc.callbacks.append(timed)
        t0 = time.perf_counter()
        try:
            for _ in range(args.runs):
                go()
        finally:
            gc.callbacks.remove(timed)
        wall = time.perf_counter() - t0
        calls = args.runs * n
        total = 0.0
        for (gen, who), (count, spent) in sorted(stats.items()):
            print(
                f"  generation {gen} on the {who} thread(s): {int(count)} collections, {spent * 1e6 / calls:.2f} us/call"
            )
            total += spent
        print(f"  collector total {total * 1e6 / calls:.2f} us/call; wall {wall * 1e6 / calls:.1f} us/call")
        if args.promoted:
            print(promoted(go, args.runs))
    finally:
        pool.close()
    print(f"# load after: {os.getloadavg()[0]:.2f}")
    return 0


def promoted(go: Any, runs: int) -> str:
    """What each middle-generation collection moved to the oldest, by type, per run."""
    moved: collections.Counter[str] = collections.Counter()
    before: dict[str, set[int]] = {}
    busy = [False]

    def watch(phase: str, info: dict[str, Any]) -> None:
        if busy[0] or info["generation"] != 1:
            return
        busy[0] = True
        try:
            if phase == "start":
                before["ids"] = {id(o) for o in gc.get_objects(2)}
            else:
                old = before["ids"]
                moved.update(type(o).__name__ for o in gc.get_objects(2) if id(o) not in old)
        finally:
            busy[0] = False

    gc.callbacks.append(watch)
    try:
        for _ in range(runs):
            go()
    finally:
        gc.callbacks.remove(watch)
    top = ", ".join(f"{name} {count / runs:.0f}" for name, count in moved.most_common(8))
    return f"  promoted to the oldest generation per run: {sum(moved.values()) / runs:.0f} ({top})"


if __name__ == "__main__":
    raise SystemExit(main())

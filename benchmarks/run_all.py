"""Run every benchmark, print every table, then PASS/MISS against each target.

    python benchmarks/run_all.py            # the figures to quote (a few minutes)
    python benchmarks/run_all.py --quick    # smoke run: smaller N, fewer repetitions
    python benchmarks/run_all.py --only lane,bridge

Each benchmark runs in its own interpreter (``sys.executable``, same
environment, so ``PYTHONPATH`` can point at another copy of ``nous_sched``):
a fresh process keeps peak RSS, thread counts and the peer's imports from
leaking between benchmarks. Exit status: 0 when every target passed, 1 when
one was missed, 2 when a benchmark itself failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _common as c  # noqa: E402

BENCHMARKS = [
    ("lane", "bench_lane.py"),
    ("fanout", "bench_fanout.py"),
    ("bridge", "bench_bridge.py"),
    ("startup", "bench_startup.py"),
    ("many_runs", "bench_many_runs.py"),
    ("peer", "bench_peer.py"),
]


def run_one(script: str, args: list[str], timeout: float) -> tuple[str, list[c.Row], str]:
    cmd = [sys.executable, os.path.join(HERE, script), "--json", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return script, [], f"timed out after {timeout:.0f}s"
    for line in proc.stdout.splitlines():
        if line.startswith(c.MARK):
            title, rows = c.rows_from_json(json.loads(line[len(c.MARK) :]))
            return title, rows, "" if proc.returncode == 0 else f"exit {proc.returncode}"
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
    return script, [], f"exit {proc.returncode}:\n    " + "\n    ".join(tail)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: smaller N, fewer repetitions")
    p.add_argument("--reps", type=int, default=None, help="repetitions for every benchmark")
    p.add_argument("--only", default="", help="comma-separated subset: " + ",".join(k for k, _ in BENCHMARKS))
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed per benchmark")
    a = p.parse_args()
    wanted = {w.strip() for w in a.only.split(",") if w.strip()}
    unknown = wanted - {k for k, _ in BENCHMARKS}
    if unknown:
        p.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    passthrough = (["--quick"] if a.quick else []) + (["--reps", str(a.reps)] if a.reps else [])

    import nous_sched

    print(f"nous_sched {nous_sched.__version__} from {os.path.dirname(nous_sched.__file__)}")
    print(c.machine_line() + (" (--quick: smoke figures, not for quoting)" if a.quick else ""))
    print()
    summary: list[tuple[str, str, str, str]] = []
    failed = False
    t_all = time.perf_counter()
    for key, script in BENCHMARKS:
        if wanted and key not in wanted:
            continue
        t0 = time.perf_counter()
        title, rows, problem = run_one(script, passthrough, a.timeout)
        if rows:
            print(c.format_table(title, rows))
        if problem:
            print(f"== {title}\n  FAILED: {problem}" if not rows else f"  ({problem})")
            failed = True
        print(f"  [{time.perf_counter() - t0:.1f}s, {c.machine_line()}]\n", flush=True)
        for r in rows:
            if r.status in ("PASS", "MISS", "UNAVAILABLE"):
                shown = c.fmt_stats(r.ours, r.unit).split(" (")[0] if r.ours is not None else r.note
                if r.ratio is not None:
                    shown += f", ratio {c.fmt_ratio(r.ratio)}"
                summary.append((r.status, r.name.strip(), r.target, shown))

    print("== summary (targets)")
    width = max((len(s[1]) for s in summary), default=10)
    for status, name, target, ratio in summary:
        print(f"{status:<11} {name:<{width}}  {target}  [{ratio}]")
    misses = sum(1 for s in summary if s[0] == "MISS")
    print(f"{sum(1 for s in summary if s[0] == 'PASS')} passed, {misses} missed; {time.perf_counter() - t_all:.0f}s")
    if failed:
        return 2
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())

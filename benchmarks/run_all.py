"""Run every benchmark, print every table, then each target's PASS/MISS.

    python benchmarks/run_all.py              # the figures to quote (several minutes)
    python benchmarks/run_all.py --quick      # smoke run, under a minute: not for quoting
    python benchmarks/run_all.py --peers      # also Vercel's code mode (npm install on first use) and pydantic-monty
    python benchmarks/run_all.py --only bridge,payload --runtime in-process
    python benchmarks/run_all.py --hot        # thread hand-offs in the fast regime, on purpose

Each benchmark runs in its own interpreter (``sys.executable``, same
environment, so ``PYTHONPATH`` can point at another copy of ``nous_sched``):
a fresh process keeps memory, threads and the peers' imports from leaking
between benchmarks. A missed target is a MISS row, not a failure: the exit
status is 0 when every benchmark ran to the end, 1 when one broke (raised,
timed out, or printed no table).

To add a benchmark: a ``bench_<name>.py`` that builds its rows with
``_common`` and ends in ``sys.exit(c.run(title, sections, opts))``, and one
line in ``BENCHMARKS`` below. Rows that take a ``runtime`` come from
``c.per_runtime`` and run on every runtime ``_common.available_runtimes`` finds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _common as c  # noqa: E402

# (key, script, run only with --peers)
PEER_ONLY = {
    "bench_vercel.py": (
        "10. peer: Vercel's code mode",
        "Vercel's code mode (@ai-sdk/code-mode)",
        "installs it with npm",
    ),
    "bench_monty.py": (
        "11. peer: pydantic-monty",
        "pydantic-monty (sync and async pools)",
        "pip install -e '.[bench]'",
    ),
}
BENCHMARKS = [
    ("lane", "bench_lane.py", False),
    ("bridge", "bench_bridge.py", False),
    ("fanout", "bench_fanout.py", False),
    ("startup", "bench_startup.py", False),
    ("startup_steps", "bench_startup_steps.py", False),
    ("payload", "bench_payload.py", False),
    ("scaling", "bench_scaling.py", False),
    ("memory", "bench_memory.py", False),
    ("many_runs", "bench_many_runs.py", False),
    ("mcp", "bench_mcp.py", False),
    ("patterns", "bench_patterns.py", False),
    ("events", "bench_events.py", False),
    ("runtimes", "bench_runtimes.py", False),
    ("durable", "bench_durable.py", False),
    ("throttle", "bench_throttle.py", False),
    ("peer", "bench_peer.py", False),
    ("ab", "bench_ab.py", False),
    ("wall", "bench_wall.py", False),
    ("blobs", "bench_blobs.py", False),
    ("tool_count", "bench_tool_count.py", False),
    ("instructions", "bench_instructions.py", False),
    ("vercel", "bench_vercel.py", True),
    ("monty", "bench_monty.py", True),
]


def run_one(script: str, args: list[str], timeout: float) -> tuple[str, list[c.Row], str]:
    """(title, rows, problem): ``problem`` is empty when the script ran to the end."""
    cmd = [sys.executable, os.path.join(HERE, script), "--json", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return script, [], f"timed out after {timeout:.0f}s"
    for line in proc.stdout.splitlines():
        if line.startswith(c.MARK):
            title, rows = c.rows_from_json(json.loads(line[len(c.MARK) :]))
            if proc.returncode == 0:
                return title, rows, ""
            tail = proc.stderr.strip().splitlines()[-12:]
            return title, rows, f"exit {proc.returncode}:\n    " + "\n    ".join(tail)
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
    return script, [], f"exit {proc.returncode}, no table:\n    " + "\n    ".join(tail)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: smaller N, fewer repetitions (under a minute)")
    p.add_argument("--reps", type=int, default=None, help="repetitions for every benchmark (at least 2)")
    p.add_argument("--only", default="", help="comma-separated subset: " + ",".join(k for k, _, _ in BENCHMARKS))
    p.add_argument("--runtime", default="", help="comma-separated runtimes for the run_code rows (default: all)")
    p.add_argument(
        "--peers",
        action="store_true",
        help="also run the peers: Vercel's code mode (installs it with npm), pydantic-monty",
    )
    p.add_argument("--hot", action="store_true", help="nice-19 spinners on every core: the fast hand-off regime")
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed per benchmark")
    p.add_argument("--save", default="", help="also write every table as JSON to this file")
    a = p.parse_args()
    wanted = {w.strip() for w in a.only.split(",") if w.strip()}
    unknown = wanted - {k for k, _, _ in BENCHMARKS}
    if unknown:
        p.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    passthrough = (
        (["--quick"] if a.quick else [])
        + (["--reps", str(a.reps)] if a.reps else [])
        + (["--runtime", a.runtime] if a.runtime else [])
        + (["--hot"] if a.hot else [])
    )

    import nous_sched

    print(f"nous_sched {nous_sched.__version__} from {os.path.dirname(nous_sched.__file__)}")
    print(
        c.machine_line()
        + (", --hot" if a.hot else "")
        + (" (--quick: smoke figures, not for quoting)" if a.quick else "")
    )
    print(f"runtimes: {', '.join(c.available_runtimes())}")
    print(
        f"hand-off column: the raw executor.submit(f).result() round trip probed beside each row's samples; "
        f"fast < {c.FAST_BELOW_US:g} us, slow {c.SLOW_ABOVE_US:g}-{c.STARVED_ABOVE_US:g} us, "
        f"starved above (CPUs oversubscribed), mixed when a row saw more than one"
    )
    print()
    summary: list[tuple[str, c.Row]] = []
    tables = []
    broken: list[str] = []
    t_all = time.perf_counter()
    for key, script, needs_peers in BENCHMARKS:
        if wanted and key not in wanted:
            continue
        if needs_peers and not a.peers:
            title, what, how = PEER_ONLY[script]
            row = c.skip_row(what, f"pass --peers ({how})")
            print(c.format_table(title, [row]) + "\n")
            summary.append((title, row))
            continue
        t0 = time.perf_counter()
        title, rows, problem = run_one(script, passthrough, a.timeout)
        if rows:
            print(c.format_table(title, rows))
            tables.append({"title": title, "rows": [asdict(r) for r in rows]})
        if problem:
            print(f"== {title}\n  BROKEN: {problem}" if not rows else f"  BROKEN: {problem}")
            broken.append(script)
        print(f"  [{time.perf_counter() - t0:.1f}s, {c.machine_line()}]\n", flush=True)
        summary.extend((title, r) for r in rows if r.status in ("PASS", "MISS", "SKIP", "ERROR"))

    print("== summary (targets)")
    width = max((len(r.name.strip()) for _, r in summary), default=10)
    for _, r in summary:
        if r.ours is None:
            shown = r.note
        else:
            shown = c.fmt_stats(r.ours, r.unit).split(" (")[0]
            if r.ratio is not None:
                shown += f", ratio {c.fmt_ratio(r.ratio).split(' (')[0]}"
            if r.cpu is not None or r.base_cpu is not None:
                shown += f"; CPU {c.fmt_cpu(r)}"
            shown += f"; hand-off {c.fmt_regime(r.regime)}; load {c.fmt_load(r.load)}"
        print(f"{r.status:<5} {r.name.strip():<{width}}  {r.target}  [{shown}]")
    count = {s: sum(1 for _, r in summary if r.status == s) for s in ("PASS", "MISS", "SKIP", "ERROR")}
    print(
        f"{count['PASS']} passed, {count['MISS']} missed, {count['SKIP']} skipped; "
        f"{len(broken)} benchmark(s) broken{': ' + ', '.join(broken) if broken else ''}; "
        f"{time.perf_counter() - t_all:.0f}s; {c.machine_line()}"
    )
    if a.save:
        with open(a.save, "w") as f:
            json.dump({"machine": c.machine_line(), "quick": a.quick, "tables": tables}, f, indent=1)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())

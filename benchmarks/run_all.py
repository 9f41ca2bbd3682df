"""Run every benchmark, print every table, then each target's PASS/MISS.

    python benchmarks/run_all.py              # the figures to quote (several minutes)
    python benchmarks/run_all.py --quick      # smoke run, under a minute: not for quoting
    python benchmarks/run_all.py --peers      # also Vercel's code mode (npm install on first use) and pydantic-monty
    python benchmarks/run_all.py --only bridge,payload --runtime in-process
    python benchmarks/run_all.py --hot        # thread hand-offs in the fast regime, on purpose
    python benchmarks/run_all.py --summary --peers   # only the README's summary block, on stdout

``--summary`` runs only the benchmarks the README's summary reads (tables and
progress on stderr) and prints the block (reStructuredText, with the date,
the commit and the load); a full run (no ``--only``) ends with the same block.
tests/test_docs.py checks that the README's block has the rows and the
shape printed here.

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
import compileall
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Optional

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
    ("concurrency", "bench_concurrency.py", False),
    ("exit", "bench_exit.py", False),
    ("vercel", "bench_vercel.py", True),
    ("monty", "bench_monty.py", True),
]


# -- the summary block (README.rst) --------------------------------------------------

#: The block's first and last lines: reStructuredText comments, so a reader
#: sees the table and tests/test_docs.py finds it.
SUMMARY_BEGIN = ".. benchmark summary: printed by `python benchmarks/run_all.py --summary --peers`"
SUMMARY_END = ".. end of the benchmark summary"
SUMMARY_COMMAND = "python benchmarks/run_all.py --summary --peers"
SUMMARY_HEAD = ("row", "wall: ours / baseline", "CPU: ours / baseline", "ratio: wall; CPU", "load", "goal")


@dataclass(frozen=True)
class Pick:
    """A table row a summary line reads: the benchmark's key, a pattern its
    name matches whole (stripped), and optionally a pattern of the row it
    must come after (companion rows share names across runtimes)."""

    bench: str
    name: str
    after: str = ""


@dataclass(frozen=True)
class Line:
    """One row of the summary: its name (the README's), the rows it reads,
    how it turns them into cells, its goal, and for a peer what the peer's
    design skips (so a ratio behind it says why)."""

    name: str
    picks: tuple[Pick, ...]
    # "row": ours vs base of picks[0] (CPU from picks[1] if given); "pair": picks[0] vs picks[1]; "levels";
    # "count": a load-independent count (instructions) of picks[0], in the CPU column
    how: str
    goal: str
    skips: str = ""


def _seq(rt: str) -> Pick:
    return Pick("bridge", rf"run_code: [\d,]+ sequential awaits \[{rt}\]")


def _wide(rt: str) -> tuple[Pick, Pick]:
    head = rf"run_code fan-out 50 x 5 ms, max_parallel 50 \[{rt}\]"
    return Pick("fanout", head), Pick("fanout", r"vs a warm ThreadPoolExecutor\(50\)", after=head)


_VERCEL = "a process boundary (QuickJS runs in a Node worker thread), thread hand-offs (async tools)"
_LANGCHAIN = "a process boundary (QuickJS in the caller's process), thread hand-offs (async tools)"
_MONTY_SYNC = "thread hand-offs, a scheduler, per-call records, concurrency (the tool runs on the calling thread)"
_MONTY_ASYNC = "a scheduler and per-call records (async tools on the caller's event loop)"

SUMMARY: tuple[Line, ...] = (
    Line(
        "sequential awaits [worker] vs a minimal bridge",
        (_seq("worker"),),
        "row",
        "CPU <= 2.0x",
    ),
    Line(
        "Promise.all over 1,000 calls [worker] vs a minimal bridge",
        (Pick("bridge", r"run_code: Promise\.all over [\d,]+ calls \[worker\]"),),
        "row",
        "CPU <= 2.0x",
    ),
    Line("per call, sequential awaits: worker vs in-process", (_seq("worker"), _seq("in-process")), "pair", "<= 1.3x"),
    Line("fan-out 50 x 5 ms at 50 wide [worker] vs ideal", _wide("worker"), "row", "<= 2.0x ideal"),
    Line("fan-out 50 x 5 ms at 50 wide [in-process] vs ideal", _wide("in-process"), "row", "<= 2.0x ideal"),
    Line(
        "start-up, one call, spares ready [worker] vs a bare context",
        (Pick("startup", r"start-up: a run with one tool call \[worker\]"),),
        "row",
        "< 2.0 ms wall, <= 4 ms CPU",
    ),
    Line(
        "host instructions per sequential call [worker] vs the floor",
        (Pick("instructions", r"instructions: a sequential call \[worker\]"),),
        "count",
        "report: the load-independent figure (the worker's own are in bench_workerstep.py)",
    ),
    Line(
        "one-call run, 5,000 tools vs 10 [worker]",
        # (the wall row's own CPU: the host's and the workers'; the table's "CPU per run" row counts
        # this process and the children it reaped, and the fork server's workers are not among them)
        (Pick("tool_count", r"one-call run, 5,000 tools vs 10, wall per run \[worker\]"),),
        "row",
        "<= 1.2x",
    ),
    Line(
        "CPU per run at 1, 16, 64, 256 runs at once [worker]",
        tuple(Pick("concurrency", rf"{k} runs at once: CPU per run \[worker\]") for k in (1, 16, 64, 256))
        + (Pick("concurrency", r"256 runs at once: wall per run \[worker\]"),),
        "levels",
        "flat: 256 <= 1.25x of 1",
    ),
    Line(
        "a python -c host's exit after its last run_code vs a bare interpreter",
        (
            Pick("exit", r"host exit after its last run_code: wall"),
            Pick("exit", r"host exit after its last run_code: the host's CPU"),
        ),
        "row",
        "report (18-19 ms before 0.3.0)",
    ),
    Line(
        "vs Vercel's code mode: sequential calls [worker]",
        (Pick("vercel", r"vs Vercel code mode: [\d,]+ sequential calls \[worker\]"),),
        "row",
        "ahead (< 1.0)",
        _VERCEL,
    ),
    Line(
        "vs Vercel's code mode: fan-out 50 x 5 ms [worker]",
        (Pick("vercel", r"vs Vercel code mode: fan-out 50 x 5 ms \[worker\]"),),
        "row",
        "ahead (< 1.0)",
        _VERCEL,
    ),
    Line(
        "vs langchain-quickjs: sequential calls [worker]",
        (Pick("peer", r"vs langchain-quickjs: [\d,]+ sequential calls \[worker\]"),),
        "row",
        "ahead (< 1.0)",
        _LANGCHAIN,
    ),
    Line(
        "vs langchain-quickjs: fan-out 50 x 5 ms [worker]",
        (Pick("peer", r"vs langchain-quickjs: fan-out 50 x 5 ms \[worker\]"),),
        "row",
        "ahead (< 1.0)",
        _LANGCHAIN,
    ),
    Line(
        "vs pydantic-monty sync pool: sequential calls [worker]",
        (Pick("monty", r"vs monty sync pool: [\d,]+ sequential calls \[worker\]"),),
        "row",
        "ahead (< 1.0)",
        _MONTY_SYNC,
    ),
    Line(
        "vs pydantic-monty async pool: sequential calls [worker]",
        (Pick("monty", r"vs monty async pool: [\d,]+ sequential calls \[worker\]"),),
        "row",
        "ahead (< 1.0)",
        _MONTY_ASYNC,
    ),
    Line(
        "vs pydantic-monty async pool: fan-out 50 x 5 ms [worker]",
        (Pick("monty", r"vs monty async pool: fan-out 50 x 5 ms \[worker\]"),),
        "row",
        "ahead (< 1.0)",
        _MONTY_ASYNC,
    ),
)
PEERS = ("peer", "vercel", "monty")
#: The benchmarks the summary reads, in the order they run.
SUMMARY_BENCHES = tuple(dict.fromkeys(p.bench for line in SUMMARY for p in line.picks))


def _find(found: dict[str, list[c.Row]], pick: Pick) -> Optional[c.Row]:
    rows = found.get(pick.bench, [])
    start = 0
    if pick.after:
        heads = [i for i, r in enumerate(rows) if re.fullmatch(pick.after, r.name.strip())]
        if not heads:
            return None
        start = heads[0] + 1
    for r in rows[start:]:
        if re.fullmatch(pick.name, r.name.strip()):
            return r
    return None


def _v(s: Optional[c.Stats]) -> str:
    return "-" if s is None else c.fmt_stats(s, "").split(" (")[0].strip()


def _x(a: Optional[float], b: Optional[float]) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def _med(s: Optional[c.Stats]) -> Optional[float]:
    return None if s is None else s.median


def _cells(line: Line, found: dict[str, list[c.Row]]) -> tuple[list[str], list[c.Stats]]:
    """(wall, CPU, ratio cells; the loads the rows ran under) of one summary line."""
    rows = [_find(found, p) for p in line.picks]
    first = rows[0]
    if first is None or first.ours is None:
        why = first.note if first is not None and first.note else "not run (a peer: pass --peers)"
        if line.picks[0].bench not in PEERS and (first is None or not first.note):
            why = "not measured in this run"
        return [why, "-", "-"], []
    loads = [r.load for r in rows if r is not None and r.load is not None]
    unit = first.unit.replace(" CPU", "")
    if line.how == "pair":
        other = rows[1]
        if other is None or other.ours is None:
            return ["-", "-", "-"], loads
        wall = f"{_v(first.ours)} / {_v(other.ours)} {unit}"
        cpu = f"{_v(first.cpu)} / {_v(other.cpu)} {unit}"
        ratio = f"{_x(_med(first.ours), _med(other.ours))}; {_x(_med(first.cpu), _med(other.cpu))}"
        return [wall, cpu, ratio], loads
    if line.how == "count":
        cpu = f"{_v(first.ours)} / {_v(first.base)} {unit}"
        return ["-", cpu, f"-; {_x(_med(first.ours), _med(first.base))}"], loads
    if line.how == "levels":
        levels = [r for r in rows[:-1] if r is not None and r.ours is not None]
        cpu = ", ".join(f"{r.name.strip().split()[0]}: {_v(r.ours)}" for r in levels) + f" {unit}"
        wall_row = rows[-1]
        wall = "-" if wall_row is None else f"{_v(wall_row.ours)} / {_v(wall_row.base)} {wall_row.unit} per run"
        ratio = f"-; {_x(_med(levels[-1].ours), _med(levels[0].ours))}" if levels else "-"
        return [wall, cpu, ratio], loads
    wall = f"{_v(first.ours)} / {_v(first.base) if first.base is not None else '-'} {unit}"
    if len(rows) > 1 and rows[1] is not None and rows[1].ours is not None and "CPU" in rows[1].unit + rows[1].name:
        src = rows[1]  # a row of CPU figures beside the row of wall figures
        cpu_ours, cpu_base = src.ours, src.base
        cpu_unit = src.unit.replace(" CPU", "")
    elif len(rows) > 1 and rows[1] is not None:
        src = rows[1]  # a companion whose ours is the same run, beside a real baseline
        cpu_ours, cpu_base, cpu_unit = src.cpu, src.base_cpu, src.unit
    else:
        cpu_ours, cpu_base, cpu_unit = first.cpu, first.base_cpu, unit
    cpu = f"{_v(cpu_ours)} / {_v(cpu_base)} {cpu_unit}"
    # The wall ratio is the median of the paired ratios (each pair back to back), where the row has them.
    paired = f"{first.ratio.median:.2f}x" if first.ratio is not None else _x(_med(first.ours), _med(first.base))
    ratio = f"{paired}; {_x(_med(cpu_ours), _med(cpu_base))}"
    return [wall, cpu, ratio], loads


def git_commit() -> str:
    """``git rev-parse --short HEAD`` of the checkout the benchmarks are in, `` (dirty)`` if tracked files changed."""
    root = os.path.dirname(HERE)
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (dirty)" if dirty else "")


def format_summary(found: dict[str, list[c.Row]], *, reps: str, when: str, commit: str, machine: str) -> str:
    """The README's summary block: one row of a simple table per :data:`SUMMARY`
    line, with the date, the commit and the load the rows ran under."""
    body: list[list[str]] = []
    loads: list[float] = []
    for line in SUMMARY:
        cells, row_loads = _cells(line, found)
        lo = [x for s in row_loads for x in (s.lo, s.hi)]
        loads += lo
        load = "-" if not lo else f"{min(lo):.1f}" if max(lo) - min(lo) < 0.05 else f"{min(lo):.1f}-{max(lo):.1f}"
        goal = line.goal + (f"; the peer skips: {line.skips}" if line.skips else "")
        body.append([line.name, *cells, load, goal])
    table = [list(SUMMARY_HEAD), *body]
    widths = [max(len(row[i]) for row in table) for i in range(len(SUMMARY_HEAD))]
    border = "  ".join("=" * w for w in widths)

    def fmt(row: list[str]) -> str:
        return "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()

    span = "-" if not loads else f"{min(loads):.1f}-{max(loads):.1f}"
    return "\n".join(
        [
            SUMMARY_BEGIN,
            "",
            f"Measured {when} at commit ``{commit}`` with ``{SUMMARY_COMMAND}``",
            f"({machine}; load {span}): medians of {reps} repetitions, each pair back to",
            "back in alternating order; CPU is the host's and every worker's.",
            "",
            border,
            fmt(table[0]),
            border,
            *(fmt(row) for row in body),
            border,
            "",
            SUMMARY_END,
            "",
        ]
    )


def summary_shape(text: str) -> tuple[list[str], str, str]:
    """(row names, date, commit) of the summary block in ``text`` (a README):
    what tests/test_docs.py compares with what :func:`format_summary` prints.
    ValueError when ``text`` has no such block, or one without a date, a
    commit or a table."""
    lines = text.split("\n")
    try:
        start = lines.index(SUMMARY_BEGIN)
        end = lines.index(SUMMARY_END, start)
    except ValueError:
        raise ValueError(f"no summary block ({SUMMARY_BEGIN!r} ... {SUMMARY_END!r})") from None
    block = lines[start:end]
    borders = [i for i, x in enumerate(block) if re.fullmatch(r"=+(  +=+)+", x)]
    if len(borders) != 3:
        raise ValueError("the summary block has no table (three border lines)")
    first = len(block[borders[0]].split()[0])
    names = [x[:first].strip() for x in block[borders[1] + 1 : borders[2]]]
    head = "\n".join(block[: borders[0]])
    date = re.search(r"Measured (\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC)", head)
    commit = re.search(r"at commit ``([0-9a-f]{7,40}(?: \(dirty\))?)``", head)
    if not date or not commit:
        raise ValueError("the summary block names no date or no commit")
    return names, date.group(1), commit.group(1)


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
    p.add_argument(
        "--summary",
        action="store_true",
        help="run only what the README's summary reads; print the block on stdout, the tables on stderr",
    )
    a = p.parse_args()
    wanted = {w.strip() for w in a.only.split(",") if w.strip()}
    out = sys.stdout
    if a.summary:
        if wanted:
            p.error("--summary runs its own set of benchmarks: leave out --only")
        wanted = set(SUMMARY_BENCHES)
        sys.stdout = sys.stderr  # the tables and progress; the block alone goes to ``out``
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

    # Measured as an installed copy runs (pip compiles its bytecode): where
    # PYTHONDONTWRITEBYTECODE is set and the copy was never compiled, every
    # benchmark process and fork server would compile its modules again.
    compileall.compile_dir(os.path.dirname(nous_sched.__file__), quiet=1)
    commit = git_commit()  # the code this run measures: read before any benchmark starts
    print(f"nous_sched {nous_sched.__version__} from {os.path.dirname(nous_sched.__file__)}, commit {commit}")
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
    found: dict[str, list[c.Row]] = {}
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
        found[key] = rows
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
    if a.summary or not wanted:
        block = format_summary(
            found,
            reps=f"{a.reps}"
            if a.reps
            else "each benchmark's default" + (" (--quick: not for quoting)" if a.quick else ""),
            when=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            commit=commit,
            machine=c.machine_line().split(", load")[0],
        )
        print()
        print(block, end="", file=out if a.summary else sys.stdout, flush=True)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())

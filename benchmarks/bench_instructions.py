"""12. Instructions per call and per run (callgrind): the load-independent figures.

Wall time on a shared machine moves with the load, CPU time less but still
(caches, frequency); the number of instructions a path executes does not.
This benchmark runs the hot paths in one interpreter under ``valgrind
--tool=callgrind`` (deterministic hashing, ``PYTHONHASHSEED=0``) and asks
callgrind for a dump between phases (``callgrind_control --dump``), so
each phase's count is its own; the difference of two phases of different
sizes cancels what a run costs once (``run_code``'s start, the dump's own
request), leaving:

- **per call**: one ``await tools.noop({ i })`` in a sequential loop, run
  by ``run_code`` against the floor (``_floor.py``: the least a bridge with
  the same semantics can do), (220 calls - 20 calls) / 200;
- **per run**: a whole ``run_code`` of a program making one tool call, (25
  runs - 5 runs) / 20, against the floor's.

Only the benchmark's own process is counted: the worker runtime's fork
server and workers are separate programs (``--trace-children=no``), whose
CPU the ``CPU per call`` columns and ``bench_startup_steps.py`` show.
Each runtime is its own valgrind run (about a minute each here); a row is
the same count every time the code is the same, so one repetition is
enough. Skipped where ``valgrind`` is not installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SEQUENTIAL = "let s = 0;\nfor (let i = 0; i < {n}; i++) {{ await tools.noop({{ i }}); s += 1; }}\nreturn s;"
ONE_CALL = "return await tools.noop({ i: 1 });"
PHASES = [("seq", 20), ("seq", 220), ("run", 5), ("run", 25)]


def phases(runtime_name: str) -> None:  # runs under valgrind
    sys.path.insert(0, HERE)
    import concurrent.futures

    import _common as c
    import _floor

    from nous_sched import Tool, run_code

    rt = c.make_runtime(runtime_name).runtime
    tool = Tool("noop", lambda args: args["i"], concurrency_safe=lambda args: True)
    floor_pool = concurrent.futures.ThreadPoolExecutor(10)
    floor_tools = {"noop": lambda args: args["i"]}

    def ours(program: str) -> None:
        r = run_code(program, [tool], runtime=rt, description="test", timeout=600)
        assert r.ok, r.error

    def floor(program: str) -> None:
        _floor.run(program, floor_tools, floor_pool)

    def dump(label: str) -> None:
        subprocess.run(["callgrind_control", "--dump=" + label, str(os.getpid())], capture_output=True, check=True)

    for side, go in (("ours", ours), ("floor", floor)):
        go(SEQUENTIAL.format(n=5))
        go(ONE_CALL)
        dump(f"{side}-warm")
        for kind, n in PHASES:
            if kind == "seq":
                go(SEQUENTIAL.format(n=n))
            else:
                for _ in range(n):
                    go(ONE_CALL)
            dump(f"{side}-{kind}-{n}")
    floor_pool.shutdown()


def counts(out_prefix: str) -> dict[str, int]:
    found: dict[str, int] = {}
    folder, base = os.path.split(out_prefix)
    for name in os.listdir(folder):
        if not name.startswith(base):
            continue
        label, total = None, None
        with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith(("desc: Trigger: Client Request: ", "desc: Trigger: dump ")):
                    label = line.split()[-1]
                elif line.startswith(("totals:", "summary:")):
                    total = int(line.split()[1])
        if label is not None and total is not None:
            found[label] = total
    return found


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--phases":
        phases(sys.argv[2])
        return 0
    import _common as c

    opts = c.options(__doc__.splitlines()[0], default_reps=1, quick_reps=1)
    title = "12. instructions (callgrind, this process only)"
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        return c.run(title, [("callgrind", lambda: [c.skip_row("instructions", "valgrind is not installed")])], opts)

    def section(rc: c.RuntimeChoice) -> list[c.Row]:
        with tempfile.TemporaryDirectory() as d:
            prefix = os.path.join(d, "callgrind.out")
            env = {**os.environ, "PYTHONHASHSEED": "0"}
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={prefix}", "--trace-children=no"]
            cmd += [sys.executable, os.path.abspath(__file__), "--phases", rc.name]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
            if proc.returncode != 0:
                raise RuntimeError(f"valgrind exit {proc.returncode}: " + proc.stderr.strip()[-500:])
            got = counts(prefix)
        k = 1e3

        def per(side: str, kind: str) -> float:
            (_, small), (_, large) = [p for p in PHASES if p[0] == kind]
            return (got[f"{side}-{kind}-{large}"] - got[f"{side}-{kind}-{small}"]) / (large - small)

        rows = []
        for kind, what, unit in (
            ("seq", "a sequential call", "k instr/call"),
            ("run", "a one-call run", "k instr/run"),
        ):
            ours, floor = per("ours", kind), per("floor", kind)
            rows.append(
                c.Row(
                    f"instructions: {what} [{rc.name}]",
                    c.Stats.fixed(ours / k),
                    c.Stats.fixed(floor / k),
                    unit=unit,
                    base_name="floor",
                    note="this process only (callgrind); a worker's own instructions are in its process",
                )
            )
        return rows

    return c.run(title, c.per_runtime(opts, "instructions", section), opts)


if __name__ == "__main__":
    sys.exit(main())

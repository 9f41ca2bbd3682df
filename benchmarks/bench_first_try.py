"""The first try's cost (issue 36): stripping TypeScript, and what a plain program's start-up pays for it.

Three tables, all measured in this one run:

1. **Stripping.** ``_program.prepare`` (the cheap checks, and the parse when
   they send a program to it) and the strip itself (tree-sitter's parse, the
   spans blanked, the last expression rewritten) on a one-line and a
   1,000-line program, TypeScript and plain JavaScript. Microseconds per
   program, median of batches, CPU beside wall.
2. **Start-up, before and after.** ``run_code("return 1")`` and a
   1,000-line plain JavaScript program, end to end, on both runtimes:
   *before* runs the program as written (``_program.prepare`` replaced by one
   that returns it untouched, as the host did before issue 36), *after* as
   shipped. The arms alternate within each repetition, each going first in
   half of them; each sample is the median of a batch. Target: *after* at
   most 0.2 ms over *before* for a plain JavaScript program.
3. **A TypeScript program's first try**: the same one-line program as
   JavaScript and as TypeScript (which QuickJS refuses, then runs stripped).

4. With ``--base DIR`` (a checkout of the commit before issue 36): ``return 1``
   end to end in fresh processes, the base tree against this one, the
   prelude's and the hints' costs included.

Run by hand: ``PYTHONPATH=. python benchmarks/bench_first_try.py [--reps N] [--base DIR]``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

from nous_sched import QuickJSRuntime, run_code
from nous_sched.runtime import _program
from nous_sched.runtime._typescript import strip

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_wall import _tree_cpu  # noqa: E402

rc = importlib.import_module("nous_sched._run.runner")  # the machinery of run_code (its program preparation)

TARGET_MS = 0.2
ONE_LINE_JS = "return 1"
ONE_LINE_TS = "const n: number = 1; return n"
JS_LINE = "const x{i} = [{i}, {i} + 1].map(v => v * 2).filter(Boolean); if (x{i}.length > 3) throw new Error('x');"
TS_LINE = (
    "const x{i}: number[] = ([{i}, {i} + 1] as number[]).map((v: number): number => v * 2)"
    ".filter(Boolean); if (x{i}.length > 3) throw new Error('x');"
)
THOUSAND_JS = "\n".join(JS_LINE.format(i=i) for i in range(999)) + "\nreturn x0"
THOUSAND_TS = "\n".join(TS_LINE.format(i=i) for i in range(999)) + "\nreturn x0"
THOUSAND_JS_NO_RETURN = "\n".join(JS_LINE.format(i=i) for i in range(999)) + "\nx0"


def per_call(fn: Callable[[], Any], batch: int) -> tuple[float, float]:
    """Wall and CPU microseconds per call of ``fn``, over a batch."""
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(batch):
        fn()
    return (time.perf_counter() - w0) / batch * 1e6, (time.process_time() - c0) / batch * 1e6


def med(samples: list[float]) -> str:
    return f"{statistics.median(samples):9.1f} ({min(samples):.1f}-{max(samples):.1f})"


def stripping(reps: int) -> None:
    print("\n1. Stripping: microseconds per program, median (min-max) of batches; CPU beside wall")
    print(f"{'program':<46} {'wall us':>26} {'cpu us':>26}")
    rows = [
        ("prepare: one-line JS (no parse)", lambda: _program.prepare(ONE_LINE_JS), 2000),
        ("prepare: 1,000-line JS ending in return", lambda: _program.prepare(THOUSAND_JS), 200),
        ("prepare: one-line TS (parsed)", lambda: _program.prepare(ONE_LINE_TS), 500),
        ("strip: one-line TS", lambda: strip(ONE_LINE_TS), 500),
        ("strip+rewrite (_parsed): one-line TS", lambda: _program._parsed(ONE_LINE_TS, ONE_LINE_TS), 500),
        ("strip: 1,000-line TS", lambda: strip(THOUSAND_TS), 3),
        ("strip+rewrite (_parsed): 1,000-line TS", lambda: _program._parsed(THOUSAND_TS, THOUSAND_TS), 3),
        ("prepare: 1,000-line JS, last line no return", lambda: _program.prepare(THOUSAND_JS_NO_RETURN), 3),
    ]
    strip(ONE_LINE_TS)  # tree-sitter loaded once, as the first TypeScript program of a process loads it
    for name, fn, batch in rows:
        walls, cpus = [], []
        for _ in range(reps):
            wall, cpu = per_call(fn, batch)
            walls.append(wall)
            cpus.append(cpu)
        print(f"{name:<46} {med(walls):>26} {med(cpus):>26}")


def _untouched(code: str) -> _program.Source:
    return _program.Source(code, code)


def startup(reps: int) -> None:
    print(
        f"\n2. Start-up before/after (ms per run, median (min-max) of per-repetition batch medians); target +{TARGET_MS} ms"
    )
    print(
        f"{'runtime / program':<38} {'before wall':>22} {'after wall':>22} {'after-before':>22} {'cpu b/a':>14}  status"
    )
    real = rc._program.prepare
    runtimes = [("in-process", QuickJSRuntime()), ("worker", None)]
    programs = [("return 1", ONE_LINE_JS, 200), ("1,000-line JS", THOUSAND_JS, 20)]
    for rt_name, runtime in runtimes:
        for p_name, program, batch in programs:
            run_code(program, description="warm", runtime=runtime)
            before, after, diff, cpu_b, cpu_a = [], [], [], [], []
            for rep in range(reps):
                arms = [("before", _untouched), ("after", real)]
                if rep % 2:
                    arms.reverse()
                got: dict[str, tuple[float, float]] = {}
                for arm, prepare in arms:
                    rc._program.prepare = prepare  # type: ignore[assignment]
                    try:
                        walls = []
                        c0 = _tree_cpu(os.getpid())
                        for _ in range(batch):
                            w0 = time.perf_counter()
                            result = run_code(program, description="bench", runtime=runtime)
                            walls.append((time.perf_counter() - w0) * 1e3)
                            assert result.ok, result.error
                        cpu = (_tree_cpu(os.getpid()) - c0) / batch * 1e3
                    finally:
                        rc._program.prepare = real
                    got[arm] = (statistics.median(walls), cpu)
                before.append(got["before"][0])
                after.append(got["after"][0])
                diff.append(got["after"][0] - got["before"][0])
                cpu_b.append(got["before"][1])
                cpu_a.append(got["after"][1])
            # CPU (this process and its workers, from /proc) is the verdict: this
            # machine's wall time moves by more than the target between batches.
            # INFO: only the host's first step differs between the arms, and this
            # machine's load moves a batch by more than the target; table 1 has
            # that step's own cost, table 4 the whole change's.
            status = "INFO"
            cpu = f"{statistics.median(cpu_b):.2f}/{statistics.median(cpu_a):.2f}"
            name = f"{rt_name} / {p_name}"
            print(f"{name:<38} {med(before):>22} {med(after):>22} {med(diff):>22} {cpu:>14}  {status}")


def typescript_first_try(reps: int) -> None:
    print("\n3. A one-line program as JavaScript and as TypeScript (ms per run, in-process)")
    runtime = QuickJSRuntime()
    for name, program in (("JavaScript", "const n = 1; return n"), ("TypeScript", ONE_LINE_TS)):
        walls = []
        for _ in range(reps):
            samples = []
            for _ in range(20):
                w0 = time.perf_counter()
                result = run_code(program, description="bench", runtime=runtime)
                samples.append((time.perf_counter() - w0) * 1e3)
                assert result.result == 1
            walls.append(statistics.median(samples))
        print(f"{name:<12} {med(walls)}")


#: One side of section 4, run with ``python -c`` in a fresh process whose
#: PYTHONPATH picks the tree: ms per run of ``return 1``, wall median and CPU
#: (the process and its workers, from /proc), both runtimes, as JSON.
_CHILD = """
import json, os, statistics, sys, time
sys.path.insert(0, {bench!r})
from bench_wall import _tree_cpu
from nous_sched import QuickJSRuntime, run_code
out = {{}}
for name, runtime in (("in-process", QuickJSRuntime()), ("worker", None)):
    for _ in range(50):
        run_code("return 1", description="warm", runtime=runtime)
    walls = []
    c0 = _tree_cpu(os.getpid())
    for _ in range({runs}):
        w0 = time.perf_counter()
        run_code("return 1", description="bench", runtime=runtime)
        walls.append((time.perf_counter() - w0) * 1e3)
    out[name] = (statistics.median(walls), (_tree_cpu(os.getpid()) - c0) / {runs} * 1e3)
print(json.dumps(out))
"""


def base_against_tree(base: str, reps: int) -> None:
    print(f"\n4. `return 1` end to end, the base tree ({base}) against this one, each in a fresh process,")
    print("   alternating which goes first (ms per run: wall median, CPU of the process and its workers)")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sides: dict[str, list[dict[str, list[float]]]] = {"base": [], "this": []}
    for rep in range(reps):
        order = [("base", base), ("this", here)]
        if rep % 2:
            order.reverse()
        for side, root in order:
            env = {**os.environ, "PYTHONPATH": root}
            child = _CHILD.format(bench=os.path.dirname(os.path.abspath(__file__)), runs=400)
            done = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, check=True)
            text = done.stdout
            sides[side].append(json.loads(text.strip().splitlines()[-1]))
    for runtime in ("in-process", "worker"):
        b_wall = [s[runtime][0] for s in sides["base"]]
        t_wall = [s[runtime][0] for s in sides["this"]]
        b_cpu = [s[runtime][1] for s in sides["base"]]
        t_cpu = [s[runtime][1] for s in sides["this"]]
        grew = statistics.median(t_cpu) - statistics.median(b_cpu)
        status = "PASS" if grew <= TARGET_MS else "MISS"
        print(
            f"{runtime:<12} wall base {med(b_wall)} this {med(t_wall)} | "
            f"cpu base {statistics.median(b_cpu):.3f} this {statistics.median(t_cpu):.3f} (+{grew:.3f})  {status}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--base", default="", help="a checkout of the commit before issue 36, for section 4")
    args = parser.parse_args()
    stripping(args.reps)
    startup(args.reps)
    typescript_first_try(args.reps)
    if args.base:
        base_against_tree(args.base, max(args.reps // 2, 2))


if __name__ == "__main__":
    main()

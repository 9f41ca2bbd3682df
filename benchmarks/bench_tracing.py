"""What the automatic OpenTelemetry spans cost per call: off (before and after), and on.

Every entry point asks ``nous_sched._tracing.active()`` whether a tracer
provider is configured. This measures, per call, in fresh processes:

* ``call_tool`` of a trivial tool (a direct call: the gate, the audit-free
  path, one span when on);
* one nested call of a ``run_code`` program that makes 200 calls of a
  trivial tool one after another (in-process QuickJS runtime, so the
  worker's pipe does not drown the difference), per call.

Conditions, each in its own process:

* ``base``: a checkout of the commit before the change (``--base``, by
  default ``git merge-base HEAD main``), exported with ``git archive``;
* ``head``: this tree;
* ``off``: OpenTelemetry never imported; ``proxy``: ``opentelemetry.trace``
  imported but no provider set (a library imported it; nothing configured);
  ``memory`` (head only): an SDK tracer provider with a simple processor into
  an in-memory exporter, so every call makes its span.

The processes run in rounds, the order of conditions reversed every other
round (both orders), and each number is the median over rounds of the
median of ``--reps`` repetitions in the process; CPU time
(``time.process_time``, all threads of the process) is beside wall time.
Run by hand: ``python benchmarks/bench_tracing.py [--rounds 6]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CALLS = 200
DIRECT = 2000
PROGRAM = f"let s = 0; for (let i = 0; i < {CALLS}; i++) s += await tools.noop({{ i }}); return s;"


def _worker(otel: str, reps: int) -> dict[str, Any]:
    if otel in ("proxy", "memory"):
        import opentelemetry.trace  # noqa: F401
    if otel == "memory":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    from nous_sched import QuickJSRuntime, Tool, call_tool, run_code

    noop = Tool("noop", lambda args: 1)
    runtime = QuickJSRuntime()

    def program() -> None:
        result = run_code(PROGRAM, [noop], description="bench", runtime=runtime, timeout=60)
        assert result.ok and result.result == CALLS, result.error

    def direct() -> None:
        for i in range(DIRECT):
            call_tool(noop, {"i": i})

    out: dict[str, Any] = {}
    try:
        from nous_sched import _tracing
    except ImportError:  # the base commit has no seam
        pass
    else:  # the whole cost of "off": the check each run and each direct call makes
        n = 200_000
        t0 = time.perf_counter()
        for _ in range(n):
            _tracing.active()
        out["check_ns"] = (time.perf_counter() - t0) / n * 1e9
    for name, fn, calls in (("run_code", program, CALLS), ("call_tool", direct, DIRECT)):
        fn()  # warm
        walls, cpus = [], []
        for _ in range(reps):
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            walls.append((time.perf_counter() - w0) / calls * 1e6)
            cpus.append((time.process_time() - c0) / calls * 1e6)
            if otel == "memory":
                exporter.clear()
        out[name] = {"wall_us": statistics.median(walls), "cpu_us": statistics.median(cpus)}
    return out


def _base_tree(rev: str, into: str) -> str:
    data = subprocess.run(["git", "archive", rev, "nous_sched"], cwd=ROOT, check=True, capture_output=True).stdout
    path = os.path.join(into, "archive.tar")
    Path(path).write_bytes(data)
    with tarfile.open(path) as tar:
        tar.extractall(into, filter="data")
    return into


def _run(tree: str, otel: str, reps: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run(
        [sys.executable, __file__, "--worker", otel, "--reps", str(reps)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=tree,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", choices=["off", "proxy", "memory"])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--base", default=None, help="the commit before the change (default: git merge-base HEAD main)")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker, args.reps)))
        return 0
    base = (
        args.base
        or subprocess.run(
            ["git", "merge-base", "HEAD", "main"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout.strip()
    )
    conditions = [("base", "off"), ("head", "off"), ("base", "proxy"), ("head", "proxy"), ("head", "memory")]
    samples: dict[tuple[str, str], list[dict[str, Any]]] = {c: [] for c in conditions}
    with tempfile.TemporaryDirectory(prefix="nous-sched-bench-base-") as tmp:
        trees = {"base": _base_tree(base, tmp), "head": str(ROOT)}
        for r in range(args.rounds):
            for tree, otel in conditions if r % 2 == 0 else reversed(conditions):
                samples[(tree, otel)].append(_run(trees[tree], otel, args.reps))
    print(f"base {base[:10]} vs head {_head()}; {args.rounds} rounds x {args.reps} reps; {os.cpu_count()} CPUs")
    print(
        f"{'entry point':<10} {'condition':<14} {'wall us/call':>13} {'cpu us/call':>12} "
        f"{'wall vs base off':>17} {'cpu vs base off':>16}"
    )
    for tree, otel in conditions:
        checks = [s["check_ns"] for s in samples[(tree, otel)] if "check_ns" in s]
        if checks and otel != "memory":
            print(
                f"the off check (_tracing.active()), {tree} {otel}: {statistics.median(checks):.0f} ns per run or call"
            )
    for entry in ("run_code", "call_tool"):
        ref_wall = statistics.median(s[entry]["wall_us"] for s in samples[("base", "off")])
        ref_cpu = statistics.median(s[entry]["cpu_us"] for s in samples[("base", "off")])
        for tree, otel in conditions:
            wall = statistics.median(s[entry]["wall_us"] for s in samples[(tree, otel)])
            cpu = statistics.median(s[entry]["cpu_us"] for s in samples[(tree, otel)])
            print(
                f"{entry:<10} {tree + ' ' + otel:<14} {wall:>13.2f} {cpu:>12.2f} "
                f"{wall / ref_wall:>16.3f}x {cpu / ref_cpu:>15.3f}x"
            )
    return 0


def _head() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short=10", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())

"""Tool count: a one-call run with 5,000 tools against one with 10, run_code_tool built twice, a warm sdk.search.

Rows (issue 44, tool count; targets: <= 1.2x, a second build ~0, search under 2 ms):

* one-call run, 5,000 tools over 10 tools, per runtime (worker, in-process):
  both sets alternate in every repetition, in both orders; each sample a batch
  of runs; wall time per run beside CPU per run (this process's and its
  children's, rusage: a worker's CPU counts once it is reaped);
* ``run_code_tool`` over 5,000 tools (with schemas), built a first and a
  second time (CPU ms);
* ``sdk.search`` over the same tools: the first question (the index built),
  then the same question again, then new questions of known words (CPU ms).

``--compare PATH`` runs this script again under ``PYTHONPATH=PATH`` (another
checkout, e.g. main) in the same session, alternating, and prints both;
``--tree`` adds the whole process tree's CPU per run (host, fork server and
every worker, all reaped when a child interpreter running 40 and then 160 runs
exits: the difference over 120), the figure the worker rows' rusage misses.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from typing import Any


def _cpu() -> float:
    a = resource.getrusage(resource.RUSAGE_SELF)
    b = resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def measure(reps: int, batch: int) -> dict[str, Any]:
    import nous_sched
    from nous_sched import QuickJSRuntime, Tool, WorkerPool, run_code, run_code_tool
    from nous_sched.sdk.discovery import shared_index

    def noop(args: Any) -> int:
        return 1

    words = "weather forecast city user account invoice order payment email calendar event file folder".split()
    rnd = random.Random(7)

    def tools(n: int) -> list[Any]:
        return [
            Tool(
                f"{rnd.choice(words)}_{rnd.choice(words)}_{i}",
                noop,
                description=" ".join(rnd.choice(words) for _ in range(8)),
                parameters={
                    "type": "object",
                    "properties": {"city": {"type": "string", "description": "the city"}, "days": {"type": "integer"}},
                    "required": ["city"],
                },
                concurrency_safe=lambda a: True,
            )
            for i in range(n)
        ]

    small, large = tools(10), tools(5000)
    out: dict[str, Any] = {"module": os.path.dirname(nous_sched.__file__), "load": os.getloadavg()[0]}
    for label, rt in (("worker", WorkerPool()), ("in-process", QuickJSRuntime())):

        def one(ts: list[Any]) -> tuple[float, float]:
            code = f"return await tools.{ts[1].name}({{city: 'x'}});"
            c0, t0 = _cpu(), time.perf_counter()
            for _ in range(batch):
                r = run_code(code, ts, runtime=rt, description="bench")
                assert r.ok, r.error
            return (time.perf_counter() - t0) / batch * 1e3, (_cpu() - c0) / batch * 1e3

        one(small), one(large)  # warm: kept values made, pool started
        rows: dict[str, list[tuple[float, float]]] = {"10": [], "5000": []}
        for rep in range(reps):
            order = (("10", small), ("5000", large)) if rep % 2 == 0 else (("5000", large), ("10", small))
            for name, ts in order:
                rows[name].append(one(ts))
        wall = [b[0] / a[0] for a, b in zip(rows["10"], rows["5000"])]
        cpu = [b[1] / a[1] for a, b in zip(rows["10"], rows["5000"])]
        out[label] = {
            "wall_ms_10": statistics.median(r[0] for r in rows["10"]),
            "wall_ms_5000": statistics.median(r[0] for r in rows["5000"]),
            "cpu_ms_10": statistics.median(r[1] for r in rows["10"]),
            "cpu_ms_5000": statistics.median(r[1] for r in rows["5000"]),
            "wall_ratio": statistics.median(wall),
            "cpu_ratio": statistics.median(cpu),
        }
        if isinstance(rt, WorkerPool):
            rt.close()
    rt = QuickJSRuntime()
    builds = []
    for _ in range(2):
        c0 = time.process_time()
        run_code_tool(large, runtime=rt)
        builds.append((time.process_time() - c0) * 1e3)
    out["build_ms"] = builds
    index = shared_index(list(large))
    c0 = time.process_time()
    index.search("weather forecast for a city", 10)
    first = (time.process_time() - c0) * 1e3
    c0 = time.process_time()
    index.search("weather forecast for a city", 10)
    again = (time.process_time() - c0) * 1e3
    queries = ["city user account", "invoice payment", "calendar event email", "order file folder"]
    c0 = time.process_time()
    for q in queries:
        index.search(q, 10)
    new = (time.process_time() - c0) * 1e3 / len(queries)
    out["search_ms"] = {"first": first, "same_again": again, "new_words": new}
    return out


def runs_only(n: int, runs: int, which: str) -> None:
    """``runs`` one-call runs over ``n`` tools (a tuple, as an agent's tool set) in this process, then exit."""
    from nous_sched import QuickJSRuntime, Tool, WorkerPool, run_code

    def noop(args: Any) -> int:
        return 1

    ts = tuple(Tool(f"weather_forecast_city_{i}", noop, concurrency_safe=lambda a: True) for i in range(n))
    rt = WorkerPool() if which == "worker" else QuickJSRuntime()
    for _ in range(runs):
        r = run_code("return await tools.weather_forecast_city_1({});", ts, runtime=rt, description="bench")
        assert r.ok, r.error


def tree_cpu(path: str, which: str, n: int) -> float:
    """CPU ms per run of the whole process tree (host, fork server, every worker: all
    reaped by the time the child exits), from the difference of 160 and 40 runs."""

    def once(runs: int) -> float:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        cmd = [sys.executable, __file__, "--runs-only", str(n), str(runs), which]
        subprocess.run(cmd, env={**os.environ, "PYTHONPATH": path}, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)

    return (once(160) - once(40)) / 120 * 1e3


def show(name: str, r: dict[str, Any]) -> None:
    print(f"== {name}: {r['module']} (load {r['load']:.2f})")
    for label in ("worker", "in-process"):
        x = r[label]
        print(
            f"  one-call run, 5,000 vs 10 tools [{label}]: wall {x['wall_ms_5000']:.2f} / {x['wall_ms_10']:.2f} ms "
            f"= {x['wall_ratio']:.2f}x; CPU {x['cpu_ms_5000']:.2f} / {x['cpu_ms_10']:.2f} ms = {x['cpu_ratio']:.2f}x"
            f"  (target <= 1.2x)"
        )
    print(
        f"  run_code_tool over 5,000 tools: first build {r['build_ms'][0]:.1f} ms CPU, second {r['build_ms'][1]:.1f} ms"
    )
    s = r["search_ms"]
    print(
        f"  sdk.search over 5,000 tools: first {s['first']:.1f} ms (index built), the same again {s['same_again']:.2f} ms, "
        f"new questions of known words {s['new_words']:.2f} ms CPU  (target < 2 ms)"
    )


def table() -> int:
    """The rows ``run_all.py`` shows (``_common``'s table: both orders, the hand-off regime, PASS/MISS)."""
    import _common as c

    from nous_sched import Tool, run_code, run_code_tool
    from nous_sched.sdk.discovery import shared_index

    opts = c.options(__doc__.splitlines()[0], default_reps=5, quick_reps=2)
    batch = 5 if opts.quick else 20

    def noop(args: Any) -> int:
        return 1

    def tools(n: int) -> tuple[Any, ...]:
        return tuple(
            Tool(
                f"weather_forecast_city_{i}",
                noop,
                description=f"Forecast {i} for a city.",
                parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                concurrency_safe=lambda a: True,
            )
            for i in range(n)
        )

    small, large = tools(10), tools(5000)

    def section(rc: c.RuntimeChoice) -> list[c.Row]:
        rt = rc.runtime
        cpu: dict[int, list[float]] = {10: [], 5000: []}

        def runs(ts: tuple[Any, ...]) -> float:
            c0, t0 = _cpu(), time.perf_counter()
            for _ in range(batch):
                r = run_code(
                    "return await tools.weather_forecast_city_1({city: 'x'});", ts, runtime=rt, description="b"
                )
                assert r.ok, r.error
            cpu[len(ts)].append((_cpu() - c0) / batch)
            return (time.perf_counter() - t0) / batch

        runs(small), runs(large)
        cpu[10].clear(), cpu[5000].clear()
        s = c.interleave(opts.reps, lambda: runs(large), lambda: runs(small))
        return [
            c.ours_vs(
                f"one-call run, 5,000 tools vs 10, wall per run [{rc.name}]",
                s[0],
                s[1],
                s,
                scale=1e3,
                unit="ms",
                base_name="10 tools",
                target=c.ratio_at_most(1.2),
                note=f"{batch} runs per sample",
            ),
            c.ours_vs(
                f"one-call run, 5,000 tools vs 10, CPU per run [{rc.name}]",
                cpu[5000],
                cpu[10],
                s,
                scale=1e3,
                unit="ms",
                base_name="10 tools",
                note="this process + reaped children (a worker's CPU: --tree in --compare)",
            ),
        ]

    def section_build() -> list[c.Row]:
        first: list[float] = []
        second: list[float] = []
        for _ in range(opts.reps):
            ts = tools(5000)  # new tool objects: a first build each time
            for into in (first, second):
                c0 = time.process_time()
                run_code_tool(ts)
                into.append(time.process_time() - c0)
        return [
            c.Row(
                "run_code_tool over 5,000 tools, built a second time (CPU)",
                c.Stats.of([x * 1e3 for x in second]),
                c.Stats.of([x * 1e3 for x in first]),
                unit="ms",
                base_name="first build",
                target=c.value_at_most(5.0, "ms"),
            )
        ]

    def section_search() -> list[c.Row]:
        index = shared_index(list(large))
        index.search("forecast for a city", 10)  # the index built, the question asked once
        again: list[float] = []
        fresh: list[float] = []
        for rep in range(opts.reps):
            c0 = time.process_time()
            index.search("forecast for a city", 10)
            again.append(time.process_time() - c0)
            c0 = time.process_time()
            index.search(f"city weather {rep}", 10)
            fresh.append(time.process_time() - c0)
        return [
            c.Row(
                "sdk.search over 5,000 tools, warm (CPU)",
                c.Stats.of([x * 1e3 for x in again]),
                c.Stats.of([x * 1e3 for x in fresh]),
                unit="ms",
                base_name="a new question",
                target=c.Target("< 2.0 ms", 2.0, on="value", strict=True),
            )
        ]

    sections: list[tuple[str, Any]] = c.per_runtime(opts, "runs", section)
    sections += [("run_code_tool", section_build), ("sdk.search", section_search)]
    return c.run("tool count: 5,000 tools against 10", sections, opts)


def main() -> int:
    if not any(a in sys.argv for a in ("--compare", "--figures", "--runs-only")):
        return table()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--figures", action="store_true", help="print the figures as JSON (for --compare)")
    ap.add_argument("--compare", help="another checkout's path: measured in the same session, alternating")
    ap.add_argument("--runs-only", nargs=3, metavar=("N", "RUNS", "RUNTIME"), help=argparse.SUPPRESS)
    ap.add_argument("--tree", action="store_true", help="also the whole process tree's CPU per run (slow)")
    args = ap.parse_args()
    if args.runs_only:
        runs_only(int(args.runs_only[0]), int(args.runs_only[1]), args.runs_only[2])
        return 0
    if args.figures:
        print(json.dumps(measure(args.reps, args.batch)))
        return 0
    if not args.compare:
        show("this checkout", measure(args.reps, args.batch))
        return 0
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "this": []}
    for turn in range(2):  # both orders
        order = (("base", args.compare), ("this", here)) if turn == 0 else (("this", here), ("base", args.compare))
        for name, path in order:
            env = {**os.environ, "PYTHONPATH": path}
            cmd = [sys.executable, __file__, "--figures", "--reps", str(args.reps), "--batch", str(args.batch)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for name in ("base", "this"):
        for i, r in enumerate(runs[name]):
            show(f"{name} #{i + 1}", r)
    if args.tree:
        print("== whole process tree CPU per one-call run (ms; host + fork server + workers), 5,000 vs 10 tools:")
        for which in ("worker", "in-process"):
            for turn in range(2):
                order = (
                    (("base", args.compare), ("this", here)) if turn == 0 else (("this", here), ("base", args.compare))
                )
                for name, path in order:
                    small, large = tree_cpu(path, which, 10), tree_cpu(path, which, 5000)
                    print(f"  {name} [{which}]: {large:.2f} / {small:.2f} = {large / small:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

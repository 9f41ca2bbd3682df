"""13. The live event stream: the per-call cost of a run watched by one consumer, against none.

A program making N sequential ``await tools.noop({})`` and one awaiting
``Promise.all`` over M calls, each run through ``start_run``: once with one
consumer draining ``run.events()`` on a thread of its own while the run goes,
once with no consumer (the stream is still written: every call, commit and
log is an event), and beside them ``run_code`` (no stream at all). The
repetitions alternate which goes first (``_common.interleave``). Target: one
consumer costs at most 1.25x no consumer per call.

The events are the rich ones (each call's arguments rendered as the approval
question renders them, each commit's duration and value): a third program
passes every call two arguments, so the renderer has work; a third consumer
translates every event to AG-UI (``nous_sched.agui.events``) as a front end's
server would. Beside each wall-time row, the CPU time of this process per
call (``time.process_time``: the driver, the runtime's thread, the tool
threads and the consumer; a worker's own CPU is its process's).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import _common as c

from nous_sched import Limits, Tool, run_code, start_run

TARGET = 1.25

SEQUENTIAL = "for (let i = 0; i < {n}; i++) await tools.noop({{}});\nreturn {n};"
PROMISE_ALL = "const r = await Promise.all(Array.from({{ length: {n} }}, () => tools.noop({{}})));\nreturn r.length;"
WITH_ARGUMENTS = 'for (let i = 0; i < {n}; i++) await tools.noop({{city: "Paris", n: i}});\nreturn {n};'
CPU: dict[str, list[float]] = {}


def noop(args: dict[str, Any]) -> None:
    return None


TOOL = Tool("noop", noop, concurrency_safe=lambda args: True)


def _limits(n: int) -> Limits:
    return Limits(timeout=300, max_calls=n + 1)


def _cpu(label: str, fn: Any) -> Any:
    """``fn`` timed: its wall time returned, this process's CPU time kept under ``label``."""

    def timed(*args: Any) -> float:
        c0 = time.process_time()
        wall = fn(*args)
        CPU.setdefault(label, []).append(time.process_time() - c0)
        return float(wall)

    return timed


def watched(runtime: Any, program: str, n: int, agui: bool = False) -> float:
    """start_run with one consumer reading every event as it comes (as AG-UI events with ``agui``)."""
    code = program.format(n=n)
    seen = [0]
    t0 = time.perf_counter()
    run = start_run(code, [TOOL], runtime=runtime, limits=_limits(n), description="test")

    def consume() -> None:
        if agui:
            from nous_sched import agui as ag

            for _ in ag.events(run):
                seen[0] += 1
            seen[0] //= 2  # a call is START, ARGS, END and CUSTOM; a commit RESULT and CUSTOM
            return
        for _ in run.events():
            seen[0] += 1

    consumer = threading.Thread(target=consume, name="bench-events-consumer")
    consumer.start()
    result = run.result()
    consumer.join()
    dt = time.perf_counter() - t0
    assert result.ok and result.result == n, result.error
    assert seen[0] >= 2 * n + 1, seen  # every call and commit, and the end
    return dt


def unwatched(runtime: Any, program: str, n: int) -> float:
    """start_run with no consumer: the stream is written, nobody reads it."""
    code = program.format(n=n)
    t0 = time.perf_counter()
    result = start_run(code, [TOOL], runtime=runtime, limits=_limits(n), description="test").result()
    dt = time.perf_counter() - t0
    assert result.ok and result.result == n, result.error
    return dt


def plain(runtime: Any, program: str, n: int) -> float:
    """run_code: no stream at all."""
    code = program.format(n=n)
    t0 = time.perf_counter()
    result = run_code(code, [TOOL], runtime=runtime, limits=_limits(n), description="test")
    dt = time.perf_counter() - t0
    assert result.ok and result.result == n, result.error
    return dt


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=7, quick_reps=2)
    n = 500 if opts.quick else 5_000

    def section(rc: c.RuntimeChoice) -> list[c.Row]:
        rt = rc.runtime
        for fn in (watched, unwatched, plain):
            fn(rt, SEQUENTIAL, 100)  # warm-up: imports, a warm pool where the runtime has one
        watched(rt, SEQUENTIAL, 100, True)
        rows: list[c.Row] = []
        us = 1e6 / n
        programs = (
            ("sequential awaits", SEQUENTIAL),
            ("Promise.all", PROMISE_ALL),
            ("awaits with 2 args", WITH_ARGUMENTS),
        )
        for label, program in programs:
            CPU.clear()
            s = c.interleave(
                opts.reps,
                _cpu("watched", lambda p=program: watched(rt, p, n)),
                _cpu("unwatched", lambda p=program: unwatched(rt, p, n)),
                _cpu("plain", lambda p=program: plain(rt, p, n)),
                _cpu("agui", lambda p=program: watched(rt, p, n, True)),
            )
            rows += [
                c.ours_vs(
                    f"events: {n:,} {label}, one consumer vs none [{rc.name}]",
                    s[0],
                    s[1],
                    s,
                    scale=us,
                    unit="us/call",
                    base_name="no consumer",
                    target=c.ratio_at_most(TARGET),
                ),
                c.ours_vs(
                    "  CPU of this process: one consumer vs none",
                    CPU["watched"],
                    CPU["unwatched"],
                    s,
                    scale=us,
                    unit="us CPU/call",
                    base_name="no consumer",
                ),
                c.ours_vs(
                    "  beside: one AG-UI consumer (agui.events) vs none",
                    s[3],
                    s[1],
                    s,
                    scale=us,
                    unit="us/call",
                    base_name="no consumer",
                    note="the consumer builds ag_ui.core events (pydantic) on the run's GIL",
                ),
                c.ours_vs(
                    "  CPU of this process: one AG-UI consumer vs none",
                    CPU["agui"],
                    CPU["unwatched"],
                    s,
                    scale=us,
                    unit="us CPU/call",
                    base_name="no consumer",
                ),
                c.ours_vs(
                    "  beside: no consumer vs run_code (no stream)",
                    s[1],
                    s[2],
                    s,
                    scale=us,
                    unit="us/call",
                    base_name="run_code",
                    note="what writing the stream costs when nobody reads it (and the run's own thread)",
                ),
            ]
        return rows

    return c.run("13. The live event stream (tool = no-op)", c.per_runtime(opts, "events", section), opts)


if __name__ == "__main__":
    sys.exit(main())

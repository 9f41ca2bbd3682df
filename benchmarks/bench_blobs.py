"""Blob handles (issue 40): a 10 MB tool result passed to a second tool, with handles and without.

The program takes a 10 MB result (5,000,000 "é", 10,000,000 bytes of UTF-8)
from one tool, passes it to a second and returns it. With handles (the
default ``Limits.blob_bytes``, 256 KiB) the result stays on the host: the
program gets a handle, the second tool the exact value, the model the handle.
The baseline is the same program with handles off (``blob_bytes=None``): the
10 MB crosses into the worker, back out as the second call's arguments and
out as the answer; its argument and output limits are raised to let it
(under the default limits it cannot pass the value on at all: one call's
arguments are at most 1 MB).

Rows, on the worker runtime (a fresh worker per run, so each run's peak is
its own):

* the worker's peak RSS (``VmHWM`` of the processes under this one, read
  by the second tool while the run's worker is alive: its largest);
* the model-facing answer's bytes (``result.usage.answer_bytes``);
* wall time per run, and this process's CPU per run beside it (the host's
  side: the worker's CPU is its own process's).

Each repetition runs both back to back, in alternating order
(``_common.interleave``); ratios are handles over no handles, paired.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import _common as c

from nous_sched import Limits, Tool, WorkerPool, run_code

BIG = "é" * 5_000_000
PROGRAM = """
const r = await tools.big({});
const n = await tools.take({s: r});
return {n, body: r};
"""
ROOMY = 64_000_000  # the baseline's argument and output limits: room for the 10 MB both ways


def _hwm_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _descendants() -> set[int]:
    found: set[int] = set()
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            found.update(kids)
            todo.extend(kids)
    return found


class _Once:
    """One run of the program, handles on or off: its worker's peak, answer size, wall and CPU."""

    def __init__(self, pool: WorkerPool, blob_bytes: Any) -> None:
        self.pool = pool
        self.limits = Limits(
            timeout=120,
            blob_bytes=blob_bytes,
            max_args_bytes=ROOMY,
            max_total_args_bytes=ROOMY,
            max_output_bytes=ROOMY,
        )
        self.peak: list[float] = []
        self.answer: list[float] = []
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def __call__(self) -> float:
        peaks: list[float] = []

        def take(args: Any) -> int:
            assert args["s"] == BIG  # the exact value, both ways
            peaks.append(max((_hwm_mib(p) for p in _descendants()), default=0.0))
            return len(args["s"])

        tools = [Tool("big", lambda args: BIG), Tool("take", take)]
        cpu0, t0 = time.process_time(), time.perf_counter()
        result = run_code(PROGRAM, tools, runtime=self.pool, limits=self.limits, description="pass 10 MB on")
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        assert result.error is None and result.result["n"] == len(BIG), result.error
        self.peak.append(peaks[0])
        self.answer.append(float(result.usage.answer_bytes))
        self.wall.append(wall)
        self.cpu.append(cpu)
        return wall


def _section(opts: Any) -> list[c.Row]:
    pool = WorkerPool(size=2)
    try:
        ours, base = _Once(pool, Limits().blob_bytes), _Once(pool, None)
        ours(), base()  # warm-up: the pool's first workers, imports
        for side in (ours, base):
            side.peak.clear(), side.answer.clear(), side.wall.clear(), side.cpu.clear()
        s = c.interleave(opts.reps, ours, base)
        note = "the program passes a 10 MB result to a second tool and returns it"
        return [
            c.ours_vs(
                "worker peak RSS, 10 MB passed on",
                ours.peak,
                base.peak,
                s,
                unit="MiB",
                base_name="handles off",
                note="VmHWM of the run's worker, read while it is alive; " + note,
            ),
            c.ours_vs("  model-facing answer", ours.answer, base.answer, s, unit="bytes", base_name="handles off"),
            c.ours_vs("  wall per run", ours.wall, base.wall, s, scale=1000, unit="ms", base_name="handles off"),
            c.ours_vs(
                "  host CPU per run",
                ours.cpu,
                base.cpu,
                s,
                scale=1000,
                unit="ms",
                base_name="handles off",
                note="this process's CPU (the worker's is its own)",
            ),
        ]
    finally:
        pool.close()


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=6, quick_reps=2)
    return c.run(
        "blob handles: a 10 MB result passed to a second tool [worker]", [("blobs", lambda: _section(opts))], opts
    )


if __name__ == "__main__":
    sys.exit(main())

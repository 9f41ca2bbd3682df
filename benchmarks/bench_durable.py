"""Durable approval: suspend, then resume by replay, of a run with 100 committed calls.

The program makes 100 sequential calls of a cheap tool, then one call that
needs approval. ``run_code(..., approval_store=SqliteApprovalStore(...))``
suspends it with 100 calls in its ledger; ``resume`` replays them (no tool
runs) and makes the approved call. Rows:

* **resume by replay, p99** (target: at most 300 ms, the budget Vercel's run
  package holds itself to in CI), and its median against the same program run
  end to end with an approval handler that approves at once (no store: the
  100 calls run live);
* **suspend + resume, p99**: the whole round trip, store writes included;
* **cost per replayed call**: (resume with 100 recorded calls - resume with
  none) / 100, against the cost per live call of the un-suspended run.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any

import _common as c

from nous_sched import Limits, SqliteApprovalStore, Tool, resume, run_code

TARGET_P99_MS = 300.0
N = 100


def _noop(args: dict[str, Any]) -> dict[str, Any]:
    return {"i": args.get("i")}


TOOLS = [
    Tool("step", _noop, concurrency_safe=lambda args: True),
    Tool("pay", _noop, requires_approval=True),
]


def program(n: int) -> str:
    return f"let s = 0;\nfor (let i = 0; i < {n}; i++) s += (await tools.step({{i}})).i;\nawait tools.pay({{i: s}});\nreturn s;"


def suspend(rt: Any, store: SqliteApprovalStore, n: int) -> str:
    result = run_code(
        program(n), TOOLS, runtime=rt, approval_store=store, limits=Limits(timeout=120), description="test"
    )
    assert result.suspended is not None, result.error
    token: str = result.suspended.token
    return token


def resumed(rt: Any, store: SqliteApprovalStore, token: str, n: int) -> float:
    t0 = time.perf_counter()
    result = resume(token, {n: True}, TOOLS, approval_store=store, runtime=rt, limits=Limits(timeout=120))
    dt = time.perf_counter() - t0
    assert result.ok and result.result == n * (n - 1) // 2, result.error
    return dt


def round_trip(rt: Any, store: SqliteApprovalStore, n: int) -> float:
    t0 = time.perf_counter()
    token = suspend(rt, store, n)
    resumed(rt, store, token, n)
    return time.perf_counter() - t0


def live(rt: Any, n: int) -> float:
    t0 = time.perf_counter()
    result = run_code(
        program(n), TOOLS, runtime=rt, approval_handler=lambda r: True, limits=Limits(timeout=120), description="test"
    )
    dt = time.perf_counter() - t0
    assert result.ok, result.error
    return dt


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=40, quick_reps=5)
    folder = tempfile.mkdtemp(prefix="nous-sched-bench-durable-")
    store = SqliteApprovalStore(os.path.join(folder, "approvals.db"))

    def section(rc: c.RuntimeChoice) -> list[c.Row]:
        rt = rc.runtime
        live(rt, N)
        resumed(rt, store, suspend(rt, store, N), N)  # warm-up
        tokens = [suspend(rt, store, N) for _ in range(opts.reps)]
        empties = [suspend(rt, store, 0) for _ in range(opts.reps)]
        t_tokens, t_empties = iter(tokens), iter(empties)
        s = c.interleave(
            opts.reps,
            lambda: resumed(rt, store, next(t_tokens), N),
            lambda: live(rt, N),
            lambda: resumed(rt, store, next(t_empties), 0),
            lambda: round_trip(rt, store, N),
        )
        replay_ms, live_ms, empty_ms, trip_ms = ([x * 1000 for x in series] for series in s)
        per_replayed = [(a - b) * 1000 / N for a, b in zip(replay_ms, empty_ms, strict=True)]
        per_live = [(a - b) * 1000 / N for a, b in zip(live_ms, empty_ms, strict=True)]
        return [
            c.Row(
                f"resume by replay of {N} committed calls, p99 [{rc.name}]",
                c.Stats.fixed(c.percentile(replay_ms, 99)),
                unit="ms",
                target=c.value_at_most(TARGET_P99_MS, "ms"),
                note=f"{len(replay_ms)} resumes; median {c.Stats.of(replay_ms).median:.1f} ms",
            ),
            c.ours_vs(
                "  resume by replay against the same run live (auto-approved)",
                s[0],
                s[1],
                s,
                scale=1000,
                unit="ms",
                base_name="live run",
            ),
            c.Row(
                f"  suspend + resume, p99 [{rc.name}]",
                c.Stats.fixed(c.percentile(trip_ms, 99)),
                unit="ms",
                target=c.value_at_most(TARGET_P99_MS, "ms"),
                note="both runs and the store's writes and claim",
            ),
            c.Row(
                "  cost per replayed call",
                c.Stats.of(per_replayed),
                c.Stats.of(per_live),
                unit="us/call",
                base_name="live call",
                note="(resume with 100 recorded calls - resume with none) / 100, beside the same for live calls",
            ),
        ]

    return c.run(__doc__.splitlines()[0], c.per_runtime(opts, "durable", section), opts)


if __name__ == "__main__":
    sys.exit(main())

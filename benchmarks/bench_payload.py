"""5. Payloads: what moving big JSON values across the bridge costs, against a JSON round trip.

- A tool returning 1 MB of records (a list of small objects) to a program:
  the extra time of that run over the same run whose tool returns ``[]``.
- 100 KB of records as a call's arguments: the extra time of a run sending
  them over the same program sending ``{n}`` (the records are a literal in
  both programs, so parsing them is on both sides).
- A program returning a 500 KB result while 1,000 calls it started without
  ``await`` are still outstanding: the extra time over the same run returning
  a number. A result should cross once, however many calls are in flight.

Baseline for each: one ``json.dumps`` + ``json.loads`` of the same object in
Python, the least any bridge that speaks JSON pays. Target: at most 1.5x.
Beside each, the floor (``_floor.py``) moving the same payload.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any, Callable

import _common as c
import _floor

from nous_sched import Limits, Tool, run_code

TARGET = 1.5


def records(n_bytes: int) -> list[dict[str, Any]]:
    """Small record objects totalling about ``n_bytes`` of JSON."""
    out = []
    size = 2
    i = 0
    while size < n_bytes:
        rec = {"id": i, "name": f"item-{i}", "tags": ["alpha", "beta"], "score": i * 0.5, "active": i % 2 == 0}
        out.append(rec)
        size += len(json.dumps(rec)) + 2
        i += 1
    return out


def json_round_trip(value: Any) -> float:
    t0 = time.perf_counter()
    json.loads(json.dumps(value))
    return time.perf_counter() - t0


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=7, quick_reps=2)
    ms = 1000.0
    big = records(1_000_000)
    args_records = records(100_000)
    # Before the result crossed once, each outstanding call re-sent it (about
    # 12 ms per call for 500 KB here), so fewer in --quick.
    held = 30 if opts.quick else 1_000
    result_value = records(500_000)
    batch = 1 if opts.quick else 3

    def med(fn: Callable[[], float]) -> float:
        return float(statistics.median(fn() for _ in range(batch)))

    def section(rc: c.RuntimeChoice) -> list[c.Row]:
        rt = rc.runtime

        # -- a 1 MB result from a tool
        result_tools = [
            Tool("records", lambda args: big, concurrency_safe=lambda args: True),
            Tool("empty", lambda args: [], concurrency_safe=lambda args: True),
        ]
        result_floor_tools = {"records": lambda args: big, "empty": lambda args: []}
        get = "const r = await tools.{tool}({{}});\nreturn r.length;"

        def ours_get(tool: str, expect: int) -> float:
            t0 = time.perf_counter()
            r = run_code(get.format(tool=tool), result_tools, runtime=rt, timeout=60, description="test")
            dt = time.perf_counter() - t0
            assert r.ok and r.result == expect, r.error
            return dt

        def floor_get(tool: str, expect: int) -> float:
            t0 = time.perf_counter()
            assert _floor.run(get.format(tool=tool), result_floor_tools) == expect
            return time.perf_counter() - t0

        n_big = len(big)
        fns: tuple[Callable[[], float], ...] = (
            lambda: ours_get("records", n_big),
            lambda: ours_get("empty", 0),
            lambda: floor_get("records", n_big),
            lambda: floor_get("empty", 0),
            lambda: json_round_trip(big),
        )
        for fn in fns:
            fn()  # warm-up
        s = c.interleave(opts.reps, *[(lambda fn=fn: med(fn)) for fn in fns])
        ours = c.per_rep(lambda a, b: a - b, s[0], s[1])
        floor = c.per_rep(lambda a, b: a - b, s[2], s[3])
        mb = len(json.dumps(big)) / 1e6
        rows = [
            c.ours_vs(
                f"payload: a tool returns {mb:.1f} MB of records [{rc.name}]",
                ours,
                s[4],
                s,
                scale=ms,
                unit="ms",
                base_name="json.dumps + json.loads",
                target=c.ratio_at_most(TARGET),
                note=f"{n_big:,} records; run with them minus the same run whose tool returns []",
            ),
            c.ours_vs("  the floor, same payload", floor, s[4], s, scale=ms, unit="ms", base_name="json round trip"),
        ]

        # -- 100 KB of record arguments
        literal = json.dumps(args_records)
        send = "const recs = " + literal + ";\nawait tools.sink({arg});\nreturn recs.length;"
        sink_tools = [Tool("sink", lambda args: None, concurrency_safe=lambda args: True)]
        sink_floor = {"sink": lambda args: None}
        sent = {"records": args_records}

        def ours_send(arg: str) -> float:
            t0 = time.perf_counter()
            r = run_code(send.replace("{arg}", arg), sink_tools, runtime=rt, timeout=60, description="test")
            dt = time.perf_counter() - t0
            assert r.ok and r.result == len(args_records), r.error
            return dt

        def floor_send(arg: str) -> float:
            t0 = time.perf_counter()
            assert _floor.run(send.replace("{arg}", arg), sink_floor) == len(args_records)
            return time.perf_counter() - t0

        fns = (
            lambda: ours_send("{ records: recs }"),
            lambda: ours_send("{ n: recs.length }"),
            lambda: floor_send("{ records: recs }"),
            lambda: floor_send("{ n: recs.length }"),
            lambda: json_round_trip(sent),
        )
        for fn in fns:
            fn()
        # Short runs: each sample is the median of several.
        k = 3 if opts.quick else 9
        a = c.interleave(opts.reps, *[(lambda fn=fn: statistics.median(fn() for _ in range(k))) for fn in fns])
        kb = len(json.dumps(sent)) / 1e3
        rows += [
            c.ours_vs(
                f"payload: {kb:.0f} KB of record arguments [{rc.name}]",
                c.per_rep(lambda x, y: x - y, a[0], a[1]),
                a[4],
                a,
                scale=ms,
                unit="ms",
                base_name="json.dumps + json.loads",
                target=c.ratio_at_most(TARGET),
                note=f"{len(args_records):,} records; run sending them minus the same run sending {{n}}",
            ),
            c.ours_vs(
                "  the floor, same payload",
                c.per_rep(lambda x, y: x - y, a[2], a[3]),
                a[4],
                a,
                scale=ms,
                unit="ms",
                base_name="json round trip",
            ),
        ]

        # -- a 500 KB result while 1,000 calls are outstanding
        value_literal = json.dumps(result_value)
        hold = "for (let i = 0; i < {held}; i++) tools.noop({{}});\nreturn {what};"
        noop_tools = [Tool("noop", lambda args: None, concurrency_safe=lambda args: True)]

        def ours_hold(what: str, n_held: int) -> float:
            code = "const value = " + value_literal + ";\n" + hold.format(held=n_held, what=what)
            t0 = time.perf_counter()
            r = run_code(
                code, noop_tools, runtime=rt, limits=Limits(timeout=120, max_calls=n_held + 1), description="test"
            )
            dt = time.perf_counter() - t0
            assert r.ok and r.result is not None, r.error
            return dt

        fns = (
            lambda: ours_hold("value", held),
            lambda: ours_hold("value.length", held),
            lambda: ours_hold("value", 0),
            lambda: ours_hold("value.length", 0),
            lambda: json_round_trip(result_value),
        )
        for fn in fns[1:]:
            fn()  # the first is seconds long today: its own first run is its warm-up
        h = c.interleave(min(opts.reps, 3), *fns)
        kb = len(value_literal) / 1e3
        rows += [
            c.ours_vs(
                f"result while {held:,} calls outstanding: {kb:.0f} KB [{rc.name}]",
                c.per_rep(lambda x, y: x - y, h[0], h[1]),
                h[4],
                h,
                scale=ms,
                unit="ms",
                base_name="json.dumps + json.loads",
                target=c.ratio_at_most(TARGET),
                note=f"a program starts {held:,} calls without await and returns the value; "
                "minus the same run returning value.length",
            ),
            c.ours_vs(
                "  the runs themselves: value vs value.length",
                h[0],
                h[1],
                h,
                scale=ms,
                unit="ms",
                base_name="value.length",
            ),
            c.ours_vs(
                "  same result, no call outstanding",
                c.per_rep(lambda x, y: x - y, h[2], h[3]),
                h[4],
                h,
                scale=ms,
                unit="ms",
                base_name="json round trip",
            ),
        ]
        return rows

    return c.run(
        "5. payloads (each row: the payload's extra time against a JSON round trip of it)",
        c.per_runtime(opts, "payloads", section),
        opts,
    )


if __name__ == "__main__":
    sys.exit(main())

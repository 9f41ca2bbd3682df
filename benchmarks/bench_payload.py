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

Then the parts, in this process with no run (INFO rows, each against the same
JSON round trip): the ways to check and copy a result and to parse, check and
freeze arguments that were measured to choose the ones ``nous_sched`` uses:
the walk, the C parser's hooks (``object_pairs_hook``), ``orjson`` (the
``speed`` extra), the audit's copy kept as text and frozen on first read,
the arguments' crossing (a JSON string inside the envelope, or after it as
they are) and the count of the bytes a model reads (``text_bytes``; before,
its characters).
``--without-orjson`` runs everything as if ``orjson`` were not installed.
"""

from __future__ import annotations

import importlib
import json
import statistics
import sys
import time
from typing import Any, Callable

import _common as c
import _floor

if "--without-orjson" in sys.argv:  # before nous_sched is imported: as on a machine without it
    sys.modules["orjson"] = None  # type: ignore[assignment]

from nous_sched import Limits, Tool, run_code  # noqa: E402

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


def _flag(p: Any) -> None:
    p.add_argument("--without-orjson", action="store_true", help="run as if orjson were not installed")


def parts(opts: c.Options, big: list[dict[str, Any]], args_records: list[dict[str, Any]]) -> list[c.Row]:
    """Where a payload's time goes, part by part, against a JSON round trip of it."""
    events = importlib.import_module("nous_sched.events")
    snap = importlib.import_module("nous_sched.crossing._snapshot")  # the module, not the function of that name

    if not hasattr(snap, "snapshot_text"):  # an older nous_sched (e.g. PYTHONPATH at main)
        return [c.skip_row("payload parts", "this nous_sched has no snapshot.snapshot_text")]
    _fastjson = importlib.import_module("nous_sched.crossing._fastjson")

    ms = 1000.0
    k = 3 if opts.quick else 7
    compact = json.JSONEncoder(separators=(",", ":"), allow_nan=False, check_circular=False).encode
    unescaped = json.JSONEncoder(
        separators=(",", ":"), ensure_ascii=False, allow_nan=False, check_circular=False
    ).encode
    with_nulls = [dict(r, note=None) for r in big]
    sent = {"records": args_records}
    text = compact(sent)
    parsed = json.loads(text)
    have_orjson = _fastjson.available()
    missing: Any = object()

    def timed(fn: Callable[[], Any]) -> Callable[[], float]:
        return lambda: statistics.median(c.timed(fn) for _ in range(k))

    def without_orjson(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            saved = sys.modules.get("orjson", missing)
            sys.modules["orjson"] = None  # type: ignore[assignment]
            _fastjson.reset()
            try:
                return fn()
            finally:
                if saved is missing:
                    sys.modules.pop("orjson", None)
                else:
                    sys.modules["orjson"] = saved
                _fastjson.reset()

        return run

    def before(value: Any) -> None:  # main's result path: the walk, then one encode for the size, one for the program
        copy = snap.snapshot(value)
        len(unescaped(copy).encode("utf-8", "surrogatepass"))
        compact(copy)

    answer = {"logs": [], "result": big}
    escaped = compact(text)  # the arguments as a JSON string inside the envelope (before)
    envelope_head = '{"calls":[[1,"sink",0]],"logs":[],"dropped":0,"main":null}'
    out_of_line = envelope_head + "\x01" + text  # after the envelope, as they are
    engine = importlib.import_module("nous_sched.runtime.engine")
    has_split = hasattr(engine, "_split")

    def indented_count(
        value: Any,
    ) -> Any:  # an older count of characters: compact + indented dumps, 2- and 3-byte scans
        orjson = _fastjson._load()
        compact_bytes = orjson.dumps(value, option=_fastjson._options)
        if _fastjson._respelled(compact_bytes):
            return None
        return len(compact_bytes) + _fastjson._separators_by_indent(orjson, value, compact_bytes)

    def chars_before(value: Any) -> Any:  # the count in characters (text_chars, before bytes): decoded when not ASCII
        orjson = _fastjson._load()
        compact_bytes = orjson.dumps(value, option=_fastjson._options)
        if _fastjson._respelled(compact_bytes):
            return None
        separators = _fastjson._separators(compact_bytes)
        if separators is None:
            separators = _fastjson._separators_by_indent(orjson, value, compact_bytes)
        return (len(compact_bytes) if compact_bytes.isascii() else len(compact_bytes.decode("utf-8"))) + separators

    # The same records with non-ASCII names (accents, an emoji): the count in bytes differs from characters.
    answer_u = {"logs": [], "result": [dict(r, name=f"élément {r['id']} \U0001f600") for r in big]}
    result_parts: list[tuple[str, Callable[[], Any]]] = [
        ("result 1 MB: walk + two encodes (before)", lambda: before(big)),
        ("result 1 MB: snapshot_text, walk + one encode", without_orjson(lambda: snap.snapshot_text(big))),
        ("result 1 MB: snapshot_text, orjson", lambda: snap.snapshot_text(big)),
        ("result 1 MB with nulls: snapshot_text, orjson", lambda: snap.snapshot_text(with_nulls)),
        (
            "answer 1 MB: characters, the stdlib's json.dumps (before)",
            without_orjson(lambda: len(json.dumps(answer, ensure_ascii=False))),
        ),
        ("answer 1 MB: text_bytes, the stdlib's json.dumps", without_orjson(lambda: snap.text_bytes(answer))),
        ("answer 1 MB: characters, orjson + indented dump (before)", lambda: indented_count(answer)),
        ("answer 1 MB: characters, orjson + one translate (before)", lambda: chars_before(answer)),
        ("answer 1 MB: text_bytes, orjson + one translate", lambda: snap.text_bytes(answer)),
        (
            "answer 1 MB non-ASCII: characters, the stdlib's json.dumps (before)",
            without_orjson(lambda: len(json.dumps(answer_u, ensure_ascii=False))),
        ),
        (
            "answer 1 MB non-ASCII: text_bytes, the stdlib's json.dumps",
            without_orjson(lambda: snap.text_bytes(answer_u)),
        ),
        ("answer 1 MB non-ASCII: characters, orjson + one translate (before)", lambda: chars_before(answer_u)),
        ("answer 1 MB non-ASCII: text_bytes, orjson + one translate", lambda: snap.text_bytes(answer_u)),
    ]
    args_parts: list[tuple[str, Callable[[], Any]]] = [
        ("args 100 KB: json.loads + check", lambda: snap.check(json.loads(text))),
        ("args 100 KB: snapshot.loads, orjson", lambda: snap.loads(text)),
        (
            "args 100 KB: cross as a JSON string in the envelope (before; both escapes by the stdlib)",
            lambda: (compact(text), json.loads(escaped)),
        ),
        ("args 100 KB: cross after the envelope, as they are", lambda: engine._checked(out_of_line)),
        ("args 100 KB: audit copy, freeze walk (before)", lambda: events.freeze(parsed)),
        (
            "args 100 KB: audit copy, C parser + object_pairs_hook (lists not frozen)",
            lambda: json.loads(text, object_pairs_hook=events._frozen_dict),
        ),
        (
            "args 100 KB: audit copy, C parser + object_hook (lists not frozen)",
            lambda: json.loads(text, object_hook=events._frozen_dict),
        ),
        ("args 100 KB: audit copy kept as text (frozen_later), unread", lambda: events.frozen_later(text)),
        (
            "args 100 KB: audit copy kept as text, first read",
            lambda: events.ToolCallEvent("c:0", "t", events.frozen_later(text), "parallel", 0).arguments,
        ),
    ]
    rows: list[c.Row] = []
    for value, named in ((big, result_parts), (sent, args_parts)):
        if not have_orjson:
            named = [(n, f) for n, f in named if "orjson" not in n]
        if not has_split:  # an older nous_sched: the parts it does not have
            named = [(n, f) for n, f in named if "envelope" not in n and "answer 1 MB" not in n]
        if not hasattr(snap, "text_bytes"):  # one that counts a model's answer in characters
            named = [(n, f) for n, f in named if "text_bytes" not in n]
        fns = [timed(f) for _, f in named] + [timed(lambda value=value: json_round_trip(value))]
        for fn in fns:
            fn()
        s = c.interleave(opts.reps, *fns)
        for i, (name, _) in enumerate(named):
            rows.append(c.ours_vs(name, s[i], s[-1], s, scale=ms, unit="ms", base_name="json round trip"))
    return rows


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=7, quick_reps=2, add_arguments=_flag)
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
        crossing = Limits(timeout=60, blob_bytes=None)

        def ours_get(tool: str, expect: int) -> float:
            t0 = time.perf_counter()
            # Handles off: this row measures the 1 MB crossing the bridge (bench_blobs.py: keeping it on the host).
            r = run_code(get.format(tool=tool), result_tools, runtime=rt, limits=crossing, description="test")
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
        [*c.per_runtime(opts, "payloads", section), ("payload parts", lambda: parts(opts, big, args_records))],
        opts,
    )


if __name__ == "__main__":
    sys.exit(main())

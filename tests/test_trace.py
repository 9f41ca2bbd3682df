"""nous_sched.trace: Chrome trace-event export of a run's trail."""

from __future__ import annotations

import json
import threading
import time

import pytest

from nous_sched import CallRecord, RunResult, Tool, run_code
from nous_sched.result import RunError
from nous_sched.trace import assign_lanes, chrome_trace, write_chrome_trace

EPS = 0.002  # microseconds: timestamps are rounded to nanoseconds


def _slow(args):
    time.sleep(args.get("sleep", 0.03))
    return args["i"]


SLOW = Tool("slow", _slow, concurrency_safe=lambda args: True)
WRITE = Tool("write", lambda args: {"wrote": args["i"]})  # exclusive

FANOUT = """
const first = await Promise.all([0, 1, 2, 3, 4, 5].map((i) => tools.slow({ i })));
const w = await tools.write({ i: 6 });
const last = await Promise.all([tools.slow({ i: 7 }), tools.write({ i: 8 }), tools.slow({ i: 9, sleep: 0 })]);
console.log("done");
return [first, w, last];
"""


@pytest.fixture(scope="module")
def fanout_result():
    result = run_code(FANOUT, [SLOW, WRITE], max_parallel=4, timeout=20, description="test")
    assert result.ok, result.error
    assert len(result.trail) == 10
    return result


def _calls(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] in ("call", "commit-wait")]


def check_structure(trace: dict) -> None:
    """Every property the module docstring promises, for any trace."""
    assert set(trace) >= {"traceEvents", "displayTimeUnit"}
    assert trace["displayTimeUnit"] == "ms"
    json.dumps(trace, allow_nan=False)  # plain JSON
    events = trace["traceEvents"]
    assert events
    for e in events:
        for key in ("name", "ph", "ts", "pid", "tid"):
            assert key in e, (key, e)
        assert isinstance(e["name"], str) and e["name"]
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
    run = [e for e in events if e["ph"] == "X" and e.get("cat") == "run"]
    assert len(run) == 1 and run[0]["tid"] == 0 and run[0]["ts"] == 0
    run_end = run[0]["dur"]

    lanes: dict[int, list] = {}
    for e in _calls(trace):
        assert e["tid"] >= 1
        assert {"seq", "tool", "mode", "ok"} <= set(e["args"])
        assert e["ts"] + e["dur"] <= run_end + EPS
        lanes.setdefault(e["tid"], []).append(e)
    for tid, lane in lanes.items():
        lane.sort(key=lambda e: (e["ts"], e["cat"] != "call"))
        for before, after in zip(lane, lane[1:]):
            assert before["ts"] + before["dur"] <= after["ts"] + EPS, (tid, before, after)

    # Commits (the end of each wait event) are non-decreasing in seq order.
    waits = sorted((e for e in _calls(trace) if e["cat"] == "commit-wait"), key=lambda e: e["args"]["seq"])
    ends = [e["ts"] + e["dur"] for e in waits]
    assert all(a <= b + EPS for a, b in zip(ends, ends[1:])), ends


def test_fanout_trace_structure(fanout_result):
    trace = chrome_trace(fanout_result)
    check_structure(trace)
    calls = [e for e in _calls(trace) if e["cat"] == "call"]
    waits = [e for e in _calls(trace) if e["cat"] == "commit-wait"]
    assert [e["args"]["seq"] for e in calls] == list(range(10))
    assert [e["args"]["seq"] for e in waits] == list(range(10))
    assert [e["name"] for e in calls] == [r.tool for r in fanout_result.trail]
    assert all(w["name"] == f"{w['args']['tool']} (wait for commit)" for w in waits)
    # Each call's execution and wait sit back to back on one lane.
    for call, wait in zip(calls, waits):
        assert call["tid"] == wait["tid"]
        assert abs(call["ts"] + call["dur"] - wait["ts"]) <= EPS
    by_seq = {e["args"]["seq"]: e for e in calls}
    # Greedy lanes are optimal for intervals: as many lanes as calls holding one
    # (from start to commit) at the busiest instant, and the fan-out did overlap.
    trail = fanout_result.trail
    busiest = max(sum(1 for r in trail if r.started <= t.started < r.committed) for t in trail)
    assert busiest >= 2
    assert max(e["tid"] for e in calls) == busiest
    # Exclusive calls start once everything before has committed: always lane 1.
    assert by_seq[6]["args"]["mode"] == "exclusive" and by_seq[6]["tid"] == 1
    assert by_seq[8]["args"]["mode"] == "exclusive" and by_seq[8]["tid"] == 1
    # Timestamps are microseconds of the trail's clock.
    for record in fanout_result.trail:
        assert by_seq[record.seq]["ts"] == pytest.approx(record.started * 1e6, abs=0.01)
        assert by_seq[record.seq]["dur"] == pytest.approx((record.finished - record.started) * 1e6, abs=0.01)


def test_metadata_names_process_and_lanes(fanout_result):
    trace = chrome_trace(fanout_result, name="fanout.js")
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    assert {"name": "process_name", "ph": "M", "ts": 0, "pid": 1, "tid": 0, "args": {"name": "fanout.js"}} in meta
    lane_names = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    lanes = max(e["tid"] for e in trace["traceEvents"] if e["ph"] == "X")
    assert lane_names == {0: "run", **{i: f"lane {i}" for i in range(1, lanes + 1)}}
    run = next(e for e in trace["traceEvents"] if e.get("cat") == "run")
    assert run["name"] == "fanout.js"
    assert run["args"] == {"ok": True, "calls": 10, "logs": 1}
    assert run["dur"] >= max(r.committed for r in fanout_result.trail) * 1e6 - EPS


def test_write_chrome_trace_round_trips(fanout_result, tmp_path):
    path = tmp_path / "run.trace.json"
    assert write_chrome_trace(fanout_result, path) == str(path)
    loaded = json.loads(path.read_text(encoding="utf-8"))
    assert loaded == json.loads(json.dumps(chrome_trace(fanout_result)))
    check_structure(loaded)


def test_failed_run_and_empty_trail():
    result = run_code("throw new Error('nope')", [SLOW], description="test")
    trace = chrome_trace(result)
    check_structure(trace)
    assert _calls(trace) == []
    run = next(e for e in trace["traceEvents"] if e.get("cat") == "run")
    assert run["args"] == {"ok": False, "calls": 0, "logs": 0, "error": "exception"}


def test_failed_call_is_marked_not_ok():
    def boom(args):
        raise RuntimeError("broken")

    tool = Tool("boom", boom, concurrency_safe=lambda args: True)
    result = run_code("try { await tools.boom({}) } catch (e) { return e.message }", [tool], description="test")
    assert result.result == "broken"
    trace = chrome_trace(result)
    check_structure(trace)
    assert [e["args"]["ok"] for e in _calls(trace)] == [False, False]


def test_abandoned_call_runs_to_the_end_of_the_run():
    release = threading.Event()
    hang = Tool("hang", lambda args: release.wait(10), concurrency_safe=lambda args: True)
    try:
        result = run_code("await tools.hang({})", [hang], timeout=0.3, description="test")
    finally:
        release.set()
    assert result.error.kind == "timeout"
    assert result.trail[0].finished is None
    trace = chrome_trace(result)
    check_structure(trace)
    (call,) = _calls(trace)
    assert call["cat"] == "call" and call["args"]["abandoned"] is True and call["args"]["ok"] is None
    run = next(e for e in trace["traceEvents"] if e.get("cat") == "run")
    assert call["ts"] + call["dur"] == pytest.approx(run["dur"], abs=EPS)
    assert run["args"]["error"] == "timeout"


def _rec(seq, started, finished, committed, mode="parallel", ok=True):
    return CallRecord(seq, f"t{seq}", mode, started, finished, committed, ok)


def test_assign_lanes_is_greedy():
    trail = [
        _rec(0, 0.0, 1.0, 1.0),
        _rec(1, 0.1, 0.5, 1.0),  # overlaps 0
        _rec(2, 0.2, 0.3, 1.0),  # overlaps 0 and 1
        _rec(3, 1.0, 1.5, 1.5, "exclusive"),  # everything before has committed
        _rec(4, 1.5, 2.0, 2.5),
        _rec(5, 1.6, 2.4, 2.5),
    ]
    assert assign_lanes(trail) == [1, 2, 3, 1, 1, 2]


def test_synthetic_result_is_exact():
    trail = (_rec(0, 0.001, 0.002, 0.004), _rec(1, 0.001, 0.004, 0.004, ok=False), _rec(2, 0.005, None, None, ok=None))
    result = RunResult(logs=("a",), error=RunError("timeout", "late"), trail=trail, elapsed=0.006)
    trace = chrome_trace(result)
    check_structure(trace)
    xs = [(e["name"], e["ts"], e["dur"], e["tid"]) for e in trace["traceEvents"] if e["ph"] == "X"]
    assert xs == [
        ("run_code", 0.0, 6000.0, 0),
        ("t0", 1000.0, 1000.0, 1),
        ("t0 (wait for commit)", 2000.0, 2000.0, 1),
        ("t1", 1000.0, 3000.0, 2),
        ("t1 (wait for commit)", 4000.0, 0.0, 2),
        ("t2", 5000.0, 1000.0, 1),
    ]

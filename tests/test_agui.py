"""nous_sched.agui: a run's live events as AG-UI, checked by the independent
conformance validator from PyPI (``ag-ui-validate``, run as a real subprocess
with ``--fail-on warning``) over recorded server-sent-event streams."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from nous_sched import PermissionPolicy, SqliteApprovalStore, Tool, agui, start_run
from nous_sched.live import RunEvent

WAIT = 60
VALIDATOR = shutil.which("ag-ui-validate") or os.path.join(os.path.dirname(sys.executable), "ag-ui-validate")

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _lookup(args):
    if args["city"] == "Atlantis":
        raise LookupError("no city <b>Atlantis</b>")
    return {"city": args["city"], "population": len(args["city"])}


LOOKUP = Tool(name="population", function=_lookup, description="p", parameters=CITY, concurrency_safe=lambda args: True)


def _validate(path):
    proc = subprocess.run(
        [VALIDATOR, "--fail-on", "warning", "--no-color", str(path)], capture_output=True, text=True, timeout=WAIT
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no conformance violations" in proc.stdout, proc.stdout
    return proc.stdout


def _record(run, tmp_path, name):
    """The run's AG-UI stream as server-sent events, written to a file; the events as dicts."""
    path = tmp_path / f"{name}.sse"
    text = "".join(agui.sse(run))
    path.write_text(text, encoding="utf-8")
    events = [json.loads(block[len("data: ") :]) for block in text.strip().split("\n\n")]
    return path, events


def _types(events):
    return [e["type"] for e in events if e["type"] != "CUSTOM"]


def _customs(events, name):
    return [e["value"] for e in events if e["type"] == "CUSTOM" and e["name"] == name]


def test_a_fan_out_with_a_failing_call_is_valid_ag_ui(runtime, tmp_path):
    code = (
        'console.log("looking up"); const r = await Promise.allSettled('
        '["Paris", "Atlantis", "Lima"].map(city => tools.population({city})));'
        "return r.map(x => x.status)"
    )
    run = start_run(code, [LOOKUP], description="fan out over three cities")
    path, events = _record(run, tmp_path, "fanout")
    _validate(path)
    assert events[0]["type"] == "RUN_STARTED" and events[0]["runId"] == run.call_id
    assert _customs(events, "nous_sched.run") == [{"description": "fan out over three cities", "call_id": run.call_id}]
    starts = [e for e in events if e["type"] == "TOOL_CALL_START"]
    assert [e["toolCallId"] for e in starts] == [f"{run.call_id}:code:{n}" for n in range(3)]
    args = [json.loads(e["delta"]) for e in events if e["type"] == "TOOL_CALL_ARGS"]
    assert args == [{"city": "Paris"}, {"city": "Atlantis"}, {"city": "Lima"}]
    results = {e["toolCallId"]: e["content"] for e in events if e["type"] == "TOOL_CALL_RESULT"}
    assert json.loads(results[f"{run.call_id}:code:0"]) == {"city": "Paris", "population": 5}
    failed = json.loads(results[f"{run.call_id}:code:1"])["error"]
    assert failed["kind"] == "tool_error" and "no city <b>Atlantis</b>" in failed["message"]
    assert [e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"] == ["looking up"]
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}
    assert events[-1]["result"]["result"] == ["fulfilled", "rejected", "fulfilled"]
    commits = _customs(events, "nous_sched.commit")
    assert [c["seq"] for c in commits] == [0, 1, 2] and all(c["duration"] >= 0 for c in commits)


def test_a_refused_call_is_a_tool_call_whose_result_says_why(runtime, tmp_path):
    code = "try { await tools.population({}); } catch (e) { console.log(e.message); } return 1"
    run = start_run(code, [LOOKUP], description="a call the schema refuses")
    path, events = _record(run, tmp_path, "refused")
    _validate(path)
    assert _types(events)[1:5] == ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"]
    result = next(e for e in events if e["type"] == "TOOL_CALL_RESULT")
    error = json.loads(result["content"])["error"]
    assert error["kind"] == "refused" and error["reason"] == "schema" and "city" in error["message"]
    assert _customs(events, "nous_sched.refused")[0]["reason"] == "schema"


def test_an_answered_approval_is_valid_ag_ui(runtime, tmp_path):
    asked = []

    def handler(request):
        asked.append(request.question())
        return True

    run = start_run(
        'return await tools.population({city: "Lima"})',
        [LOOKUP],
        description="a call that needs approval",
        policy=PermissionPolicy(require_approval={"population"}),
        approval_handler=handler,
    )
    path, events = _record(run, tmp_path, "approval")
    _validate(path)
    states = [a["state"] for a in _customs(events, "nous_sched.approval")]
    assert states == ["asked", "approved"]
    assert _customs(events, "nous_sched.approval")[0]["question"] == asked[0]
    assert _customs(events, "nous_sched.call")[0]["approval"] is True
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["result"]["result"]["city"] == "Lima"


def test_a_run_that_times_out_ends_with_run_error(runtime, tmp_path, make_event):
    release = make_event()
    slow = Tool(name="slow", function=lambda a: release.wait(WAIT) and 1, description="s")
    run = start_run("await tools.slow({}); return 1", [slow], description="a run past its deadline", timeout=1.0)
    path, events = _record(run, tmp_path, "timeout")
    release.set()
    _validate(path)
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "timeout"
    assert "TOOL_CALL_START" in _types(events)


def test_a_cancelled_run_finishes_as_cancelled(runtime, tmp_path, make_event):
    started, release = make_event(), make_event()

    def wait(args):
        started.set()
        return release.wait(WAIT) and 1

    run = start_run("await tools.wait({}); return 1", [Tool(name="wait", function=wait)], description="cancelled")
    recorded = {}
    reader = threading.Thread(target=lambda: recorded.update(r=_record(run, tmp_path, "cancelled")))
    reader.start()
    assert started.wait(WAIT)
    run.cancel()
    reader.join(WAIT)
    release.set()
    path, events = recorded["r"]
    _validate(path)
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "cancelled"}


def test_a_durable_suspension_is_ag_uis_interrupt(tmp_path):
    store = SqliteApprovalStore(str(tmp_path / "approvals.db"))
    run = start_run(
        'return await tools.population({city: "Lima"})',
        [LOOKUP],
        description="waits for a durable approval",
        policy=PermissionPolicy(require_approval={"population"}),
        approval_store=store,
    )
    path, events = _record(run, tmp_path, "suspended")
    _validate(path)
    suspension = run.result(timeout=WAIT).suspended
    end = events[-1]
    assert end["type"] == "RUN_FINISHED" and end["outcome"]["type"] == "interrupt"
    (interrupt,) = end["outcome"]["interrupts"]
    assert interrupt["reason"] == "approval_required" and interrupt["id"] == f"{suspension.token}#0"
    assert interrupt["message"] == suspension.pending[0].question()
    start = next(e for e in events if e["type"] == "TOOL_CALL_START")
    assert start["toolCallId"] == interrupt["toolCallId"] and start["toolCallName"] == "population"


def test_hostile_strings_cannot_stop_the_stream_or_become_markup(runtime, tmp_path):
    code = r'console.log("\ud800 <script>x</script> \u202e"); return "\udc00"'
    run = start_run(code, [], description="hostile \udfff strings")
    path, events = _record(run, tmp_path, "hostile")
    _validate(path)
    # A lone surrogate is U+FFFD, as in every other value the library hands an encoder (_text.machine_text).
    (line,) = [e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert line == "\ufffd <script>x</script> \u202e"
    assert events[-1]["result"]["result"] == "\ufffd"
    assert _customs(events, "nous_sched.run")[0]["description"] == "hostile \ufffd strings"


def test_clean_writes_a_lone_surrogate_as_the_replacement_character_in_values_and_keys():
    value = {"k\udc00": ["a\ud800b", ("\udfff",), 1, None], "plain": "é😀\u202e"}
    assert agui.clean(value) == {"k\ufffd": ["a\ufffdb", ["\ufffd"], 1, None], "plain": "é😀\u202e"}
    json.dumps(agui.clean(value), ensure_ascii=False).encode("utf-8")  # strict: encodable


def test_a_consumer_that_missed_a_start_still_gets_a_well_formed_call(tmp_path):
    translator = agui.Translator("r", "t")
    commit = {"tool": "x", "ok": True, "chars": 1, "value": {"text": "1", "chars": 1, "clipped": False}}
    out = [e.type.value for e in translator.feed(RunEvent("gap", None, 0.0, {"missed": 3}))]
    out += [e.type.value for e in translator.feed(RunEvent("commit", 4, 0.1, commit))]
    out += [e.type.value for e in translator.feed(RunEvent("end", None, 0.2, {"ok": True, "answer": {"result": 1}}))]
    assert out == [
        "RUN_STARTED",
        "CUSTOM",
        "CUSTOM",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "CUSTOM",
        "RUN_FINISHED",
    ]
    assert translator.feed(RunEvent("log", None, 0.3, {"line": "late"})) == []


_ROW = {"key": "k", "value": '"v"', "chars": 3, "clipped": False}


def _live_events():
    """Any order of live events a consumer may see (gaps drop starts), ending or not with ``end``."""
    seqs = st.integers(0, 5)
    text = st.text(max_size=8)
    call = st.builds(lambda s, t: RunEvent("call", s, 0.0, {"tool": t, "arguments": [_ROW]}), seqs, text)
    commit = st.builds(
        lambda s, ok, t: RunEvent(
            "commit",
            s,
            0.0,
            {"tool": t, "ok": ok, "value": {"text": "1"} if ok else None, "error": None if ok else {"kind": "x"}},
        ),
        seqs,
        st.booleans(),
        text,
    )
    other = st.sampled_from(
        [
            RunEvent("log", None, 0.0, {"line": "a"}),
            RunEvent("log", None, 0.0, {"line": ""}),
            RunEvent("refused", None, 0.0, {"tool": "t", "reason": "schema", "message": "m"}),
            RunEvent("approval", 1, 0.0, {"tool": "t", "call_id": "c", "state": "asked", "question": "q"}),
            RunEvent("gap", None, 0.0, {"missed": 2}),
        ]
    )
    end = st.sampled_from(
        [
            RunEvent("end", None, 0.0, {"ok": True, "answer": {"result": 1}}),
            RunEvent("end", None, 0.0, {"ok": False, "error": {"kind": "timeout", "message": "late"}}),
            RunEvent("end", None, 0.0, {"ok": False, "error": {"kind": "cancelled", "message": "c"}}),
        ]
    )
    return st.tuples(st.lists(st.one_of(call, commit, other), max_size=30), end)


@given(_live_events())
@settings(max_examples=200, deadline=None)
def test_any_live_stream_translates_to_a_well_formed_ag_ui_stream(events_and_end):
    events, end = events_and_end
    translator = agui.Translator("r", "t")
    out = [e for event in [*events, end, *events] for e in translator.feed(event)]
    types = [e.type.value for e in out]
    assert types[0] == "RUN_STARTED" and types.count("RUN_STARTED") == 1
    assert types[-1] in ("RUN_FINISHED", "RUN_ERROR")
    assert sum(t in ("RUN_FINISHED", "RUN_ERROR") for t in types) == 1  # nothing after the end
    open_calls, ended, messages = set(), set(), set()
    for e in out:
        kind = e.type.value
        if kind == "TOOL_CALL_START":
            open_calls.add(e.tool_call_id)
        elif kind in ("TOOL_CALL_ARGS", "TOOL_CALL_END"):
            assert e.tool_call_id in open_calls
            if kind == "TOOL_CALL_ARGS":
                json.loads(e.delta)
            else:
                ended.add(e.tool_call_id)
        elif kind == "TOOL_CALL_RESULT":
            assert e.tool_call_id in ended
        elif kind == "TEXT_MESSAGE_START":
            assert e.message_id not in messages
            messages.add(e.message_id)
        elif kind == "TEXT_MESSAGE_CONTENT":
            assert e.message_id in messages and e.delta
    assert open_calls == ended

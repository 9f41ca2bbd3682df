"""``nous-sched run --events``: the run's live events as JSON lines on standard output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from nous_sched.cli import main
from nous_sched.live import EVENT_KINDS

ROOT = Path(__file__).resolve().parent.parent
FANOUT = str(ROOT / "examples" / "fanout.js")
TOOLS = str(ROOT / "examples" / "tools.py")


def _lines(out):
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_events_are_json_lines_in_order_end_last(capsys):
    assert main(["run", FANOUT, "--tools", TOOLS, "--events", "--no-progress"]) == 0
    out, _ = capsys.readouterr()
    events = _lines(out)
    assert all(set(e) == {"kind", "seq", "at", "data"} and e["kind"] in EVENT_KINDS for e in events)
    assert events[-1]["kind"] == "end" and events[-1]["data"]["ok"] is True
    assert [e["seq"] for e in events if e["kind"] == "commit"] == list(range(12))
    assert sorted(e["seq"] for e in events if e["kind"] == "call") == list(range(12))
    assert [e["data"]["line"] for e in events if e["kind"] == "log"][0] == "looked up 12 cities in 9 countries"
    assert events[-1]["data"]["usage"]["received_chars"] == sum(
        e["data"]["chars"] for e in events if e["kind"] == "commit"
    )


def test_events_with_json_end_with_the_result_object(capsys):
    assert main(["run", FANOUT, "--tools", TOOLS, "--events", "--json", "--no-progress"]) == 0
    out, _ = capsys.readouterr()
    lines = _lines(out)
    assert lines[-2]["kind"] == "end"
    assert lines[-1]["result"]["cities"] == 12


def test_events_of_a_failed_run_exit_1(capsys, tmp_path):
    program = tmp_path / "fail.js"
    program.write_text('console.log("x"); throw new Error("boom")', encoding="utf-8")
    assert main(["run", str(program), "--tools", TOOLS, "--events", "--no-progress"]) == 1
    events = _lines(capsys.readouterr()[0])
    assert [e["kind"] for e in events] == ["log", "end"]
    assert events[-1]["data"]["error"]["kind"] == "exception"


def test_events_from_a_real_subprocess_stream_line_by_line():
    proc = subprocess.run(
        [sys.executable, "-m", "nous_sched", "run", FANOUT, "--tools", TOOLS, "--events"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    events = _lines(proc.stdout)
    assert events[0]["kind"] in ("call", "log") and events[-1]["kind"] == "end"


def test_events_carry_arguments_durations_errors_refusals_and_the_answer(capsys, tmp_path):
    program = tmp_path / "mixed.js"
    program.write_text(
        'const r = await tools.lookup_city({name: "Paris"});'
        "try { await tools.lookup_city({}); } catch (e) {}"
        "try { await tools.nowhere({}); } catch (e) {}"
        "return r.name",
        encoding="utf-8",
    )
    assert main(["run", str(program), "--tools", TOOLS, "--events", "--no-progress"]) == 0
    events = _lines(capsys.readouterr()[0])
    (call,) = [e for e in events if e["kind"] == "call"]
    assert call["seq"] == 0 and call["data"]["tool"] == "lookup_city"
    assert call["data"]["arguments"] == [{"key": "name", "value": '"Paris"', "chars": 7, "clipped": False}]
    assert call["data"]["call_id"].endswith(":code:0") and call["data"]["mode"] in ("parallel", "exclusive")
    (commit,) = [e for e in events if e["kind"] == "commit"]
    assert commit["seq"] == 0 and commit["data"]["ok"] is True and commit["data"]["duration"] >= 0
    assert commit["data"]["error"] is None and '"population"' in commit["data"]["value"]["text"]
    refused = [(e["seq"], e["data"]["tool"], e["data"]["reason"]) for e in events if e["kind"] == "refused"]
    assert refused == [(None, "lookup_city", "schema"), (None, "nowhere", "unknown")]
    assert events[-1]["data"]["answer"]["result"] == json.loads(commit["data"]["value"]["text"])["name"]

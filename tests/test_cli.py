"""The nous-sched command line: in process through main(), and once as a real subprocess."""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nous_sched import CallRecord
from nous_sched.cli import Progress, UsageError, format_trail, load_tools, main

ROOT = Path(__file__).resolve().parent.parent
FANOUT = str(ROOT / "examples" / "fanout.js")
NOTES = str(ROOT / "examples" / "notes.js")
TOOLS = str(ROOT / "examples" / "tools.py")

ROW = re.compile(
    r"^\s+(\d+)\s+(\S+)\s+(parallel|exclusive)\s+([\d.]+)\s+([\d.-]+)\s+([\d.-]+)\s+(ok|error|-)\s+\|(.*)\|$"
)


def rows(stdout: str) -> list[re.Match]:
    return [m for m in map(ROW.match, stdout.splitlines()) if m]


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


def check_fanout_output(stdout: str) -> None:
    assert stdout.startswith("result:\n")
    start = stdout.index("{")
    end = stdout.index("\n\nlogs (2):")
    result = json.loads(stdout[start:end])
    assert result["cities"] == 12
    assert result["largest"] == "Shanghai"
    assert result["total_population"] == 151216015
    assert "looked up 12 cities in 9 countries" in stdout
    assert "largest: Shanghai, China (24870895)" in stdout
    assert "trail (12 calls" in stdout
    found = rows(stdout)
    assert [int(m.group(1)) for m in found] == list(range(12))
    assert {m.group(2) for m in found} == {"lookup_city"}
    assert {m.group(3) for m in found} == {"parallel"}
    assert {m.group(7) for m in found} == {"ok"}
    for m in found:
        assert len(m.group(8)) == 40 and "#" in m.group(8)
        assert float(m.group(4)) <= float(m.group(5)) <= float(m.group(6))


# -- the main job ------------------------------------------------------------


def test_run_fanout_in_process(capsys):
    assert main(["run", FANOUT, "--tools", TOOLS]) == 0
    out, err = capsys.readouterr()
    check_fanout_output(out)
    assert err == ""  # no progress when stderr is not a terminal
    # Lookups ran side by side (at most max_parallel=10 at once).
    assert 2 <= int(re.search(r"peak (\d+) running at once", out).group(1)) <= 10


def test_run_fanout_as_a_subprocess_from_the_repo_root():
    proc = subprocess.run(
        [sys.executable, "-m", "nous_sched", "run", "examples/fanout.js", "--tools", "examples/tools.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    check_fanout_output(proc.stdout)
    assert "Traceback" not in proc.stderr


def test_dotted_module_name(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["run", "examples/errors.js", "--tools", "examples.tools"]) == 0
    out, _ = capsys.readouterr()
    assert '"missing": [\n      "Atlantis"' in out
    assert [m.group(7) for m in rows(out)] == ["ok", "error", "ok", "ok", "error"]
    assert "2 failed" in out


def test_max_parallel_one_serialises(capsys):
    assert main(["run", FANOUT, "--tools", TOOLS, "--max-parallel", "1"]) == 0
    out, _ = capsys.readouterr()
    assert "peak 1 running at once" in out
    found = rows(out)
    for before, after in zip(found, found[1:]):
        assert float(after.group(4)) >= float(before.group(5))


def test_exclusive_barrier_shows_in_the_timeline(capsys):
    assert main(["run", NOTES, "--tools", TOOLS]) == 0
    out, _ = capsys.readouterr()
    found = {int(m.group(1)): m for m in rows(out)}
    assert found[5].group(2) == "add_note" and found[5].group(3) == "exclusive"
    assert "  why exclusive: add_note: no concurrency_safe predicate (seq 5)\n" in out  # the timeline says why
    note_start, note_commit = float(found[5].group(4)), float(found[5].group(6))
    assert note_start >= max(float(found[s].group(6)) for s in (3, 4))
    assert all(float(found[s].group(4)) >= note_commit for s in (6, 7))


def test_program_from_stdin(capsys, monkeypatch):
    monkeypatch.setattr(
        sys, "stdin", io.StringIO("console.log('hi'); return (await tools.word_count({text: 'a b c'})).words")
    )
    assert main(["run", "-", "--tools", TOOLS]) == 0
    out, _ = capsys.readouterr()
    assert out.startswith("result:\n  3\n")
    assert "logs (1):\n  hi\n" in out
    assert len(rows(out)) == 1


# -- --json, --trace, --progress ----------------------------------------------


def test_json_output(capsys):
    assert main(["run", FANOUT, "--tools", TOOLS, "--json"]) == 0
    out, _ = capsys.readouterr()
    doc = json.loads(out)
    assert list(doc) == ["result", "logs", "trail", "events", "refused"]
    assert doc["result"]["cities"] == 12
    assert doc["logs"][0] == "looked up 12 cities in 9 countries"
    assert [r["seq"] for r in doc["trail"]] == list(range(12))
    assert set(doc["trail"][0]) == {
        "seq",
        "tool",
        "mode",
        "started",
        "began",
        "finished",
        "committed",
        "ok",
        "reason",
        "throttled",
    }
    calls = [e for e in doc["events"] if e["type"] == "tool_call"]
    assert [e["name"] for e in calls] == ["lookup_city"] * 12
    assert calls[0]["arguments"] == {"name": "Tokyo"}
    outcomes = [e for e in doc["events"] if e["type"] == "tool_outcome"]
    assert [(e["seq"], e["ok"]) for e in outcomes] == [(i, True) for i in range(12)]


def test_json_output_of_a_failed_run(capsys, tmp_path):
    program = write(tmp_path, "bad.js", "console.log('before'); null.x;")
    assert main(["run", program, "--tools", TOOLS, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["error", "logs", "trail", "events", "refused"]
    assert doc["error"]["kind"] == "exception"
    assert doc["error"]["message"].startswith("TypeError")
    assert doc["logs"] == ["before"]


def test_trace_file(capsys, tmp_path):
    path = tmp_path / "fanout.trace.json"
    assert main(["run", FANOUT, "--tools", TOOLS, "--trace", str(path)]) == 0
    out, _ = capsys.readouterr()
    assert f"trace written to {path}" in out
    trace = json.loads(path.read_text(encoding="utf-8"))
    assert trace["displayTimeUnit"] == "ms"
    for event in trace["traceEvents"]:
        assert {"name", "ph", "ts", "pid", "tid"} <= set(event)
        assert event["ph"] != "X" or event["dur"] >= 0
    calls = [e for e in trace["traceEvents"] if e.get("cat") == "call"]
    assert len(calls) == 12
    assert next(e for e in trace["traceEvents"] if e.get("cat") == "run")["name"] == "fanout.js"


def test_trace_into_a_missing_folder_is_a_usage_error(capsys, tmp_path):
    assert main(["run", FANOUT, "--tools", TOOLS, "--trace", str(tmp_path / "nope" / "t.json")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "--trace" in err and "does not exist" in err


def test_progress_on_a_pipe_prints_the_final_count(capsys):
    assert main(["run", FANOUT, "--tools", TOOLS, "--progress"]) == 0
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert lines and lines[-1] == "calls started 12 / committed 12"
    assert all(re.fullmatch(r"calls started \d+ / committed \d+", line) for line in lines)
    check_fanout_output(out)


def test_no_progress_flag(capsys):
    assert main(["run", FANOUT, "--tools", TOOLS, "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_redraws_in_place_on_a_terminal():
    stream = _Tty()
    progress = Progress(stream, interval=0.01)
    assert progress.tty
    record = CallRecord(0, "t", "parallel", 0.0, 0.1, 0.2, False)
    with progress:
        progress.observe(record, "start")
        progress.observe(record, "commit")

        deadline = time.monotonic() + 10
        while "committed 1" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    text = stream.getvalue()
    assert "\r\x1b[Kcalls started 1 / committed 1 (1 failed)" in text
    assert text.endswith("\r\x1b[K")  # erased at the end
    assert "\n" not in text


def test_progress_observer_never_writes():
    class Exploding(io.StringIO):
        def write(self, s):
            raise AssertionError("the observer must not write")

    progress = Progress(Exploding())
    record = CallRecord(0, "t", "parallel", 0.0)
    for _ in range(1000):
        progress.observe(record, "start")
    assert progress.text() == "calls started 1000 / committed 0"


# -- failures ------------------------------------------------------------------


def test_program_failure_exits_1_with_the_kind(capsys, tmp_path):
    program = write(
        tmp_path,
        "throws.js",
        """\
        console.log("about to fail");
        await tools.lookup_city({ name: "Atlantis" });
    """,
    )
    assert main(["run", program, "--tools", TOOLS]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("error (exception):\n  ToolError: no city named 'Atlantis'")
    assert "logs (1):\n  about to fail" in out
    assert [m.group(7) for m in rows(out)] == ["error"]
    assert err == ""


def test_timeout_exits_1(capsys, tmp_path):
    program = write(tmp_path, "loop.js", "console.log('spinning'); while (true) {}")
    assert main(["run", program, "--tools", TOOLS, "--timeout", "0.3"]) == 1
    out, _ = capsys.readouterr()
    assert out.startswith("error (timeout):\n  the program exceeded its 0.3s deadline")
    assert "spinning" in out
    assert "(no tool calls)" in out


@pytest.mark.parametrize("runtime", ["worker", "in-process"])
def test_runtime_flag_chooses_where_the_program_runs(capsys, runtime):
    assert main(["run", FANOUT, "--tools", TOOLS, "--runtime", runtime]) == 0
    check_fanout_output(capsys.readouterr()[0])


def test_ctrl_c_cancels_the_run_and_prints_what_it_logged(tmp_path):
    # The first SIGINT cancels: the worker is killed, the logs so far and a
    # `cancelled` error are printed, and the exit status is 130.
    tools = write(
        tmp_path,
        "ready_tools.py",
        """\
        import sys
        from nous_sched import Tool

        def ready(args):
            sys.stderr.write("ready\\n")
            sys.stderr.flush()
            return True

        TOOLS = [Tool("ready", ready)]
        """,
    )
    program = write(tmp_path, "spin.js", "console.log('spinning'); await tools.ready({}); for (;;) {}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "nous_sched", "run", program, "--tools", tools, "--timeout", "60", "--no-progress"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr.readline() == "ready\n"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (out, err)
    assert out.startswith("error (cancelled):\n  the run was cancelled"), out
    assert "logs (1):\n  spinning" in out
    assert "Traceback" not in err
    assert elapsed < 10


def _usage_error(capsys, argv) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err
    assert err.count("nous-sched: ") == 1
    return err


def test_unknown_module(capsys):
    err = _usage_error(capsys, ["run", FANOUT, "--tools", "no_such_module_xyz.tools"])
    assert "no module named 'no_such_module_xyz'" in err


def test_missing_tools_file(capsys, tmp_path):
    err = _usage_error(capsys, ["run", FANOUT, "--tools", str(tmp_path / "tools.py")])
    assert "no such file" in err


def test_module_without_tools(capsys, tmp_path):
    module = write(tmp_path, "empty_tools.py", "X = 1\n")
    err = _usage_error(capsys, ["run", FANOUT, "--tools", module])
    assert "defines neither TOOLS nor tools()" in err
    assert "TOOLS = [nous_sched.Tool(...), ...]" in err


def test_tools_that_are_not_tools(capsys, tmp_path):
    module = write(tmp_path, "bad_tools.py", "TOOLS = ['search_files']\n")
    err = _usage_error(capsys, ["run", FANOUT, "--tools", module])
    assert "TOOLS[0] is a str, not a nous_sched.Tool" in err
    module = write(tmp_path, "bad_tools2.py", "TOOLS = 3\n")
    err = _usage_error(capsys, ["run", FANOUT, "--tools", module])
    assert "TOOLS must be an iterable of nous_sched.Tool, got int" in err


def test_duplicate_tool_names(capsys, tmp_path):
    module = write(
        tmp_path,
        "dup_tools.py",
        """\
        from nous_sched import Tool
        TOOLS = [Tool("a", lambda args: 1), Tool("a", lambda args: 2)]
    """,
    )
    err = _usage_error(capsys, ["run", FANOUT, "--tools", module])
    assert "two tools named 'a'" in err


def test_module_that_raises_on_import(capsys, tmp_path):
    module = write(tmp_path, "raising_tools.py", "import os\nraise RuntimeError('no database configured')\n")
    err = _usage_error(capsys, ["run", FANOUT, "--tools", module])
    assert "importing it raised RuntimeError: no database configured" in err
    assert "raising_tools.py:2" in err
    module = write(tmp_path, "syntax_tools.py", "TOOLS = [\n")
    err = _usage_error(capsys, ["run", FANOUT, "--tools", module])
    assert "syntax error" in err


def test_tools_function(capsys, tmp_path):
    module = write(
        tmp_path,
        "factory_tools.py",
        """\
        from nous_sched import Tool
        def tools():
            return (Tool("double", lambda args: args["n"] * 2, concurrency_safe=lambda a: True),)
    """,
    )
    program = write(tmp_path, "double.js", "return await Promise.all([1, 2, 3].map((n) => tools.double({ n })))")
    assert main(["run", program, "--tools", module, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["result"] == [2, 4, 6]

    module = write(tmp_path, "factory_raises.py", "def tools():\n    raise KeyError('API_KEY')\n")
    err = _usage_error(capsys, ["run", program, "--tools", module])
    assert "tools() raised KeyError: 'API_KEY'" in err


def test_sibling_imports_work_for_a_path(capsys, tmp_path):
    write(tmp_path, "helpers_for_tools.py", "def triple(n):\n    return 3 * n\n")
    module = write(
        tmp_path,
        "sibling_tools.py",
        """\
        from nous_sched import Tool
        from helpers_for_tools import triple
        TOOLS = [Tool("triple", lambda args: triple(args["n"]))]
    """,
    )
    program = write(tmp_path, "triple.js", "return await tools.triple({ n: 5 })")
    assert main(["run", program, "--tools", module, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["result"] == 15
    assert str(tmp_path) not in sys.path  # the folder was on sys.path only while loading


def test_missing_program(capsys, tmp_path):
    err = _usage_error(capsys, ["run", str(tmp_path / "nope.js"), "--tools", TOOLS])
    assert "nope.js: no such file" in err


def test_bad_arguments(capsys):
    err = _usage_error(capsys, ["run", FANOUT])
    assert "--tools" in err
    err = _usage_error(capsys, ["run", FANOUT, "--tools", TOOLS, "--max-parallel", "0"])
    assert "--max-parallel" in err and "positive integer" in err
    err = _usage_error(capsys, ["run", FANOUT, "--tools", TOOLS, "--timeout", "-1"])
    assert "--timeout" in err
    err = _usage_error(capsys, [])
    assert "COMMAND" in err


def test_help(capsys):
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--tools", "--max-parallel", "--timeout", "--trace", "--json", "--progress", "--no-progress"):
        assert flag in out


def test_load_tools_examples():
    names = [t.name for t in load_tools(TOOLS)]
    assert names == ["search_files", "read_file", "word_count", "lookup_city", "list_notes", "add_note"]
    with pytest.raises(UsageError):
        load_tools("")


# -- the timeline ---------------------------------------------------------------


def test_format_trail_bars():
    trail = [
        CallRecord(0, "read", "parallel", 0.0, 0.5, 1.0, True),
        CallRecord(1, "read", "parallel", 0.0, 1.0, 1.0, True),
        CallRecord(2, "write", "exclusive", 1.0, 2.0, 2.0, False),
        CallRecord(3, "slow", "parallel", 2.0, None, None, None),
    ]
    lines = format_trail(trail, width=8, span=4.0)
    bars = [line[line.index("|") + 1 : line.rindex("|")] for line in lines[1:5]]
    assert bars == ["#.      ", "##      ", "  ##    ", "    ????"]
    assert lines[3].split()[:7] == ["2", "write", "exclusive", "1000.0", "2000.0", "2000.0", "error"]
    assert lines[4].split()[:7] == ["3", "slow", "parallel", "2000.0", "-", "-", "-"]
    assert lines[-1].startswith("# running")
    assert format_trail([]) == ["(no tool calls)"]

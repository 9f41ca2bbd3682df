"""The command line shows a program's output inert, and explains itself (issue 9).

* lone surrogates in a result or a log print in human and ``--json`` modes,
  through a real UTF-8 standard output;
* control characters (ESC/CSI, OSC 52, CR, BEL) from a program reach the
  terminal escaped, never raw;
* the timeline after a timeout is drawn on the run's whole span;
* ``--version`` answers; a ``null`` result says why it may be null.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from nous_sched import CallRecord, __version__
from nous_sched.cli import format_trail, main
from nous_sched.cli.render import NULL_HINT, inert

ROOT = Path(__file__).resolve().parent.parent
TOOLS = str(ROOT / "examples" / "tools.py")
HOSTILE = r"""
console.log("\x1b[2J\x1b[H cleared");
console.log("\x1b]0;retitled\x07");
console.log("\x1b]52;c;ZXZpbA==\x07");
console.log("ok\rresult:\n  ok");
console.log("\u202eevil\u2028line");
throw new Error("bad \x1b[31mred\x1b[0m \r");
"""
RAW = ("\x1b", "\x07", "\r", "\u202e", "\u2028")


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


def test_inert_escapes_what_acts_on_a_terminal_and_keeps_the_rest():
    assert inert("a\x1b[2Jb\rc\x07d\x7f\x9b\u202e\u2066\u2028\ud800") == (
        "a\\x1b[2Jb\\rc\\x07d\\x7f\\x9b\\u202e\\u2066\\u2028\\ud800"
    )
    assert inert("tab\tand\nnewline é 😀") == "tab\tand\nnewline é 😀"
    # Every format character, the zero-width joiner of emoji sequences too: shown, not invisible.
    assert inert("\u200d\u061c\U000e0041") == "\\u200d\\u061c\\U000e0041"


def test_control_characters_from_a_program_are_shown_escaped(capsys, tmp_path):
    program = write(tmp_path, "hostile.js", HOSTILE)
    assert main(["run", program, "--tools", TOOLS]) == 1
    out, _ = capsys.readouterr()
    for raw in RAW:
        assert raw not in out
    assert "\\x1b[2J\\x1b[H cleared" in out
    assert "\\x1b]52;c;ZXZpbA==\\x07" in out
    # The faked result line stays inside the indented log block.
    assert "\n  ok\\rresult:\n    ok\n" in out or "\n  ok\\rresult:\n    ok" in out
    assert not re.search(r"^result:", out, re.M)
    assert "error (exception):\n  Error: bad \\x1b[31mred\\x1b[0m \\r" in out


def test_json_output_escapes_control_characters_too(capsys, tmp_path):
    program = write(tmp_path, "hostile.js", HOSTILE)
    assert main(["run", program, "--tools", TOOLS, "--json"]) == 1
    out, _ = capsys.readouterr()
    for raw in RAW:
        assert raw not in out
    doc = json.loads(out)
    assert doc["logs"][0] == "\x1b[2J\x1b[H cleared"  # the data itself is unchanged
    assert doc["error"]["message"].startswith("Error: bad \x1b[31mred")


def test_lone_surrogates_print_in_both_modes_through_a_real_utf8_stdout(tmp_path):
    program = write(tmp_path, "surrogate.js", 'console.log("half \\ud800 log"); return {s: "\\udc00 result"};')
    for extra in ([], ["--json"]):
        done = subprocess.run(
            [sys.executable, "-m", "nous_sched", "run", program, "--tools", TOOLS, *extra],
            capture_output=True,
            timeout=120,
            env={"PYTHONIOENCODING": "utf-8", "PATH": "/usr/bin:/bin"},
            cwd=ROOT,
        )
        assert done.returncode == 0, done.stderr.decode()
        out = done.stdout.decode("utf-8")  # strict: the output is valid UTF-8
        assert "Traceback" not in done.stderr.decode()
        if extra:  # strict JSON: a lone surrogate is U+FFFD
            doc = json.loads(out)
            assert doc["logs"] == ["half \ufffd log"] and doc["result"] == {"s": "\ufffd result"}
        else:  # shown as an escape
            assert "\\ud800" in out and "\\udc00" in out


def test_the_timeline_after_a_timeout_spans_the_whole_run(capsys, tmp_path):
    tools = write(
        tmp_path,
        "hangtools.py",
        """
        import threading
        from nous_sched import Tool

        RELEASE = threading.Event()
        TOOLS = [Tool("quick", lambda a: 1), Tool("hang", lambda a: RELEASE.wait(60))]
        """,
    )
    program = write(tmp_path, "hang.js", "await tools.quick({}); await tools.hang({});")
    try:
        assert main(["run", program, "--tools", tools, "--timeout", "0.5"]) == 1
    finally:
        sys.modules["_nous_sched_tools_hangtools"].RELEASE.set()
    out, _ = capsys.readouterr()
    assert out.startswith("error (timeout)")
    took = float(re.search(r"run took ([\d.]+) ms", out).group(1))
    axis = float(out.rstrip().splitlines()[-2].split()[-1])  # the axis' end, above the legend
    assert took >= 500 and axis == took
    hang_row = next(line for line in out.splitlines() if " hang " in line)
    assert hang_row.rstrip().endswith("?|")  # abandoned: drawn to the end of the run


def test_version(capsys):
    assert main(["--version"]) == 0
    out, _ = capsys.readouterr()
    assert out.strip() == f"nous-sched {__version__}"


def test_a_null_result_comes_with_a_hint(capsys, tmp_path):
    for text in ("", "const x = 1;", "return undefined", "return null"):
        program = write(tmp_path, "empty.js", text)
        assert main(["run", program, "--tools", TOOLS]) == 0
        out, _ = capsys.readouterr()
        assert out.startswith("result:\n  null\n  " + NULL_HINT + "\n")
    program = write(tmp_path, "one.js", "return 1")
    assert main(["run", program, "--tools", TOOLS]) == 0
    assert NULL_HINT not in capsys.readouterr().out


def test_json_output_lists_the_calls_the_gate_refused(capsys, tmp_path):
    program = write(
        tmp_path, "refused.js", 'try { await tools.lookup_city({name: JSON.rawJSON("1e400")}) } catch (e) {}'
    )
    assert main(["run", program, "--tools", TOOLS, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["events"] == []
    assert [(r["name"], r["source"]) for r in doc["refused"]] == [("lookup_city", "code_mode")]
    assert doc["refused"][0]["message"].startswith("arguments cannot cross: $.name: inf is not JSON")


def test_human_output_lists_the_calls_the_gate_refused(capsys, tmp_path):
    program = write(
        tmp_path, "refused.js", 'try { await tools.lookup_city({name: JSON.rawJSON("1e400")}) } catch (e) {}'
    )
    assert main(["run", program, "--tools", TOOLS]) == 0
    out = capsys.readouterr().out
    assert "\nrefused by the gate (1):\n  lookup_city: arguments cannot cross: $.name: inf is not JSON" in out


def test_the_timeline_shows_a_wait_for_an_executor_thread():
    # Handed over at 0, taken up by a thread at 5 ms, ran to 8 ms, committed at 10 ms.
    waited = CallRecord(0, "slow", "parallel", 0.0, 0.008, 0.010, True, began=0.005)
    prompt = CallRecord(1, "fast", "parallel", 0.0, 0.010, 0.010, True, began=0.0)
    lines = format_trail([waited, prompt], width=10, span=0.010)
    bars = [line[line.index("|") + 1 : line.rindex("|")] for line in lines[1:3]]
    assert bars == ["-----###..", "##########"]
    assert lines[-1].endswith("- waiting for a thread")

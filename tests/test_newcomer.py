"""The rough edges a newcomer hit (issue 22, items 3-9), each with the fix's promise."""

from __future__ import annotations

import importlib.util

import pytest

from nous_sched import ConfigError, QuickJSRuntime, RunCodeError, Tool, WorkerPool, run_code, visible_tools
from nous_sched.runtime.syntax import unclosed

RUNTIMES = [QuickJSRuntime(), None]
IDS = ["in_process", "worker"]


# -- 3. syntax errors name what the program wrote ------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES, ids=IDS)
@pytest.mark.parametrize(
    "program, said",
    [
        ("return [1, 2", "the program ends before the '[' opened at <input>:1:8 is closed (expected ']')"),
        ("const o = {\n  a: [1, 2],\n  b: f(3", "the '(' opened at <input>:3:7 is closed (expected ')')"),
        ("return `total ${[1].map((x) => x", "the '(' opened at <input>:1:24 is closed (expected ')')"),
        ("return 1 +", "the program ends in the middle of a statement or expression"),
        ("return [1, 2]\n}", "the '}' at <input>:2:1 closes a bracket the program never opened"),
    ],
)
def test_a_truncated_program_is_told_about_its_own_text(runtime, program, said):
    result = run_code(program, description="truncated", runtime=runtime)
    assert result.error.kind == "exception"
    message = result.error.message
    assert message.startswith("SyntaxError: ") and said in message
    lines = program.split("\n")
    # Never a line past the program's end, never the wrapper's token.
    assert f"<input>:{len(lines) + 1}:" not in message and "Unexpected token '}'" not in message


def test_a_syntax_error_inside_the_program_is_reported_as_the_engine_said():
    result = run_code('let s = "abc', description="unclosed string", runtime=QuickJSRuntime())
    assert result.error.message.startswith("SyntaxError: unexpected end of string\n    at <input>:1:")


def test_the_scanner_skips_strings_comments_regexes_and_template_text():
    assert unclosed("const a = '(['; // [\n/* { */ const r = /[(]/; return `${a}(`") is None
    assert unclosed("f(`${g(1)}`, {") == ("{", 1, 14)


# -- 7. spec details -----------------------------------------------------------------------------


def hide_quickjs(monkeypatch):
    """As if quickjs-ng were not installed: its `_quickjs` module cannot be found."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "_quickjs" else real(name, *a))


def test_both_degrades_to_native_when_no_runtime_can_start(monkeypatch):
    lookup = Tool("lookup", lambda args: 1)
    hide_quickjs(monkeypatch)
    assert [t.name for t in visible_tools("both", [lookup])] == ["lookup"]
    assert [t.name for t in visible_tools("native", [lookup])] == ["lookup"]
    with pytest.raises(RunCodeError) as raised:
        visible_tools("code", [lookup])
    assert "runtime=" in str(raised.value) and "nous_sched.CodeRuntime" in str(raised.value)
    with pytest.raises(RunCodeError, match="runtime=.*CodeRuntime"):
        run_code("return 1", description="no runtime")
    # An explicit runtime still works: only the default one needs quickjs-ng found.
    monkeypatch.undo()
    assert [t.name for t in visible_tools("both", [lookup])] == ["lookup", "run_code"]


def test_run_code_refuses_a_missing_description_as_a_config_error():
    with pytest.raises(ConfigError, match="run_code requires a `description`"):
        run_code("return 1", runtime=QuickJSRuntime())
    with pytest.raises(ConfigError, match="non-empty `description`"):
        run_code("return 1", description=" ", runtime=QuickJSRuntime())


# -- 5. Ctrl-C and cancel ------------------------------------------------------------------------

import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
READY_TOOLS = """\
import sys
from nous_sched import Tool

def ready(args):
    sys.stderr.write("ready\\n")
    sys.stderr.flush()
    return True

TOOLS = [Tool("ready", ready)]
"""


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spin_and_cancel(runtime, worker_pid=None):
    cancel = threading.Event()

    def cancel_once_spinning(spent: float) -> None:
        # The worker burns CPU only once its program has the answer and spins:
        # a cancel before that would find the run still waiting for the call.
        for _ in range(6000):
            if _cpu_seconds(worker_pid) - spent >= 0.2:
                break
            time.sleep(0.01)
        cancel.set()

    def ready(args):
        if worker_pid is None:
            cancel.set()  # the program is past its first step: the next one logs, then spins
        else:
            threading.Thread(target=cancel_once_spinning, args=(_cpu_seconds(worker_pid),)).start()
        return True

    started = time.monotonic()
    result = run_code(
        "console.log('before'); await tools.ready({}); console.log('spinning'); for (;;) {}",
        [Tool("ready", ready)],
        description="spin",
        runtime=runtime,
        cancel=cancel,
        timeout=60,
    )
    return result, time.monotonic() - started


def test_a_cancelled_in_process_run_stops_inside_a_javascript_loop_and_keeps_the_steps_logs():
    result, took = spin_and_cancel(QuickJSRuntime())
    assert result.error.kind == "cancelled"
    assert result.logs == ("before", "spinning")
    assert took < 10, took  # at once (about 20 ms), not at the 60 s deadline


def test_a_cancelled_worker_run_keeps_the_logs_of_the_step_in_progress():
    # The pool stops the program softly first (SIGUSR2), so the step's logs come back.
    with WorkerPool(size=1, spares=0) as pool:
        pool.prestart(1)
        (pid,) = pool.pids()
        result, took = spin_and_cancel(pool, worker_pid=pid)
    assert result.error.kind == "cancelled" and took < 30
    assert result.logs == ("before", "spinning")


def start_cli(tmp_path, runtime):
    (tmp_path / "ready_tools.py").write_text(READY_TOOLS)
    program = tmp_path / "spin.js"
    program.write_text("console.log('before'); await tools.ready({}); console.log('spinning'); for (;;) {}")
    command = [sys.executable, "-m", "nous_sched", "run", str(program), "--tools", str(tmp_path / "ready_tools.py")]
    command += ["--timeout", "60", "--no-progress", "--runtime", runtime]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr.readline() == "ready\n"
    return proc


def interrupt(proc, times):
    started = time.monotonic()
    try:
        for _ in range(times):
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return out, err, time.monotonic() - started


def test_ctrl_c_cancels_an_in_process_javascript_loop_and_prints_its_logs(tmp_path):
    out, err, took = interrupt(start_cli(tmp_path, "in-process"), 1)
    assert out.startswith("error (cancelled):\n  the run was cancelled"), (out, err)
    assert "logs (2):\n  before\n  spinning" in out
    assert "Traceback" not in err and took < 10


@pytest.mark.parametrize("runtime", ["in-process", "worker"])
def test_a_second_ctrl_c_interrupts_at_once(tmp_path, runtime):
    proc = start_cli(tmp_path, runtime)
    out, err, took = interrupt(proc, 2)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and took < 10


def test_run_help_lists_every_exit_status(capsys):
    from nous_sched.cli import main

    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for status in ("0 success", "1 the program failed", "2 usage", "130 interrupted"):
        assert status in text


# -- 6. install hints in the one form that works -------------------------------------------------

import re  # noqa: E402

HINT = re.compile(r"pip\s+install\s+(?P<args>[^`\"\n)]*(?:\n\s*'[^`\n]*)?)")


def hint_sources():
    for pattern in ("nous_sched/**/*.py", "examples/*.py", "benchmarks/*.py", "*.rst", "benchmarks/*.rst"):
        for path in ROOT.glob(pattern):
            # The changelog quotes the old form it replaced; _extras.py builds the command each error
            # names for how the library was installed (tests/test_extras.py), and says which in its docstring.
            if path.name not in ("CHANGELOG.rst", "_extras.py"):
                yield path


def test_every_install_hint_uses_the_form_that_works_from_a_checkout():
    """A fresh venv: ``pip install -e '.[mcp]'`` from a checkout installs (checked by hand, see
    CHANGELOG); ``pip install 'nous_sched[mcp]'`` fails, nous_sched not being on an index."""
    seen = 0
    for path in hint_sources():
        for found in HINT.finditer(path.read_text(encoding="utf-8")):
            args = " ".join(found.group("args").split())
            seen += 1
            assert "nous_sched[" not in args and "nous-sched[" not in args, (path, args)
            if args.startswith("-e"):
                assert re.match(r"-e (\.|'\.\[[a-z,{}-]+\]')[ ,.']", args + " "), (path, args)
    assert seen > 10
    from nous_sched._extras import install_command
    from nous_sched.integrations._common import require

    with pytest.raises(ConfigError, match=re.escape(install_command("x"))):
        require("no_such_module_anywhere", "x", "adapter")


# -- 8. SDK rendering ----------------------------------------------------------------------------

from nous_sched import function_tool, sdk  # noqa: E402


@function_tool
def find(kinds: list[str] = ["doc"], limit: int = 10, *, query: str) -> list[str]:
    """Find things.

    Args:
        query: What to look for.
        limit: How many at most.
    """
    return []


def test_required_properties_come_first_and_defaults_are_shown():
    out = sdk.render([find])
    assert out.index('"query": string') < out.index('"kinds"?:') < out.index('"limit"?:')
    assert "/** How many at most. (default: 10) */" in out
    assert '/** default: ["doc"] */' in out
    python = sdk.render([find], "python")
    assert '{"query": str, "kinds": NotRequired[list[str]], "limit": NotRequired[int]}' in python
    assert "#   limit: How many at most. (default: 10)" in python


def test_framework_tools_return_annotations_render_as_their_types():
    from agents import function_tool as agents_tool
    from langchain_core.tools import tool as langchain_tool

    from nous_sched import from_langchain, from_openai_agents

    @langchain_tool
    def count(text: str) -> int:
        """Count the words."""
        return len(text.split())

    @agents_tool
    def shout(text: str) -> str:
        """Shout."""
        return text.upper()

    out = sdk.render([from_langchain(count), from_openai_agents(shout)])
    assert '"count"(args: {\n    "text": string;\n  }): Promise<number>;' in out
    assert '"shout"(args: {\n    "text": string;\n  }): Promise<string>;' in out
    assert "Promise<unknown>" not in out

"""The rough edges a newcomer hit (issue 22, items 3-9), each with the fix's promise."""

from __future__ import annotations

import importlib.util

import pytest

from nous_sched import ConfigError, QuickJSRuntime, RunCodeError, Tool, run_code, visible_tools
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

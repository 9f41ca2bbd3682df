"""Line and column in every error the program sees are the program's own, on
every line (the host's wrapper shares the program's first line), and no frame
of the prelude shows; a failed tool call's stack is where the program called
it. The formatting hook is in ``runtime/prelude.js``.
"""

from __future__ import annotations

import pytest

from nous_sched import Tool, ToolError, run_code


def fail(args):
    raise ToolError("quota exceeded")


TOOLS = [Tool("echo", lambda args: args), Tool("fail", fail)]


@pytest.mark.parametrize(
    "program, where",
    [
        ("foo();", "    at program (<input>:1:1)"),
        ("   foo();", "    at program (<input>:1:4)"),
        ("const x = 1; foo();", "    at program (<input>:1:14)"),
        ("\nfoo();", "    at program (<input>:2:1)"),
        ("const a = 1;\n  const b = 2;\n    foo();", "    at program (<input>:3:5)"),
    ],
)
def test_a_thrown_error_is_located_on_the_programs_own_line_and_column(runtime, program, where):
    result = run_code(program, TOOLS, description="test")
    assert result.error.kind == "exception"
    assert result.error.message == "ReferenceError: foo is not defined\n" + where


def test_nested_functions_show_each_frame_in_program_coordinates(runtime):
    program = "function inner() { null.x; }\nfunction outer() { inner(); }\nouter();"
    result = run_code(program, TOOLS, description="test")
    assert result.error.message == (
        "TypeError: cannot read property 'x' of null\n"
        "    at inner (<input>:1:20)\n"
        "    at outer (<input>:2:20)\n"
        "    at program (<input>:3:1)"
    )


def test_a_syntax_error_on_line_one_has_the_programs_column(runtime):
    result = run_code("let x = ;", TOOLS, description="test")
    assert result.error.kind == "exception"
    assert result.error.message == "SyntaxError: unexpected token in expression: ';'\n    at <input>:1:9"


def test_the_stack_the_program_reads_is_in_its_own_coordinates_too(runtime):
    result = run_code("try { foo(); } catch (e) { return e.stack; }", TOOLS, description="test")
    assert result.result == "    at program (<input>:1:7)\n"


def test_an_uncaught_tool_error_names_the_tool_and_where_the_program_called_it(runtime):
    program = 'console.log("start");\nasync function lookup() {\n  return await tools.fail({});\n}\nawait lookup();'
    result = run_code(program, TOOLS, description="test")
    assert result.error.kind == "exception"
    assert (
        result.error.message
        == 'ToolError: quota exceeded (tool "fail")\n    at lookup (<input>:3:22)\n    at program (<input>:5:7)'
    )
    assert result.logs == ("start",)


def test_a_caught_tool_error_keeps_two_strings_and_its_stack_is_the_call_site(runtime):
    program = (
        "try { await tools.fail({}); } catch (e) { return [Object.keys(e), e.tool, e.message, e.stack, String(e)]; }"
    )
    result = run_code(program, TOOLS, description="test")
    assert result.result == [
        ["tool"],
        "fail",
        "quota exceeded",
        "    at program (<input>:1:19)\n",
        "ToolError: quota exceeded",
    ]


def test_a_call_refused_in_the_sandbox_is_located_too(runtime):
    program = "const big = 'x'.repeat(100);\nawait tools.echo({big: 1n});"
    result = run_code(program, TOOLS, description="test")
    assert result.error.message == (
        'ToolError: arguments are not JSON: TypeError: BigInt are forbidden in JSON.stringify (tool "echo")\n'
        "    at program (<input>:2:13)"
    )


def test_a_logged_error_is_located_and_no_prelude_frame_shows(runtime):
    program = "try { await tools.echo({toJSON() { throw new Error('bad'); }}); } catch (e) { console.log(e); }\nconsole.log(new Error('here'));"
    result = run_code(program, TOOLS, description="test")
    assert result.ok, result.error
    assert result.logs == (
        'ToolError: arguments are not JSON: Error: bad (tool "echo")\n    at program (<input>:1:19)',
        "Error: here\n    at program (<input>:2:17)",  # QuickJS places `new X` at X
    )


def test_an_internal_error_with_no_message_is_the_memory_abort_it_usually_is(runtime):
    # QuickJS raises it when even the out-of-memory message cannot be
    # allocated; the prelude's stack hook must not turn it into a bare exception.
    result = run_code('throw new InternalError("");', TOOLS, description="test")
    assert result.error.kind == "abort"
    assert "memory limit" in result.error.message and "InternalError with no message" in result.error.message


def test_a_failed_calls_stack_keeps_the_frames_error_stack_trace_limit_lets_through(runtime):
    # The limit counts every frame from the call down, this file's own too (a
    # tool's three, sdk's four, state's five), as a capture of the whole stack
    # at the call would; whatever the limit, the program's frames shown are the
    # ones such a capture keeps.
    program = """
function dig(n, make) { if (n > 0) return dig(n - 1, make); return make(); }
const makes = {tool: () => tools.fail({}), sdk: () => sdk.describe(5), state: () => state.get(5)};
const out = [];
for (const limit of [10, 6, 5, 4, 3, 2.7, 0, -1, NaN, Infinity, "x", true]) {
  for (const depth of [0, 3, 12]) {
    for (const kind of ["tool", "sdk", "state"]) {
      Error.stackTraceLimit = limit;
      try { await dig(depth, makes[kind]); out.push("no error"); }
      catch (e) { out.push([String(limit), depth, kind, e.stack.split("\\n").filter(Boolean).length]); }
    }
  }
}
return out;
"""
    result = run_code(program, TOOLS, description="test")
    assert result.error is None, result.error
    own = {"tool": 3, "sdk": 4, "state": 5}
    # (The engine's reading of each limit: a fraction cut, a negative one or NaN 0, true 1, "x" 0.)
    effective = {"10": 10, "6": 6, "5": 5, "4": 4, "3": 3, "2.7": 2, "0": 0, "-1": 0, "NaN": 0, "Infinity": 10**6}
    effective.update({"x": 0, "true": 1})
    expected = []
    for limit, frames_let in effective.items():
        for depth in (0, 3, 12):
            for kind in ("tool", "sdk", "state"):
                frames = depth + 3  # dig's depth + 1 frames, the arrow, program
                expected.append([limit, depth, kind, min(frames, max(frames_let - own[kind], 0))])
    assert result.result == expected

"""JavaScript programs end to end: ``run_code`` with the QuickJS runtime and real
Python tools.

Ordering is forced with Events (a tool blocks on its own gate; a controller
thread opens the gates in a chosen order), never with sleeps. The only sleeps
are the tiny random delays inside tools in the determinism test, which create
varied finish orders and are never relied on for any assertion. Timeout tests
use deadlines of one second or less.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nous_sched import ConfigError, Limits, PermissionPolicy, Tool, ToolError, run_code
from nous_sched.result._hints import NOTHING_RETURNED

# Every test runs against both runtimes (conftest.py `runtime`).
pytestmark = pytest.mark.usefixtures("runtime")

WAIT = 10.0
MIB = 1024 * 1024


def echo(name="echo", **kw):
    return Tool(name=name, function=lambda args: args, **kw)


def safe(name, fn):
    return Tool(name=name, function=fn, concurrency_safe=lambda args: True)


class Recorder:
    """A tool body that records every argument object it receives."""

    def __init__(self, value="ok") -> None:
        self.lock = threading.Lock()
        self.calls: list = []
        self.value = value

    def __call__(self, args):
        with self.lock:
            self.calls.append(args)
        return self.value


# === fan-out: submission order whatever the finish order ===============================

N = 50

FAN_OUT = """
const log = [];
const calls = [];
for (let i = 0; i < 50; i++) {
  calls.push(tools.work({k: i}).then(v => { log.push(i); return v; }));
}
const results = await Promise.all(calls);
console.log("observed " + log.join(","));
return {results, log};
"""


def run_fan_out(order, make_event):
    """Run FAN_OUT with the 50 calls finishing exactly in ``order``."""
    gates = [make_event() for _ in range(N)]
    cond = threading.Condition()
    started: list = []
    finished: list = []
    problems: list = []

    def work(args):
        k = args["k"]
        with cond:
            started.append(k)
            cond.notify_all()
        if not gates[k].wait(WAIT):
            raise RuntimeError(f"gate {k} never opened")
        with cond:
            finished.append(k)
            cond.notify_all()
        return f"r{k}"

    def controller():
        try:
            with cond:
                if not cond.wait_for(lambda: len(started) == N, WAIT):
                    problems.append(f"only {len(started)} calls started")
                    return
            for k in order:
                gates[k].set()
                with cond:
                    if not cond.wait_for(lambda: k in finished, WAIT):
                        problems.append(f"call {k} did not finish")
                        return
        finally:
            for gate in gates:
                gate.set()

    thread = threading.Thread(target=controller, name="fan-out-controller")
    thread.start()
    try:
        result = run_code(FAN_OUT, [safe("work", work)], max_parallel=N, timeout=WAIT * 2, description="test")
    finally:
        thread.join(WAIT)
    assert not problems, problems
    assert finished == list(order), "the finish order was not the forced one"
    return result


def test_fan_out_of_50_is_in_submission_order_whatever_the_finish_order(make_event):
    rng = random.Random(20240601)
    shuffled_a = list(range(N))
    rng.shuffle(shuffled_a)
    shuffled_b = list(range(N))
    rng.shuffle(shuffled_b)
    orders = {
        "reversed": list(reversed(range(N))),
        "shuffled-a": shuffled_a,
        "shuffled-b": shuffled_b,
        "odds-then-evens": list(range(1, N, 2)) + list(range(0, N, 2)),
        "in-order": list(range(N)),
    }
    seen = []
    for label, order in orders.items():
        result = run_fan_out(order, make_event)
        assert result.ok, (label, result.error)
        assert result.result["results"] == [f"r{k}" for k in range(N)], label
        # The program's own observation order (each .then pushes) is submission order.
        assert result.result["log"] == list(range(N)), label
        assert result.logs == ("observed " + ",".join(map(str, range(N))),)
        assert [(e.seq, e.tool, e.arguments, e.mode) for e in result.calls] == [
            (k, "work", {"k": k}, "parallel") for k in range(N)
        ]
        # (run_fan_out checked the calls finished in the forced order.) They
        # committed in submission order all the same.
        assert [r.seq for r in sorted(result.trail, key=lambda r: r.committed)] == list(range(N))
        seen.append((result.result, result.logs, [(e.tool, e.arguments) for e in result.calls]))
    assert all(s == seen[0] for s in seen)


# === errors inside the program ========================================================


def test_program_catches_tool_error_and_goes_on():
    def fail(args):
        raise ToolError(f"no record {args['id']}")

    program = """
    const out = [];
    try {
      await tools.fail({id: 7});
      out.push("not reached");
    } catch (e) {
      out.push([e instanceof ToolError, e instanceof Error, e.name, e.tool, e.message]);
    }
    out.push(await tools.echo({after: true}));
    return out;
    """
    result = run_code(program, [Tool("fail", fail), echo()], description="test")
    assert result.ok, result.error
    assert result.result == [[True, True, "ToolError", "fail", "no record 7"], {"after": True}]
    assert [e.tool for e in result.calls] == ["fail", "echo"]
    assert [r.ok for r in result.trail] == [False, True]


def test_uncaught_tool_error_fails_the_run_as_an_exception():
    def fail(args):
        raise ToolError("quota exceeded")

    result = run_code("console.log('start'); await tools.fail({})", [Tool("fail", fail)], description="test")
    assert result.error.kind == "exception"
    assert result.error.message.startswith("ToolError: quota exceeded")
    assert result.logs == ("start",)


def test_tool_raising_a_python_exception_shows_only_tool_and_message():
    def broken(args):
        def inner():
            raise ValueError("bad input")

        inner()

    program = """
    try { await tools.broken({}); }
    catch (e) {
      return {keys: Object.keys(e), tool: e.tool, message: e.message, text: String(e),
              json: JSON.stringify(e), stack: String(e.stack), own: Object.getOwnPropertyNames(e)};
    }
    """
    result = run_code(program, [Tool("broken", broken)], description="test")
    assert result.ok, result.error
    seen = result.result
    assert seen["tool"] == "broken"
    assert seen["message"] == "bad input"
    assert seen["keys"] == ["tool"]
    assert seen["text"] == "ToolError: bad input"
    assert json.loads(seen["json"]) == {"tool": "broken"}
    everything = json.dumps(seen)
    for leak in ("Traceback", 'File "', ".py", "ValueError", "inner", "line "):
        assert leak not in everything, leak


def test_tool_exceptions_of_any_class_become_two_strings():
    def key_error(args):
        raise KeyError("missing")

    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("cannot print")

    def unprintable(args):
        raise Unprintable()

    def empty(args):
        raise RuntimeError()

    program = """
    const out = [];
    for (const n of ["key_error", "unprintable", "empty"]) {
      try { await tools[n]({}); } catch (e) { out.push([e.tool, e.message]); }
    }
    return out;
    """
    tools = [Tool("key_error", key_error), Tool("unprintable", unprintable), Tool("empty", empty)]
    result = run_code(program, tools, description="test")
    assert result.result == [
        ["key_error", "'missing'"],
        ["unprintable", "tool call failed"],
        ["empty", "tool call failed"],
    ]


def test_tool_returning_non_json_is_a_tool_error_mentioning_json():
    tools = [
        Tool("obj", lambda a: object()),
        Tool("nan", lambda a: float("nan")),
        Tool("bad_key", lambda a: {1j: 2}),
    ]
    program = """
    const out = [];
    for (const n of ["obj", "nan", "bad_key"]) {
      try { await tools[n]({}); out.push("no error"); } catch (e) { out.push([e instanceof ToolError, e.tool, e.message]); }
    }
    return out;
    """
    result = run_code(program, tools, description="test")
    assert result.ok, result.error
    for (is_tool_error, tool, message), name in zip(result.result, ["obj", "nan", "bad_key"]):
        assert is_tool_error is True and tool == name
        assert "JSON" in message, message


def test_tool_values_round_trip_exactly():
    values = {
        "big": 2**40,
        "max_safe": 2**53 - 1,  # Number.MAX_SAFE_INTEGER: the largest int that crosses
        "neg": -(2**31) - 1,
        "f": 0.1,
        "s": "é\x00\u2028😀",
        "nested": {"a": [1, None, True, {"b": []}]},
    }
    tools = [Tool("v", lambda a: values)]
    result = run_code("const v = await tools.v({}); return [v, v.s.length]", tools, description="test")
    assert result.result == [values, 5]  # "😀" is two UTF-16 units


# === resource limits =================================================================


def test_infinite_loop_times_out_and_keeps_earlier_logs():
    t0 = time.monotonic()
    result = run_code("console.log('before'); console.log('the loop'); while (true) {}", timeout=1, description="test")
    elapsed = time.monotonic() - t0
    assert result.error.kind == "timeout"
    assert "1s deadline" in result.error.message
    assert result.logs == ("before", "the loop")
    # A generous bound: the engine's limit is CPU time, so a loaded machine
    # stretches it (see test_runaway_loop_deadline_is_wall_clock_under_contention).
    assert elapsed < 1 + 10


def test_infinite_loop_cannot_swallow_the_interrupt():
    result = run_code(
        "try { while (true) {} } catch (e) { return 'swallowed' } finally { return 'finally' }",
        timeout=0.5,
        description="test",
    )
    assert result.error.kind == "timeout"
    assert result.result is None


def test_endless_promise_chain_times_out():
    t0 = time.monotonic()
    result = run_code("console.log('x'); while (true) { await null; }", timeout=0.5, description="test")
    assert result.error.kind == "timeout"
    assert result.logs == ("x",)
    assert time.monotonic() - t0 < 0.5 + 2.5


def test_unbounded_allocation_aborts_and_the_next_run_works():
    limits = Limits(timeout=10, memory_bytes=32 * MIB)
    for program in (
        "const a = []; while (true) a.push([a.length]);",
        "const a = []; while (true) a.push({i: a.length, s: 'x' + a.length});",
    ):
        result = run_code("console.log('allocating'); " + program, limits=limits, description="test")
        assert result.error.kind == "abort", result.error
        assert "memory" in result.error.message
        assert "32 MiB" in result.error.message
        assert result.logs == ("allocating",)
    # The process is fine: the next runs work, with and without tools.
    assert run_code("return 1 + 1", description="test").result == 2
    assert run_code("return await tools.echo({a: 1})", [echo()], limits=limits, description="test").result == {"a": 1}


def test_unbounded_allocation_in_a_program_that_mentions_null_aborts():
    limits = Limits(timeout=10, memory_bytes=16 * MIB)
    kinds = [
        run_code(
            "let last = null; const a = []; while (true) a.push([a.length]);", limits=limits, description="test"
        ).error.kind
        for _ in range(3)
    ]
    assert kinds == ["abort"] * 3


def test_a_bare_null_exception_is_reported_as_memory_with_both_readings():
    # QuickJS throws a bare null when it cannot allocate the out-of-memory
    # error, and nothing afterwards tells that from `throw null`: the runtime
    # reports an abort whose message names both readings.
    result = run_code("throw JSON.parse('nu' + 'll');", description="test")
    assert result.error.kind == "abort"
    assert "memory limit" in result.error.message
    assert "threw a bare null" in result.error.message


def test_unbounded_recursion_aborts():
    result = run_code("console.log('deep'); function f(n) { return f(n + 1) + 1; } return f(0);", description="test")
    assert result.error.kind == "abort"
    assert "stack" in result.error.message
    assert result.logs == ("deep",)
    result = run_code("const f = async (n) => 1 + await f(n + 1); return await f(0);", description="test")
    assert result.error.kind == "abort"
    assert run_code("return 'fine'", description="test").result == "fine"


def _log_bytes(logs) -> int:
    return sum(len(line.encode("utf-8")) for line in logs)


def test_ten_megabytes_of_logs_are_truncated_with_a_marker():
    # 100,000 lines of 105 bytes: 10.5 MB, over 10 MiB.
    result = run_code(
        "const line = 'x'.repeat(105); for (let i = 0; i < 100000; i++) console.log(line); return 'done'",
        description="test",
    )
    assert result.ok and result.result == "done"
    assert "truncated" in result.logs[-1]
    assert not any("truncated" in line for line in result.logs[:-1])
    assert _log_bytes(result.logs[:-1]) <= 1_000_000
    assert _log_bytes(result.logs) <= 1_000_000 + 200
    assert result.logs[0] == "x" * 105


def test_logs_exactly_at_the_budget_have_no_marker():
    # Each line costs its bytes plus one: 998 + 2 is the whole 1000.
    result = run_code(
        "console.log('x'.repeat(997)); console.log('y');", limits=Limits(max_log_bytes=1000), description="test"
    )
    assert result.logs == ("x" * 997, "y")
    result = run_code(
        "console.log('x'.repeat(997)); console.log('yz');", limits=Limits(max_log_bytes=1000), description="test"
    )
    assert result.logs[:2] == ("x" * 997, "y") and "truncated" in result.logs[-1]


def test_log_limit_is_in_utf8_bytes():
    result = run_code(
        "for (let i = 0; i < 1000; i++) console.log('€€€€€€€€€€');",
        limits=Limits(max_log_bytes=3000),
        description="test",
    )
    assert "truncated" in result.logs[-1]
    assert _log_bytes(result.logs[:-1]) <= 3000
    assert result.logs[0] == "€" * 10


def test_a_single_ten_megabyte_log_line_is_truncated_with_a_marker():
    # (A line cut to exactly the remaining budget once lost its marker: prelude.js emit().)
    result = run_code("console.log('x'.repeat(10 * 1024 * 1024)); return 'done'", description="test")
    assert result.result == "done"
    assert _log_bytes(result.logs) <= 1_000_000 + 200
    assert "truncated" in result.logs[-1]
    assert result.logs[0] == "x" * len(result.logs[0]) and len(result.logs) == 2


def test_tool_that_hangs_past_the_deadline_times_out_promptly(make_event):
    gate = make_event()
    entered = make_event()

    def hangs(args):
        entered.set()
        gate.wait(WAIT * 3)
        return "too late"

    t0 = time.monotonic()
    result = run_code(
        "console.log('calling'); return await tools.hangs({})", [Tool("hangs", hangs)], timeout=0.5, description="test"
    )
    elapsed = time.monotonic() - t0
    assert entered.is_set()
    assert result.error.kind == "timeout"
    assert "waiting for tool 'hangs' (call 0) to return" in result.error.message
    assert result.logs == ("calling",)
    assert [e.tool for e in result.calls] == ["hangs"]
    assert elapsed < 0.5 + 2.0


def test_program_awaiting_a_never_settled_promise_is_a_clear_error():
    t0 = time.monotonic()
    result = run_code(
        "console.log('waiting'); await new Promise(() => {}); return 'unreachable'", timeout=WAIT, description="test"
    )
    assert result.error.kind == "exception"
    assert "nothing will ever settle" in result.error.message
    assert result.logs == ("waiting",)
    assert time.monotonic() - t0 < 3.0
    # Also after some real calls.
    result = run_code("await tools.echo({}); await new Promise(() => {})", [echo()], timeout=WAIT, description="test")
    assert result.error.kind == "exception" and "settle" in result.error.message
    assert len(result.calls) == 1


# === sandbox =============================================================================

BRIDGE_LIKE = re.compile(r"bridge|settle|drain|outbox|nous|host|python|submit|pending|waiting|__", re.I)


def test_globals_expose_no_bridge():
    result = run_code("return Object.getOwnPropertyNames(globalThis)", description="test")
    names = result.result
    assert {"tools", "console", "ToolError"} <= set(names)
    assert [n for n in names if BRIDGE_LIKE.search(n)] == []
    # Nothing hidden under a symbol either, and `tools` holds only tool functions.
    result = run_code(
        "return [Object.getOwnPropertySymbols(globalThis).map(String), Object.getOwnPropertyNames(tools),"
        " Object.getPrototypeOf(tools), Object.isFrozen(tools), Object.getOwnPropertyNames(console).sort()]",
        [echo()],
        description="test",
    )
    symbols, tool_names, proto, frozen, console_names = result.result
    assert [s for s in symbols if BRIDGE_LIKE.search(s)] == []
    assert tool_names == ["echo"] and proto is None and frozen is True
    assert console_names == ["debug", "error", "info", "log", "warn"]


def test_program_cannot_replace_tools_console_or_tool_error():
    program = """
    const fake = async () => "forged";
    globalThis.tools = {echo: fake};
    tools.echo = fake;
    console.log = () => {};
    globalThis.console = {log() {}};
    ToolError = class Fake {};
    delete globalThis.tools;
    const strict = [];
    for (const attempt of [
      () => { "use strict"; globalThis.tools = {}; },
      () => { "use strict"; tools.echo = fake; },
      () => Object.defineProperty(globalThis, "tools", {value: {}}),
      () => Object.defineProperty(tools, "extra", {value: fake}),
      () => { "use strict"; ToolError.prototype.tool = "x"; },
    ]) {
      try { attempt(); strict.push("allowed"); } catch (e) { strict.push(e.constructor.name); }
    }
    console.log("still logging");
    let caught;
    try { await tools.fail({}); } catch (e) { caught = [e instanceof ToolError, e.tool]; }
    return [await tools.echo({real: true}), strict, caught];
    """

    def fail(args):
        raise ToolError("real failure")

    result = run_code(program, [echo(), Tool("fail", fail)], description="test")
    assert result.ok, result.error
    assert result.result == [{"real": True}, ["TypeError"] * 5, [True, "fail"]]
    assert result.logs == ("still logging",)
    assert [e.tool for e in result.calls] == ["fail", "echo"]


def test_program_cannot_reach_the_host():
    program = """
    const out = {};
    out.types = [typeof require, typeof std, typeof os, typeof process, typeof Deno, typeof module,
                 typeof __nous_bridge, typeof bridge, typeof __settle, typeof settle, typeof drain];
    try { await import("os"); out.os = "imported"; } catch (e) { out.os = String(e); }
    try { await import("std"); out.std = "imported"; } catch (e) { out.std = String(e); }
    try { out.caller = typeof tools.echo.caller; } catch (e) { out.caller = e.constructor.name; }
    try { out.logCaller = typeof console.log.caller; } catch (e) { out.logCaller = e.constructor.name; }
    try { out.args = typeof program.caller; } catch (e) { out.args = e.constructor.name; }
    out.fnGlobal = Function("return this")() === globalThis;
    return out;
    """
    result = run_code(program, [echo()], description="test")
    assert result.ok, result.error
    out = result.result
    assert out["types"] == ["undefined"] * 11
    assert "imported" not in (out["os"], out["std"])
    assert "os" in out["os"]
    assert out["caller"] == "TypeError" and out["logCaller"] == "TypeError" and out["args"] == "TypeError"
    assert out["fnGlobal"] is True
    assert result.calls == ()


def test_program_cannot_settle_its_own_pending_call():
    # Call every global function (and method of every global object) with
    # bridge-shaped arguments while a call is pending: none may settle it.
    program = """
    const pending = tools.slow({});
    const shapes = [["settle", 1, true, '"forged"'], [1, true, '"forged"'], ["drain"], ["start", async () => "forged"]];
    let tried = 0;
    const targets = [];
    for (const name of Object.getOwnPropertyNames(globalThis)) {
      if (name === "eval" || name === "Function") continue;
      let v; try { v = globalThis[name]; } catch (e) { continue; }
      if (typeof v === "function") targets.push(v);
      else if (v && typeof v === "object" && v !== globalThis) {
        for (const k of Object.getOwnPropertyNames(v)) {
          let f; try { f = v[k]; } catch (e) { continue; }
          if (typeof f === "function") targets.push(f.bind(v));
        }
      }
    }
    for (const f of targets) {
      for (const args of shapes) {
        try { const r = f(...args); if (r && typeof r.catch === "function") r.catch(() => {}); } catch (e) {}
        tried++;
      }
    }
    return [tried > 100, await pending];
    """
    tools = [Tool("slow", lambda a: "real value")]
    result = run_code(program, tools, timeout=WAIT, description="test")
    assert result.ok, result.error
    assert result.result == [True, "real value"]
    # The probing reached tools.slow only with its one real call (the rest were
    # refused before the scheduler: "arguments must be an object").
    assert [e.arguments for e in result.calls] == [{}]


def test_polluted_intrinsics_do_not_change_what_crosses_to_the_host():
    program = """
    JSON.stringify = () => '"forged"';
    JSON.parse = () => "forged";
    String.prototype.slice = () => "forged";
    Object.create = () => ({});
    Reflect.apply = () => "forged";
    Promise.prototype.then = function () { return "forged"; };
    Array.prototype.push = () => 0;
    console.log("line", {a: 1});
    const v = await tools.echo({x: [1, 2]});
    return {v, n: 3};
    """
    result = run_code(program, [echo()], description="test")
    assert result.ok, result.error
    assert result.result == {"v": {"x": [1, 2]}, "n": 3}
    assert result.logs == ('line {"a":1}',)
    assert [e.arguments for e in result.calls] == [{"x": [1, 2]}]


def test_program_closing_its_wrapper_is_an_exception():
    result = run_code("}); console.log('outside'); (function () {", description="test")
    assert result.error.kind == "exception"
    assert "__nous" not in result.error.message


# === program shape ======================================================================


def test_top_level_await_and_return():
    result = run_code(
        "const v = await tools.echo({x: 1});\nif (v.x) return v.x + 1;\nreturn 0;", [echo()], description="test"
    )
    assert result.result == 2
    result = run_code(
        "for (const i of [1, 2, 3]) { if (i === 2) return 'early ' + i; }\nreturn 'late';", description="test"
    )
    assert result.result == "early 2"


@pytest.mark.parametrize("program", ["return undefined", "return", "", "void 0", "return void 0", "// only a comment"])
def test_undefined_result_is_none(program):
    result = run_code(program, description="test")
    assert result.ok and result.result is None
    # The model is told, with the fix (nous_sched.result._hints).
    assert result.to_dict() == {"logs": [], "result": None, "hint": NOTHING_RETURNED}


def test_a_last_expression_is_the_result_and_return_wins():
    assert run_code("1 + 1", description="test").result == 2
    assert run_code("const a = [1, 2];\na.length // the count", description="test").result == 2
    assert run_code("if (true) return 'early'\n'late'", description="test").result == "early"
    # A statement that is not an expression gives nothing, as before.
    assert run_code("const a = 1", description="test").result is None


def test_syntax_error_is_an_exception():
    result = run_code("console.log('never');\nconst = 5;", description="test")
    assert result.error.kind == "exception"
    assert "SyntaxError" in result.error.message
    assert result.logs == ()
    assert result.calls == ()


@pytest.mark.parametrize(
    "thrown, message",
    [
        ("'a string'", 'Uncaught "a string"'),
        ("42", "Uncaught 42"),
        ("undefined", "Uncaught undefined"),
        ("{code: 7}", 'Uncaught {"code":7}'),
        ("Symbol('s')", "Uncaught Symbol(s)"),
        ("10n", "Uncaught 10n"),
        ("[1, 2]", "Uncaught [1,2]"),
    ],
)
def test_throwing_non_error_values_is_an_exception(thrown, message):
    result = run_code(f"console.log('pre'); throw {thrown};", description="test")
    assert result.error.kind == "exception"
    assert result.error.message == message
    assert result.logs == ("pre",)


def test_throwing_errors_keeps_name_message_and_stack():
    result = run_code(
        "class MyError extends Error { get name() { return 'MyError'; } }\nthrow new MyError('custom');",
        description="test",
    )
    assert result.error.kind == "exception"
    assert result.error.message.startswith("MyError: custom")
    assert ":2:" in result.error.message
    assert "__nous" not in result.error.message


@pytest.mark.parametrize(
    "returned, mentions",
    [
        ("() => 1", "function"),
        ("Symbol('x')", "symbol"),
        ("{get boom() { throw new Error('getter'); }}", "getter"),
    ],
)
def test_returning_values_without_json_form_is_invalid_output(returned, mentions):
    result = run_code(f"console.log('kept'); return {returned};", description="test")
    assert result.error.kind == "invalid_output", result.error
    assert mentions in result.error.message
    assert result.logs == ("kept",)


def test_json_semantics_of_results():
    result = run_code(
        "return {f: () => 1, u: undefined, d: new Date(0), n: NaN, m: new Map([[1, 2]]), a: [undefined], "
        "b: 10n, c: (() => { const a = {}; a.self = a; return a; })()}",
        description="test",
    )
    assert result.result == {
        "d": "1970-01-01T00:00:00.000Z",
        "n": None,
        "m": [[1, 2]],
        "a": [None],
        "b": "10",
        "c": {"self": None},
    }
    # Each conversion is said, by its path (nous_sched.result._hints has the rule).
    for said in ("$.f: a function", "$.u: undefined, dropped", "$.d: a Date", "$.n: NaN", "$.m: a Map with keys"):
        assert said in result.hint, said
    assert "$.a[0]: undefined, sent as null" in result.hint and "$.c.self: a reference back" in result.hint
    # At most eight notes are listed; the rest are counted.
    result = run_code("return Array.from({length: 11}, () => NaN)", description="test")
    assert result.result == [None] * 11 and "$[7]: NaN" in result.hint and "; and 3 more." in result.hint


def test_huge_result_is_an_output_limit():
    result = run_code("console.log('made it'); return 'x'.repeat(2000000);", description="test")
    assert result.error.kind == "output_limit"
    assert "1000000" in result.error.message
    assert result.logs == ("made it",)
    # The limit counts UTF-8 bytes of the JSON, not characters.
    limits = Limits(max_output_bytes=1000)
    assert run_code("return '€'.repeat(300)", limits=limits, description="test").result == "€" * 300
    result = run_code("return '€'.repeat(500)", limits=limits, description="test")
    assert result.error.kind == "output_limit"
    assert "1502 bytes" in result.error.message


def test_line_numbers_are_the_programs_own():
    result = run_code("const a = 1;\nconst b = 2;\nthrow new Error('line three');", description="test")
    assert result.error.message.startswith("Error: line three")
    assert ":3:" in result.error.message
    result = run_code("function f() {\n  throw new Error('in f');\n}\n\nf();", description="test")
    assert ":2:" in result.error.message and ":5:" in result.error.message
    result = run_code("const a = 1;\nconst b = 2;\nconst c = ;", description="test")
    assert "SyntaxError" in result.error.message and ":3:" in result.error.message


def test_console_methods_and_formatting():
    program = """
    console.log("a", 1, {b: [2]}, null, undefined, true);
    console.info("info");
    console.debug("debug");
    console.warn("careful");
    console.error(new TypeError("bad"));
    console.log(Symbol("s"), 10n, () => 1);
    """
    result = run_code(program, description="test")
    assert result.logs[:4] == ('a 1 {"b":[2]} null undefined true', "info", "debug", "[warn] careful")
    # An Error logs as "Name: message" plus its stack, from the program's own line.
    assert result.logs[4].startswith("[error] TypeError: bad\n    at program (<input>:6:")
    assert result.logs[5].startswith("Symbol(s) 10")


# === floating calls =====================================================================


def test_floating_call_before_awaited_work_runs_and_is_logged():
    rec = Recorder("floated")
    result = run_code(
        "tools.side({n: 1}); return await tools.echo({n: 2});", [Tool("side", rec), echo()], description="test"
    )
    assert result.ok and result.result == {"n": 2}
    assert rec.calls == [{"n": 1}]
    assert [(e.tool, e.seq) for e in result.calls] == [("side", 0), ("echo", 1)]


def test_floating_call_at_the_end_does_not_hold_the_run():
    t0 = time.monotonic()
    result = run_code("tools.echo({x: 1}); return 'done';", [echo()], description="test")
    assert result.ok and result.result == "done"
    assert time.monotonic() - t0 < 3.0


def test_floating_call_at_the_end_still_logs_its_event():
    rec = Recorder()
    for _ in range(5):
        result = run_code("tools.side({x: 1}); return 'done';", [Tool("side", rec)], description="test")
        assert result.result == "done"
        assert [e.tool for e in result.calls] == ["side"]


# === arguments and names ===============================================================


def test_tool_names_that_are_not_identifiers():
    names = ["odd-name", "has space", "é", "__proto__", "constructor", "then", "0", 'q"uote']
    tools = [Tool(n, lambda a, n=n: f"I am {n}") for n in names]
    program = "return await Promise.all(NAMES.map(n => tools[n]({})))".replace("NAMES", json.dumps(names))
    result = run_code(program, tools, description="test")
    assert result.ok, result.error
    assert result.result == [f"I am {n}" for n in names]
    assert [e.tool for e in result.calls] == names


def test_tool_named_like_a_prelude_placeholder_is_reachable():
    tools = [Tool("__MAX_LOG_UNITS__", lambda a: "reached")]
    result = run_code("return await tools['__MAX_LOG_UNITS__']({})", tools, description="test")
    assert result.result == "reached"


def test_undefined_or_null_args_become_an_empty_object():
    rec = Recorder()
    result = run_code(
        "await tools.t(); await tools.t(undefined); await tools.t(null); await tools.t({});",
        [Tool("t", rec)],
        description="test",
    )
    assert result.ok, result.error
    assert rec.calls == [{}, {}, {}, {}]
    assert [e.arguments for e in result.calls] == [{}, {}, {}, {}]


@pytest.mark.parametrize("args, shown", [("5", "5"), ('"x"', '"x"'), ("[1]", "[1]"), ("true", "true")])
def test_non_object_args_are_a_tool_error(args, shown):
    rec = Recorder()
    program = f"try {{ await tools.t({args}); }} catch (e) {{ return [e instanceof ToolError, e.tool, e.message]; }}"
    result = run_code(program, [Tool("t", rec)], description="test")
    assert result.result == [True, "t", f"arguments must be an object, got {shown}"]
    assert rec.calls == []
    assert result.calls == ()


@pytest.mark.parametrize(
    "args, mentions",
    [("{n: 10n}", "BigInt"), ("(() => { const a = {}; a.a = a; return a; })()", "circular")],
)
def test_non_json_args_are_a_tool_error(args, mentions):
    rec = Recorder()
    program = f"try {{ await tools.t({args}); }} catch (e) {{ return [e instanceof ToolError, e.tool, e.message]; }}"
    result = run_code(program, [Tool("t", rec)], description="test")
    tool_error, tool, message = result.result
    assert tool_error is True and tool == "t"
    assert message.startswith("arguments are not JSON") and mentions in message
    assert rec.calls == []
    assert result.calls == ()


def test_each_call_gets_its_own_copy_of_the_arguments():
    def mutate(args):
        args["mutated"] = True
        return args

    result = run_code(
        "const a = {n: 1}; const r = await tools.m(a); return [a, r];", [Tool("m", mutate)], description="test"
    )
    assert result.result == [{"n": 1}, {"n": 1, "mutated": True}]
    assert result.calls[0].arguments == {"n": 1}


def test_denied_tool_inside_js_is_declared_but_refused():
    rec = Recorder()
    result = run_code(
        "try { await tools.t({}) } catch (e) { return [Object.keys(tools), e.message] }",
        [Tool("t", rec)],
        policy=PermissionPolicy(deny=["t"]),
        description="test",
    )
    assert result.result == [["t"], 'tool "t" is denied by the permission policy']
    assert rec.calls == [] and result.calls == ()


def test_result_with_a_lone_surrogate_is_data_not_a_crash():
    result = run_code("return '\\ud800';", description="test")
    assert result.error is None or result.error.kind == "invalid_output"


def test_tool_echoing_a_lone_surrogate_back_to_the_program():
    result = run_code(
        "const r = await tools.echo({s: '\\ud800'}); return r.s.charCodeAt(0);", [echo()], description="test"
    )
    assert result.result == 0xD800


# === determinism =========================================================================

MIXED = """
const a = await tools.step({n: "a"});
console.log("first", a);
const fan = await Promise.all(["b1", "b2", "b3", "b4", "b5", "b6"].map(
  n => tools.step({n}).then(v => { console.log("then", v); return v; })));
console.log("fan", fan.join(","));
const c = await tools.step({n: "c"});
const more = [];
for (const n of ["d1", "d2"]) more.push(await tools.step({n}));
const race = await Promise.race([tools.step({n: "r1"}), tools.step({n: "r2"})]);
console.log("race", race);
const settled = await Promise.allSettled([tools.step({n: "e1"}), tools.step({n: "fail"}), tools.step({n: "e2"})]);
console.log("settled", settled.map(s => s.status).join(","));
return {a, fan, c, more, race};
"""


def test_mixed_program_is_deterministic_under_random_finish_orders():
    outputs = []
    for seed in range(5):
        rng = random.Random(seed)
        lock = threading.Lock()
        delays = {}

        def step(args):
            n = args["n"]
            with lock:
                delay = delays.setdefault(n, rng.uniform(0, 0.004))
            time.sleep(delay)  # only to vary finish orders; nothing relies on it
            if n == "fail":
                raise ToolError("failed on purpose")
            return n.upper()

        result = run_code(MIXED, [safe("step", step)], description="test")
        assert result.ok, result.error
        outputs.append((result.result, result.logs, [(e.seq, e.arguments) for e in result.calls]))
    assert all(o == outputs[0] for o in outputs)
    result, logs, events = outputs[0]
    assert result == {
        "a": "A",
        "fan": ["B1", "B2", "B3", "B4", "B5", "B6"],
        "c": "C",
        "more": ["D1", "D2"],
        "race": "R1",
    }
    assert logs == (
        "first A",
        "then B1",
        "then B2",
        "then B3",
        "then B4",
        "then B5",
        "then B6",
        "fan B1,B2,B3,B4,B5,B6",
        "race R1",
        "settled fulfilled,rejected,fulfilled",
    )
    assert [a["n"] for _, a in events] == [
        "a",
        "b1",
        "b2",
        "b3",
        "b4",
        "b5",
        "b6",
        "c",
        "d1",
        "d2",
        "r1",
        "r2",
        "e1",
        "fail",
        "e2",
    ]


# === values round-trip (property) ==========================================================

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
    # JS numbers print integral floats past 2**53 by their shortest decimal, which
    # json.loads reads back as a different int: keep floats where both agree.
    | st.floats(min_value=-1e15, max_value=1e15, allow_nan=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=JSON_VALUES)
def test_json_values_round_trip_through_program_and_tool(value):
    result = run_code(
        "const r = await tools.echo({v: V}); return r.v;".replace("V", json.dumps(value)), [echo()], description="test"
    )
    assert result.ok, result.error
    assert result.result == value
    assert result.calls[0].arguments == {"v": value}


def test_oversized_arguments_are_refused_in_the_sandbox_and_never_reach_the_host():
    seen = []
    echo = Tool("echo", lambda args: seen.append(len(args["s"])) or len(args["s"]))
    program = """
    try { await tools.echo({s: "x".repeat(2000)}); }
    catch (e) { console.log(e instanceof ToolError, e.tool, e.message); }
    return await tools.echo({s: "ok"});
    """
    result = run_code(program, [echo], limits=Limits(max_args_bytes=1000), description="test")
    assert result.result == 2
    assert result.logs == ("true echo arguments are 2008 characters of JSON, over the run's limit of 1000",)
    assert seen == [2], "the refused call never reached the tool"
    assert [e.tool for e in result.calls] == ["echo"], "nor the scheduler: one audit event, for the call that ran"


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_max_args_bytes_is_validated(bad):
    with pytest.raises(ConfigError, match="max_args_bytes"):
        Limits(max_args_bytes=bad)

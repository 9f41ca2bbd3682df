"""The boundary (issue 9): nothing from a program or a caller makes the host raise, lie, or grow.

Each test is one reproduction from the issue and its class, run against both
runtimes where a program is involved:

* what crosses: non-finite numbers, integers a double cannot hold and deep
  nesting never cross, in either direction, and become data (a per-call
  ``ToolError`` or a run error with a kind), with every event audited;
* one gate: a model's direct call (``call_tool``) is refused exactly as a
  sub-call is and audited the same way; an approval handler gets its own
  copy, the run's description, the call's id and the tool's description; an
  approval that answers after the run is over starts nothing; a blank
  description is refused;
* bounded: the call budget, the argument budgets (in UTF-8 bytes), the log
  line cost and cap, and clipped run messages.
"""

from __future__ import annotations

import functools
import json
import math
import threading

import pytest

from nous_sched import (
    ApprovalRequest,
    ConfigError,
    Limits,
    PermissionPolicy,
    RunCodeError,
    SessionLog,
    SnapshotError,
    Tool,
    call_tool,
    run_code,
    snapshot,
)
from nous_sched.crossing import MAX_DEPTH, MAX_SAFE_INTEGER, check, loads, safe_int
from nous_sched.scheduler._tool_threads import retire_shared

WAIT = 30.0


def echo(name="echo"):
    return Tool(name, lambda args: args)


def nested(depth, leaf=0):
    return functools.reduce(lambda inner, _: [inner], range(depth), leaf)


# --- the snapshot rules, in both directions ------------------------------------------------


@pytest.mark.parametrize(
    "text,fragment",
    [
        ('{"n": 1e400}', "inf is not JSON"),
        ('{"n": -1e400}', "-inf is not JSON"),
        ('{"n": NaN}', "NaN is not JSON"),
        ('{"n": Infinity}', "Infinity is not JSON"),
        ('{"n": ' + "9" * 4300 + "}", "cannot cross exactly"),  # CPython still parses this one
        ('{"n": ' + "9" * 5000 + "}", "cannot cross exactly"),  # ...and raises ValueError on this one
        ('{"n": 9007199254740993}', "cannot cross exactly"),  # 2**53 + 1
        ('{"n": 1152921504606847000}', "cannot cross exactly"),  # how a program writes 2**60
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), f"nested deeper than {MAX_DEPTH}"),
        ("[" * 1500 + "]" * 1500, f"nested deeper than {MAX_DEPTH}"),  # RecursionError in json alone
        ("[" * 100_000 + "]" * 100_000, f"nested deeper than {MAX_DEPTH}"),
        ("{not json", "not valid JSON"),
    ],
)
def test_loads_refuses_what_cannot_cross_with_a_snapshot_error(text, fragment):
    with pytest.raises(SnapshotError) as info:
        loads(text)
    assert fragment in str(info.value)
    assert len(str(info.value)) < 1000  # a path a thousand levels deep is shortened


@pytest.mark.parametrize(
    "value",
    [
        0,
        MAX_SAFE_INTEGER,
        -MAX_SAFE_INTEGER,
        1e20,
        2.0**60,
        -1e300,
        1.5,
        "s",
        None,
        True,
        [1, {"a": [2**52]}],
        nested(200),
    ],
    ids=repr,
)
def test_exact_values_cross_unchanged(value):
    assert loads(json.dumps(value)) == value
    assert snapshot(value) == value
    check(value)


@pytest.mark.parametrize(
    "value,fragment",
    [
        (2**53, "9007199254740992 cannot cross exactly"),
        (-(2**53), "cannot cross exactly"),
        (2**60, "cannot cross exactly"),
        (math.factorial(2000), "of about 5736 digits cannot cross exactly"),
        (2**1024, "cannot cross exactly"),  # beyond the largest double
        ({"a": [1, float("inf")]}, "$.a[1]: inf is not JSON"),
        (nested(MAX_DEPTH + 1), "nested deeper than"),
        (nested(1500), "nested deeper than"),
    ],
    ids=["2**53", "-2**53", "2**60", "factorial", "2**1024", "inf", "depth201", "depth1500"],
)
def test_snapshot_and_check_refuse_the_same_values(value, fragment):
    for rule in (snapshot, check):
        with pytest.raises(SnapshotError) as info:
            rule(value)
        assert fragment in str(info.value)
        assert len(str(info.value)) < 1000


def test_safe_ints_are_javascripts():
    assert MAX_SAFE_INTEGER == 9007199254740991  # Number.MAX_SAFE_INTEGER
    for n in (0, 1, -1, MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER):
        assert safe_int(n)
    for n in (MAX_SAFE_INTEGER + 1, -MAX_SAFE_INTEGER - 1, 2**70, 10**400):
        assert not safe_int(n)


# --- ... and through run_code: failure is data, the audit complete -------------------------


@pytest.fixture
def tools():
    made = []

    def tool(name, value):
        made.append(name)
        return Tool(name, lambda args: value)

    return [
        echo(),
        tool("factorial", math.factorial(2000)),
        tool("deep", nested(1500)),
        tool("inexact", {"id": 2**53}),
        tool("nan", {"x": float("nan")}),
    ]


@pytest.mark.usefixtures("runtime")
@pytest.mark.parametrize(
    "call,fragment",
    [
        ("tools.echo({o: deep(201)})", f"nested deeper than {MAX_DEPTH}"),
        ("tools.echo({o: deep(1500)})", f"nested deeper than {MAX_DEPTH}"),
        ('tools.echo({n: JSON.rawJSON("1e400")})', "inf is not JSON"),
        ('tools.echo({n: JSON.rawJSON("9".repeat(4300))})', "cannot cross exactly"),
        ('tools.echo({n: JSON.rawJSON("9".repeat(5000))})', "cannot cross exactly"),
        ('tools.echo({n: JSON.rawJSON("9007199254740993")})', "cannot cross exactly"),
        ("tools.echo({n: 2**60})", "cannot cross exactly"),  # written 1152921504606847000
        ("tools.factorial({})", "cannot cross exactly"),
        ("tools.deep({})", "nested deeper than"),
        ("tools.inexact({})", "cannot cross exactly"),
        ("tools.nan({})", "nan is not JSON"),
    ],
)
def test_a_value_that_cannot_cross_fails_its_call_and_the_run_goes_on(tools, call, fragment):
    program = f"""
        function deep(n) {{ let o = 1; for (let i = 0; i < n; i++) o = {{a: o}}; return o; }}
        const before = await tools.echo({{first: 1}});
        let failed;
        try {{ await {call}; }} catch (e) {{ failed = [e.name, e.tool, e.message]; }}
        const after = await tools.echo({{last: 2}});
        return [before, failed, after];
    """
    result = run_code(program, tools, limits=Limits(timeout=WAIT), description="test")
    assert result.error is None, result.error
    before, failed, after = result.result
    assert before == {"first": 1} and after == {"last": 2}
    assert failed[0] == "ToolError" and fragment in failed[2], failed
    assert len(failed[2]) <= 2100  # clamped
    json.dumps(result.to_dict(), allow_nan=False)
    # Every call that started is audited; a refused argument is audited as a refusal.
    names = [e.tool for e in result.calls]
    assert names[0] == "echo" and names[-1] == "echo"
    assert len(result.calls) + len(result.refused) == 3


@pytest.mark.usefixtures("runtime")
@pytest.mark.parametrize(
    "expression,fragment",
    [
        ('{n: JSON.rawJSON("1e400")}', "inf is not JSON"),
        ('{n: JSON.rawJSON("-1e400")}', "-inf is not JSON"),
        ('{n: JSON.rawJSON("9".repeat(5000))}', "cannot cross exactly"),
        ('[JSON.rawJSON("9007199254740993")]', "cannot cross exactly"),
    ],
)
def test_a_result_that_cannot_cross_is_invalid_output_with_the_audit(tools, expression, fragment):
    result = run_code(
        f"await tools.echo({{a: 1}}); return {expression};", tools, limits=Limits(timeout=WAIT), description="test"
    )
    assert result.error is not None and result.error.kind == "invalid_output", result
    assert fragment in result.error.message
    assert result.result is None
    json.dumps(result.to_dict(), allow_nan=False)
    assert [e.tool for e in result.calls] == ["echo"]


@pytest.mark.usefixtures("runtime")
def test_safe_integers_and_every_float_cross_from_a_program(tools):
    program = "return [await tools.echo({n: 2**53 - 1, m: -(2**53 - 1), f: 1e300, g: 1e21}), 0.1, -1e21]"
    result = run_code(program, tools, description="test")
    assert result.error is None, result.error
    assert result.result == [{"n": MAX_SAFE_INTEGER, "m": -MAX_SAFE_INTEGER, "f": 1e300, "g": 1e21}, 0.1, -1e21]


# --- one gate -----------------------------------------------------------------------------------


def _sub_call_refusal(tool, policy=None, **options):
    """What a program's sub-call of ``tool`` is answered, and the session log it leaves."""
    session_log = SessionLog()
    program = f"try {{ await tools[{json.dumps(tool.name)}]({{x: 1}}); return null }} catch (e) {{ return [e.tool, e.message] }}"
    options.setdefault("description", "test")
    result = run_code(program, [tool], policy=policy, session_log=session_log, limits=Limits(timeout=WAIT), **options)
    assert result.error is None, result.error
    return result, session_log


def _audit_shape(session_log):
    return [(e.type, e.data["name"]) for e in session_log.events if e.type in ("tool_call", "tool_refused")]


@pytest.mark.usefixtures("runtime")
def test_a_direct_call_of_an_approval_gated_tool_is_refused_and_audited_like_a_sub_call():
    ran = []
    gated = Tool("delete_all", lambda a: ran.append(a) or "deleted", requires_approval=True)
    sub, sub_log = _sub_call_refusal(gated)
    direct_log = SessionLog()
    answer = json.loads(call_tool(gated, '{"x":1}', direct_log))
    assert ran == []  # the reproduction: it ran, unapproved
    assert sub.result == ["delete_all", answer["error"]]
    assert answer["error"] == 'tool "delete_all" requires approval and no approval handler is configured'
    # Audited the same way: a tool_call event (the call was admitted, then refused at approval).
    assert _audit_shape(sub_log) == _audit_shape(direct_log) == [("tool_call", "delete_all")]
    assert sub_log.events[0].data["arguments"] == direct_log.events[0].data["arguments"] == {"x": 1}
    assert (sub_log.events[0].data["source"], direct_log.events[0].data["source"]) == ("code_mode", "direct")

    # A handler that says no: the same refusal both ways; one that says yes: it runs.
    no = json.loads(call_tool(gated, {"x": 1}, approval_handler=lambda r: False))
    sub_no, _ = _sub_call_refusal(gated, approval_handler=lambda r: False)
    assert sub_no.result == ["delete_all", no["error"]] and "rejected by the approval handler" in no["error"]
    assert ran == []
    assert json.loads(call_tool(gated, {"x": 1}, approval_handler=lambda r: True)) == "deleted"
    assert ran == [{"x": 1}]


@pytest.mark.usefixtures("runtime")
def test_a_direct_call_of_a_denied_tool_is_refused_and_audited_like_a_sub_call():
    ran = []
    secret = Tool("secret", lambda a: ran.append(a) or "SECRET")
    policy = PermissionPolicy(deny="secret")
    sub, sub_log = _sub_call_refusal(secret, policy)
    direct_log = SessionLog()
    answer = json.loads(call_tool(secret, {"x": 1}, direct_log, policy=policy))
    assert ran == []
    assert sub.result == ["secret", answer["error"]] == ["secret", 'tool "secret" is denied by the permission policy']
    assert _audit_shape(sub_log) == _audit_shape(direct_log) == [("tool_refused", "secret")]
    assert sub_log.events[0].data["message"] == direct_log.events[0].data["message"]
    assert [(r.tool, r.message) for r in sub.refused] == [("secret", answer["error"])]


@pytest.mark.usefixtures("runtime")
def test_a_direct_call_with_arguments_that_fail_the_schema_is_refused_like_a_sub_call():
    ran = []
    typed = Tool(
        "typed",
        lambda a: ran.append(a),
        parameters={"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
        requires_approval=True,
    )
    asked = []
    sub, sub_log = _sub_call_refusal(typed, approval_handler=asked.append)
    direct_log = SessionLog()
    answer = json.loads(call_tool(typed, {"x": 1}, direct_log, approval_handler=asked.append))
    assert sub.result == ["typed", answer["error"]] and answer["error"].startswith("invalid arguments: $.x")
    assert asked == [] and ran == []  # checked before anyone is asked to approve
    assert _audit_shape(sub_log) == _audit_shape(direct_log) == [("tool_refused", "typed")]


@pytest.mark.usefixtures("runtime")
def test_the_approval_handler_gets_its_own_copy_and_the_run_description():
    ran = []
    requests = []

    def handler(request):
        requests.append(request)
        request.arguments["n"] = 999  # changes only the handler's copy
        request.arguments["nested"]["k"] = "changed"
        return True

    pay = Tool("pay", lambda a: ran.append(a) or a["n"], description="Pay someone.", requires_approval=True)
    result = run_code(
        "return await tools.pay({n: 1, nested: {k: 'v'}})",
        [pay],
        approval_handler=handler,
        description="Pay the invoice.",
        call_id="turn-7",
        limits=Limits(timeout=WAIT),
    )
    assert result.result == 1
    assert ran == [{"n": 1, "nested": {"k": "v"}}]
    assert result.calls[0].arguments == {"n": 1, "nested": {"k": "v"}}
    [request] = requests
    assert isinstance(request, ApprovalRequest)
    assert (request.tool, request.description, request.call_id, request.tool_description) == (
        "pay",
        "Pay the invoice.",
        "turn-7:code:0",
        "Pay someone.",
    )
    # The same for a direct call.
    requests.clear()
    assert json.loads(call_tool(pay, {"n": 2, "nested": {}}, approval_handler=handler, description="Pay.")) == 2
    assert ran[-1] == {"n": 2, "nested": {}}
    assert requests[0].description == "Pay." and requests[0].call_id.startswith("direct-")


@pytest.mark.usefixtures("runtime")
def test_an_approval_that_answers_after_the_run_is_over_starts_nothing(make_event):
    ran = []
    release = make_event()
    asked = threading.Event()
    answered = threading.Event()
    threads = []

    def slow_handler(request):
        threads.append(threading.current_thread())
        asked.set()
        release.wait(WAIT)
        answered.set()
        return True

    gated = Tool("gated", lambda a: ran.append(a), requires_approval=True)
    result = run_code(
        "return await tools.gated({})",
        [gated],
        approval_handler=slow_handler,
        limits=Limits(timeout=0.5),
        description="test",
    )
    assert asked.is_set()
    assert result.error is not None and result.error.kind == "timeout"
    release.set()  # approve, now that the run is over
    assert answered.wait(WAIT)
    # The call's thread is done with it: a shared tool thread, it exits once retired.
    assert threads[0] not in retire_shared(WAIT)
    assert not threads[0].is_alive()
    assert ran == []


def test_a_missing_or_blank_description_is_refused_with_a_config_error():
    for blank in ("", "   ", "\n\t"):
        with pytest.raises(RunCodeError, match="non-empty `description`"):
            run_code("return 1", [], description=blank)
    for missing in ({}, {"description": None}):
        with pytest.raises(ConfigError, match="run_code requires a `description`"):
            run_code("return 1", [], **missing)
    assert run_code("return 1", [], description="one", limits=Limits(timeout=WAIT)).result == 1


# --- bounded ------------------------------------------------------------------------------------


@pytest.mark.usefixtures("runtime")
def test_the_call_budget_ends_a_runaway_loop_of_calls_and_keeps_the_audit_bounded():
    program = """
        let ok = 0, refused = 0, last;
        for (let i = 0; i < 500; i++) {
            try { await tools.echo({i}); ok++; } catch (e) { refused++; last = e.message; }
            try { await tools.secret({i}); } catch (e) { refused++; }
        }
        return [ok, refused, last];
    """
    tools = [echo(), echo("secret")]
    result = run_code(
        program,
        tools,
        policy=PermissionPolicy(deny="secret"),
        limits=Limits(timeout=WAIT, max_calls=50),
        description="test",
    )
    assert result.error is None, result.error
    ok, refused, last = result.result
    assert ok == 25 and refused == 975
    assert "Limits.max_calls" in last
    assert len(result.calls) == 25
    # 25 denied calls within the budget, then one refusal that says the budget is spent.
    assert len(result.refused) == 26
    assert "Limits.max_calls" in result.refused[-1].message


@pytest.mark.usefixtures("runtime")
def test_approval_prompts_count_against_the_call_budget():
    asked = []
    gated = Tool("gated", lambda a: "ok", requires_approval=True)
    program = "let n = 0; for (let i = 0; i < 100; i++) { try { await tools.gated({}); n++ } catch (e) {} } return n"
    result = run_code(
        program,
        [gated],
        approval_handler=lambda r: asked.append(r) or False,
        limits=Limits(max_calls=7),
        description="test",
    )
    assert result.result == 0
    assert len(asked) == 7


@pytest.mark.usefixtures("runtime")
def test_max_args_bytes_counts_utf8_bytes():
    program = """
        const r = [];
        for (const s of ["a".repeat(90), "é".repeat(45), "é".repeat(60), "😀".repeat(30)]) {
            try { await tools.echo({s}); r.push("ok"); } catch (e) { r.push(e.message); }
        }
        return r;
    """
    result = run_code(program, [echo()], limits=Limits(max_args_bytes=100), description="test")
    ok1, ok2, big1, big2 = result.result
    assert ok1 == ok2 == "ok"  # 98 and 98 bytes
    assert big1 == "arguments are 128 bytes of JSON, over the limit of 100 for one call (Limits.max_args_bytes)"
    assert "128 bytes" in big2  # 30 astral characters: 60 UTF-16 units, 120 bytes


@pytest.mark.usefixtures("runtime")
def test_the_cumulative_argument_budget_refuses_the_calls_past_it():
    program = """
        const r = [];
        for (let i = 0; i < 10; i++) {
            try { await tools.echo({s: "x".repeat(100)}); r.push(1); } catch (e) { r.push(e.message); }
        }
        return r;
    """
    result = run_code(program, [echo()], limits=Limits(max_total_args_bytes=500), description="test")
    assert result.result[:4] == [1, 1, 1, 1]  # 108 bytes each
    assert all("Limits.max_total_args_bytes" in m for m in result.result[4:])
    assert len(result.calls) == 4


@pytest.mark.usefixtures("runtime")
def test_empty_log_lines_cost_against_the_budget_and_lines_are_capped():
    result = run_code("for (;;) console.log()", [], limits=Limits(timeout=1, max_log_bytes=1000), description="test")
    assert result.error.kind == "timeout"
    assert len(result.logs) == 1000 + 1 and result.logs[-1] == "[output truncated at 1000 bytes]"
    result = run_code(
        "for (let i = 0; i < 1000; i++) console.log(i); return 1",
        [],
        limits=Limits(timeout=WAIT, max_log_lines=10),
        description="test",
    )
    assert result.result == 1
    assert list(result.logs) == [str(i) for i in range(10)] + ["[output truncated at 10 lines]"]


@pytest.mark.usefixtures("runtime")
def test_every_run_error_message_is_clipped():
    result = run_code(
        'return {toJSON() { throw new Error("x".repeat(20e6)) }}', [], limits=Limits(timeout=WAIT), description="test"
    )
    assert result.error.kind == "invalid_output"
    assert len(result.error.message) <= 4100
    result = run_code('throw new Error("y".repeat(20e6))', [], limits=Limits(timeout=WAIT), description="test")
    assert result.error.kind == "exception" and len(result.error.message) <= 4100


def test_limits_defaults_are_what_the_readme_says():
    limits = Limits()
    assert (limits.max_calls, limits.max_total_args_bytes, limits.max_log_lines) == (1000, 4_000_000, 10_000)
    assert (limits.max_args_bytes, limits.max_log_bytes, limits.max_output_bytes) == (1_000_000,) * 3


def test_a_direct_call_with_a_non_finite_number_is_refused_before_the_tool_runs():
    ran = []
    tool = Tool("t", lambda a: ran.append(a))
    refused = json.loads(call_tool(tool, '{"n": 1e400}'))
    assert refused == {"error": "arguments cannot cross: $.n: inf is not JSON (JSON has no NaN or Infinity)"}
    assert json.loads(call_tool(tool, {"n": float("nan")}))["error"].endswith(
        "nan is not JSON (JSON has no NaN or Infinity)"
    )
    assert ran == []

"""The promise of ``errors.py``: a bad option reaches the caller as a ``ConfigError``.

Never a ``TypeError``, ``ValueError`` or ``OverflowError`` from deep inside, and
always the same shape: ``<owner>: `<option>` must be <expected>, got <value>``.
"""

from __future__ import annotations

import math
import re
import threading

import pytest

from nous_sched import (
    ConfigError,
    Limits,
    PermissionPolicy,
    RunError,
    Scheduler,
    Tool,
    run_code,
    run_code_tool,
    visible_tools,
)
from nous_sched.cli import main

INF = float("inf")
HUGE = 1e10  # past threading.TIMEOUT_MAX: a lock wait this long raises OverflowError
SHAPE = re.compile(r"^(?P<owner>[\w.]+): `(?P<option>\w+)` must be (?P<expected>.+), got (?P<value>.+)$", re.S)


def assert_config_error(call, owner: str, option: str, shown: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        call()
    match = SHAPE.match(str(info.value))
    assert match, f"not the one message shape: {info.value}"
    assert (match["owner"], match["option"], match["value"]) == (owner, option, shown), str(info.value)
    assert match["expected"], str(info.value)
    return info.value


def noop(args):
    return None


SCHEDULER_OPTIONS = [
    ("timeout", INF, "inf"),
    ("timeout", -INF, "-inf"),
    ("timeout", math.nan, "nan"),
    ("timeout", HUGE, "10000000000.0"),
    ("timeout", 0, "0"),
    ("timeout", True, "True"),
    ("timeout", "5", "'5'"),
    ("max_parallel", 0, "0"),
    ("max_parallel", 2.0, "2.0"),
    ("max_parallel", True, "True"),
    ("call_id", 42, "42"),
    ("executor", object(), "a object"),
    ("observer", 42, "42"),
    ("session_log", {}, "{}"),
    ("dispatch", None, "None"),
]


@pytest.mark.parametrize("option,value,shown", SCHEDULER_OPTIONS, ids=[f"{o}={s}" for o, _, s in SCHEDULER_OPTIONS])
def test_scheduler_options(option, value, shown):
    assert_config_error(lambda: Scheduler(**{option: value}), "Scheduler", option, shown)


@pytest.mark.parametrize("value,shown", [(INF, "inf"), (HUGE, "10000000000.0"), (-1, "-1"), ("1", "'1'")])
def test_waits_refuse_unbounded_or_negative_timeouts(make_scheduler, value, shown):
    s = make_scheduler()
    ticket = s.submit(Tool("t", noop), {})
    assert_config_error(lambda: s.wait(ticket, timeout=value), "Scheduler.wait", "timeout", shown)
    assert_config_error(lambda: ticket.wait(value), "Ticket.wait", "timeout", shown)
    assert_config_error(lambda: s.stop(timeout=value), "Scheduler.stop", "timeout", shown)
    assert s.wait(ticket).ok, "a refused option changed nothing"


def test_waits_accept_zero_and_none(make_scheduler):
    s = make_scheduler()
    ticket = s.submit(Tool("t", noop), {})
    assert s.wait(ticket).ok
    assert s.wait(ticket, timeout=0).ok and ticket.wait(0).ok and ticket.wait(None).ok


@pytest.mark.parametrize("value,shown", [(INF, "inf"), (HUGE, "10000000000.0"), (0, "0"), (None, "None")])
def test_run_code_timeout(value, shown):
    # Once this answered "exceeded its infs deadline" instead of refusing the option.
    assert_config_error(lambda: run_code("return 1", timeout=value, description="test"), "run_code", "timeout", shown)


def test_run_code_options():
    assert_config_error(
        lambda: run_code("return 1", limits={"timeout": 1}, description="test"), "run_code", "limits", "{'timeout': 1}"
    )
    assert_config_error(lambda: run_code("return 1", policy=["a"], description="test"), "run_code", "policy", "['a']")
    assert_config_error(
        lambda: run_code("return 1", approval_handler=1, description="test"), "run_code", "approval_handler", "1"
    )
    assert_config_error(lambda: run_code("return 1", tools="abc", description="test"), "run_code", "tools", "'abc'")
    assert_config_error(
        lambda: run_code("return 1", tools=[noop], description="test"), "run_code", "tools", "a function"
    )
    # run_code's own option, named as run_code's, before anything starts (it once came from the Scheduler).
    assert_config_error(
        lambda: run_code("return 1", max_parallel=0, description="test"), "run_code", "max_parallel", "0"
    )


@pytest.mark.parametrize(
    "field,value,shown",
    [
        ("timeout", INF, "inf"),
        ("memory_bytes", 1024, "1024"),
        ("memory_bytes", 2.5e8, "250000000.0"),
        ("stack_bytes", 8 * 1024 * 1024, "8388608"),
        ("max_log_bytes", 0, "0"),
        ("max_output_bytes", None, "None"),
        ("max_args_bytes", True, "True"),
        ("blob_bytes", 4095, "4095"),
        ("blob_bytes", True, "True"),
    ],
)
def test_limits_fields(field, value, shown):
    assert_config_error(lambda: Limits(**{field: value}), "Limits", field, shown)


@pytest.mark.parametrize(
    "field,value,shown",
    [
        ("deny", 5, "5"),
        ("allow", 3.5, "3.5"),
        ("require_approval", [1, 2], "(1, 2)"),
        ("approval_categories", b"x", "b'x'"),
    ],
)
def test_permission_policy_fields(field, value, shown):
    # PermissionPolicy(deny=5) once raised TypeError from frozenset(5).
    assert_config_error(lambda: PermissionPolicy(**{field: value}), "PermissionPolicy", field, shown)


@pytest.mark.parametrize(
    "field,value,shown",
    [
        ("name", "", "''"),
        ("function", 42, "42"),
        ("description", None, "None"),
        ("parameters", [], "[]"),
        ("requires_approval", "yes", "'yes'"),
        ("concurrency_safe", True, "True"),
        ("returns", "string", "'string'"),
    ],
)
def test_tool_fields(field, value, shown):
    fields = {"name": "t", "function": noop, field: value}
    assert_config_error(lambda: Tool(**fields), "Tool", field, shown)


def test_run_error_fields():
    assert_config_error(lambda: RunError("oops", "m"), "RunError", "kind", "'oops'")
    assert_config_error(lambda: RunError("timeout", 5), "RunError", "message", "5")


def test_agent_entry_points():
    assert_config_error(lambda: visible_tools("all", []), "visible_tools", "mode", "'all'")
    assert_config_error(lambda: run_code_tool(42), "run_code_tool", "tools", "42")
    assert_config_error(lambda: visible_tools("native", 42), "visible_tools", "tools", "42")


@pytest.mark.parametrize(
    "flag,value", [("--timeout", "inf"), ("--timeout", "nan"), ("--timeout", "1e10"), ("--max-parallel", "0")]
)
def test_cli_flags_say_what_the_option_expects(capsys, flag, value):
    code = main(["run", "examples/fanout.js", "--tools", "examples/tools.py", flag, value])
    err = capsys.readouterr().err
    assert code == 2
    assert f"argument {flag}: expected " in err and repr(value) in err


def test_adapter_options():
    from langchain_core.tools import tool as langchain_tool

    from nous_sched import openai_tool
    from nous_sched.integrations import from_langchain
    from nous_sched.sdk import ToolIndex

    plain = Tool("t", noop)
    assert_config_error(lambda: openai_tool(plain, api="assistants"), "openai_tool", "api", "'assistants'")
    assert_config_error(lambda: openai_tool(plain, strict="yes"), "openai_tool", "strict", "'yes'")

    @langchain_tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return key

    adapter = "from_langchain"
    assert_config_error(lambda: from_langchain(lookup, requires_approval="no"), adapter, "requires_approval", "'no'")
    assert_config_error(lambda: from_langchain(lookup, concurrency_safe=3), adapter, "concurrency_safe", "3")
    assert_config_error(lambda: from_langchain(lookup, name=""), adapter, "name", "''")
    index = ToolIndex([plain])
    assert_config_error(lambda: index.search(42), "search", "query", "42")
    assert_config_error(lambda: index.search("t", limit=0), "search", "limit", "0")


# -- run_code_tool and visible_tools check their options when built (issue 11) --

RUN_OPTIONS = [
    ("max_parallel", 0, "0"),
    ("max_parallel", True, "True"),
    ("timeout", INF, "inf"),
    ("timeout", -1, "-1"),
    ("limits", 5, "5"),
    ("executor", object(), "a object"),
    ("approval_handler", 42, "42"),
    ("call_id", 42, "42"),
    ("dispatch", 42, "42"),
    ("session_log", {}, "{}"),
    ("observer", "x", "'x'"),
    ("cancel", 42, "42"),
    ("budget", 0, "0"),
    ("budget", "big", "'big'"),
]


@pytest.mark.parametrize("option, value, shown", RUN_OPTIONS)
def test_run_code_tool_checks_each_option_when_built(option, value, shown):
    assert_config_error(lambda: run_code_tool([], **{option: value}), "run_code_tool", option, shown)


@pytest.mark.parametrize("mode", ["native", "code", "both"])
@pytest.mark.parametrize("option, value, shown", RUN_OPTIONS)
def test_visible_tools_checks_each_option_in_every_mode(mode, option, value, shown):
    assert_config_error(lambda: visible_tools(mode, [], **{option: value}), "visible_tools", option, shown)


@pytest.mark.parametrize("build", [lambda **o: run_code_tool([], **o), lambda **o: visible_tools("native", [], **o)])
def test_a_misspelled_option_is_named_with_the_closest_one(build):
    with pytest.raises(ConfigError) as info:
        build(max_paralel=4)
    assert "`max_paralel` is not an option of run_code; did you mean `max_parallel`?" in str(info.value)
    with pytest.raises(ConfigError, match="`description` is not an option of run_code"):
        build(description="set per call by the model")


def test_good_options_build_a_tool_that_uses_them():
    tool = run_code_tool([Tool("noop", noop)], max_parallel=2, timeout=5, budget=None, limits=None)
    assert tool.name == "run_code"
    assert tool.function({"code": "return await tools.noop({})", "description": "d"}) is not None


# -- every option is checked before any work starts (issue 24) --


class RecordingRuntime:
    """The in-process runtime, recording each time a run asked it for anything."""

    language = "javascript"

    def __init__(self):
        from nous_sched import QuickJSRuntime

        self.inner = QuickJSRuntime()
        self.asked = []

    def begin(self, program, names, limits, cancel=None):
        self.asked.append("begin")
        return None  # nothing started early: run() does it all

    def run(self, program, host, limits):
        self.asked.append("run")
        return self.inner.run(program, host, limits)


def _threads():
    return {t.ident for t in threading.enumerate()}


RUN_CODE_OPTIONS = [
    ("timeout", INF, "inf"),
    ("timeout", 0, "0"),
    ("limits", 5, "5"),
    ("policy", ["a"], "['a']"),
    ("approval_handler", 1, "1"),
    ("max_parallel", 0, "0"),
    ("max_parallel", 2.5, "2.5"),
    ("executor", object(), "a object"),
    ("call_id", 42, "42"),
    ("dispatch", 42, "42"),
    ("session_log", {}, "{}"),
    ("observer", "x", "'x'"),
    ("cancel", 42, "42"),
]


@pytest.mark.parametrize("option,value,shown", RUN_CODE_OPTIONS, ids=[f"{o}={s}" for o, _, s in RUN_CODE_OPTIONS])
def test_run_code_checks_each_option_before_any_work_starts(option, value, shown):
    runtime = RecordingRuntime()
    assert (
        run_code("return 1", runtime=runtime, description="test").result == 1
    )  # the runtime works, and threads are warm
    runtime.asked.clear()
    before = _threads()
    assert_config_error(lambda: run_code("return 1", runtime=runtime, **{option: value}), "run_code", option, shown)
    assert runtime.asked == [], "no worker taken, no program begun"
    assert _threads() <= before, "no thread started"


def test_a_bad_option_leaves_a_warm_worker_pool_serving():
    from nous_sched import WorkerPool

    pool = WorkerPool(size=1)
    try:
        assert run_code("return 1", runtime=pool, description="test").result == 1
        assert_config_error(
            lambda: run_code("return 2", runtime=pool, max_parallel=0, description="test"),
            "run_code",
            "max_parallel",
            "0",
        )
        assert run_code("return 3", runtime=pool, description="test").result == 3
    finally:
        pool.close()


WORKER_POOL_OPTIONS = [
    ("size", 0, "0"),
    ("start_method", "fork", "'fork'"),
    ("runs_per_worker", 0, "0"),
    ("kill_grace", -1, "-1"),
    ("memory_headroom", 1024, "1024"),
    ("start_timeout", INF, "inf"),
    ("python", 5, "5"),
]


@pytest.mark.parametrize("option,value,shown", WORKER_POOL_OPTIONS, ids=[o for o, _, _ in WORKER_POOL_OPTIONS])
def test_worker_pool_options(option, value, shown):
    from nous_sched import WorkerPool

    before = _threads()
    assert_config_error(lambda: WorkerPool(**{option: value}), "WorkerPool", option, shown)
    assert _threads() <= before


FUNCTION_TOOL_OPTIONS = [
    ("name", "", "''"),
    ("description", 5, "5"),
    ("concurrency_safe", 3, "3"),
    ("requires_approval", "yes", "'yes'"),
    ("category", None, "None"),
    ("validate_arguments", "no", "'no'"),
]


@pytest.mark.parametrize("option,value,shown", FUNCTION_TOOL_OPTIONS, ids=[o for o, _, _ in FUNCTION_TOOL_OPTIONS])
def test_function_tool_options_are_checked_where_they_are_written(option, value, shown):
    from nous_sched import function_tool

    def lookup(key: str) -> str:
        return key

    assert_config_error(lambda: function_tool(lookup, **{option: value}), "function_tool", option, shown)
    # As a decorator: refused when the options are given, before any function is.
    assert_config_error(lambda: function_tool(**{option: value}), "function_tool", option, shown)


def test_function_tool_needs_a_function():
    from nous_sched import function_tool

    assert_config_error(lambda: function_tool(42), "function_tool", "fn", "42")


def _otel():
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from nous_sched import otel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return otel, provider.get_tracer("test_config_errors"), exporter


@pytest.mark.parametrize(
    "option,value,shown", [("then", 5, "5"), ("tracer", "t", "'t'"), ("context", {"a": 1}, "{'a': 1}")]
)
def test_span_observer_options(option, value, shown):
    # SpanObserver(then=5) once raised TypeError.
    otel, tracer, _ = _otel()
    options = {"tracer": tracer, option: value}
    assert_config_error(lambda: otel.SpanObserver(**options), "SpanObserver", option, shown)


TRACED_OPTIONS = [
    ("tool_context", "yes", "'yes'"),
    ("call_id", 42, "42"),
    ("observer", 5, "5"),
    ("dispatch", None, "None"),
    ("max_parallel", 0, "0"),
    ("timeout", INF, "inf"),
]


@pytest.mark.parametrize("option,value,shown", TRACED_OPTIONS, ids=[o for o, _, _ in TRACED_OPTIONS])
def test_traced_run_code_checks_each_option_before_its_span_starts(option, value, shown):
    otel, tracer, exporter = _otel()
    runtime = RecordingRuntime()
    run = lambda: otel.traced_run_code("return 1", tracer=tracer, runtime=runtime, **{option: value})  # noqa: E731
    assert_config_error(run, "traced_run_code", option, shown)
    assert exporter.get_finished_spans() == () and runtime.asked == []
    assert_config_error(
        lambda: otel.traced_run_code("return 1", tracer="t", description="test"), "traced_run_code", "tracer", "'t'"
    )


CALL_TOOL_OPTIONS = [
    ("session_log", {}, "{}"),
    ("policy", 1, "1"),
    ("approval_handler", 1, "1"),
    ("description", 5, "5"),
    ("limits", 5, "5"),
    ("call_id", 5, "5"),
]


@pytest.mark.parametrize("option,value,shown", CALL_TOOL_OPTIONS, ids=[o for o, _, _ in CALL_TOOL_OPTIONS])
def test_call_tool_checks_each_option_before_the_tool_runs(option, value, shown):
    from nous_sched import call_tool

    ran = []
    tool = Tool("t", lambda args: ran.append(args))
    assert_config_error(lambda: call_tool(tool, "{}", **{option: value}), "call_tool", option, shown)
    assert_config_error(lambda: call_tool("t", "{}"), "call_tool", "tool", "'t'")
    assert ran == []

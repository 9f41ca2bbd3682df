"""``RunOptions``: every option of a run in one frozen value, checked once, as it is made.

What a caller may rely on (:class:`nous_sched.RunOptions`): it cannot be
changed after it is made; a bad field is the one ``ConfigError`` shape naming
it (the door's name when a door made it); equal options compare equal;
``evolve`` makes a checked copy; ``run_code(options=...)`` runs as the
keywords do, and an option given both ways is refused, naming it; and the
same options reach the runtime through every door.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import threading

import attrs
import pytest

from nous_sched import (
    CodeRuntime,
    ConfigError,
    Limits,
    PermissionPolicy,
    QuickJSRuntime,
    RunCodeError,
    RunOptions,
    SessionLog,
    SqliteApprovalStore,
    arun_code,
    run_code,
    run_code_tool,
    start_run,
    visible_tools,
)
from nous_sched.cli import durable as cli_durable
from nous_sched.cli import main

SHAPE = re.compile(r"^(?P<owner>[\w.]+): `(?P<option>\w+)` must be (?P<expected>.+), got (?P<value>.+)$", re.S)
WAIT = 30.0


def refusal(call) -> tuple[str, str, str]:
    """(owner, option, value shown) of the ConfigError ``call()`` raises, in the one shape."""
    with pytest.raises(ConfigError) as info:
        call()
    match = SHAPE.match(str(info.value))
    assert match, f"not the one message shape: {info.value}"
    return match["owner"], match["option"], match["value"]


BAD_FIELDS = [
    ("description", 5, "5"),
    ("policy", ["a"], "['a']"),
    ("approval_handler", 1, "1"),
    ("timeout", 0, "0"),
    ("timeout", float("inf"), "inf"),
    ("limits", 5, "5"),
    ("max_parallel", 0, "0"),
    ("max_parallel", True, "True"),
    ("executor", object(), "a object"),
    ("call_id", 42, "42"),
    ("dispatch", 42, "42"),
    ("session_log", {}, "{}"),
    ("observer", "x", "'x'"),
    ("cancel", 42, "42"),
    ("output_budget", 10, "10"),
    ("approval_store", "file.db", "'file.db'"),
    ("state", "conversation-42", "'conversation-42'"),
    ("bind", ["sk-secret"], "a list"),  # the type only: a bind's values are secrets
    ("review", "strict", "'strict'"),
]


def test_every_field_but_deps_and_runtime_has_a_case():
    # (deps is the caller's own value, never looked at; runtime is refused as a RunCodeError, below.)
    assert {name for name, _, _ in BAD_FIELDS} == {f.name for f in attrs.fields(RunOptions)} - {"deps", "runtime"}


@pytest.mark.parametrize("field,value,shown", BAD_FIELDS, ids=[f"{f}={s}" for f, _, s in BAD_FIELDS])
def test_each_bad_field_is_a_config_error_naming_it(field, value, shown):
    assert refusal(lambda: RunOptions(**{field: value})) == ("RunOptions", field, shown)
    # Made by a door, it names the door.
    assert refusal(lambda: run_code("return 1", **{field: value})) == ("run_code", field, shown)
    assert refusal(lambda: start_run("return 1", **{field: value})) == ("run_code", field, shown)


def test_a_runtime_that_is_not_one_is_refused_as_a_run_code_error():
    with pytest.raises(RunCodeError, match="is a class and does not implement nous_sched.CodeRuntime"):
        RunOptions(runtime=QuickJSRuntime)
    with pytest.raises(RunCodeError, match="does not implement nous_sched.CodeRuntime"):
        RunOptions(runtime=object())


def test_limits_override_timeout_which_is_then_not_checked():
    options = RunOptions(limits=Limits(timeout=3), timeout=float("inf"))
    assert options.run_limits == Limits(timeout=3)
    assert RunOptions(timeout=4).run_limits == Limits(timeout=4)


def test_the_default_limits_of_a_timeout_are_its_own_whatever_ran_before():
    # (Made once per timeout and shared: a Limits is frozen.) 4 and 4.0 are
    # equal keys of a dict, but each run's limits keep the timeout it was given.
    for timeout in (4, 4.0, 7, 4, 4.0, 0.5):
        limits = RunOptions(timeout=timeout).run_limits
        assert limits == Limits(timeout=timeout) and type(limits.timeout) is type(timeout)
        assert repr(limits) == repr(Limits(timeout=timeout))
    assert RunOptions(timeout=9).run_limits is RunOptions(timeout=9).run_limits
    # An interpreter-long cache of timeouts stays bounded.
    for i in range(500):
        assert RunOptions(timeout=1 + i).run_limits.timeout == 1 + i
    assert RunOptions(timeout=4.0).run_limits == Limits(timeout=4.0)


def test_it_is_frozen():
    options = RunOptions(timeout=5)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        options.timeout = 6  # type: ignore[misc]
    assert options.timeout == 5


def test_equal_options_compare_equal():
    log = SessionLog()
    assert RunOptions() == RunOptions()
    assert RunOptions(timeout=5, session_log=log, call_id="a") == RunOptions(timeout=5, session_log=log, call_id="a")
    assert RunOptions(timeout=5) != RunOptions(timeout=6)
    assert RunOptions(session_log=log) != RunOptions(session_log=SessionLog())  # stores and logs by identity
    assert hash(RunOptions(timeout=5)) == hash(RunOptions(timeout=5))


def test_evolve_makes_a_checked_copy():
    options = RunOptions(timeout=5, max_parallel=2)
    changed = options.evolve(max_parallel=3)
    assert (changed.timeout, changed.max_parallel) == (5, 3)
    assert options.max_parallel == 2, "the original is unchanged"
    assert refusal(lambda: options.evolve(max_parallel=0)) == ("RunOptions", "max_parallel", "0")
    with pytest.raises(ConfigError, match="`max_paralel` is not an option of RunOptions; did you mean `max_parallel`"):
        options.evolve(max_paralel=3)
    assert attrs.evolve(options, call_id="x").call_id == "x"


def test_options_run_as_the_keywords_do():
    rt = QuickJSRuntime()
    options = RunOptions(description="test", runtime=rt, call_id="same")
    by_value = run_code("return 6 * 7", options=options)
    by_keywords = run_code("return 6 * 7", description="test", runtime=rt, call_id="same")
    assert by_value.result == by_keywords.result == 42
    assert start_run("return 6 * 7", options=options).result(timeout=WAIT).result == 42


@pytest.mark.parametrize("door", [run_code, start_run], ids=["run_code", "start_run"])
def test_an_option_given_both_ways_is_refused_naming_it(door):
    options = RunOptions(description="test", runtime=QuickJSRuntime(), timeout=5)
    assert refusal(lambda: door("return 1", options=options, timeout=5))[:2] == ("run_code", "timeout")
    # Even a keyword at its default: it was given.
    assert refusal(lambda: door("return 1", options=options, max_parallel=10))[:2] == ("run_code", "max_parallel")
    assert refusal(lambda: door("return 1", options={"timeout": 5})) == ("run_code", "options", "{'timeout': 5}")


# -- the same options reach the runtime through every door --------------------------------------


class Recording(CodeRuntime):
    """The in-process runtime, recording what each run's runtime was handed."""

    language = "javascript"

    def __init__(self) -> None:
        self.inner = QuickJSRuntime()
        self.seen: list[tuple] = []

    def run(self, program, host, limits):
        plain = getattr(host, "inner", host)  # a durable run's host wraps the run's own
        scheduler = plain.scheduler
        ctx = plain.run_ctx
        self.seen.append((limits, ctx.deps, ctx.description, scheduler.call_id, scheduler.max_parallel))
        return self.inner.run(program, host, limits)


LIMITS = Limits(timeout=WAIT, max_calls=77)
DEPS = {"tenant": "acme"}


def expected(description="test", call_id="door"):
    return (LIMITS, DEPS, description, call_id, 3)


def given(rt):
    return dict(runtime=rt, limits=LIMITS, deps=DEPS, call_id="door", max_parallel=3)


def test_run_code_and_start_run_hand_the_runtime_the_same_options():
    rt = Recording()
    options = RunOptions(description="test", **given(rt))
    assert run_code("return 1", description="test", **given(rt)).result == 1
    assert run_code("return 1", options=options).result == 1
    assert start_run("return 1", description="test", **given(rt)).result(timeout=WAIT).result == 1
    assert start_run("return 1", options=options).result(timeout=WAIT).result == 1
    assert asyncio.run(arun_code("return 1", options=options)).result == 1
    assert asyncio.run(arun_code("return 1", description="test", **given(rt))).result == 1
    assert rt.seen == [expected()] * 6


def test_the_run_code_tool_and_visible_tools_hand_the_runtime_the_same_options():
    rt = Recording()
    tool = run_code_tool([], **given(rt))
    (offered,) = visible_tools("code", [], **given(rt))
    for door in (tool, offered):
        door.function({"code": "return 1", "description": "test"})
    assert rt.seen == [expected()] * 2


def test_a_durable_run_hands_the_runtime_the_same_options(tmp_path):
    rt = Recording()
    store = SqliteApprovalStore(str(tmp_path / "a.db"))
    result = run_code("return 1", options=RunOptions(description="test", approval_store=store, **given(rt)))
    assert result.result == 1
    assert run_code("return 1", description="test", approval_store=store, **given(rt)).result == 1
    assert rt.seen == [expected()] * 2


def test_traced_run_code_hands_the_runtime_the_same_options():
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider

    from nous_sched import otel

    rt = Recording()
    tracer = TracerProvider().get_tracer("test_run_options")
    assert otel.traced_run_code("return 1", tracer=tracer, description="test", **given(rt)).result == 1
    assert rt.seen == [expected()]


def test_the_cli_hands_the_runtime_the_options_its_flags_say(tmp_path, monkeypatch):
    rt = Recording()
    monkeypatch.setattr(cli_durable, "runtime_named", lambda name: rt)
    program = tmp_path / "one.js"
    program.write_text("return 1")
    assert main(["run", str(program), "--tools", "examples.tools", "--timeout", "7", "--max-parallel", "3"]) == 0
    ((limits, deps, description, _, max_parallel),) = rt.seen
    assert (limits, deps, description, max_parallel) == (Limits(timeout=7), None, "one.js", 3)


def test_serve_mcp_hands_the_runtime_the_same_options():
    pytest.importorskip("mcp")
    import anyio
    from mcp import Client

    from nous_sched.mcp import CodeModeServer

    rt = Recording()
    server = CodeModeServer([], policy=PermissionPolicy(), runtime=rt, limits=LIMITS, deps=DEPS, max_parallel=3)

    async def go():
        with anyio.fail_after(WAIT):
            async with Client(server.server) as client:
                return await client.call_tool("run_code", {"code": "return 1", "description": "test"})

    result = anyio.run(go)
    assert result.structured_content == {"logs": [], "result": 1}
    ((limits, deps, description, call_id, max_parallel),) = rt.seen
    assert (limits, deps, description, max_parallel) == (LIMITS, DEPS, "test", 3)
    assert call_id.startswith("mcp-run-"), "the server names each run"


def test_options_made_once_serve_many_runs_and_threads():
    rt = Recording()
    options = RunOptions(description="test", **given(rt))
    with concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="nous-sched-test") as pool:
        results = list(pool.map(lambda _: run_code("return 1", options=options).result, range(8)))
    assert results == [1] * 8 and rt.seen == [expected()] * 8
    assert options == RunOptions(description="test", **given(rt)), "no run changed them"


def test_a_cancel_given_in_options_cancels_the_run():
    cancel = threading.Event()
    cancel.set()
    result = run_code(
        "while (true) {}", options=RunOptions(description="test", runtime=QuickJSRuntime(), cancel=cancel)
    )
    assert result.error is not None and result.error.kind == "cancelled"


def test_resume_hands_the_runtime_the_same_options(tmp_path):
    from nous_sched import Tool, resume

    rt = Recording()
    store = SqliteApprovalStore(str(tmp_path / "a.db"))
    pay = Tool("pay", lambda args: "paid", requires_approval=True)
    policy = PermissionPolicy(require_approval={"pay"})
    options = RunOptions(description="test", approval_store=store, policy=policy, **given(rt))
    suspended = run_code("return await tools.pay({amount: 1})", [pay], options=options).suspended
    assert suspended is not None
    (pending,) = suspended.pending
    with pytest.raises(ConfigError, match="resume: `approval_store`"):  # another store than the options'
        resume(
            suspended.token,
            {pending.seq: True},
            [pay],
            approval_store=SqliteApprovalStore(str(tmp_path / "b.db")),
            options=options,
        )
    resumed = resume(suspended.token, {pending.seq: True}, [pay], approval_store=store, options=options)
    assert resumed.result == "paid"
    assert rt.seen == [expected()] * 2


def test_an_unknown_keyword_is_the_type_error_run_code_raises_at_every_door_that_forwards():
    for call in (
        lambda: run_code("return 1", no_such_option=1),
        lambda: start_run("return 1", no_such_option=1),
        lambda: asyncio.run(arun_code("return 1", no_such_option=1)),
    ):
        with pytest.raises(TypeError, match="no_such_option"):
            call()


def test_the_approval_store_field_is_typed_with_the_public_seam_the_stores_implement(tmp_path):
    import nous_sched
    from nous_sched import ApprovalStore, ApprovalStoreSeam
    from nous_sched._run import options as options_module

    assert "ApprovalStoreSeam" in nous_sched.__all__
    assert attrs.fields(RunOptions).approval_store.type == "Optional[ApprovalStoreSeam]"
    assert options_module.ApprovalStoreSeam is ApprovalStoreSeam
    store = SqliteApprovalStore(str(tmp_path / "a.db"))
    assert isinstance(store, ApprovalStore) and isinstance(store, ApprovalStoreSeam)
    assert RunOptions(approval_store=store).approval_store is store

    class Partial(ApprovalStoreSeam):  # a store that leaves a method out cannot be made
        def save(self, record):
            return "t", 0.0

    with pytest.raises(TypeError, match="abstract"):
        Partial()
    owner, option, _ = refusal(lambda: RunOptions(approval_store=object()))
    assert (owner, option) == ("RunOptions", "approval_store")


# -- options= at the doors that also take their own keywords -----------------------------------


def test_the_run_code_tool_and_visible_tools_take_options_and_hand_the_runtime_the_same():
    rt = Recording()
    options = RunOptions(**given(rt))
    tool = run_code_tool([], options=options)
    (offered,) = visible_tools("code", [], options=options)
    for door in (tool, offered):
        door.function({"code": "return 1", "description": "test"})
    assert rt.seen == [expected()] * 2


@pytest.mark.parametrize("door", ["run_code_tool", "visible_tools"])
def test_an_option_given_both_to_a_tool_door_is_refused_naming_it(door):
    options = RunOptions(**given(QuickJSRuntime()))
    make = (
        (lambda **k: run_code_tool([], **k))
        if door == "run_code_tool"
        else (lambda **k: visible_tools("both", [], **k))
    )
    # run_code's options, and the door's own option keywords, even at their default.
    for name, value in [("timeout", 5), ("max_parallel", 3), ("runtime", QuickJSRuntime()), ("policy", None)]:
        assert refusal(lambda: make(options=options, **{name: value}))[:2] == (door, name)
    assert refusal(lambda: make(options=options, output_budget=20_000))[:2] == (door, "output_budget")
    assert refusal(lambda: make(options={"timeout": 5}))[:2] == (door, "options")


def test_a_tool_doors_output_budget_is_its_default_with_keywords_and_the_options_with_options():
    from nous_sched.result.budget import DEFAULT_OUTPUT_BUDGET

    def answer(tool):
        value = tool.function({"code": "return 'x'.repeat(30000)", "description": "test"})
        return len(json.dumps(value, separators=(",", ":")).encode())

    rt = QuickJSRuntime()
    assert answer(run_code_tool([], runtime=rt)) <= DEFAULT_OUTPUT_BUDGET  # the tool's own default
    assert answer(run_code_tool([], options=RunOptions(runtime=rt))) > 30_000  # RunOptions' default: None
    assert answer(run_code_tool([], options=RunOptions(runtime=rt, output_budget=1_000))) <= 1_000


def test_traced_run_code_takes_options_and_hands_the_runtime_the_same():
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider

    from nous_sched import otel

    rt = Recording()
    tracer = TracerProvider().get_tracer("test_run_options")
    options = RunOptions(description="test", **given(rt))
    assert otel.traced_run_code("return 1", tracer=tracer, options=options).result == 1
    assert rt.seen == [expected()]
    for name, value in [("call_id", "door"), ("observer", None), ("timeout", 5)]:
        assert refusal(lambda: otel.traced_run_code("return 1", options=options, **{name: value}))[:2] == (
            "traced_run_code",
            name,
        )


def test_serve_mcp_takes_options_and_hands_the_runtime_the_same():
    pytest.importorskip("mcp")
    import anyio
    from mcp import Client

    from nous_sched.mcp import CodeModeServer

    rt = Recording()
    options = RunOptions(policy=PermissionPolicy(), runtime=rt, limits=LIMITS, deps=DEPS, max_parallel=3)
    server = CodeModeServer([], options=options)

    async def go():
        with anyio.fail_after(WAIT):
            async with Client(server.server) as client:
                return await client.call_tool("run_code", {"code": "return 1", "description": "test"})

    result = anyio.run(go)
    assert result.structured_content == {"logs": [], "result": 1}
    ((limits, deps, description, call_id, max_parallel),) = rt.seen
    assert (limits, deps, description, max_parallel) == (LIMITS, DEPS, "test", 3)
    assert call_id.startswith("mcp-run-"), "the server names each run"


def test_serve_mcp_refuses_an_option_given_both_ways_or_one_it_sets_per_run():
    pytest.importorskip("mcp")
    from nous_sched.mcp import CodeModeServer

    options = RunOptions(runtime=QuickJSRuntime())
    for name, value in [("policy", None), ("timeout", 5), ("runtime", QuickJSRuntime())]:
        assert refusal(lambda: CodeModeServer([], options=options, **{name: value}))[:2] == ("CodeModeServer", name)
    for name, value in [("call_id", "mine"), ("description", "mine"), ("cancel", threading.Event())]:
        with pytest.raises(ConfigError, match=f"CodeModeServer: `{name}` is set per run by the server"):
            CodeModeServer([], options=options.evolve(**{name: value}))

"""``run_code`` and the ``run_code`` tool, grouped by what they promise: the
description and program a run needs, the runtime seam, results as data, what
a runtime is handed, the lane behind each run, the tool's schema, permissions
and per-sub-call approval, and code modes. The first groups port the original
``run_code_tool_test.exs`` (tests 1-29); every test is named for its behaviour.

Python mapping of the Elixir shapes:

* ``{:error, String}`` (nothing ran) is :class:`RunCodeError` raised, by
  ``run_code`` for a non-str program or by the tool's ``function`` for a
  missing/blank ``code``/``description``.
* A "provider" is any object with ``run(program, host, limits)``; the fake
  runtimes here drive the lane through ``host.call(name, args).wait(t)``
  without any JavaScript.
* ``{:ok, out, %ContextUpdate{}}`` is :class:`WithContextUpdate`.
* "The scheduler is dead" means its driver (``nous-sched-driver-*``, a
  thread borrowed from the warm driver threads) is done with it once
  ``run_code`` returns: no thread bears that name, and the thread went back
  idle or exited, not leaked (``drivers.assert_released``). The driver is
  captured either by an ``observer`` (which runs on the driver) or by a fake
  runtime that looks at the threads driving while it runs.

Ordering is controlled with Events/Barriers only; every wait is bounded.
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from drivers import assert_released, driving, me

import nous_sched
from nous_sched import (
    ApprovalRequest,
    CodeRuntime,
    ConfigError,
    LogEvent,
    Outcome,
    PermissionPolicy,
    RunCodeError,
    RunError,
    RuntimeOutcome,
    Tool,
    WithContextUpdate,
    WorkerPool,
    current_call,
    run_code,
    run_code_tool,
    visible_tools,
)
from nous_sched._run.runner import resolve_runtime
from nous_sched.agent import RUN_CODE_DESCRIPTION
from nous_sched.result._explain import FIXES
from nous_sched.runtime.quickjs import QuickJSRuntime

# Every test runs against both runtimes (conftest.py `runtime`).
pytestmark = pytest.mark.usefixtures("runtime")

WAIT = 10.0  # bound on every wait for something that must happen


# --- helpers -------------------------------------------------------------------------


def echo_tool(name="echo", **kw):
    return Tool(name=name, function=lambda args: args, **kw)


def const_tool(name, value, **kw):
    return Tool(name=name, function=lambda args: value, **kw)


def drivers() -> set:
    return driving()


def assert_dead(captured) -> None:
    """Every captured driver is done with its scheduler, idle or exited (not leaked)."""
    assert_released(captured)


class LaneSpy:
    """An ``observer``: it runs on the driver, so it captures the driver thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.threads: set = set()
        self.phases: list = []

    def __call__(self, record, phase) -> None:
        with self.lock:
            self.threads.add(me())
            self.phases.append((record.seq, record.tool, phase))

    def assert_dead(self) -> None:
        assert_dead(self.threads)


class FakeRuntime(CodeRuntime):
    """A provider without JavaScript. ``body(program, host, limits)`` does the run;
    every run records what the runtime was handed and which drivers were alive."""

    language = "fake"

    def __init__(self, body=None) -> None:
        self.body = body
        self.runs: list = []

    def run(self, program, host, limits):
        self.runs.append(
            SimpleNamespace(
                program=program,
                names=tuple(host.names),
                limits=limits,
                thread=threading.current_thread(),
                drivers=drivers(),
            )
        )
        if self.body is not None:
            return self.body(program, host, limits)
        return RuntimeOutcome(logs=("fake ran",), result="fake")


def fake_call(host, name, args):
    """Start one call through the host and wait for its committed outcome."""
    outcome = host.call(name, args).wait(WAIT)
    assert outcome is not None, f"call {name!r} did not commit within {WAIT}s"
    return outcome


def call_rc(tool, code, description="test program"):
    return tool.function({"code": code, "description": description})


def unwrap(value):
    """(model-facing dict, ContextUpdate or None) from a run_code tool return."""
    if isinstance(value, WithContextUpdate):
        return value.value, value.update
    return value, None


@pytest.fixture
def no_quickjs(monkeypatch):
    """Make the default runtime's import fail: "no provider configured"."""
    monkeypatch.setitem(sys.modules, "nous_sched.runtime.pool", None)


# === one run ==========================================================================

# --- Description ---------------------------------------------------------------------


def test_empty_description_is_rejected_and_provider_never_started():
    rt = FakeRuntime()
    tool = run_code_tool([echo_tool()], runtime=rt)
    with pytest.raises(RunCodeError) as err:
        tool.function({"code": "return 1", "description": ""})
    assert "non-empty `description`" in str(err.value)
    assert "audit log" in str(err.value)
    assert rt.runs == []


def test_whitespace_only_description_is_rejected():
    rt = FakeRuntime()
    tool = run_code_tool([echo_tool()], runtime=rt)
    for blank in (" ", "\t\n  ", "\u3000"):
        with pytest.raises(RunCodeError, match="non-empty `description`"):
            tool.function({"code": "return 1", "description": blank})
    assert rt.runs == []


def test_missing_description_is_rejected():
    rt = FakeRuntime()
    tool = run_code_tool([echo_tool()], runtime=rt)
    with pytest.raises(RunCodeError) as err:
        tool.function({"code": "return 1"})
    assert "`description`" in str(err.value)
    # Missing and blank are told apart.
    assert "non-empty" not in str(err.value)
    for not_a_string in (None, 7, ["a sentence"], {"text": "x"}):
        with pytest.raises(RunCodeError, match="`description`"):
            tool.function({"code": "return 1", "description": not_a_string})
    assert rt.runs == []


def test_missing_or_non_string_program_is_rejected():
    rt = FakeRuntime()
    tool = run_code_tool([echo_tool()], runtime=rt)
    with pytest.raises(RunCodeError, match="`code` parameter"):
        tool.function({"description": "does things"})
    for bad in (42, None, b"return 1", ["return 1"]):
        with pytest.raises(RunCodeError, match="`code` parameter"):
            tool.function({"code": bad, "description": "does things"})
    # run_code itself: a non-str program is "nothing ran", before any runtime is touched.
    with pytest.raises(RunCodeError, match="`code` parameter"):
        run_code(42, [echo_tool()], runtime=rt, description="test")
    # The program is checked before the description.
    with pytest.raises(RunCodeError, match="`code` parameter"):
        tool.function({"code": 42, "description": ""})
    assert rt.runs == []


def _required_check(schema: dict, args: dict) -> list[str]:
    """The part of JSON Schema validation an agent loop's ToolExecutor applies."""
    problems = [f"missing required property {k!r}" for k in schema["required"] if k not in args]
    for key, value in args.items():
        prop = schema["properties"].get(key)
        if prop is None:
            if schema.get("additionalProperties") is False:
                problems.append(f"unexpected property {key!r}")
        elif prop["type"] == "string" and not isinstance(value, str):
            problems.append(f"{key!r} must be a string")
    return problems


def test_schema_requires_description():
    # Elixir: ToolExecutor validates the schema, so a call without `description`
    # fails mentioning it. Python has no executor: the schema itself says so
    # (checked here with a minimal validator), and the function enforces it too.
    tool = run_code_tool([echo_tool()], runtime=FakeRuntime())
    problems = _required_check(tool.parameters, {"code": "return 1"})
    assert problems == ["missing required property 'description'"]
    assert _required_check(tool.parameters, {"code": "return 1", "description": "d"}) == []
    assert _required_check(tool.parameters, {"code": 1, "description": "d", "x": 1}) == [
        "'code' must be a string",
        "unexpected property 'x'",
    ]
    with pytest.raises(RunCodeError, match="description"):
        tool.function({"code": "return 1"})


# --- Provider ------------------------------------------------------------------------


def test_no_provider_configured(no_quickjs):
    with pytest.raises(RunCodeError) as err:
        resolve_runtime(None)
    message = str(err.value)
    assert "no code runtime is configured" in message
    # Elixir names `config :nous, :code_runtime` and Nous.CodeRuntime; here: how to get one.
    assert "quickjs-ng" in message
    assert "nous_sched.CodeRuntime" in message
    assert "native" in message
    with pytest.raises(RunCodeError, match="no code runtime is configured"):
        run_code("return 1", [echo_tool()], description="test")
    with pytest.raises(RunCodeError, match="no code runtime is configured"):
        run_code_tool([echo_tool()])


def test_provider_not_implementing_the_behaviour():
    # Elixir: configuring `Enum` as the provider. Python: any object without run().
    for not_a_runtime in (object(), SimpleNamespace(run=5), SimpleNamespace(language="js"), int):
        with pytest.raises(RunCodeError, match="does not implement nous_sched.CodeRuntime"):
            run_code("return 1", [echo_tool()], runtime=not_a_runtime, description="test")
        with pytest.raises(RunCodeError, match="does not implement nous_sched.CodeRuntime"):
            run_code_tool([echo_tool()], runtime=not_a_runtime)


def test_no_runtime_option_uses_the_default_provider(runtime):
    # Elixir: execute/2 with no opts uses `config :nous, :code_runtime`.
    # Python: no runtime= means the process's default runtime, a WorkerPool
    # (test_worker_pool.py checks that in a fresh interpreter); here the
    # `runtime` fixture made each runtime the default in turn.
    assert resolve_runtime(None) is runtime
    assert isinstance(runtime, (WorkerPool, QuickJSRuntime))
    tool = run_code_tool([])
    assert call_rc(tool, 'return "via config"') == {"logs": [], "result": "via config"}
    assert run_code('return "via config"', description="test").result == "via config"


# --- Results -------------------------------------------------------------------------


def test_success_returns_exactly_logs_and_result():
    tool = run_code_tool([], runtime=FakeRuntime(lambda p, h, lim: RuntimeOutcome(("a", "b"), result={"x": [1]})))
    out = call_rc(tool, "whatever")
    assert out == {"logs": ["a", "b"], "result": {"x": [1]}}
    assert set(out) == {"logs", "result"}
    # The same through the real runtime.
    out = call_rc(run_code_tool([]), "console.log('hi'); return [1, 'two']")
    assert out == {"logs": ["hi"], "result": [1, "two"]}


def test_failure_returns_exactly_logs_and_error():
    out = call_rc(run_code_tool([]), "console.log('before'); throw new Error('nope')")
    assert set(out) == {"logs", "error"}
    assert out["logs"] == ["before"]
    assert set(out["error"]) == {"kind", "message"}
    assert out["error"]["kind"] == "exception"
    assert out["error"]["message"].startswith("Error: nope")


def test_every_failure_kind_survives_the_round_trip():
    # Python has no `substrate_exit`: a worker process that dies is an `abort`.
    # `cancelled` is the caller's own cancel (run_code(cancel=...)); `replay_diverged` a resumed
    # durable run whose calls differ from its ledger (nous_sched.durable); `cpu_time` its
    # CPU budget spent (Limits.cpu_time); `review_denied` a program its reviewer denied
    # before it started (run_code(review=...)).
    assert nous_sched.ERROR_KINDS == (
        "exception",
        "timeout",
        "abort",
        "invalid_output",
        "output_limit",
        "cancelled",
        "replay_diverged",
        "cpu_time",
        "review_denied",
    )
    with pytest.raises(ValueError):
        RunError("substrate_exit", "x")
    for kind in nous_sched.ERROR_KINDS:
        rt = FakeRuntime(lambda p, h, lim, kind=kind: RuntimeOutcome(("log",), error=RunError(kind, f"m-{kind}")))
        out = call_rc(run_code_tool([], runtime=rt), "x")
        # Each kind but the program's own exception says what to change (nous_sched.result._explain).
        told = f"m-{kind}" + (f". {FIXES[kind]}" if kind != "exception" else "")
        assert out == {"logs": ["log"], "error": {"kind": kind, "message": told}}
        assert isinstance(out["error"]["kind"], str)


def test_run_that_never_answers_times_out(make_event):
    # Elixir: the provider never answers within 50 ms -> cancel(ref, :timeout) and
    # kind "timeout" mentioning "50ms" with logs []. Python: the runtime runs on the
    # caller's thread and enforces the deadline itself; a tool that never returns is
    # what "never answers" looks like. Unlike the original, logs are kept.
    hang = make_event()
    started = make_event()

    def hangs(args):
        started.set()
        hang.wait(WAIT * 3)
        return "late"

    tool = run_code_tool([Tool("hangs", hangs)], timeout=0.5)
    t0 = time.monotonic()
    out, update = unwrap(call_rc(tool, "console.log('waiting'); return await tools.hangs({})"))
    elapsed = time.monotonic() - t0
    assert started.is_set()
    assert out["logs"] == ["waiting"]
    assert out["error"]["kind"] == "timeout"
    assert "0.5s" in out["error"]["message"]
    assert elapsed < 0.5 + WAIT, "it ends at its deadline, not when the tool returns"
    assert [(op.type, op.data.get("name") or op.data["tool"]) for op in update.operations] == [
        ("tool_call", "hangs"),
        ("tool_outcome", "hangs"),
    ]
    assert update.operations[1].data["error"]["kind"] == "abandoned"


def test_runtime_refusing_the_request_propagates_unchanged():
    # Elixir: start_run returns {:error, {:contract, msg}} -> "the code runtime refused
    # the request: msg". Python's seam has no refusal value: a runtime refuses by
    # raising, and run_code lets that through unchanged (and still stops the lane).
    def refuse(program, host, limits):
        raise RunCodeError("the code runtime refused the request: disposed runtime")

    rt = FakeRuntime(refuse)
    before = drivers()
    with pytest.raises(RunCodeError, match="^the code runtime refused the request: disposed runtime$"):
        call_rc(run_code_tool([echo_tool()], runtime=rt), "return 1")
    assert len(rt.runs) == 1
    assert_dead(rt.runs[0].drivers - before)


def test_runtime_returning_garbage_is_a_clear_error():
    # Elixir: "code runtime M returned :whatever from start_run/2; expected ...".
    rt = FakeRuntime(lambda p, h, lim: "whatever")
    with pytest.raises(RunCodeError) as err:
        run_code("return 1", runtime=rt, description="test")
    assert "whatever" in str(err.value) and "RuntimeOutcome" in str(err.value)


def test_runtime_returning_garbage_still_stops_the_lane():
    # The part of test 14 that holds today: whatever the runtime returns, the lane ends.
    rt = FakeRuntime(lambda p, h, lim: "whatever")
    before = drivers()
    with pytest.raises(Exception):
        run_code("return 1", runtime=rt, description="test")
    assert_dead(rt.runs[0].drivers - before)


def test_bad_runtime_and_run_options():
    # Elixir: a bad :runtime option -> "invalid :runtime option ...". Python: a value
    # that is not a runtime, and bad run options, fail before anything runs.
    for bad in ("quickjs", 42, ("QuickJSRuntime", {}), {"run": "x"}):
        with pytest.raises(RunCodeError, match="does not implement"):
            run_code("return 1", runtime=bad, description="test")
    before = drivers()
    with pytest.raises(ConfigError, match="limits"):
        run_code("return 1", limits="fast", description="test")
    with pytest.raises(ConfigError, match="timeout"):
        run_code("return 1", timeout=0, description="test")
    with pytest.raises(ConfigError, match="policy"):
        run_code("return 1", policy={"deny": ["x"]}, description="test")
    with pytest.raises(ConfigError, match="approval_handler"):
        run_code("return 1", approval_handler="yes", description="test")
    with pytest.raises(ConfigError, match="max_parallel"):
        run_code("return 1", max_parallel=0, description="test")
    with pytest.raises(ConfigError, match="tools"):
        run_code("return 1", "echo", description="test")
    with pytest.raises(ConfigError, match="tools"):
        run_code("return 1", [lambda args: args], description="test")
    # None of these left a lane running.
    assert not (drivers() - before)


# --- Request -------------------------------------------------------------------------


def test_runtime_gets_program_owner_and_bindings():
    policy = PermissionPolicy(deny=["denied"])
    granted_calls = []
    denied_calls = []
    tools = [
        Tool("granted", lambda a: granted_calls.append(a) or "granted ran"),
        Tool("denied", lambda a: denied_calls.append(a) or "denied ran"),
    ]
    outcomes = {}

    def body(program, host, limits):
        outcomes["granted"] = fake_call(host, "granted", {})
        outcomes["denied"] = fake_call(host, "denied", {})
        return RuntimeOutcome(())

    rt = FakeRuntime(body)
    program = "the program text\n  exactly"
    result = run_code(program, tools, policy=policy, runtime=rt, description="test")
    (run,) = rt.runs
    assert run.program == program
    assert run.thread is threading.current_thread()  # the "owner": the caller's thread
    assert run.names == ("denied", "granted")
    assert outcomes["granted"] == Outcome.success("granted ran")
    assert not outcomes["denied"].ok
    assert outcomes["denied"].error.as_dict() == {
        "tool": "denied",
        "message": 'tool "denied" is denied by the permission policy',
    }
    assert denied_calls == [] and granted_calls == [{}]
    assert [e.tool for e in result.calls] == ["granted"]


def test_no_tools_still_has_an_empty_binding():
    rt = FakeRuntime()
    run_code("return 1", [], runtime=rt, description="test")
    assert rt.runs[0].names == ()
    result = run_code("return [typeof tools, Object.keys(tools), Object.getPrototypeOf(tools)]", description="test")
    assert result.result == ["object", [], None]


def test_custom_dispatch_is_used_and_the_lane_still_logs():
    seen = []

    def dispatch(tool, args, run_ctx):
        seen.append((tool.name, args, run_ctx.deps))
        return f"dispatched {tool.name}"

    alpha = Tool("alpha", lambda a: pytest.fail("the tool function must not be called directly"))
    result = run_code(
        "return await tools.alpha({x: 1})", [alpha], dispatch=dispatch, deps="my-deps", description="test"
    )
    assert result.result == "dispatched alpha"
    assert seen == [("alpha", {"x": 1}, "my-deps")]
    assert [e.tool for e in result.calls] == ["alpha"]


# --- Lane ----------------------------------------------------------------------------


def test_six_calls_two_tools_events_in_submission_order():
    tools = [echo_tool("alpha"), echo_tool("beta")]
    tool = run_code_tool(tools)
    program = """
        const names = ["alpha", "beta", "alpha", "beta", "alpha", "beta"];
        return await Promise.all(names.map(n => tools[n]({n})));
    """
    value = call_rc(tool, program)
    assert isinstance(value, WithContextUpdate)
    out, update = value.value, value.update
    names = ["alpha", "beta", "alpha", "beta", "alpha", "beta"]
    assert out == {"logs": [], "result": [{"n": n} for n in names]}
    ops = [op for op in update.operations if op.type == "tool_call"]
    assert all(isinstance(op, LogEvent) for op in update.operations)
    assert [op.data["seq"] for op in update.operations if op.type == "tool_outcome"] == list(range(6))
    assert [op.data["name"] for op in ops] == names
    assert [op.data["seq"] for op in ops] == list(range(6))
    assert [op.data["arguments"] for op in ops] == [{"n": n} for n in names]
    assert [op.data["source"] for op in ops] == ["code_mode"] * 6
    ids = [op.data["id"] for op in ops]
    assert len(set(ids)) == 6
    assert all(i.startswith("run_code-") for i in ids)
    call_id = ids[0].rsplit(":code:", 1)[0]
    assert ids == [f"{call_id}:code:{n}" for n in range(6)]


def test_call_id_option_prefixes_event_ids():
    result = run_code("await tools.echo({}); await tools.echo({})", [echo_tool()], call_id="turn-7", description="test")
    assert [e.id for e in result.calls] == ["turn-7:code:0", "turn-7:code:1"]
    other = run_code("await tools.echo({})", [echo_tool()], description="test")
    assert other.calls[0].id.startswith("run_code-")
    assert other.calls[0].id != run_code("await tools.echo({})", [echo_tool()], description="test").events[0].id


def test_no_sub_calls_returns_a_plain_result():
    value = call_rc(run_code_tool([echo_tool()]), "return 'no calls'")
    assert not isinstance(value, WithContextUpdate)
    assert value == {"logs": [], "result": "no calls"}


def test_failure_after_a_sub_call_keeps_its_audit_event():
    # Elixir: {:error, msg} after a sub-call dropped the events and logged
    # "run_code failed after 1 sub-dispatch(es) (alpha)". Python returns a failed
    # run as data, so the error travels *with* its context update: nothing is lost.
    tool = run_code_tool([echo_tool("alpha")])
    value = call_rc(tool, "await tools.alpha({n: 1}); throw new Error('after alpha')")
    assert isinstance(value, WithContextUpdate)
    assert value.value["error"]["kind"] == "exception"
    assert "after alpha" in value.value["error"]["message"]
    assert [(op.type, op.data.get("name"), op.data.get("arguments")) for op in value.update.operations] == [
        ("tool_call", "alpha", {"n": 1}),
        ("tool_outcome", None, None),
    ]


def test_scheduler_is_dead_after_a_successful_run():
    rt = FakeRuntime(lambda p, h, lim: RuntimeOutcome((), result=fake_call(h, "echo", {"a": 1}).value))
    before = drivers()
    result = run_code("x", [echo_tool()], runtime=rt, description="test")
    assert result.ok and result.result == {"a": 1}
    lane = rt.runs[0].drivers - before
    assert len(lane) == 1, "exactly one lane was running during the run"
    assert_dead(lane)
    # The same with the real runtime, capturing the driver through the observer.
    spy = LaneSpy()
    assert run_code("return await tools.echo({})", [echo_tool()], observer=spy, description="test").ok
    spy.assert_dead()


def test_concurrent_runs_each_get_their_own_lane():
    # Elixir: killing the runner process kills the linked scheduler. A Python run
    # cannot outlive its caller's thread (the runtime runs *on* it), so the intent
    # ported is isolation: many run_code calls at once, from many threads, each get
    # their own scheduler, their own events and the right results.
    n = 8
    # Eight fresh workers must all be live at once: on a loaded 2-core machine
    # the spares behind them boot slowly, so this bound is far past WAIT's.
    barrier = threading.Barrier(n, timeout=60.0)

    def who(args):
        if args.get("sync"):
            barrier.wait()  # every run is live at once
        info = current_call.get()
        return {"i": args["i"], "id": info.id}

    tools = [Tool("who", who, concurrency_safe=lambda a: True)]
    program = """
        const a = await tools.who({i: I, sync: true});
        const [b, c] = await Promise.all([tools.who({i: I}), tools.who({i: I})]);
        return [a, b, c];
    """
    spies = [LaneSpy() for _ in range(n)]

    def one(i):
        return run_code(
            program.replace("I", str(i)), tools, call_id=f"run-{i}", observer=spies[i], description="test", timeout=90
        )

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(one, range(n)))
    lanes = set()
    for i, result in enumerate(results):
        assert result.ok, result.error
        assert [r["i"] for r in result.result] == [i, i, i]
        assert [r["id"] for r in result.result] == [f"run-{i}:code:{k}" for k in range(3)]
        assert [e.id for e in result.calls] == [f"run-{i}:code:{k}" for k in range(3)]
        assert len(spies[i].threads) == 1
        lanes |= spies[i].threads
        spies[i].assert_dead()
    assert len(lanes) == n


def test_after_a_program_failure_the_lane_is_dead_and_its_event_survives():
    spy = LaneSpy()
    result = run_code(
        "await tools.alpha({}); throw new Error('boom')", [echo_tool("alpha")], observer=spy, description="test"
    )
    assert result.error.kind == "exception"
    assert [e.tool for e in result.calls] == ["alpha"]
    spy.assert_dead()


def test_after_a_timeout_the_lane_is_dead_and_its_event_survives(make_event):
    gate = make_event()
    spy = LaneSpy()
    tools = [echo_tool("alpha"), Tool("stuck", lambda a: gate.wait(WAIT * 3))]
    result = run_code(
        "await tools.alpha({}); await tools.stuck({})", tools, observer=spy, timeout=0.5, description="test"
    )
    assert result.error.kind == "timeout"
    assert [e.tool for e in result.calls] == ["alpha", "stuck"]
    spy.assert_dead()


def test_runtime_that_raises_propagates_and_the_lane_is_dead():
    def crash(program, host, limits):
        fake_call(host, "echo", {})
        raise RuntimeError("provider crashed")

    rt = FakeRuntime(crash)
    spy = LaneSpy()
    with pytest.raises(RuntimeError, match="provider crashed"):
        run_code("x", [echo_tool()], runtime=rt, observer=spy, description="test")
    with pytest.raises(RuntimeError, match="provider crashed"):
        call_rc(run_code_tool([echo_tool()], runtime=rt, observer=spy), "x")
    assert len(spy.threads) == 2
    spy.assert_dead()


def _gated_slow_tool():
    """A concurrency-safe tool whose calls all block until ten run at once."""
    cond = threading.Condition()
    state = {"inflight": 0, "max": 0}
    full = threading.Event()

    def slow(args):
        with cond:
            state["inflight"] += 1
            state["max"] = max(state["max"], state["inflight"])
            if state["inflight"] == 10:
                full.set()
        try:
            # Nobody finishes until ten run at once: a lower cap would fail here.
            if not full.wait(WAIT):
                raise RuntimeError("ten calls never ran at once")
            return args["i"]
        finally:
            with cond:
                state["inflight"] -= 1

    return Tool("slow", slow, concurrency_safe=lambda a: True), state


TWELVE = "return await Promise.all(Array.from({length: 12}, (_, i) => tools.slow({i})))"


def test_twelve_concurrent_calls_max_in_flight_exactly_ten():
    slow, state = _gated_slow_tool()
    tool = run_code_tool([slow])  # the default max_parallel: 10
    out, update = unwrap(call_rc(tool, TWELVE))
    assert out == {"logs": [], "result": list(range(12))}
    assert state["max"] == 10
    calls = [op for op in update.operations if op.type == "tool_call"]
    assert len(calls) == 12
    assert {op.data["mode"] for op in calls} == {"parallel"}


def test_the_eleventh_call_waits_for_a_slot():
    slow, state = _gated_slow_tool()
    result = run_code(TWELVE, [slow], description="test")
    assert result.result == list(range(12)) and state["max"] == 10
    assert len(result.calls) == 12
    first_finish = min(r.finished for r in result.trail[:10])
    assert all(r.started >= first_finish for r in result.trail[10:])


# --- Tool ----------------------------------------------------------------------------


def test_schema_requires_code_and_description_as_strings():
    tool = run_code_tool([echo_tool()])
    params = tool.parameters
    assert params["type"] == "object"
    assert params["required"] == ["code", "description"]
    assert params["properties"]["code"]["type"] == "string"
    assert params["properties"]["description"]["type"] == "string"
    assert set(params["properties"]) == {"code", "description"}
    assert params["additionalProperties"] is False


def test_category_execute_and_approval_by_category():
    # Elixir: requires_approval?(:permissive, "run_code", :execute) is true. Python:
    # a policy gating the "execute" category gates run_code.
    tool = run_code_tool([echo_tool()])
    assert tool.name == "run_code"
    assert tool.category == "execute"
    assert tool.requires_approval is False
    assert PermissionPolicy(approval_categories="execute").needs_approval(tool)
    assert not PermissionPolicy().needs_approval(tool)


# === permissions and approval ==========================================================

CATCH = """
try { return ["ok", await tools[NAME](ARGS)]; }
catch (e) { return [e instanceof ToolError, e.tool, e.message]; }
"""


def catch_program(name, args="{}"):
    return CATCH.replace("NAME", repr(name)).replace("ARGS", args)


def test_granted_tool_is_bound_and_callable():
    policy = PermissionPolicy(allow=["search"])
    tools = [const_tool("search", ["hit"]), const_tool("other", "x")]
    result = run_code(
        "return [Object.keys(tools), await tools.search({q: 'a'})]", tools, policy=policy, description="test"
    )
    # A tool outside `allow` is denied, yet still declared.
    assert result.result == [["other", "search"], ["hit"]]
    assert [e.tool for e in result.calls] == ["search"]


def test_denied_tool_answers_exactly_and_never_reaches_the_scheduler():
    called = []
    spy = LaneSpy()
    tools = [Tool("x", lambda a: called.append(a) or "ran")]
    result = run_code(
        catch_program("x", "{a: 1}"), tools, policy=PermissionPolicy(deny="x"), observer=spy, description="test"
    )
    assert result.result == [True, "x", 'tool "x" is denied by the permission policy']
    assert result.calls == ()
    assert result.trail == ()
    assert spy.phases == []
    assert called == []


def test_denied_wins_over_approval_and_never_asks():
    asked = []
    tools = [Tool("pay", lambda a: "paid", requires_approval=True)]
    result = run_code(
        catch_program("pay"),
        tools,
        policy=PermissionPolicy(deny=["pay"]),
        approval_handler=asked.append,
        description="test",
    )
    assert result.result == [True, "pay", 'tool "pay" is denied by the permission policy']
    assert asked == []


def test_unknown_tool_through_the_host_is_refused():
    got = {}

    def body(program, host, limits):
        got["unknown"] = fake_call(host, "nope", {})
        return RuntimeOutcome(())

    result = run_code("x", [echo_tool()], runtime=FakeRuntime(body), description="test")
    assert got["unknown"].error.as_dict() == {
        "tool": "nope",
        "message": 'unknown tool "nope". Object.keys(tools) lists the 1 declared tool; '
        'sdk.search("words") finds them by what they do.',
    }
    assert result.calls == ()


class Approvals:
    def __init__(self, answer=True) -> None:
        self.answer = answer
        self.lock = threading.Lock()
        self.requests: list = []

    def __call__(self, request):
        with self.lock:
            self.requests.append(request)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def test_requires_approval_asks_once_per_sub_call_with_real_name_and_args():
    ran = []
    handler = Approvals(True)
    tools = [Tool("pay", lambda a: ran.append(a) or f"paid {a['amount']}", description="Pay.", requires_approval=True)]
    program = "return [await tools.pay({amount: 1}), await tools.pay({amount: 2, to: 'bob'})]"
    result = run_code(program, tools, approval_handler=handler, description="Pay twice.")
    assert result.result == ["paid 1", "paid 2"]
    # The run's description, the call's audit id and the tool's description.
    ids = [e.id for e in result.calls]
    # And what the program's text says is coming for the tool (its static summary).
    coming = "the program's text has 2 call sites: at most 2 calls in all"
    assert handler.requests == [
        ApprovalRequest("pay", {"amount": 1}, "Pay twice.", ids[0], "Pay.", coming=coming),
        ApprovalRequest("pay", {"amount": 2, "to": "bob"}, "Pay twice.", ids[1], "Pay.", coming=coming),
    ]
    assert ran == [{"amount": 1}, {"amount": 2, "to": "bob"}]


def test_approval_handler_rejecting_becomes_a_catchable_tool_error():
    ran = []
    for answer in (False, None, 1, "yes", "approve"):  # only `True` approves
        handler = Approvals(answer)
        tools = [Tool("pay", lambda a: ran.append(a), requires_approval=True)]
        program = catch_program("pay", "{amount: 5}").replace("return [e", "console.log('caught'); return [e")
        result = run_code(program, tools, approval_handler=handler, description="test")
        assert result.result == [True, "pay", 'tool "pay" was rejected by the approval handler'], answer
        assert result.logs == ("caught",)
        assert [(r.tool, r.arguments, r.description) for r in handler.requests] == [("pay", {"amount": 5}, "test")]
        # The call was started (and is audited) but the tool never ran.
        assert [(e.tool, e.arguments) for e in result.calls] == [("pay", {"amount": 5})]
    assert ran == []


def test_approval_handler_raising_refuses_the_call():
    ran = []
    handler = Approvals(RuntimeError("approval service down"))
    tools = [Tool("pay", lambda a: ran.append(a), requires_approval=True)]
    result = run_code(catch_program("pay"), tools, approval_handler=handler, description="test")
    assert result.result[:2] == [True, "pay"]
    assert "approval service down" in result.result[2]
    assert ran == []


def test_no_approval_handler_means_refused():
    ran = []
    tools = [Tool("pay", lambda a: ran.append(a), requires_approval=True)]
    result = run_code(catch_program("pay"), tools, description="test")
    assert result.result == [True, "pay", 'tool "pay" requires approval and no approval handler is configured']
    assert ran == []


def test_policy_require_approval_by_name():
    handler = Approvals(True)
    tools = [const_tool("write", "written"), const_tool("read", "read it")]
    policy = PermissionPolicy(require_approval=["write"])
    result = run_code(
        "return [await tools.read({}), await tools.write({path: 'a'})]",
        tools,
        policy=policy,
        approval_handler=handler,
        description="test",
    )
    assert result.result == ["read it", "written"]
    assert [(r.tool, r.arguments) for r in handler.requests] == [("write", {"path": "a"})]
    # Without a handler the same policy refuses the gated tool and only it.
    result = run_code(
        "const r = await tools.read({}); try { await tools.write({}) } catch (e) { return [r, e.message] }",
        tools,
        policy=policy,
        description="test",
    )
    assert result.result == ["read it", 'tool "write" requires approval and no approval handler is configured']


def test_policy_approval_categories():
    handler = Approvals(False)
    tools = [
        Tool("rm", lambda a: "removed", category="execute"),
        Tool("ls", lambda a: ["f"], category="read"),
    ]
    policy = PermissionPolicy(approval_categories=["execute"])
    program = "const l = await tools.ls({}); try { await tools.rm({p: 1}) } catch (e) { return [l, e.message] }"
    result = run_code(program, tools, policy=policy, approval_handler=handler, description="test")
    assert result.result == [["f"], 'tool "rm" was rejected by the approval handler']
    assert [(r.tool, r.arguments) for r in handler.requests] == [("rm", {"p": 1})]


def test_run_code_tool_applies_the_policy_to_every_sub_call():
    handler = Approvals(True)
    tools = [const_tool("a", 1), const_tool("b", 2, requires_approval=True), const_tool("c", 3)]
    tool = run_code_tool(tools, policy=PermissionPolicy(deny=["c"]), approval_handler=handler)
    out, update = unwrap(
        call_rc(
            tool,
            """
        const r = [await tools.a({}), await tools.b({})];
        try { await tools.c({}) } catch (e) { r.push(e.message) }
        return r;
    """,
        )
    )
    assert out["result"] == [1, 2, 'tool "c" is denied by the permission policy']
    assert [r.tool for r in handler.requests] == ["b"]
    # Started calls are audited as tool_call, the denied one as tool_refused.
    assert [(op.type, op.data.get("name")) for op in update.operations if op.type in ("tool_call", "tool_refused")] == [
        ("tool_call", "a"),
        ("tool_call", "b"),
        ("tool_refused", "c"),
    ]


# === modes ============================================================================


def _names(tools):
    return [t.name for t in tools]


def test_mode_native_returns_granted_tools_only():
    tools = [echo_tool("a"), echo_tool("b"), echo_tool("c")]
    assert _names(visible_tools("native", tools)) == ["a", "b", "c"]
    assert _names(visible_tools("native", tools, policy=PermissionPolicy(deny="b"))) == ["a", "c"]


def test_mode_code_returns_only_run_code():
    tools = [echo_tool("a"), echo_tool("b")]
    (rc,) = visible_tools("code", tools, policy=PermissionPolicy(deny="b"))
    assert rc.name == "run_code"
    assert '"a"(' in rc.description and '"b"(' not in rc.description
    out, _ = unwrap(call_rc(rc, "try { await tools.b({}) } catch (e) { return [await tools.a({v: 1}), e.message] }"))
    assert out["result"] == [{"v": 1}, 'tool "b" is denied by the permission policy']


def test_mode_code_with_deny_all_still_offers_run_code():
    tools = [echo_tool("a")]
    (rc,) = visible_tools("code", tools, policy=PermissionPolicy(allow=[]))
    assert rc.name == "run_code"
    out, update = unwrap(call_rc(rc, "try { await tools.a({}) } catch (e) { return e.message }"))
    assert out["result"] == 'tool "a" is denied by the permission policy'
    assert update is None
    assert visible_tools("native", tools, policy=PermissionPolicy(allow=[])) == []


def test_mode_both_returns_granted_plus_run_code():
    tools = [echo_tool("a"), echo_tool("b")]
    got = visible_tools("both", tools, policy=PermissionPolicy(deny="a"))
    assert _names(got) == ["b", "run_code"]
    out = call_rc(got[-1], "return 'both'")
    assert out == {"logs": [], "result": "both"}


def test_mode_both_without_runtime_degrades_to_native(no_quickjs):
    tools = [echo_tool("a"), echo_tool("b")]
    assert _names(visible_tools("both", tools)) == ["a", "b"]
    assert _names(visible_tools("native", tools)) == ["a", "b"]
    with pytest.raises(RunCodeError, match="no code runtime is configured"):
        visible_tools("code", tools)


def test_mode_both_with_a_bad_runtime_degrades_but_code_fails():
    tools = [echo_tool("a")]
    assert _names(visible_tools("both", tools, runtime=object())) == ["a"]
    with pytest.raises(RunCodeError, match="does not implement"):
        visible_tools("code", tools, runtime=object())


def test_mode_invalid_is_a_config_error():
    for mode in ("Code", "all", None, ""):
        with pytest.raises(ConfigError, match="`mode` must be one of 'native', 'code', 'both'"):
            visible_tools(mode, [echo_tool()])
    assert nous_sched.MODES == ("native", "code", "both")


def test_visible_tools_passes_run_options_through():
    tools = [echo_tool("a")]
    rc = visible_tools("both", tools, call_id="turn-3")[-1]
    value = call_rc(rc, "return await tools.a({})")
    assert [op.data["id"] for op in value.update.operations if op.type == "tool_call"] == ["turn-3:code:0"]


# === the run_code tool =================================================================


def test_run_code_tool_description_declares_granted_tools_only():
    tools = [
        Tool(
            "search_docs",
            lambda a: a,
            description="Search the docs.",
            parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        ),
        Tool("secret_admin", lambda a: a),
    ]
    tool = run_code_tool(tools, policy=PermissionPolicy(deny=["secret_admin"]))
    assert tool.description.startswith(RUN_CODE_DESCRIPTION + "\n\n")
    assert "declare const tools" in tool.description
    assert '"search_docs"(' in tool.description
    assert "Search the docs." in tool.description
    assert "secret_admin" not in tool.description
    assert RUN_CODE_DESCRIPTION.startswith("Run a program that calls tools.")
    assert "`tools` object declared below" in RUN_CODE_DESCRIPTION


def test_run_code_tool_with_no_tools_still_declares_tools():
    tool = run_code_tool([])
    assert "declare const tools" in tool.description


def test_run_code_tool_duplicate_names_first_wins():
    tools = [const_tool("dup", "first"), const_tool("dup", "second")]
    out, _ = unwrap(call_rc(run_code_tool(tools), "return await tools.dup({})"))
    assert out["result"] == "first"


def test_run_code_tool_non_object_arguments_are_a_run_code_error():
    tool = run_code_tool([echo_tool()], runtime=FakeRuntime())
    for bad in (["return 1"], "return 1", None, 5):
        with pytest.raises(RunCodeError, match="`code` parameter"):
            tool.function(bad)


def test_run_code_rejects_bad_tool_lists_before_running():
    rt = FakeRuntime()
    with pytest.raises(ConfigError):
        run_code_tool("not tools", runtime=rt)
    with pytest.raises(ConfigError):
        run_code_tool([{"name": "x"}], runtime=rt)
    assert rt.runs == []


def test_run_code_returns_data_for_the_model_and_audit_apart():
    result = run_code("console.log('hi'); return await tools.echo({k: [1, 2]})", [echo_tool()], description="test")
    assert result.ok
    assert result.to_dict() == {"logs": ["hi"], "result": {"k": [1, 2]}}
    assert [(e.tool, e.arguments, e.mode, e.seq, e.source) for e in result.calls] == [
        ("echo", {"k": [1, 2]}, "exclusive", 0, "code_mode")
    ]
    assert [(r.seq, r.tool, r.ok) for r in result.trail] == [(0, "echo", True)]
    assert result.elapsed >= 0
    ops = result.context_update().operations
    assert [(op.type, op.data.get("name")) for op in ops] == [("tool_call", "echo"), ("tool_outcome", None)]


def test_every_sub_call_sees_the_run_deadline_through_current_call():
    seen = []

    def probe(args):
        seen.append(current_call.get().run_ctx.deadline)
        return time.monotonic()

    before = time.monotonic()
    result = run_code(
        "return [await tools.probe({}), await tools.probe({})]",
        [Tool("probe", probe)],
        timeout=7.5,
        runtime=None,
        description="test",
    )
    after = time.monotonic()
    assert result.ok, result.error
    assert len(seen) == 2 and seen[0] == seen[1]
    # The deadline is fixed when the run starts: its start plus the timeout, later than each call.
    assert before + 7.5 <= seen[0] <= after + 7.5
    assert all(t < seen[0] for t in result.result)

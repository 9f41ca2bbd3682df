"""Python-side faults: tools and predicates that misbehave, and a lane stopped mid-run.

Whatever a tool does, the program sees only JSON or a ``{tool, message}`` error,
the run ends as data within its deadline (plus bounded slack), every started
sub-call has exactly one audit event (ids unique, seqs contiguous from 0), and
every waiting caller is released. Tools that block wait on Events that the
test releases at teardown; nothing here sleeps to synchronise.
"""

from __future__ import annotations

import datetime
import enum
import json
import sys
import threading
import time

import pytest

from nous_sched import (
    ApprovalRequest,
    CodeRuntime,
    Limits,
    Outcome,
    PermissionPolicy,
    RunResult,
    RuntimeOutcome,
    Scheduler,
    Tool,
    ToolError,
    current_call,
    run_code,
)
from nous_sched.scheduler._tool_threads import retire_shared
from nous_sched.sdk.discovery import unknown_tool_message

pytestmark = pytest.mark.timeout(120)

# Bounded slack on top of a run's deadline: run_code's own stop() may wait up to
# min(timeout, 5 s) for the lane, and the 2-core CI box is shared.
SLACK = 8.0
JOIN = 10.0
GONE = "code run is over"


def sched_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith(("nous-sched-driver-", "nous-sched-tool-"))}


def assert_released(before: set[threading.Thread]) -> None:
    retire_shared(0)  # the shared tool threads stay warm: retired, each exits (joined below) unless busy
    for t in sched_threads() - before:
        t.join(JOIN)
    assert not sorted(t.name for t in sched_threads() - before)


def assert_audit(events, expected_names=None) -> None:
    """Exactly one event per started call: unique ids, seqs contiguous from 0."""
    events = list(events)
    assert [e.seq for e in events] == list(range(len(events)))
    assert len({e.id for e in events}) == len(events)
    if expected_names is not None:
        assert [e.tool for e in events] == expected_names


@pytest.fixture
def threads_released():
    before = sched_threads()
    yield
    assert_released(before)


@pytest.fixture
def event(make_event):
    """``event()``: conftest's ``make_event``: set at teardown, so no tool is left blocked."""
    return make_event


def canary() -> None:
    r = run_code(
        "return await tools.add({x: 2, y: 3});",
        [Tool("add", lambda a: a["x"] + a["y"])],
        limits=Limits(timeout=10),
        description="test",
    )
    assert r.error is None and r.result == 5


# -- tools that raise ------------------------------------------------------------------


class StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() itself failed")


class StrRaisesBase(Exception):
    def __str__(self) -> str:
        raise KeyboardInterrupt


class Secret(Exception):
    pass


def _raiser(exc_factory):
    def function(args):
        raise exc_factory()

    return function


def _chained(args):
    try:
        raise Secret("password=hunter2")
    except Secret as exc:
        raise ValueError("outer failure") from exc


RAISERS = {
    "value_error": (lambda: ValueError("bad value"), "bad value"),
    "empty_runtime_error": (lambda: RuntimeError(), "tool call failed"),
    "str_raises": (lambda: StrRaises("hidden"), "tool call failed"),
    "tool_error": (lambda: ToolError("written for the program"), "written for the program"),
    "keyboard_interrupt": (lambda: KeyboardInterrupt(), "tool call did not complete"),
    "system_exit": (lambda: SystemExit(3), "tool call did not complete"),
    "str_raises_base": (lambda: StrRaisesBase("hidden"), "tool call did not complete"),
    "huge_message": (lambda: ValueError("v" * 5000), "v" * 2000 + "… (truncated)"),
    "key_error": (lambda: KeyError("k"), "'k'"),
}


def test_raising_tools_become_two_string_errors(threads_released):
    tools = [Tool(name, _raiser(factory)) for name, (factory, _) in RAISERS.items()]
    tools.append(Tool("chained", _chained))
    program = """
    const out = {};
    for (const name of Object.keys(tools)) {
      try { await tools[name]({}); out[name] = "resolved"; }
      catch (e) { out[name] = [e instanceof ToolError, e.name, e.tool, e.message, Object.keys(e)]; }
    }
    return out;
    """
    r = run_code(program, tools, limits=Limits(timeout=10), call_id="faults", description="test")
    assert r.error is None, r.error
    expected = {name: [True, "ToolError", name, message, ["tool"]] for name, (_, message) in RAISERS.items()}
    expected["chained"] = [True, "ToolError", "chained", "outer failure", ["tool"]]
    assert r.result == expected
    shown = json.dumps(r.to_dict())
    for leak in ("hunter2", "Traceback", "StrRaises", "hidden", ".py"):
        assert leak not in shown
    assert_audit(r.calls, sorted(n for n in expected))
    assert all(rec.ok is False for rec in r.trail)


def test_raising_approval_handler_fails_the_call_not_the_run(threads_released):
    ran = []

    def handler(request: ApprovalRequest):
        raise RuntimeError(f"approver crashed on {request.tool}")

    tool = Tool("guarded", lambda a: ran.append(a) or "ran", requires_approval=True)
    r = run_code(
        "try { return await tools.guarded({a: 1}); } catch (e) { return [e.tool, e.message]; }",
        [tool],
        approval_handler=handler,
        limits=Limits(timeout=10),
        description="test",
    )
    assert r.result == ["guarded", "approver crashed on guarded"]
    assert ran == []
    assert_audit(r.calls, ["guarded"])


# -- tools that hang past the deadline ---------------------------------------------------


def test_tool_hanging_past_the_deadline_times_out_as_data(event):
    release = event()
    entered = threading.Event()

    def hang(args):
        entered.set()
        release.wait(60)
        return "too late"

    before = sched_threads()
    program = 'console.log("waiting"); return await tools.hang({q: 1});'
    started = time.perf_counter()
    r = run_code(program, [Tool("hang", hang)], limits=Limits(timeout=1.0), description="test")
    elapsed = time.perf_counter() - started
    assert entered.is_set()
    assert r.error is not None and r.error.kind == "timeout"
    assert "exceeded its 1s deadline (waiting for tool 'hang' (call 0) to return)" in r.error.message
    assert r.logs == ("waiting",)
    assert elapsed < 1.0 + SLACK
    assert_audit(r.calls, ["hang"])
    assert r.trail[0].finished is None and r.trail[0].committed is None
    release.set()
    assert_released(before)
    canary()


def test_unawaited_call_to_a_hung_tool_keeps_the_result(event):
    """A run ends when every started call committed; an unawaited call that hangs is abandoned at the deadline."""
    release = event()

    def hang(args):
        release.wait(60)
        return "late"

    before = sched_threads()
    started = time.perf_counter()
    r = run_code(
        'tools.hang({}); console.log("bye"); return "returned";',
        [Tool("hang", hang)],
        limits=Limits(timeout=1.0),
        description="test",
    )
    assert time.perf_counter() - started < 1.0 + SLACK
    assert r.error is None and r.result == "returned"
    assert r.logs == ("bye", "[1 tool call(s) started without await were abandoned at the deadline]")
    assert_audit(r.calls, ["hang"])
    release.set()
    assert_released(before)


def test_parallel_fan_out_with_one_hung_call(event):
    release = event()

    def hang(args):
        release.wait(60)
        return "late"

    safe = lambda args: True  # noqa: E731
    tools = [Tool("hang", hang, concurrency_safe=safe), Tool("quick", lambda a: a["i"], concurrency_safe=safe)]
    program = (
        "return await Promise.all([tools.quick({i: 0}), tools.hang({}), tools.quick({i: 2}), tools.quick({i: 3})]);"
    )
    before = sched_threads()
    started = time.perf_counter()
    r = run_code(program, tools, limits=Limits(timeout=1.0), description="test")
    assert time.perf_counter() - started < 1.0 + SLACK
    assert r.error is not None and r.error.kind == "timeout"
    assert_audit(r.calls, ["quick", "hang", "quick", "quick"])
    assert {e.mode for e in r.calls} == {"parallel"}
    release.set()
    assert_released(before)


# -- tools that return values with no JSON form ------------------------------------------


class Color(enum.Enum):
    RED = "red"


_cyclic: list = []
_cyclic.append(_cyclic)
_deep: list = []
for _ in range(250):
    _deep = [_deep]

RETURNS = {
    "object": (object(), "err", "tool returned a value that is not JSON: $: a value of type object is not JSON"),
    "bytes": (
        b"\x00\xff",
        "err",
        "tool returned a value that is not JSON: $: bytes are not JSON; decode them to str or base64-encode them first",
    ),
    "nan": (
        float("nan"),
        "err",
        "tool returned a value that is not JSON: $: nan is not JSON (JSON has no NaN or Infinity)",
    ),
    "nested_inf": (
        {"a": [1, float("-inf")]},
        "err",
        "tool returned a value that is not JSON: $.a[1]: -inf is not JSON (JSON has no NaN or Infinity)",
    ),
    "cyclic": (
        _cyclic,
        "err",
        "tool returned a value that is not JSON: $[0]: cyclic reference (a container that contains itself)",
    ),
    "too_deep": (_deep, "err", None),
    "tuple_key": (
        {(1, 2): "v"},
        "err",
        "tool returned a value that is not JSON: $: a key of type tuple is not JSON (keys must be strings)",
    ),
    "set": ({3, 1, 2}, "ok", [1, 2, 3]),
    "frozenset_mixed": (frozenset({"b", 1}), "ok", ["b", 1]),  # sorted by JSON text: '"b"' < '1'
    "scalar_keys": ({1: "a", None: "c", 2.5: "f", False: "b"}, "ok", {"1": "a", "null": "c", "2.5": "f", "false": "b"}),
    "clashing_keys": (
        {1: "a", "1": "b"},
        "err",
        "tool returned a value that is not JSON: $: two keys both spell '1' in JSON (e.g. 1 and '1'); keep one",
    ),
    "enum": (Color.RED, "ok", "red"),
    "date": (datetime.date(2020, 1, 2), "ok", "2020-01-02"),
    # Past JavaScript's safe integers a program would read another number: refused, not rounded.
    "big_int": (
        2**70,
        "err",
        "tool returned a value that is not JSON: $: the integer 1180591620717411303424 cannot cross exactly: "
        "a program's numbers are doubles, whose safe integers end at ±(2**53 - 1); send it as a string",
    ),
    "nul_string": ("a\x00b", "ok", "a\x00b"),
}


def test_non_json_tool_results_follow_the_snapshot_rules(threads_released):
    tools = [Tool(name, (lambda v: lambda args: v)(value)) for name, (value, _, _) in RETURNS.items()]
    program = """
    const out = {};
    for (const name of Object.keys(tools)) {
      try { out[name] = ["ok", await tools[name]({})]; }
      catch (e) { out[name] = ["err", e.message]; }
    }
    return out;
    """
    r = run_code(program, tools, limits=Limits(timeout=10), description="test")
    assert r.error is None, r.error
    for name, (_, status, expected) in RETURNS.items():
        got_status, got = r.result[name]
        assert got_status == status, (name, got)
        if expected is not None:
            assert got == expected, name
        else:
            assert (
                got.startswith("tool returned a value that is not JSON: $[0][0]")
                and "nested deeper than 200 levels" in got
            )
    assert_audit(r.calls)
    assert len(r.calls) == len(RETURNS)


def test_tool_result_with_a_lone_surrogate_reaches_the_program(threads_released):
    """A str with a lone surrogate (a surrogateescape'd filename, say) is valid JSON text once escaped."""
    tool = Tool("listdir", lambda args: ["ok.txt", "bad-\udcff.txt"])
    r = run_code(
        "const names = await tools.listdir({}); return names.map((n) => n.length);",
        [tool],
        limits=Limits(timeout=10),
        description="test",
    )
    assert r.error is None, r.error
    assert r.result == [6, 9]


def test_tool_result_larger_than_the_sandbox_memory_aborts_the_run(threads_released):
    tool = Tool("huge", lambda args: "h" * (40 * 1024 * 1024))
    r = run_code(
        "return (await tools.huge({})).length;",
        [tool],
        # Handles off: with them (the default) the 40 MB stays on the host (tests/test_blobs.py).
        limits=Limits(timeout=10, memory_bytes=32 * 1024 * 1024, blob_bytes=None),
        description="test",
    )
    assert r.error is not None and r.error.kind == "abort"
    assert "32 MiB memory limit" in r.error.message
    assert_audit(r.calls, ["huge"])
    canary()


# -- tools that mutate their arguments ---------------------------------------------------


def test_argument_mutation_never_reaches_the_audit_record(threads_released):
    kept = []

    def mutate(args):
        kept.append(args)
        args["items"].append("added by the tool")
        args["nested"]["k"] = "changed"
        args["new"] = True
        return args

    program = """
    const a = {items: [1], nested: {k: "original"}};
    const first = await tools.mutate(a);
    const second = await tools.mutate({items: [], nested: {k: "second"}});
    return {first, second, mine: a};
    """
    r = run_code(program, [Tool("mutate", mutate)], limits=Limits(timeout=10), description="test")
    assert r.error is None, r.error
    assert r.result["first"] == {"items": [1, "added by the tool"], "nested": {"k": "changed"}, "new": True}
    assert r.result["mine"] == {"items": [1], "nested": {"k": "original"}}
    assert [e.arguments for e in r.calls] == [
        {"items": [1], "nested": {"k": "original"}},
        {"items": [], "nested": {"k": "second"}},
    ]
    # Mutating the tool's copy after the run changes nothing either.
    kept[0]["items"].clear()
    assert r.calls[0].arguments == {"items": [1], "nested": {"k": "original"}}
    assert_audit(r.calls, ["mutate", "mutate"])


# -- tools that call back into the library -----------------------------------------------


def test_tool_calling_run_code_recursively(threads_released):
    seen = {}

    def inner_info(args):
        info = current_call.get()
        seen["inner"] = (info.id, info.tool, info.seq)
        return args["n"] * 10

    inner_tools = [Tool("inner_info", inner_info)]

    def nested(args):
        outer = current_call.get()
        seen["outer"] = (outer.id, outer.tool, outer.seq)
        result = run_code(
            args["code"],
            inner_tools,
            limits=Limits(timeout=args.get("timeout", 10)),
            call_id="inner",
            description="test",
        )
        # The caller's context is restored after the nested run.
        assert current_call.get() is outer
        return result.to_dict()

    program = """
    const ok = await tools.nested({code: "return await tools.inner_info({n: 4});"});
    const looped = await tools.nested({code: "while (true) {}", timeout: 1});
    const threw = await tools.nested({code: "throw new Error('inner boom');"});
    return {ok, looped: looped.error.kind, threw: threw.error.message.split("\\n")[0]};
    """
    r = run_code(program, [Tool("nested", nested)], limits=Limits(timeout=30), call_id="outer", description="test")
    assert r.error is None, r.error
    assert r.result == {"ok": {"logs": [], "result": 40}, "looped": "timeout", "threw": "Error: inner boom"}
    assert seen["inner"] == ("inner:code:0", "inner_info", 0)
    assert seen["outer"][1:] == ("nested", 2)
    assert_audit(r.calls, ["nested", "nested", "nested"])


@pytest.mark.parametrize("parallel", [False, True], ids=["exclusive", "parallel"])
def test_tool_waiting_on_its_own_lane_fails_as_data_not_deadlock(threads_released, parallel):
    """A tool that submits to the lane it runs on and waits cannot succeed: commits are strictly in
    submission order, so its sub-call cannot commit before it does (an exclusive caller even keeps it
    from starting). The wait is bounded by the lane's timeout and fails as data; afterwards the
    sub-call still runs or commits, in order."""
    safe = (lambda args: True) if parallel else None
    sched = Scheduler(timeout=1.0, call_id="reenter")
    ran = []
    inner = Tool("inner", lambda args: ran.append(args) or "inner ran", concurrency_safe=safe)
    inner_ticket = {}

    def outer_fn(args):
        ticket = sched.submit(inner, {"from": "outer"})
        inner_ticket["t"] = ticket
        outcome = sched.wait(ticket)
        return {"ok": outcome.ok, "message": None if outcome.ok else outcome.error.message}

    try:
        started = time.perf_counter()
        outcome = sched.wait(sched.submit(Tool("outer", outer_fn, concurrency_safe=safe), {}), timeout=JOIN)
        assert time.perf_counter() - started < 1.0 + SLACK
        assert outcome.ok, outcome
        assert outcome.value == {"ok": False, "message": "timed out waiting for the sub-call to commit"}
        late = sched.wait(inner_ticket["t"], timeout=JOIN)
        assert late.ok and late.value == "inner ran"
        assert ran == [{"from": "outer"}]
        events = sched.logged_events()
        assert_audit(events, ["outer", "inner"])
        assert {e.mode for e in events} == {"parallel" if parallel else "exclusive"}
    finally:
        sched.stop(timeout=JOIN)


# -- a concurrency_safe predicate that hangs -------------------------------------------


def test_hanging_predicate_on_the_scheduler_releases_everyone(event):
    release = event()
    entered = threading.Event()

    def predicate(args):
        entered.set()
        release.wait(60)
        return True

    before = sched_threads()
    sched = Scheduler(timeout=1.0)
    stuck = Tool("stuck", lambda args: "never", concurrency_safe=predicate)
    started = time.perf_counter()
    ticket = sched.submit(stuck, {})
    outcome = sched.wait(ticket)
    assert entered.is_set()
    assert not outcome.ok and "did not answer" in outcome.error.message
    later = sched.call(Tool("later", lambda a: 1), {})
    assert not later.ok and "did not answer" in later.error.message
    sched.stop(timeout=1.0)
    assert time.perf_counter() - started < 3 * 1.0 + SLACK
    assert ticket.done()
    release.set()
    assert_released(before)
    assert sched.logged_events() == []


def test_hanging_predicate_in_run_code_ends_as_timeout(event):
    release = event()

    def predicate(args):
        release.wait(60)
        return True

    tool = Tool("stuck", lambda args: "never", concurrency_safe=predicate)
    started = time.perf_counter()
    try:
        r = run_code(
            'console.log("before"); return await tools.stuck({});',
            [tool],
            limits=Limits(timeout=1.0),
            description="test",
        )
    finally:
        elapsed = time.perf_counter() - started
        release.set()
    assert isinstance(r, RunResult)
    assert r.error is not None and r.error.kind == "timeout"
    assert r.logs == ("before",)
    assert elapsed < 1.0 + SLACK


def test_hanging_predicate_in_run_code_leaves_the_host_whole(event):
    """After such a run, the host recovers once the predicate returns."""
    release = event()

    def predicate(args):
        release.wait(60)
        return True

    tool = Tool("stuck", lambda args: "never", concurrency_safe=predicate)
    before = sched_threads()
    started = time.perf_counter()
    try:
        run_code("return await tools.stuck({});", [tool], limits=Limits(timeout=1.0), description="test")
    except TimeoutError:
        pass
    assert time.perf_counter() - started < 3 * 1.0 + SLACK
    release.set()
    assert_released(before)
    canary()


# -- Scheduler.stop() from another thread mid-run ----------------------------------------


def _wait_until(predicate, limit: float = JOIN) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"


def test_stop_from_another_thread_releases_every_waiter(event):
    release = event()
    running = threading.Event()
    safe = lambda args: True  # noqa: E731

    def blocker(args):
        running.set()
        release.wait(60)
        return "unblocked"

    before = sched_threads()
    sched = Scheduler(timeout=30.0, max_parallel=2, call_id="stopped")
    block_tool = Tool("block", blocker, concurrency_safe=safe)
    quick = Tool("quick", lambda args: args["i"], concurrency_safe=safe)
    exclusive = Tool("exclusive", lambda args: "exclusive ran")

    tickets = [
        sched.submit(block_tool, {}),  # 0: runs and blocks
        sched.submit(quick, {"i": 1}),  # 1: finishes, cannot commit before 0
        sched.submit(exclusive, {}),  # 2: queued behind the barrier
        sched.submit(quick, {"i": 3}),  # 3: queued behind the exclusive call
    ]
    running.wait(JOIN)
    _wait_until(lambda: 1 in sched.lane_state().settled)

    outcomes: dict[int, Outcome] = {}
    waiting = threading.Barrier(len(tickets) + 1)

    def waiter(i: int) -> None:
        waiting.wait()
        outcomes[i] = sched.wait(tickets[i])

    waiters = [threading.Thread(target=waiter, args=(i,)) for i in range(len(tickets))]
    for t in waiters:
        t.start()
    waiting.wait()
    stopper = threading.Thread(target=sched.stop, kwargs={"timeout": JOIN})
    stopper.start()
    stopper.join(JOIN)
    assert not stopper.is_alive()
    for t in waiters:
        t.join(JOIN)
        assert not t.is_alive()

    assert outcomes[1].ok and outcomes[1].value == 1  # finished before stop: its real outcome
    for i in (0, 2, 3):
        assert not outcomes[i].ok
        assert GONE in outcomes[i].error.message
        assert outcomes[i].error.tool == tickets[i].tool
    assert all(t.done() for t in tickets)
    # Only started calls are in the audit: 0 and 1, contiguous, unique ids.
    assert_audit(sched.logged_events(), ["block", "quick"])
    # After stop: submit is released at once, stop is idempotent.
    after = sched.call(quick, {"i": 9})
    assert not after.ok and "code run is over; scheduler is gone" == after.error.message
    sched.stop(timeout=JOIN)
    release.set()
    assert_released(before)


def test_stop_while_a_run_code_program_waits(event, monkeypatch):
    """Stopping the lane under a live program ends the program's call with the lane's error, as data."""
    release = event()
    running = threading.Event()
    lanes = []

    def blocker(args):
        running.set()
        release.wait(60)
        return "unblocked"

    tool = Tool("block", blocker)

    original_init = Scheduler.__init__

    class Spy(Scheduler):
        def __init__(self, *a, **kw):
            original_init(self, *a, **kw)
            lanes.append(self)

    rc = sys.modules["nous_sched._run.runner"]  # the machinery of run_code

    before = sched_threads()
    result: dict = {}
    program = "try { return await tools.block({}); } catch (e) { return [e.tool, e.message]; }"

    def runner() -> None:
        result["r"] = run_code(program, [tool], limits=Limits(timeout=30), description="test")

    monkeypatch.setattr(rc, "Scheduler", Spy)
    t = threading.Thread(target=runner)
    t.start()
    running.wait(JOIN)
    assert lanes
    lanes[0].stop(timeout=JOIN)
    t.join(JOIN)
    assert not t.is_alive()
    monkeypatch.undo()
    r = result["r"]
    assert r.error is None, r.error
    assert r.result == ["block", "code run is over; tool call abandoned"]
    assert_audit(r.calls, ["block"])
    release.set()
    assert_released(before)


# -- nothing lost under a mixed fan-out ----------------------------------------------------


def test_mixed_fan_out_loses_nothing(threads_released):
    safe = lambda args: True  # noqa: E731

    def slow(args):
        time.sleep(0.002 * (args["i"] % 5))  # simulated I/O
        return args["i"]

    def flaky(args):
        if args["i"] % 3 == 0:
            raise ValueError(f"flaky {args['i']}")
        return -args["i"]

    tools = [
        Tool("slow", slow, concurrency_safe=safe),
        Tool("flaky", flaky, concurrency_safe=lambda a: a["i"] % 2 == 0),
        Tool("exclusive", lambda args: args["i"] * 100),
    ]
    program = """
    const calls = [];
    for (let i = 0; i < 60; i++) {
      const name = ["slow", "flaky", "exclusive"][i % 3];
      calls.push(tools[name]({i}).then((v) => ["ok", v], (e) => ["err", e.tool, e.message]));
    }
    return await Promise.all(calls);
    """
    r = run_code(program, tools, limits=Limits(timeout=30), max_parallel=4, call_id="mixed", description="test")
    assert r.error is None, r.error
    expected = []
    for i in range(60):
        kind = i % 3
        if kind == 0:
            expected.append(["ok", i])
        elif kind == 1:
            expected.append(["err", "flaky", f"flaky {i}"] if i % 3 == 0 else ["ok", -i])
        else:
            expected.append(["ok", i * 100])
    assert r.result == expected
    assert_audit(r.calls, [["slow", "flaky", "exclusive"][i % 3] for i in range(60)])
    assert [e.arguments for e in r.calls] == [{"i": i} for i in range(60)]
    assert all(rec.committed is not None for rec in r.trail)
    assert [rec.committed for rec in r.trail] == sorted(rec.committed for rec in r.trail)


# -- the Host seam's contract -----------------------------------------------------------


class _CallingRuntime(CodeRuntime):
    """A CodeRuntime that makes the calls a (compromised) program could queue, straight through the Host."""

    language = "javascript"

    def __init__(self, calls):
        self.calls = calls

    def run(self, program, host, limits):
        seen = []
        for name, args in self.calls:
            outcome = host.call(name, args).wait(limits.timeout)
            seen.append([outcome.ok, outcome.error.message if not outcome.ok else outcome.value])
        return RuntimeOutcome(logs=(), result=seen)


def test_host_refuses_bad_arguments_as_data(threads_released):
    runtime = _CallingRuntime([("echo", [1, 2]), ("echo", None), ("nope", {}), ("secret", {}), ("echo", {"a": 1})])
    tools = [Tool("echo", lambda a: a), Tool("secret", lambda a: "SECRET")]
    r = run_code(
        "",
        tools,
        runtime=runtime,
        policy=PermissionPolicy(deny={"secret"}),
        limits=Limits(timeout=10),
        description="test",
    )
    assert r.result == [
        [False, "arguments must be an object, got [1, 2]"],
        [True, {}],
        [False, unknown_tool_message("nope", ["echo", "secret"])],
        [False, 'tool "secret" is denied by the permission policy'],
        [True, {"a": 1}],
    ]
    assert_audit(r.calls, ["echo", "echo"])


def test_host_refuses_non_string_tool_names_as_data(threads_released):
    runtime = _CallingRuntime([(["not", "a", "name"], {}), ({"a": 1}, {}), ("echo", {"a": 1})])
    r = run_code("", [Tool("echo", lambda a: a)], runtime=runtime, limits=Limits(timeout=10), description="test")
    assert isinstance(r, RunResult)
    assert [ok for ok, _ in r.result] == [False, False, True]

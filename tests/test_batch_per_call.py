"""What each call of a batch gets is its own, however the host shares work across the batch.

The host's bookkeeping for a ``Promise.all`` is shared where the answer cannot
differ between its calls (a tool's shape at the gate, a whole pass of the
lane in one call), and each call still gets its own answer where it can: its
approval, its deadline check, its schema check, its hooks, its result.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_sched import ApprovalEvent, Limits, RunContext, Tool, ToolError, ToolOutcomeEvent, run_code
from nous_sched.crossing import _fastjson, _snapshot, snapshot_text
from nous_sched.gate._gate import Admitted, Gate
from nous_sched.gate.dispatch import RUN_OVER, approve
from nous_sched.outcome import Outcome
from nous_sched.scheduler.lane import COMMIT, START, Lane
from nous_sched.tooling import EXCLUSIVE, PARALLEL

# -- the lane: a pass in one call ------------------------------------------------------

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("accept"), st.sampled_from([PARALLEL, PARALLEL, EXCLUSIVE])),
        st.tuples(st.just("finish"), st.integers(0, 50)),
        st.tuples(st.just("pass"), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), _ops)
def test_a_lanes_pass_in_one_call_gives_the_actions_step_gives_one_at_a_time(max_parallel, ops):
    one_by_one: Lane[int] = Lane(max_parallel)
    at_once: Lane[int] = Lane(max_parallel)
    for op, arg in ops + [("pass", 0)]:
        if op == "accept":
            seq = one_by_one.state().submitted
            assert one_by_one.accept(seq, arg) == at_once.accept(seq, arg) == seq  # each item is its seq
        elif op == "finish":
            running = one_by_one.state().inflight
            if running:
                seq = running[arg % len(running)]
                assert one_by_one.finished(seq) == at_once.finished(seq) == seq
        else:
            stepped = []
            while (action := one_by_one.step()) is not None:
                stepped.append(action)
            assert at_once.steps() == stepped
        assert at_once.state() == one_by_one.state()
    assert at_once.steps() == [] and one_by_one.step() is None


def test_a_pass_commits_before_it_starts_and_stops_at_an_exclusive_call():
    lane: Lane[str] = Lane(2)
    for item, mode in (("a", PARALLEL), ("b", PARALLEL), ("c", EXCLUSIVE), ("d", PARALLEL)):
        lane.accept(item, mode)
    assert lane.steps() == [(START, "a"), (START, "b")]
    assert lane.steps() == []
    lane.finished(1)
    assert lane.steps() == []  # b waits for a's commit; c waits for both
    lane.finished(0)
    assert lane.steps() == [(COMMIT, "a"), (COMMIT, "b"), (START, "c")]
    lane.finished(2)
    assert lane.steps() == [(COMMIT, "c"), (START, "d")]


# -- results that are constants ------------------------------------------------------


@pytest.mark.parametrize("orjson_path", [True, False])
@pytest.mark.parametrize("value", [None, True, False])
def test_a_result_of_none_or_a_flag_crosses_as_the_general_path_makes_it(value, orjson_path, monkeypatch):
    if not orjson_path:
        monkeypatch.setitem(__import__("sys").modules, "orjson", None)
        _fastjson.reset()
    try:
        got = snapshot_text(value)
        copy = _snapshot.snapshot(value)
        text = _snapshot.dumps(copy)
        assert got == (copy, text, len(text.encode()))
        assert type(got[0]) is type(value) and got[0] is value
        assert json.loads(got[1]) is value
        if orjson_path:
            assert _fastjson.encode(value, _snapshot.dumps) == got
    finally:
        _fastjson.reset()


def test_a_batch_of_calls_that_return_nothing_or_flags_reads_each_as_written(runtime):
    def flag(args: dict[str, Any]) -> Any:
        return [None, True, False, 0, ""][args["i"] % 5]

    tool = Tool("flag", flag, concurrency_safe=lambda args: True)
    code = "return await Promise.all(Array.from({length: 10}, (_, i) => tools.flag({i})));"
    result = run_code(code, [tool], description="flags")
    assert result.ok, result.error
    assert result.result == [None, True, False, 0, ""] * 2
    sizes = [e.bytes for e in result.events if isinstance(e, ToolOutcomeEvent)]
    assert sizes == [4, 4, 5, 1, 2] * 2


# -- approval and the deadline: per call ---------------------------------------------


def test_a_batch_whose_calls_get_different_approval_answers_keeps_each_answer(runtime):
    asked: list[int] = []

    def handler(request: Any) -> bool:
        asked.append(request.arguments["i"])
        return request.arguments["i"] % 3 != 0

    tool = Tool("write", lambda args: args["i"] * 10, requires_approval=True, concurrency_safe=lambda args: True)
    code = """
    const out = await Promise.allSettled(Array.from({length: 9}, (_, i) => tools.write({i})));
    return out.map(o => o.status === "fulfilled" ? o.value : "refused");
    """
    result = run_code(code, [tool], approval_handler=handler, description="a batch of writes")
    assert result.ok, result.error
    assert result.result == ["refused" if i % 3 == 0 else i * 10 for i in range(9)]
    assert sorted(asked) == list(range(9))
    approvals = {e.seq: e.approved for e in result.events if isinstance(e, ApprovalEvent)}
    assert approvals == {i: i % 3 != 0 for i in range(9)}
    # Each call's records in its own order: its tool_call, its approval, then its outcome.
    for seq in range(9):
        kinds = [type(e).__name__ for e in result.events if e.seq == seq]
        assert kinds == ["ToolCallEvent", "ApprovalEvent", "ToolOutcomeEvent"], (seq, kinds)
    outcomes = [e for e in result.events if isinstance(e, ToolOutcomeEvent)]
    assert [e.seq for e in outcomes] == list(range(9))
    assert [e.ok for e in outcomes] == [i % 3 != 0 for i in range(9)]


def test_each_call_checks_the_deadline_as_it_starts():
    name = "t"
    tool = Tool(name, lambda args: None)
    approve(tool, {}, RunContext())  # no deadline
    approve(tool, {}, RunContext(deadline=time.monotonic() + 60))
    approve(tool, {}, None)
    with pytest.raises(ToolError) as caught:
        approve(tool, {}, RunContext(deadline=time.monotonic() - 0.001))
    assert str(caught.value) == RUN_OVER and caught.value.kind == "run_over"


def test_a_deadline_passing_mid_batch_refuses_only_the_calls_that_start_after_it(runtime):
    started: list[int] = []

    def slow(args: dict[str, Any]) -> int:
        started.append(args["i"])
        if args["i"] == 1:
            time.sleep(1.5)  # the run's deadline passes while this call runs
        return args["i"]

    tool = Tool("slow", slow)  # exclusive: each call starts after the one before has committed
    code = "return await Promise.all(Array.from({length: 4}, (_, i) => tools.slow({i})));"
    result = run_code(code, [tool], limits=Limits(timeout=0.8), description="slow calls")
    assert not result.ok and result.error.kind == "timeout"
    # Calls 2 and 3 would start after the deadline: they never reach their tool (on a loaded
    # machine the deadline may come before call 1 starts too).
    assert started in ([0], [0, 1])
    outcomes = {e.seq: e for e in result.events if isinstance(e, ToolOutcomeEvent)}
    assert outcomes[0].ok


# -- the gate: a tool's shape is worked out once, every call still checked ------------


def _schema_tool(name: str = "t", **options: Any) -> Tool:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    return Tool(name, lambda args: args, parameters=schema, **options)


def test_every_call_of_a_tool_is_checked_against_its_schema_whatever_came_before():
    tool = _schema_tool()
    gate = Gate({"t": tool}, {}, Limits())
    for i in range(6):
        text = json.dumps({"n": i} if i % 2 == 0 else {"n": "x"})
        got = gate.admit_json("t", text)
        if i % 2 == 0:
            assert type(got) is Admitted and got.args == {"n": i}
        else:
            assert isinstance(got, Outcome) and not got.ok and "n" in got.error.message
    assert [r.tool for r in gate.refused] == ["t", "t", "t"]


def test_a_tool_that_opts_out_of_checking_is_never_checked():
    gate = Gate({"t": _schema_tool(validate_arguments=False)}, {}, Limits())
    for _ in range(2):
        assert type(gate.admit_json("t", '{"n": "x"}')) is Admitted


def test_a_bound_argument_sent_by_the_program_is_refused_at_every_call():
    tool = Tool("t", lambda args: args, bound={"secret": "s3cr3t"})
    gate = Gate({"t": tool}, {}, Limits())
    for _ in range(2):
        refused = gate.admit_json("t", '{"secret": "mine"}')
        assert isinstance(refused, Outcome) and "bound argument" in refused.error.message
        admitted = gate.admit_json("t", '{"a": 1}')
        assert type(admitted) is Admitted and admitted.args == {"a": 1, "secret": "[bound]"}


def test_a_name_granted_to_another_tool_mid_run_is_checked_as_the_new_tool():
    granted = {"t": Tool("t", lambda args: args)}
    gate = Gate(granted, {}, Limits())
    assert type(gate.admit_json("t", '{"n": "x"}')) is Admitted
    granted["t"] = _schema_tool()
    assert isinstance(gate.admit_json("t", '{"n": "x"}'), Outcome)


class _Mutable:
    """A tool-like object that is not a (frozen) Tool: its fields may change between calls."""

    def __init__(self) -> None:
        self.name = "t"
        self.parameters: Any = None
        self.bound: Any = None
        self.callers = None

    def function(self, args: Any) -> Any:
        return args


def test_a_tool_like_object_that_is_not_a_tool_is_asked_again_at_each_call():
    tool = _Mutable()
    gate = Gate({"t": tool}, {}, Limits())  # type: ignore[dict-item]
    assert type(gate.admit_json("t", '{"n": "x"}')) is Admitted
    tool.parameters = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert isinstance(gate.admit_json("t", '{"n": "x"}'), Outcome)
    tool.parameters = None
    tool.bound = {"k": "v"}
    refused = gate.admit_json("t", '{"k": 1}')
    assert isinstance(refused, Outcome) and "bound argument" in refused.error.message


# -- hooks: per call, in the lane's order --------------------------------------------


def test_the_hooks_of_a_batch_come_per_call_in_the_lanes_order(make_scheduler):
    scheduler = make_scheduler(max_parallel=3)
    said: list[tuple[str, int]] = []
    scheduler.watch(
        on_start=lambda record, event, args, tool: said.append(("start", event.seq)),
        on_outcome=lambda record, event, outcome: said.append(("outcome", event.seq)),
    )
    parallel = Tool("p", lambda args: args["i"], concurrency_safe=lambda args: True)
    exclusive = Tool("x", lambda args: args["i"])
    tools = [exclusive if i in (4, 7) else parallel for i in range(10)]
    with scheduler.batch():
        tickets = [scheduler.submit(tool, {"i": i}) for i, tool in enumerate(tools)]
    assert [scheduler.wait(t).value for t in tickets] == list(range(10))
    starts = [seq for what, seq in said if what == "start"]
    outcomes = [seq for what, seq in said if what == "outcome"]
    assert starts == list(range(10)) and outcomes == list(range(10))
    where = {item: i for i, item in enumerate(said)}
    for seq in range(10):
        assert where[("start", seq)] < where[("outcome", seq)]
    for seq in (4, 7):  # an exclusive call starts after every earlier commit, and commits before any later start
        assert all(where[("outcome", s)] < where[("start", seq)] for s in range(seq))
        assert all(where[("outcome", seq)] < where[("start", s)] for s in range(seq + 1, 10))


# -- the usage ledger: its records made when first read ------------------------------


def test_a_usage_whose_calls_are_read_later_is_the_usage_made_with_them_at_once():
    import pickle

    import attrs

    from nous_sched import CallUsage, Usage
    from nous_sched.result.usage import calls_later

    rows = [(0, "t", 4, True), (None, "x", 10, False), (2, "t", 0, False)]
    at_once = Usage(tuple(CallUsage(*row) for row in rows), 7, 5, 1, 0, 3)

    def later() -> Usage:
        ledger = list(rows)
        usage = Usage(calls_later(ledger), 7, 5, 1, 0, 3)
        ledger.append((3, "late", 1, True))  # the ledger as it stood when the usage was made
        return usage

    assert later() == at_once and hash(later()) == hash(at_once) and repr(later()) == repr(at_once)
    assert later().as_dict() == at_once.as_dict() and later().received_chars == 14
    assert pickle.loads(pickle.dumps(later())) == at_once
    assert attrs.evolve(later(), answer_bytes=9) == attrs.evolve(at_once, answer_bytes=9)
    read = later()
    assert read.calls == at_once.calls and type(read.calls) is tuple
    assert read.calls is read.calls  # built once
    assert all(type(c) is CallUsage for c in read.calls)
    assert Usage().calls == () and Usage(calls=()).calls == ()


def test_a_runs_usage_has_one_record_per_call_in_the_order_received(runtime):
    tool = Tool("echo", lambda args: args["i"], concurrency_safe=lambda args: True)
    code = "await tools.nope({}).catch(() => 0); return await Promise.all([0, 1, 2].map(i => tools.echo({i})));"
    result = run_code(code, [tool], description="echoes")
    assert result.ok, result.error
    got = [(c.seq, c.tool, c.chars, c.ok) for c in result.usage.calls]
    assert got[0][0] is None and got[0][1] == "nope" and got[0][3] is False
    assert got[1:] == [(0, "echo", 1, True), (1, "echo", 1, True), (2, "echo", 1, True)]


# -- the trail: its records made when first read -------------------------------------


def test_a_result_whose_trail_is_read_later_is_the_result_made_with_it_at_once():
    import pickle

    import attrs

    from nous_sched import CallRecord, RunResult
    from nous_sched.result.records import trail_later

    rows = [
        (0, "t", "parallel", 0.5, 0.75, 1.0, True, 0.625, "", None),
        (1, "x", "exclusive", 1.0, None, None, None, None, "why", 0.25),
    ]
    at_once = RunResult(result=3, trail=tuple(CallRecord(*row) for row in rows), elapsed=1.5)

    def later() -> RunResult:
        return RunResult(result=3, trail=trail_later(list(rows)), elapsed=1.5)

    assert later() == at_once and repr(later()) == repr(at_once)
    assert later().to_dict() == at_once.to_dict()
    assert pickle.loads(pickle.dumps(later())) == at_once
    assert attrs.evolve(later(), hint="h") == attrs.evolve(at_once, hint="h")
    read = later()
    assert read.trail == at_once.trail and read.trail is read.trail and type(read.trail) is tuple
    assert RunResult().trail == () and RunResult(trail=()).trail == ()


def test_a_call_still_waiting_for_its_throttles_at_the_runs_end_keeps_the_wait_as_it_was_then():
    from nous_sched import RunResult
    from nous_sched.result.records import trail_later
    from nous_sched.scheduler._calls import Timeline

    timeline = Timeline(0, "t", PARALLEL, 0.1)
    timeline.waiting_since = time.perf_counter() - 0.5
    result = RunResult(trail=trail_later([timeline.row()]))  # the run ends: its trail is taken
    waited = timeline.record().throttled
    time.sleep(0.05)
    assert result.trail[0].throttled is not None and 0.5 <= result.trail[0].throttled <= waited
    assert timeline.record().throttled > waited  # the timeline goes on; the result's trail does not


def test_a_runs_trail_has_one_record_per_started_call(runtime):
    tool = Tool("echo", lambda args: args["i"], concurrency_safe=lambda args: True)
    code = "return await Promise.all([0, 1, 2].map(i => tools.echo({i})));"
    result = run_code(code, [tool], description="echoes")
    assert result.ok, result.error
    assert [(r.seq, r.tool, r.mode, r.ok) for r in result.trail] == [(i, "echo", PARALLEL, True) for i in range(3)]
    for r in result.trail:
        assert r.started <= r.began <= r.finished <= r.committed

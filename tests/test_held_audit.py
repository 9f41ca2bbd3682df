"""A run's audit records are made when first read, and a reader cannot tell.

The driver writes a started call's ``tool_call`` and an ok call's
``tool_outcome`` as held entries (``result.records.made``: the record's type
and its arguments) while no one sees them as they are written: no hook, and
the run's own log. ``Scheduler.audit_events()``, ``logged_events()``, the
run's session log and ``RunResult.events`` make them when read, each reader
the same values it would have had from records made at once.
"""

from __future__ import annotations

import pickle

import attrs

from nous_sched import (
    ApprovalEvent,
    Event,
    RunResult,
    Scheduler,
    SessionLog,
    Tool,
    ToolCallEvent,
    ToolOutcomeEvent,
    run_code,
)
from nous_sched._slots import held
from nous_sched.events import freeze, frozen_later
from nous_sched.result.records import HeldAudit, audit_later, made
from nous_sched.tooling import PARALLEL

ECHO = Tool("echo", lambda args: args["i"], concurrency_safe=lambda args: True)
FAILS = Tool("fails", lambda args: 1 / 0, concurrency_safe=lambda args: True)


def _records() -> list[object]:
    return [
        ToolCallEvent("code:0", "echo", freeze({"i": 0}), PARALLEL, 0),
        ApprovalEvent(0, "echo", True, "policy"),
        ToolOutcomeEvent(0, "echo", True, None, 1),
    ]


def _held() -> list[object]:
    return [
        ("tool_call", "code:0", "echo", frozen_later('{"i": 0}'), PARALLEL, 0),
        ApprovalEvent(0, "echo", True, "policy"),
        ("tool_outcome", 0, "echo", True, None, 1),
    ]


def test_a_held_entry_is_made_into_the_record_made_at_once():
    assert [made(entry) for entry in _held()] == _records()
    record = _records()[0]
    assert made(record) is record


def test_a_result_whose_events_are_read_later_is_the_result_made_with_them_at_once():
    at_once = RunResult(result=3, events=tuple(_records()), elapsed=1.5)

    def later() -> RunResult:
        return RunResult(result=3, events=audit_later(_held()), elapsed=1.5)

    assert type(held(later(), "events")) is HeldAudit
    assert later() == at_once and repr(later()) == repr(at_once)
    assert later().to_dict() == at_once.to_dict()
    assert later().calls == at_once.calls
    assert pickle.loads(pickle.dumps(later())) == at_once
    assert attrs.evolve(later(), hint="h") == attrs.evolve(at_once, hint="h")
    read = later()
    assert read.events == at_once.events and read.events is read.events and type(read.events) is tuple
    assert type(held(read, "events")) is tuple  # built once, kept
    assert RunResult().events == () and RunResult(events=()).events == ()


def test_a_runs_events_are_held_until_read_and_read_as_each_call_wrote_them(runtime):
    code = (
        "const a = await Promise.all([0, 1, 2].map(i => tools.echo({i})));"
        "const b = await tools.fails({}).catch(e => 'failed');"
        "return [a, b];"
    )
    result = run_code(code, [ECHO, FAILS], description="echoes, then one that fails")
    assert result.ok, result.error
    assert type(held(result, "events")) is HeldAudit  # the run wrote them held
    events = result.events
    assert [type(e) for e in events] == [ToolCallEvent] * 3 + [ToolOutcomeEvent] * 3 + [
        ToolCallEvent,
        ToolOutcomeEvent,
    ]
    assert [(e.id.split(":", 1)[1], e.tool, e.arguments, e.mode, e.seq) for e in events[:3]] == [
        (f"code:{i}", "echo", {"i": i}, PARALLEL, i) for i in range(3)
    ]
    assert [(e.seq, e.tool, e.ok, e.error, e.bytes) for e in events[3:6]] == [
        (i, "echo", True, None, 1) for i in range(3)
    ]
    failed = events[7]
    assert (failed.seq, failed.ok, dict(failed.error)) == (
        3,
        False,
        {"kind": "tool_error", "message": "division by zero"},
    )
    assert result.calls == events[:3] + (events[6],)


def test_a_schedulers_readers_get_the_same_records_each_time(make_scheduler):
    s = make_scheduler()
    tickets = [s.submit(ECHO, {"i": i}) for i in range(3)]
    assert [s.wait(t).value for t in tickets] == [0, 1, 2]
    first = s.audit_events()
    assert sorted(type(e).__name__ for e in first) == ["ToolCallEvent"] * 3 + ["ToolOutcomeEvent"] * 3
    again = s.audit_events()
    assert all(a is b for a, b in zip(first, again))  # made once, in place
    assert s.logged_events() == [e for e in first if type(e) is ToolCallEvent]
    assert all(any(e is f for f in first) for e in s.logged_events())
    assert [made(e) for e in s.audit_entries()] == first
    log = s.session_log().events
    assert log == [e.as_event() for e in first] and all(type(e) is Event for e in log)
    assert s.session_log().events == log


def test_the_hooks_get_the_very_records_the_audit_keeps(make_scheduler):
    s = make_scheduler()
    seen: list[object] = []
    s.watch(on_start=lambda record, event, args, tool: seen.append(event), on_outcome=lambda r, e, o: seen.append(e))
    assert s.call(ECHO, {"i": 7}).value == 7
    s.stop()
    audit = s.audit_events()
    assert len(seen) == 2 and all(any(e is a for a in audit) for e in seen)


def test_a_callers_own_session_log_gets_each_event_as_it_is_written():
    log = SessionLog()
    with Scheduler(session_log=log) as s:
        assert s.call(ECHO, {"i": 1}).value == 1
        assert [e.type for e in log.events] == ["tool_call", "tool_outcome"]
        assert all(type(e) is not tuple for e in s.audit_entries())  # written as records: someone sees them


def test_a_held_entry_of_plain_values_is_one_the_garbage_collector_stops_tracking():
    import gc

    entries = [e for e in _held() if type(e) is tuple]
    gc.collect()
    gc.collect()  # (a tuple is untracked once what it holds is: the arguments' text at the first look)
    assert not any(gc.is_tracked(e) for e in entries)

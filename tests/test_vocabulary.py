"""One event vocabulary (nous_sched.events.VOCABULARY) and its projections.

Each kind of thing that happens to a call or a run is named once, with its
record type and its name in each projection; every projection (the audit,
the observer, the live stream, OTel, AG-UI, MCP notifications) is a table
keyed by one column of it. These tests are the checklist ARCHITECTURE.rst's
"Events" section gives for a new kind: each fails until every projection
says what it does with it.
"""

from __future__ import annotations

import warnings

import attrs
import pytest

from nous_sched import (
    ApprovalDecision,
    ApprovalEvent,
    CallRecord,
    SqliteApprovalStore,
    Tool,
    ToolCallEvent,
    ToolOutcomeEvent,
    ToolRefusedEvent,
    agui,
    events,
    live,
    otel,
    resume,
    run_code,
    start_run,
)
from nous_sched.gate.dispatch import CallInfo
from nous_sched.mcp import live_forward, serve

VOCABULARY = events.VOCABULARY


def _column(name):
    return [getattr(kind, name) for kind in VOCABULARY if getattr(kind, name) is not None]


def test_each_kind_and_each_of_its_projection_names_is_there_once():
    for column in ("name", "audit", "live", "phase"):
        names = _column(column)
        assert len(names) == len(set(names)), column
    assert {k.scope for k in VOCABULARY} == {"call", "run"}
    assert {k.name for k in VOCABULARY} >= {
        "call",
        "approval",
        "outcome",
        "refused",
        "log",
        "suspended",
        "resumed",
        "end",
        "gap",
        "state",
    }


def test_the_audits_records_are_the_kinds_with_a_record_each_typed_by_its_audit_name():
    calls = [k for k in VOCABULARY if k.scope == "call"]
    assert {k.record for k in calls} == {ToolCallEvent, ApprovalEvent, ToolOutcomeEvent, ToolRefusedEvent}
    assert all(k.record.type == k.audit for k in calls)
    # ... and the run's state operations, which the run's session log keeps too.
    assert set(events.AUDIT_TYPES) == {k.audit for k in calls} | {"state"}


def test_every_kind_has_one_record_type_and_each_run_record_is_named_by_its_kind():
    records = [k.record for k in VOCABULARY]
    assert all(isinstance(r, type) for r in records) and len(records) == len(set(records))
    runs = [k for k in VOCABULARY if k.scope == "run"]
    assert tuple(k.record for k in runs) == events.RUN_RECORDS
    assert all(k.record.kind == k.name and attrs.has(k.record) for k in runs)
    for k in runs:  # frozen: a run's record is made once, read as it is
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            setattr(_SAMPLES[k.record], attrs.fields(k.record)[0].name, None)


class _Request:
    seq, tool, arguments = 3, "pay", {"amount": 1}

    def question(self):
        return "Allow pay?"


#: One record of each run-level type, and its live data and audit data (None: not carried).
_SAMPLES = {
    events.LogLineEvent: events.LogLineEvent("hi"),
    events.SuspendedEvent: events.SuspendedEvent("tid.secret", (_Request(),), 12.5),
    events.ResumedEvent: events.ResumedEvent("tid", 2, took_over="host 1"),
    events.EndEvent: events.EndEvent(True, None, 1, {"calls": 0}, {"logs": ["hi"], "result": 1}),
    events.GapEvent: events.GapEvent(4),
    events.StateEvent: events.StateEvent("set", "k", 7, 3, False, "conflict"),
}
_LIVE = {
    events.LogLineEvent: {"line": "hi"},
    events.SuspendedEvent: {
        "token": "tid.secret",
        "expires_at": 12.5,
        "pending": [{"seq": 3, "tool": "pay", "arguments": {"amount": 1}, "question": "Allow pay?"}],
    },
    events.EndEvent: {
        "ok": True,
        "error": None,
        "logs": 1,
        "usage": {"calls": 0},
        "answer": {"logs": ["hi"], "result": 1},
    },
    events.GapEvent: {"missed": 4},
    events.StateEvent: {"op": "set", "key": "k", "size": 7, "version": 3, "ok": False, "error": "conflict"},
}
_AUDIT = {
    events.SuspendedEvent: {"token_id": "tid", "pending": [3], "expires_at": 12.5},
    events.ResumedEvent: {"token_id": "tid", "replayed": 2, "took_over": "host 1"},
    events.StateEvent: {"op": "set", "key": "k", "size": 7, "version": 3, "ok": False, "error": "conflict"},
}


@pytest.mark.parametrize("kind", [k for k in VOCABULARY if k.scope == "run"], ids=lambda k: k.name)
def test_each_run_records_live_and_audit_projections_follow_its_row(kind):
    record = _SAMPLES[kind.record]
    if kind.live is None:
        assert kind.record not in live.LIVE_DATA
    else:  # the live event's data, key for key in the wire's order
        data = live.live_data(record)
        assert data == _LIVE[kind.record] and list(data) == list(_LIVE[kind.record])
    if kind.audit is None:
        assert not hasattr(record, "as_event")
    else:  # the audit keeps the token's id, never the token
        event = record.as_event()
        assert event.type == kind.audit and event.data == _AUDIT[kind.record]
        assert list(event.data) == list(_AUDIT[kind.record])


def test_the_live_projection_names_every_run_record_with_a_live_kind_and_nothing_else():
    assert set(live.LIVE_DATA) == {k.record for k in VOCABULARY if k.scope == "run" and k.live is not None}


def test_the_live_projection_names_every_record_type_with_a_live_kind():
    # A new kind with a live name fails this until live.py says how its event's data is made.
    assert set(live.PROJECTION) == {k.record for k in VOCABULARY if k.live is not None}
    assert all(live.PROJECTION[k.record] is live.LIVE_DATA[k.record] for k in VOCABULARY if k.scope == "run" and k.live)


def test_a_runs_live_call_commit_and_refused_events_are_projections_of_its_audit_records():
    program = "try { await tools.nope({}); } catch (e) {} await tools.echo({x: 1}); return await tools.bad({});"
    bad = Tool("bad", lambda args: 1 / 0)
    run = start_run(program, [Tool("echo", lambda args: args), bad], description="test")
    seen = [e for e in run.events() if e.kind in ("call", "commit", "refused")]
    result = run.result()
    refused, (call0, outcome0, call1, outcome1) = result.refused, result.events
    trail = {r.seq: r for r in result.trail}
    assert [e.kind for e in seen] == ["refused", "call", "commit", "call", "commit"]
    assert seen[0].data == live.refused_data(refused[0], "unknown")
    for event, record in ((seen[1], call0), (seen[3], call1)):
        assert event.seq == record.seq and event.data["call_id"] == record.id and event.data["tool"] == record.tool
        assert event.data["mode"] == record.mode == trail[record.seq].mode
    for event, record in ((seen[2], outcome0), (seen[4], outcome1)):
        assert event.seq == record.seq and event.data["tool"] == record.tool and event.data["ok"] is record.ok
    assert seen[4].data["error"]["kind"] == outcome1.error["kind"] == "tool_error"
    assert seen[4].data["error"]["message"] == outcome1.error["message"]


def test_a_resumed_record_writes_took_over_and_parked_only_when_they_say_something():
    assert events.ResumedEvent("t", 0).as_event().data == {"token_id": "t", "replayed": 0}
    assert events.ResumedEvent("t", 0, parked=True).as_event().data == {"token_id": "t", "replayed": 0, "parked": True}


def test_the_live_kinds_and_the_observer_phases_are_the_vocabularys_columns():
    assert live.EVENT_KINDS == events.LIVE_KINDS == tuple(_column("live"))
    assert events.PHASES == (events.START, events.COMMIT) == ("start", "commit")


@pytest.mark.parametrize(
    ("projection", "keys"),
    [
        (agui.PROJECTION, live.EVENT_KINDS),
        (live_forward.PROJECTION, live.EVENT_KINDS),
        (otel.PROJECTION, events.PHASES),
        (serve.AUDIT_LINES, events.AUDIT_TYPES),
    ],
    ids=["agui", "mcp", "otel", "audit-log"],
)
def test_every_projection_says_what_it_does_with_every_kind_of_its_column(projection, keys):
    # A new kind in the vocabulary fails this until the projection names it
    # (with what it makes, or None for nothing).
    assert set(projection) == set(keys)


def test_one_name_for_a_calls_tool_in_every_record():
    for cls in (*(k.record for k in VOCABULARY if k.scope == "call"), CallRecord, CallInfo):
        names = [f.name for f in attrs.fields(cls)]
        assert "tool" in names and "name" not in names, cls


@pytest.mark.parametrize(
    "record", [ToolCallEvent("r:code:0", "t", {}, "parallel", 0), ToolRefusedEvent("t", "no")], ids=type
)
def test_the_older_name_still_reads_the_tool_and_says_it_is_deprecated(record):
    with pytest.warns(DeprecationWarning, match=r"\.name is deprecated: read \.tool"):
        assert record.name == "t"
    with pytest.raises(TypeError):
        type(record)(*attrs.astuple(record, recurse=False)[:-1], bogus=1)


def test_the_audits_json_keeps_its_field_names():
    # The wire format (RunResult.events' session form, SessionLog, the CLI's --json)
    # is unchanged: the tool_call and tool_refused records still write the tool as "name".
    shapes = [
        (ToolCallEvent("r:code:0", "t", {"a": 1}, "parallel", 0), ["id", "name", "arguments", "mode", "seq", "source"]),
        (ToolRefusedEvent("t", "no"), ["name", "message", "source"]),
        (ApprovalEvent(0, "t", True, "ok"), ["seq", "tool", "approved", "reason"]),
        (ToolOutcomeEvent(0, "t", True), ["seq", "tool", "ok", "error", "bytes"]),
    ]
    for record, keys in shapes:
        event = record.as_event()
        assert event.type == record.type and list(event.data) == keys
        assert event.data["name" if "name" in keys else "tool"] == "t"


def test_a_run_emits_only_the_vocabularys_live_kinds_with_the_tool_named_tool():
    program = "console.log('a'); try { await tools.nope({}); } catch (e) {} return await tools.echo({x: 1});"
    run = start_run(program, [Tool("echo", lambda args: args)], description="test")
    seen = list(run.events())
    assert run.result().ok
    assert [e.kind for e in seen] == ["log", "refused", "call", "commit", "end"]
    assert all(e.kind in live.EVENT_KINDS for e in seen)
    assert all(e.data["tool"] in ("echo", "nope") for e in seen if e.kind in ("refused", "call", "commit"))


def test_a_durable_runs_audit_types_are_the_vocabularys(tmp_path):
    store = SqliteApprovalStore(str(tmp_path / "approvals.db"))
    pay = Tool("pay", lambda args: "paid", requires_approval=True)
    suspended = run_code("return await tools.pay({})", [pay], approval_store=store, description="test")
    assert suspended.suspended is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        done = resume(suspended.suspended.token, {0: ApprovalDecision(True, "yes")}, [pay], approval_store=store)
    assert done.result == "paid"
    made = events.SuspendedEvent(suspended.suspended.token, suspended.suspended.pending, suspended.suspended.expires_at)
    assert made.as_event() in suspended.audit  # the audit's suspended event is the record's projection
    resumed = next(e for e in done.audit if e.type == "resumed")
    assert resumed == events.ResumedEvent(**resumed.data).as_event()
    types = [e.type for e in (*suspended.audit, *done.audit)]
    assert {"suspended", "approval", "resumed"} <= set(types) <= set(_column("audit"))
    assert {e.type for e in done.events} <= set(events.AUDIT_TYPES)

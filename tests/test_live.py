"""nous_sched.live: start_run, Run and its live, ordered events.

Synchronisation is by events and barriers only: a tool blocks on a
``threading.Event`` the test sets once it has *seen* the event it waits for,
which proves the event arrived while the run was still going.
"""

from __future__ import annotations

import json
import threading

import pytest

import nous_sched
from nous_sched import ConfigError, PermissionPolicy, RunCodeError, RunEvent, Tool, run_code, start_run
from nous_sched.live import EVENT_KINDS

# Generous: a loaded 2-core machine must never make these flake.
WAIT = 60


def _parallel(name, function):
    return Tool(name=name, function=function, description=name, concurrency_safe=lambda args: True)


def _kinds(events):
    return [e.kind for e in events]


def test_start_run_returns_a_run_at_once_and_its_result_is_run_codes(runtime, make_event):
    release = make_event()
    tools = [Tool(name="wait", function=lambda a: release.wait(WAIT) and {"n": a["n"]}, description="w")]
    run = start_run("return await tools.wait({n: 3})", tools, description="test")
    assert isinstance(run, nous_sched.Run)
    assert not run.done()  # the tool is still blocked: start_run did not wait for it
    release.set()
    result = run.result(timeout=WAIT)
    same = run_code("return await tools.wait({n: 3})", tools, description="test")
    assert result.result == same.result == {"n": 3}
    assert result.to_dict() == same.to_dict()
    assert result.usage == same.usage


def test_a_log_line_arrives_while_a_slow_call_is_still_running(runtime, make_event):
    release = make_event()
    tools = [Tool(name="slow", function=lambda a: {"released": release.wait(WAIT)}, description="s")]
    run = start_run(
        'console.log("before"); const r = await tools.slow({}); console.log("after"); return r',
        tools,
        description="test",
    )
    seen = []
    for event in run.events():
        seen.append(event)
        if event.kind == "log" and event.data["line"] == "before":
            assert not run.done()  # the call cannot end: only this test releases it
            release.set()
    assert run.result(timeout=WAIT).result == {"released": True}
    lines = [e.data["line"] for e in seen if e.kind == "log"]
    assert lines == ["before", "after"]
    assert _kinds(seen)[-1] == "end"
    # The "call" of the slow tool came before its commit, and the "before" line before both ended.
    order = [(e.kind, e.seq) for e in seen if e.kind in ("call", "commit")]
    assert order == [("call", 0), ("commit", 0)]


def test_a_call_event_arrives_before_the_call_ends(runtime, make_event):
    release = make_event()
    tools = [Tool(name="slow", function=lambda a: release.wait(WAIT), description="s")]
    run = start_run("return await tools.slow({})", tools, description="test")
    for event in run.events():
        if event.kind == "call":
            assert event.seq == 0 and event.data["tool"] == "slow" and event.data["mode"] == "exclusive"
            assert event.data["call_id"].endswith(":code:0") and event.data["arguments"] == []
            assert not run.done()
            release.set()
    assert run.result(timeout=WAIT).ok


def test_commits_come_in_seq_order_under_promise_all_whatever_order_calls_finish(runtime, make_event):
    # Each call waits for the one after it to have finished: they finish in reverse order.
    n = 6
    finished = [make_event() for _ in range(n + 1)]
    finished[n].set()

    def step(args):
        i = args["i"]
        finished[i + 1].wait(WAIT)
        finished[i].set()
        return {"i": i, "pad": "x" * i}

    run = start_run(
        f"return await Promise.all(Array.from({{length: {n}}}, (_, i) => tools.step({{i}})))",
        [_parallel("step", step)],
        max_parallel=n,
        description="test",
    )
    events = list(run.events())
    result = run.result(timeout=WAIT)
    assert result.ok, result.error
    commits = [e for e in events if e.kind == "commit"]
    assert [e.seq for e in commits] == list(range(n))
    assert sorted(e.seq for e in events if e.kind == "call") == list(range(n))
    # Each call started before it committed; the run ended last, once.
    for e in commits:
        assert _kinds(events).index("call") < events.index(e)
    assert _kinds(events)[-1] == "end" and _kinds(events).count("end") == 1
    # Every event's time is after the one before it: one order, as emitted.
    ats = [e.at for e in events]
    assert ats == sorted(ats)
    # The finish order really was reversed (so the seq order of commits is the scheduler's doing).
    assert [r.seq for r in sorted(result.trail, key=lambda r: r.finished)] == list(reversed(range(n)))


def test_two_consumers_see_the_same_events_in_the_same_order(runtime, make_event):
    release = make_event()
    tools = [Tool(name="slow", function=lambda a: release.wait(WAIT) and a, description="s")]
    run = start_run('console.log("a"); await tools.slow({k: 1}); console.log("b"); return 1', tools, description="test")
    got = {1: [], 2: []}
    both_saw_a = threading.Barrier(2, timeout=WAIT)

    def consume(which):
        for event in run.events():
            got[which].append(event)
            if event.kind == "log" and event.data["line"] == "a":
                both_saw_a.wait()  # neither can see "b" before both saw "a": the run is held by the tool
                if which == 1:
                    release.set()

    threads = [threading.Thread(target=consume, args=(w,), name=f"test-consumer-{w}") for w in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert run.result(timeout=WAIT).result == 1
    assert got[1] == got[2]
    assert [e.kind for e in got[1]] == ["log", "call", "commit", "log", "end"]
    # A consumer that starts after the run ended still sees it all, from the first event.
    assert list(run.events()) == got[1]


def test_a_slow_consumer_does_not_slow_the_run_and_is_told_what_it_missed(runtime, make_event):
    consumer_may_go = make_event()
    first_read = make_event()
    n = 200
    run = start_run(
        f"for (let i = 0; i < {n}; i++) await tools.echo({{i}}); return 'done'",
        [Tool(name="echo", function=lambda a: a, description="e")],
        description="test",
    )
    seen = []

    def slow_consumer():
        for event in run.events(buffer=10):
            seen.append(event)
            if len(seen) == 1:
                first_read.set()
                consumer_may_go.wait(WAIT)  # stuck while the run goes on

    thread = threading.Thread(target=slow_consumer, name="test-slow-consumer")
    thread.start()
    assert first_read.wait(WAIT)
    # The run ends although its one consumer has read a single event.
    assert run.result(timeout=WAIT).result == "done"
    assert run.done()
    consumer_may_go.set()
    thread.join(WAIT)
    gaps = [e for e in seen if e.kind == "gap"]
    assert gaps and all(g.data["missed"] > 0 for g in gaps)
    assert seen[-1].kind == "end"
    # The gaps count exactly what this consumer never saw.
    everything = list(run.events())
    assert len(seen) - len(gaps) + sum(g.data["missed"] for g in gaps) == len(everything)
    last_gap = max(i for i, e in enumerate(seen) if e.kind == "gap")
    assert len(seen) - last_gap - 1 <= 10  # after its last gap, at most its buffer
    assert [e for e in seen if e.kind != "gap"][-10:] == everything[-10:]


def test_cancel_through_the_handle(runtime, make_event):
    never = make_event()
    tools = [Tool(name="hang", function=lambda a: never.wait(WAIT), description="h")]
    run = start_run('console.log("started"); await tools.hang({}); return "not reached"', tools, description="test")
    events = []
    for event in run.events():
        events.append(event)
        if event.kind == "call":
            run.cancel()
    result = run.result(timeout=WAIT)
    assert result.error is not None and result.error.kind == "cancelled"
    assert result.logs == ("started",)
    end = events[-1]
    assert end.kind == "end" and end.data["ok"] is False and end.data["error"]["kind"] == "cancelled"


def test_the_callers_own_cancel_event_still_cancels(runtime, make_event):
    never = make_event()
    theirs = threading.Event()
    run = start_run(
        "await tools.hang({})",
        [Tool(name="hang", function=lambda a: never.wait(WAIT))],
        cancel=theirs,
        description="test",
    )
    for event in run.events():
        if event.kind == "call":
            theirs.set()
    assert run.result(timeout=WAIT).error.kind == "cancelled"


def test_approval_events_asked_then_decided(runtime):
    asked = []

    def handler(request):
        asked.append(request.tool)
        return request.arguments["ok"]

    tool = Tool(name="pay", function=lambda a: "paid", description="p", requires_approval=True)
    run = start_run(
        "const a = await tools.pay({ok: true}); let b; try { await tools.pay({ok: false}) } catch (e) { b = e.message }"
        "; return [a, b]",
        [tool],
        approval_handler=handler,
        description="test",
    )
    events = list(run.events())
    result = run.result(timeout=WAIT)
    assert result.result[0] == "paid"
    approvals = [(e.seq, e.data["state"]) for e in events if e.kind == "approval"]
    assert approvals == [(0, "asked"), (0, "approved"), (1, "asked"), (1, "rejected")]
    first = next(e for e in events if e.kind == "approval")
    assert first.data["tool"] == "pay" and first.data["call_id"].endswith(":code:0")
    # Asked after the call started, decided before it committed.
    kinds = [(e.kind, e.seq) for e in events if e.seq == 0]
    assert kinds == [("call", 0), ("approval", 0), ("approval", 0), ("commit", 0)]


def test_a_policy_approval_is_asked_through_the_stream_too(runtime):
    tool = Tool(name="write", function=lambda a: "w", description="w")
    policy = PermissionPolicy(require_approval=frozenset({"write"}))
    run = start_run(
        "return await tools.write({})", [tool], policy=policy, approval_handler=lambda r: True, description="test"
    )
    assert [e.data["state"] for e in run.events() if e.kind == "approval"] == ["asked", "approved"]
    assert run.result(timeout=WAIT).result == "w"


def test_suspended_is_a_kind_a_run_can_emit():
    from nous_sched.gate.dispatch import RunContext, live_event
    from nous_sched.live import EventStream

    stream = EventStream()
    live_event(RunContext(live=stream), "suspended", None, {"approval": "a-1"})
    live_event(RunContext(), "suspended", None, {"approval": "ignored: no stream"})
    stream.end(None, RuntimeError("x"))
    events = list(stream.consume())
    assert [e.kind for e in events] == ["suspended", "end"]
    assert events[0].data == {"approval": "a-1"}
    assert "suspended" in EVENT_KINDS


def test_events_are_json_ready_and_have_kind_seq_at_data(runtime):
    run = start_run(
        'console.log("x"); return await tools.echo({a: "é"})',
        [Tool(name="echo", function=lambda a: a)],
        description="test",
    )
    events = list(run.events())
    for event in events:
        assert isinstance(event, RunEvent)
        assert event.kind in EVENT_KINDS
        assert event.seq is None or isinstance(event.seq, int)
        assert event.at >= 0
        assert json.loads(event.to_json()) == event.as_dict()
    assert run.result(timeout=WAIT).ok


def test_start_run_raises_what_run_code_raises_on_the_callers_thread():
    with pytest.raises(RunCodeError):
        start_run(42, description="test")
    with pytest.raises(ConfigError, match="timeout"):
        start_run("return 1", timeout=-1, description="test")
    with pytest.raises(ConfigError, match="output_budget"):
        start_run("return 1", output_budget=10, description="test")
    with pytest.raises(ConfigError, match="max_parallel"):
        start_run(
            "return 1", max_parallel=0, description="test"
        )  # a scheduler option, refused before the run's thread starts
    with pytest.raises(ConfigError, match="observer"):
        start_run("return 1", observer=3, description="test")
    with pytest.raises(TypeError):
        start_run("return 1", no_such_option=1, description="test")
    run = start_run("return 1", description="test")
    with pytest.raises(ConfigError, match="buffer"):
        run.events(buffer=0)
    assert run.result(timeout=WAIT).result == 1


def test_a_run_thread_is_named_and_sees_the_callers_contextvars(runtime):
    import contextvars

    var = contextvars.ContextVar("test_live_var", default="unset")
    var.set("mine")
    names = []

    def who(args):
        names.append(threading.current_thread().name)
        return var.get()

    run = start_run("return await tools.who({})", [Tool(name="who", function=who)], description="test")
    assert run.result(timeout=WAIT).result == "mine"
    assert run.thread is not None and run.thread.name.startswith("nous-sched-run-")


def test_result_timeout_says_so(make_event):
    release = make_event()
    run = start_run(
        "return await tools.w({})", [Tool(name="w", function=lambda a: release.wait(WAIT))], description="test"
    )
    with pytest.raises(TimeoutError):
        run.result(timeout=0.01)
    release.set()
    assert run.result(timeout=WAIT).result is True


def test_a_consumer_that_starts_after_the_history_is_told_what_it_missed():
    from nous_sched.live import EventStream

    stream = EventStream(history=8)
    for i in range(30):
        stream.emit("log", None, {"line": str(i)})
    stream.end(None, RuntimeError("x"))
    events = list(stream.consume())
    assert events[0].kind == "gap"
    lines = [int(e.data["line"]) for e in events if e.kind == "log"]
    assert events[0].data["missed"] + len(lines) == 30  # the end is kept too
    assert lines == list(range(30 - len(lines), 30)) and len(lines) >= 7
    assert events[-1].kind == "end"
    # An event after the end is ignored: the end stays last.
    stream.emit("log", None, {"line": "late"})
    assert list(stream.consume())[-1].kind == "end"


def test_the_callers_observer_still_hears_every_start_and_commit(runtime):
    heard = []
    run = start_run(
        "await tools.echo({}); await tools.echo({}); return 1",
        [Tool(name="echo", function=lambda a: a)],
        observer=lambda record, phase: heard.append((record.seq, phase)),
        description="test",
    )
    events = list(run.events())
    assert run.result(timeout=WAIT).result == 1
    assert heard == [(0, "start"), (0, "commit"), (1, "start"), (1, "commit")]
    assert [(e.seq, e.kind) for e in events if e.kind in ("call", "commit")] == [
        (0, "call"),
        (0, "commit"),
        (1, "call"),
        (1, "commit"),
    ]


def test_a_durable_run_says_it_suspended_before_it_ends(tmp_path):
    from nous_sched import SqliteApprovalStore

    read = Tool("read", lambda a: {"i": a["i"]}, concurrency_safe=lambda a: True)
    pay = Tool("pay", lambda a: "paid", requires_approval=True)
    run = start_run(
        "const r = await tools.read({i: 1}); console.log('read', r.i); return await tools.pay({amount: 5})",
        [read, pay],
        approval_store=SqliteApprovalStore(str(tmp_path / "approvals.db")),
        description="read, then pay",
    )
    events = list(run.events())
    result = run.result()
    kinds = [e.kind for e in events]
    assert result.suspended is not None
    assert kinds[-2:] == ["suspended", "end"]
    assert "call" in kinds and "commit" in kinds and "log" in kinds  # the run was watched live up to the gate
    suspended = events[-2]
    assert suspended.data["token"] == result.suspended.token
    assert [p["tool"] for p in suspended.data["pending"]] == ["pay"]


def test_refused_events_say_why_and_are_bounded_as_the_audit_is(runtime):
    tools = [_parallel("ok", lambda a: 1), _parallel("secret", lambda a: 2)]
    code = (
        "for (const name of ['secret', 'nope']) { try { await tools[name]({}); } catch (e) {} }"
        "for (let i = 0; i < 10; i++) { try { await tools.ok({}); } catch (e) {} } return 1"
    )
    run = start_run(
        code, tools, description="test", policy=PermissionPolicy(deny={"secret"}), limits=nous_sched.Limits(max_calls=5)
    )
    refused = [(e.seq, e.data["tool"], e.data["reason"]) for e in run.events() if e.kind == "refused"]
    result = run.result(timeout=WAIT)
    assert refused == [(None, "secret", "policy"), (None, "nope", "unknown"), (None, "ok", "budget")]
    assert len(refused) == len(result.refused)  # one event per audited refusal, no more


def test_call_arguments_are_clipped_per_value_and_inert(runtime):
    echo = _parallel("echo", lambda a: {"n": len(a["big"])})
    code = 'return await tools.echo({big: "x".repeat(5000), evil: "\\u202e\\ud800<b>", path: "/etc/passwd"})'
    run = start_run(code, [echo], description="test")
    (call,) = [e for e in run.events() if e.kind == "call"]
    big, evil, path = call.data["arguments"]
    assert big["key"] == "big" and big["clipped"] and big["chars"] == 5002
    assert big["value"].endswith("… (clipped; 5,002 characters in all)") and len(big["value"]) < 400
    assert evil == {
        "key": "evil",
        "value": '"\\u202e\\ud800<b>"',
        "chars": 7,
        "clipped": False,
    }  # its JSON text's length
    assert path["value"] == '"/etc/passwd"'  # a long first value cannot push a later one out of sight
    assert run.result(timeout=WAIT).result == {"n": 5000}


def test_commit_events_carry_duration_value_and_the_error_the_program_saw(runtime):
    def fail(args):
        raise ValueError("boom <b>")

    tools = [_parallel("ok", lambda a: {"v": "é"}), _parallel("bad", fail)]
    code = "await tools.ok({}); try { await tools.bad({}); } catch (e) { return e.message; }"
    run = start_run(code, tools, description="test")
    commits = [e.data for e in run.events() if e.kind == "commit"]
    result = run.result(timeout=WAIT)
    ok, bad = commits
    assert ok["ok"] and ok["duration"] >= 0 and ok["waited"] >= 0 and ok["value"]["text"] == '{"v":"é"}'
    assert ok["chars"] == len('{"v":"\\u00e9"}')  # the ledger's count: the program's ASCII JSON text
    assert not bad["ok"] and bad["value"] is None and bad["error"]["kind"] == "tool_error"
    assert bad["error"]["message"] == result.result


def test_resume_run_watches_a_resume_and_raises_what_resume_raises(tmp_path):
    store = nous_sched.SqliteApprovalStore(str(tmp_path / "approvals.db"))
    pay = Tool(name="pay", function=lambda a: {"paid": a["n"]}, description="p")
    options = dict(policy=PermissionPolicy(require_approval={"pay"}), approval_store=store)
    first = start_run('console.log("paying"); return await tools.pay({n: 3})', [pay], description="pays", **options)
    suspended = [e for e in first.events() if e.kind == "suspended"]
    token = first.result(timeout=WAIT).suspended.token
    assert (
        suspended[0].data["pending"][0]["arguments"] == {"n": 3}
        and "pay" in suspended[0].data["pending"][0]["question"]
    )
    run = nous_sched.resume_run(token, {0: True}, [pay], approval_store=store, description="pays")
    assert isinstance(run, nous_sched.Run) and run.description == "pays" and run.call_id.startswith("run_code-")
    events = list(run.events())
    assert [e.kind for e in events if e.kind in ("call", "commit", "end")] == ["call", "commit", "end"]
    assert events[-1].data["answer"] == {"logs": ["paying"], "result": {"paid": 3}}
    assert run.result(timeout=WAIT).result == {"paid": 3}
    again = nous_sched.resume_run(token, {0: True}, [pay], approval_store=store)
    with pytest.raises(nous_sched.TokenError):
        again.result(timeout=WAIT)
    assert [e.kind for e in again.events()] == ["end"]


def test_event_batches_are_the_events_as_lists_each_at_most_the_buffer_and_a_gap():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from nous_sched.live import EventStream

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=8), st.integers(1, 30))
    def check(bursts, buffer):
        stream = EventStream()
        batches = stream.consume_batches(buffer)
        got = []
        for i, n in enumerate(bursts):  # the consumer reads between bursts, as a slow writer would
            for k in range(n):
                stream.emit("log", None, {"line": f"{i}.{k}"})
            if i == len(bursts) - 1:
                stream.emit("end", None, {})
            got.append(next(batches))
        got.extend(batches)
        for batch in got:
            assert batch and len(batch) <= buffer + 1
            assert all(e.kind != "gap" for e in batch[1:])  # a gap comes first, or not at all
        flat = [e for batch in got for e in batch]
        assert flat[-1].kind == "end"
        shown = [e for e in flat if e.kind != "gap"]
        missed = sum(e.data["missed"] for e in flat if e.kind == "gap")
        assert len(shown) + missed == sum(bursts) + 1
        emitted = [f"{i}.{k}" for i, n in enumerate(bursts) for k in range(n)] + [None]
        positions = [emitted.index(e.data.get("line")) for e in shown]
        assert positions == sorted(set(positions))  # in order, none twice: only skipped, never reordered

    check()

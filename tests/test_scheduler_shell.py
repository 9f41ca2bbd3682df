"""The scheduler's thread shell keeps the promises its docstrings make.

Each test is one promise, checked with events and joins, never sleeps:

* teardown: ``stop()`` winds the driver down, also when it comes from an
  observer, and takes back its calls no tool thread has taken up; an
  interrupt while the driver starts leaks no thread;
* the shared tool threads: a warm run starts no thread, a hung tool does not
  starve other runs, the threads are named, and each call gets its own copy
  of the submitting thread's ``contextvars``;
* observers: whatever one raises, ``KeyboardInterrupt`` and ``SystemExit``
  included, the lane goes on and calls that succeeded commit as successes;
* reads: ``trail()`` and ``logged_events()`` never wait on the driver, and
  ``lane_state()`` answers ``None`` rather than raise when the driver is stuck;
* the wedge: a lane condemned by an unanswered wait recovers once the driver
  accepts that call, whichever of the two happened first;
* the audit: records are immutable once written, for every reader.
"""

from __future__ import annotations

import contextvars
import copy
import gc
import json
import pickle
import re
import threading
import time

import drivers
import pytest
from drivers import IDLE, assert_released

from nous_sched import Event, Limits, Outcome, Scheduler, SessionLog, Tool, ToolCallEvent, ToolOutcomeEvent, run_code
from nous_sched.events import FrozenDict, FrozenList, freeze
from nous_sched.scheduler import _driver_threads
from nous_sched.scheduler._driver_threads import DriverThreads
from nous_sched.scheduler._tool_threads import retire_shared, shared

WAIT = 10.0


def assert_exited(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(WAIT)
    assert not [t.name for t in threads if t.is_alive()]


TOOL_THREAD = re.compile(r"nous-sched-tool-\d+")


def tool_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("nous-sched-tool-")}


def whoami(args):
    return threading.current_thread().name


# -- teardown -------------------------------------------------------------------------


def test_stop_from_an_observer_still_winds_the_driver_down_and_queued_calls_never_run():
    stopped = threading.Event()
    ran: list = []

    def observer(record, phase):
        if phase == "commit" and record.seq == 0:
            s.stop()  # on the driver: returns at once, the driver winds down after this callback
            stopped.set()

    s = Scheduler(observer=observer, timeout=30, max_parallel=1)
    driver = drivers.of(s)
    with s.batch():  # both reach the driver at once: the second queues behind the first
        first = s.submit(Tool("whoami", whoami), {})
        second = s.submit(Tool("never", lambda a: ran.append(a)), {})
    outcome = s.wait(first)
    assert outcome.ok and TOOL_THREAD.fullmatch(outcome.value)
    assert stopped.wait(WAIT)
    assert s._wait_driver(WAIT), "the driver winds down after the observer's stop()"
    assert_released([driver])
    assert s.wait(second).error.message == "code run is over; tool call abandoned"
    assert ran == []
    assert s.call(Tool("late", whoami), {}).error.message == "code run is over; scheduler is gone"
    assert outcome.value not in {t.name for t in retire_shared()}, "its tool thread is not left busy"


def test_keyboard_interrupt_while_the_driver_starts_leaks_no_thread(monkeypatch):
    # A set with no idle thread, so Scheduler() starts one; the interrupt lands
    # once it runs. The scheduler stops itself, and its driver goes back idle.
    private = DriverThreads()
    private._went_idle = threading.Semaphore(0)
    monkeypatch.setattr(_driver_threads._SHARED, "_value", private)
    real_start = threading.Thread.start
    started = []

    def start(thread):
        real_start(thread)
        if thread.name.startswith("nous-sched-driver-"):
            started.append(thread)
            raise KeyboardInterrupt  # lands once the thread runs, before __init__ returns

    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(KeyboardInterrupt):
        Scheduler(timeout=30)
    monkeypatch.setattr(threading.Thread, "start", real_start)
    assert len(started) == 1
    assert private._went_idle.acquire(timeout=WAIT), "the driver of the scheduler that never was went back idle"
    assert started[0].name.startswith(IDLE) and private.counts() == (1, 1)
    private.retire_idle()
    assert_exited(started)


# -- the shared tool threads ---------------------------------------------------------

FAN = 50


def fan_out(max_parallel: int = FAN) -> set[str]:
    """A fan-out of FAN calls that all run at once (a barrier holds each until
    every one has started); the names of the threads they ran on."""
    barrier = threading.Barrier(FAN, timeout=WAIT)

    def meet(args):
        barrier.wait()
        return threading.current_thread().name

    tool = Tool("meet", meet, concurrency_safe=lambda a: True)
    with Scheduler(timeout=30, max_parallel=max_parallel) as s:
        tickets = [s.submit(tool, {"i": i}) for i in range(FAN)]
        names = {s.wait(t).unwrap() for t in tickets}
    assert len(names) == FAN
    return names


def test_a_warm_fan_out_starts_no_tool_thread(monkeypatch):
    idle = threading.Semaphore(0)
    monkeypatch.setattr(shared(), "_went_idle", idle)
    fan_out()  # warms the shared set: FAN threads at least
    while shared().counts()[1] < FAN:  # until FAN of them are idle again (each wait is for one to go idle)
        assert idle.acquire(timeout=WAIT)
    before = tool_threads()
    names = fan_out()
    assert tool_threads() == before, "the run started no tool thread"
    assert names <= {t.name for t in before}
    assert all(TOOL_THREAD.fullmatch(name) for name in names)


def test_a_warm_run_code_fan_out_starts_no_tool_thread(monkeypatch):
    barrier = threading.Barrier(FAN, timeout=WAIT)

    def meet(args):
        barrier.wait()
        return threading.current_thread().name

    tool = Tool("meet", meet, concurrency_safe=lambda a: True)
    program = f"return await Promise.all(Array.from({{ length: {FAN} }}, (_, i) => tools.meet({{ i }})));"

    def run() -> set:
        result = run_code(program, [tool], max_parallel=FAN, timeout=WAIT, description="test")
        assert result.ok, result.error
        return set(result.result)

    idle = threading.Semaphore(0)
    monkeypatch.setattr(shared(), "_went_idle", idle)
    run()  # warms the shared set
    while shared().counts()[1] < FAN:
        assert idle.acquire(timeout=WAIT)
    before = tool_threads()
    names = run()
    assert tool_threads() == before, "the run started no tool thread"
    assert len(names) == FAN and names <= {t.name for t in before}


def test_a_hung_tool_does_not_starve_other_runs(make_event):
    hang = make_event()
    hung: list = []

    def stuck(args):
        hung.append(threading.current_thread())
        hang.wait(60)

    safe = {"concurrency_safe": lambda a: True}
    result = run_code(
        "return await Promise.all([tools.stuck({}), tools.stuck({})]);",
        [Tool("stuck", stuck, **safe)],
        limits=Limits(timeout=0.5),
        description="test",
    )
    assert result.error is not None and result.error.kind == "timeout"
    assert len(hung) == 2 and all(t.is_alive() for t in hung), "both tools still hold their threads"
    fan_out()  # 50 more at once, while they hang: the set grew past them
    hang.set()
    busy = retire_shared()
    assert not [t for t in hung if t in busy], "the hung threads came free once their tools returned"


def test_calls_committed_in_one_pass_are_all_published_when_the_oldest_is(make_event):
    gates = [make_event() for _ in range(3)]
    tool = Tool("gated", lambda a: gates[a["i"]].wait(WAIT) and a["i"], concurrency_safe=lambda a: True)
    with Scheduler(timeout=30, max_parallel=3) as s:
        tickets = [s.submit(tool, {"i": i}) for i in range(3)]
        gates[2].set()
        gates[1].set()
        deadline = time.monotonic() + WAIT
        while s.lane_state().settled != (1, 2):  # both finished, waiting for the oldest to commit
            assert time.monotonic() < deadline, s.lane_state()
        gates[0].set()
        assert s.wait(tickets[0]).value == 0
        # Published newest first, after one lock: the waiter on the oldest wakes to find the rest done.
        assert tickets[1].done() and tickets[2].done()
        assert [s.wait(t).value for t in tickets[1:]] == [1, 2]


def test_each_call_runs_in_its_own_copy_of_the_submitting_threads_context():
    var: contextvars.ContextVar[str] = contextvars.ContextVar("test_shell_var", default="unset")
    seen: list = []

    def look(args):
        seen.append(var.get())
        var.set("set by the tool")  # on a shared thread: must not reach the next call
        return True

    tool = Tool("look", look)
    with Scheduler(timeout=30, max_parallel=1) as s:
        token = var.set("the caller's")
        try:
            assert s.call(tool, {}).ok
        finally:
            var.reset(token)
        assert s.call(tool, {}).ok
        assert s.call(tool, {}).ok
    assert seen == ["the caller's", "unset", "unset"]
    assert var.get() == "unset"


# -- observers ------------------------------------------------------------------------


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, RuntimeError], ids=lambda e: e.__name__)
def test_whatever_an_observer_raises_the_lane_goes_on(exc, caplog):
    caplog.set_level("WARNING", logger="nous_sched")

    def observer(record, phase):
        raise exc("observer broke")

    s = Scheduler(observer=observer, timeout=30, max_parallel=2)
    driver = drivers.of(s)
    try:
        outcomes = [s.call(Tool("whoami", whoami), {}) for _ in range(3)]
        assert all(o.ok for o in outcomes), "calls that succeeded commit as successes, not abandoned"
        assert s.lane_state().cursor == 3 and driver[0].is_alive() and driver[0].name == driver[1]
    finally:
        s.stop(timeout=WAIT)
    assert s._wait_driver(0)
    assert_released([driver])
    assert not {o.value for o in outcomes} & {t.name for t in retire_shared()}, "no tool thread is left busy"
    assert sum("observer raised" in r.getMessage() for r in caplog.records) == 6  # start and commit, 3 calls


# -- reads ----------------------------------------------------------------------------


def test_reads_never_wait_on_a_driver_stuck_in_a_predicate(make_event):
    unblock, entered = make_event(), threading.Event()

    def stuck(args):
        entered.set()
        unblock.wait(60)
        return True

    s = Scheduler(timeout=30)  # a read that waited on the driver would wait 30 s, then raise
    try:
        assert s.call(Tool("fine", whoami), {}).ok
        s.submit(Tool("stuck", whoami, concurrency_safe=stuck), {})
        assert entered.wait(WAIT)
        assert [r.tool for r in s.trail()] == ["fine"]
        assert [e.tool for e in s.logged_events()] == ["fine"]
        assert s.lane_state(timeout=0.05) is None, "the stuck driver cannot answer: None, not an exception"
    finally:
        unblock.set()
        s.stop(timeout=WAIT)
    final = s.lane_state()
    assert final is not None and final.stopped and final.submitted == 2


def test_ticket_wait_answers_none_when_its_timeout_passes_first(make_scheduler, make_event):
    hold = make_event()
    s = make_scheduler()
    ticket = s.submit(Tool("held", lambda args: hold.wait(WAIT)), {})
    assert ticket.wait(0.05) is None and not ticket.done(), "a timeout is None, and changes nothing"
    hold.set()
    assert ticket.wait(WAIT) == Outcome.success(True)
    assert s.call(Tool("next", whoami), {}).ok, "a short ticket wait never wedges the lane"


def test_calls_leave_no_reference_cycles_behind(make_scheduler):
    # A cycle per call (a call holding its future holding a callback holding
    # the call) once made every call garbage for the collector to find.
    s = make_scheduler(max_parallel=2)
    tool = Tool("t", whoami, concurrency_safe=lambda args: True)
    for _ in range(20):
        assert s.call(tool, {"xs": [1, {"y": 2}]}).ok
    gc.collect()
    gc.disable()
    try:
        for _ in range(200):
            assert s.call(tool, {"xs": [1, {"y": 2}]}).ok
        assert gc.collect() == 0
    finally:
        gc.enable()


# -- the wedge ------------------------------------------------------------------------


def test_a_wedged_lane_recovers_once_the_condemning_call_is_accepted(make_event):
    decide = make_event()
    s = Scheduler(timeout=1.0)

    def call(name):
        return s.wait(s.submit(Tool(name, whoami), {}), timeout=WAIT)

    try:
        slow = Tool("slow", whoami, concurrency_safe=lambda a: decide.wait(WAIT))
        first = s.submit(slow, {})
        assert "did not answer" in s.wait(first).error.message  # a full-timeout silence condemns the lane
        refused = s.submit(Tool("refused", whoami), {})
        assert "did not answer" in refused.wait(0).error.message
        decide.set()
        assert first.wait(WAIT) is not None and first.seq == 0
        assert call("after").ok, "the driver answered: the lane is not wedged"

        # The other order: a waiter whose timeout raced the driver's accept condemns
        # the lane *after* the call was accepted. That stale verdict changes nothing.
        with s._lock:
            s._wedged_by = first
        assert call("still fine").ok
    finally:
        decide.set()
        s.stop(timeout=WAIT)


# -- the audit ------------------------------------------------------------------------


def test_the_session_log_a_scheduler_makes_reads_as_events_in_append_order_every_time():
    s = Scheduler(timeout=30)
    try:
        session = s.session_log()
        assert isinstance(session, SessionLog)
        assert s.call(Tool("a", lambda a: 1), {}).ok
        session.append(Event("note", {"by": "the caller"}))  # as the gate appends its refusals
        assert s.call(Tool("b", lambda a: 2), {}).ok
        first = session.events
        assert all(type(e) is Event for e in first)
        assert [(e.type, e.data.get("name") or e.data.get("tool") or e.data.get("by")) for e in first] == [
            ("tool_call", "a"),
            ("tool_outcome", "a"),
            ("note", "the caller"),
            ("tool_call", "b"),
            ("tool_outcome", "b"),
        ]
        assert [e.as_event() for e in s.audit_events()] == [e for e in first if e.type != "note"]
        assert s.call(Tool("c", lambda a: 3), {}).ok
        second = session.events
        assert second[:5] == first and all(x is y for x, y in zip(first, second)), "the same Events, read again"
        assert len(session) == 7 and [e.type for e in second[5:]] == ["tool_call", "tool_outcome"]
    finally:
        s.stop()


def test_audit_records_are_immutable_for_every_reader():
    tool = Tool("echo", lambda args: args)
    result = run_code(
        "await tools.echo({n: 1, xs: [1, {deep: true}]}); return 1", [tool], call_id="run", description="test"
    )
    expected = {"n": 1, "xs": [1, {"deep": True}]}
    event = result.calls[0]
    assert event.arguments == expected
    for mutate in (
        lambda a: a.__setitem__("n", 999),
        lambda a: a.update(n=2),
        lambda a: a.pop("n"),
        lambda a: a["xs"].append(3),
        lambda a: a["xs"][1].__setitem__("deep", False),
        lambda a: a["xs"].__iadd__([4]),
        lambda a: a.__init__({"n": 5}),
        lambda a: a["xs"].__init__([5]),
    ):
        with pytest.raises(TypeError, match="immutable"):
            mutate(event.arguments)
    with pytest.raises(TypeError):
        event.as_event().data["name"] = "forged"
    assert event.arguments == expected
    assert result.context_update().operations[0].data["arguments"] == expected
    assert result.to_dict() == {"logs": [], "result": 1}


def test_mutating_an_event_from_logged_events_changes_no_later_read(make_scheduler):
    log = SessionLog()
    s = make_scheduler(session_log=log)
    assert s.call(Tool("t", whoami), {"k": [1]}).ok
    with pytest.raises(TypeError):
        s.logged_events()[0].arguments["k"].append(2)
    with pytest.raises(TypeError):
        log.events[0].data["arguments"]["k"] = "forged"
    assert s.logged_events()[0].arguments == {"k": [1]}
    assert log.events[0].data["arguments"] == {"k": [1]}


def test_frozen_data_behaves_as_json_everywhere_else():
    data = freeze({"a": [1, {"b": (2, 3)}], "c": None})
    assert isinstance(data, FrozenDict) and isinstance(data["a"], FrozenList)
    assert data == {"a": [1, {"b": [2, 3]}], "c": None}
    assert json.loads(json.dumps(data)) == data
    assert pickle.loads(pickle.dumps(data)) == data and type(pickle.loads(pickle.dumps(data))) is FrozenDict
    assert copy.deepcopy(data) is data and freeze(data) is data
    editable = json.loads(json.dumps(data))
    editable["a"].append(4)  # a copy to edit is one json round trip away
    assert data["a"] == [1, {"b": [2, 3]}]
    # A caller's own event is frozen too, and the caller's dict stays theirs.
    mine = {"content": ["x"]}
    event = Event("user_message", mine)
    mine["content"].append("y")
    assert event.data == {"content": ["x"]}


def test_outcome_values_are_not_frozen():
    # Only audit records are frozen; what a tool returns is the program's data.
    s = Scheduler(timeout=30)
    try:
        value = s.call(Tool("t", lambda a: {"xs": [1]}), {}).value
    finally:
        s.stop()
    value["xs"].append(2)
    assert value == {"xs": [1, 2]} and type(value) is dict and Outcome.success(value).ok


def test_an_observer_that_sleeps_past_the_deadline_leaves_the_audit_complete():
    # The driver is held in the observer when the run's deadline passes and
    # stop() gives up waiting for it: the call it started still gets its
    # tool_outcome (abandoned) before run_code returns, and only one.
    release = threading.Event()
    log = SessionLog()

    def observer(record, phase):
        release.wait(30)

    try:
        result = run_code(
            "return await Promise.all([1, 2, 3].map(i => tools.t({i})))",
            [Tool("t", lambda a: a["i"])],
            timeout=0.5,
            observer=observer,
            session_log=log,
            description="test",
        )
        calls = [e.seq for e in result.events if e.type == "tool_call"]
        outcomes = [e.seq for e in result.events if e.type == "tool_outcome"]
        assert calls and sorted(outcomes) == sorted(calls), result.events
        assert [e.data["error"]["kind"] for e in log.events if e.type == "tool_outcome"] == ["abandoned"] * len(calls)
    finally:
        release.set()
    _driver_threads.retire_shared(10)  # (the driver leaves the observer, then writes nothing more)
    assert sorted(e.data["seq"] for e in log.events if e.type == "tool_outcome") == sorted(calls)


# -- the runtime port -------------------------------------------------------------------


def test_a_batch_reaches_the_driver_whole_and_batches_do_not_nest(make_scheduler):
    s = make_scheduler(max_parallel=1)
    order: list = []
    with s.batch():
        tickets = [s.submit(Tool(f"t{i}", lambda a, i=i: order.append(i)), {}) for i in range(3)]
        assert [t.seq for t in tickets] == [None, None, None], "held back until the batch ends"
        with pytest.raises(RuntimeError, match="do not nest"):
            with s.batch():
                pass
    assert [s.wait(t).ok for t in tickets] == [True, True, True]
    assert order == [0, 1, 2] and [t.seq for t in tickets] == [0, 1, 2]


def test_watch_hears_each_start_and_commit_on_the_driver(make_scheduler):
    s = make_scheduler()
    heard: list = []
    s.watch(
        on_start=lambda record, event, args, tool: heard.append(("start", record.seq, event, dict(args), tool.name)),
        on_outcome=lambda record, event, outcome: heard.append(("commit", record.seq, event, outcome.ok)),
    )
    assert s.call(Tool("ok", lambda a: 1), {"n": 1}).ok
    assert not s.call(Tool("bad", lambda a: 1 / 0), {}).ok
    s.stop(timeout=WAIT)
    kept = s.audit_events()
    calls, outcomes = kept[0::2], kept[1::2]
    assert heard == [
        ("start", 0, calls[0], {"n": 1}, "ok"),
        ("commit", 0, outcomes[0], True),
        ("start", 1, calls[1], {}, "bad"),
        ("commit", 1, outcomes[1], False),
    ]
    # The hooks get the audit records the run keeps, not copies: a live event is their projection.
    assert [type(e) for e in kept] == [ToolCallEvent, ToolOutcomeEvent] * 2
    assert all(heard_event is record for (_, _, heard_event, *_), record in zip(heard, kept))
    assert outcomes[1].error["kind"] == "tool_error"


def test_a_watch_hook_that_raises_is_logged_and_the_run_goes_on(make_scheduler, caplog):
    s = make_scheduler()

    def boom(*args):
        raise ValueError("hook")

    s.watch(on_start=boom, on_outcome=boom)
    assert s.call(Tool("ok", lambda a: 1), {}).value == 1
    s.stop(timeout=WAIT)
    assert {r.getMessage() for r in caplog.records} >= {
        "scheduler start hook raised; ignoring it",
        "scheduler outcome hook raised; ignoring it",
    }


def test_on_done_is_called_once_by_the_publishing_thread_after_done(make_scheduler):
    s = make_scheduler()
    release = threading.Event()
    seen: list = []
    ticket = s.submit(Tool("slow", lambda a: release.wait(WAIT)), {})
    assert ticket.on_done(lambda: seen.append((ticket.done(), threading.current_thread().name))) is True
    release.set()
    assert s.wait(ticket).ok
    assert len(seen) == 1 and seen[0][0] is True
    assert seen[0][1].startswith("nous-sched-driver-"), "the driver publishes as it commits"
    taken_back = s.submit(Tool("later", lambda a: 1), {})
    taken_back.on_done(lambda: seen.append("never"))
    taken_back.on_done(None)
    assert s.wait(taken_back).ok and len(seen) == 1

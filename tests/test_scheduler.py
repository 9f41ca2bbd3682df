"""The Scheduler through its threads, grouped by guarantee: commit order, the
``max_parallel`` ceiling, the exclusive barrier, classification, snapshots,
audit events, failures as data, the caller's context, the dispatch seam,
teardown, configuration and deadlines. It ports the original
``scheduler_test.exs`` and ``scheduler_deadline_test.exs``, each test named for
its behaviour; the same guarantees without threads are ``test_lane.py``.

Timing is controlled with Events, never with sleeps: a tool that must "finish
last" blocks on its own gate, which the test opens once the others finished.
Every wait in here is bounded (``WAIT``), so a regression fails instead of hanging.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import datetime
import enum
import inspect
import logging
import os
import pickle
import threading
import time
from types import SimpleNamespace
from unittest import mock

import drivers
import pytest
from drivers import Driver, released

import nous_sched
from nous_sched import (
    CallInfo,
    ConfigError,
    Event,
    Outcome,
    Scheduler,
    SessionLog,
    SnapshotError,
    Ticket,
    Tool,
    ToolError,
    current_call,
)
from nous_sched.gate.dispatch import approval_sink
from nous_sched.scheduler._tool_threads import retire_shared

WAIT = 10.0  # the bound on every wait for something that must happen

GONE = "code run is over; scheduler is gone"
ABANDONED = "code run is over; tool call abandoned"
TIMED_OUT = "timed out waiting for the sub-call to commit"
MARK = "… (truncated)"


# --- helpers ------------------------------------------------------------------------


class Probe:
    """Tool body that counts calls in flight and holds each call on its own gate.

    A call is keyed by ``args["k"]``. It records its start, blocks until its gate
    is opened (``release``), records its finish and returns its key.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.inflight = 0
        self.max_inflight = 0
        self.started: list = []
        self.finished: list = []
        self.threads: list[str] = []
        self._gates: dict = {}
        self._all_open = False

    def gate(self, key) -> threading.Event:
        with self.cond:
            gate = self._gates.get(key)
            if gate is None:
                gate = self._gates[key] = threading.Event()
                if self._all_open:
                    gate.set()
            return gate

    def run(self, args):
        key = args["k"]
        with self.cond:
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            self.started.append(key)
            self.threads.append(threading.current_thread().name)
            self.cond.notify_all()
        try:
            if not self.gate(key).wait(WAIT):
                raise RuntimeError(f"gate {key!r} never opened")
        finally:
            with self.cond:
                self.inflight -= 1
                self.finished.append(key)
                self.cond.notify_all()
        return key

    def release(self, *keys) -> None:
        for key in keys:
            self.gate(key).set()

    def release_all(self) -> None:
        with self.cond:
            self._all_open = True
            gates = list(self._gates.values())
        for gate in gates:
            gate.set()

    def wait_for(self, predicate, what: str) -> None:
        with self.cond:
            assert self.cond.wait_for(predicate, WAIT), (
                f"timed out waiting for {what}; started={self.started} finished={self.finished}"
            )

    def wait_started(self, n: int) -> None:
        self.wait_for(lambda: len(self.started) >= n, f"{n} calls to start")

    def wait_finished(self, key) -> None:
        self.wait_for(lambda: key in self.finished, f"{key!r} to finish")


@pytest.fixture
def probe(make_scheduler):
    # Depends on make_scheduler so that its teardown (opening every gate) runs first.
    p = Probe()
    yield p
    p.release_all()


def safe_tool(name, fn):
    return Tool(name, fn, concurrency_safe=lambda args: True)


def eventually(condition, what: str, timeout: float = WAIT) -> None:
    """Poll ``condition`` (a state query, not an ordering device) until true or fail."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        pause.wait(0.002)


def commit_recorder():
    """An observer that records (phase, seq); read it after a lane query or stop()."""
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()

    def observer(record, phase):
        with lock:
            seen.append((phase, record.seq))

    def commits():
        with lock:
            return [seq for phase, seq in seen if phase == "commit"]

    observer.seen = seen
    observer.commits = commits
    return observer


def sync(scheduler) -> None:
    """Round-trip through the driver: everything it was doing (an observer call) is over."""
    scheduler.lane_state()


def driver_of(scheduler) -> Driver:
    """The thread driving ``scheduler`` and its name; the thread has taken it up (a round trip through it)."""
    driver = drivers.of(scheduler)
    scheduler.lane_state()
    assert scheduler._driver is driver[0]
    return driver


def assert_clean_message(message: str) -> None:
    """No traceback, class name or file path reaches the program."""
    here = os.path.dirname(os.path.abspath(__file__))
    package = os.path.dirname(os.path.abspath(nous_sched.__file__))
    for leak in ("Traceback", 'File "', "line ", "scheduler.py", "test_scheduler", here, package, " object at 0x"):
        assert leak not in message, f"{leak!r} leaked into {message!r}"


# --- commit ordering ----------------------------------------------------------------


def test_commits_in_submission_order_not_finish_order(make_scheduler, probe):
    observer = commit_recorder()
    s = make_scheduler(max_parallel=3, observer=observer)
    tool = safe_tool("lane", probe.run)
    tickets = [s.submit(tool, {"k": k}) for k in ("first", "second", "third")]
    probe.wait_started(3)  # three lanes: all in flight at once

    for key, seq in (("third", 2), ("second", 1)):
        probe.release(key)
        eventually(lambda: seq in s.lane_state().settled, f"{key!r} to finish and settle")
    assert not any(t.done() for t in tickets), "nothing may commit before 'first' finished"
    probe.release("first")

    outcomes = [s.wait(t) for t in tickets]
    assert [o.value for o in outcomes] == ["first", "second", "third"]
    assert probe.finished == ["third", "second", "first"]
    sync(s)
    assert observer.commits() == [0, 1, 2]
    trail = s.trail()
    assert trail[2].finished < trail[1].finished < trail[0].finished
    assert trail[0].committed <= trail[1].committed <= trail[2].committed


def test_slow_call_commits_in_submission_order(make_scheduler, probe):
    observer = commit_recorder()
    s = make_scheduler(observer=observer)
    tool = safe_tool("t", probe.run)
    a, b, c, d = (s.submit(tool, {"k": k}) for k in "abcd")
    probe.wait_started(4)
    probe.release("a", "b", "d")
    assert s.wait(a).value == "a"
    assert s.wait(b).value == "b"
    probe.wait_finished("d")
    eventually(lambda: s.lane_state().settled == (3,), "d to settle behind c")
    state = s.lane_state()
    assert state.cursor == 2 and state.inflight == (2,)
    assert not d.done(), "d finished but must not commit before c"

    probe.release("c")
    assert [s.wait(t).value for t in (c, d)] == ["c", "d"]
    assert probe.finished[-1] == "c"
    sync(s)
    assert observer.commits() == [0, 1, 2, 3]


# --- max_parallel -------------------------------------------------------------------


def test_max_parallel_bounds_calls_in_flight_exactly(make_scheduler, probe):
    s = make_scheduler(max_parallel=3)
    tool = safe_tool("t", probe.run)
    tickets = [s.submit(tool, {"k": i}) for i in range(6)]
    probe.wait_started(3)
    state = s.lane_state()
    assert state.inflight == (0, 1, 2)
    assert state.pending == (3, 4, 5), "the rest queue, they never fail"
    assert probe.started == [0, 1, 2]

    probe.release_all()
    assert [s.wait(t).value for t in tickets] == list(range(6))
    assert probe.max_inflight == 3


def test_default_max_parallel_is_10(make_scheduler, probe):
    s = make_scheduler()
    assert s.max_parallel == 10
    tool = safe_tool("t", probe.run)
    tickets = [s.submit(tool, {"k": i}) for i in range(12)]
    probe.wait_started(10)
    state = s.lane_state()
    assert state.inflight == tuple(range(10))
    assert state.pending == (10, 11)

    probe.release_all()
    assert [s.wait(t).value for t in tickets] == list(range(12))
    assert probe.max_inflight == 10


# --- exclusive barrier --------------------------------------------------------------


def _step_serially(s, probe, n):
    """Release n held exclusive calls one by one, checking each runs alone."""
    for i in range(n):
        probe.wait_started(i + 1)
        state = s.lane_state()
        assert state.inflight == (i,) and state.exclusive == i, state
        assert state.pending == tuple(range(i + 1, n)), state
        assert probe.started == list(range(i + 1)), "nothing starts inside an exclusive window"
        probe.release(i)


def test_undeclared_tools_run_one_at_a_time(make_scheduler, probe):
    s = make_scheduler(max_parallel=5)
    tool = Tool("plain", probe.run)  # no concurrency_safe: exclusive
    tickets = [s.submit(tool, {"k": i}) for i in range(4)]
    _step_serially(s, probe, 4)
    assert [s.wait(t).value for t in tickets] == [0, 1, 2, 3]
    assert probe.max_inflight == 1


def test_exclusive_call_splits_parallel_runs(make_scheduler, probe):
    observer = commit_recorder()
    s = make_scheduler(max_parallel=4, observer=observer)
    safe = safe_tool("safe", probe.run)
    excl = Tool("excl", probe.run)
    tickets = [s.submit(tool, {"k": i}) for i, tool in enumerate([safe, safe, excl, safe, safe])]

    probe.wait_started(2)
    state = s.lane_state()
    assert state.inflight == (0, 1) and state.pending == (2, 3, 4)
    probe.release(0, 1)

    probe.wait_started(3)
    state = s.lane_state()
    assert state.inflight == (2,) and state.exclusive == 2 and state.pending == (3, 4)
    assert state.cursor == 2, "the exclusive call starts only after everything before it committed"
    probe.release(2)

    probe.wait_started(5)
    state = s.lane_state()
    assert state.inflight == (3, 4) and state.exclusive is None
    probe.release(3, 4)

    assert [s.wait(t).value for t in tickets] == [0, 1, 2, 3, 4]
    assert probe.started == [0, 1, 2, 3, 4]
    assert probe.max_inflight == 2
    sync(s)
    assert observer.commits() == [0, 1, 2, 3, 4]
    assert [e.mode for e in s.logged_events()] == ["parallel", "parallel", "exclusive", "parallel", "parallel"]


def test_lane_state_while_exclusive_call_runs(make_scheduler, probe):
    s = make_scheduler()
    first = s.submit(Tool("excl", probe.run), {"k": 0})
    queued = s.submit(safe_tool("safe", probe.run), {"k": 1})
    probe.wait_started(1)

    state = s.lane_state()
    assert state.exclusive == 0
    assert state.inflight == (0,)
    assert state.pending == (1,)
    assert state.settled == ()
    assert state.cursor == 0, "nothing has committed"
    assert state.submitted == 2 and state.stopped is False
    assert probe.started == [0], "the queued call has not started"
    assert not first.done() and not queued.done()

    probe.release_all()
    assert s.wait(first).ok and s.wait(queued).ok
    state = s.lane_state()
    assert state.exclusive is None
    assert state.cursor == 2
    assert state.inflight == () and state.pending == () and state.settled == ()


# --- classification -----------------------------------------------------------------


def _raises(args):
    raise ValueError("predicate blew up")


CLASSIFICATION = [
    # id, concurrency_safe, expected mode, expected warning fragment (None: no warning)
    ("safe", lambda a: True, "parallel", None),
    ("no_declaration", None, "exclusive", None),
    ("false", lambda a: False, "exclusive", None),
    ("raising", _raises, "exclusive", "failed; treating it as exclusive"),
    ("truthy_1", lambda a: 1, "exclusive", "returned int, not True or False"),
    ("truthy_yes", lambda a: "yes", "exclusive", "returned str, not True or False"),
    ("mock", mock.Mock(), "exclusive", "returned Mock, not True or False"),
]


@pytest.mark.parametrize("predicate,mode,warning", [c[1:] for c in CLASSIFICATION], ids=[c[0] for c in CLASSIFICATION])
def test_classification_is_exclusive_unless_exactly_true(make_scheduler, caplog, predicate, mode, warning):
    caplog.set_level(logging.WARNING, logger="nous_sched")
    tool = Tool("classified", lambda args: "ran", concurrency_safe=predicate)
    assert nous_sched.concurrency_mode(tool, {}) == mode
    assert nous_sched.concurrency_mode(tool, {}) == mode

    s = make_scheduler()
    outcome = s.call(tool, {})
    assert outcome == Outcome.success("ran"), "classification never fails the call"
    assert [e.mode for e in s.logged_events()] == [mode]

    warnings = [
        r
        for r in caplog.records
        if r.name == "nous_sched" and r.levelno == logging.WARNING and "concurrency_safe" in r.getMessage()
    ]
    if warning is None:
        assert warnings == []
    else:
        assert len(warnings) == 3  # two direct checks and the one on submit
        assert all(warning in r.getMessage() and "'classified'" in r.getMessage() for r in warnings)


def test_classification_of_objects_without_a_predicate(make_scheduler):
    # The "nonexistent module" row: any object with a name; no predicate means exclusive.
    bare = SimpleNamespace(name="bare", function=lambda args: "ran")
    assert nous_sched.concurrency_mode(bare, {}) == "exclusive"
    assert nous_sched.concurrency_mode(object(), {}) == "exclusive"
    s = make_scheduler()
    assert s.call(bare, {}) == Outcome.success("ran")
    assert s.logged_events()[0].mode == "exclusive"


class Exit(BaseException):
    """A predicate that 'exits' rather than raising an Exception."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the crashed driver
@pytest.mark.parametrize("exc", [SystemExit(3), Exit("bye")], ids=["SystemExit", "BaseException"])
def test_predicate_that_exits_is_exclusive_and_the_lane_survives(make_scheduler, exc):
    def predicate(args):
        raise exc

    s = make_scheduler(timeout=1)
    tool = Tool("exits", lambda args: "ran", concurrency_safe=predicate)
    outcome = s.call(tool, {})
    after = s.call(Tool("next", lambda args: "fine"), {})
    assert outcome == Outcome.success("ran")
    assert after == Outcome.success("fine")
    assert [e.mode for e in s.logged_events()] == ["exclusive", "exclusive"]


def test_the_predicate_classifies_each_call_by_its_args(make_scheduler, caplog):
    caplog.set_level(logging.WARNING, logger="nous_sched")
    tool = Tool("maybe", lambda args: "ran", concurrency_safe=lambda args: args["safe"])
    assert nous_sched.concurrency_mode(tool, {"safe": True}) == "parallel"
    assert nous_sched.concurrency_mode(tool, {"safe": False}) == "exclusive"
    assert nous_sched.concurrency_mode(tool, {}) == "exclusive"  # KeyError: exclusive, with a warning

    s = make_scheduler()
    for args in ({"safe": True}, {"safe": False}, {}):
        assert s.call(tool, args).ok
    assert [e.mode for e in s.logged_events()] == ["parallel", "exclusive", "exclusive"]
    assert any("failed; treating it as exclusive" in r.getMessage() for r in caplog.records)


class Key(enum.Enum):
    SAFE = "safe"


def test_classification_sees_the_dispatched_snapshot(make_scheduler):
    seen = {}

    def predicate(args):
        seen["predicate"] = args
        return args.get("safe") is True

    def function(args):
        seen["tool"] = args
        return "ran"

    s = make_scheduler()
    # An enum key and a tuple value: the predicate and the tool both see plain JSON.
    outcome = s.call(Tool("snap", function, concurrency_safe=predicate), {Key.SAFE: True, "ids": (1, 2)})
    assert outcome.ok
    expected = {"safe": True, "ids": [1, 2]}
    assert seen["predicate"] == expected and seen["tool"] == expected
    assert all(type(k) is str for k in seen["tool"]) and type(seen["tool"]["ids"]) is list
    event = s.logged_events()[0]
    assert event.mode == "parallel"
    assert event.arguments == expected


def test_undeclared_tools_really_run_serially(make_scheduler, probe):
    s = make_scheduler(max_parallel=8)
    tool = Tool("plain", probe.run)
    go = threading.Barrier(4)
    outcomes = {}

    def caller(i):
        go.wait(WAIT)
        outcomes[i] = s.call(tool, {"k": i})

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    eventually(lambda: s.lane_state().submitted == 4, "4 submits from 4 threads")
    for n in range(1, 5):
        probe.wait_started(n)
        state = s.lane_state()
        assert len(state.inflight) == 1 and len(state.pending) == 4 - n, state
        with probe.cond:
            assert probe.inflight == 1 and len(probe.started) == n
            current = probe.started[-1]
        probe.release(current)
    for t in threads:
        t.join(WAIT)
    assert sorted(outcomes) == [0, 1, 2, 3] and all(o.ok for o in outcomes.values())
    assert probe.max_inflight == 1


def test_raising_predicate_runs_serially_and_call_succeeds(make_scheduler, probe, caplog):
    caplog.set_level(logging.WARNING, logger="nous_sched")
    s = make_scheduler(max_parallel=5)
    tool = Tool("fragile", probe.run, concurrency_safe=_raises)
    tickets = [s.submit(tool, {"k": i}) for i in range(3)]
    _step_serially(s, probe, 3)
    assert [s.wait(t) for t in tickets] == [Outcome.success(i) for i in range(3)]
    assert probe.max_inflight == 1
    failed = [r for r in caplog.records if "failed; treating it as exclusive" in r.getMessage()]
    assert len(failed) == 3 and all(r.exc_info for r in failed), "the predicate's traceback goes to the log"


# --- snapshots ----------------------------------------------------------------------


def test_dispatch_rewriting_its_args_leaves_the_event_alone(make_scheduler):
    counter = {"n": 0}
    lock = threading.Lock()

    def dispatch(tool, args, run_ctx):
        with lock:
            counter["n"] += 1
        args["path"] = "/etc/rewritten"
        args["nested"]["x"] = "mutated"
        args["extra"] = True
        return counter["n"]

    s = make_scheduler(dispatch=dispatch)
    tool = Tool("write", lambda args: None)
    first = {"path": "/tmp/a", "nested": {"x": 1}}
    assert s.call(tool, first).value == 1
    assert s.call(tool, {"path": "/tmp/b", "nested": {"x": 2}}).value == 2
    events = s.logged_events()
    assert [e.arguments for e in events] == [
        {"path": "/tmp/a", "nested": {"x": 1}},
        {"path": "/tmp/b", "nested": {"x": 2}},
    ]
    assert first == {"path": "/tmp/a", "nested": {"x": 1}}, "the caller's dict is never touched"
    assert counter["n"] == 2


def test_args_are_snapshotted_at_submit(make_scheduler, make_event):
    seen = []
    hold = make_event()

    def function(args):
        hold.wait(WAIT)
        seen.append(args)
        return None

    s = make_scheduler()
    args = {"items": [1, 2], "meta": {"a": "b"}}
    ticket = s.submit(Tool("t", function), args)
    args["items"].append(3)
    args["meta"]["a"] = "changed"
    args["new"] = 1
    hold.set()
    assert s.wait(ticket).ok
    assert seen == [{"items": [1, 2], "meta": {"a": "b"}}]
    assert s.logged_events()[0].arguments == {"items": [1, 2], "meta": {"a": "b"}}


class Colour(enum.Enum):
    RED = "red"


def test_non_json_args_are_converted_or_refused(make_scheduler):
    got = []

    def function(args):
        got.append(args)
        return "ok"

    s = make_scheduler()
    tool = Tool("convert", function)
    when = datetime.date(2024, 5, 1)
    outcome = s.call(tool, {"pair": (1, "a"), "colour": Colour.RED, "when": when, "tags": {"b", "a"}, 7: [None]})
    assert outcome.ok
    converted = {"pair": [1, "a"], "colour": "red", "when": "2024-05-01", "tags": ["a", "b"], "7": [None]}
    assert got == [converted]
    event_args = s.logged_events()[0].arguments
    assert event_args == got[0], "the event's args equal the dispatched args"
    assert event_args is not got[0] and event_args["pair"] is not got[0]["pair"], "but are separate snapshots"

    # A function, a lock or an arbitrary object has no JSON form: refused, naming the path.
    for args, path in [
        ({"cb": lambda: None}, "$.cb"),
        ({"items": [1, threading.Lock()]}, "$.items[1]"),
        ({"deep": {"obj": object()}}, "$.deep.obj"),
    ]:
        with pytest.raises(ConfigError) as info:
            s.submit(tool, args)
        assert isinstance(info.value, SnapshotError)
        assert path in str(info.value)
    assert len(s.logged_events()) == 1, "a refused submit never reaches the lane"


# --- events -------------------------------------------------------------------------


def test_events_for_each_started_call_stay_out_of_the_transcript(make_scheduler):
    session_log = SessionLog([Event("user_message", {"content": "hi"})])
    messages_before = session_log.messages()
    s = make_scheduler(session_log=session_log, call_id="call_42")
    assert s.session_log() is session_log and s.call_id == "call_42"
    for i in range(5):
        assert s.call(Tool(f"t{i + 1}", lambda args: args["i"]), {"i": i}).value == i

    events = s.logged_events()
    assert [e.tool for e in events] == ["t1", "t2", "t3", "t4", "t5"]
    assert [e.seq for e in events] == [0, 1, 2, 3, 4]
    assert [e.arguments for e in events] == [{"i": i} for i in range(5)]
    assert [e.id for e in events] == [f"call_42:code:{i}" for i in range(5)]
    assert all(e.source == "code_mode" and e.type == "tool_call" for e in events)

    assert session_log.messages() == messages_before
    logged = [e for e in session_log.events if e.type != "tool_outcome"]
    assert [e.data["seq"] for e in session_log.events if e.type == "tool_outcome"] == [0, 1, 2, 3, 4]
    assert len(logged) == 6
    assert [e.surface for e in logged].count(True) == 1
    assert [e.type for e in logged[1:]] == ["tool_call"] * 5
    assert logged[1].data == {
        "id": "call_42:code:0",
        "name": "t1",
        "arguments": {"i": 0},
        "mode": "exclusive",
        "seq": 0,
        "source": "code_mode",
    }


def test_failed_sub_call_is_logged_once(make_scheduler):
    def fail(args):
        raise ToolError("nope")

    s = make_scheduler()
    outcome = s.call(safe_tool("failing", fail), {"x": 1})
    assert not outcome.ok
    events = s.logged_events()
    assert len(events) == 1
    assert (events[0].tool, events[0].mode, events[0].arguments) == ("failing", "parallel", {"x": 1})
    assert [e.type for e in s.session_log().events] == ["tool_call", "tool_outcome"]
    assert s.session_log().events[1].data["error"] == {"kind": "tool_error", "message": "nope"}


def test_event_id_without_a_call_id_is_code_seq(make_scheduler):
    s = make_scheduler()
    s.call(Tool("t", lambda args: None), {})
    assert s.logged_events()[0].id == "code:0"


# --- failures -----------------------------------------------------------------------


def test_tool_error_gives_exactly_two_strings(make_scheduler):
    def write_file(args):
        raise ToolError("disk is full")

    s = make_scheduler()
    outcome = s.call(Tool("write_file", write_file), {})
    assert outcome.ok is False and outcome.value is None
    assert outcome.error.as_dict() == {"tool": "write_file", "message": "disk is full"}
    assert all(type(v) is str for v in outcome.error.as_dict().values())
    with pytest.raises(ToolError, match="^disk is full$"):
        outcome.unwrap()

    # The same through a dispatch returning a failed Outcome.
    s2 = make_scheduler(dispatch=lambda tool, args, ctx: Outcome.failure("write_file", "disk is full"))
    assert s2.call(Tool("write_file", write_file), {}).error.as_dict() == {
        "tool": "write_file",
        "message": "disk is full",
    }


def test_raise_gives_the_message_and_nothing_else(make_scheduler, caplog):
    caplog.set_level(logging.WARNING, logger="nous_sched")

    def boom(args):
        raise RuntimeError("kaboom")

    s = make_scheduler()
    outcome = s.call(Tool("boom", boom), {})
    assert outcome.error.as_dict() == {"tool": "boom", "message": "kaboom"}
    assert_clean_message(outcome.error.message)
    assert "RuntimeError" not in outcome.error.message
    raised = [r for r in caplog.records if "raised" in r.getMessage() and r.exc_info]
    assert raised and raised[0].exc_info[0] is RuntimeError, "the traceback goes to the operator's log"


class SecretError(Exception):
    pass


def test_tool_error_message_passes_through_without_leaks(make_scheduler):
    def declines(args):
        try:
            raise SecretError("secret-token-123 original_error attempt=3")
        except SecretError as cause:
            raise ToolError("the tool declined", tool="spoofed") from cause

    s = make_scheduler()
    outcome = s.call(Tool("declines", declines), {})
    assert outcome.error.as_dict() == {"tool": "declines", "message": "the tool declined"}
    for leak in ("secret", "ToolError", "SecretError", "original_error", "attempt", "spoofed"):
        assert leak not in repr(outcome.error.as_dict())
    assert_clean_message(outcome.error.message)


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("cannot render")


def test_exception_without_a_message_form_is_opaque(make_scheduler):
    def fn(args):
        raise Unprintable()

    s = make_scheduler()
    outcome = s.call(Tool("opaque", fn), {})
    assert outcome.error.as_dict() == {"tool": "opaque", "message": "tool call failed"}


def test_exception_with_empty_message_is_opaque(make_scheduler):
    def fn(args):
        raise RuntimeError()

    s = make_scheduler()
    assert s.call(Tool("empty", fn), {}).error.as_dict() == {"tool": "empty", "message": "tool call failed"}
    # Same for an empty ToolError.

    def empty_tool_error(args):
        raise ToolError("")

    assert s.call(Tool("empty2", empty_tool_error), {}).error.message == "tool call failed"


def test_long_messages_are_clamped(make_scheduler):
    def long_error(args):
        raise ToolError(args["c"] * args["n"])

    s = make_scheduler()
    tool = Tool("long", long_error)
    msg = s.call(tool, {"c": "x", "n": 5000}).error.message
    assert msg == "x" * 2000 + MARK
    assert msg.endswith("… (truncated)") and "\u2026" in msg
    assert s.call(tool, {"c": "y", "n": 2000}).error.message == "y" * 2000
    assert s.call(tool, {"c": "z", "n": 2001}).error.message == "z" * 2000 + MARK

    s2 = make_scheduler(dispatch=lambda t, a, c: Outcome.failure("long", "w" * 5000))
    assert s2.call(tool, {}).error.message == "w" * 2000 + MARK


class Die(BaseException):
    """Escapes every `except Exception`: the executor's future fails, like a killed task."""


def test_a_task_that_dies_does_not_complete_and_the_lane_goes_on(make_scheduler, caplog):
    caplog.set_level(logging.WARNING, logger="nous_sched")

    def dispatch(tool, args, ctx):
        if tool.name == "dies":
            raise Die("killed")
        return "alive"

    s = make_scheduler(dispatch=dispatch)
    dead = s.call(Tool("dies", lambda a: None), {})
    assert dead.error.as_dict() == {"tool": "dies", "message": "tool call did not complete"}
    assert s.call(Tool("next", lambda a: None), {}) == Outcome.success("alive")
    state = s.lane_state()
    assert state.cursor == 2 and state.inflight == () and state.exclusive is None
    assert any("did not complete" in r.getMessage() for r in caplog.records)


class CancellingExecutor(concurrent.futures.Executor):
    """Runs calls on a real pool, except that it cancels the ones for tool 'cancelled'."""

    def __init__(self):
        self.pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="test-cancelling")

    def submit(self, fn, /, *args, **kwargs):
        tool = args[2]  # ctx.run(run_call, dispatch, tool, ...)
        if tool.name == "cancelled":
            future = concurrent.futures.Future()
            future.cancel()
            return future
        return self.pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait=True, *, cancel_futures=False):
        self.pool.shutdown(wait=wait, cancel_futures=cancel_futures)


def test_a_cancelled_future_does_not_complete_and_the_lane_goes_on(make_scheduler):
    executor = CancellingExecutor()
    try:
        s = make_scheduler(executor=executor)
        a = s.submit(Tool("cancelled", lambda a: "never"), {})
        b = s.submit(Tool("fine", lambda a: "ok"), {})
        assert s.wait(a).error.as_dict() == {"tool": "cancelled", "message": "tool call did not complete"}
        assert s.wait(b) == Outcome.success("ok")
        assert s.lane_state().cursor == 2
    finally:
        executor.shutdown()


def test_contract_breach_in_the_result_is_data(make_scheduler, caplog):
    caplog.set_level(logging.ERROR, logger="nous_sched")
    s = make_scheduler()
    outcome = s.call(Tool("weird", lambda args: {"v": object()}), {})
    assert outcome.ok is False and outcome.error.tool == "weird"
    assert outcome.error.message.startswith("tool returned a value that is not JSON")
    assert "$.v" in outcome.error.message
    assert " at 0x" not in outcome.error.message
    assert any("not JSON" in r.getMessage() for r in caplog.records)
    # In Python a bare value *is* the success shape.
    assert s.call(Tool("bare", lambda args: "a bare string"), {}) == Outcome.success("a bare string")


def test_results_are_snapshotted(make_scheduler):
    live = {"items": [1, 2], "when": (3, 4)}
    s = make_scheduler()
    outcome = s.call(Tool("live", lambda args: live), {})
    assert outcome.value == {"items": [1, 2], "when": [3, 4]}
    assert outcome.value is not live and outcome.value["items"] is not live["items"]


def test_ok_outcome_from_dispatch_is_snapshotted_too(make_scheduler):
    live = [1, 2]
    s = make_scheduler(dispatch=lambda t, a, c: Outcome.success(live))
    outcome = s.call(Tool("t", lambda args: None), {})
    assert outcome == Outcome.success([1, 2])
    assert outcome.value is not live
    s2 = make_scheduler(dispatch=lambda t, a, c: Outcome.success({"x": object()}))
    bad = s2.call(Tool("t", lambda args: None), {})
    assert bad.ok is False and bad.error.message.startswith("tool returned a value that is not JSON")


# --- caller chain (contextvars) -----------------------------------------------------

request_id: contextvars.ContextVar = contextvars.ContextVar("request_id", default=None)


def test_contextvars_and_current_call_reach_the_tool(make_scheduler):
    seen = {}

    def fn(args):
        seen["request_id"] = request_id.get()
        seen["info"] = current_call.get()
        seen["thread"] = threading.current_thread().name
        return None

    s = make_scheduler(call_id="run-9")
    token = request_id.set("req-1")
    try:
        ctx = object()
        assert s.call(safe_tool("ctx", fn), {}, ctx).ok
    finally:
        request_id.reset(token)
    assert seen["request_id"] == "req-1"
    info = seen["info"]
    assert isinstance(info, CallInfo)
    assert (info.id, info.tool, info.seq, info.mode) == ("run-9:code:0", "ctx", 0, "parallel")
    assert info.run_ctx is ctx
    assert seen["thread"].startswith("nous-sched-tool-")
    assert current_call.get() is None, "outside a tool there is no current call"

    # A value set in another submitting thread is what that thread's call sees.
    def submitter():
        request_id.set("req-2")
        seen["other"] = s.call(Tool("ctx2", lambda a: request_id.get()), {}).value

    t = threading.Thread(target=submitter)
    t.start()
    t.join(WAIT)
    assert seen["other"] == "req-2"
    assert request_id.get() is None


def test_what_a_call_sets_in_its_context_is_gone_after_it_on_every_executor(make_scheduler):
    # A call runs in a context copied for it alone (nothing resets what it set):
    # the submitter's copy, or, for an executor that pickles its tasks (and so
    # runs them without the submitter's context), a copy of its thread's own.
    def fn(args):
        request_id.set("set by the tool")
        return [current_call.get().seq, request_id.get()]

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="test-pickled") as pool:

        class Pickling(concurrent.futures.Executor):
            def submit(self, task, /, *args):
                return pool.submit(pickle.loads(pickle.dumps(task)), *args)

        for executor in (None, Pickling()):
            s = make_scheduler(executor=executor)
            assert [s.call(safe_tool("sets", fn), {}).value for _ in range(2)] == [
                [0, "set by the tool"],
                [1, "set by the tool"],
            ]
            assert request_id.get() is None and current_call.get() is None
        left = pool.submit(lambda: (request_id.get(), current_call.get(), approval_sink.get())).result(WAIT)
        assert left == (None, None, None), "the executor's thread keeps nothing of the calls it ran"


# --- dispatch seam ------------------------------------------------------------------


def test_call_is_a_dispatch_passing_tool_args_and_run_ctx(make_scheduler):
    got = []

    def dispatch(tool, args, run_ctx):
        got.append((tool, args, run_ctx))
        return {"echo": args}

    s = make_scheduler(dispatch=dispatch)
    fun = s.call  # dispatch-shaped: a lane can be another lane's dispatch
    assert callable(fun)
    signature = inspect.signature(fun)
    assert len(signature.parameters) == 3
    tool = Tool("echo", lambda a: None)
    ctx = SimpleNamespace(deps="mine")
    signature.bind(tool, {"a": 1}, ctx)
    outcome = fun(tool, {"a": 1}, ctx)
    assert outcome == Outcome.success({"echo": {"a": 1}})
    ((t, args, run_ctx),) = got
    assert t is tool and args == {"a": 1} and run_ctx is ctx


def test_run_ctx_is_passed_per_call(make_scheduler):
    got = []
    s = make_scheduler(dispatch=lambda tool, args, run_ctx: got.append(run_ctx) or run_ctx)
    tool = Tool("t", lambda a: None)
    assert s.call(tool, {}, "first").value == "first"
    assert s.wait(s.submit(tool, {}, "second")).value == "second"
    assert s.call(tool, {}, "third").value == "third"
    assert s.call(tool, {}).value is None
    assert got == ["first", "second", "third", None]


def test_call_is_wait_of_submit(make_scheduler):
    s = make_scheduler()
    tool = Tool("t", lambda args: args["x"] * 2)
    ticket = s.submit(tool, {"x": 21})
    assert isinstance(ticket, Ticket) and ticket.tool == "t"
    assert s.wait(ticket) == Outcome.success(42) == s.call(tool, {"x": 21})
    assert ticket.done() and ticket.seq == 0
    assert s.wait(ticket) == Outcome.success(42), "waiting twice gives the same outcome"


# --- teardown -----------------------------------------------------------------------


def test_stop_releases_running_and_queued_calls(make_scheduler, probe):
    s = make_scheduler()
    running = s.submit(Tool("running", probe.run), {"k": 0})
    queued = s.submit(Tool("queued", probe.run), {"k": 1})
    probe.wait_started(1)
    start = time.monotonic()
    s.stop(timeout=WAIT)
    assert time.monotonic() - start < WAIT / 2, "stop does not wait for a running tool"
    assert running.done() and queued.done()
    r, q = s.wait(running, timeout=0), s.wait(queued, timeout=0)
    assert r.error.as_dict() == {"tool": "running", "message": ABANDONED}
    assert q.error.as_dict() == {"tool": "queued", "message": ABANDONED}
    assert "code run is over" in r.error.message
    assert probe.started == [0], "a queued call never starts after stop"
    assert [e.tool for e in s.logged_events()] == ["running"], "an abandoned queued call is not logged"
    assert s.lane_state().stopped is True
    probe.release_all()


def test_stop_delivers_finished_but_uncommitted_calls_their_real_outcome(make_scheduler, probe):
    s = make_scheduler()
    tool = safe_tool("t", probe.run)
    held = s.submit(tool, {"k": 0})
    done = s.submit(tool, {"k": 1})
    probe.wait_started(2)
    probe.release(1)
    eventually(lambda: s.lane_state().settled == (1,), "call 1 to settle")
    s.stop()
    assert s.wait(held, timeout=0).error.message == ABANDONED
    assert s.wait(done, timeout=0) == Outcome.success(1)
    trail = s.trail()
    assert trail[0].finished is None and trail[0].committed is None
    assert trail[1].committed is not None and trail[1].ok is True


def test_submit_after_stop_is_an_error_and_stop_is_idempotent(make_scheduler):
    s = make_scheduler()
    assert s.call(Tool("t", lambda a: 1), {}).ok
    assert s.stop() is None
    ticket = s.submit(Tool("late", lambda a: 1), {})
    assert ticket.done()
    assert s.wait(ticket).error.as_dict() == {"tool": "late", "message": GONE}
    assert s.call(Tool("later", lambda a: 1), {}).error.as_dict() == {"tool": "later", "message": GONE}
    assert s.stop() is None
    assert s.stop(timeout=0) is None
    assert "stopped" in repr(s)
    assert len(s.logged_events()) == 1 and len(s.trail()) == 1


def test_context_manager_stops(make_scheduler):
    with Scheduler(timeout=30) as s:
        assert s.call(Tool("t", lambda a: 1), {}).value == 1
        driver = driver_of(s)
    released(s, driver)  # its driver is done with it, back idle in the shared set (not leaked)
    assert s.call(Tool("t", lambda a: 1), {}).error.message == GONE


def test_a_blocked_waiter_is_released_by_stop(make_scheduler, probe):
    s = make_scheduler()
    result = {}
    waiter = threading.Thread(target=lambda: result.setdefault("o", s.call(Tool("hangs", probe.run), {"k": "h"})))
    waiter.start()
    probe.wait_started(1)
    s.stop()
    waiter.join(WAIT)
    assert not waiter.is_alive()
    assert result["o"].ok is False
    assert result["o"].error.tool == "hangs"
    assert "code run is over" in result["o"].error.message
    probe.release_all()


# --- configuration ------------------------------------------------------------------


def _two(tool, args):
    return None


def _four(tool, args, run_ctx, extra):
    return None


@pytest.mark.parametrize(
    "dispatch",
    [None, 42, "direct", _two, _four, lambda: None],
    ids=["None", "int", "str", "2-arity", "4-arity", "0-arity"],
)
def test_bad_dispatch_is_a_config_error(dispatch):
    with pytest.raises(ConfigError, match="`dispatch`"):
        Scheduler(dispatch=dispatch)


def test_flexible_dispatch_signatures_are_accepted(make_scheduler):
    s = make_scheduler(dispatch=lambda *args: "varargs")
    assert s.call(Tool("t", lambda a: None), {}).value == "varargs"
    s2 = make_scheduler(dispatch=lambda tool, args, run_ctx, extra=None: "defaults")
    assert s2.call(Tool("t", lambda a: None), {}).value == "defaults"


@pytest.mark.parametrize("value", [0, -1, float("inf"), 2.0, True, "3", None])
def test_bad_max_parallel_is_a_config_error(value):
    with pytest.raises(ConfigError, match="`max_parallel`"):
        Scheduler(max_parallel=value)


@pytest.mark.parametrize(
    "option,value",
    [
        ("session_log", {}),
        ("session_log", []),
        ("timeout", 0),
        ("timeout", -1),
        ("timeout", True),
        ("timeout", "5"),
        ("executor", object()),
        ("observer", 42),
        ("call_id", 42),
    ],
)
def test_bad_options_are_config_errors_naming_the_option(option, value):
    with pytest.raises(ConfigError, match=f"`{option}`"):
        Scheduler(**{option: value})


def test_bad_arguments_to_methods_are_config_errors(make_scheduler):
    s = make_scheduler()
    with pytest.raises(ConfigError, match="`args`"):
        s.submit(Tool("t", lambda a: None), ["not", "a", "mapping"])
    with pytest.raises(ConfigError, match="`tool`"):
        s.submit(object(), {})
    with pytest.raises(ConfigError, match="Ticket"):
        s.wait("not a ticket")
    assert s.lane_state().submitted == 0


# --- deadline -----------------------------------------------------------------------


def test_a_dispatch_that_never_returns_times_out_the_wait(probe):
    s = Scheduler(timeout=0.2)
    driver = driver_of(s)
    try:
        ticket = s.submit(Tool("hangs", probe.run), {"k": "h"})
        probe.wait_started(1)  # accepted and running: the wait below can only time out
        start = time.monotonic()
        outcome = s.wait(ticket)
        assert time.monotonic() - start < WAIT
        assert outcome.error.tool == "hangs"
        assert "timed out" in outcome.error.message and outcome.error.message == TIMED_OUT
        assert s.wait(ticket, timeout=0.01).error.message == TIMED_OUT
    finally:
        start = time.monotonic()
        assert s.stop() is None
        assert time.monotonic() - start < WAIT
    released(s, driver)  # the lane is dead after stop: its driver is done with it
    assert s.wait(ticket).error.message == ABANDONED
    probe.release_all()


def test_a_predicate_that_blocks_forever_fails_the_wait_and_later_submits(make_event, caplog):
    caplog.set_level(logging.WARNING, logger="nous_sched")
    unblock = make_event()
    entered = threading.Event()

    def stuck(args):
        entered.set()
        unblock.wait(60)
        return True

    s = Scheduler(timeout=0.3)
    driver = driver_of(s)
    try:
        first = s.submit(Tool("stuck", lambda a: "ran", concurrency_safe=stuck), {})
        assert entered.wait(WAIT)
        outcome = s.wait(first, timeout=0.3)
        assert outcome.error.tool == "stuck"
        assert "did not answer" in outcome.error.message

        later = s.submit(Tool("later", lambda a: "ran"), {})
        assert later.done(), "a later submit fails at once"
        later_outcome = s.wait(later, timeout=0)
        assert later_outcome.error.tool == "later" and "did not answer" in later_outcome.error.message

        start = time.monotonic()
        assert s.stop(timeout=0.3) is None
        assert time.monotonic() - start < WAIT
        assert any("did not stop" in r.getMessage() for r in caplog.records)
        assert s.wait(first, timeout=0).ok is False, "stop released the stuck caller"
        assert driver[0].name == driver[1], "the stuck driver still bears its scheduler's name"
    finally:
        unblock.set()
        s.stop(timeout=WAIT)
    assert s._wait_driver(WAIT), f"{driver[1]} did not leave its scheduler once the predicate returned"
    released(s, driver)
    assert s.call(Tool("after", lambda a: 1), {}).ok is False


def test_short_wait_on_a_busy_lane_does_not_poison_it(make_scheduler, make_event):
    decide = make_event()
    s = make_scheduler(timeout=30)
    slow = Tool("slow", lambda a: "ran", concurrency_safe=lambda a: decide.wait(WAIT))
    ticket = s.submit(slow, {})
    early = s.wait(ticket, timeout=0.05)  # the predicate has not decided yet
    decide.set()
    assert s.wait(ticket) == Outcome.success("ran"), "the lane did answer"
    assert "30s" not in early.error.message, "0.05 s were waited, not 30 s"
    assert s.call(Tool("next", lambda a: "fine"), {}) == Outcome.success("fine")


# --- executors, observer, trail ------------------------------------------------------


def test_callers_executor_is_used_and_not_shut_down(make_scheduler, probe):
    executor = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="caller-pool")
    try:
        s = make_scheduler(executor=executor, max_parallel=4)
        probe.release_all()
        tool = safe_tool("t", probe.run)
        assert [s.call(tool, {"k": i}).value for i in range(3)] == [0, 1, 2]
        s.stop()
        assert all(name.startswith("caller-pool") for name in probe.threads)
        assert executor.submit(lambda: 42).result(WAIT) == 42, "stop left the caller's executor alone"
    finally:
        executor.shutdown(wait=True)


def test_without_an_executor_calls_run_on_the_shared_tool_threads_and_stop_leaves_none_busy(make_scheduler, probe):
    s = make_scheduler(max_parallel=3)
    probe.release_all()
    tool = safe_tool("t", probe.run)
    tickets = [s.submit(tool, {"k": i}) for i in range(3)]
    assert all(s.wait(t).ok for t in tickets)
    s.stop()
    names = set(probe.threads)
    assert names and all(n.startswith("nous-sched-tool-") for n in names)
    busy = retire_shared()  # every thread the calls ran on was idle, warm for the next run
    assert not [t.name for t in busy if t.name in names]
    alive = [t.name for t in threading.enumerate() if t.name in names]
    assert alive == [], f"tool threads still alive once retired: {alive}"


def test_observer_sees_start_and_commit(make_scheduler, probe, caplog):
    records = []

    def observer(record, phase):
        records.append((phase, record))

    s = make_scheduler(observer=observer, max_parallel=2)
    probe.release_all()
    tickets = [s.submit(safe_tool("t", probe.run), {"k": i}) for i in range(4)]
    assert all(s.wait(t).ok for t in tickets)
    s.stop()
    assert sorted(r.seq for phase, r in records if phase == "start") == [0, 1, 2, 3]
    assert [r.seq for phase, r in records if phase == "commit"] == [0, 1, 2, 3]
    for seq in range(4):
        phases = [phase for phase, r in records if r.seq == seq]
        assert phases == ["start", "commit"]
    start_rec = next(r for phase, r in records if phase == "start")
    assert start_rec.finished is None and start_rec.committed is None
    commit_rec = next(r for phase, r in records if phase == "commit")
    assert commit_rec.ok is True and commit_rec.committed is not None and commit_rec.mode == "parallel"

    # An observer that raises is logged and ignored.
    caplog.set_level(logging.WARNING, logger="nous_sched")

    def bad_observer(record, phase):
        raise RuntimeError("observer broke")

    s2 = make_scheduler(observer=bad_observer)
    assert s2.call(Tool("t", lambda a: 1), {}).value == 1
    assert any("observer raised" in r.getMessage() for r in caplog.records)


def test_trail_timestamps_are_ordered(make_scheduler, probe):
    s = make_scheduler(max_parallel=3)
    tools = [safe_tool("safe", probe.run), Tool("excl", probe.run)]
    tickets = [s.submit(tools[i % 3 == 2], {"k": i}) for i in range(9)]
    probe.release_all()
    outcomes = [s.wait(t) for t in tickets]
    assert all(o.ok for o in outcomes)
    trail = s.trail()
    assert [r.seq for r in trail] == list(range(9))
    assert [r.mode for r in trail] == ["parallel", "parallel", "exclusive"] * 3
    for r in trail:
        assert 0 <= r.started <= r.finished <= r.committed, r
        assert r.ok is True
    commits = [r.committed for r in trail]
    assert commits == sorted(commits), "commits in seq order"
    s.stop()
    assert s.trail() == trail, "after stop the trail is final and still readable"


def test_the_run_log_holds_each_pass_s_records_as_soon_as_the_audit_does(make_scheduler):
    # Without a session log of the caller's, the scheduler's own (read as
    # Events) is written in the same breath as its audit list: an observer,
    # called after a pass has written, finds both the same, at every step.
    seen: list[tuple[str, list[Event], list[Event]]] = []

    def observer(record, phase):
        log = scheduler.session_log()
        seen.append((phase, [e.as_event() for e in scheduler.audit_events()], log.events))

    scheduler = make_scheduler(observer=observer)
    for n in range(3):
        assert scheduler.call(safe_tool("t", lambda args: args["n"]), {"n": n}).value == n
    assert [phase for phase, _, _ in seen] == ["start", "commit"] * 3
    for _, audit, logged in seen:
        assert audit == logged and audit
    assert [e.type for e in scheduler.session_log().events] == ["tool_call", "tool_outcome"] * 3

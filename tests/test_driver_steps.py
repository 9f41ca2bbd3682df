"""A worker run's answers read and stepped by its scheduler's driver
(issue 44's four wake-ups per sequential call: worker -> driver -> tool ->
driver -> worker). While the run's thread sleeps, the driver reads each
answer that only starts tool calls and steps it; everything else goes back
to the run's thread (``nous_sched/runtime/_handoffcore.py``; the relay,
``runtime/_remote.py``, is its shell). Here: the run's thread is not woken
during such a stretch, the tools see the caller's contextvars, the deadline,
a cancel and Ctrl-C during a stretch (and during a step) end the run with a
result and leave the pool whole, a scheduler that stops hands the reader
back, and a hostile worker met during a stretch is handled as before."""

from __future__ import annotations

import contextvars
import os
import signal
import threading
import time
from typing import Any, Callable

import pytest
from procs import wait_gone
from runtime_contract import ReadingHost
from test_worker_pool import _HOSTILE, HOSTILE_REPLIES, SLACK, WAIT, _fake_python, make_pool

from nous_sched import Limits, Tool, WorkerPool, run_code
from nous_sched.runtime import _remote

N = 30
SEQUENTIAL = f"let s = 0; for (let i = 0; i < {N}; i++) s += await tools.t({{i}}); return s;"


def _t(args: dict[str, Any]) -> Any:
    return args["i"]


T = Tool("t", _t, concurrency_safe=lambda args: True)


@pytest.fixture
def pool():
    with WorkerPool(size=2, spares=0) as p:
        yield p


@pytest.fixture
def spied(monkeypatch):
    """Who stepped answers (the threads that ran Relay._step), and how often
    the run's thread woke while it had lent its reader (Relay._sleep returns)."""
    seen: dict[str, list[str]] = {"steps": [], "run_wakes": []}
    step, sleep = _remote.Relay._step, _remote.Relay._sleep

    def stepping(self):
        seen["steps"].append(threading.current_thread().name)
        return step(self)

    def sleeping(self, until, cancel):
        sleep(self, until, cancel)
        seen["run_wakes"].append(threading.current_thread().name)

    monkeypatch.setattr(_remote.Relay, "_step", stepping)
    monkeypatch.setattr(_remote.Relay, "_sleep", sleeping)
    return seen


def _whole(p: WorkerPool) -> None:
    """No place held nor waited for, no share held, and the next run works."""
    assert p.places()[1] == 0 and p.shares() == (0, 0)
    assert run_code(SEQUENTIAL, [T], runtime=p, description="test").result == sum(range(N))
    assert p.shares() == (0, 0)


def test_the_driver_reads_a_sequential_stretch_and_the_runs_thread_sleeps_through_it(pool, spied):
    result = run_code(SEQUENTIAL, [T], runtime=pool, description="test")
    assert result.error is None and result.result == sum(range(N))
    # Every answer after the first two (the run frame's, and the first call's: a run's first wait is
    # its own thread's, so a run whose first answer ends it pays nothing) was read by the driver...
    assert len(spied["steps"]) == N - 1
    assert {name.startswith("nous-sched-driver-") for name in spied["steps"]} == {True}
    # ...and the run's thread woke once: the program's end, handed back to it.
    assert spied["run_wakes"] == [threading.current_thread().name]


def test_a_tool_on_a_driver_stepped_call_sees_the_callers_contextvars(pool, spied):
    var: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="unset")
    seen: list[tuple[str, str]] = []

    def t(args):
        seen.append((var.get(), threading.current_thread().name))
        return args["i"]

    def caller() -> None:
        var.set("the caller's")
        assert run_code(SEQUENTIAL, [Tool("t", t)], runtime=pool, description="test").result == sum(range(N))

    thread = threading.Thread(target=caller, name="nous-sched-test-caller")
    thread.start()
    thread.join(60)
    assert len(spied["steps"]) == N - 1
    assert [value for value, _ in seen] == ["the caller's"] * N


def _blocking_tool(at: int, then: Callable[[], None]) -> Tool:
    def t(args):
        if args["i"] == at:
            then()
        return args["i"]

    return Tool("t", t, concurrency_safe=lambda args: True)


def test_the_deadline_during_a_driver_stepped_stretch_times_the_run_out_and_the_pool_stays_whole(pool, spied):
    t0 = time.monotonic()
    result = run_code(SEQUENTIAL, [_blocking_tool(5, lambda: time.sleep(3))], runtime=pool, timeout=1, description="t")
    assert time.monotonic() - t0 < 1 + SLACK
    assert result.error is not None and result.error.kind == "timeout", result.error
    assert len(spied["steps"]) == 4  # the answers to calls 1-4, read by the driver; call 5 never answered
    assert spied["run_wakes"] == []  # the run's thread slept until its deadline took the reader back
    _whole(pool)


def test_a_cancel_during_a_driver_stepped_stretch_cancels_the_run_and_the_pool_stays_whole(pool, spied):
    cancel = threading.Event()
    result = run_code(SEQUENTIAL, [_blocking_tool(5, cancel.set)], runtime=pool, cancel=cancel, description="t")
    assert result.error is not None and result.error.kind == "cancelled", result.error
    assert len(spied["steps"]) >= 4  # (the answers to calls 1-4 at least: the driver read them)
    _whole(pool)


def test_ctrl_c_during_a_driver_stepped_stretch_raises_and_the_pool_stays_whole(pool, spied):
    assert threading.current_thread() is threading.main_thread()
    tool = _blocking_tool(5, lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(1)))
    with pytest.raises(KeyboardInterrupt):
        run_code(SEQUENTIAL, [tool], runtime=pool, description="t")
    assert len(spied["steps"]) >= 4  # (the answers to calls 1-4 at least: the driver read them)
    _whole(pool)


class _Reading(ReadingHost):
    """A :class:`ReadingHost` whose call_json (run on its reader thread while
    the driver steps) may do ``during(i)``."""

    def __init__(self, during: Callable[[int], None], leave_after: int = -1, **options: Any) -> None:
        super().__init__(leave_after, names=("first",), **options)
        self.during = during
        self.calls = 0

    def call_json(self, name: str, text: str) -> Any:
        self.calls += 1
        if threading.current_thread() in self.readers:
            self.during(self.calls)
        return super().call_json(name, text)


PROGRAM = "let s = 0; for (let i = 0; i < 20; i++) s += (await tools.first({i})).args.i; return s;"


@pytest.mark.parametrize("end", ["deadline", "cancel", "ctrl-c"])
def test_an_end_that_lands_while_the_driver_is_in_a_step_waits_for_the_step_then_ends_the_run(pool, end):
    cancel = threading.Event()

    def during(i: int) -> None:
        if i != 5:
            return
        if end == "cancel":
            cancel.set()
        elif end == "ctrl-c":
            os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1.5)  # the run's deadline (1 s) passes, or its cancel or Ctrl-C lands, inside the step

    host = _Reading(during, cancel=cancel)
    try:
        if end == "ctrl-c":
            with pytest.raises(KeyboardInterrupt):
                pool.run(PROGRAM, host, Limits(timeout=30))
        else:
            outcome = pool.run(PROGRAM, host, Limits(timeout=1 if end == "deadline" else 30))
            assert outcome.error is not None
            assert outcome.error.kind == ("timeout" if end == "deadline" else "cancelled"), outcome.error
    finally:
        host.close()
    assert host.reads >= 3  # the answers to calls 2-4 (a run's first wait is its own thread's)
    assert all(not reader.is_alive() for reader in host.readers)
    _whole(pool)


def test_a_reader_that_leaves_hands_the_run_back_to_its_thread(pool):
    host = _Reading(lambda i: None, leave_after=3)
    try:
        outcome = pool.run(PROGRAM, host, Limits(timeout=30))
    finally:
        host.close()
    assert outcome.error is None and outcome.result == sum(range(20))
    assert host.reads == 3  # the rest was read by the run's own thread


_STRETCH = """
envelope = lambda i: json.dumps({"calls": [[i, "t", "{}"]], "logs": [], "dropped": 0, "main": None}).encode()
send(b"E", envelope(1))
read()
send(b"E", envelope(2))
read()
send(b"E", envelope(3))
read()
"""


@pytest.mark.parametrize("behaviour", sorted(HOSTILE_REPLIES))
def test_a_hostile_worker_during_a_driver_stepped_stretch_is_handled_as_before(tmp_path, behaviour, spied):
    # Three answers with a call each (the driver reads the third: a run's first wait is its
    # own thread's), then the hostile reply.
    fake = _fake_python(tmp_path, _HOSTILE + _STRETCH + HOSTILE_REPLIES[behaviour] + "\n")
    p = make_pool(python=fake, size=1, kill_grace=0.1, start_method="spawn")
    try:
        (pid,) = p.pids()
        t0 = time.monotonic()
        result = run_code("return 1", [Tool("t", lambda args: 1)], runtime=p, timeout=1, description="test")
        assert time.monotonic() - t0 < 1 + 0.1 + SLACK
        assert result.result is None
        assert result.error.kind == ("timeout" if behaviour == "silent" else "abort"), result.error
        assert wait_gone(pid, WAIT), "the worker that broke the protocol was killed"
        assert spied["steps"], "the driver read during the stretch"
    finally:
        p.close()

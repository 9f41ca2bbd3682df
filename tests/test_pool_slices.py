"""CPU shares are time-sliced: a step that has computed in its worker for a
whole slice (``pool.SHARE_SLICE``) while runs wait for a share is parked (its
worker stopped with ``SIGSTOP``) and queued again behind them. So programs
that spin to their deadline hold the shares a slice at a time, and the runs
behind them are answered (before this, two spinning programs on a two-core
machine kept every other run of the pool waiting until their deadlines).
The decisions are the pool core's (the state machine below); the shell
stops and continues real workers (the tests after it). Every check is on
what happened, never on how long it took."""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from polling import until
from procs import stopped, thread_states

from nous_sched import Limits, Tool, WorkerPool, run_code
from nous_sched.runtime import procio
from nous_sched.runtime.poolcore import PoolCore

RUNS = [f"r{i}" for i in range(5)]
SLICE = 1.0


class Slices(RuleBasedStateMachine):
    """Any order of the shell's calls: shares taken, steps in their workers,
    the clock moving, slices ended, parked runs resumed, steps ended."""

    def __init__(self) -> None:
        super().__init__()
        self.core = PoolCore(size=8, spares=0, runs_per_worker=1, cpu_shares=2)
        self.now = 0.0
        self.threads: set[str] = set()  # runs whose thread waits for a share (never a parked run's)

    @rule(run=st.sampled_from(RUNS), wait=st.booleans())
    def take(self, run: str, wait: bool) -> None:
        core = self.core
        parked = run in core.parked
        head = core.share_queue[0] if core.share_queue else None
        free = len(core.computing) < core.cpu_shares
        held = run in core.computing
        got = core.take_share(run, wait)
        if held:
            assert got
        elif parked:
            assert not got, "a parked run is only resumed, never granted a share by a take"
        else:
            assert got == (free and head in (None, run)), "first come, first served"
        if got:
            self.threads.discard(run)
        elif wait and not parked:
            self.threads.add(run)

    @rule(run=st.sampled_from(RUNS))
    def in_worker(self, run: str) -> None:
        self.core.slice_from(run, self.now)
        assert (run in self.core.slices) == (run in self.core.computing)

    @rule(dt=st.sampled_from([0.25, 0.5, 1.0, 2.0]))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule()
    def slice_ends(self) -> None:
        core = self.core
        before = dict(core.slices)
        waited = bool(core.share_queue) and len(core.computing) >= core.cpu_shares
        run, due = core.park_due(self.now, SLICE)
        if run is None:
            if waited and before:
                assert due == min(before.values()) + SLICE > self.now, "the first slice to end is not over yet"
            return
        assert waited, "a step is parked only while a run waits and no share is free"
        assert before[run] == min(before.values()) and before[run] + SLICE <= self.now
        assert run in core.parked and core.share_queue[-1] == run and run not in core.computing

    @rule()
    def resume(self) -> None:
        core = self.core
        head = core.share_head()
        run = core.resume_head(self.now)
        if head is not None and head in core.parked | {run}:
            assert run == head, "a free share goes to the parked run at the head"
            assert run in core.computing and core.slices[run] == self.now and run not in core.parked
        else:
            assert run is None

    @rule(run=st.sampled_from(RUNS))
    def step_over(self, run: str) -> None:
        parked = run in self.core.parked
        assert self.core.give_share(run) == parked
        assert run not in self.core.computing and run not in self.core.parked and run not in self.core.slices
        if parked:
            assert run not in self.core.share_queue

    @rule(run=st.sampled_from(RUNS))
    def stops_softly(self, run: str) -> None:
        parked = run in self.core.parked
        assert self.core.unpark(run) == parked
        assert run not in self.core.parked and run not in self.core.slices, "its stop is never parked"
        if parked:
            assert run not in self.core.share_queue

    @precondition(lambda self: bool(self.threads))
    @rule(data=st.data())
    def thread_gives_up(self, data: Any) -> None:
        run = data.draw(st.sampled_from(sorted(self.threads)))
        self.core.leave_shares(run)
        self.threads.discard(run)
        assert run not in self.core.share_queue

    @invariant()
    def bounded(self) -> None:
        core = self.core
        assert len(core.computing) <= core.cpu_shares
        assert core.parked <= set(core.share_queue), "a parked run waits in the queue for its turn"
        assert not core.parked & core.computing
        assert set(core.slices) <= core.computing
        assert len(set(core.share_queue)) == len(core.share_queue)
        assert not set(core.share_queue) & core.computing


TestSlices = Slices.TestCase
TestSlices.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


# -- real workers ------------------------------------------------------------------


def states(pool: WorkerPool) -> set[str]:
    """The pool's workers' states: ``T`` when every thread of it is stopped,
    ``R`` when one runs (its JavaScript thread computing), else ``S``."""
    seen = set()
    for pid in pool.pids():
        threads = thread_states(pid)
        if threads:  # (not gone)
            seen.add("T" if stopped(pid) else "R" if "R" in threads else "S")
    return seen


def started(out: dict, key: str, program: str, pool: WorkerPool, **kw: Any) -> threading.Thread:
    t = threading.Thread(
        target=lambda: out.__setitem__(
            key, run_code(program, kw.pop("tools", []), runtime=pool, description="t", **kw)
        ),
        name=f"test-run-{key}",
    )
    t.start()
    return t


SPIN_AT_ONCE = 'console.log("spinning"); while (true) {}'
# The spinning step is the one the relay's kick sends (the scheduler's driver, as the call commits).
SPIN_AFTER_A_CALL = 'await tools.t({}); console.log("spinning"); while (true) {}'


@pytest.mark.timeout(180)
@pytest.mark.parametrize("spin", [SPIN_AT_ONCE, SPIN_AFTER_A_CALL], ids=["first-step", "kicked-step"])
def test_runs_behind_programs_that_spin_on_every_share_are_answered_while_they_spin(spin):
    pool = WorkerPool(size=6, cpu_shares=1, spares=0)
    cancel = threading.Event()
    out: dict = {}
    tools = [Tool("t", lambda a: 1)]
    try:
        a = started(out, "a", spin, pool, timeout=150, cancel=cancel, tools=tools)
        assert until(lambda: pool.shares() == (1, 0) and pool._core.slices and states(pool) == {"R"}), "it computes"
        b = started(out, "b", spin, pool, timeout=150, cancel=cancel, tools=tools)
        # Without slices the honest runs would wait for the only share until the spinners' deadlines.
        honest = [run_code("return 42", runtime=pool, timeout=60, description="t") for _ in range(5)]
        assert [(r.error, r.result) for r in honest] == [(None, 42)] * 5
        seen: set = set()
        assert until(lambda: seen.update(states(pool)) or {"R", "T"} <= seen), "the spinners take turns"
        assert a.is_alive() and b.is_alive(), "the spinners still spin"
        cancel.set()
        a.join(60)
        b.join(60)
        for key in "ab":
            assert out[key].error.kind == "cancelled" and out[key].logs == ("spinning",)
        assert pool.shares() == (0, 0) and not pool._core.parked
    finally:
        cancel.set()
        pool.close()


def holder(pool: WorkerPool) -> threading.Thread:
    """Another run's thread that waits for a share as a start-up does (no
    slice of its own ever ends) and keeps it until the test gives it back."""
    t = threading.Thread(
        target=pool._take_share, args=("another run", Limits(), time.monotonic() + 100, None, False), name="test-holder"
    )
    t.start()
    return t


def parked_behind_a_holder(pool: WorkerPool, out: dict, **kw: Any) -> threading.Thread:
    """A spinning run, parked for good: its slice ends while another run
    waits, and that run holds the share and never gives it back."""
    a = started(out, "a", SPIN_AT_ONCE, pool, **kw)
    assert until(lambda: pool.shares() == (1, 0) and pool._core.slices and states(pool) == {"R"}), "it computes"
    holder(pool).join(60)
    assert pool.shares() == (1, 1) and pool._core.parked == {pool._core.share_queue[0]}
    assert until(lambda: states(pool) == {"T"}), "its worker is stopped"
    return a


@pytest.fixture
def one_share_pool() -> Iterator[WorkerPool]:
    pool = WorkerPool(size=2, cpu_shares=1, spares=0)
    yield pool
    pool.close()


@pytest.fixture
def cancel() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # (before the pool closes: a run still spinning stops)


def serves_once_the_holder_gives_back(pool: WorkerPool) -> None:
    pool._give_share("another run")
    assert run_code("return 1", runtime=pool, timeout=30, description="t").result == 1


@pytest.mark.timeout(120)
def test_a_parked_run_at_its_deadline_goes_on_to_stop_softly_with_its_logs(one_share_pool):
    pool = one_share_pool
    out: dict = {}
    a = parked_behind_a_holder(pool, out, timeout=8)  # (long enough to be parked first on a loaded machine)
    a.join(60)
    r = out["a"]
    assert r.error.kind == "timeout" and r.logs == ("spinning",)
    assert "(running JavaScript) and was stopped" in r.error.message, "stopped by its engine, not killed"
    assert pool.shares() == (1, 0) and not pool._core.parked and not pool._core.share_queue
    serves_once_the_holder_gives_back(pool)


@pytest.mark.timeout(120)
def test_a_parked_run_that_is_cancelled_goes_on_to_stop_softly_with_its_logs(one_share_pool, cancel):
    pool = one_share_pool
    out: dict = {}
    a = parked_behind_a_holder(pool, out, timeout=60, cancel=cancel)
    cancel.set()
    a.join(60)
    assert out["a"].error.kind == "cancelled" and out["a"].logs == ("spinning",), out["a"]
    assert pool.shares() == (1, 0) and not pool._core.parked and not pool._core.share_queue
    serves_once_the_holder_gives_back(pool)


@pytest.mark.timeout(120)
def test_a_parked_run_is_resumed_when_the_share_comes_back_and_ends_as_it_would_have(one_share_pool):
    pool = one_share_pool
    out: dict = {}
    program = 'console.log("counting"); let n = 0; for (let i = 0; i < 6e7; i++) n += 1; return n'
    a = started(out, "a", program, pool, timeout=120)
    assert until(lambda: pool.shares() == (1, 0) and pool._core.slices and states(pool) == {"R"}), "it computes"
    holder(pool).join(60)
    assert until(lambda: states(pool) == {"T"}), "its worker is stopped"
    pool._give_share("another run")
    a.join(100)
    assert out["a"].error is None and out["a"].result == 60_000_000 and out["a"].logs == ("counting",)
    assert pool.shares() == (0, 0) and not pool._core.parked


@pytest.mark.timeout(120)
def test_a_parked_run_whose_worker_is_killed_after_its_first_answer_ends_abort_and_frees_its_place(one_share_pool):
    pool = one_share_pool
    out: dict = {}
    program = 'console.log("before"); await tools.t({}); while (true) {}'
    called: list[float] = []
    a = started(out, "a", program, pool, timeout=60, tools=[Tool("t", lambda a: called.append(time.monotonic()))])
    # (The spinning step's slice starts after the call returned; the first step's started before it.)
    assert until(lambda: called and any(t > called[0] for t in pool._core.slices.values()) and states(pool) == {"R"}), (
        "the step after the call computes"
    )
    holder(pool).join(60)
    assert until(lambda: states(pool) == {"T"}), "its worker is stopped"
    (pid,) = pool.pids()
    os.kill(pid, 9)  # (SIGKILL reaches a stopped process)
    a.join(60)
    r = out["a"]
    assert r.error.kind == "abort" and "died" in r.error.message and r.logs == ("before",), (r.error, r.logs)
    assert not pool._core.parked and not pool._core.share_queue and pool.shares() == (1, 0)
    assert until(lambda: pid not in pool.pids()), "its place is freed"
    serves_once_the_holder_gives_back(pool)
    assert pool.shares() == (0, 0)


@pytest.mark.timeout(120)
def test_a_parked_run_whose_worker_is_killed_before_its_first_answer_is_started_again_when_a_share_is_free(
    one_share_pool, cancel
):
    pool = one_share_pool
    out: dict = {}
    a = parked_behind_a_holder(pool, out, timeout=60, cancel=cancel)
    (pid,) = pool.pids()
    os.kill(pid, 9)
    # Started again (the host served none of its calls), on a new worker that waits for the share.
    assert until(lambda: pid not in pool.pids() and pool.shares() == (1, 1) and not pool._core.parked)
    pool._give_share("another run")
    assert until(lambda: states(pool) == {"R"}), "the program spins again on its new worker"
    cancel.set()
    a.join(60)
    assert out["a"].error.kind == "cancelled" and out["a"].logs == ("spinning",), (out["a"].error, out["a"].logs)
    assert pool.shares() == (0, 0) and not pool._core.parked and not pool._core.share_queue


# -- a frame read across a deadline ------------------------------------------------


def test_a_frame_cut_by_the_deadline_is_read_on_from_where_it_was_cut():
    # A worker parked (or slow) in the middle of writing a large frame: the
    # host's read reaches the deadline mid-frame, stops the worker softly and
    # reads on. What it had read of the frame must stay, or the next read
    # starts inside the frame and the run ends "broke the protocol".
    read, write = os.pipe()
    os.set_blocking(read, False)
    w = object.__new__(procio.Worker)  # its reading only: no process is needed
    w.fd_out, w.buf, w.cpu_watch = read, bytearray(), None
    w._out_poll = select.poll()
    w._out_poll.register(read, select.POLLIN)
    body = bytes(range(256)) * 1000
    frame = procio.worker.frame(procio.worker.STOPPED, body)
    try:
        os.write(write, frame[:60_000])
        with pytest.raises(procio.Expired):
            w.receive(time.monotonic() + 0.05, None, 1 << 20)
        rest = frame[60_000:]
        thread = threading.Thread(
            target=lambda: [os.write(write, rest[i : i + 30_000]) for i in range(0, len(rest), 30_000)]
        )
        thread.start()
        assert w.receive(time.monotonic() + 60, None, 1 << 20) == (procio.worker.STOPPED, body)
        thread.join(60)
        assert not w.buf
    finally:
        os.close(read)
        os.close(write)


@pytest.mark.timeout(180)
def test_programs_that_log_without_end_on_too_few_shares_each_end_at_their_deadline_with_their_logs():
    # Each stops at its deadline with a stop frame of about a megabyte (its
    # logs), while the slices park and resume the others: every one ends
    # "timeout" with its logs (an early slicer parked a stop mid-frame and the
    # host lost its place in the frame: "the worker process broke the protocol").
    pool = WorkerPool(size=6, cpu_shares=1, spares=0)
    program = "const line = 'y'.repeat(10000); for (let i = 0; ; i++) console.log(i + line);"
    results: list = []

    def runs() -> None:
        for _ in range(2):
            results.append(run_code(program, runtime=pool, timeout=2, description="t"))

    try:
        threads = [threading.Thread(target=runs, name=f"test-logs-{i}") for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [r.error.kind for r in results] == ["timeout"] * 8, [r.error for r in results]
        assert all(len(r.logs) > 10 for r in results)
    finally:
        pool.close()

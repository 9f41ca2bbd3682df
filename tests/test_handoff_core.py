"""Who reads a run's worker (nous_sched/runtime/_handoffcore.py), driven by a
hypothesis state machine through every interleaving of the run's own thread
(attach, read while it holds the reader, take it back at its deadline, a
cancel, an interrupt or a wake, collect) and the scheduler's driver (the
worker's pipe readable, one frame read and stepped, the step going on or
handing the run back), with the worker writing frames at any time. Each rule
is one lock section of the shell (:class:`nous_sched.runtime._remote.Relay`).
"""

from __future__ import annotations

from typing import Optional

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nous_sched.runtime._handoffcore import DRIVER_READS, DRIVER_STEPPING, RETURNED, RUN_READS, HandoffCore

# The run's thread's phases.
OWNS = "owns"  # holds its reader: may read the worker, may attach
WAITS = "waits"  # attached; sleeps until woken, its deadline, a cancel or an interrupt
TAKING = "taking"  # asked for its reader while the driver stepped; waits for the step's end

REASONS = st.sampled_from(["deadline", "cancel", "interrupt", "woken"])
BACKS = st.sampled_from([None, None, None, "end", "question", "raised", "split frame"])


class HandoffMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = HandoffCore()
        self.run = OWNS
        self.stepping = False  # the driver between a readable() that said True and its step_done
        self.written = 0  # frames the worker wrote
        self.read_by: list[str] = []  # who read each frame, in order
        self.woken = False  # the driver woke the run's thread (a byte on its wake pipe)
        self.handed_back: Optional[str] = None  # the reason of the driver's last hand-back, until collected

    # -- the worker -------------------------------------------------------------------

    @rule()
    def worker_writes(self) -> None:
        self.written += 1

    # -- the run's thread -------------------------------------------------------------

    @precondition(lambda self: self.run == OWNS and self.written > len(self.read_by))
    @rule()
    def run_reads(self) -> None:
        assert self.core.state is RUN_READS, "the run's thread read while the driver held the reader"
        assert not self.stepping
        self.read_by.append("run")

    @precondition(lambda self: self.run == OWNS)
    @rule()
    def run_attaches(self) -> None:
        self.core.attach()
        self.run = WAITS
        self.woken = False

    @precondition(lambda self: self.run == WAITS)
    @rule(reason=REASONS)
    def run_takes_back(self, reason: str) -> None:
        # Its deadline, a cancel, an interrupt, or a wake (the driver's, a kick's).
        if reason == "woken" and not self.woken:
            reason = "deadline"  # (a wake with no byte is a timeout)
        if self.core.take_back(reason):
            self._collect(reason)
        else:
            assert self.stepping, "the run's thread waits for a step that is not running"
            self.run = TAKING

    @precondition(lambda self: self.run == TAKING and self.woken)
    @rule()
    def run_woken_after_the_step(self) -> None:
        assert self.core.take_back("woken")
        self._collect(None)

    def _collect(self, own: Optional[str]) -> None:
        assert not self.stepping, "the run's thread went on while the driver stepped"
        reason = self.core.collect()
        if self.handed_back is not None:
            assert reason == self.handed_back, "the driver's hand-back was lost"
        elif own is not None:
            assert reason == own
        self.handed_back = None
        self.run = OWNS
        self.woken = False

    # -- the driver -------------------------------------------------------------------

    @precondition(lambda self: not self.stepping and self.written > len(self.read_by))
    @rule()
    def driver_sees_data(self) -> None:
        before = self.core.state
        if self.core.readable():
            assert before is DRIVER_READS
            assert self.run != OWNS
            self.stepping = True
        else:
            assert before is not DRIVER_READS  # (the driver drops the pipe)

    @precondition(lambda self: self.stepping)
    @rule(back=BACKS, reads=st.booleans())
    def driver_steps(self, back: Optional[str], reads: bool) -> None:
        assert self.core.state is DRIVER_STEPPING
        if reads and self.written > len(self.read_by):
            assert self.run != OWNS
            self.read_by.append("driver")
        wanted = self.run == TAKING
        wake = self.core.step_done(back)
        self.stepping = False
        if back is not None:
            assert wake and self.core.state is RETURNED
            self.handed_back = back
        elif wanted:
            assert wake and self.core.state is RETURNED
        else:
            assert not wake and self.core.state is DRIVER_READS
        if wake:
            self.woken = True

    @precondition(lambda self: not self.stepping)
    @rule()
    def driver_leaves(self) -> None:
        # Its scheduler stopped: the reader goes back (once), and nothing is read there again.
        before = self.core.state
        if self.core.left():
            assert before is DRIVER_READS and self.core.state is RETURNED
            self.handed_back = "driver left"
            self.woken = True
        else:
            assert before is not DRIVER_READS

    # -- what is always true ----------------------------------------------------------

    @invariant()
    def one_reader(self) -> None:
        assert not (self.run == OWNS and self.stepping)
        if self.run == OWNS:
            assert self.core.state is RUN_READS
        if self.stepping:
            assert self.core.state is DRIVER_STEPPING
        if self.core.state is RUN_READS:
            assert self.run == OWNS

    @invariant()
    def a_waiting_run_is_woken_once_its_reader_is_back(self) -> None:
        if self.run == TAKING:
            assert self.core.state in (DRIVER_STEPPING, RETURNED)
            assert self.stepping or self.woken
        if self.core.state is RETURNED and self.handed_back is not None:
            assert self.woken

    @invariant()
    def each_frame_is_read_once(self) -> None:
        assert len(self.read_by) <= self.written


HandoffMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None, derandomize=True, database=None
)
test_one_reader_each_frame_once_and_the_run_waits_for_a_step = HandoffMachine.TestCase


# -- examples, for a reader ----------------------------------------------------------


def test_a_deadline_while_the_driver_steps_waits_for_the_step_then_returns() -> None:
    core = HandoffCore()
    core.attach()
    assert core.readable()
    assert not core.take_back("deadline")
    assert core.step_done(None)  # the step would have gone on: the run wanted its reader
    assert core.collect() == "deadline"
    assert core.state is RUN_READS
    assert not core.readable()


def test_the_drivers_hand_back_wins_over_a_take_back_during_its_step() -> None:
    core = HandoffCore()
    core.attach()
    assert core.readable()
    assert not core.take_back("cancel")
    assert core.step_done("end")
    assert core.collect() == "end"


def test_a_returned_reader_is_never_the_drivers_again_until_attached() -> None:
    core = HandoffCore()
    core.attach()
    assert core.take_back("interrupt")
    assert not core.readable()  # the driver drops the pipe
    assert core.collect() == "interrupt"
    core.attach()
    assert core.readable()


def test_a_driver_that_leaves_hands_the_reader_back() -> None:
    core = HandoffCore()
    core.attach()
    assert core.left()
    assert not core.readable()
    assert core.collect() == "driver left"
    assert not core.left()


def test_misuse_is_refused() -> None:
    core = HandoffCore()
    with pytest.raises(RuntimeError):
        core.step_done(None)
    core.attach()
    with pytest.raises(RuntimeError):
        core.attach()
    assert core.readable()
    with pytest.raises(RuntimeError):
        core.collect()

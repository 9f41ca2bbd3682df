"""The pure lane: every ordering guarantee of the scheduler, as a property of ``Lane``.

A hypothesis state machine accepts parallel and exclusive calls, finishes
running ones in any order, drives the lane, and abandons it, checking after
every step:

* commit order: ``COMMIT`` actions come for seq 0, 1, 2, ... with no gaps;
* first in, first out: ``START`` actions come in seq order;
* the ceiling: never more than ``max_parallel`` calls running;
* the exclusive barrier: an exclusive call starts only when nothing runs and
  every earlier call has committed, and nothing starts or commits between its
  start and its commit;
* eagerness: when :meth:`Lane.step` says ``None``, nothing was startable or
  committable;
* abandon: every accepted call is committed once, or handed back queued or
  running, and the lane then does nothing.

No threads, no clocks: it runs in well under a second and the same way every
time (``derandomize``). The threaded tests in ``test_scheduler.py`` check the
shell around it.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nous_sched.result.records import LaneState
from nous_sched.scheduler.lane import COMMIT, START, Lane, LaneClosed

MODES = st.sampled_from(["parallel", "exclusive"])


class LaneMachine(RuleBasedStateMachine):
    """A model of what happened, checked against the lane's actions and state."""

    @initialize(max_parallel=st.integers(min_value=1, max_value=4))
    def start(self, max_parallel: int) -> None:
        self.max_parallel = max_parallel
        self.lane: Lane[int] = Lane(max_parallel)
        self.modes: list[str] = []  # by seq
        self.started: list[int] = []
        self.running: set[int] = set()
        self.finished: set[int] = set()  # finished, not yet committed
        self.committed: list[int] = []
        self.exclusive: int | None = None  # the exclusive call holding the barrier
        self.abandoned = False
        self.handed_back: set[int] = set()  # queued or running at abandon

    # -- rules --------------------------------------------------------------

    @precondition(lambda self: not self.abandoned)
    @rule(mode=MODES)
    def accept(self, mode: str) -> None:
        seq = self.lane.accept(len(self.modes), mode)
        assert seq == len(self.modes), "seqs count up from 0 in acceptance order"
        self.modes.append(mode)

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.running)), label="finishes")
        item = self.lane.finished(seq)
        assert item == (None if self.abandoned else seq), "finished() hands back the call's item, until abandon"
        if not self.abandoned:
            self.running.discard(seq)
            self.finished.add(seq)

    @rule()
    def drive(self) -> None:
        for _ in range(2 * len(self.modes) + 2):
            action = self.lane.step()
            if action is None:
                break
            assert not self.abandoned, "an abandoned lane does nothing"
            kind, seq = action
            if kind is START:
                self._check_start(seq)
            else:
                assert kind is COMMIT
                self._check_commit(seq)
        else:
            raise AssertionError("step() never said None: the lane livelocked")
        self._check_nothing_left_to_do()

    @precondition(lambda self: not self.abandoned)
    @rule()
    def abandon(self) -> None:
        unstarted = [seq for seq in range(len(self.modes)) if seq not in self.started]
        out = self.lane.abandon()
        assert list(out.queued) == unstarted, "queued calls come back in seq order"
        assert list(out.running) == sorted(self.running), "running calls come back in seq order"
        assert list(out.settled) == sorted(self.finished), "finished calls are committed, in seq order"
        self.committed.extend(out.settled)
        self.handed_back = set(out.queued) | set(out.running)
        self.abandoned = True
        accepted = set(range(len(self.modes)))
        assert set(self.committed) | self.handed_back == accepted, "every accepted call is accounted for"
        assert len(self.committed) + len(self.handed_back) == len(accepted), "and exactly once"
        assert self.lane.abandon() == type(out)((), (), ()), "abandon is idempotent"
        with pytest.raises(LaneClosed):
            self.lane.accept(-1, "parallel")

    # -- checks -------------------------------------------------------------

    def _check_start(self, seq: int) -> None:
        assert seq == len(self.started), f"started {seq} out of order after {self.started}"
        assert self.exclusive is None, f"{seq} started inside exclusive {self.exclusive}'s window"
        if self.modes[seq] == "exclusive":
            assert not self.running, f"exclusive {seq} started beside {self.running}"
            assert len(self.committed) == seq, f"exclusive {seq} started before its predecessors committed"
            self.exclusive = seq
        else:
            assert len(self.running) < self.max_parallel, "over the max_parallel ceiling"
        self.started.append(seq)
        self.running.add(seq)

    def _check_commit(self, seq: int) -> None:
        assert seq == len(self.committed), f"committed {seq} out of order after {self.committed}"
        assert seq in self.finished, f"committed {seq}, which has not finished"
        if self.exclusive is not None:
            assert seq == self.exclusive, f"{seq} committed inside exclusive {self.exclusive}'s window"
            self.exclusive = None
        self.finished.discard(seq)
        self.committed.append(seq)

    def _check_nothing_left_to_do(self) -> None:
        if self.abandoned:
            return
        assert len(self.committed) not in self.finished, "the head of the line finished but did not commit"
        head = len(self.started)
        if head == len(self.modes) or self.exclusive is not None:
            return  # nothing queued, or the barrier holds it
        if self.modes[head] == "exclusive":
            assert self.running or len(self.committed) < head, f"exclusive head {head} could have started"
        else:
            assert len(self.running) >= self.max_parallel, f"parallel head {head} could have started"

    @invariant()
    def state_matches_the_model(self) -> None:
        if not hasattr(self, "lane"):
            return
        state = self.lane.state()
        assert len(self.running) <= self.max_parallel
        if self.abandoned:
            assert (state.pending, state.inflight, state.settled, state.exclusive) == ((), (), (), None)
            assert state.stopped and state.submitted == len(self.modes)
            return
        assert state == LaneState(
            pending=tuple(seq for seq in range(len(self.modes)) if seq not in self.started),
            inflight=tuple(sorted(self.running)),
            settled=tuple(sorted(self.finished)),
            cursor=len(self.committed),
            exclusive=self.exclusive,
            submitted=len(self.modes),
            stopped=False,
        )


LaneMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None, derandomize=True, database=None
)
test_lane_keeps_every_scheduler_guarantee = LaneMachine.TestCase


# -- examples, for a reader ----------------------------------------------------------


def drain(lane: Lane[str]) -> list[tuple[str, str]]:
    actions = []
    while (action := lane.step()) is not None:
        actions.append(action)
    return actions


def test_a_call_that_finishes_first_waits_to_commit_in_order():
    lane: Lane[str] = Lane(max_parallel=2)
    lane.accept("a", "parallel")
    lane.accept("b", "parallel")
    assert drain(lane) == [(START, "a"), (START, "b")]
    lane.finished(1)
    assert drain(lane) == [], "b finished first but a has not committed"
    lane.finished(0)
    assert drain(lane) == [(COMMIT, "a"), (COMMIT, "b")]


def test_an_exclusive_call_holds_the_barrier_until_it_commits():
    lane: Lane[str] = Lane(max_parallel=4)
    for item, mode in (("p0", "parallel"), ("x1", "exclusive"), ("p2", "parallel")):
        lane.accept(item, mode)
    assert drain(lane) == [(START, "p0")], "the exclusive head waits for p0 to commit"
    lane.finished(0)
    assert drain(lane) == [(COMMIT, "p0"), (START, "x1")]
    assert lane.state().exclusive == 1
    lane.finished(1)
    assert drain(lane) == [(COMMIT, "x1"), (START, "p2")], "p2 starts only once x1 committed"


def test_abandon_hands_back_what_did_not_commit():
    lane: Lane[str] = Lane(max_parallel=2)
    for item in ("run", "done", "queued"):
        lane.accept(item, "parallel")
    drain(lane)
    lane.finished(1)
    out = lane.abandon()
    assert (out.queued, out.running, out.settled) == (("queued",), ("run",), ("done",))
    lane.finished(0)  # a tool returning after the run is over changes nothing
    assert lane.step() is None and lane.state().stopped

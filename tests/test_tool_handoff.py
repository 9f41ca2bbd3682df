"""The tool threads' hand-off (nous_sched/scheduler/_tool_handoff.py), driven through
every interleaving of threads, submitters, cancels, retires and shutdowns
by a hypothesis state machine; and the interleaving that once lost a task
(commit aed349f), replayed step by step, against the core and against a
copy of the old mistake (which the machine catches).

A model thread steps through what the shell's thread does, one lock section
(one core call) per rule, so every point where another thread may act is a
point where the machine may choose another rule: a thread told to start
and not yet running; started and not yet asking; busy; parked; its wait
returned (signalled, or timed out) and not yet in the lock; told to leave
and not yet gone.
"""

from __future__ import annotations

from typing import Optional

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from nous_sched.scheduler._tool_handoff import LEAVE, PARKED, Handoff, Slot

# A model thread's phases, in the order the shell's thread goes through them.
UNSTARTED = "unstarted"  # the core said to start it; Thread.start not yet called
STARTING = "starting"  # running; not yet asked for its first step (begin)
BUSY = "busy"  # owns a task, runs it
WAITING = "waiting"  # parked on its wake lock
ACQUIRED = "acquired"  # its wait took a signal; not yet in the lock (woken)
TIMED_OUT = "timed out"  # its wait timed out; not yet in the lock (timed_out)
LEAVING = "leaving"  # told to leave; not yet gone (the window aed349f lost a task in)
GONE = "gone"

RARELY = st.integers(0, 9)


class FakeTask:
    """A task: run once by whichever thread owns it, or cancelled first (the shell's ``Task`` claim)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.ran = 0
        self.cancelled = False
        self.refused = False  # its submit raised: the thread started for it could not start

    def claim(self) -> bool:
        if self.cancelled or self.ran:
            return False
        return True

    def __repr__(self) -> str:
        return f"task{self.k}"


class FakeSlot(Slot):
    """A slot whose wake lock is a count of releases: a real lock released
    twice raises, so a second signal is a failure here."""

    __slots__ = ("released",)

    def __init__(self, serial: int) -> None:
        super().__init__(serial)
        self.released = 0

    def signal(self) -> None:
        assert self.released == 0, f"thread {self.serial}'s wake lock released twice"
        self.released = 1


class Thread:
    def __init__(self, serial: int, first: FakeTask) -> None:
        self.slot = FakeSlot(serial)
        self.phase = UNSTARTED
        self.task: Optional[FakeTask] = None
        self.first = first  # the task it was started for (start_failed's)

    def __repr__(self) -> str:
        return f"Thread({self.slot.serial}, {self.phase}, {self.task})"


class HandoffMachine(RuleBasedStateMachine):
    """Submitters, threads and the owner, each acting between any two lock sections of the others."""

    def __init__(self, core: Optional[Handoff[FakeTask]] = None) -> None:
        super().__init__()
        self.core: Handoff[FakeTask] = core if core is not None else Handoff(1)
        self.threads: list[Thread] = []
        self.tasks: list[FakeTask] = []
        self.closed = False
        self.stranded = False  # a refused start left tasks queued with no member (the documented exception)

    # -- the model's bookkeeping --------------------------------------------------

    def _in(self, *phases: str) -> list[Thread]:
        return [t for t in self.threads if t.phase in phases]

    def _apply(self, thread: Thread, step: object) -> None:
        """What the shell's thread does with a step answer."""
        if step is PARKED:
            assert thread.slot.idle and thread.slot in self.core.idle
            thread.phase = WAITING
        elif step is LEAVE:
            assert not thread.slot.idle
            thread.phase = LEAVING
        else:
            assert isinstance(step, FakeTask), step
            assert step in self.tasks and step not in self.core.pending
            assert all(t.task is not step for t in self.threads), f"{step} taken twice"
            thread.task = step
            thread.phase = BUSY

    def _pick(self, data: st.DataObject, *phases: str) -> Thread:
        return data.draw(st.sampled_from(self._in(*phases)))

    @initialize(max_threads=st.integers(1, 4))
    def a_set_of_at_most(self, max_threads: int) -> None:
        self.core = Handoff(max_threads)

    # -- submitters and the owner -------------------------------------------------

    @rule(n=st.integers(0, 3))
    def a_burst(self, n: int) -> None:
        """``n`` tasks submitted one after another (0: none, so that threads
        move between a run's calls as often as the calls come)."""
        for _ in range(n):
            self.submit()

    def submit(self) -> None:
        task = FakeTask(len(self.tasks))
        try:
            serial = self.core.submit(task)
        except RuntimeError:
            assert self.closed, "submit refused before shutdown"
            return
        assert not self.closed, "submit accepted after shutdown"
        self.tasks.append(task)
        if serial is not None:
            assert serial not in {t.slot.serial for t in self.threads}
            self.threads.append(Thread(serial, task))

    # The owner's acts are always possible; each is drawn 1 time in RARELY
    # so that threads get to park, wake and time out between them.

    @precondition(lambda self: any(t.claim() for t in self.tasks))
    @rule(data=st.data(), k=RARELY)
    def cancel(self, data: st.DataObject, k: int) -> None:
        if k:
            return
        task = data.draw(st.sampled_from([t for t in self.tasks if t.claim()]))
        task.cancelled = True  # the shell's Task.cancel: its run, when taken, is a no-op

    @rule(k=RARELY)
    def retire(self, k: int) -> None:
        if not k:
            self.core.retire()

    @precondition(lambda self: len(self.tasks) >= 6)  # late: nothing happens after it
    @rule(drop=st.booleans(), k=RARELY)
    def shutdown(self, drop: bool, k: int) -> None:
        if k:
            return
        for task in self.core.close(drop):
            task.cancelled = True
        self.closed = True
        self.core.retire()

    # -- threads ----------------------------------------------------------------
    #
    # One rule moves any thread that can move by one lock section (or one
    # step outside the lock); timeouts are a rule of their own. (One rule
    # for all, so that the moves are drawn as often as the submits.)

    def _movable(self) -> list[Thread]:
        """The threads that can move now, but those leaving: they go by a rule
        of their own, so the window between a thread's decision to leave and
        its exit stays open across other rules (aed349f lost a task there)."""
        return [t for t in self.threads if t.phase in self._moves or (t.phase == WAITING and t.slot.released)]

    @precondition(lambda self: self._movable())
    @rule(data=st.data(), k=RARELY, exception=st.booleans())
    def a_thread_moves(self, data: st.DataObject, k: int, exception: bool) -> None:
        thread = data.draw(st.sampled_from(self._movable()))
        if thread.phase == UNSTARTED and not k:
            self._start_fails(thread, exception)  # 1 time in RARELY
        else:
            self._move(thread)

    @precondition(lambda self: self._movable())
    @rule(data=st.data())
    def the_threads_settle(self, data: st.DataObject) -> None:
        """Threads move, in any order, until none can (a quiet moment between bursts)."""
        for _ in range(100):
            movable = self._movable()
            if not movable:
                return
            self._move(data.draw(st.sampled_from(movable)))

    @precondition(lambda self: any(not t.slot.released for t in self._in(WAITING)))
    @rule(data=st.data())
    def a_wait_times_out(self, data: st.DataObject) -> None:
        thread = data.draw(st.sampled_from([t for t in self._in(WAITING) if not t.slot.released]))
        thread.phase = TIMED_OUT  # a signal may still come before it takes the lock

    def _move(self, thread: Thread) -> None:
        if thread.phase == WAITING:  # its wait takes its signal
            thread.slot.released = 0
            thread.phase = ACQUIRED
        else:
            self._moves[thread.phase](self, thread)

    def _starts(self, thread: Thread) -> None:
        thread.phase = STARTING

    def _start_fails(self, thread: Thread, exception: bool) -> None:
        """Thread.start raised: an OS refusal (``exception``) or an interrupt."""
        thread.phase = GONE
        if self.core.start_failed(thread.first, exception):
            assert thread.first not in self.core.pending and not thread.first.ran
            thread.first.refused = True
        if self.core.pending and self.core.count == 0:
            self.stranded = True

    def _begins(self, thread: Thread) -> None:
        self._apply(thread, self.core.begin(thread.slot))

    def _finishes(self, thread: Thread) -> None:
        task = thread.task
        assert task is not None
        if task.claim():
            task.ran += 1
        thread.task = None
        self._apply(thread, self.core.after(thread.slot))

    def _comes_woken(self, thread: Thread) -> None:
        self._apply(thread, self.core.woken(thread.slot))

    def _comes_timed_out(self, thread: Thread) -> None:
        step = self.core.timed_out(thread.slot)
        if step is None:
            # Signalled since its wait ended: its acquire must not block.
            assert thread.slot.released, "told a signal came, but its wake lock was never released"
            thread.slot.released = 0
            step = self.core.woken(thread.slot)
        self._apply(thread, step)

    @precondition(lambda self: self._in(LEAVING))
    @rule(data=st.data())
    def a_leaving_thread_is_gone(self, data: st.DataObject) -> None:
        self._is_gone(self._pick(data, LEAVING))

    def _is_gone(self, thread: Thread) -> None:
        thread.phase = GONE
        self.gone(thread)

    def gone(self, thread: Thread) -> None:
        """A thread exits (no core call: the core uncounted it when it said LEAVE)."""

    _moves = {
        UNSTARTED: _starts,
        STARTING: _begins,
        BUSY: _finishes,
        ACQUIRED: _comes_woken,
        TIMED_OUT: _comes_timed_out,
    }

    # -- what is always true, per field ---------------------------------------------

    @invariant()
    def pending_holds_each_waiting_task_once(self) -> None:
        pending = list(self.core.pending)
        assert len(set(map(id, pending))) == len(pending), "a task queued twice"
        owned = {id(t.task) for t in self.threads if t.task is not None}
        for task in pending:
            assert id(task) not in owned, f"{task} queued and owned"
            assert not task.ran and not task.refused
        for task in self.tasks:
            places = (id(task) in owned) + (task in pending) + (task.ran > 0) + task.refused
            assert task.ran <= 1, f"{task} ran twice"
            assert places == 1 or task.cancelled, f"{task} is in {places} places (lost or doubled)"

    @invariant()
    def idle_is_the_parked_threads_unsignalled(self) -> None:
        idle = self.core.idle
        assert len({id(s) for s in idle}) == len(idle)
        on_stack = {id(s) for s in idle}
        for thread in self.threads:
            slot = thread.slot
            assert slot.idle == (id(slot) in on_stack), thread
            if slot.idle:
                assert thread.phase in (WAITING, TIMED_OUT) and not slot.released, thread

    @invariant()
    def waking_is_one_thread_on_its_way(self) -> None:
        on_way = [
            t
            for t in self._in(WAITING, ACQUIRED, TIMED_OUT)
            if not t.slot.idle and not t.slot.retire and (t.slot.released or t.phase == ACQUIRED)
        ]
        assert len(on_way) == self.core.waking, (on_way, self.core.waking)

    @invariant()
    def starting_counts_threads_not_yet_asking(self) -> None:
        assert self.core.starting == len(self._in(UNSTARTED, STARTING))

    @invariant()
    def count_is_the_members_within_the_bound(self) -> None:
        members = [t for t in self.threads if t.phase not in (LEAVING, GONE) and not t.slot.retire]
        assert self.core.count == len(members), (self.core.count, members)
        assert self.core.count <= self.core.max_threads
        assert self.core.count >= len(self.core.idle) + self.core.starting + self.core.waking

    @invariant()
    def someone_is_coming(self) -> None:
        core = self.core
        if not core.pending or self.stranded:
            return
        if core.idle:
            assert core.waking, "a task waits and an idle thread was not signalled"
            return
        coming = [
            t
            for t in self.threads
            if t.phase in (UNSTARTED, STARTING, BUSY, ACQUIRED, TIMED_OUT)
            or (t.phase == WAITING and t.slot.released and not t.slot.retire)
        ]
        assert coming, f"a task waits and no thread will look at the queue ({self.threads})"

    @invariant()
    def closed_until_the_end(self) -> None:
        assert self.core.closed == self.closed

    def teardown(self) -> None:
        """Let every thread run until none can move (no timeouts, no more
        submits): every task ran exactly once, or was cancelled or refused."""
        self._drain()
        if self.core.pending and self.stranded and not self.closed:
            self.submit()  # the next thread a submit manages to start takes them
            self._drain()
        for task in self.tasks:
            if not (task.cancelled or task.refused or (self.stranded and self.closed)):
                assert task.ran == 1, f"{task} never ran: lost ({self.threads}, pending {list(self.core.pending)})"

    def _drain(self) -> None:
        for _ in range(10_000):
            for thread in self._in(LEAVING):
                self._is_gone(thread)
            movable = self._movable()
            if not movable:
                return
            self._move(movable[0])
            self.pending_holds_each_waiting_task_once()
            self.count_is_the_members_within_the_bound()
        raise AssertionError("the threads never settle")


HandoffMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=80, deadline=None, derandomize=True, database=None
)
test_tool_handoff_never_loses_a_task = HandoffMachine.TestCase


# -- the interleaving that lost a task (aed349f), replayed -------------------------------


class LateUncount(Handoff[FakeTask]):
    """aed349f's mistake: a thread that timed out (or was retired) still counted
    against the bound until it was gone, a lock section later."""

    __slots__ = ("late",)

    def __init__(self, max_threads: int) -> None:
        super().__init__(max_threads)
        self.late: set[int] = set()  # serials of the threads that leave and still count

    def timed_out(self, slot: Slot) -> object:
        step = super().timed_out(slot)
        if step is LEAVE:
            self.count += 1  # given back only when the thread is gone
            self.late.add(slot.serial)
        return step


class LateUncountMachine(HandoffMachine):
    def gone(self, thread: Thread) -> None:
        core = self.core
        assert isinstance(core, LateUncount)
        if thread.slot.serial in core.late:
            core.count -= 1

    @invariant()
    def count_is_the_members_within_the_bound(self) -> None:
        pass  # the mistake counts a leaving thread on purpose


def replay_the_lost_task(machine: HandoffMachine) -> None:
    """At the bound (one thread): the thread runs a task and parks; its wait
    times out and it decides to leave; a task is submitted before it is gone;
    then it is gone."""
    machine.submit()
    [thread] = machine.threads
    thread.phase = STARTING
    machine._begins(thread)
    machine._finishes(thread)
    assert thread.phase == WAITING
    thread.phase = TIMED_OUT
    machine._comes_timed_out(thread)
    assert thread.phase == LEAVING
    machine.submit()  # between its decision to leave and its exit
    thread.phase = GONE
    machine.gone(thread)
    machine.teardown()


def test_the_task_submitted_as_the_last_thread_leaves_runs():
    machine = HandoffMachine(Handoff(1))
    replay_the_lost_task(machine)
    assert [t.ran for t in machine.tasks] == [1, 1]
    assert len(machine.threads) == 2, "the leaving thread no longer counted: a new one was started"


def test_the_machine_catches_a_thread_that_counts_until_it_is_gone():
    machine = LateUncountMachine(LateUncount(1))
    with pytest.raises(AssertionError, match="never ran: lost"):
        replay_the_lost_task(machine)


def test_a_retired_thread_stops_counting_as_it_is_signalled():
    machine = HandoffMachine(Handoff(1))
    machine.submit()
    [thread] = machine.threads
    thread.phase = STARTING
    machine._begins(thread)
    machine._finishes(thread)
    machine.retire(0)
    assert machine.core.count == 0 and thread.slot.released and thread.slot.retire
    machine.submit()  # before the retired thread has come for its signal
    assert len(machine.threads) == 2
    machine.teardown()
    assert [t.ran for t in machine.tasks] == [1, 1] and thread.phase == GONE


def test_a_burst_wakes_the_hottest_thread_first_and_then_chains():
    core: Handoff[FakeTask] = Handoff(4)
    slots = [FakeSlot(k) for k in range(3)]
    for slot in slots:
        assert core.after(slot) is PARKED
    tasks = [FakeTask(k) for k in range(3)]
    assert core.submit(tasks[0]) is None and slots[2].released, "the most recently idled"
    assert core.submit(tasks[1]) is None and not slots[1].released, "the submitter wakes one: the chain wakes the rest"
    assert core.woken(slots[2]) is tasks[0] and slots[1].released, "the woken thread wakes the next"
    assert core.woken(slots[1]) is tasks[1] and not slots[0].released and core.idle == [slots[0]]

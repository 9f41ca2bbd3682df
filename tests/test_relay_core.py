"""The relay's decisions (nous_sched/runtime/_relaycore.py), driven by a
hypothesis state machine through every interleaving of the run's own thread
(the driving thread: arm, wait, deadline, cancel, the worker's end of file,
collect, finish a handed-off send, the run's end) and the threads that kick
it as calls commit (a send that fits the pipe, one that does not, a payload
the worker must not get, an encoder that raises, a worker gone). Each rule
is one lock section of the shell (:class:`nous_sched.runtime._remote.Relay`).
"""

from __future__ import annotations

from typing import Any, Optional

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nous_sched.runtime._relaycore import ARMED, IDLE, SENT, RelayCore, Take, Write

# The driving thread's phases.
DRIVING = "driving"  # drives the engine; not waiting for a kick
WAITING = "waiting"  # armed; waits on the worker's pipe and the wake pipe
HOLDING = "holding"  # collected a batch; finishes its send if handed off, reads the answers
OVER = "over"  # the run is over (its error raised, or closed)

# What a kick's write does.
WHOLE = "whole"  # the pipe took the whole frame
PARTIAL = "partial"  # the pipe took part (the rest is the driving thread's)
REFUSED = "refused"  # a payload the worker must not get: not written
GONE = "gone"  # the worker is gone (OSError): its end of file tells the driving thread
RAISES = "raises"  # the encoder raised
TAKE_RAISES = "take raises"  # taking the batch raised (MemoryError)
# The end of a run, and an interrupt, are drawn 1 time in RARELY: a run goes on between them.
RARELY = st.integers(0, 9)
KICKS = st.sampled_from([WHOLE, WHOLE, WHOLE, PARTIAL, REFUSED, GONE, RAISES, TAKE_RAISES])


class Boom(Exception):
    pass


class RelayMachine(RuleBasedStateMachine):
    """One run: calls commit, kicks come from any thread at any time, the driving thread waits and collects."""

    def __init__(self) -> None:
        super().__init__()
        self._a_run()

    def _a_run(self) -> None:
        self.core = RelayCore()
        self.phase = DRIVING
        self.committed: list[int] = []  # the engine's committed prefix, not yet taken
        self.next_call = 0
        self.held: list[int] = []  # the batch the driving thread collected
        self.delivered: list[int] = []  # calls whose settle reached the worker, in order
        self.lost_with_run: list[int] = []  # taken in a batch whose kick raised: the run raised
        self.woken = False  # a byte on the wake pipe since the driving thread armed
        self.worker_speaks = False  # a frame written whole (its answer) or the worker gone (its end of file)
        self.worker_gone = False
        self.taker_calls = 0

    # -- the engine's side (the fakes the core is given) ------------------------------

    def _take(self, raises: bool) -> Any:
        def take(_: None) -> list[int]:
            self.taker_calls += 1
            if raises:
                raise Boom("take")
            batch, self.committed = self.committed, []
            return batch

        return take

    def _write(self, how: str) -> Any:
        def write(batch: list[int]) -> bool:
            assert self.phase == WAITING, "a frame written while the driving thread is not waiting for it"
            if how == RAISES:
                raise Boom("encode")
            if how == WHOLE:
                self.delivered += batch
                self.worker_speaks = True
                return True
            if how == GONE:
                self.worker_speaks = self.worker_gone = True
                return True
            return False  # PARTIAL, REFUSED: the driving thread finishes it

        return write

    # -- rules ----------------------------------------------------------------------

    @precondition(lambda self: self.phase == OVER)
    @rule()
    def the_next_run(self) -> None:
        """(A run's relay is its own: a late kick of the last one has been tried by now.)"""
        self._a_run()

    @precondition(lambda self: self.phase != OVER)
    @rule()
    def a_call_commits(self) -> None:
        self.committed.append(self.next_call)
        self.next_call += 1

    @rule(how=KICKS)
    def a_thread_kicks(self, how: str) -> None:
        """Whoever publishes the head (the scheduler's driver, stop(), or the
        driving thread itself, the head published before it armed), at any time."""
        before = self.taker_calls
        acting = self.core.state is ARMED
        if self.core.kicked(self._take(how == TAKE_RAISES), self._write(how)):
            self.woken = True  # the shell writes a byte on the wake pipe
        if not acting:
            assert self.taker_calls == before, "a kick took a batch while the driving thread was not waiting"

    @rule(k=RARELY)
    def a_kick_is_interrupted(self, k: int) -> None:
        """An interrupt lands in a kick outside take and write (the shell's
        outer except), at any time: while the driving thread waits it raises
        it; otherwise no one waits, and it is dropped."""
        if k:
            return
        self.core.failed(KeyboardInterrupt())
        self.woken = True

    @precondition(lambda self: self.phase == DRIVING and not self.committed)
    @rule()
    def the_driving_thread_arms(self) -> None:
        """Nothing committed to send: it arms and waits."""
        self.core.arm()
        self.phase = WAITING
        self.woken = self.worker_speaks = False

    @precondition(lambda self: self.phase == DRIVING and self.committed)
    @rule()
    def the_driving_thread_sends_itself(self) -> None:
        """Calls committed while it read the last answers: it sends them itself (the relay is not involved)."""
        self.delivered += self.committed
        self.committed = []

    @precondition(lambda self: self.phase == WAITING)
    @rule(k=RARELY)
    def its_deadline_or_a_cancel_comes(self, k: int) -> None:
        if k:
            return
        if self.core.disarm():
            self.core.release()
            self.phase = DRIVING  # nothing taken: the committed calls are still its own to send
        else:
            self._collect()

    @precondition(lambda self: self.phase == WAITING and (self.woken or self.worker_speaks))
    @rule()
    def its_wait_wakes(self) -> None:
        """The wake pipe or the worker spoke: what it finds."""
        if self.core.state is SENT:
            self._collect()

    @precondition(lambda self: self.phase == WAITING)
    @rule(k=RARELY)
    def the_worker_ends(self, k: int) -> None:
        """The worker's end of file (or a broken protocol) while it waits."""
        if k:
            return
        if self.core.disarm():
            self.core.release()
            self.phase = OVER
        # else a kick took a batch: the next wait finds it SENT

    @precondition(lambda self: self.phase == HOLDING)
    @rule()
    def the_driving_thread_reads_the_answers(self) -> None:
        if self.worker_gone:  # its end of file: the run is over
            self.lost_with_run += self._undelivered(self.held)
            self.held = []
            self.phase = OVER
            return
        if self.core.handoff:
            self.core.handoff = False  # _Remote.answers: it sends the rest
            self.delivered += [c for c in self.held if c not in self.delivered]
        assert all(c in self.delivered for c in self.held), "a batch collected that no one sends"
        self.held = []
        self.phase = DRIVING

    @precondition(lambda self: self.phase in (DRIVING, HOLDING))
    @rule(k=RARELY)
    def the_run_ends(self, k: int) -> None:
        """close(), on the driving thread once drive has returned (or raised)."""
        if k:
            return
        self.lost_with_run += self._undelivered(self.held)
        self.held = []
        self.core.release()
        self.phase = OVER

    def _undelivered(self, calls: list[int]) -> list[int]:
        return [c for c in calls if c not in self.delivered]

    def _collect(self) -> None:
        batch, error = self.core.taken()
        self.core.release()
        if error is not None:
            assert not self.core.handoff
            self.lost_with_run += self._undelivered(batch)
            self.phase = OVER
            return
        assert batch, "collected an empty batch"
        self.held = batch
        self.phase = HOLDING

    # -- what is always true, per field ---------------------------------------------

    @invariant()
    def state_follows_the_driving_thread(self) -> None:
        state = self.core.state
        if state is ARMED or state is SENT:
            assert self.phase == WAITING, f"{state} while the driving thread is {self.phase}"
        if self.phase != WAITING:
            assert state is IDLE

    @invariant()
    def batch_is_the_kicks_until_collected(self) -> None:
        core = self.core
        if core.batch:
            assert core.state is SENT
        if core.state is SENT:
            assert core.batch or core.error is not None

    @invariant()
    def error_comes_with_a_handoff(self) -> None:
        if self.core.error is not None:
            assert self.core.state is SENT and self.core.handoff

    @invariant()
    def handoff_means_the_driving_thread_acts(self) -> None:
        if self.core.handoff:
            assert (self.core.state is SENT and self.woken) or self.phase in (HOLDING, OVER), self.phase

    @invariant()
    def a_sent_batch_wakes_the_driving_thread(self) -> None:
        if self.core.state is SENT:
            assert self.woken or self.worker_speaks, "a batch taken, and nothing will wake the driving thread"

    @invariant()
    def every_call_once(self) -> None:
        """Every committed call is, exactly once: committed, taken by a kick,
        held by the driving thread, settled, or gone with a run that raised."""
        places = self.committed + self._undelivered(self.core.batch) + self._undelivered(self.held)
        places += self.delivered + self.lost_with_run
        assert sorted(places) == list(range(self.next_call)), places
        assert len(set(self.delivered)) == len(self.delivered), "a call settled twice"


RelayMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None, derandomize=True, database=None
)
test_relay_sends_each_batch_once_while_the_run_waits = RelayMachine.TestCase


# -- examples, for a reader ----------------------------------------------------------


def test_a_kick_before_the_driving_thread_waits_does_nothing():
    core = RelayCore()
    assert core.kicked(lambda _: pytest.fail("took"), lambda b: pytest.fail("wrote")) is False
    core.arm()
    written: list[Any] = []
    assert core.kicked(lambda _: [1, 2], lambda b: written.append(b) or True) is False
    assert written == [[1, 2]] and core.state is SENT
    assert core.kicked(lambda _: pytest.fail("took twice"), lambda b: pytest.fail("wrote")) is False
    assert core.taken() == ([1, 2], None) and core.state is IDLE


def test_the_deadline_and_a_kick_race_one_way_or_the_other():
    core = RelayCore()
    core.arm()
    assert core.disarm() is True, "the deadline first: nothing taken"
    assert core.kicked(lambda _: pytest.fail("took"), lambda b: True) is False
    core.arm()
    assert core.kicked(lambda _: [7], lambda b: False) is True and core.handoff, "a partial write: wake it"
    assert core.disarm() is False, "the kick first: the driving thread collects"
    assert core.taken() == ([7], None) and core.handoff, "it finishes the send"


def test_what_a_kick_raises_is_the_runs_to_raise():
    core = RelayCore()
    core.arm()
    boom = Boom()

    def take(_: None) -> list[Any]:
        raise boom

    assert core.kicked(take, lambda b: True) is True
    batch, error = core.taken()
    assert (batch, error, core.handoff) == ([], boom, False)
    error_after: Optional[BaseException] = core.error
    assert error_after is None


# -- the machine catches a relay that breaks a promise ---------------------------------------


class ActsUnarmed(RelayCore):
    """A kick that acts whatever the state."""

    def kicked(self, take: Take, write: Write) -> bool:
        state, self.state = self.state, ARMED
        wake = super().kicked(take, write)
        if self.state is ARMED:
            self.state = state
        return wake


class DisarmDrops(RelayCore):
    """A deadline that wins even after a kick took the batch."""

    def disarm(self) -> bool:
        self.state, self.batch = IDLE, []
        return True


class NoHandoff(RelayCore):
    """A partial write the driving thread is not told to finish."""

    def kicked(self, take: Take, write: Write) -> bool:
        wake = super().kicked(take, write)
        if self.error is None:
            self.handoff = False
        return wake


class NoWake(RelayCore):
    """A hand-off that does not wake the driving thread."""

    def kicked(self, take: Take, write: Write) -> bool:
        super().kicked(take, write)
        return False


class FailsIdle(RelayCore):
    """An interrupt kept for a run that has moved on."""

    def failed(self, exc: BaseException) -> None:
        self.error, self.handoff, self.state = exc, True, SENT


def _steps(machine: RelayMachine, steps: list[tuple[str, dict[str, Any]]]) -> None:
    """Run ``steps`` (rule, arguments) on ``machine``, checking every invariant after each."""
    checks = [
        machine.state_follows_the_driving_thread,
        machine.batch_is_the_kicks_until_collected,
        machine.error_comes_with_a_handoff,
        machine.handoff_means_the_driving_thread_acts,
        machine.a_sent_batch_wakes_the_driving_thread,
        machine.every_call_once,
    ]
    for name, kwargs in steps:
        getattr(machine, name)(**kwargs)
        for check in checks:
            check()


ARM = ("the_driving_thread_arms", {})
COMMIT = ("a_call_commits", {})
#: For each broken relay, a run that shows it: each passes on RelayCore.
SHOWS: dict[type[RelayCore], list[tuple[str, dict[str, Any]]]] = {
    ActsUnarmed: [COMMIT, ("a_thread_kicks", {"how": WHOLE})],
    DisarmDrops: [ARM, COMMIT, ("a_thread_kicks", {"how": PARTIAL}), ("its_deadline_or_a_cancel_comes", {"k": 0})],
    NoHandoff: [
        ARM,
        COMMIT,
        ("a_thread_kicks", {"how": PARTIAL}),
        ("its_wait_wakes", {}),
        ("the_driving_thread_reads_the_answers", {}),
    ],
    NoWake: [ARM, COMMIT, ("a_thread_kicks", {"how": REFUSED})],
    FailsIdle: [("a_kick_is_interrupted", {"k": 0})],
}


@pytest.mark.parametrize("broken", list(SHOWS), ids=lambda cls: cls.__name__)
def test_the_machine_catches_a_broken_relay(broken: type[RelayCore]) -> None:
    _steps(RelayMachine(), SHOWS[broken])  # the run is fine with the real core
    machine = RelayMachine()
    machine.core = broken()
    with pytest.raises(AssertionError):
        _steps(machine, SHOWS[broken])

"""The tool threads (nous_sched/scheduler/_tool_threads.py): order, the bound, warm reuse,
the LIFO hand-off and its races, retirement, cancel, shutdown, names, and a
fresh shared set after fork.

Every wait is on an event, a semaphore or a join, never a sleep. The races
are driven, not hoped for: a thread is held at the racy point (its wake
lock's wait, or its exit) while the test does the other side.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

from nous_sched.scheduler import _tool_threads
from nous_sched.scheduler._tool_threads import ToolThreads, retire_shared, shared

WAIT = 30.0


def watched(pool: ToolThreads) -> threading.Semaphore:
    """A semaphore released each time one of ``pool``'s threads goes idle."""
    pool._went_idle = threading.Semaphore(0)
    return pool._went_idle


class HeldWake:
    """A slot's wake lock that a test can hold at one point of a thread's wait.

    ``time_out_at``: the next timed wait "times out" (returns False without
    taking the lock) once ``go`` is set, after announcing it on ``held``: a
    timeout that lands as a signal is sent. ``hold_woken``: the next wait
    that takes the lock announces it and then waits for ``go`` before it
    returns: a thread signalled but not yet come for its task.
    """

    def __init__(self) -> None:
        self.real = threading.Lock()
        self.thread = threading.current_thread()  # a slot is made by its own thread
        self.held = threading.Event()
        self.go = threading.Event()
        self.time_out_at = False
        self.hold_woken = False

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self.time_out_at and timeout >= 0:
            self.time_out_at = False
            self.held.set()
            assert self.go.wait(WAIT)
            return False
        got = self.real.acquire(blocking, timeout)
        if got and self.hold_woken:
            self.hold_woken = False
            self.held.set()
            assert self.go.wait(WAIT)
        return got

    def release(self) -> None:
        self.real.release()


@pytest.fixture
def wakes(monkeypatch: pytest.MonkeyPatch) -> list[HeldWake]:
    """Every slot made from now on gets a :class:`HeldWake`; the list holds them, in order."""
    made: list[HeldWake] = []
    real_slot = _tool_threads._Slot

    def slot(serial: int) -> Any:
        one = real_slot(serial)
        one.wake = HeldWake()
        one.wake.acquire()
        made.append(one.wake)
        return one

    monkeypatch.setattr(_tool_threads, "_Slot", slot)
    return made


def test_tasks_run_in_submission_order_on_named_threads_up_to_the_ceiling():
    pool = ToolThreads(2, "test-tt")
    gate = threading.Event()
    started = threading.Semaphore(0)
    ran: list = []
    lock = threading.Lock()

    def task(i: int) -> None:
        with lock:
            ran.append((i, threading.current_thread().name))
        started.release()
        gate.wait(WAIT)

    try:
        for i in range(5):
            pool.submit(task, i)
        assert started.acquire(timeout=WAIT) and started.acquire(timeout=WAIT)
        assert sorted(i for i, _ in ran) == [0, 1]  # two threads: the other three wait, in order
        assert {name for _, name in ran} == {"test-tt-0", "test-tt-1"}
        assert pool.counts() == (2, 0)
        gate.set()
        for _ in range(3):
            assert started.acquire(timeout=WAIT)
        assert [i for i, _ in ran[2:]] == [2, 3, 4], "the backlog runs in submission order"
        assert pool.counts()[0] == 2
    finally:
        gate.set()
        threads = pool.threads()
        pool.shutdown()
    assert threads and not any(t.is_alive() for t in threads)


def test_warm_threads_are_reused_and_no_thread_is_started_for_them():
    pool = ToolThreads(8, "test-tt-warm")
    idle = watched(pool)
    barrier = threading.Barrier(4, timeout=WAIT)
    try:
        for _ in range(4):
            pool.submit(barrier.wait)  # four at once: four threads
        for _ in range(4):
            assert idle.acquire(timeout=WAIT)
        first = set(pool.threads())
        assert len(first) == 4 and pool.counts() == (4, 4)
        for _ in range(4):
            pool.submit(barrier.wait)
        for _ in range(4):
            assert idle.acquire(timeout=WAIT)
        assert set(pool.threads()) == first, "the second fan-out found its threads warm"
    finally:
        pool.shutdown()


def test_sequential_tasks_reuse_the_most_recently_idled_thread_while_the_others_stay_parked():
    pool = ToolThreads(8, "test-tt-lifo")
    idle = watched(pool)
    barrier = threading.Barrier(4, timeout=WAIT)
    ran: list = []
    try:
        for _ in range(4):
            pool.submit(barrier.wait)  # four at once: four threads, then all four idle
        for _ in range(4):
            assert idle.acquire(timeout=WAIT)
        first = set(pool.threads())
        assert pool.counts() == (4, 4)
        for _ in range(20):  # each waited (done, and its thread idle again) before the next
            done = threading.Event()
            pool.submit(lambda: (ran.append(threading.current_thread()), done.set()))
            assert done.wait(WAIT) and idle.acquire(timeout=WAIT)
            assert pool.counts() == (4, 4)
        assert len(set(ran)) == 1, "one hot thread took every sequential task"
        assert set(pool.threads()) == first and ran[0] in first, "no thread was started for them"
    finally:
        pool.shutdown()


def test_under_a_trickle_the_threads_it_does_not_need_retire():
    pool = ToolThreads(8, "test-tt-trickle", idle_seconds=0.3)
    idle = watched(pool)
    barrier = threading.Barrier(4, timeout=WAIT)
    try:
        for _ in range(4):
            pool.submit(barrier.wait)
        for _ in range(4):
            assert idle.acquire(timeout=WAIT)
        first = pool.threads()
        deadline = time.monotonic() + WAIT  # a bound on the wait, not a timing
        # One task at a time, without pause: the top of the idle stack takes
        # each, so the three below it see no task and retire (a shared queue
        # would wake them in turn and keep all four alive).
        while sum(t.is_alive() for t in first) > 1 and time.monotonic() < deadline:
            done = threading.Event()
            pool.submit(done.set)
            assert done.wait(WAIT)
        assert sum(t.is_alive() for t in first) <= 1
    finally:
        pool.shutdown()


def test_a_task_submitted_at_the_bound_while_the_only_thread_is_exiting_runs():
    # The lost task of the first LIFO hand-off (aed349f): a thread that had
    # timed out and left the idle stack still counted against the bound until
    # it exited, so a task submitted then went to the backlog, which only a
    # thread finishing a task looks at, and the exiting thread did not: the
    # task never ran. Here the only thread (bound 1, idle_seconds 0: it times
    # out as soon as it idles) is held after it decided to exit.
    pool = ToolThreads(1, "test-tt-exiting", idle_seconds=0)
    exiting = threading.Event()
    go = threading.Event()
    first: list[threading.Thread] = []

    def on_leave() -> None:
        if threading.current_thread() is first[0]:
            exiting.set()
            assert go.wait(WAIT)

    pool._on_leave = on_leave
    try:
        pool.submit(lambda: first.append(threading.current_thread()))
        assert exiting.wait(WAIT), "the thread idled, timed out at once and is exiting"
        assert pool.counts() == (0, 0), "an exiting thread no longer counts against the bound"
        done = threading.Event()
        pool.submit(done.set)  # at the bound had the exiting thread still counted
        assert done.wait(WAIT), "the task ran (on a new thread) while the old one was still exiting"
        assert first[0].is_alive()
    finally:
        go.set()
        pool.shutdown()
    first[0].join(WAIT)
    assert not first[0].is_alive()


def test_a_task_submitted_at_the_bound_just_after_a_retire_runs():
    # The retired idle thread exits; until it has, it must not count against
    # the bound, or the task waits for it (the FIFO queue of afa3b1c lost it
    # so: its retire marker was taken, the task after it never).
    pool = ToolThreads(1, "test-tt-retired-bound")
    idle = watched(pool)
    try:
        pool.submit(lambda: None)
        assert idle.acquire(timeout=WAIT)
        [retired] = pool.retire_idle()
        assert pool.counts() == (0, 0), "uncounted at once, before it has exited"
        done = threading.Event()
        pool.submit(done.set)
        assert done.wait(WAIT)
        retired.join(WAIT)
        assert not retired.is_alive()
    finally:
        pool.shutdown()


def test_a_wait_that_times_out_as_its_thread_is_handed_a_task_takes_the_task(wakes: list[HeldWake]):
    pool = ToolThreads(4, "test-tt-timeout-race")
    idle = watched(pool)
    try:
        # Its first task arms its thread's wake: the wait it enters next, on
        # the idle stack, "times out" once the test lets it, after the signal.
        pool.submit(lambda: setattr(wakes[0], "time_out_at", True))
        [wake] = wakes
        assert idle.acquire(timeout=WAIT) and wake.held.wait(WAIT)
        [thread] = pool.threads()
        assert pool.counts() == (1, 1)
        done = threading.Event()
        ran_on: list = []
        pool.submit(lambda: (ran_on.append(threading.current_thread()), done.set()))  # signals it
        assert pool.counts() == (1, 0), "the hand-off took it off the idle stack"
        wake.go.set()  # its wait returns as timed out, after the signal
        assert done.wait(WAIT)
        assert idle.acquire(timeout=WAIT)
        assert ran_on == [thread], "the thread whose wait timed out took its task"
        assert pool.threads() == [thread] and pool.counts() == (1, 1), "none was started, none left"
        assert wake.real.locked(), "the signal was taken: none is left to wake the next wait early"
        again = threading.Event()
        pool.submit(again.set)
        assert again.wait(WAIT) and idle.acquire(timeout=WAIT)
        assert pool.counts() == (1, 1) and pool.threads() == [thread]
    finally:
        for wake in wakes:
            wake.go.set()
        pool.shutdown()


def test_a_finishing_thread_takes_the_task_a_woken_thread_has_not_come_for_yet(wakes: list[HeldWake]):
    pool = ToolThreads(4, "test-tt-steal")
    idle = watched(pool)
    barrier = threading.Barrier(2, timeout=WAIT)
    try:
        for _ in range(2):
            pool.submit(barrier.wait)
        for _ in range(2):
            assert idle.acquire(timeout=WAIT)
        finish = threading.Event()
        busy_started = threading.Event()
        busy: list = []

        def hold() -> None:
            busy.append(threading.current_thread())
            busy_started.set()
            assert finish.wait(WAIT)

        pool.submit(hold)
        assert busy_started.wait(WAIT)
        [parked] = [w for w in wakes if w.thread is not busy[0]]
        parked.hold_woken = True
        ran: list = []
        pool.submit(lambda: ran.append(threading.current_thread()))  # wakes the parked thread
        assert parked.held.wait(WAIT), "the parked thread was signalled and holds before it comes for the task"
        assert pool.counts() == (2, 0)
        finish.set()  # the busy thread finishes first: it takes the task without sleeping
        assert idle.acquire(timeout=WAIT)
        assert ran == busy, "the finishing thread ran it"
        parked.go.set()  # the woken thread comes, finds nothing, and parks again
        assert idle.acquire(timeout=WAIT)
        assert pool.counts() == (2, 2) and ran == busy, "it ran once"
        both = threading.Barrier(2, timeout=WAIT)
        for _ in range(2):
            pool.submit(both.wait)  # both threads take one: neither was lost to the race
        for _ in range(2):
            assert idle.acquire(timeout=WAIT)
        assert pool.counts() == (2, 2) and len(pool.threads()) == 2
    finally:
        for wake in wakes:
            wake.go.set()
        pool.shutdown()


def test_a_retire_while_a_thread_is_woken_for_a_task_runs_the_task_then_retires_it(wakes: list[HeldWake]):
    pool = ToolThreads(4, "test-tt-retire-race")
    idle = watched(pool)
    try:
        pool.submit(lambda: None)
        assert idle.acquire(timeout=WAIT)
        [wake] = wakes
        [thread] = pool.threads()
        wake.hold_woken = True
        done = threading.Event()
        pool.submit(done.set)
        assert wake.held.wait(WAIT)
        assert pool.retire_idle() == [thread]  # not idle: it is on its way to the task
        wake.go.set()
        assert done.wait(WAIT)
        thread.join(WAIT)
        assert not thread.is_alive() and pool.counts() == (0, 0)
    finally:
        for wake in wakes:
            wake.go.set()
        pool.shutdown()


def test_a_burst_wakes_every_parked_thread():
    pool = ToolThreads(16, "test-tt-burst")
    idle = watched(pool)
    try:
        for width in (8, 3, 8, 1, 8):
            barrier = threading.Barrier(width, timeout=WAIT)
            for _ in range(width):
                pool.submit(barrier.wait)  # every one must run at once: every wake-up of the chain came
            for _ in range(width):
                assert idle.acquire(timeout=WAIT)
            assert pool.counts() == (8, 8), "the bursts after the first found their threads warm"
    finally:
        pool.shutdown()


def test_a_hung_task_does_not_starve_others_until_the_bound_and_there_they_wait_in_order():
    pool = ToolThreads(3, "test-tt-bound")
    hang = threading.Event()
    hung = threading.Semaphore(0)
    done: list = []

    def stuck() -> None:
        hung.release()
        hang.wait(WAIT)

    try:
        pool.submit(stuck)
        pool.submit(stuck)
        assert hung.acquire(timeout=WAIT) and hung.acquire(timeout=WAIT)
        ran = threading.Event()
        pool.submit(ran.set)  # the set grows past the two hung threads
        assert ran.wait(WAIT)
        pool.submit(stuck)  # now all three are hung: the bound
        assert hung.acquire(timeout=WAIT)
        assert pool.counts() == (3, 0)
        second = threading.Event()
        waiting = pool.submit(done.append, "waited")
        pool.submit(second.set)
        cancelled = pool.submit(done.append, "cancelled")
        assert cancelled.cancel() is True
        assert pool.counts() == (3, 0), "no thread past the bound"
        assert done == [] and not second.is_set()
        hang.set()  # the threads come free: the backlog runs
        assert second.wait(WAIT)
    finally:
        hang.set()
        pool.shutdown()  # joins: every task that was to run has run
    assert done == ["waited"] and waiting.cancel() is False


def test_an_idle_thread_retires_after_idle_seconds():
    pool = ToolThreads(2, "test-tt-retire", idle_seconds=0.0)  # the clock: no idle time allowed at all
    ran: list = []
    first, second = threading.Event(), threading.Event()
    pool.submit(lambda: (ran.append(threading.current_thread()), first.set()))
    try:
        assert first.wait(WAIT)
        ran[0].join(WAIT)
        assert not ran[0].is_alive() and pool.counts() == (0, 0)
        pool.submit(lambda: (ran.append(threading.current_thread()), second.set()))  # a retired set starts afresh
        assert second.wait(WAIT)
        assert ran[1].name == "test-tt-retire-1"
    finally:
        pool.shutdown()


def test_retire_idle_ends_idle_threads_at_once_and_busy_ones_when_done():
    pool = ToolThreads(4, "test-tt-retire-now")
    idle = watched(pool)
    gate = threading.Event()
    entered = threading.Event()
    running: list = []

    def busy() -> None:
        running.append(threading.current_thread())
        entered.set()
        gate.wait(WAIT)

    try:
        pool.submit(lambda: None)
        assert idle.acquire(timeout=WAIT)
        pool.submit(busy)
        assert entered.wait(WAIT)
        pool.submit(lambda: None)  # the first thread is busy: a second one
        assert idle.acquire(timeout=WAIT)
        retired = pool.retire_idle()
        assert len(retired) == 2
        [idle_one] = [t for t in retired if t is not running[0]]
        idle_one.join(WAIT)
        assert not idle_one.is_alive(), "the idle one exits at once"
        assert running[0].is_alive(), "the busy one finishes its task first"
        gate.set()
        running[0].join(WAIT)
        assert not running[0].is_alive() and pool.counts() == (0, 0)
    finally:
        gate.set()
        pool.shutdown()


def test_cancel_takes_back_a_task_not_yet_started_and_only_that():
    pool = ToolThreads(1, "test-tt-cancel")
    gate = threading.Event()
    entered = threading.Event()
    ran: list = []

    def first() -> None:
        entered.set()
        gate.wait(WAIT)

    try:
        running = pool.submit(first)
        assert entered.wait(WAIT)
        queued = pool.submit(ran.append, "queued")
        after = pool.submit(ran.append, "after")
        assert running.cancel() is False  # started already
        assert queued.cancel() is True and queued.cancel() is False
        gate.set()
    finally:
        gate.set()
        pool.shutdown()
    assert ran == ["after"]
    assert after.cancel() is False


def test_a_task_that_raises_does_not_stop_its_thread():
    pool = ToolThreads(1, "test-tt-raise")
    done = threading.Event()

    def boom() -> None:
        raise SystemExit("a tool that exits")

    try:
        pool.submit(boom)
        pool.submit(done.set)
        assert done.wait(WAIT)
    finally:
        pool.shutdown()


def test_shutdown_drops_queued_tasks_when_asked_and_refuses_new_ones():
    pool = ToolThreads(1, "test-tt-shutdown")
    gate = threading.Event()
    entered = threading.Event()
    ran: list = []

    def first() -> None:
        entered.set()
        gate.wait(WAIT)

    pool.submit(first)
    assert entered.wait(WAIT)
    threads = pool.threads()
    pool.submit(ran.append, "dropped")
    pool.shutdown(wait=False, cancel_futures=True)  # while the only thread is still busy
    gate.set()
    for thread in threads:
        thread.join(WAIT)
    assert ran == [] and not any(t.is_alive() for t in threads)
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(ran.append, "late")


def test_the_shared_set_is_one_per_process_bounded_and_named():
    assert shared() is shared()
    assert shared().max_threads == _tool_threads.HARD_CAP
    name = []
    ran = threading.Event()
    shared().submit(lambda: (name.append(threading.current_thread().name), ran.set()))
    assert ran.wait(WAIT)
    assert name[0].startswith("nous-sched-tool-") and name[0].rsplit("-", 1)[1].isdigit()
    assert name[0] not in {t.name for t in retire_shared()}, "its thread is not left busy"


FORK_SCRIPT = textwrap.dedent(
    """
    import os, threading
    from nous_sched.scheduler._tool_threads import shared

    ran = threading.Event()
    shared().submit(ran.set)
    assert ran.wait(30)
    parent = shared()
    pid = os.fork()
    if pid == 0:
        try:
            child = shared()
            assert child is not parent and child.counts() == (0, 0), child.counts()
            done = threading.Event()
            child.submit(done.set)
            os._exit(0 if done.wait(30) else 3)
        except BaseException:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status))
    """
)


def test_a_forked_child_gets_a_fresh_shared_set():
    done = subprocess.run([sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


def test_a_tasks_then_is_called_once_its_thread_has_parked_or_taken_the_next_task():
    # A task may return a Then: its thread calls it after its bookkeeping (on
    # the idle stack, or holding its next task), just before it sleeps, so the
    # thread it wakes need not wait for that bookkeeping. One that raises is ignored.
    pool = ToolThreads(max_threads=1, idle_seconds=WAIT)
    idle = watched(pool)
    seen: list[tuple[str, int]] = []
    told = threading.Event()

    class Report(_tool_threads.Then):
        __slots__ = ("label",)

        def __call__(self) -> None:
            seen.append((self.label, pool.counts()[1]))  # (which, threads idle meanwhile)
            if self.label == "second":
                told.set()
                raise RuntimeError("a report that raises")

    def task(label: str, gate: threading.Event | None = None) -> Report:
        if gate is not None:
            assert gate.wait(WAIT)
        report = Report()
        report.label = label
        return report

    gate = threading.Event()
    pool.submit(task, "first", gate)
    pool.submit(task, "second")  # queued behind the first: its thread takes it before the first's Then
    gate.set()
    assert told.wait(WAIT) and idle.acquire(timeout=WAIT)
    pool.submit(lambda: "not a Then")  # any other return value is ignored, as before
    assert idle.acquire(timeout=WAIT)
    assert seen == [("first", 0), ("second", 1)]
    assert pool.counts() == (1, 1)
    pool.shutdown()


def test_a_parked_thread_holds_nothing_of_the_tasks_it_ran():
    # A thread parks for up to idle_seconds: what its last task was given,
    # returned or raised (a call's arguments, a tool's result) must not live on
    # in it meanwhile. Freed by reference counting: no collection is asked for.
    import weakref

    class Held:
        pass

    pool = ToolThreads(max_threads=1, idle_seconds=WAIT)
    idle = watched(pool)

    def returns(given: Held) -> Held:
        return Held()

    def raises(given: Held) -> None:
        raise ValueError(given)

    try:
        for task in (returns, raises, lambda given: None):
            given = Held()
            seen = weakref.ref(given)
            got: list[weakref.ref[Held]] = []

            def watched_task(given: Held, task: Any = task, got: list[Any] = got) -> Any:
                value = task(given)
                if value is not None:
                    got.append(weakref.ref(value))
                return value

            pool.submit(watched_task, given)
            del given
            assert idle.acquire(timeout=WAIT)
            assert seen() is None, task
            assert all(ref() is None for ref in got), task
    finally:
        pool.shutdown()

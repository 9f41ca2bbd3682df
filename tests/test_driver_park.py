"""A driver with nothing to do sleeps parked (nous_sched.scheduler._driver_threads.PARK),
and stop() takes it back without waking it: the promises of the module docstring's
"Parked between messages", on private sets, then through the Scheduler.

Every wait is on an event, a lock or a join, bounded by WAIT; "the driver has
parked" is waited for as a state, never as a time.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest
from drivers import IDLE, assert_released

from nous_sched import Scheduler, Tool
from nous_sched.scheduler import _driver_threads
from nous_sched.scheduler._driver_threads import PARK, DriverThreads

WAIT = 10.0


def held() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


def done_within(lock: threading.Lock) -> bool:
    if lock.acquire(timeout=WAIT):
        lock.release()
        return True
    return False


def until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


class Parking:
    """An fn that parks after each call until told to end; where and how often it ran."""

    def __init__(self, calls_to_park: int = 10**9) -> None:
        self.ran_on: list[threading.Thread] = []
        self.parked = threading.Semaphore(0)
        self.calls_to_park = calls_to_park

    def __call__(self):
        self.ran_on.append(threading.current_thread())
        if len(self.ran_on) <= self.calls_to_park:
            self.parked.release()
            return PARK
        return None


def test_a_parked_fn_keeps_its_thread_and_name_and_runs_again_when_resumed(make_set):
    threads = make_set()
    fn, done = Parking(calls_to_park=2), held()
    driving = threads.drive(fn, "nous-sched-driver-p", done)
    driving()
    assert fn.parked.acquire(timeout=WAIT)
    assert driving.thread.name == "nous-sched-driver-p", "a parked thread is still its fn's"
    assert not done.acquire(blocking=False), "a parked fn is not over"
    assert threads.counts() == (1, 0), "a parked thread is not idle"
    driving.resume()
    assert fn.parked.acquire(timeout=WAIT)
    driving.resume()
    assert done_within(done)
    assert fn.ran_on == [driving.thread] * 3, "every call on the one thread"
    assert driving.thread.name.startswith(IDLE)


def test_take_back_puts_a_parked_thread_back_idle_unwoken_and_releases_done(make_set):
    threads = make_set()

    class Owner:
        def __init__(self) -> None:
            self.fn = Parking()

        def run(self):
            return self.fn()

    owner, done = Owner(), held()
    fn = owner.fn
    gone = weakref.ref(owner)
    driving = threads.drive(owner.run, "nous-sched-driver-t", done)
    driving()
    assert fn.parked.acquire(timeout=WAIT)
    del owner
    threads.take_back(driving)
    assert done.acquire(blocking=False), "done is released by take_back itself"
    assert driving.thread.name.startswith(IDLE) and threads.counts() == (1, 1)
    gc.collect()
    assert gone() is None, "a taken-back driver keeps no reference to what it drove"
    # It was not woken: it runs the next job, and only that, once that job's wake comes.
    ran, second = threading.Event(), held()
    again = threads.drive(ran.set, "next", second)
    assert again.thread is driving.thread
    assert not ran.wait(0.05), "asleep until woken"
    again()
    assert ran.wait(WAIT) and done_within(second)
    assert len(fn.ran_on) == 1, "the taken-back fn never ran again"


def test_take_back_of_a_warm_thread_never_woken(make_set):
    threads = make_set()
    first = held()
    threads.drive(lambda: None, "first", first)()
    assert done_within(first)
    ran, done = threading.Event(), held()
    driving = threads.drive(ran.set, "never", done)
    assert driving.warm
    threads.take_back(driving)
    assert done.acquire(blocking=False)
    assert driving.thread.name.startswith(IDLE) and threads.counts() == (1, 1)
    assert not ran.wait(0.05), "its fn never runs"


def test_a_taken_back_thread_still_retires_after_idle_seconds(make_set):
    threads = make_set(idle_seconds=0.2)
    fn, done = Parking(), held()
    driving = threads.drive(fn, "nous-sched-driver-r", done)
    driving()
    assert fn.parked.acquire(timeout=WAIT)
    time.sleep(0.3)  # parked longer than idle_seconds: a parked thread never retires
    assert driving.thread.is_alive()
    threads.take_back(driving)
    driving.thread.join(WAIT)
    assert not driving.thread.is_alive() and threads.counts() == (0, 0)


def test_a_taken_back_thread_beyond_max_idle_exits(make_set):
    threads = make_set(max_idle=1)
    idle = held()
    threads.drive(lambda: None, "idle", idle)()
    assert done_within(idle)
    fn, done = Parking(), held()
    driving = threads.drive(fn, "nous-sched-driver-m", done)
    driving()
    assert fn.parked.acquire(timeout=WAIT)
    other, second = held(), held()  # a second thread idle meanwhile: the set is full
    threads.drive(lambda: None, "other", second)()
    assert done_within(second)
    threads.take_back(driving)
    assert done.acquire(blocking=False)
    driving.thread.join(WAIT)
    assert not driving.thread.is_alive() and threads.counts() == (1, 1)
    del other


def test_retire_idle_ends_a_parked_thread_when_taken_back(make_set):
    threads = make_set()
    fn, done = Parking(), held()
    driving = threads.drive(fn, "nous-sched-driver-x", done)
    driving()
    assert fn.parked.acquire(timeout=WAIT)
    assert driving.thread in threads.retire_idle()
    assert driving.thread.is_alive(), "a parked thread is driving: it ends when its fn is over"
    threads.take_back(driving)
    driving.thread.join(WAIT)
    assert not driving.thread.is_alive() and threads.counts() == (0, 0)


# -- through the Scheduler ------------------------------------------------------------


@pytest.fixture
def private(make_set, monkeypatch) -> DriverThreads:
    threads = make_set()
    monkeypatch.setattr(_driver_threads._SHARED, "_value", threads)
    return threads


def last_act_on(s: Scheduler) -> list[threading.Thread]:
    """The threads the driver's last act (``_wind_down``) runs on, once it has."""
    real = s._wind_down
    on: list[threading.Thread] = []

    def wind_down():
        on.append(threading.current_thread())
        real()

    s._wind_down = wind_down
    return on


def test_stop_of_an_idle_scheduler_wakes_no_driver(private, monkeypatch):
    # The driver parked once its call committed (its lane idle, its queue
    # empty): stop() does its last act on the calling thread, and its thread
    # goes back idle asleep. (Before: stop() woke the driver with STOP and
    # waited for it: two hand-offs on the run's path.)
    loops = []
    real_loop = Scheduler._drive_loop
    monkeypatch.setattr(Scheduler, "_drive_loop", lambda self: (loops.append(1), real_loop(self))[1])
    s = Scheduler(timeout=30)
    assert s.call(Tool("t", lambda a: 1), {}).value == 1
    driver = (s._driver, s._name)
    until(lambda: s._parked, "the driver parks once it has nothing to do")
    entered = len(loops)
    on = last_act_on(s)
    s.stop()
    assert on == [threading.current_thread()], "the driver's last act, done by stop() itself"
    assert len(loops) == entered, "the driver was not woken"
    assert s._wait_driver(0)
    assert_released([driver])
    assert s.lane_state() is not None and s.lane_state().stopped
    assert s.call(Tool("t", lambda a: 1), {}).error.message == "code run is over; scheduler is gone"


def test_stop_of_a_scheduler_that_never_had_a_message_wakes_no_driver(private, monkeypatch):
    warm = held()
    private.drive(lambda: None, "warm", warm)()  # a thread idle: the scheduler's driver is warm
    assert done_within(warm)
    loops = []
    real_loop = Scheduler._drive_loop
    monkeypatch.setattr(Scheduler, "_drive_loop", lambda self: (loops.append(1), real_loop(self))[1])
    s = Scheduler(timeout=30)
    driver = (s._driver, s._name)
    on = last_act_on(s)
    s.stop()
    assert on == [threading.current_thread()]
    assert loops == [], "its driver never ran"
    assert_released([driver])
    assert private.counts() == (1, 1)


def test_stop_of_a_busy_scheduler_is_still_the_drivers(private):
    # A call still running: the lane is not idle, the driver does not park,
    # and stop() hands it STOP as before (the call is abandoned by the driver).
    go = threading.Event()
    s = Scheduler(timeout=30)
    ticket = s.submit(Tool("slow", lambda a: go.wait(WAIT)), {})
    until(lambda: s.lane_state().inflight == (0,), "the call runs")
    driver = s._driver
    on = last_act_on(s)
    s.stop()
    go.set()
    assert on == [driver], "the driver's own last act"
    assert s.wait(ticket).error.message == "code run is over; tool call abandoned"


def test_a_parked_driver_resumes_for_each_message(private):
    s = Scheduler(timeout=30)
    tool = Tool("t", lambda a: a["i"])
    try:
        for i in range(50):
            assert s.call(tool, {"i": i}).value == i
            until(lambda: s._parked, "parked between calls")
        assert s.lane_state().submitted == 50, "a query resumes it too"
    finally:
        s.stop()
    assert [r.seq for r in s.trail()] == list(range(50))

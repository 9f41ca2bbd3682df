"""The warm driver threads (nous_sched.scheduler._driver_threads): one promise of the
module docstring per test, on private sets, then through the Scheduler.

Every wait is on an event, a lock or a join, bounded by WAIT.
"""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import textwrap
import threading
import time
import weakref

from drivers import IDLE, assert_released

from nous_sched import Scheduler, Tool
from nous_sched.scheduler import _driver_threads
from nous_sched.scheduler._driver_threads import DriverThreads

WAIT = 10.0


def held() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


def wake(threads: DriverThreads, fn, name: str, done: threading.Lock) -> None:
    """``drive`` and its wake at once."""
    threads.drive(fn, name, done)()


def done_within(lock: threading.Lock) -> bool:
    if lock.acquire(timeout=WAIT):
        lock.release()
        return True
    return False


def test_fn_runs_on_a_thread_named_for_it_from_the_moment_drive_returns(make_set):
    threads = make_set()
    go, done = threading.Event(), held()
    seen = []

    def fn():
        seen.append(threading.current_thread())
        go.wait(WAIT)

    wake(threads, fn, "nous-sched-driver-x", done)
    named = [t for t in threading.enumerate() if t.name == "nous-sched-driver-x"]
    assert len(named) == 1, "named before drive() returned"
    go.set()
    assert done_within(done)
    assert seen == named
    assert named[0].name.startswith(IDLE), "named idle once fn is over"


def test_each_fn_has_a_thread_of_its_own_while_it_runs(make_set):
    threads = make_set()
    n = 4
    barrier = threading.Barrier(n, timeout=WAIT)  # every fn runs at once, or none gets past it
    seen = []
    dones = [held() for _ in range(n)]
    for i in range(n):
        wake(threads, lambda: seen.append((threading.current_thread(), barrier.wait())), f"d-{i}", dones[i])
    assert all(done_within(d) for d in dones)
    assert len({t for t, _ in seen}) == n
    assert threads.counts() == (n, n)


def test_a_finished_thread_is_reused_warm_and_no_thread_is_started(make_set, monkeypatch):
    threads = make_set()
    first = held()
    wake(threads, lambda: None, "a", first)
    assert done_within(first) and threads.counts() == (1, 1)
    (warm,) = threads.threads()
    started = []
    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda t: (started.append(t), real_start(t)))
    ran_on, second = [], held()
    wake(threads, lambda: ran_on.append(threading.current_thread().name), "b", second)
    assert done_within(second)
    assert started == [] and ran_on == ["b"] and threads.threads() == [warm]


def test_a_warm_thread_runs_fn_only_once_woken(make_set):
    threads = make_set()
    first = held()
    wake(threads, lambda: None, "first", first)
    assert done_within(first)
    (warm,) = threads.threads()
    ran, done = threading.Event(), held()
    woken = threads.drive(ran.set, "second", done)
    assert warm.name == "second", "named for its fn from the moment drive() returns"
    assert not ran.wait(0.05), "asleep until woken"
    woken()
    assert ran.wait(WAIT) and done_within(done)


def test_done_is_released_after_the_thread_let_go_of_fn(make_set):
    threads = make_set()

    class Owner:
        def run(self) -> None:
            pass

    owner, done = Owner(), held()
    gone = weakref.ref(owner)
    wake(threads, owner.run, "owner", done)
    del owner
    assert done_within(done)
    gc.collect()
    assert gone() is None, "an idle driver keeps no reference to what it drove"


def test_at_most_max_idle_threads_stay_the_others_exit(make_set):
    threads = make_set(max_idle=2)
    n = 5
    barrier = threading.Barrier(n, timeout=WAIT)
    dones = [held() for _ in range(n)]
    every = []
    for i in range(n):
        wake(threads, lambda: every.append((threading.current_thread(), barrier.wait())[0]), f"d-{i}", dones[i])
    assert all(done_within(d) for d in dones)
    assert len(every) == n
    assert threads.counts() == (2, 2)
    leaving = set(every) - set(threads.threads())
    assert len(leaving) == n - 2
    for thread in leaving:
        thread.join(WAIT)
        assert not thread.is_alive()


def test_an_idle_thread_exits_after_idle_seconds(make_set):
    threads = make_set(idle_seconds=0.05)
    done = held()
    wake(threads, lambda: None, "brief", done)
    (thread,) = threads.threads()
    assert done_within(done)
    thread.join(WAIT)
    assert not thread.is_alive() and threads.counts() == (0, 0), "no thread outlives its idle timeout"


def test_the_most_recently_idle_thread_is_reused_so_a_bursts_surplus_retires_under_a_trickle(make_set):
    threads = make_set(idle_seconds=0.3)
    barrier = threading.Barrier(2, timeout=WAIT)
    a, b = held(), held()
    wake(threads, barrier.wait, "a", a)
    wake(threads, barrier.wait, "b", b)
    assert done_within(a) and done_within(b)
    assert threads._went_idle.acquire(timeout=WAIT) and threads._went_idle.acquire(timeout=WAIT)
    warm = threads._waiting[-1].thread  # the one a drive takes next
    other = threads._waiting[0].thread
    deadline = time.monotonic() + WAIT
    while other.is_alive() and time.monotonic() < deadline:  # a trickle: one scheduler at a time
        done, ran_on = held(), []
        wake(threads, lambda: ran_on.append(threading.current_thread()), "trickle", done)
        assert done_within(done) and ran_on == [warm]
        other.join(0.01)
    assert not other.is_alive(), "the thread left idle at the bottom of the stack retired"
    assert threads.threads() == [warm]


def test_retire_idle_ends_idle_threads_now_and_driving_ones_when_done(make_set):
    threads = make_set()
    go = threading.Event()
    idle, driving = held(), held()
    wake(threads, lambda: None, "idle", idle)
    assert done_within(idle)
    wake(threads, lambda: go.wait(WAIT), "long", driving)  # takes the idle thread
    spare = held()
    wake(threads, lambda: None, "spare", spare)  # a second thread, idle once done
    assert done_within(spare)
    retired = threads.retire_idle()
    assert len(retired) == 2
    (still,) = [t for t in retired if t.name == "long"]
    for thread in retired:
        if thread is not still:
            thread.join(WAIT)
            assert not thread.is_alive()
    assert still.is_alive(), "a driving thread finishes its fn"
    go.set()
    assert done_within(driving)
    still.join(WAIT)
    assert not still.is_alive() and threads.counts() == (0, 0)


def test_retire_shared_names_the_threads_still_driving():
    go = threading.Event()
    s = Scheduler(timeout=30)
    stuck = Tool("stuck", lambda a: "ran", concurrency_safe=lambda a: go.wait(WAIT))
    try:
        s.submit(stuck, {})
        busy = _driver_threads.retire_shared(0.05)
        assert s._name in {t.name for t in busy}, "the driver stuck in a predicate is reported"
    finally:
        go.set()
        s.stop(timeout=WAIT)
    assert s._wait_driver(WAIT)
    assert _driver_threads.retire_shared() == []


class Boom(BaseException):
    pass


def uncaught(monkeypatch) -> tuple[list, threading.Event]:
    """What ``threading.excepthook`` is handed from now on, (exception type, thread name); set at the first."""
    hooked = threading.Event()
    caught: list = []

    def hook(args):
        caught.append((args.exc_type, args.thread.name))
        hooked.set()

    monkeypatch.setattr(threading, "excepthook", hook)
    return caught, hooked


def test_an_fn_that_raises_ends_its_thread_as_a_thread_of_its_own_would(make_set, monkeypatch):
    threads = make_set()
    caught, hooked = uncaught(monkeypatch)
    done = held()
    ran_on = []

    def fn():
        ran_on.append(threading.current_thread())
        raise Boom("driver bug")

    wake(threads, fn, "nous-sched-driver-boom", done)
    assert done_within(done)
    (thread,) = ran_on
    assert hooked.wait(WAIT)
    assert caught == [(Boom, "nous-sched-driver-boom")]
    thread.join(WAIT)
    assert not thread.is_alive() and threads.counts() == (0, 0)


# -- through the Scheduler ------------------------------------------------------------


def test_a_crashed_driver_releases_every_caller_and_is_reported_under_the_schedulers_name(
    monkeypatch, caplog, make_set
):
    caplog.set_level(logging.CRITICAL, logger="nous_sched")
    threads = make_set()
    monkeypatch.setattr(_driver_threads._SHARED, "_value", threads)
    caught, hooked = uncaught(monkeypatch)
    real_handle = Scheduler._handle

    def handle(self, msg):
        if type(msg).__name__ == "Call":
            raise Boom("a bug in the driver")
        return real_handle(self, msg)

    monkeypatch.setattr(Scheduler, "_handle", handle)
    s = Scheduler(timeout=30)
    outcome = s.call(Tool("t", lambda a: 1), {})
    assert outcome.error.message == "code run is over; scheduler is gone"
    assert hooked.wait(WAIT)
    assert caught == [(Boom, s._name)]
    assert any(r.getMessage() == f"{s._name} crashed; releasing every caller" for r in caplog.records)
    assert s._wait_driver(0)
    s.stop()
    for thread in threads.threads():
        thread.join(WAIT)
    assert threads.counts() == (0, 0), "the crashed thread left the set"


def test_a_schedulers_driver_goes_back_idle_and_drives_the_next(make_set, monkeypatch):
    threads = make_set()
    monkeypatch.setattr(_driver_threads._SHARED, "_value", threads)
    names = []
    for _ in range(3):
        with Scheduler(timeout=30, observer=lambda r, p: names.append(threading.current_thread().name)) as s:
            assert s.call(Tool("t", lambda a: 1), {}).value == 1
            driver = (s._driver, s._name)
        assert s._wait_driver(0)
        assert_released([driver])
        assert threads._went_idle.acquire(timeout=WAIT)
        assert threads.counts() == (1, 1)
    assert len(set(names)) == 3, "each scheduler's name, on one warm thread"


def test_stop_waits_until_the_driver_is_done_with_the_scheduler(make_set, monkeypatch):
    threads = make_set()
    monkeypatch.setattr(_driver_threads._SHARED, "_value", threads)
    s = Scheduler(timeout=30)
    real = s._wind_down
    finished = []

    def wind_down():
        real()
        finished.append(True)

    s._wind_down = wind_down  # read by the driver when STOP arrives
    s.stop()
    assert finished == [True], "stop() returned only after the driver's last act on it"
    assert s._driver is not None and s._driver.name.startswith(IDLE)


FORK_SCRIPT = textwrap.dedent(
    """
    import os, threading, time
    from nous_sched import Scheduler, Tool
    from nous_sched.scheduler._driver_threads import shared

    s = Scheduler(timeout=30)
    assert s.call(Tool("t", lambda a: 1), {}).value == 1
    parent = shared()
    pid = os.fork()
    if pid == 0:
        try:
            child = shared()
            assert child is not parent and child.counts() == (0, 0), child.counts()
            assert parent.forked_away
            start = time.monotonic()
            s.stop()  # inherited: its driver does not exist here, so nothing to wait for
            assert time.monotonic() - start < 1.0, time.monotonic() - start
            with Scheduler(timeout=30) as fresh:
                assert fresh.call(Tool("t", lambda a: 2), {}).value == 2
            os._exit(0)
        except BaseException:
            import traceback; traceback.print_exc()
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    s.stop()
    assert not parent.forked_away
    print(os.waitstatus_to_exitcode(status))
    """
)


def test_a_forked_child_gets_a_fresh_set_and_an_inherited_scheduler_stops_at_once():
    done = subprocess.run([sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0", done.stderr

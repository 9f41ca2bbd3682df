"""The tool threads (nous_sched/_tool_threads.py): order, the bound, warm reuse,
retirement, cancel, shutdown, names, and a fresh shared set after fork.

Every wait is on an event, a semaphore or a join, never a sleep.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from nous_sched import _tool_threads
from nous_sched._tool_threads import ToolThreads, retire_shared, shared

WAIT = 30.0


def watched(pool: ToolThreads) -> threading.Semaphore:
    """A semaphore released each time one of ``pool``'s threads goes idle."""
    pool._went_idle = threading.Semaphore(0)
    return pool._went_idle


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
    from nous_sched._tool_threads import shared

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

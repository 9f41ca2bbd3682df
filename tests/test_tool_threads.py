"""The scheduler's own tool threads (nous_sched/_tool_threads.py): order, the thread ceiling, cancel, shutdown."""

from __future__ import annotations

import threading

import pytest

from nous_sched._tool_threads import ToolThreads

WAIT = 30.0


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
        assert {name for _, name in ran} == {"test-tt_0", "test-tt_1"}
        gate.set()
        for _ in range(3):
            assert started.acquire(timeout=WAIT)
        assert sorted(i for i, _ in ran[2:]) == [2, 3, 4]
        assert len(pool._threads) == 2
    finally:
        gate.set()
        pool.shutdown()
    assert not any(t.is_alive() for t in pool._threads)


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
    pool.submit(ran.append, "dropped")
    pool.shutdown(wait=False, cancel_futures=True)  # while the only thread is still busy
    gate.set()
    for thread in pool._threads:
        thread.join(WAIT)
    assert ran == [] and not any(t.is_alive() for t in pool._threads)
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(ran.append, "late")

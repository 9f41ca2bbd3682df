"""The queue for a place: runs that find every place taken wait first come,
first served, and only the run at the head is woken by a change (each woken
run asks the pool core again, so waking every queued run made a change cost
O(queued runs): the CPU per run grew with concurrency). What that must not
cost: a run that reaches the head is woken by whatever put it there (the run
ahead served, timed out or interrupted), and closing the pool wakes every
queued run. A lost wake-up would leave a run asleep until its deadline, which
these tests set far beyond the joins' bounds."""

from __future__ import annotations

import threading

from polling import until

from nous_sched import RunCodeError, RunResult, Tool, WorkerPool, run_code

FAR = 300.0  # every queued run's deadline: a lost wake-up sleeps this long
BOUND = 45.0  # each join's bound: far below FAR and the suite's 120 s timeout, far above a loaded machine's need


def _queue(pool: WorkerPool, n: int, results: list, timeout: float = FAR) -> list[threading.Thread]:
    """``n`` runs started one at a time, each once the one before is queued;
    each appends its result, or the RunCodeError it raised, to ``results``."""

    def one() -> None:
        try:
            results.append(run_code("return 7", runtime=pool, timeout=timeout, description="queued"))
        except RunCodeError as e:
            results.append(e)

    threads = []
    for i in range(n):
        t = threading.Thread(target=one)
        t.start()
        threads.append(t)
        assert until(lambda: pool.places()[1] == i + 1), pool.places()
    return threads


def _holder(pool: WorkerPool, gate: threading.Event, results: list[RunResult]) -> threading.Thread:
    """A run that takes the pool's one place and keeps it until ``gate`` is set."""
    tool = Tool("hold", lambda args: gate.wait(BOUND), description="waits for the test")
    t = threading.Thread(
        target=lambda: results.append(
            run_code("await tools.hold({}); return 1", [tool], runtime=pool, timeout=FAR, description="holder")
        )
    )
    t.start()
    assert until(lambda: pool.places() == (1, 0) and pool.shares()[0] == 0), pool.places()
    return t


def test_every_queued_run_is_served_in_turn_without_waiting_for_its_deadline():
    pool = WorkerPool(size=1, spares=0)
    try:
        gate, held, queued = threading.Event(), [], []
        holder = _holder(pool, gate, held)
        threads = _queue(pool, 3, queued)
        gate.set()
        for t in [holder, *threads]:
            t.join(BOUND)
            assert not t.is_alive(), "a queued run slept past its turn"
        assert [r.error for r in held + queued] == [None] * 4
        assert [r.result for r in queued] == [7, 7, 7]
        assert pool.places()[1] == 0
    finally:
        pool.close()


def test_a_run_behind_a_head_that_times_out_is_woken_and_served():
    pool = WorkerPool(size=1, spares=0)
    try:
        gate, held, head, behind = threading.Event(), [], [], []
        holder = _holder(pool, gate, held)
        first = _queue(pool, 1, head, timeout=1.0)
        second = threading.Thread(
            target=lambda: behind.append(run_code("return 8", runtime=pool, timeout=FAR, description="behind"))
        )
        second.start()
        first[0].join(BOUND)
        assert head[0].error is not None and head[0].error.kind == "timeout"
        assert "waiting for a free worker process" in head[0].error.message
        assert until(lambda: pool.places()[1] == 1)  # the second is now the head, still queued
        gate.set()
        for t in (holder, second):
            t.join(BOUND)
            assert not t.is_alive(), "the run that became the head slept past its turn"
        assert behind[0].error is None and behind[0].result == 8
    finally:
        pool.close()


def test_closing_the_pool_wakes_every_queued_run():
    pool = WorkerPool(size=1, spares=0)
    gate, held, queued = threading.Event(), [], []
    try:
        holder = _holder(pool, gate, held)
        threads = _queue(pool, 3, queued)
        closer = threading.Thread(target=pool.close)
        closer.start()
        for t in threads:
            t.join(BOUND)
            assert not t.is_alive(), "a queued run slept through the pool's close"
        # (a closed pool is the caller's doing: run_code raises, as it does for
        # a run started on a pool already closed)
        assert [(type(e), str(e)) for e in queued] == [(RunCodeError, "the worker pool is closed")] * 3
    finally:
        gate.set()
        holder.join(BOUND)
        closer.join(BOUND)
        pool.close()

"""Places for waiting, shares for CPU (issue 43, item 7): a run holds its
worker's place for its whole length, but one of the pool's few CPU shares
only while its worker computes a step. So 64 runs that wait on a tool are
all admitted at once by the default pool, while the JavaScript computing at
once stays at ``cpu_shares``; a run that finds no share waits for one within
its deadline and cancel, and the relay's kick never waits for one (it hands
the batch to the run's own thread). Every check here is on what happened,
never on how long it took. The shares' decisions are the pool core's
(``tests/test_pool_core.py``, a share column in its state machine); an
interrupt at any step gives every share back (``tests/test_pool_interrupts.py``)."""

from __future__ import annotations

import threading

import pytest
from polling import until

from nous_sched import ConfigError, RunResult, Tool, WorkerPool, run_code
from nous_sched.runtime.pool import default_cpu_shares, default_size
from nous_sched.runtime.wake import CPUS

RUNS = 64


def test_the_default_pool_has_places_by_memory_and_shares_by_cores():
    assert default_size() == max(64, 2 * CPUS)
    assert default_cpu_shares() == CPUS
    pool = WorkerPool()
    try:
        assert (pool.size, pool.cpu_shares) == (default_size(), default_cpu_shares())
        assert "cpu_shares=" in repr(pool)
    finally:
        pool.close()


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2", [2]])
def test_a_bad_cpu_shares_is_a_config_error_naming_it(bad):
    with pytest.raises(ConfigError, match="cpu_shares"):
        WorkerPool(cpu_shares=bad)


@pytest.mark.timeout(300)
def test_sixty_four_runs_waiting_on_a_tool_are_all_admitted_at_once_by_the_default_pool():
    # The tool returns only once all 64 runs are inside it at once: a run that
    # was not admitted (no place) would leave the barrier short and every run
    # would end at its 5 s deadline. When they all wait, no share is held.
    pool = WorkerPool()
    seen: dict = {}

    def all_in() -> None:  # (the barrier's action: every run waits on the tool now)
        with pool._lock:
            seen["computing"] = set(pool._core.computing)
            seen["busy"] = pool._core.busy()

    barrier = threading.Barrier(RUNS, action=all_in)

    def wait(args):
        barrier.wait(30)
        return args["i"]

    tools = [Tool("wait", wait)]
    results: dict[int, RunResult] = {}

    def one(i: int) -> None:
        results[i] = run_code(
            f"return 1 + await tools.wait({{i: {i}}})", tools, runtime=pool, timeout=5, description="test"
        )

    try:
        # Start-up is not what is shown here: every run finds its worker ready.
        pool.prestart(RUNS)
        threads = [threading.Thread(target=one, args=(i,)) for i in range(RUNS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        barrier.abort()
        pool.close()
    errors = {i: r.error for i, r in results.items() if r.error is not None}
    assert errors == {}
    assert {i: r.result for i, r in results.items()} == {i: i + 1 for i in range(RUNS)}
    assert seen == {"computing": set(), "busy": RUNS}, "64 places held while they wait, no CPU share"


@pytest.mark.timeout(120)
def test_a_run_that_finds_no_free_share_waits_within_its_deadline_and_says_so():
    pool = WorkerPool(size=2, cpu_shares=1, spares=0)
    try:
        assert run_code("return 1", runtime=pool, description="test").result == 1
        with pool._lock:
            assert pool._core.take_share("another run", False)  # the only share computes elsewhere
        r = run_code("return 1", runtime=pool, timeout=1, description="test")
        assert r.error is not None and r.error.kind == "timeout"
        assert "waiting for a free CPU share" in r.error.message
        assert not pool._core.share_queue and not pool._share_waits
        pool._give_share("another run")
        assert run_code("return 2", runtime=pool, timeout=30, description="test").result == 2
        assert not pool._core.computing
    finally:
        pool.close()


@pytest.mark.timeout(120)
def test_a_cancel_ends_the_wait_for_a_share():
    pool = WorkerPool(size=2, cpu_shares=1, spares=0)
    cancel = threading.Event()
    try:
        with pool._lock:
            assert pool._core.take_share("another run", False)
        out: list = []
        t = threading.Thread(
            target=lambda: out.append(run_code("return 1", runtime=pool, timeout=60, cancel=cancel, description="t"))
        )
        t.start()
        assert until(lambda: len(pool._core.share_queue) == 1), "the run waits for the share"
        cancel.set()
        t.join(60)
        assert out[0].error is not None and out[0].error.kind == "cancelled"
        assert not pool._core.share_queue and not pool._share_waits
        pool._give_share("another run")
        assert run_code("return 3", runtime=pool, timeout=30, description="test").result == 3
    finally:
        pool.close()


@pytest.mark.timeout(120)
def test_a_committed_call_that_finds_no_share_is_sent_by_the_runs_own_thread_once_one_is_free():
    # The scheduler's driver commits the call and would send the settle itself
    # (the relay's kick); with every share computing it must not wait: the
    # run's own thread waits for the share, first come, first served, then sends.
    pool = WorkerPool(size=2, cpu_shares=1, spares=0)
    inside, go = threading.Event(), threading.Event()

    def gate(args):
        inside.set()
        go.wait(60)
        return 41

    out: list = []
    try:
        t = threading.Thread(
            target=lambda: out.append(
                run_code(
                    "return 1 + await tools.gate({})", [Tool("gate", gate)], runtime=pool, timeout=60, description="t"
                )
            )
        )
        t.start()
        assert inside.wait(60)
        assert until(lambda: not pool._core.computing), "waiting on the tool, the run holds no share"
        with pool._lock:
            assert pool._core.take_share("another run", False)
        go.set()
        assert until(lambda: len(pool._core.share_queue) == 1), "the kick handed the batch over; the run waits"
        assert t.is_alive() and out == []
        pool._give_share("another run")
        t.join(60)
        assert out[0].error is None and out[0].result == 42
        assert not pool._core.computing and not pool._core.share_queue
    finally:
        go.set()
        pool.close()


@pytest.mark.timeout(120)
def test_runs_beyond_the_shares_all_compute_in_turn():
    # Four runs that compute, one share: each waits its turn, none is lost.
    pool = WorkerPool(size=4, cpu_shares=1, spares=0)
    program = "let x = 0; for (let i = 0; i < 1e5; i++) x += i; await tools.echo({}); for (let i = 0; i < 1e5; i++) x += i; return x > 0"
    tools = [Tool("echo", lambda a: 1)]
    out: list = []
    try:
        threads = [
            threading.Thread(
                target=lambda: out.append(run_code(program, tools, runtime=pool, timeout=60, description="t"))
            )
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [r.result for r in out] == [True] * 4
        assert not pool._core.computing and not pool._core.share_queue
    finally:
        pool.close()


@pytest.mark.timeout(120)
def test_a_run_waiting_for_a_cpu_share_has_started_no_worker_process():
    # One share, no spares: while it computes elsewhere (a holder no slice
    # ends: tests/test_pool_slices.py parks a worker's step), the next run
    # holds a reserved place but no process; its worker is started once the
    # share is free. A run that reaches its deadline waiting has cost no
    # start-up at all.
    pool = WorkerPool(size=4, cpu_shares=1, spares=0)
    out: dict = {}

    def start(key: str, program: str, **kw) -> threading.Thread:
        t = threading.Thread(
            target=lambda: out.__setitem__(key, run_code(program, runtime=pool, description="t", **kw))
        )
        t.start()
        return t

    try:
        with pool._lock:
            assert pool._core.take_share("another run", False)
        b = start("b", "return 2", timeout=60)
        assert until(lambda: pool.shares() == (1, 1)), "the run waits for the share"
        assert pool.pids() == [] and pool.places() == (1, 0), "with a place reserved and no worker process"
        seen: set = set()
        c = start("c", "return 3", timeout=1)
        while c.is_alive():
            seen.update(pool.pids())
            c.join(0.005)
        assert out["c"].error is not None and out["c"].error.kind == "timeout"
        assert "waiting for a free CPU share" in out["c"].error.message
        assert seen == set(), "a run that timed out waiting for a share started no worker"
        assert pool.shares() == (1, 1) and pool.pids() == []
        pool._give_share("another run")
        b.join(60)
        assert out["b"].error is None and out["b"].result == 2, "the waiting run started its worker and ran"
        assert pool.shares() == (0, 0)
    finally:
        pool.close()


@pytest.mark.timeout(120)
def test_a_run_that_would_wait_for_a_share_leaves_the_spare_to_the_run_whose_turn_comes():
    # A run that took a spare and then waited for the share would have spent
    # a start-up (the spare's) and might time out waiting: it reserves a place
    # instead, and the spare goes to the run that gets the share. (The share
    # computes elsewhere, for a holder no slice ends: see test_pool_slices.py.)
    pool = WorkerPool(size=4, cpu_shares=1, spares=1)
    out: dict = {}

    def start(key: str, program: str, **kw) -> threading.Thread:
        t = threading.Thread(
            target=lambda: out.__setitem__(key, run_code(program, runtime=pool, description="t", **kw))
        )
        t.start()
        return t

    try:
        assert pool.wait_for_spares(60)
        held = pool.pids()
        assert len(held) == 1
        with pool._lock:
            assert pool._core.take_share("another run", False)
        b = start("b", "return 2", timeout=60)
        assert until(lambda: pool.shares() == (1, 1)), "the run waits for the share"
        seen: set = set()
        c = start("c", "return 3", timeout=1)
        while c.is_alive():
            seen.update(pool.pids())
            c.join(0.005)
        assert out["c"].error is not None and "waiting for a free CPU share" in out["c"].error.message
        assert seen == set(held), "the runs waiting took no spare, and none was started for them"
        pool._give_share("another run")
        b.join(60)
        assert out["b"].error is None and out["b"].result == 2
        assert pool.wait_for_spares(60)
        assert not set(held) & set(pool.pids()), "the waiting run ran on the spare (it started no worker of its own)"
    finally:
        pool.close()

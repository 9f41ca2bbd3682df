"""A one-shot run's worker is killed by the pool's spares thread, not on the run's
thread (WorkerPool._release_now): the signal, the pipes' close and the dying
process's wake-up are off the run's path. Its place stays taken until it is
gone, no process outlives its pool, and a forked copy of the host leaves it alone.

Every wait is bounded by WAIT; nothing is timed.
"""

from __future__ import annotations

import os
import threading

import pytest
from procs import wait_gone

from nous_sched import Tool, WorkerPool, run_code
from nous_sched.runtime import procio

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="fork server children need pidfd_open"),
]

WAIT = 10.0
NOOP = Tool("noop", lambda args: 1, concurrency_safe=lambda args: True)


def killers(monkeypatch) -> list[str]:
    """The names of the threads that discard a worker from now on."""
    names: list[str] = []
    real = procio.Worker.discard

    def discard(self):
        names.append(threading.current_thread().name)
        return real(self)

    monkeypatch.setattr(procio.Worker, "discard", discard)
    return names


def test_a_one_shot_runs_worker_is_killed_off_the_runs_thread(monkeypatch):
    names = killers(monkeypatch)
    pool = WorkerPool(size=4, spares=1)
    try:
        for _ in range(3):
            r = run_code("return await tools.noop({});", [NOOP], runtime=pool, description="one call")
            assert r.ok and r.result == 1, r.error
        assert pool._reaped(WAIT), "every discarded worker is killed and reaped"
        assert len(names) == 3
        assert all(name.startswith("nous-sched-spares-") for name in names), names
        assert threading.main_thread().name not in names
    finally:
        pool.close()


def test_its_place_is_taken_until_it_is_gone_so_a_pool_of_one_runs_one_at_a_time():
    pool = WorkerPool(size=1, spares=0)
    try:
        for i in range(4):
            r = run_code(f"return await tools.noop({{}}) + {i};", [NOOP], runtime=pool, description="one call")
            assert r.ok and r.result == 1 + i, r.error
            assert len(pool.pids()) <= 1, "never a second process beside the one being killed"
        assert pool._reaped(WAIT)
        assert pool.places()[0] == 0, "every place back once its process is gone"
    finally:
        pool.close()


def test_closing_the_pool_kills_a_worker_whose_kill_was_still_to_come(monkeypatch):
    pool = WorkerPool(size=2, spares=0)
    # The spares thread never runs: the released worker waits for its kill.
    monkeypatch.setattr(pool, "_top_up", lambda: None)
    r = run_code("return await tools.noop({});", [NOOP], runtime=pool, description="one call")
    assert r.ok, r.error
    (wid, worker) = pool._killing[0]
    pid = worker.proc.pid
    assert os.path.exists(f"/proc/{pid}"), "not killed yet"
    pool.close()
    assert wait_gone(pid, WAIT), "close() kills it"


def test_a_forked_copy_of_the_host_leaves_a_worker_to_be_killed_alone(monkeypatch):
    pool = WorkerPool(size=2, spares=0)
    monkeypatch.setattr(pool, "_top_up", lambda: None)
    try:
        r = run_code("return await tools.noop({});", [NOOP], runtime=pool, description="one call")
        assert r.ok, r.error
        (_, worker) = pool._killing[0]
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                pool._after_fork_in_child()
                code = 0 if not pool._killing and worker.fd_in == -1 else 3
            except BaseException:
                code = 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.path.exists(f"/proc/{worker.proc.pid}"), "the parent's worker untouched by the child"
    finally:
        pool.close()


def test_a_finished_runs_wind_down_drops_nothing_and_wakes_no_thread(monkeypatch):
    # After a run that ended, its ticket holds nothing: run_code's wind-down
    # (Begun.abandon) must not run a whole drop (the pool's lock, a scan of its
    # workers, a wake of every thread waiting on the pool) for it.
    pool = WorkerPool(size=2, spares=1)
    dropped: list = []
    real = WorkerPool._drop
    monkeypatch.setattr(WorkerPool, "_drop", lambda self, ticket: (dropped.append(ticket), real(self, ticket))[1])
    try:
        for _ in range(3):
            r = run_code("return await tools.noop({});", [NOOP], runtime=pool, description="one call")
            assert r.ok, r.error
        assert [t for t in dropped if t is not None] == []
        # A run that fails still gives everything back.
        r = run_code("throw new Error('no');", [NOOP], runtime=pool, description="throws")
        assert r.error is not None and r.error.kind == "exception"
        assert pool._reaped(WAIT), "its worker killed and reaped all the same"
    finally:
        pool.close()

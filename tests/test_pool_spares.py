"""Spares: a fresh worker is handed out only once it is ready (bounded, its
first context prepared), its start-up never on the run's thread; a run waits
for a spare on its way rather than start another process; every worker a run
leaves behind is gone afterwards. Checked through the pool's own events (the
hello each worker sends when it is ready, the core's states), never timing."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

import pytest
from procs import descendants, wait_gone

from nous_sched import Tool, WorkerPool, run_code
from nous_sched.errors import RunCodeError
from nous_sched.runtime import Limits, procio
from nous_sched.runtime.poolcore import FRESH, SPAWN, USE, WAIT, PoolCore

pytestmark = pytest.mark.timeout(120)

LINUX = sys.platform.startswith("linux")
WAIT_S = 30.0


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        return dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)


def _policies(pid: int) -> list[int]:
    """The scheduling policy of each thread of ``pid`` (``/proc/.../stat`` field 41)."""
    found = []
    for task in sorted(os.listdir(f"/proc/{pid}/task")):
        with open(f"/proc/{pid}/task/{task}/stat", encoding="ascii") as fh:
            found.append(int(fh.read().rsplit(")", 1)[1].split()[38]))
    return found


def _hello_readers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every thread that reads a worker's hello from here on."""
    readers: list[str] = []
    real = procio.Worker.hello

    def hello(self: procio.Worker, until: float) -> None:
        readers.append(threading.current_thread().name)
        real(self, until)

    monkeypatch.setattr(procio.Worker, "hello", hello)
    return readers


@pytest.mark.skipif(not LINUX, reason="/proc")
def test_a_spare_is_ready_before_it_is_handed_out_and_the_run_never_waits_for_its_start_up(monkeypatch):
    readers = _hello_readers(monkeypatch)
    with WorkerPool(size=4, spares=2) as pool:
        assert pool.wait_for_spares(WAIT_S)
        with pool._lock:
            spares = {wid: w for wid, w in pool._workers.items() if wid in pool._core.idle}
        assert len(spares) == 2
        for w in spares.values():
            # Its hello said so: bounded (the filter is on) and its context prepared.
            assert w.ready and w.prepared
            status = _status(w.proc.pid)
            assert status["Seccomp"] == "2" and status["NoNewPrivs"] == "1"
            # It booted in the background, and serves at the normal policy, every thread of it.
            assert _policies(w.proc.pid) == [os.SCHED_OTHER] * 2
        assert readers and "MainThread" not in readers, "the spares' hellos were read off the run's thread"
        del readers[:]
        ran_on: list[int] = []

        def where(args: dict) -> int:
            with pool._lock:
                ran_on.extend(wid for wid, s in pool._core.slots.items() if s.state == "busy")
            return 1

        result = run_code("return await tools.where({})", [Tool("where", where)], runtime=pool, description="test")
        assert result.error is None and result.result == 1
        assert len(ran_on) == 1 and ran_on[0] in spares, "the run took a ready spare"
        assert "MainThread" not in readers, "the run read no hello: its worker was ready"


def test_a_run_waits_for_a_spare_on_its_way_rather_than_start_another_process():
    core = PoolCore(size=4, spares=1, runs_per_worker=5)
    (spare,) = core.want_spares()
    assert core.ask(1, FRESH, 1) == (WAIT, None, None), "a spare is on its way"
    assert core.ask(2, "a", 1) == (WAIT, None, None), "first come, first served"
    assert core.spares_ready() == 0
    assert not core.started(spare, True)
    assert core.spares_ready() == 1 and core.changed()
    assert core.ask(1, FRESH, 1) == (USE, spare, None)
    verdict, wid, retire = core.ask(2, "a", 1)
    assert verdict == SPAWN and wid not in (None, spare) and retire is None, "no spare on its way: start one"


def test_with_more_runs_waiting_than_spares_on_their_way_the_first_starts_its_own():
    core = PoolCore(size=4, spares=1, runs_per_worker=5)
    (spare,) = core.want_spares()
    assert core.ask(1, FRESH, 1)[0] == WAIT
    assert core.ask(2, FRESH, 1)[0] == WAIT
    verdict, wid, _ = core.ask(1, FRESH, 1)  # two waiting, one spare coming: a free place is not left idle
    assert verdict == SPAWN and wid != spare
    core.started(spare, True)
    assert core.ask(2, FRESH, 1) == (USE, spare, None)


def test_runs_that_find_no_spare_ready_raise_the_spares_kept_ready_up_to_the_bound():
    core = PoolCore(size=8, spares=1, runs_per_worker=5, max_spares=3)
    (spare,) = core.want_spares()
    for run in (1, 2, 3):  # each finds none ready
        assert core.ask(run, FRESH, 1)[0] == WAIT
    assert core.target == 3, "one more per run that found none, up to max_spares"
    core.started(spare, True)
    assert core.ask(1, FRESH, 1) == (USE, spare, None)
    core.leave(2)
    core.leave(3)
    made = core.want_spares()
    assert len(made) == 3
    for wid in made:
        core.started(wid, True)
    assert core.ask(4, "a", 1)[0] == USE and core.target == 3, "a domain's run never moves it"


def test_the_spares_kept_ready_fall_back_to_spares_once_runs_find_them_ready():
    core = PoolCore(size=8, spares=1, runs_per_worker=5)
    assert core.max_spares == 2, "default: twice spares"
    assert core.ask(1, FRESH, 1)[0] == SPAWN  # none ready, none coming
    assert core.target == 2
    made = core.want_spares()
    assert len(made) == 2
    for wid in made:
        core.started(wid, True)
    assert core.ask(2, FRESH, 1)[0] == USE  # two ready: it leaves the other
    assert core.target == 1
    assert core.want_spares() == [], "one ready is enough again"
    assert core.ask(3, FRESH, 1)[0] == USE
    assert core.target == 1, "never below spares"


def test_a_spare_that_could_not_start_lets_the_waiting_run_start_its_own():
    core = PoolCore(size=2, spares=1, runs_per_worker=5)
    (spare,) = core.want_spares()
    assert core.ask(1, FRESH, 1)[0] == WAIT
    core.started(spare, False)
    assert core.changed()
    assert core.ask(1, FRESH, 1)[0] == SPAWN


@pytest.mark.timeout(120)
@pytest.mark.skipif(not LINUX, reason="/proc")
def test_a_spare_killed_as_it_boots_is_replaced_with_no_run_to_ask(monkeypatch):
    # Issue 43 item 8: after a loss the pool keeps its spares. The first spare
    # is killed (SIGKILL, for real) before the spares thread reads its hello;
    # no run follows, and the spares are back all the same.
    real = procio.Worker.hello
    killed: list[int] = []

    def hello(self: procio.Worker, until: float) -> None:
        if not killed and threading.current_thread().name.startswith("nous-sched-spares"):
            killed.append(self.proc.pid)
            os.kill(self.proc.pid, signal.SIGKILL)
            # Gone, and what it wrote before the kill left unread: a spare that
            # boots faster than this thread comes here has its hello in the pipe
            # already, and the loss this test is about would not happen.
            assert self.proc.exited(30.0)
            blocking = os.get_blocking(self.fd_out)
            os.set_blocking(self.fd_out, False)
            try:
                while os.read(self.fd_out, 65536):
                    pass
            except BlockingIOError:
                pass
            finally:
                os.set_blocking(self.fd_out, blocking)
        real(self, until)

    monkeypatch.setattr(procio.Worker, "hello", hello)
    pool = WorkerPool(size=4, spares=2)
    try:
        assert pool.wait_for_spares(60)
        assert len(killed) == 1
        with pool._lock:
            assert pool._core.spares_ready() == 2 and not pool._spares_failed
        assert killed[0] not in pool.pids()
        assert run_code("return 5", runtime=pool, description="test").result == 5
    finally:
        pool.close()


def test_a_used_spare_being_killed_is_not_counted_as_a_spare():
    core = PoolCore(size=4, spares=1, runs_per_worker=5)
    (spare,) = core.want_spares()
    core.started(spare, True)
    assert core.ask(1, FRESH, 1) == (USE, spare, None)
    (replacement,) = core.want_spares()
    core.started(replacement, True)
    assert not core.release(spare, FRESH, True)  # retiring until it is gone
    assert core.want_spares() == [] and core.spares_ready() == 1


@pytest.mark.skipif(not LINUX, reason="/proc")
def test_fresh_runs_leave_no_process_behind_and_no_worker_serves_two(monkeypatch):
    before = descendants(os.getpid())
    served: list[set[int]] = []
    with WorkerPool(size=3, spares=2) as pool:
        assert pool.wait_for_spares(WAIT_S)

        def who(args: dict) -> int:
            with pool._lock:
                served.append({pool._workers[w].proc.pid for w, s in pool._core.slots.items() if s.state == "busy"})
            return 1

        tool = Tool("who", who)
        for _ in range(6):
            assert run_code("return await tools.who({})", [tool], runtime=pool, description="test").result == 1
        used = [pids.pop() for pids in served]
        assert len(set(used)) == 6, "every run had a worker of its own"
        assert all(wait_gone(pid, WAIT_S) for pid in used), "each was discarded after its run"
        server = pool._server
        assert server is not None
    assert wait_gone(server.proc.pid, WAIT_S)
    assert descendants(os.getpid()) <= before, "no worker, spare or fork server outlives the pool"


@pytest.mark.skipif(not (LINUX and os.uname().machine in ("x86_64", "aarch64")), reason="seccomp on Linux only")
def test_the_filter_a_fork_server_builds_once_is_each_childs_own(monkeypatch):
    from nous_sched.runtime import oslimits

    machine = os.uname().machine
    monkeypatch.setattr(oslimits, "_TEMPLATE", None)
    monkeypatch.setattr(oslimits, "_FILTER", None)
    expected = {pid: oslimits.filter_bytes(machine, pid) for pid in (7, 4242, 2**22 - 1)}
    assert len(set(expected.values())) == 3
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # build the template only: keep this process's capabilities
    oslimits.prepare()
    assert oslimits._TEMPLATE is not None and len(oslimits._TEMPLATE[2]) >= 1
    assert {pid: oslimits.filter_bytes(machine, pid) for pid in expected} == expected
    assert oslimits._FILTER is not None
    for pid, raw in expected.items():  # what a child installs: the ready buffer, its own pid written in
        fprog, buf = oslimits._ready_filter(machine, pid)
        assert fprog.len * 8 == len(raw) and ctypes.string_at(fprog.filter, len(raw)) == raw


@pytest.mark.skipif(not (LINUX and os.geteuid() == 0), reason="a root host's workers only")
def test_a_root_hosts_spare_has_an_empty_bounding_set_and_no_capability():
    with WorkerPool(size=2, spares=1) as pool:
        assert pool.wait_for_spares(WAIT_S)
        (pid,) = pool.pids()
        status = _status(pid)
    for field in ("CapBnd", "CapPrm", "CapEff", "CapInh", "CapAmb"):
        assert int(status[field], 16) == 0, (field, status[field])
    assert status["Uid"].split() == ["65534"] * 4


def test_a_busy_pool_replaces_its_spares_from_one_thread_which_leaves_with_the_pool(monkeypatch):
    from nous_sched.runtime import pool as pool_module

    monkeypatch.setattr(pool_module, "SPARES_LINGER", 60.0)  # (busy: runs come well within it)
    # A closed pool's spares thread may still be on its way out (an earlier test's).
    earlier = {t for t in threading.enumerate() if t.name.startswith("nous-sched-spares-")}
    with WorkerPool(size=3, spares=1) as pool:
        assert pool.wait_for_spares(WAIT_S)
        seen = set()
        for n in range(4):
            assert run_code(f"return {n}", runtime=pool, description="test").result == n
            assert pool.wait_for_spares(WAIT_S), "the spare a run took was replaced when it ended"
            seen |= {t for t in threading.enumerate() if t.name.startswith("nous-sched-spares-")} - earlier
        assert len(seen) == 1, "one spares thread for every run"
        (thread,) = seen
    thread.join(WAIT_S)
    assert not thread.is_alive(), "closing the pool ends it"


def test_a_run_that_takes_the_head_of_the_queue_wakes_the_run_behind_it(monkeypatch):
    """bench_memory.py's stall: a spare is ready and the pool says so; only
    the head of the queue is woken by that (the run behind it sleeps on a
    condition of its own, see tests/test_pool_queue.py); the head then takes
    the spare and leaves the queue. The run behind is now at the head with a
    free place, and must be woken: no spare is on its way and no run ends, so
    nothing else would wake it before its deadline. (Before the queue woke
    only its head, the same stall came from one notify waking both runs: the
    second re-checked first, was not at the head, and slept again.)"""
    limits = Limits()
    asked: dict[int, list[str]] = {1: [], 2: []}
    waits_of_2 = threading.Event()  # run 2's first WAIT

    with WorkerPool(size=4, spares=1) as pool:
        real_ask = pool._core.ask

        def ask(run, domain, need):  # (called with the pool's lock held, up to the condition's wait)
            verdict = real_ask(run, domain, need)
            asked[run].append(verdict[0])
            if run == 2 and verdict[0] == WAIT:
                waits_of_2.set()
            return verdict

        monkeypatch.setattr(pool._core, "ask", ask)
        with pool._lock:
            (spare,) = pool._core.want_spares()  # a spare on its way (no process: the core's word only)
            assert pool._core.ask(1, FRESH, 1)[0] == WAIT, "run 1 waits for the spare"
        got: list[object] = []

        def run_2() -> None:
            try:
                got.append(pool._place(2, 1, limits, time.monotonic() + 120, None, FRESH))
            except RunCodeError as exc:  # (the pool closed under it: the failure below says why)
                got.append(exc)

        second = threading.Thread(target=run_2, name="test-run-2")
        second.start()
        assert waits_of_2.wait(WAIT_S), "run 2 waits behind run 1"
        with pool._lock:  # run 2 is in its condition's wait: it released the lock there
            pool._core.started(spare, True)  # the spare is ready, as _admit says it ...
            pool._notify()  # ... and wakes the head of the queue (run 1, which asks below)
        assert asked[2] == [WAIT], "run 2, behind the head, was not woken by a change that is not its turn"
        wid, w, retire = pool._place(1, 1, limits, time.monotonic() + 120, None, FRESH)
        assert (wid, w, retire) == (spare, None, None), "run 1 took the spare"
        second.join(WAIT_S)
        alive = second.is_alive()
        if alive:
            pool.close()  # (wakes it with "closed", so the test ends)
            second.join(WAIT_S)
        assert not alive, "run 2 was left asleep at the head of the queue with a free place"
        (place,) = got
        assert asked[2][-1] == SPAWN and isinstance(place, tuple) and place[0] not in (None, spare)

"""The pool's decisions (:mod:`nous_sched.runtime.poolcore`), places and CPU
shares, driven through every interleaving by a hypothesis state machine; and the shell around them
with real processes: a cold pool raced by 12 threads never holds a third
worker, and a KeyboardInterrupt at any point of a worker's start-up leaks no
process and no descriptor."""

from __future__ import annotations

import os
import select
import sys
import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from procs import descendants

from nous_sched import Tool, WorkerPool, run_code
from nous_sched.runtime import poolcore, procio
from nous_sched.runtime.poolcore import FRESH, SPAWN, USE, WAIT, Closed, PoolCore

DOMAINS = st.sampled_from([FRESH, FRESH, "a", "b"])


class PoolMachine(RuleBasedStateMachine):
    """Runs ask, wait, start, compute steps (a CPU share each), finish, or are
    interrupted at any of those steps; spares come and go; the pool closes."""

    SHAPE = {"size": 3, "spares": 2, "runs_per_worker": 3, "cpu_shares": 2}

    def __init__(self) -> None:
        super().__init__()
        self.core = PoolCore(**self.SHAPE)
        self.computing: set[int] = set()  # runs holding a CPU share
        self.share_order: list[int] = []  # runs waiting for one, in the order they started waiting
        self.next_run = 0
        self.waiting: dict[int, object] = {}  # run -> domain
        self.holding: dict[int, tuple[int, object]] = {}  # run -> (wid, domain)
        self.starting: set[int] = set()  # wids whose process the "shell" is making
        self.reserved: dict[int, int] = {}  # wid -> its run: a SPAWN place, no process until the run has a share
        self.retiring: set[int] = set()  # wids killed, not yet gone
        self.served: dict[int, set] = {}  # wid -> domains it ran
        self.fresh_runs: dict[int, int] = {}  # wid -> runs without a domain it was handed to
        self.order: list[int] = []  # waiting runs, in the order they started waiting

    def _ask(self, run: int, domain: object) -> None:
        core = self.core
        would_wait = len(core.computing) >= core.cpu_shares or bool(core.share_queue)
        room = len(core.slots) < core.size
        try:
            verdict, wid, retire = self.core.ask(run, domain, need=1)
        except Closed:
            self.waiting.pop(run, None)
            if run in self.order:
                self.order.remove(run)
            return
        if verdict == WAIT:
            if run not in self.waiting:
                self.order.append(run)
            self.waiting[run] = domain
            return
        if run in self.waiting:
            assert self.order[0] == run, "first come, first served"
            self.order.pop(0)
            del self.waiting[run]
        assert wid is not None
        if verdict == SPAWN:
            self.reserved[wid] = run
        if verdict == USE and wid not in self.served:
            assert not (would_wait and room), "a spare is left to the run whose turn comes"
        self.holding[run] = (wid, domain)
        self.served.setdefault(wid, set()).add(domain)
        if domain is FRESH:
            self.fresh_runs[wid] = self.fresh_runs.get(wid, 0) + 1

    @rule(domain=DOMAINS)
    def a_run_asks(self, domain: object) -> None:
        self.next_run += 1
        self._ask(self.next_run, domain)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def a_waiting_run_asks_again(self, data: st.DataObject) -> None:
        run = data.draw(st.sampled_from(sorted(self.waiting)))
        self._ask(run, self.waiting[run])

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def a_waiting_run_gives_up(self, data: st.DataObject) -> None:
        run = data.draw(st.sampled_from(sorted(self.waiting)))
        self.core.leave(run)
        del self.waiting[run]
        self.order.remove(run)

    @rule()
    def the_spares_thread_tops_up(self) -> None:
        self.starting.update(self.core.want_spares())

    @precondition(lambda self: self.reserved)
    @rule(data=st.data())
    def a_run_with_a_reserved_place_asks_for_its_share(self, data: st.DataObject) -> None:
        # (the shell: a SPAWN place's process is started only under the run's share)
        self._take(self.reserved[data.draw(st.sampled_from(sorted(self.reserved)))], True)

    @precondition(lambda self: any(r in self.share_order for r in self.reserved.values()))
    @rule(data=st.data())
    def a_run_with_a_reserved_place_gives_up_waiting_for_its_share(self, data: st.DataObject) -> None:
        # its deadline, a cancel: the shell drops its ticket (the place, no process yet)
        run = data.draw(st.sampled_from(sorted(r for r in self.reserved.values() if r in self.share_order)))
        self._drop(run)

    @precondition(lambda self: self.starting)
    @rule(data=st.data(), ok=st.booleans())
    def a_process_start_ends(self, data: st.DataObject, ok: bool) -> None:
        wid = data.draw(st.sampled_from(sorted(self.starting)))
        self.starting.discard(wid)
        slot = self.core.slots.get(wid)
        if slot is not None and slot.for_run is not None:
            assert slot.for_run in self.core.computing, "a run's own process starts under its share"
        self.core.started(wid, ok)
        if not ok:  # its run (if any) fails: it holds nothing, its share given back
            for run, (held, _) in list(self.holding.items()):
                if held == wid:
                    del self.holding[run]
                    self.core.give_share(run)
                    self.computing.discard(run)

    def _ready(self) -> list[int]:
        """The runs whose worker is started."""
        return sorted(r for r, (w, _) in self.holding.items() if w not in self.starting and w not in self.reserved)

    @precondition(lambda self: self._ready())
    @rule(data=st.data(), reusable=st.booleans())
    def a_run_ends(self, data: st.DataObject, reusable: bool) -> None:
        runs = self._ready()
        run = data.draw(st.sampled_from(runs))
        wid, domain = self.holding.pop(run)
        # (the shell: each step gives its share back, and the run's end does again)
        self.core.give_share(run)
        self.core.leave_shares(run)
        self.computing.discard(run)
        if run in self.share_order:
            self.share_order.remove(run)
        kept = self.core.release(wid, domain, reusable)
        if domain is FRESH:
            assert not kept, "a run without a domain never leaves its worker for another"
        if not kept:
            self.retiring.add(wid)

    @precondition(lambda self: self.retiring)
    @rule(data=st.data())
    def a_killed_process_is_gone(self, data: st.DataObject) -> None:
        wid = data.draw(st.sampled_from(sorted(self.retiring)))
        self.retiring.discard(wid)
        self.core.dead(wid)

    @precondition(lambda self: self.core.idle)
    @rule(data=st.data())
    def an_idle_worker_is_found_dead(self, data: st.DataObject) -> None:
        self.core.dead(data.draw(st.sampled_from(list(self.core.idle))))

    @precondition(lambda self: self.waiting or self.holding)
    @rule(data=st.data())
    def a_run_is_interrupted_at_any_step(self, data: st.DataObject) -> None:
        # A KeyboardInterrupt cut the run off wherever it was (waiting, its
        # process being made, running): the shell drops its ticket.
        self._drop(data.draw(st.sampled_from(sorted(set(self.waiting) | set(self.holding)))))

    def _drop(self, run: int) -> None:
        kill = self.core.drop(run)
        if run in self.waiting:
            del self.waiting[run]
            self.order.remove(run)
        held = self.holding.pop(run, None)
        self.computing.discard(run)
        if run in self.share_order:
            self.share_order.remove(run)
        assert run not in self.core.computing and run not in self.core.share_queue, "its share is back"
        if held is None:
            assert kill == []
        else:
            wid = held[0]
            assert kill == [wid]
            if wid in self.starting or wid in self.reserved:  # its place is gone; the shell kills what it was making
                self.starting.discard(wid)
                self.reserved.pop(wid, None)
                assert wid not in self.core.slots
            else:
                self.retiring.add(wid)
                assert self.core.slots[wid].state == "retiring"
        assert not self.core.holds(run)
        assert self.core.drop(run) == [], "dropping a run twice gives nothing more back"

    # -- CPU shares: a run with a place starts a step, waits for a share, ends its step

    def _take(self, run: int, wait: bool) -> None:
        got = self.core.take_share(run, wait)
        if run in self.computing:
            assert got, "a run holding a share holds it still"
            return
        if got:
            if self.share_order:
                assert self.share_order[0] == run, "first come, first served (no kick goes ahead of a waiting run)"
                self.share_order.pop(0)
            self.computing.add(run)
        elif wait and run not in self.share_order:
            self.share_order.append(run)
        for wid, owner in list(self.reserved.items()):
            if owner == run and got:  # (the shell takes a spare ready now, or starts its process)
                del self.reserved[wid]
                spare = self.core.swap(run, wid)
                if spare is None:
                    self.starting.add(wid)
                    continue
                assert wid not in self.core.slots, "the reservation is given back"
                assert spare not in self.served, "a spare that never ran anything"
                domain = self.holding[run][1]
                self.holding[run] = (spare, domain)
                self.served.setdefault(spare, set()).add(domain)
                if domain is FRESH:
                    self.fresh_runs[spare] = self.fresh_runs.get(spare, 0) + 1

    @precondition(lambda self: self._ready())
    @rule(data=st.data(), wait=st.booleans())
    def a_run_starts_a_step(self, data: st.DataObject, wait: bool) -> None:
        # (once its worker is ready) wait: its own thread (the run frame, a
        # settle it sends); else the relay's kick
        runs = self._ready()
        self._take(data.draw(st.sampled_from(runs)), wait)

    @precondition(lambda self: self.share_order)
    @rule(data=st.data())
    def a_run_waiting_for_a_share_asks_again(self, data: st.DataObject) -> None:
        self._take(data.draw(st.sampled_from(self.share_order)), True)

    @precondition(lambda self: self.share_order)
    @rule(data=st.data())
    def a_run_waiting_for_a_share_gives_up(self, data: st.DataObject) -> None:
        run = data.draw(st.sampled_from(self.share_order))  # its deadline, a cancel
        if run in self.reserved.values():
            self._drop(run)  # (the shell gives its reserved place back with it)
            return
        self.core.leave_shares(run)
        self.share_order.remove(run)

    @precondition(lambda self: self.computing & set(self._ready()))
    @rule(data=st.data())
    def a_step_s_answers_arrive(self, data: st.DataObject) -> None:
        # (a run keeps the share its start-up took into its first step)
        run = data.draw(st.sampled_from(sorted(self.computing & set(self._ready()))))
        self.core.give_share(run)
        self.computing.discard(run)
        self.core.give_share(run)  # (idempotent: the run's end gives it back again)

    @rule()
    def close(self) -> None:
        wids = set(self.core.close())
        held = {w for w, _ in self.holding.values()}
        assert held <= wids | self.starting | set(self.reserved)
        self.reserved.clear()
        self.holding.clear()
        self.retiring.clear()
        self.waiting.clear()
        self.order.clear()
        self.computing.clear()
        self.share_order.clear()
        assert self.core.take_share(-1, True), "a closed pool grants a share at once"
        assert not self.core.computing, "and does not count it"

    @invariant()
    def never_more_than_size_workers_or_runs(self) -> None:
        assert len(self.core.slots) <= self.core.size
        assert self.core.busy() <= self.core.size
        assert len(self.holding) <= self.core.size

    @invariant()
    def a_process_serves_one_trust_domain(self) -> None:
        for wid, domains in self.served.items():
            assert len(domains) == 1, (wid, domains)  # a run without a domain: its worker's only run

    @invariant()
    def a_fresh_worker_is_handed_to_one_run_only(self) -> None:
        assert all(n == 1 for n in self.fresh_runs.values()), self.fresh_runs

    @invariant()
    def every_place_is_accounted_for(self) -> None:
        held = {w for w, _ in self.holding.values()}
        for wid, slot in self.core.slots.items():
            if slot.state == "busy":
                assert wid in held
                assert self.holding[slot.holder][0] == wid, "a busy place knows the run that holds it"
            if slot.state == "starting":
                assert wid in self.starting or self.reserved.get(wid) == slot.holder
            if slot.state == "idle":
                assert wid in self.core.idle
            if slot.state == "retiring":
                assert wid in self.retiring

    @invariant()
    def never_more_than_cpu_shares_compute_and_only_runs_with_a_place(self) -> None:
        assert self.core.computing == self.computing
        assert len(self.core.computing) <= self.core.cpu_shares
        assert self.computing <= set(self.holding)
        assert set(self.share_order) <= set(self.holding)

    @invariant()
    def a_run_waiting_for_its_first_share_has_no_process(self) -> None:
        for wid, run in self.reserved.items():
            assert self.core.slots[wid].state == "starting" and self.core.slots[wid].holder == run
            assert run not in self.computing

    @invariant()
    def the_core_queues_share_waiters_as_they_came(self) -> None:
        assert list(self.core.share_queue) == self.share_order

    @invariant()
    def a_free_share_goes_to_the_head(self) -> None:
        # The shell wakes only share_head(): when it names nobody, no waiting run can get one.
        head = self.core.share_head()
        if head is None:
            assert not self.share_order or len(self.computing) >= self.core.cpu_shares
        else:
            assert head == self.share_order[0] and len(self.computing) < self.core.cpu_shares

    @invariant()
    def the_core_queues_runs_as_they_came(self) -> None:
        assert list(self.core.waiting) == self.order

    @invariant()
    def a_head_that_could_go_on_is_said_to_be_worth_waking(self) -> None:
        # The shell wakes the waiting runs only when changed() says so (after
        # every grant too): a head it leaves asleep must have nothing to get.
        if self.core.waiting and not self.core.changed():
            head = self.core.waiting[0]
            assert self.core.ask(head, self.waiting[head], 1) == (WAIT, None, None)


PoolMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_the_pool_core_state_machine = PoolMachine.TestCase


class OneSharePoolMachine(PoolMachine):
    """The same, with one CPU share and room beside it: runs queue for the
    share with places reserved, and spares are ready when their turn comes
    (the reservation swapped for a spare)."""

    SHAPE = {"size": 4, "spares": 1, "runs_per_worker": 3, "cpu_shares": 1}

    @rule()
    def the_spares_thread_tops_up_and_its_spares_say_hello(self) -> None:
        for wid in self.core.want_spares():
            self.core.started(wid, True)


OneSharePoolMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_the_pool_core_state_machine_with_one_share = OneSharePoolMachine.TestCase


def test_a_fresh_run_after_a_domain_run_never_gets_that_worker():
    core = PoolCore(size=1, spares=0, runs_per_worker=5)
    verdict, wid, _ = core.ask(1, "a", 1)
    assert verdict == SPAWN and wid is not None
    core.started(wid, True)
    assert core.release(wid, "a", True)
    verdict, other, retire = core.ask(2, FRESH, 1)
    assert verdict == SPAWN and retire == wid and other != wid
    verdict, again, _ = core.ask(3, "b", 1)
    assert verdict == WAIT
    assert USE  # (the name the shell uses)


# === the shell, with real processes =============================================================

LINUX = sys.platform.startswith("linux")


def _workers_alive(server_pid: int) -> int:
    """Live worker processes under the fork server (zombies excluded)."""
    n = 0
    for pid in descendants(server_pid):
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                    n += 1
        except (FileNotFoundError, ProcessLookupError):  # (gone between the listing and the read)
            pass
    return n


@pytest.mark.timeout(180)
@pytest.mark.skipif(not LINUX, reason="/proc")
def test_twelve_threads_racing_a_cold_pool_of_two_never_see_a_third_worker():
    pool = WorkerPool(size=2)
    most = [0]
    lock = threading.Lock()

    def look(args):
        alive = len(pool.pids())
        if pool._server is not None:
            alive = max(alive, _workers_alive(pool._server.proc.pid))
        with lock:
            most[0] = max(most[0], alive)
        return alive

    tool = Tool("look", look)
    barrier = threading.Barrier(12)
    errors: list = []

    def one() -> None:
        barrier.wait(30)
        for _ in range(3):
            r = run_code("return await tools.look({})", [tool], runtime=pool, timeout=60, description="test")
            if r.error is not None:
                errors.append(r.error)

    try:
        threads = [threading.Thread(target=one) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        pool.close()
    assert errors == []
    assert 1 <= most[0] <= 2, most


class _Boom(BaseException):
    pass


@pytest.mark.timeout(300)
@pytest.mark.skipif(not LINUX, reason="/proc")
@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_a_keyboard_interrupt_anywhere_in_worker_start_up_leaks_nothing(monkeypatch, start_method):
    # Interrupt the n-th call, for every n, of each step a start-up makes.
    points = [
        (os, "pipe"),
        (procio.subprocess, "Popen"),
        (procio.socket, "send_fds"),
        (procio.socket, "recv_fds"),
        (procio.Worker, "hello"),
        (procio.select, "poll"),
        (os, "set_blocking"),
    ]
    pool = WorkerPool(size=1, spares=0, start_method=start_method)
    pool.prestart(1)  # the fork server (if any) is up; measure from here
    assert run_code("return 1", runtime=pool, description="test").result == 1
    base_fds = len(os.listdir("/proc/self/fd"))
    base_children = descendants(os.getpid())
    try:
        for owner, name in points:
            real = getattr(owner, name)
            for n in range(1, 4):
                calls = [0]

                def boom(*args, _real=real, _n=n, **kwargs):
                    calls[0] += 1
                    if calls[0] == _n:
                        raise _Boom
                    return _real(*args, **kwargs)

                monkeypatch.setattr(owner, name, boom)
                try:
                    run_code("return 2", runtime=pool, description="test")
                except _Boom:
                    pass
                finally:
                    monkeypatch.setattr(owner, name, real)
                assert run_code("return 3", runtime=pool, description="test").result == 3, (name, n)
                assert not pool._core.slots or all(s.state != "starting" for s in pool._core.slots.values())
        _settle(base_children)
        assert pool._reaped(30.0), "the spares thread reaps every discarded worker (and closes its pidfd)"
        assert len(os.listdir("/proc/self/fd")) <= base_fds
        assert descendants(os.getpid()) <= base_children | set(pool.pids()) | _server_tree(pool)
    finally:
        pool.close()


def _server_tree(pool: WorkerPool) -> set[int]:
    if pool._server is None:
        return set()
    return {pool._server.proc.pid} | {p for p in descendants(pool._server.proc.pid) if _is_zombie(p)}


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _settle(base: set[int]) -> None:
    """Wait (on pidfds) for every process started since ``base`` but already killed."""
    for pid in descendants(os.getpid()) - base:
        try:
            fd = os.pidfd_open(pid)
        except (ProcessLookupError, OSError):
            continue
        try:
            select.select([fd], [], [], 0.2)
        finally:
            os.close(fd)


assert poolcore.__all__


def test_a_run_that_would_wait_for_a_share_reserves_a_place_and_takes_the_spare_when_its_turn_comes():
    core = PoolCore(size=4, spares=1, runs_per_worker=3, cpu_shares=1)
    (spare,) = core.want_spares()
    core.started(spare, True)
    assert core.ask("a", FRESH, 1) == (USE, spare, None), "a share is free: the spare is taken at once"
    assert core.take_share("a", True)
    (second,) = core.want_spares()
    core.started(second, True)
    verdict, reserved, _ = core.ask("b", FRESH, 1)
    assert verdict == SPAWN and reserved != second, "b would wait for the share: it reserves a place"
    assert core.spares_ready() == 1 and core.slots[reserved].state == "starting"
    assert not core.take_share("b", True), "b waits for the share"
    core.give_share("a")
    assert core.share_head() == "b" and core.take_share("b", True)
    assert core.swap("b", reserved) == second, "its turn: the ready spare instead of a start-up"
    assert reserved not in core.slots and core.slots[second].holder == "b" and core.spares_ready() == 0
    assert core.swap("b", reserved) is None, "once"
    verdict, other, _ = core.ask("c", FRESH, 1)
    assert verdict == SPAWN
    assert core.drop("c") == [other] and other not in core.slots, "a reservation dropped is gone at once"

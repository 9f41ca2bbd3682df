"""When the spare a run took is replaced: once the run's start-up is over
(``SPARE_CALM`` after it first waits for a tool, and its calls have begun;
or as it ends), not beside
its first step, when another spare is still ready and nothing waits; at once
when it took the last spare ready. A held replacement is never kept from a
run that needs one. The core's rule (:meth:`PoolCore.hold`) is checked by
plain steps and by the pool core's state machine with holds taken and let
go; the shell's with real workers, through the core's states, never timing."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule
from test_pool_core import OneSharePoolMachine, PoolMachine

from nous_sched import Tool, WorkerPool, run_code
from nous_sched.runtime import pool as pool_module
from nous_sched.runtime.poolcore import FRESH, SPAWN, USE, WAIT, PoolCore
from nous_sched.throttle import Throttle

pytestmark = pytest.mark.timeout(120)

WAIT_S = 30.0


def _ready_core(spares: int, size: int = 6) -> PoolCore:
    core = PoolCore(size=size, spares=spares, runs_per_worker=3)
    for wid in core.want_spares():
        core.started(wid, True)
    assert core.spares_ready() == spares
    return core


def test_a_run_that_takes_a_spare_with_another_ready_holds_its_replacement_until_its_start_up_is_over():
    core = _ready_core(spares=2)
    verdict, wid, _ = core.ask("a", FRESH, 1)
    assert verdict == USE and wid is not None
    assert core.hold("a", wid), "another spare is ready: the replacement waits"
    assert core.want_spares() == [], "held back: no spare is started beside the run's start-up"
    assert core.calm("a") and not core.calm("a"), "once"
    assert len(core.want_spares()) == 1, "its start-up is over: the replacement starts"


def test_a_run_that_ends_lets_its_hold_go():
    core = _ready_core(spares=2)
    _, wid, _ = core.ask("a", FRESH, 1)
    assert wid is not None and core.hold("a", wid)
    assert not core.release(wid, FRESH, False)
    assert not core.held and len(core.want_spares()) == 1, "it ended before it waited: the replacement starts"
    _, other, _ = core.ask("b", FRESH, 1)
    assert other is not None and core.hold("b", other) is False, "the last spare ready: nothing is held"


def test_a_run_interrupted_lets_its_hold_go():
    core = _ready_core(spares=2)
    _, wid, _ = core.ask("a", FRESH, 1)
    assert wid is not None and core.hold("a", wid)
    assert core.drop("a") == [wid]
    assert not core.held and len(core.want_spares()) == 1


def test_a_run_that_takes_the_last_spare_ready_holds_nothing():
    core = _ready_core(spares=1)
    verdict, wid, _ = core.ask("a", FRESH, 1)
    assert verdict == USE and wid is not None
    assert not core.hold("a", wid), "a run that follows would find none ready"
    assert len(core.want_spares()) == 1, "replaced at once"


def test_a_reused_worker_or_a_runs_own_holds_nothing():
    core = _ready_core(spares=2)
    _, wid, _ = core.ask("a", "dom", 1)
    assert wid is not None and core.hold("a", wid)  # (a domain's first run takes a spare like any)
    core.release(wid, "dom", True)
    assert not core.held
    assert core.ask("b", "dom", 1) == (USE, wid, None)
    assert not core.hold("b", wid), "a warm worker of the domain is no spare: nothing to replace"
    assert not core.hold("c", wid), "only the run it was handed to"


def test_a_run_that_finds_no_idle_worker_lets_every_hold_go():
    core = _ready_core(spares=2, size=8)
    _, a, _ = core.ask("a", FRESH, 1)
    assert a is not None and core.hold("a", a)
    _, b, _ = core.ask("b", FRESH, 1)
    assert b is not None and not core.hold("b", b), "the last one ready"
    (b_replacement,) = core.want_spares()
    verdict, _, _ = core.ask("c", FRESH, 1)
    assert verdict == WAIT, "it waits for the spare on its way"
    assert not core.held, "a run that found none ready: a's replacement is wanted now"
    assert core.want_spares() == [], "(a run waits: it takes the places itself)"
    core.started(b_replacement, True)
    assert core.ask("c", FRESH, 1)[0] == USE
    assert len(core.want_spares()) >= 1, "a's replacement, held no more"


def test_a_run_that_would_wait_for_a_share_lets_every_hold_go():
    core = PoolCore(size=6, spares=2, runs_per_worker=3, cpu_shares=1)
    for wid in core.want_spares():
        core.started(wid, True)
    _, a, _ = core.ask("a", FRESH, 1)
    assert a is not None and core.hold("a", a)
    assert core.take_share("a", True)
    verdict, _, _ = core.ask("b", FRESH, 1)
    assert verdict == SPAWN, "b would wait for the share"
    assert not core.held
    assert not core.take_share("b", True)
    _, c, _ = core.ask("c", "dom", 1)
    assert c is not None and not core.hold("c", c), "a run waits for a share: the replacement is wanted"


def test_the_pool_asked_for_its_spares_lets_every_hold_go():
    core = _ready_core(spares=2)
    _, a, _ = core.ask("a", FRESH, 1)
    assert a is not None and core.hold("a", a)
    assert core.release_holds() and not core.release_holds()
    assert len(core.want_spares()) == 1


class HoldingPoolMachine(PoolMachine):
    """The pool core's state machine with the shell's holds: every run handed
    a worker asks to hold its replacement; start-ups end, the pool asks for
    its spares. Every invariant of the pool core holds with them, and a hold
    is only ever a run's that holds a place, never while runs wait for one."""

    def _ask(self, run: int, domain: object) -> None:
        had = run in self.holding
        super()._ask(run, domain)
        if run in self.holding and not had:
            wid = self.holding[run][0]
            held = self.core.hold(run, wid)
            assert not held or wid not in self.reserved, "a run's own process is no spare"

    @rule()
    def spares_are_started_and_say_hello(self) -> None:
        # (so that runs meet two spares ready, the case a hold is for)
        wanted = self.core.spares_wanted()
        wids = self.core.want_spares()
        assert len(wids) == wanted, "spares_wanted counts what want_spares reserves"
        assert self.core.spares_wanted() == 0, "and reserves nothing itself"
        for wid in wids:
            self.core.started(wid, True)

    @precondition(lambda self: self.core.held)
    @rule(data=st.data())
    def a_run_s_start_up_ends(self, data: st.DataObject) -> None:
        run = data.draw(st.sampled_from(sorted(self.core.held)))
        assert self.core.calm(run)

    @rule()
    def the_pool_is_asked_for_its_spares(self) -> None:
        self.core.release_holds()

    @invariant()
    def a_hold_is_a_run_s_that_holds_a_place(self) -> None:
        for run in self.core.held:
            assert self.core.holds(run), run
            assert run in self.holding

    @invariant()
    def nothing_is_held_while_runs_wait_for_a_place(self) -> None:
        assert not (self.core.held and self.core.waiting)

    @invariant()
    def a_run_holds_at_most_one_and_never_more_than_the_spares(self) -> None:
        assert len(self.core.held) <= self.core.target


HoldingPoolMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_the_pool_core_state_machine_with_holds = HoldingPoolMachine.TestCase


class HoldingOneSharePoolMachine(HoldingPoolMachine, OneSharePoolMachine):
    """The same with one CPU share and room beside it (runs queue for the
    share with places reserved; spares say hello as they are started)."""


HoldingOneSharePoolMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_the_pool_core_state_machine_with_holds_and_one_share = HoldingOneSharePoolMachine.TestCase


# -- the shell, with real workers ----------------------------------------------------


def _spares_on_their_way_or_ready(pool: WorkerPool) -> int:
    with pool._lock:
        return sum(
            1
            for s in pool._core.slots.values()
            if s.for_run is None and s.domain is FRESH and s.state in ("starting", "idle")
        )


def _until(check, timeout: float = WAIT_S) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.002)
    return check()


def test_the_replacement_is_not_started_before_the_run_first_waits_and_is_started_as_it_ends(monkeypatch):
    monkeypatch.setattr(pool_module, "SPARE_CALM", 3600.0)  # (held until the run ends)
    seen: list[int] = []
    go = threading.Event()

    with WorkerPool(size=4, spares=2) as pool:
        assert pool.wait_for_spares(WAIT_S)

        def blocked(args: dict) -> int:
            # The run waits for this call: its start-up is over, and the
            # replacement is held for the hour. With the replacement started as
            # the spare was taken, a second spare would be on its way by now.
            _until(lambda: _spares_on_their_way_or_ready(pool) > 1, 0.5)
            seen.append(_spares_on_their_way_or_ready(pool))
            go.wait(WAIT_S)
            return 1

        def run() -> None:
            out.append(
                run_code("return await tools.blocked({})", [Tool("blocked", blocked)], runtime=pool, description="t")
            )

        out: list = []
        t = threading.Thread(target=run)
        t.start()
        assert _until(lambda: bool(seen)), "the tool ran"
        assert seen == [1], "only the other spare: the one the run took is not replaced yet"
        go.set()
        t.join(WAIT_S)
        assert out and out[0].error is None and out[0].result == 1
        assert _until(lambda: _spares_on_their_way_or_ready(pool) == 2), "replaced as the run ended"


def test_the_replacement_starts_while_the_run_still_waits_for_its_tool():
    seen: list[bool] = []

    with WorkerPool(size=4, spares=2) as pool:
        assert pool.wait_for_spares(WAIT_S)

        def slow(args: dict) -> int:
            # SPARE_CALM after the run first waited, its spare's replacement starts.
            seen.append(_until(lambda: _spares_on_their_way_or_ready(pool) == 2))
            return 1

        result = run_code("return await tools.slow({})", [Tool("slow", slow)], runtime=pool, description="t")
        assert result.error is None and result.result == 1
        assert seen == [True], "the worker's run said when it first waited (drive's idle hook)"


def test_the_replacement_waits_for_the_calls_the_run_made_to_begin(monkeypatch):
    # Two calls through a throttle of one place: the second cannot begin while
    # the first runs. Its run's replacement waits for it (Host.when_begun), as
    # it waits for a wide fan-out's calls to reach their tool threads.
    monkeypatch.setattr(pool_module, "SPARE_BEGUN_LIMIT", 3600.0)
    db = Throttle("db", max_running=1)
    held: list[bool] = []
    started: list[bool] = []

    with WorkerPool(size=4, spares=2) as pool:
        assert pool.wait_for_spares(WAIT_S)

        def first(args: dict) -> int:
            # Long past SPARE_CALM: the replacement would be on its way by now.
            held.append(not _until(lambda: _spares_on_their_way_or_ready(pool) > 1, 0.5))
            return 1

        def second(args: dict) -> int:
            started.append(_until(lambda: _spares_on_their_way_or_ready(pool) == 2))
            return 2

        safe = lambda a: True  # noqa: E731
        tools = [
            Tool("first", first, throttles=(db,), concurrency_safe=safe),
            Tool("second", second, throttles=(db,), concurrency_safe=safe),
        ]
        program = "const [a, b] = await Promise.all([tools.first({}), tools.second({})]); return a + b;"
        result = run_code(program, tools, runtime=pool, description="t")
        assert result.error is None and result.result == 3
        assert held == [True], "the second call had not begun: the replacement waited"
        assert started == [True], "it began: the replacement started while the run still waited"


def test_a_run_that_took_the_last_spare_ready_has_it_replaced_at_once(monkeypatch):
    monkeypatch.setattr(pool_module, "SPARE_CALM", 3600.0)
    seen: list[bool] = []

    with WorkerPool(size=4, spares=1) as pool:
        assert pool.wait_for_spares(WAIT_S)

        def where(args: dict) -> int:
            seen.append(_until(lambda: _spares_on_their_way_or_ready(pool) == 1))
            return 1

        result = run_code("return await tools.where({})", [Tool("where", where)], runtime=pool, description="t")
        assert result.error is None and seen == [True], "no spare was left ready: replaced during the run"


def test_waiting_for_the_spares_starts_a_held_replacement(monkeypatch):
    monkeypatch.setattr(pool_module, "SPARE_CALM", 3600.0)
    answers: list[bool] = []

    with WorkerPool(size=4, spares=2) as pool:
        assert pool.wait_for_spares(WAIT_S)

        def asks(args: dict) -> int:
            answers.append(pool.wait_for_spares(WAIT_S))
            return 1

        result = run_code("return await tools.asks({})", [Tool("asks", asks)], runtime=pool, description="t")
        assert result.error is None and answers == [True]


def test_a_run_that_holds_its_replacement_does_not_wake_the_lingering_spares_thread_at_its_start(monkeypatch):
    # The spares thread, lingering, has nothing to do when a run takes a spare
    # and holds its replacement back: a wake-up then would only take a CPU and
    # the GIL beside the run's first step. Woken later (its start-up over, or
    # it ends) it starts the replacement.
    monkeypatch.setattr(pool_module, "SPARES_LINGER", 3600.0)  # (it lingers for the whole test)
    monkeypatch.setattr(pool_module, "SPARE_CALM", 3600.0)  # (held until the run ends)
    wakers: list[str] = []
    seen: list[list[str]] = []

    with WorkerPool(size=4, spares=2) as pool:
        assert pool.wait_for_spares(WAIT_S)
        assert _until(lambda: pool._spare_thread is not None), "the spares thread lingers"
        notify = pool._notify

        def counted() -> None:
            wakers.append(sys._getframe(1).f_code.co_name)
            notify()

        monkeypatch.setattr(pool, "_notify", counted)

        def look(args: dict) -> int:
            seen.append(list(wakers))
            return 1

        result = run_code("return await tools.look({})", [Tool("look", look)], runtime=pool, description="t")
        assert result.error is None and result.result == 1
        # (Its start-up over, the run may have said so already: _calm, which sets the hold's time.)
        assert len(seen) == 1 and "_top_up" not in seen[0], f"nothing woke the spares thread as the run began: {seen}"
        assert "_top_up" in wakers, "woken as the run ended: a worker to kill, a replacement to start"
        assert _until(lambda: _spares_on_their_way_or_ready(pool) == 2), "replaced as the run ended"

"""``Scheduler.when_begun``: told once every call handed to a tool has begun
(or will not), or the scheduler stops; what the worker pool waits for before
it starts the replacement of the spare a run took
(``tests/test_pool_replacement.py``). Every check waits on events the tools
and callbacks set, never on time."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import Any, Callable

import pytest

from nous_sched import ConfigError, Scheduler, Tool
from nous_sched.throttle import Throttle

pytestmark = pytest.mark.timeout(60)

WAIT = 30.0


class GatedExecutor(concurrent.futures.Executor):
    """Runs each task on a thread of its own, once the test lets it go (``go(i)``)."""

    def __init__(self) -> None:
        self.gates: list[threading.Event] = []
        self.threads: list[threading.Thread] = []
        self.submitted = threading.Condition()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        gate = threading.Event()
        with self.submitted:
            self.gates.append(gate)
            self.submitted.notify_all()

        def run() -> None:
            gate.wait(WAIT)
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)

        thread = threading.Thread(target=run, daemon=True)
        self.threads.append(thread)
        thread.start()
        return future

    def go(self, i: int) -> None:
        """Let task ``i`` run, once the scheduler has handed it over."""
        with self.submitted:
            assert self.submitted.wait_for(lambda: len(self.gates) > i, WAIT)
        self.gates[i].set()


def _until_exited(sched: Scheduler) -> bool:
    """Whether the scheduler's driver has taken its last message (a stopped one's ``lane_state`` answers at once)."""
    return sched.lane_state(WAIT) is not None


def _told() -> tuple[threading.Event, Callable[[], None]]:
    told = threading.Event()
    return told, told.set


def test_a_then_that_is_not_callable_is_a_config_error_naming_it():
    with Scheduler() as sched:
        with pytest.raises(ConfigError, match=r"Scheduler.when_begun: `then` must be callable"):
            sched.when_begun("soon")  # type: ignore[arg-type]


def test_with_no_call_waiting_to_begin_it_is_told_at_once():
    with Scheduler() as sched:
        told, then = _told()
        sched.when_begun(then)
        assert told.wait(WAIT)


def test_it_is_told_when_the_last_call_handed_over_begins_not_before():
    executor = GatedExecutor()
    told, then = _told()
    seen: dict[str, bool] = {}
    first_running = threading.Event()
    release = threading.Event()

    def first(args: dict) -> int:
        seen["first"] = told.is_set()
        first_running.set()
        release.wait(WAIT)
        return 1

    second_ran = threading.Event()

    def second(args: dict) -> int:
        seen["second"] = told.is_set()  # Begin told it, before the tool's first line
        second_ran.set()
        return 2

    safe = lambda a: True  # noqa: E731
    with Scheduler(executor=executor, max_parallel=2) as sched:
        a = sched.submit(Tool("first", first, concurrency_safe=safe), {})
        b = sched.submit(Tool("second", second, concurrency_safe=safe), {})
        sched.when_begun(then)
        assert sched.lane_state(WAIT) is not None  # (the driver takes its messages in order: it has the ask now)
        executor.go(0)
        assert first_running.wait(WAIT)
        assert not told.is_set() and seen == {"first": False}, "the second call has not begun"
        executor.go(1)
        assert second_ran.wait(WAIT) and seen["second"] is True
        release.set()
        assert sched.wait(a).value == 1 and sched.wait(b).value == 2


def test_calls_held_back_by_max_parallel_are_not_waited_for():
    told, then = _told()
    release = threading.Event()
    began: list[bool] = []

    def slow(args: dict) -> int:
        began.append(told.is_set())
        release.wait(WAIT)
        return 1

    with Scheduler(max_parallel=1) as sched:
        tool = Tool("slow", slow, concurrency_safe=lambda a: True)
        tickets = [sched.submit(tool, {}) for _ in range(3)]
        sched.when_begun(then)
        assert told.wait(WAIT), "the one call handed over began: the two held back are not waited for"
        release.set()
        assert [sched.wait(t).value for t in tickets] == [1, 1, 1]


def test_a_call_that_finishes_without_beginning_counts_as_begun():
    # The second call waits for its throttle's one place until the run's
    # deadline passes: it ends without beginning, and then nothing is left to begin.
    db = Throttle("db", max_running=1)
    release = threading.Event()
    told, then = _told()

    def hold(args: dict) -> int:
        release.wait(WAIT)
        return 1

    with Scheduler(max_parallel=2, timeout=WAIT) as sched:
        safe = lambda a: True  # noqa: E731
        first = sched.submit(Tool("hold", hold, throttles=(db,), concurrency_safe=safe), {})
        queued = sched.submit(Tool("q", lambda a: 2, throttles=(db,), concurrency_safe=safe), {}, _Deadline(0.05))
        sched.when_begun(then)
        assert told.wait(WAIT), "the refused call will never begin: nothing is left to wait for"
        release.set()
        assert sched.wait(first).value == 1
        outcome = sched.wait(queued)  # (committed after the first: in submission order)
        assert not outcome.ok and "deadline passed while waiting for throttle 'db'" in outcome.error.message


class _Deadline:
    """A run context whose deadline is ``seconds`` from now (what ``Begin`` reads)."""

    def __init__(self, seconds: float) -> None:
        import time

        self.deadline = time.monotonic() + seconds


def test_a_scheduler_that_stops_tells_every_waiting_callback_and_a_later_one_at_once():
    executor = GatedExecutor()
    told, then = _told()
    sched = Scheduler(executor=executor)
    sched.submit(Tool("never", lambda a: 1), {})
    sched.when_begun(then)
    assert not told.wait(0.05)
    sched.stop()
    assert told.wait(WAIT), "stopped: no call will begin"
    late, then_late = _told()
    sched.when_begun(then_late)
    assert late.is_set(), "told at once, on this thread: the scheduler has stopped"
    executor.go(0)


def test_what_a_callback_raises_is_logged_and_the_others_are_told(caplog):
    told, then = _told()

    def bad() -> None:
        raise ValueError("boom")

    with caplog.at_level(logging.WARNING, logger="nous_sched"), Scheduler() as sched:
        sched.when_begun(bad)
        sched.when_begun(then)
        assert told.wait(WAIT)
        ticket = sched.submit(Tool("ok", lambda a: 3), {})
        assert sched.wait(ticket).value == 3, "the scheduler goes on"
    assert any("when_begun callback raised" in r.getMessage() for r in caplog.records)


def test_an_ask_queued_before_a_stop_starts_no_call_after_it():
    # The driver is held in a call's concurrency_safe predicate while the ask
    # and stop() are queued behind it: once it is let go, it hands nothing to
    # a tool (stop() has begun), and the ask is told all the same.
    executor = GatedExecutor()
    release = threading.Event()
    in_predicate = threading.Event()
    told, then = _told()

    def predicate(args: dict) -> bool:
        in_predicate.set()
        release.wait(WAIT)
        return True

    sched = Scheduler(executor=executor)
    sched.submit(Tool("stuck", lambda a: 1, concurrency_safe=predicate), {})
    assert in_predicate.wait(WAIT)
    sched.when_begun(then)
    sched.stop(timeout=0.05)  # (the driver does not answer in time: stop() returns, the driver is left to end)
    release.set()
    assert told.wait(WAIT)
    assert _until_exited(sched)
    with executor.submitted:
        assert executor.gates == [], "no call was handed to a tool after stop() began"

"""A ticket's lock is made by its first waiter, and every waiter still passes.

Most of a batch's tickets are taken once ``done()`` and never waited on, so a
ticket makes its lock only when someone waits; a wait before the publish, one
after it, several at once and one that times out all behave as before.
"""

from __future__ import annotations

import threading

from nous_sched import Outcome, Scheduler, Tool
from nous_sched.scheduler import Ticket

WAIT = 10.0


def _publish(ticket: Ticket, outcome: Outcome) -> None:
    ticket._publish(outcome)  # noqa: SLF001  (the scheduler's own act, done here by hand)


def test_a_wait_after_the_publish_returns_the_outcome_at_once():
    ticket = Ticket("t")
    outcome = Outcome.success(1)
    _publish(ticket, outcome)
    assert ticket.done()
    assert ticket.wait(0.0) is outcome
    assert ticket.wait() is outcome


def test_every_waiter_before_the_publish_passes():
    ticket = Ticket("t")
    outcome = Outcome.success(2)
    got: list[object] = []
    waiting = threading.Barrier(5)

    def waiter() -> None:
        waiting.wait(WAIT)
        got.append(ticket.wait(WAIT))

    threads = [threading.Thread(target=waiter) for _ in range(4)]
    for t in threads:
        t.start()
    waiting.wait(WAIT)
    _publish(ticket, outcome)
    for t in threads:
        t.join(WAIT)
    assert got == [outcome] * 4
    assert ticket.wait(0.0) is outcome  # and any waiter after them


def test_a_wait_that_times_out_leaves_the_ticket_to_a_later_one():
    ticket = Ticket("t")
    assert ticket.wait(0.01) is None
    assert not ticket.done()
    outcome = Outcome.failure("t", "no")
    threading.Timer(0.05, _publish, (ticket, outcome)).start()
    assert ticket.wait(WAIT) is outcome


def test_on_done_is_told_once_the_outcome_is_there():
    ticket = Ticket("t")
    seen: list[bool] = []
    ticket.on_done(lambda: seen.append(ticket.done()))
    _publish(ticket, Outcome.success(3))
    assert seen == [True]


def test_a_ticket_waited_on_again_after_its_commit_answers_each_time():
    scheduler = Scheduler()
    try:
        ticket = scheduler.submit(Tool("one", lambda args: 1), {})
        first = scheduler.wait(ticket, timeout=WAIT)
        assert first.ok and first.value == 1
        # Each later wait finds the outcome (no gate left held by the first look).
        assert scheduler.wait(ticket, timeout=0.5) is first
        assert scheduler.wait(ticket, timeout=0.5) is first
        assert ticket.wait(0.0) is first
    finally:
        scheduler.stop()

import threading

import pytest

from nous_sched import Scheduler


@pytest.fixture
def make_scheduler():
    """``make_scheduler(**options)``: a Scheduler (timeout 30 s unless given), stopped at teardown."""
    made = []

    def make(**options):
        options.setdefault("timeout", 30)
        scheduler = Scheduler(**options)
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        scheduler.stop(timeout=10)


@pytest.fixture
def make_event(make_scheduler):
    """``make_event()``: a threading.Event that is set at teardown, before any scheduler is stopped.

    Tools and predicates block on these, so no test leaves a thread waiting.
    """
    events = []

    def make():
        event = threading.Event()
        events.append(event)
        return event

    yield make
    for event in events:
        event.set()

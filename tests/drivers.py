"""Driver threads, as the tests see them.

A scheduler's driver is a thread borrowed from the process's warm driver
threads (``nous_sched.scheduler._driver_threads``) and named ``nous-sched-driver-<n>``
while it drives scheduler ``<n>``; when the scheduler stops, ``stop()`` waits
until the thread is done with it, and the thread goes back idle
(``nous-sched-idle-driver-<k>``), or exits when enough are idle. So "the lane
is dead" is checked as: no thread bears the scheduler's driver name any more,
and the thread that did is idle, exited or driving another scheduler; never
still on the stopped one (a leak).
"""

from __future__ import annotations

import threading
from typing import Iterable

from nous_sched.scheduler._driver_threads import IDLE_PREFIX, shared

DRIVING = "nous-sched-driver-"
IDLE = IDLE_PREFIX + "-"

Driver = tuple[threading.Thread, str]  # a thread and the driver name it bore when captured


def driving() -> set[Driver]:
    """Every thread now driving a scheduler, with its name."""
    return {(t, t.name) for t in threading.enumerate() if t.name.startswith(DRIVING)}


def of(scheduler) -> Driver:
    """The thread driving ``scheduler`` (it bears the scheduler's driver name
    from the moment ``Scheduler()`` returns) and that name."""
    name = scheduler._name
    assert name.startswith(DRIVING) and name in repr(scheduler)
    found = [t for t in threading.enumerate() if t.name == name]
    assert len(found) == 1, f"{name}: {found}"
    return found[0], name


def me() -> Driver:
    """The calling thread and its name (an observer calls it: observers run on the driver)."""
    thread = threading.current_thread()
    assert thread.name.startswith(DRIVING), thread.name
    return thread, thread.name


def assert_released(captured: Iterable[Driver]) -> None:
    """Every captured driver is done with the scheduler it drove: no thread
    bears that driver's name now, and its thread is idle in the shared set,
    exited, or driving some other scheduler (not leaked)."""
    captured = list(captured)
    assert captured, "no scheduler driver thread was captured"
    names_now = {t.name for t in threading.enumerate()}
    still = sorted(name for _, name in captured if name in names_now)
    assert not still, f"scheduler driver(s) still driving their stopped scheduler: {still}"
    pool = set(shared().threads())
    for thread, name in captured:
        if not thread.is_alive():
            continue  # it exited (more idle threads than the set keeps)
        assert thread.name.startswith((IDLE, DRIVING)), f"{name} became {thread.name}"
        if thread.name.startswith(IDLE) and thread not in pool:
            thread.join(10.0)  # it left the set (retired or idle too long): it is on its way out
            assert not thread.is_alive(), f"{thread.name} is out of the shared set but alive: leaked"


def released(scheduler, driver: Driver) -> None:
    """``scheduler`` has stopped and ``driver`` (captured while it drove it) is done with it."""
    assert scheduler._wait_driver(0), f"{scheduler._name} still has its driver"
    assert_released([driver])

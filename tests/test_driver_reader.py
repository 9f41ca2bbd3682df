"""The scheduler's driver reading a run's pipe (``Scheduler.attach_reader``):
it sleeps in poll over the pipe and its own queue, calls ``readable()`` on
its own thread whenever the pipe has data, drops the pipe once that answers
False, and still hears every message (a tool's report, a submit, stop)
while it polls."""

from __future__ import annotations

import os
import threading
from typing import Any

from polling import until

from nous_sched import Scheduler, Tool


def echo(args: dict[str, Any]) -> Any:
    return args["x"]


ECHO = Tool("echo", echo, concurrency_safe=lambda args: True)


def test_the_driver_reads_an_attached_pipe_on_its_own_thread_until_told_to_drop_it() -> None:
    r, w = os.pipe()
    seen: list[tuple[bytes, str]] = []
    done = threading.Event()

    def readable() -> bool:
        data = os.read(r, 100)
        seen.append((data, threading.current_thread().name))
        if data == b"last":
            done.set()
            return False
        return True

    try:
        with Scheduler() as sched:
            assert sched.attach_reader(r, readable, lambda: None)
            # Calls go on while the driver polls: each report pokes it.
            for i in range(20):
                assert sched.call(ECHO, {"x": i}).value == i
            os.write(w, b"one")
            assert until(lambda: len(seen) == 1)
            assert sched.call(ECHO, {"x": "after"}).value == "after"
            os.write(w, b"last")
            assert done.wait(10)
            os.write(w, b"unread")  # dropped: the driver never reads it again
            assert sched.call(ECHO, {"x": 1}).value == 1
            assert [data for data, _ in seen] == [b"one", b"last"]
            assert {name for _, name in seen} == {f"nous-sched-driver-{sched._n}"}  # noqa: SLF001
        assert os.read(r, 100) == b"unread"
    finally:
        os.close(r)
        os.close(w)


def test_stop_wakes_a_driver_polling_an_attached_pipe_and_nothing_is_called_after() -> None:
    r, w = os.pipe()
    calls = []
    try:
        sched = Scheduler()
        gone = []
        assert sched.attach_reader(r, lambda: calls.append(1) or True, lambda: gone.append(1))
        assert sched.call(ECHO, {"x": 0}).value == 0  # the driver is polling now
        sched.stop(timeout=10)
        os.write(w, b"late")
        assert sched.lane_state() is not None  # (the final state, at once)
        assert calls == []
        assert gone == [1]  # told once, as the driver wound down
        assert not sched.attach_reader(r, lambda: True, lambda: None)  # stopped: refused
    finally:
        os.close(r)
        os.close(w)

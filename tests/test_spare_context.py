"""The in-process runtime's spare context (``nous_sched/runtime/spare.py``).

Each promise of the module's docstring: a spare is fresh and handed to one run
only, ``take`` never waits for one, the preparing thread is named and exits
when idle, and a forked child starts with none. Waits are on the module's own
condition (``ready``) or a thread's join, bounded generously; no sleeps.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import threading

from nous_sched import QuickJSRuntime, Tool, run_code
from nous_sched.runtime import spare

WAIT = 30.0
PRELUDE = "nous-sched-prelude-"


def _preparers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(PRELUDE)]


def _held() -> tuple:
    """A spare, made for this test: asked for, waited for."""
    spare.take()
    assert spare.ready(WAIT), "a spare is made once one is asked for"
    return spare._spare


def test_a_spare_is_handed_to_one_taker_only():
    made = _held()
    first = spare.take()
    assert first is made
    second = spare.take()  # the next one may be ready already, but is another context
    assert second is not first
    if second is not None:
        assert second[0] is not first[0]


def test_take_never_waits_for_a_spare(monkeypatch):
    gate = threading.Event()
    entered = threading.Event()
    real = spare.prepare

    def slow():
        entered.set()
        assert gate.wait(WAIT)
        return real()

    _held()  # nothing left in the making from an earlier test: the thread waits for a request
    spare.discard()
    monkeypatch.setattr(spare, "prepare", slow)
    try:
        spare.take()  # asks for one: the preparing thread now blocks in `slow`
        assert entered.wait(WAIT)
        assert spare.take() is None, "none is ready, and take() returned without waiting for it"
    finally:
        gate.set()
    assert spare.ready(WAIT)


def test_a_run_on_a_spare_sees_a_fresh_sandbox():
    tool = Tool("noop", lambda args: 1, concurrency_safe=lambda args: True)
    rt = QuickJSRuntime()
    _held()
    first = run_code(
        "globalThis.left = 7; Object.prototype.polluted = 1; return await tools.noop({});",
        [tool],
        runtime=rt,
        description="test",
    )
    assert first.ok and first.result == 1, first.error
    _held()  # the next run is given the spare made while the first ran
    second = run_code(
        "return [typeof left, ({}).polluted === undefined, Object.keys(tools), performance.now() >= 0];",
        [tool],
        runtime=rt,
        description="test",
    )
    assert second.ok, second.error
    assert second.result == ["undefined", True, ["noop"], True]


def test_the_preparing_thread_is_named_and_exits_when_idle(monkeypatch):
    gate = threading.Event()
    real = spare.prepare

    def held():
        assert gate.wait(WAIT)
        return real()

    for t in _preparers():  # one from an earlier test exits on its own idle wait
        t.join(WAIT)
    monkeypatch.setattr(spare, "IDLE_SECONDS", 0.01)
    monkeypatch.setattr(spare, "prepare", held)
    spare.discard()
    try:
        spare.take()  # starts the thread, which now waits in `held`
        threads = _preparers()
        assert len(threads) == 1 and threads[0].daemon
        assert re.fullmatch(PRELUDE + r"\d+", threads[0].name)
    finally:
        gate.set()
    threads[0].join(WAIT)
    assert not threads[0].is_alive(), "no request came: it exited"
    assert spare._spare is not None, "the spare it made stays for the next run"
    monkeypatch.undo()
    assert spare.take() is not None  # and a later take() starts a new one for the next
    assert spare.ready(WAIT)


FORK_SCRIPT = textwrap.dedent(
    """
    import os
    from nous_sched.runtime import spare
    spare.take()
    assert spare.ready(30)
    pid = os.fork()
    if pid == 0:
        code = 0 if spare._spare is None and spare.take() is None else 3
        code = code if spare.ready(30) else 5  # and it can make its own
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status))
    """
)


def test_a_forked_child_starts_with_no_spare():
    done = subprocess.run([sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"

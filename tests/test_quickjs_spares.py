"""The in-process runtime's spare contexts: a run's start-up (a fresh context,
the prelude evaluated) is made while an earlier run waited for its tools.

What a caller may rely on (``nous_sched.runtime.quickjs``): each run still
gets a context no program ran in, whichever thread made it; a run that
waits for a tool makes one for a later run, never more than ``SPARES``
wait; a forked child starts with none. Tools block on Events, never
on sleeps the assertions depend on.
"""

from __future__ import annotations

import os
import threading

import pytest

from nous_sched import Limits, QuickJSRuntime, Tool, run_code
from nous_sched.runtime import quickjs

WAIT = 10.0


@pytest.fixture(autouse=True)
def no_spares():
    quickjs._spares.clear()
    yield
    quickjs._spares.clear()


def gated() -> tuple[Tool, threading.Event]:
    """A tool that returns once its event is set: a first call that runs as long as the test says."""
    gate = threading.Event()

    def wait(args):
        assert gate.wait(WAIT)
        return "late"

    return Tool("wait", wait), gate


def run(code: str, tools=(), **kw):
    return run_code(code, list(tools), runtime=QuickJSRuntime(), description="spares", timeout=WAIT, **kw)


def release_after_spare(gate: threading.Event, before: int) -> threading.Thread:
    """Set ``gate`` once the run waiting on it has made its spare (``before`` + 1 wait)."""

    def watch():
        for _ in range(int(WAIT / 0.001)):
            if len(quickjs._spares) > before:
                break
            threading.Event().wait(0.001)
        gate.set()

    t = threading.Thread(target=watch, name="nous-sched-test-spare-watch", daemon=True)
    t.start()
    return t


def test_a_run_waiting_on_a_tool_makes_the_next_runs_context_and_the_next_run_takes_it():
    tool, gate = gated()
    watcher = release_after_spare(gate, 0)
    r = run("return await tools.wait({});", [tool])
    watcher.join(WAIT)
    assert r.ok and r.result == "late", r.error
    assert len(quickjs._spares) == 1
    r = run("return 1 + 1;")  # waits for nothing: takes the spare, makes none
    assert r.ok and r.result == 2, r.error
    assert quickjs._spares == []


def test_a_spare_carries_nothing_of_the_run_that_made_it():
    tool, gate = gated()
    watcher = release_after_spare(gate, 0)
    r = run(
        "globalThis.leak = 'run one'; Object.prototype.polluted = 1; console.log('one'); return await tools.wait({});",
        [tool],
    )
    watcher.join(WAIT)
    assert r.ok, r.error
    assert len(quickjs._spares) == 1
    r = run("console.log('two'); return [typeof leak, typeof ({}).polluted, typeof tools.wait];")
    assert r.ok, r.error
    assert quickjs._spares == []  # it ran on the spare
    assert r.result == ["undefined", "undefined", "function"]
    assert r.logs == ("two",)


def test_a_spare_made_on_one_thread_keeps_the_stack_bound_of_the_thread_that_runs_it():
    # The spare is made on a helper thread; the recursion runs on this one, with its own bound.
    tool, gate = gated()
    box = []

    def first():
        box.append(run("return await tools.wait({});", [tool]))

    maker = threading.Thread(target=first, name="nous-sched-test-spare-maker")
    watcher = release_after_spare(gate, 0)
    maker.start()
    maker.join(WAIT)
    watcher.join(WAIT)
    assert box and box[0].ok, box
    assert len(quickjs._spares) == 1
    r = run("function f(n) { return f(n + 1) + 1; } return f(0);", limits=Limits(timeout=WAIT))
    assert quickjs._spares == []
    assert r.error is not None and r.error.kind == "abort" and "stack" in r.error.message, r.error


def test_never_more_than_spares_wait():
    tool, gate = gated()
    for _ in range(quickjs.SPARES + 1):
        quickjs._spares.append(quickjs.prepare())
    # The run takes one, leaving SPARES; its call runs well past SPARE_AFTER, and it makes none.
    timer = threading.Timer(quickjs.SPARE_AFTER * 50, gate.set)
    timer.start()
    r = run("return await tools.wait({});", [tool])
    timer.join(WAIT)
    assert r.ok, r.error
    assert len(quickjs._spares) == quickjs.SPARES


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_starts_with_no_spares():
    quickjs._spares.append(quickjs.prepare())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report how many it has, and exit without running anything else
        try:
            os.write(write, str(len(quickjs._spares)).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        said = os.read(read, 16)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert said == b"0"
    assert len(quickjs._spares) == 1

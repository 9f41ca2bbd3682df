"""Settles in batches, end to end (``runtime/engine.py`` ``drive``; the worker's
relay, ``runtime/pool.py`` ``Relay``).

What is promised, and checked here on both runtimes:

* a batch of settles gives the program exactly the steps that one settle per
  frame gives: the same trace where it depends on microtask interleaving,
  the same logs, result, calls and answers, in the same order;
* the committed prefix goes as one batch (one frame to a worker);
* with the worker runtime, the thread that commits the oldest call writes the
  settle frame itself; it never waits on the worker, stuck or stopped, and a
  frame the pipe cannot hold is finished by the run's own thread;
* a deadline or a cancel that lands inside a batch ends the run with the logs
  of every step the program took.

Nothing sleeps to synchronise: tools block on Events and Barriers, and the
tests wait on those; the one state no event reports (every thread of a
stopped worker stopped) is polled on /proc. Bounds on time are generous (a
loaded 2-core machine).
"""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest
from polling import until
from procs import stopped

from nous_sched import Limits, Outcome, QuickJSRuntime, Tool, WorkerPool, run_code
from nous_sched.runtime import Host, Settled
from nous_sched.runtime import _remote as remote_module
from nous_sched.runtime import engine as engine_module
from nous_sched.runtime.procio import Worker

pytestmark = pytest.mark.timeout(120)

WAIT = 10.0
FIRST = 6  # the calls the program starts at once

#: Each answer's continuation queues a microtask and, for even answers, a new
#: call: with one settle per step, ``b<i>`` comes before ``a<i+1>``; settled
#: all at once and then run, every ``a`` would come before every ``b``.
TRACE = f"""
const trace = [];
const later = [];
const first = [];
for (let i = 0; i < {FIRST}; i++) {{
  first.push(tools.t({{i}}).then((v) => {{
    trace.push("a" + v);
    console.log("a" + v);
    Promise.resolve().then(() => trace.push("b" + v));
    if (v % 2 === 0) later.push(tools.t({{i: 100 + v}}).then((w) => trace.push("c" + w)));
    return v;
  }}));
}}
const got = await Promise.all(first);
trace.push("all " + got.join(","));
await Promise.all(later);
return trace;
"""


@pytest.fixture(params=["worker", "in_process"])
def rt(request):
    """Each runtime; the worker one a pool of its own, closed at teardown."""
    if request.param == "in_process":
        yield QuickJSRuntime()
        return
    made = WorkerPool(size=2, spares=0)
    made.prestart(1)
    yield made
    made.close()


@pytest.fixture
def batches(monkeypatch):
    """The size of every batch of settles a runtime is handed, in order."""
    sizes: list[int] = []
    frame = remote_module.settle_frame
    many = engine_module.Engine.settle_many

    def counted_frame(batch):
        sizes.append(len(batch))
        return frame(batch)

    def counted_many(self, batch):
        sizes.append(len(batch))
        return many(self, batch)

    monkeypatch.setattr(remote_module, "settle_frame", counted_frame)
    monkeypatch.setattr(engine_module.Engine, "settle_many", counted_many)
    return sizes


def test_a_settled_call_is_known_at_once() -> None:
    # The seam's declared pending call for an answer a host knows at once (runtime.Settled).
    outcome = Outcome.failure("t", "refused")
    settled = Settled(outcome, tool="t")
    assert settled.done() is True
    assert settled.wait(0.0) is outcome
    assert (settled.tool, settled.seq) == ("t", None)
    assert Settled(Outcome.success(1)).tool is None
    assert settled.on_done(lambda: None) is False  # it never needs to tell: done() already says so


class _Host(Host):
    """A host whose every call is answered at once (so every answer behind the
    oldest is committed: one batch), recording what it sees in order."""

    names = ("t",)

    def __init__(self, cancel=None):
        self.cancel = cancel
        self.seen: list = []

    def call_json(self, name, text):
        self.seen.append(("call", name, text))
        return Settled(Outcome.success(json.loads(text)["i"]))

    def on_settled(self, pending, outcome, payload):
        self.seen.append(("answer", payload))


def _run(rt, program, host, limits=None):
    return rt.run(program, host, limits or Limits(timeout=30))


# === the program sees one order, however the settles are batched ===============================


def test_a_batch_of_settles_gives_the_steps_one_settle_per_frame_gives(rt, batches, monkeypatch):
    host = _Host()
    batched = _run(rt, TRACE, host)
    assert batched.error is None, batched.error
    # Every answer behind the oldest was there: they went together.
    assert batches[0] == FIRST and max(batches) == FIRST
    monkeypatch.setattr(engine_module, "BATCH_CALLS", 1)
    del batches[:]
    alone = _Host()
    one_each = _run(rt, TRACE, alone)
    assert one_each.error is None, one_each.error
    assert set(batches) == {1} and len(batches) == FIRST + FIRST // 2

    assert batched.result == one_each.result
    assert batched.logs == one_each.logs == tuple(f"a{i}" for i in range(FIRST))
    assert host.seen == alone.seen  # calls and answers, interleaved as the program made them
    trace = batched.result
    # The trace does depend on the interleaving: each answer's jobs ran before the next answer.
    assert trace.index("b0") < trace.index("a1") and trace.index("b4") < trace.index("a5")
    assert trace[-3:] == ["c100", "c102", "c104"]


def test_calls_released_at_once_through_the_scheduler_give_the_same_trace_as_one_at_a_time(rt, monkeypatch):
    gate = threading.Barrier(FIRST)

    def t(args):
        if args["i"] < 100:
            gate.wait(WAIT)  # all FIRST finish together: their commits arrive at once
        return args["i"]

    tool = Tool("t", t, concurrency_safe=lambda args: True)

    def run():
        gate.reset()
        result = run_code(TRACE, [tool], runtime=rt, timeout=30, description="test")
        assert result.error is None, result.error
        return result

    together = run()
    monkeypatch.setattr(engine_module, "BATCH_CALLS", 1)
    apart = run()
    assert together.result == apart.result
    assert together.logs == apart.logs
    assert [(c.seq, c.tool, c.arguments) for c in together.calls] == [(c.seq, c.tool, c.arguments) for c in apart.calls]
    assert together.usage.calls == apart.usage.calls  # the ledger: every answer, in order


def test_a_promise_all_of_answered_calls_settles_in_batches_not_one_by_one(rt, batches):
    n = 600
    result = _run(
        rt, f"return (await Promise.all(Array.from({{length: {n}}}, (_, i) => tools.t({{i}})))).length;", _Host()
    )
    assert result.error is None and result.result == n
    assert sum(batches) == n
    assert len(batches) == -(-n // engine_module.BATCH_CALLS), batches


# === the worker runtime: the committing thread sends ==========================================


@pytest.fixture
def armed(monkeypatch):
    """Set once the relay is armed for the run's next wait on the worker (by
    the run's own thread, or by the scheduler's driver reading the worker for
    it), so a tool that waits for it commits after the relay is armed."""
    event = threading.Event()
    arm = remote_module.Relay.arm

    def arming(self):
        arm(self)
        event.set()

    monkeypatch.setattr(remote_module.Relay, "arm", arming)
    return event


@pytest.fixture
def offers(monkeypatch):
    """Each relay write: (thread name, bytes offered, bytes the pipe took)."""
    seen: list = []
    offer = Worker.offer

    def recorded(self, data):
        took = offer(self, data)
        seen.append((threading.current_thread().name, len(data), took))
        return took

    monkeypatch.setattr(Worker, "offer", recorded)
    return seen


def test_the_thread_that_commits_the_call_writes_its_settle_to_the_worker(armed, offers):
    def t(args):
        assert armed.wait(WAIT)
        armed.clear()
        return args["i"]

    with WorkerPool(size=1, spares=0) as p:
        result = run_code(
            "let s = 0; for (let i = 1; i <= 3; i++) s += await tools.t({i}); return s;",
            [Tool("t", t)],
            runtime=p,
            timeout=30,
            description="test",
        )
    assert result.error is None and result.result == 6, result.error
    assert len(offers) == 3
    for thread, size, took in offers:
        assert thread.startswith("nous-sched-driver-") and took == size


def test_a_settle_larger_than_the_pipe_is_finished_by_the_runs_own_thread(armed, offers):
    big = "x" * (1024 * 1024)

    def t(args):
        assert armed.wait(WAIT)
        return big

    # Handles off (Limits.blob_bytes=None): the 1 MB result itself is the settle.
    limits = Limits(blob_bytes=None)
    with WorkerPool(size=1, spares=0) as p:
        result = run_code(
            "return (await tools.t({})).length;", [Tool("t", t)], runtime=p, limits=limits, description="test"
        )
    assert result.error is None and result.result == len(big), result.error
    ((thread, size, took),) = offers
    assert thread.startswith("nous-sched-driver-") and took < size


@pytest.mark.parametrize("size", [10, 1024 * 1024], ids=["fits-the-pipe", "larger-than-the-pipe"])
def test_a_stuck_worker_never_blocks_the_thread_that_commits(size, armed, make_event):
    """The worker is stopped (SIGSTOP) before its settle is written: the driver
    writes what the pipe takes and goes on committing the next call while the
    run's own thread waits; the run ends at its deadline (or when the worker
    is killed), never hangs the scheduler."""
    with WorkerPool(size=1, spares=0) as p:
        p.prestart(1)
        (pid,) = p.pids()
        second_committed = make_event()

        def stop_worker(args):
            assert armed.wait(WAIT)
            os.kill(pid, signal.SIGSTOP)
            # (The settle is written once this returns: the worker must be stopped by then, not about to be.)
            assert until(lambda: stopped(pid), WAIT), "the worker did not stop"
            return "y" * size

        def observer(record, phase):
            if phase == "commit" and record.tool == "second":
                second_committed.set()

        box: list = []
        tools = [Tool("first", stop_worker), Tool("second", lambda args: 2)]
        run = threading.Thread(
            target=lambda: box.append(
                run_code(
                    "return await Promise.all([tools.first({}), tools.second({})]);",
                    tools,
                    runtime=p,
                    limits=Limits(timeout=60, blob_bytes=None),  # the big result itself is the settle
                    observer=observer,
                    description="test",
                )
            )
        )
        run.start()
        try:
            assert second_committed.wait(WAIT), "the driver is stuck writing to a stopped worker"
            assert run.is_alive()  # still waiting on the stopped worker
        finally:
            os.kill(pid, signal.SIGKILL)
            run.join(WAIT)
        (result,) = box
        assert result.error is not None and result.error.kind == "abort", result.error
        assert [(r.tool, r.ok) for r in result.trail] == [("first", True), ("second", True)]


# === a deadline or a cancel inside a batch ======================================================

#: The second answer's continuation never ends: the batch stops there.
LOOPS_IN_THE_SECOND = """
const p0 = tools.t({i: 0}).then(() => console.log("first settled"));
const p1 = tools.t({i: 1}).then(() => { console.log("second settled"); for (;;) {} });
const p2 = tools.t({i: 2}).then(() => console.log("never"));
await Promise.all([p0, p1, p2]);
"""


def test_a_deadline_inside_a_batch_keeps_the_logs_of_every_step(rt, batches):
    result = _run(rt, LOOPS_IN_THE_SECOND, _Host(), Limits(timeout=1.0))
    assert batches == [3]
    assert result.error is not None and result.error.kind == "timeout", result.error
    assert result.logs == ("first settled", "second settled")


def test_a_cancel_inside_a_batch_ends_the_run_with_the_logs_of_every_step(rt, monkeypatch):
    cancel = threading.Event()
    # Set as the batch starts (sent to the worker, or settled in process): the program is past its last wait.
    frame = remote_module.settle_frame
    many = engine_module.Engine.settle_many

    def cancelling_frame(batch):
        cancel.set()
        return frame(batch)

    def cancelling_many(self, batch):
        cancel.set()
        return many(self, batch)

    monkeypatch.setattr(remote_module, "settle_frame", cancelling_frame)
    monkeypatch.setattr(engine_module.Engine, "settle_many", cancelling_many)
    host = _Host(cancel)
    result = _run(rt, LOOPS_IN_THE_SECOND, host, Limits(timeout=60))
    assert result.error is not None and result.error.kind == "cancelled", result.error
    assert result.logs == ("first settled", "second settled")
    # The answers the program received, up to the one it stopped in, in order.
    assert [s for s in host.seen if s[0] == "answer"] == [("answer", "0"), ("answer", "1")]

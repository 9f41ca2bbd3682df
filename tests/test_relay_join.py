"""A call that commits while the worker settles the batch before it joins that
batch (``runtime/_remote.py`` ``Relay.more``, ``_relaycore.py`` ``joined``).

With the worker runtime, the thread that commits a run's oldest call writes
its settle frame (the relay). A call that commits behind it while the worker
is still settling that frame is written to the worker then, as a frame of its
own, by the thread that commits it, and the run's own thread reads one answer
per call of the whole batch: it sends nothing itself, where it used to read
the first answers and only then send the next batch (a round trip more on a
fan-out's end). What the program observes is the same (the conformance and
batch tests).

Nothing sleeps to synchronise: the first tool returns only once the run's
thread waits on the worker with the relay armed (:func:`waiting`), so the
scheduler's driver, committing it, is the thread that writes its frame (on a
loaded box the run's thread can otherwise reach its wait after the call has
committed, and send the frame itself); the second tool waits for that
frame's write, and the program keeps the worker busy (in JavaScript, after
the first settle) far longer than that takes.
"""

from __future__ import annotations

import threading

import pytest

from nous_sched import Tool, WorkerPool, run_code
from nous_sched.runtime import _remote as remote_module
from nous_sched.runtime.procio import Worker

pytestmark = pytest.mark.timeout(120)

WAIT = 30.0
#: How long the program computes after the first answer (ms): the second call
#: commits well before the worker has answered the first frame.
BUSY_MS = 1500

PROGRAM = f"""
const pa = tools.a({{}});
const pb = tools.b({{}});
const x = await pa;
const t0 = Date.now();
while (Date.now() - t0 < {BUSY_MS}) {{}}
return [x, await pb];
"""


def waiting(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once the run's thread waits on the worker with the relay armed
    (``Worker.wait_readable``: only the relay's wait calls it, after arming
    and after its own check that the head has not committed yet); a call
    that commits after it is sent by the thread that commits it."""
    event = threading.Event()
    wait_readable = Worker.wait_readable

    def wait(self, *args, **kwargs):
        event.set()
        return wait_readable(self, *args, **kwargs)

    monkeypatch.setattr(Worker, "wait_readable", wait)
    return event


def test_a_call_committed_while_the_worker_settles_the_one_before_joins_its_frame(monkeypatch):
    armed = waiting(monkeypatch)
    written = threading.Event()
    offers: list[tuple[str, int, int]] = []
    offer = Worker.offer

    def recorded(self, data):
        took = offer(self, data)
        offers.append((threading.current_thread().name, len(data), took))
        written.set()
        return took

    sent_by_the_run: list[int] = []
    settle_many = remote_module.Remote.settle_many

    def counted(self, batch):
        sent_by_the_run.append(len(batch))
        return settle_many(self, batch)

    monkeypatch.setattr(Worker, "offer", recorded)
    monkeypatch.setattr(remote_module.Remote, "settle_many", counted)

    def a(args):
        assert armed.wait(WAIT)  # the run's thread waits: the driver, committing this, writes its frame
        return 1

    def b(args):
        assert written.wait(WAIT)  # the first call's frame is with the worker
        return 2

    tools = [Tool("a", a, concurrency_safe=lambda args: True), Tool("b", b, concurrency_safe=lambda args: True)]
    with WorkerPool(size=1, spares=0) as pool:
        result = run_code(PROGRAM, tools, runtime=pool, timeout=60, description="test")
    assert result.error is None and result.result == [1, 2], result.error
    # Both settles went as frames written by the thread that committed each call; the run's own
    # thread sent none (it read both answers once the worker was done).
    assert [thread.startswith("nous-sched-driver-") and took == size for thread, size, took in offers] == [True, True]
    assert sent_by_the_run == []
    assert [(c.seq, c.ok) for c in result.trail] == [(0, True), (1, True)]


def test_the_core_joins_only_a_batch_sent_and_not_collected_and_a_write_that_fails_gives_back():
    from nous_sched.runtime._relaycore import ARMED, IDLE, SENT, RelayCore

    waiting = ["c2", "c3"]

    def take(_: None) -> list:
        got, waiting[:] = list(waiting), []
        return got

    def give_back(batch: list) -> None:
        waiting[:0] = batch

    core = RelayCore()
    for state in (IDLE, ARMED):  # nothing sent, or the driving thread collected it: no join
        core.state = state
        assert core.joined(take, lambda batch: True, give_back) is False
        assert waiting == ["c2", "c3"] and core.batch == []

    core.arm()
    assert core.kicked(lambda _: ["c1"], lambda batch: True) is False  # c1 sent: the worker answers
    assert core.state is SENT and core.batch == ["c1"]
    assert core.joined(take, lambda batch: False, give_back) is False  # could not go whole: given back
    assert waiting == ["c2", "c3"] and core.batch == ["c1"]
    assert core.joined(take, lambda batch: True, give_back) is False  # written: joins the batch
    assert core.batch == ["c1", "c2", "c3"] and waiting == []
    assert core.taken() == (["c1", "c2", "c3"], None) and core.state is IDLE

    core.arm()
    core.kicked(lambda _: ["c4"], lambda batch: False)  # a frame the pipe could not hold: handed off
    waiting[:] = ["c5"]
    assert core.handoff and core.joined(take, lambda batch: True, give_back) is False
    assert waiting == ["c5"] and core.batch == ["c4"]


def test_what_a_join_raises_is_the_runs_to_raise():
    from nous_sched.runtime._relaycore import RelayCore

    core = RelayCore()
    core.arm()
    core.kicked(lambda _: ["c1"], lambda batch: True)
    boom = MemoryError()

    def take(_: None) -> list:
        raise boom

    assert core.joined(take, lambda batch: True, lambda batch: None) is True  # wake the driving thread
    assert core.taken() == (["c1"], boom)


def test_a_frame_joined_behind_one_its_run_stopped_in_leaves_the_worker_whole(monkeypatch):
    """The run's deadline stops the program in the first frame's step, after the
    second call's frame joined it: the worker reads that frame and answers
    nothing, and takes the domain's next run itself (no worker started again)."""
    armed = waiting(monkeypatch)
    written = threading.Event()
    offers: list[int] = []
    offer = Worker.offer

    def recorded(self, data):
        took = offer(self, data)
        offers.append(took)
        written.set()
        return took

    monkeypatch.setattr(Worker, "offer", recorded)

    def a(args):
        assert armed.wait(WAIT)  # the run's thread waits: the driver, committing this, writes its frame
        return 1

    def b(args):
        assert written.wait(WAIT)
        return 2

    tools = [Tool("a", a, concurrency_safe=lambda args: True), Tool("b", b, concurrency_safe=lambda args: True)]
    program = "const pa = tools.a({}); const pb = tools.b({}); await pa; while (true) {} return await pb;"
    with WorkerPool(size=1, spares=0) as pool:
        # Started (and ready) before the run: the 1 s deadline is the program's alone, not a
        # worker's start on a loaded box as well (the second frame joins within ms of the run's start).
        pool.prestart(1)
        domain = pool.domain("join")
        stopped = run_code(program, tools, runtime=domain, timeout=1.0, description="test")
        assert stopped.error is not None and stopped.error.kind == "timeout", stopped.error
        assert len(offers) == 2  # the second call's frame joined the first's
        pids = {w.proc.pid for w in pool._workers.values()}  # noqa: SLF001
        again = run_code("return 3;", [], runtime=domain, timeout=30, description="test")
        assert again.error is None and again.result == 3, again.error
        assert {w.proc.pid for w in pool._workers.values()} == pids  # noqa: SLF001

"""nous_sched with tools running on Dask: ``distributed.Client(processes=False).get_executor()``.

What Dask does to a sub-call, even in-process (``processes=False``): it
serializes every task it is given (function and arguments, with cloudpickle)
and the worker thread runs a deserialized copy. So:

* whatever the scheduler hands the executor must pickle: it hands over
  ``InContext(ctx)``, which pickles without the context (handing over
  ``contextvars.Context.run`` made every call fail);
* a tool's function, its ``concurrency_safe`` predicate, the run's
  ``RunContext`` (``deps``, ``approval_handler``) must pickle too: module-level
  functions travel by reference (their module's globals are shared, in
  process); closures and lambdas travel by value (a copy: mutations of
  captured objects are not seen by the caller; a captured lock or
  ``ContextVar`` makes the call fail);
* the submitting thread's ``contextvars`` do not reach the tool (the context
  cannot be pickled); ``current_call`` does, because it is set on the worker.

The tools below are module-level for that reason, and they report what they
saw in their return value rather than in shared state.

The test that needs no Dask (``test_a_serializing_executor_runs_the_calls``)
pins the same contract with the standard library's ``pickle``, so CI checks it
even where ``distributed`` is not installed.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import pickle
import threading
import time

import pytest

from nous_sched import Outcome, Scheduler, Tool, current_call, run_code

WAIT = 30.0

#: Set by the test before a run; a Dask worker must not see it (contexts do not pickle).
submitter_var: contextvars.ContextVar[str] = contextvars.ContextVar("test_dask.submitter_var", default="unset")

# Rendezvous for calls that must overlap, by name (module state: shared in process).
_BARRIERS: dict[str, threading.Barrier] = {}


# --- tools: module-level, so Dask pickles them by reference ------------------------


def _always(args):
    return True


def _report(args):
    """What a tool body saw: its key, its interval, its thread, its call info, the submitter's var."""
    start = time.monotonic()
    gate = args.get("gate")
    if gate is not None:
        _BARRIERS[gate].wait()  # BrokenBarrierError (the call fails) if the calls are not concurrent
    time.sleep(args.get("hold", 0.0))
    info = current_call.get()
    return {
        "i": args["i"],
        "start": start,
        "end": time.monotonic(),
        "thread": threading.current_thread().name,
        "call": None if info is None else {"id": info.id, "seq": info.seq, "mode": info.mode, "tool": info.tool},
        "submitter": submitter_var.get(),
    }


FAN = Tool("fan", _report, concurrency_safe=_always)
WRITE = Tool("write", _report)  # no predicate: exclusive


def _disjoint(a, b):
    return a["end"] <= b["start"] or b["end"] <= a["start"]


# --- fixtures -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def dask_executor():
    distributed = pytest.importorskip("distributed")
    with pytest.MonkeyPatch.context() as mp:
        # In-process comms are named after the host's outward IP, which Dask finds by
        # connecting a UDP socket to a public address (no packet is sent). Name them
        # after loopback instead, so nothing here ever addresses anything but 127.0.0.1.
        from distributed.comm import inproc

        if hasattr(inproc, "get_ip"):
            mp.setattr(inproc, "get_ip", lambda *a, **k: "127.0.0.1")
        # The scheduler and the worker always serve HTTP (health, metrics), on every
        # interface unless told otherwise: keep both on loopback, on free ports.
        with distributed.Client(
            processes=False,
            n_workers=1,
            threads_per_worker=4,
            dashboard_address="127.0.0.1:0",
            worker_dashboard_address="127.0.0.1:0",
        ) as client:
            yield client.get_executor()


@pytest.fixture
def barrier():
    names = []

    def make(parties):
        name = f"b{len(_BARRIERS)}-{time.monotonic_ns()}"
        _BARRIERS[name] = threading.Barrier(parties, timeout=WAIT / 2)
        names.append(name)
        return name

    yield make
    for name in names:
        _BARRIERS.pop(name).abort()


# --- a serializing executor, no Dask needed -----------------------------------------


class PicklingExecutor(concurrent.futures.Executor):
    """Pickles every task with the standard library, runs the copy on a thread pool."""

    def __init__(self):
        self.pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="test-pickling-pool")

    def submit(self, fn, /, *args, **kwargs):
        fn, args, kwargs = pickle.loads(pickle.dumps((fn, args, kwargs)))
        return self.pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait=True, *, cancel_futures=False):
        self.pool.shutdown(wait=wait, cancel_futures=cancel_futures)


def test_a_serializing_executor_runs_the_calls(barrier):
    executor = PicklingExecutor()
    token = submitter_var.set("request-7")
    try:
        gate = barrier(3)
        with Scheduler(executor=executor, timeout=WAIT, call_id="pk") as s:
            tickets = [s.submit(FAN, {"i": i, "gate": gate}) for i in range(3)]
            outcomes = [s.wait(t) for t in tickets]
        assert all(o.ok for o in outcomes), outcomes
        assert [o.value["i"] for o in outcomes] == [0, 1, 2]
        assert [o.value["call"]["id"] for o in outcomes] == ["pk:code:0", "pk:code:1", "pk:code:2"]
        # The copy carries no context: the submitter's var is not there.
        assert {o.value["submitter"] for o in outcomes} == {"unset"}
    finally:
        submitter_var.reset(token)
        executor.shutdown()


def test_an_in_process_executor_still_carries_the_context():
    """The patch must not cost the ordinary case its contextvars."""
    executor = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="test-plain-pool")
    token = submitter_var.set("request-8")
    try:
        with Scheduler(executor=executor, timeout=WAIT) as s:
            outcome = s.call(FAN, {"i": 0})
        assert outcome.ok, outcome
        assert outcome.value["submitter"] == "request-8"
    finally:
        submitter_var.reset(token)
        executor.shutdown()


# --- Dask ---------------------------------------------------------------------------


def test_dask_scheduler_fan_out_commits_in_order(dask_executor, barrier):
    gate = barrier(4)  # all four must be inside the tool at once: real parallelism on Dask threads
    with Scheduler(executor=dask_executor, max_parallel=4, timeout=WAIT, call_id="fan") as s:
        tickets = [s.submit(FAN, {"i": i, "gate": gate}) for i in range(4)]
        outcomes = [s.wait(t) for t in tickets]
        trail = s.trail()
    assert all(o.ok for o in outcomes), outcomes
    values = [o.value for o in outcomes]
    assert [v["i"] for v in values] == [0, 1, 2, 3]
    assert [v["call"] for v in values] == [
        {"id": f"fan:code:{i}", "seq": i, "mode": "parallel", "tool": "fan"} for i in range(4)
    ]
    assert all("Dask" in v["thread"] for v in values), [v["thread"] for v in values]
    committed = [r.committed for r in trail]
    assert committed == sorted(committed)
    assert [r.ok for r in trail] == [True] * 4


def test_dask_scheduler_exclusive_calls_run_alone(dask_executor):
    with Scheduler(executor=dask_executor, max_parallel=4, timeout=WAIT) as s:
        tickets = [s.submit(WRITE, {"i": i, "hold": 0.03}) for i in range(4)]
        outcomes = [s.wait(t) for t in tickets]
        trail = s.trail()
    assert all(o.ok for o in outcomes), outcomes
    values = [o.value for o in outcomes]
    assert [v["i"] for v in values] == [0, 1, 2, 3]
    assert {v["call"]["mode"] for v in values} == {"exclusive"}
    # One after another, in order, on the tool side...
    for before, after in zip(values, values[1:]):
        assert before["end"] <= after["start"], (before, after)
    # ...and in the scheduler's view: each starts only after the previous one committed.
    for before, after in zip(trail, trail[1:]):
        assert before.committed <= after.started, (before, after)


def test_dask_run_code_fan_out_and_barrier(dask_executor, barrier):
    gate = barrier(3)
    code = f"""
    const before = [0, 1, 2].map(i => tools.fan({{i, gate: {gate!r}}}));
    const write = tools.write({{i: 3, hold: 0.05}});
    const after = [4, 5, 6].map(i => tools.fan({{i, hold: 0.02}}));
    const all = await Promise.all([...before, write, ...after]);
    console.log(`made ${{all.length}} calls`);
    return all;
    """
    token = submitter_var.set("request-9")
    try:
        result = run_code(
            code, [FAN, WRITE], executor=dask_executor, max_parallel=4, timeout=WAIT, call_id="dk", description="test"
        )
    finally:
        submitter_var.reset(token)
    assert result.ok, result.error
    assert result.logs == ("made 7 calls",)
    values = result.result
    assert [v["i"] for v in values] == list(range(7))
    assert [v["call"]["seq"] for v in values] == list(range(7))
    assert [e.mode for e in result.calls] == ["parallel"] * 3 + ["exclusive"] + ["parallel"] * 3
    assert [e.id for e in result.calls] == [f"dk:code:{i}" for i in range(7)]
    # The exclusive call overlapped nothing: everything before it had finished, nothing after had started.
    write = values[3]
    for other in values[:3] + values[4:]:
        assert _disjoint(write, other), (write, other)
    assert all(v["start"] >= write["end"] for v in values[4:])
    # Semantics on Dask: current_call is there, the submitter's contextvars are not.
    assert {v["submitter"] for v in values} == {"unset"}
    assert [r.ok for r in result.trail] == [True] * 7


def test_dask_an_unpicklable_tool_fails_as_data(dask_executor, caplog):
    """A tool closing over a lock cannot be shipped: its call fails, the run goes on."""
    lock = threading.Lock()

    def locked(args):
        with lock:
            return "never"

    tool = Tool("locked", locked)
    code = """
    let message = null;
    try { await tools.locked({}); } catch (e) { message = e.message; }
    const ok = await tools.fan({i: 1});
    return {message, i: ok.i};
    """
    result = run_code(code, [tool, FAN], executor=dask_executor, timeout=WAIT, description="test")
    assert result.ok, result.error
    assert result.result == {"message": "tool call did not complete", "i": 1}
    assert any("could not be handed to the executor" in r.getMessage() for r in caplog.records)


def test_dask_outcome_of_a_failing_tool_is_data(dask_executor):
    """Failure inside a tool on a Dask worker is the usual two strings (patch or not: the call never starts without it)."""

    def boom(args):
        raise RuntimeError("secret detail")

    with Scheduler(executor=dask_executor, timeout=WAIT) as s:
        outcome = s.call(Tool("boom", boom), {})
    assert isinstance(outcome, Outcome) and outcome.ok is False
    assert outcome.error.tool == "boom"
    # Patched: the tool raised on the worker. Unpatched: the executor refused the task.
    assert outcome.error.message in ("secret detail", "tool call did not complete")


def big(args):
    return "x" * 300_000


ASKED: list = []


def grant_all(request):
    from nous_sched import Grant

    ASKED.append(request.coming)
    return Grant()


def test_with_a_serializing_executor_a_big_result_crosses_whole():
    """A run's held values stay in its own process: a call pickled to another (Dask, a process
    pool) holds nothing there, so a result over ``Limits.blob_bytes`` crosses whole, and a run's
    approval grants and what-is-coming text stay behind too (every such call asks)."""
    executor = PicklingExecutor()
    ASKED.clear()
    try:
        tool = Tool("big", big, requires_approval=True)
        program = "const a = await tools.big({}); const b = await tools.big({}); return [a.length, b.length];"
        result = run_code(
            program,
            [tool],
            description="big",
            executor=executor,
            timeout=WAIT,
            approval_handler=grant_all,
        )
    finally:
        executor.shutdown()
    assert result.ok, result.error
    assert result.result == [300_000, 300_000]  # whole strings, not handles
    assert result.usage.held_bytes == 0
    assert ASKED == ["", ""]  # each call asked (no grant crossed), knowing nothing of what is coming

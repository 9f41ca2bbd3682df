"""The CPU budget (``Limits.cpu_time``): the program's own JavaScript time,
apart from the wall-clock deadline, and how the worker runtime holds it
against native code (the host's look at the worker's CPU, the kernel's
``RLIMIT_CPU``). Every bound on time here is generous (a loaded 2-core box);
CPU is measured where it can be, not wall time."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from procs import descendants

from nous_sched import (
    ERROR_KINDS,
    ConfigError,
    Limits,
    QuickJSRuntime,
    SqliteApprovalStore,
    Tool,
    WorkerPool,
    resume,
    run_code,
)
from nous_sched.result._explain import FIXES
from nous_sched.runtime import worker

pytestmark = pytest.mark.timeout(300)

GRACE = 0.5  # WorkerPool's default kill_grace


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


# -- the option ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "1", True, [1]])
def test_a_bad_cpu_time_is_a_config_error_naming_it(bad):
    with pytest.raises(ConfigError, match="`cpu_time`"):
        Limits(cpu_time=bad)


def test_no_cpu_budget_by_default_and_the_kind_is_known_everywhere():
    assert Limits().cpu_time is None
    assert Limits(cpu_time=2.5).cpu_time == 2.5
    assert "cpu_time" in ERROR_KINDS and "cpu_time" in FIXES
    assert "cpu_time" in worker.LIMIT_FIELDS


# -- Must show ------------------------------------------------------------------------------


def test_a_ten_second_tool_fits_a_one_second_cpu_budget():
    # Waiting for a tool costs no CPU time: the budget is the JavaScript's own.
    slow = Tool("slow", lambda args: time.sleep(10) or "slept")
    t0 = time.monotonic()
    result = run_code(
        "const r = await tools.slow({}); return r + '!'",
        [slow],
        limits=Limits(timeout=60, cpu_time=1),
        description="a slow tool",
    )
    assert result.error is None, result.error
    assert result.result == "slept!"
    assert time.monotonic() - t0 >= 10


def test_a_runaway_loop_stops_at_its_cpu_budget_long_before_the_deadline():
    # A pool of spawned workers: the worker is this process's child, so its
    # CPU time, once it is reaped, is read here (an interpreter's start-up is
    # part of it: allowed for on top of the budget and the grace).
    pool = WorkerPool(size=1, spares=0, start_method="spawn")
    try:
        before = _children_cpu()
        t0 = time.monotonic()
        result = run_code(
            "console.log('spinning'); while (true) {}",
            limits=Limits(timeout=60, cpu_time=1),
            runtime=pool,
            description="a runaway loop",
        )
        wall = time.monotonic() - t0
    finally:
        pool.close()
    assert result.error is not None and result.error.kind == "cpu_time", result.error
    assert result.error.message.startswith("the program used its 1s of CPU time (running JavaScript)")
    assert result.logs == ("spinning",)
    assert wall < 30, wall  # the wall deadline (60 s) was never the end
    spent = _children_cpu() - before
    assert 1.0 <= spent < 1.0 + GRACE + 1.5, spent


def test_in_process_a_runaway_loop_stops_at_its_cpu_budget():
    before = time.thread_time()  # (this thread runs the engine: its stack is big enough)
    result = run_code(
        "while (true) {}", limits=Limits(timeout=60, cpu_time=1), runtime=QuickJSRuntime(), description="loop"
    )
    spent = time.thread_time() - before
    assert result.error is not None and result.error.kind == "cpu_time", result.error
    assert 1.0 <= spent < 1.0 + GRACE, spent


def test_in_process_other_threads_cpu_is_not_the_programs():
    # The binding's own slice counts the whole process's CPU; the budget is the
    # engine thread's (read by the nous-sched-cpu watcher), so a thread burning
    # CPU beside the program (here a Python loop, the engine holding no GIL)
    # spends none of it. The program's own loop lasts 0.6 s of wall time, so
    # at most 0.6 s of its thread's CPU: it fits 1 s whatever the load.
    stop = threading.Event()
    names = []

    def burn():
        while not stop.is_set():
            pass

    def program_threads(args):
        names.extend(t.name for t in threading.enumerate())
        return 1

    burner = threading.Thread(target=burn, name="nous-sched-test-burner", daemon=True)
    burner.start()
    try:
        result = run_code(
            "await tools.look({}); const t = Date.now(); while (Date.now() - t < 600) {} return 'fits'",
            [Tool("look", program_threads)],
            limits=Limits(timeout=60, cpu_time=1),
            runtime=QuickJSRuntime(),
            description="beside a busy thread",
        )
    finally:
        stop.set()
        burner.join()
    assert result.error is None, result.error
    assert result.result == "fits"
    assert any(n.startswith("nous-sched-cpu-") for n in names), names


# -- native code: the host's look and the kernel's limit -----------------------------------


def test_one_long_native_call_is_killed_by_the_host_past_the_budget_and_grace():
    # A big BigInt's toString is native code the engine's interrupt never
    # reaches, and join() makes three of them one native call (in-process it
    # runs for seconds past any budget: about 7 s of CPU where 0.05 s was left).
    before = time.monotonic()
    result = run_code(
        "const b = 7n ** 330000n; return Array(3).fill(b).join().length",
        limits=Limits(timeout=120, cpu_time=0.3),
        description="a long native call",
    )
    assert result.error is not None and result.error.kind == "cpu_time", result.error
    # The host kills it at the budget plus the grace (0.8 s of CPU); when the host's look comes
    # late (a loaded machine), the kernel's limit, one whole second, ends it first: either way it
    # ends as a cpu_time error saying which, long before the wall deadline.
    assert (
        "its worker process was killed after 0.8s of CPU time" in result.error.message
        or "the kernel's CPU time limit ended its worker process" in result.error.message
    ), result.error.message
    assert time.monotonic() - before < 60


@pytest.fixture
def payload_pool(tmp_path, monkeypatch):
    """A pool whose workers run ``body`` (Python, as native code inside the
    engine would run: see tests/test_wall.py) for a ``/*payload*/`` program."""
    made = []

    def make(body: str) -> WorkerPool:
        path = tmp_path / f"payload-{len(made)}.py"
        path.write_text("import os, resource, signal, time\n" + textwrap.dedent(body), encoding="utf-8")
        monkeypatch.setenv(worker.PAYLOAD_ENV, str(path))
        pool = WorkerPool(size=2, spares=1)
        pool.prestart(1)
        monkeypatch.delenv(worker.PAYLOAD_ENV)
        made.append(pool)
        return pool

    yield make
    for pool in made:
        pool.close()


def test_the_worker_holds_the_kernels_cpu_limit_at_the_budget_plus_the_grace(payload_pool):
    pool = payload_pool(
        """
        report["limit"] = list(resource.getrlimit(resource.RLIMIT_CPU))
        report["used"] = time.process_time()
        """
    )
    result = run_code("/*payload*/", limits=Limits(cpu_time=1.25), runtime=pool, description="test")
    assert result.error is None, result.error
    soft, hard = result.result["limit"]
    # Whole seconds: the CPU used so far plus 1.25 s and the grace, rounded up; SIGKILL a second later.
    assert result.result["used"] + 1.25 + GRACE <= soft < result.result["used"] + 1.25 + GRACE + 1
    assert hard == soft + 1
    # No budget, no limit.
    plain = run_code("/*payload*/", runtime=pool, description="test")
    assert plain.result["limit"] == [resource.RLIM_INFINITY, resource.RLIM_INFINITY]


def test_the_limit_is_in_the_worker_process_as_proc_shows_it():
    # Read from outside, while the program waits for a tool: /proc/<pid>/limits of its worker.
    pool = WorkerPool(size=1, spares=0)
    seen = {}

    def peek(args):
        workers = []
        for pid in descendants(os.getpid()):
            try:
                with open(f"/proc/{pid}/comm", encoding="ascii") as fh:
                    if fh.read().startswith("nous-worker"):
                        workers.append(pid)
            except OSError:
                pass
        for pid in workers:
            with open(f"/proc/{pid}/limits", encoding="ascii") as fh:
                seen[pid] = [line for line in fh if line.startswith("Max cpu time")]
        return len(workers)

    try:
        result = run_code(
            "return await tools.peek({})",
            [Tool("peek", peek)],
            limits=Limits(cpu_time=2),
            runtime=pool,
            description="peek",
        )
    finally:
        pool.close()
    assert result.error is None and result.result >= 1, (result, seen)
    # (Other pools' workers, the default pool's spares, are there too, without a limit.)
    limited = [line for (line,) in seen.values() if line.split()[3] != "unlimited"]
    assert len(limited) == 1, seen
    soft, hard = (int(x) for x in limited[0].split()[3:5])
    assert 3 <= soft <= 4 and hard == soft + 1, limited


def test_the_kernel_ends_a_process_past_its_cpu_limit():
    # The backstop on its own (oslimits.cap_cpu, as a worker calls it), in a
    # process whose native loop nothing else would stop.
    script = textwrap.dedent(
        """
        from nous_sched.runtime import oslimits
        assert oslimits.cap_cpu(0.5) >= 1
        while True:
            pass
        """
    )
    before = _children_cpu()
    done = subprocess.run([sys.executable, "-c", script], timeout=120, check=False)
    assert done.returncode == -signal.SIGXCPU
    assert _children_cpu() - before < 0.5 + 1 + 1.5  # (start-up, rounding to whole seconds)


def test_a_worker_the_kernels_cpu_limit_ended_is_a_cpu_time_error(payload_pool):
    # As the kernel ends one: SIGXCPU, its default action (which the worker keeps).
    pool = payload_pool('signal.raise_signal(signal.SIGXCPU)\nreport["alive"] = True\n')
    result = run_code("/*payload*/", limits=Limits(cpu_time=5), runtime=pool, description="test")
    assert result.error is not None and result.error.kind == "cpu_time", result.error
    assert "the kernel's CPU time limit ended its worker process" in result.error.message


def test_a_worker_that_ran_with_a_cpu_budget_is_not_reused():
    # Its kernel limit cannot be raised again: a domain's next run gets another process.
    pool = WorkerPool(size=2, spares=0)
    try:
        alice = pool.domain("alice")
        program = "return await tools.pid({})"
        pid = Tool("pid", lambda args: sorted(descendants(os.getpid())))
        first = run_code(program, [pid], limits=Limits(cpu_time=5), runtime=alice, description="t").result
        second = run_code(program, [pid], runtime=alice, description="t").result
        assert first and second and set(first) != set(second)
    finally:
        pool.close()


# -- durable runs: each part has the whole budget ------------------------------------------


BURN = "{ let x = 0; for (let i = 0; i < 1e7; i++) x += i; }"  # (no clock read: a durable run records those)


def test_a_durable_run_counts_each_part_from_zero_and_a_resume_replays_the_whole_program(tmp_path):
    # Each part (the run, each resume) has the whole budget; a resume replays
    # the program from its start, so the budget bounds the program's whole
    # JavaScript however often it suspends: two burns fit 4 burns' budget,
    # not 1.5 burns' (though the part that suspended, one burn, did).
    before = time.thread_time()
    alone = run_code(BURN, runtime=QuickJSRuntime(), description="one burn")
    burn = time.thread_time() - before
    assert alone.error is None
    pay = Tool("pay", lambda args: "paid", requires_approval=True)
    program = f"{BURN}; const r = await tools.pay({{}}); {BURN}; return r"
    for budget, kind in ((4 * burn, None), (1.5 * burn, "cpu_time")):
        store = SqliteApprovalStore(str(tmp_path / f"store-{kind}.db"))
        runtime = QuickJSRuntime()
        limits = Limits(timeout=60, cpu_time=budget)
        first = run_code(program, [pay], approval_store=store, runtime=runtime, limits=limits, description="d")
        assert first.suspended is not None, first.error
        done = resume(first.suspended.token, {0: True}, [pay], approval_store=store, runtime=runtime, limits=limits)
        assert (done.error and done.error.kind) == kind, (done.error, burn)
        if kind is None:
            assert done.result == "paid"


# -- every output path that shows a kind ---------------------------------------------------


LOOP = "console.log('on'); while (true) {}"
SMALL = Limits(timeout=60, cpu_time=0.2)


def test_the_cli_exits_1_and_names_the_kind(tmp_path, capsys):
    from nous_sched.cli import main

    program = tmp_path / "loop.js"
    program.write_text(LOOP, encoding="utf-8")
    tools = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "tools.py")
    assert main(["run", str(program), "--tools", tools, "--cpu-time", "0.2", "--timeout", "60"]) == 1
    out, _ = capsys.readouterr()
    assert out.startswith("error (cpu_time):\n  the program used its 0.2s of CPU time (running JavaScript)")
    assert main(["run", str(program), "--tools", tools, "--cpu-time", "0.2", "--json"]) == 1
    out, _ = capsys.readouterr()
    assert json.loads(out)["error"]["kind"] == "cpu_time"
    for bad in ("0", "-1", "nan", "inf", "1e400", "one"):
        assert main(["run", str(program), "--tools", tools, "--cpu-time", bad]) == 2
        _, err = capsys.readouterr()
        last = err.strip().splitlines()[-1]  # (after argparse's usage lines)
        assert last.startswith("nous-sched: argument --cpu-time: expected a positive number of seconds"), err


def test_serve_mcp_takes_cpu_time_for_every_run(capsys, monkeypatch):
    from nous_sched.cli import build_parser, main
    from nous_sched.cli.serve_mcp import run_limits

    args = build_parser().parse_args(["serve-mcp", "--tools", "t.py", "--cpu-time", "2", "--timeout", "9"])
    assert run_limits(args) == {"limits": Limits(timeout=9, cpu_time=2)}
    plain = build_parser().parse_args(["serve-mcp", "--tools", "t.py"])
    assert run_limits(plain) == {"timeout": 30.0}
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert main(["serve-mcp", "--tools", "examples/tools.py", "--cpu-time", "nan"]) == 2
    _, err = capsys.readouterr()
    assert err.strip().splitlines()[-1].startswith("nous-sched: argument --cpu-time: expected a positive"), err


def test_the_live_end_event_and_agui_name_the_kind():
    from nous_sched import agui, start_run

    run = start_run(LOOP, [], limits=SMALL, runtime=QuickJSRuntime(), description="live")
    events = list(run.events())
    assert events[-1].kind == "end"
    assert events[-1].data["error"]["kind"] == "cpu_time"
    again = start_run(LOOP, [], limits=SMALL, runtime=QuickJSRuntime(), description="agui")
    stream = [json.loads(b[len("data: ") :]) for b in "".join(agui.sse(again)).strip().split("\n\n")]
    assert stream[-1]["type"] == "RUN_ERROR" and stream[-1]["code"] == "cpu_time"


def test_otel_marks_the_run_span_with_the_kind():
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from nous_sched import otel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        result = otel.traced_run_code(
            LOOP, [], tracer=provider.get_tracer("t"), limits=SMALL, runtime=QuickJSRuntime(), description="otel"
        )
    finally:
        provider.shutdown()
    assert result.error.kind == "cpu_time"
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "nous_sched.run_code"]
    assert span.attributes["error.type"] == "cpu_time"
    assert span.attributes["nous_sched.error.kind"] == "cpu_time"


def test_serve_mcp_returns_the_kind():
    pytest.importorskip("mcp")
    import anyio
    from mcp import Client

    from nous_sched.mcp import CodeModeServer

    server = CodeModeServer([], limits=SMALL, runtime=QuickJSRuntime())

    async def call() -> dict:
        async with Client(server.server) as client:
            result = await client.call_tool("run_code", {"code": LOOP, "description": "spin"})
            return dict(result.structured_content)

    answer = anyio.run(call)
    assert answer["error"]["kind"] == "cpu_time", answer
    assert "0.2s of CPU time" in answer["error"]["message"]

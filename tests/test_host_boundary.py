"""The host itself (issue 9): a hung tool, a saturated executor, a nested run.

* a tool hung past its run's deadline does not hold the interpreter's exit
  (the shared tool threads are daemon threads), with either runtime;
* on a shared executor saturated by other work, the audit says whether and
  when a call actually began (``CallRecord.began``), and a call that never
  began before its run was over never runs;
* a tool that calls ``run_code`` on its own saturated executor fails fast
  with a clear error instead of waiting for the inner deadline.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import textwrap
import threading

import pytest

from nous_sched import Limits, Scheduler, Tool, run_code

WAIT = 30.0
HUNG_SCRIPT = textwrap.dedent(
    """
    import sys, threading
    from nous_sched import Tool, run_code
    from nous_sched.runtime.quickjs import QuickJSRuntime

    never = threading.Event()
    runtime = QuickJSRuntime() if sys.argv[1] == "in_process" else None
    result = run_code("return await tools.hang({})", [Tool("hang", lambda a: never.wait())], timeout=0.5, runtime=runtime, description="t")
    print(result.error.kind, flush=True)
    """
)


@pytest.mark.parametrize("runtime", ["worker", "in_process"])
def test_a_tool_hung_past_the_deadline_does_not_hold_interpreter_exit(runtime):
    # Before: ThreadPoolExecutor joins its threads at exit, and this never ended.
    done = subprocess.run([sys.executable, "-c", HUNG_SCRIPT, runtime], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "timeout"


def test_the_shared_tool_threads_are_daemon_threads_named_for_what_they_do():
    seen = []
    with Scheduler(timeout=WAIT) as scheduler:
        ticket = scheduler.submit(Tool("t", lambda a: seen.append(threading.current_thread())), {})
        assert scheduler.wait(ticket).ok
    [thread] = seen
    assert thread.daemon and thread.name.startswith("nous-sched-tool-")


def test_a_call_that_began_records_when():
    result = run_code(
        "return await tools.t({})", [Tool("t", lambda a: 1)], limits=Limits(timeout=WAIT), description="test"
    )
    [record] = result.trail
    assert record.began is not None
    assert record.started <= record.began <= record.finished <= record.committed


def test_on_a_saturated_shared_executor_a_call_that_never_began_is_audited_so_and_never_runs(make_event):
    shared = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shared")
    release = make_event()
    busy = threading.Event()

    def other_run():
        busy.set()
        release.wait(WAIT)

    shared.submit(other_run)
    assert busy.wait(WAIT)
    ran = []
    try:
        result = run_code(
            "return await tools.t({})",
            [Tool("t", lambda a: ran.append(a))],
            executor=shared,
            limits=Limits(timeout=0.5),
            description="test",
        )
        assert result.error is not None and result.error.kind == "timeout"
        [event] = result.calls  # handed to the executor, and audited
        [record] = result.trail
        assert record.seq == event.seq and record.began is None and record.finished is None
    finally:
        release.set()
        shared.shutdown(wait=True)  # the executor takes the call up now, after its run is over...
    assert ran == []  # ...and it does not run


def test_a_nested_run_on_its_own_saturated_executor_fails_fast():
    shared = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shared")
    inner = Tool("inner", lambda a: "inner ran")

    def outer(args):
        return run_code("return await tools.inner({})", [inner], executor=shared, timeout=60, description="test").result

    try:
        program = "try { return await tools.outer({}) } catch (e) { return e.message }"
        result = run_code(
            program, [Tool("outer", outer)], executor=shared, limits=Limits(timeout=120), description="test"
        )
    finally:
        shared.shutdown(wait=True)
    assert result.error is None, result
    assert "every thread of that executor is busy" in result.result
    assert result.elapsed < 60  # it failed at once, not at the inner run's deadline


def test_a_nested_run_with_a_free_thread_on_the_same_executor_runs():
    shared = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="shared")
    inner = Tool("inner", lambda a: "inner ran")

    def outer(args):
        return run_code(
            "return await tools.inner({})", [inner], executor=shared, timeout=WAIT, description="test"
        ).result

    try:
        result = run_code(
            "return await tools.outer({})", [Tool("outer", outer)], executor=shared, timeout=WAIT, description="test"
        )
    finally:
        shared.shutdown(wait=True)
    assert result.result == "inner ran"


def test_the_thread_pool_executors_fields_are_where_the_saturation_check_reads_them():
    # CPython keeps them private; if a release moves them, thread_pool_view says None
    # ("cannot tell") and a nested run on a saturated executor waits until its deadline again.
    from nous_sched._run.runner import thread_pool_view

    pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="nous-sched-test-view")
    try:
        worker = pool.submit(threading.current_thread).result(timeout=WAIT)
        view = thread_pool_view(pool)
        assert view is not None, "ThreadPoolExecutor's private fields moved: see thread_pool_view"
        assert view.threads == {worker}
        assert worker.name.startswith(view.prefix + "_") and view.prefix == "nous-sched-test-view"
        assert view.max_workers == 2
        assert isinstance(view.idle, threading.Semaphore)
    finally:
        pool.shutdown(wait=True)
    assert thread_pool_view(object()) is None
    assert thread_pool_view(None) is None

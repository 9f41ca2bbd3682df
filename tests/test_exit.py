"""A host's exit: what ``import nous_sched`` leaves for the interpreter to tear
down, and what the pool's teardown at exit leaves running.

A synchronous host never imports ``asyncio`` (nor ``ssl``, which it brings):
the asyncio doors (``arun_code``, ``acall_tool``, ``Run.aconsume_batches``,
async tools, the agent integrations' loop bridge) import it when first used,
so a short-lived host (a CLI, a test process) does not pay for its import at
start or its teardown at exit. ``benchmarks/bench_exit.py`` measures the exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nous_sched import Tool, WorkerPool, run_code

ROOT = Path(__file__).resolve().parent.parent
LAZY = ("asyncio", "ssl")


def _modules_after(code: str) -> set[str]:
    """The names in ``sys.modules`` after ``code`` ran in a fresh interpreter (this checkout first on the path)."""
    probe = textwrap.dedent(code) + "\nimport sys\nprint(' '.join(sorted(sys.modules)))\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_import_nous_sched_does_not_import_asyncio():
    loaded = _modules_after("import nous_sched")
    assert "nous_sched.agent.aio" in loaded and "nous_sched.live" in loaded  # (the modules that use it are there)
    assert not loaded & set(LAZY)


@pytest.mark.parametrize("runtime", ["WorkerPool(size=1, spares=0)", "QuickJSRuntime()"])
def test_a_synchronous_run_does_not_import_asyncio(runtime):
    loaded = _modules_after(
        f"""
        from nous_sched import QuickJSRuntime, Tool, WorkerPool, run_code
        tool = Tool("price", lambda args: 1, description="Unit price.", parameters={{"type": "object"}})
        runtime = {runtime}
        result = run_code("return await tools.price({{}})", [tool], runtime=runtime, description="One call")
        assert result.ok and result.result == 1, result.error
        getattr(runtime, "close", lambda: None)()
        """
    )
    assert not loaded & set(LAZY)


def test_the_asyncio_door_imports_it_when_used():
    loaded = _modules_after(
        """
        import asyncio
        from nous_sched import QuickJSRuntime, arun_code
        result = asyncio.run(arun_code("return 6 * 7", runtime=QuickJSRuntime(), description="Multiply"))
        assert result.result == 42, result.error
        """
    )
    assert "asyncio" in loaded


def _state(pid: int) -> str:
    """The process's state letter (``Z``: exited, not yet reaped), or ``gone``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0].decode()
    except (FileNotFoundError, ProcessLookupError):
        return "gone"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_close_returns_with_every_idle_worker_exited():
    # The pool kills every idle worker before waiting for any (their exits
    # overlap); when close returns, each has exited.
    pool = WorkerPool(size=4, spares=3)
    tool = Tool("one", lambda args: 1, description="One.")
    assert run_code("return await tools.one({})", [tool], runtime=pool, description="One call").result == 1
    assert pool.wait_for_spares(60)
    pids = pool.pids()
    assert len(pids) >= 3
    pool.close()
    states = {pid: _state(pid) for pid in pids}
    assert all(state in ("Z", "gone") for state in states.values()), states

"""A run's first collection comes once its engine holds ``engine.GC_FIRST``, or
an eighth of its memory limit if that is less (issue 44, the Promise.all row:
quickjs-ng's own first threshold, 256 KB, had a run with many calls pending
collect again at every 1.5-fold growth of its heap). After that first
collection the engine's own rule goes on, so cyclic garbage never meets the
memory limit uncollected. The worker's evidence is its resident memory, read
by a tool between two points of the program: garbage below the threshold is
still held, garbage above it has been collected."""

from __future__ import annotations

import os

import _quickjs
import pytest

from nous_sched import Limits, Tool, WorkerPool, run_code
from nous_sched.runtime import engine

_MIB = 1 << 20

# About 9.5 MB of cyclic garbage (two objects pointing at each other, 40,000 times),
# between two marks: under GC_FIRST, and eight times an 8 MiB limit's threshold.
GARBAGE = """
await tools.mark({});
for (let i = 0; i < 40000; i++) { const a = {i}; const b = {a}; a.b = b; }
await tools.mark({});
return "done";
"""


def _resident(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _garbage_held(limits: Limits) -> int:
    """How much a one-shot worker's resident memory grew while the program made the garbage."""
    with WorkerPool(size=1, spares=0) as pool:
        seen: list[int] = []
        mark = Tool("mark", lambda args: seen.append(_resident(pool.pids()[0])))
        result = run_code(GARBAGE, [mark], runtime=pool, limits=limits, description="t")
        assert result.error is None and result.result == "done", result.error
        assert len(seen) == 2
        return seen[1] - seen[0]


def test_a_workers_garbage_under_gc_first_waits_for_its_first_collection():
    assert engine.GC_FIRST == 16 * _MIB
    assert _garbage_held(Limits()) > 6 * _MIB, "collected before GC_FIRST (the engine's own 256 KB threshold)"


def test_a_workers_first_collection_comes_at_an_eighth_of_a_smaller_memory_limit():
    assert _garbage_held(Limits(memory_bytes=8 * _MIB)) < 3 * _MIB


def test_cyclic_garbage_many_times_the_memory_limit_is_collected_before_the_limit(runtime):
    # About 48 MB of garbage under a 4 MiB limit: the run ends only if every collection comes before the limit.
    program = 'for (let i = 0; i < 200000; i++) { const a = {i}; const b = {a}; a.b = b; } return "done";'
    result = run_code(program, limits=Limits(memory_bytes=4 * _MIB), description="t")
    assert result.error is None and result.result == "done", result.error


def test_the_first_collection_is_set_from_the_memory_limit_and_never_lowered():
    assert engine.load_gc_threshold(), "the binding's layout is not the one expected: the threshold stays 256 KB"
    ctx = _quickjs.Context()
    assert engine.gc_threshold(ctx) == 256 * 1024  # quickjs-ng's own
    engine._first_collection(ctx, 256 * _MIB)
    assert engine.gc_threshold(ctx) == engine.GC_FIRST
    engine._first_collection(ctx, 8 * _MIB)
    assert engine.gc_threshold(ctx) == engine.GC_FIRST, "never lowered"
    small = _quickjs.Context()
    engine._first_collection(small, 8 * _MIB)
    assert engine.gc_threshold(small) == _MIB
    engine._first_collection(small, 4 * _MIB)
    assert engine.gc_threshold(small) == _MIB
    # After the first collection the engine's own rule: the next at 1.5 times what it then holds.
    small.eval("globalThis.keep = []; for (let i = 0; i < 30000; i++) keep.push({i});")
    assert engine.gc_threshold(small) != _MIB


@pytest.mark.parametrize("limit", [4 * _MIB, 256 * _MIB])
def test_an_in_process_run_gets_the_same_first_collection(monkeypatch, limit):
    seen: list[int] = []
    real = engine._first_collection

    def spy(ctx, memory_bytes):
        real(ctx, memory_bytes)
        seen.append(engine.gc_threshold(ctx))

    monkeypatch.setattr(engine, "_first_collection", spy)
    from nous_sched import QuickJSRuntime

    result = run_code("return 1", runtime=QuickJSRuntime(), limits=Limits(memory_bytes=limit), description="t")
    assert result.result == 1 and len(seen) == 1 and seen[0] >= min(engine.GC_FIRST, limit // 8)

"""The engine's step per call: what each call the program makes keeps, and
the CPU slice around each call into the engine (deterministic: object counts
and the binding's own flag, never timings)."""

from __future__ import annotations

import ctypes
import json
import time

import _quickjs
import pytest

from nous_sched import Limits, Tool, run_code
from nous_sched.runtime.engine import Engine, Stopped, _checked
from nous_sched.runtime.worker import budget_offset

# A first step that makes calls before it waits, and a later step (after the
# gate call settles) that makes more, from the same line, then waits again.
PROGRAM = """
const make = () => tools.t({n: 1});
const first = Array.from({length: %(first)d}, make);
await tools.gate({});
const later = Array.from({length: %(later)d}, make);
await tools.gate({});
await Promise.all([...first, ...later]);
return 1;
"""


def _objects_after(first: int, later: int) -> tuple[int, int]:
    """The engine's live objects after its first step, and after the gate's settle."""
    engine = Engine(PROGRAM % {"first": first, "later": later}, ["t", "gate"], Limits(), time.monotonic() + 30)
    try:
        text = engine.start()
        calls = _checked(text)["calls"]
        assert len(calls) == first + 1
        engine.ctx.gc()
        after_first = engine.ctx.memory()["obj_count"]
        text = engine.settle(calls[-1][0], True, "null")  # the gate: the later step makes its calls
        assert len(_checked(text)["calls"]) == later + 1
        engine.ctx.gc()
        return after_first, engine.ctx.memory()["obj_count"]
    finally:
        engine.close()


def test_a_call_made_in_the_programs_first_step_keeps_no_more_objects_than_one_made_later():
    # Each call keeps its call site's frames (for its error's stack). The
    # program's first step runs with no frame of the prelude under it, so a
    # call made there keeps exactly what the same call made later keeps.
    small_first, small_later = _objects_after(10, 10)
    per_first_call = (_objects_after(30, 10)[0] - small_first) / 20
    per_later_call = (_objects_after(10, 30)[1] - small_later) / 20
    assert per_first_call == per_later_call, (per_first_call, per_later_call)


def test_a_failed_call_from_the_first_step_shows_the_same_stack_as_one_from_a_later_step(runtime):
    # Where the program made the call, and nothing of the bridge below it
    # (the first step's call is made before any wait, the second's after one).
    program = """
function deep(n) { return n ? deep(n - 1) : tools.fail({}); }
const stacks = [];
for (let i = 0; i < 2; i++) try { await deep(2); } catch (e) { stacks.push(e.stack); }
return stacks;
"""

    def fail(args):
        raise ValueError("no")

    result = run_code(program, [Tool("fail", fail)], limits=Limits(timeout=20), description="test")
    assert result.error is None, result.error
    first, later = result.result
    assert first == later
    lines = [line.strip() for line in first.splitlines() if line.strip()]
    assert lines == ["at deep (<input>:2:51)"] + ["at deep (<input>:2:40)"] * 2 + ["at program (<input>:4:41)"]


def test_a_first_step_sees_no_this_as_before(runtime):
    # The engine calls the program itself now: `this` is what a call from the
    # bridge gave it (undefined in strict code, the global object otherwise).
    strict = run_code('"use strict"; return this === undefined;', [], description="test")
    loose = run_code("return this === globalThis;", [], description="test")
    assert (strict.error, strict.result) == (None, True)
    assert (loose.error, loose.result) == (None, True)


def _slice_flag(engine: Engine) -> int:
    """The binding's ``has_time_limit`` for the engine's context (the layout :func:`budget_offset` checks)."""
    return ctypes.c_int32.from_address(id(engine.ctx) + 32).value


def test_between_steps_the_engine_holds_no_slice_and_each_settle_of_a_batch_is_armed():
    # The drain needs no slice (so the binding reads no clock for it); every
    # call into the engine that may run the program's code is armed again.
    assert budget_offset(_quickjs) == 64  # (the layout _slice_flag reads)
    program = "const a = tools.t({}); const b = tools.t({}); await a; await b; while (true) {}"
    engine = Engine(program, ["t"], Limits(), time.monotonic() + 1.0)
    try:
        text = engine.start()
        assert _slice_flag(engine) == 0
        ids = [c[0] for c in _checked(text)["calls"]]
        with pytest.raises(Stopped) as stopped:
            # The second settle wakes the endless loop: the deadline's slice stops it.
            engine.settle_many([(ids[0], None, None, True, "1"), (ids[1], None, None, True, "2")])
        assert stopped.value.kind == "timeout"
        assert len(stopped.value.steps) == 1 and json.loads(stopped.value.steps[0]) is not None
    finally:
        engine.close()

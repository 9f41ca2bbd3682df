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


class _Recorded:
    """The engine's context, each call into it that matters here recorded in order (the real context answers)."""

    def __init__(self, ctx: object, seen: list[str]) -> None:
        self._ctx = ctx
        self._seen = seen

    def set_time_limit(self, seconds: float) -> None:
        self._seen.append("slice" if seconds > 0 else "off")
        self._ctx.set_time_limit(seconds)  # type: ignore[attr-defined]

    def execute_pending_job(self) -> bool:
        ran = self._ctx.execute_pending_job()  # type: ignore[attr-defined]
        self._seen.append("job" if ran else "none")
        return bool(ran)

    def __getattr__(self, name: str) -> object:
        return getattr(self._ctx, name)


def _recording(engine: Engine) -> list[str]:
    seen: list[str] = []
    bridge = engine.bridge

    def recorded(op: str, *args: object) -> object:
        seen.append(op)
        return bridge(op, *args)

    engine.ctx = _Recorded(engine.ctx, seen)
    engine.bridge = recorded
    return seen


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ("5", ["settle", "slice", "job", "job", "none", "off", "drain"]),
        ('"text"', ["settle", "slice", "job", "job", "none", "off", "drain"]),
        ("null", ["settle", "slice", "job", "job", "none", "off", "drain"]),
        ('{"x": 1}', ["slice", "settle", "job", "job", "none", "off", "drain"]),
        ("[1]", ["slice", "settle", "job", "job", "none", "off", "drain"]),
    ],
)
def test_a_settle_with_a_primitive_enters_the_engine_unarmed_and_one_with_an_object_armed(payload, expected):
    # Resolving with an object asks it for a `then`, which may be the
    # program's own getter: that settle runs armed. A primitive is never
    # asked: its settle runs without a slice (no clock read), its jobs armed.
    engine = Engine("const a = await tools.t({}); return [a];", ["t"], Limits(), time.monotonic() + 30)
    try:
        (call_id,) = [c[0] for c in _checked(engine.start())["calls"]]
        seen = _recording(engine)
        text = engine.settle(call_id, True, payload)
        assert seen == expected
        assert json.loads(_checked(text)["main"]["json"]) == [json.loads(payload)]
    finally:
        engine.close()


def test_an_objects_then_getter_run_by_a_settle_is_stopped_at_the_deadline():
    program = """
Object.defineProperty(Object.prototype, "then", {get() { for (;;) {} }, configurable: true});
return await tools.t({});
"""
    engine = Engine(program, ["t"], Limits(), time.monotonic() + 1.0)
    try:
        (call_id,) = [c[0] for c in _checked(engine.start())["calls"]]
        with pytest.raises(Stopped) as stopped:
            engine.settle(call_id, True, '{"x": 1}')
        assert stopped.value.kind == "timeout"
    finally:
        engine.close()


def test_a_batchs_later_settles_with_primitives_enter_unarmed_and_their_jobs_armed():
    program = "const r = await Promise.all([tools.t({}), tools.t({}), tools.t({})]); return r;"
    engine = Engine(program, ["t"], Limits(), time.monotonic() + 30)
    try:
        ids = [c[0] for c in _checked(engine.start())["calls"]]
        seen = _recording(engine)
        texts = engine.settle_many(
            [(ids[0], None, None, True, "1"), (ids[1], None, None, True, '{"a": 2}'), (ids[2], None, None, True, "3")]
        )
        assert seen == [
            *["slice", "settle", "job", "none", "off", "drain"],  # (the first: armed as the step starts)
            *["slice", "settle", "job", "none", "off", "drain"],  # an object: armed before its settle
            *["settle", "slice", "job", "job", "job", "none", "off", "drain"],  # a primitive: armed after
        ]
        assert json.loads(_checked(texts[-1])["main"]["json"]) == [1, {"a": 2}, 3]
    finally:
        engine.close()

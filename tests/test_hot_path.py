"""The hot path's promises: what the fast paths must never change.

Each test checks behaviour, never timing: the costs themselves are measured by
hand in ``benchmarks/`` (see ``benchmarks/README.rst``).
"""

from __future__ import annotations

import importlib
import json
import threading
import time

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_sched import CallRecord, CallUsage, Limits, Outcome, SnapshotError, Tool, ToolCallEvent, ToolOutcomeEvent
from nous_sched.events import Event, FrozenDict, FrozenList, frozen_later
from nous_sched.gate.dispatch import CallInfo, RunContext
from nous_sched.runtime.engine import Engine, _checked


def _main_of(text: str):
    return _checked(text)["main"]


def test_a_result_returned_while_calls_are_outstanding_crosses_once():
    # The program returns while two calls it started are still outstanding:
    # the envelope that first carries the result is the only one that does.
    program = "tools.a({}); tools.a({}); return 'x'.repeat(1000);"
    engine = Engine(program, ["a"], Limits(), time.monotonic() + 30)
    try:
        first = _checked(engine.start())  # the envelope's one reader (a long result follows it)
        assert [c[0] for c in first["calls"]] == [1, 2]
        # (With the calls it left pending, for the hint: nous_sched.result._hints.)
        assert first["main"] == {"state": "fulfilled", "json": json.dumps("x" * 1000), "pending": ["a", "a"]}
        assert _main_of(engine.settle(1, True, "null")) is None
        assert _main_of(engine.settle(2, True, "null")) is None
    finally:
        engine.close()


_STEPPED = """
const out = [];
for (let i = 0; i < 4; i++) {
  try { out.push(await tools.a({ i })); } catch (e) { out.push(String(e)); console.log("failed", i); }
  console.log("step", i);
}
const both = await Promise.all([tools.a({ x: 1 }), tools.a({ x: 2 })]);
return [out, both];
"""


def _stepped(one_at_a_time: bool) -> list[str]:
    engine = Engine(_STEPPED, ["a"], Limits(), time.monotonic() + 30)
    try:
        texts = [engine.start()]
        while True:
            calls = _checked(texts[-1])["calls"]
            if not calls:
                return texts
            for call_id, *_ in calls:
                ok = call_id not in (2, 4)  # (two of the loop's calls fail)
                payload = json.dumps(call_id) if ok else json.dumps({"tool": "a", "message": f"no {call_id}"})
                if one_at_a_time:
                    texts.append(engine.settle(call_id, ok, payload))
                else:
                    texts.append(engine.settle_many([(call_id, None, None, ok, payload)])[0])
    finally:
        engine.close()


def test_settling_one_call_steps_as_a_batch_of_that_one_call_does():
    # The worker steps a one-call settle frame with Engine.settle, a batch with
    # settle_many: the program, its logs and its calls cannot tell them apart.
    one, batched = _stepped(True), _stepped(False)
    assert one == batched
    assert _main_of(one[-1])["state"] == "fulfilled"


def test_a_stop_while_settling_one_call_carries_no_earlier_steps():
    from nous_sched.runtime.engine import Stopped

    engine = Engine("await tools.a({}); while (true) {}", ["a"], Limits(timeout=1), time.monotonic() + 0.3)
    try:
        engine.start()
        with pytest.raises(Stopped) as stop:
            engine.settle(1, True, "null")
        assert stop.value.kind == "timeout" and tuple(stop.value.steps) == ()
    finally:
        engine.close()


def test_a_step_with_nothing_new_still_carries_the_dropped_count():
    # A settle that starts no call, logs nothing and does not end the program
    # drains the envelope with nothing in it; once a log line was dropped,
    # every later envelope still says how many.
    program = (
        "const p = Promise.all([tools.a({}), tools.a({}), tools.a({})]); await p; console.log('x'); await p; return 1;"
    )
    limits = Limits(max_log_lines=1)
    engine = Engine(program, ["a"], limits, time.monotonic() + 30)
    try:
        assert len(_checked(engine.start())["calls"]) == 3
        assert engine.settle(1, True, "null") == '{"calls":[],"logs":[],"dropped":0,"main":null}'
        engine.settle(2, True, "null")
    finally:
        engine.close()
    program = "console.log('a'); console.log('b'); const p = Promise.all([tools.a({}), tools.a({})]); return await p;"
    engine = Engine(program, ["a"], limits, time.monotonic() + 30)
    try:
        first = _checked(engine.start())
        assert first["logs"] == ["a"] and first["dropped"] == 1
        assert _checked(engine.settle(1, True, "null")) == {"calls": [], "logs": [], "dropped": 1, "main": None}
        assert _main_of(engine.settle(2, True, "null"))["state"] == "fulfilled"
    finally:
        engine.close()


def test_each_failed_call_has_its_own_call_site_even_with_no_stack_frames_kept():
    # Call sites are captured into one private holder, replaced at every call:
    # a failed call's stack is where that call was made, never an earlier call's.
    program = """
async function early() { return await tools.a({}); }
async function late() { return await tools.a({}); }
await early();
const stacks = [];
try { await late(); } catch (e) { stacks.push(e.stack); }
Error.stackTraceLimit = 0;
try { await late(); } catch (e) { stacks.push(e.stack); }
return stacks;
"""
    engine = Engine(program, ["a"], Limits(), time.monotonic() + 30)
    try:
        text = engine.start()
        for call_id in (1, 2, 3):
            assert [c[0] for c in _checked(text)["calls"]] == [call_id]
            payload = "null" if call_id == 1 else json.dumps({"tool": "a", "message": "no"})
            text = engine.settle(call_id, call_id == 1, payload)
        stacks = json.loads(_main_of(text)["json"])
    finally:
        engine.close()
    assert "at late" in stacks[0] and "early" not in stacks[0]
    assert "early" not in stacks[1] and "late" not in stacks[1]


def test_a_batch_reaches_the_driver_in_one_message_in_order(make_scheduler):
    s = make_scheduler()
    seen = []
    tool = Tool("t", lambda args: seen.append(args["i"]) or args["i"])  # exclusive: one at a time, in order
    with s.batch():
        tickets = [s.submit(tool, {"i": i}) for i in range(5)]
        # Held back until the block ends: the driver has accepted nothing yet.
        assert s.lane_state().submitted == 0
        assert all(t.seq is None for t in tickets)
    assert [s.wait(t).value for t in tickets] == [0, 1, 2, 3, 4]
    assert seen == [0, 1, 2, 3, 4] and [t.seq for t in tickets] == [0, 1, 2, 3, 4]


def test_a_batch_from_another_thread_does_not_hold_back_this_threads_submits(make_scheduler):
    s = make_scheduler()
    tool = Tool("t", lambda args: "ok")
    box = []
    with s.batch():
        held = s.submit(tool, {})
        other = threading.Thread(target=lambda: box.append(s.call(tool, {})))
        other.start()
        other.join(30)
        assert box == [Outcome.success("ok")]  # committed while this thread's batch was open
        assert held.seq is None
    assert s.wait(held) == Outcome.success("ok") and held.seq == 1


def test_a_batch_still_open_at_stop_is_released(make_scheduler):
    s = make_scheduler()
    with s.batch():
        ticket = s.submit(Tool("t", lambda args: "never"), {})
        s.stop()
    # The driver never got the call: it is released as a submit that raced stop() is.
    assert ticket.wait(30) == Outcome.failure("t", "code run is over; scheduler is gone")


def test_a_ticket_is_published_once_and_every_waiter_sees_it(make_scheduler, make_event):
    gate = make_event()
    s = make_scheduler()
    ticket = s.submit(Tool("slow", lambda args: gate.wait(30) and "late"), {})
    got = []
    waiters = [threading.Thread(target=lambda: got.append(ticket.wait(30))) for _ in range(4)]
    for w in waiters:
        w.start()
    s.stop()  # releases the ticket as abandoned; the driver's own release comes later, or never
    gate.set()
    for w in waiters:
        w.join(30)
    abandoned = Outcome.failure("slow", "code run is over; tool call abandoned")
    assert got == [abandoned] * 4 and ticket.wait(0) == abandoned and ticket.done()


def test_a_tool_call_events_session_form_has_every_field_in_order():
    # The audit projection writes every field, in field order, the tool under its wire name "name".
    event = ToolCallEvent("r:code:0", "t", {"a": [1]}, "parallel", 0)
    data = event.as_event().data
    assert [f.name for f in attrs.fields(ToolCallEvent)] == ["id", "tool", "arguments", "mode", "seq", "source"]
    assert list(data) == ["id", "name", "arguments", "mode", "seq", "source"]
    fields = attrs.asdict(event, recurse=False)
    assert data == {("name" if key == "tool" else key): value for key, value in fields.items()}
    assert event.as_event().type == "tool_call"


# A twin of each hot-path record made by attrs' own __init__: _slots.record writes its
# own, and each must make what attrs' would, from the same arguments.
def _attrs_twin(cls):
    fields = {
        f.name: attrs.field(default=f.default, converter=f.converter, init=f.init, eq=f.eq, repr=f.repr)
        for f in attrs.fields(cls)
    }
    return attrs.make_class("Twin" + cls.__name__, fields, frozen=True)


def _same(made, twin):
    for f in attrs.fields(type(made)):
        mine, theirs = getattr(made, f.name), getattr(twin, f.name)
        assert mine == theirs and type(mine) is type(theirs), f.name


@given(
    arguments=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=3),
        lambda inner: st.lists(inner, max_size=3) | st.tuples(inner) | st.dictionaries(st.text(max_size=2), inner),
        max_leaves=6,
    ),
    seq=st.integers(0, 10),
)
@settings(max_examples=50, deadline=None)
def test_the_hot_path_records_make_what_attrs_would(arguments, seq):
    call = ("r:code:3", "t", arguments, "exclusive", seq)
    _same(ToolCallEvent(*call), _attrs_twin(ToolCallEvent)(*call))
    _same(ToolCallEvent(*call, source="direct"), _attrs_twin(ToolCallEvent)(*call, source="direct"))
    outcome = (seq, "t", False, {"kind": "tool_error", "message": arguments}, 7)
    _same(ToolOutcomeEvent(*outcome), _attrs_twin(ToolOutcomeEvent)(*outcome))
    _same(ToolOutcomeEvent(seq, "t", True), _attrs_twin(ToolOutcomeEvent)(seq, "t", True))
    _same(Event("x", {"a": arguments}), _attrs_twin(Event)("x", {"a": arguments}))
    run_ctx = RunContext(deadline=1.0)
    info = ("r:code:2", "t", seq, "parallel", run_ctx)
    _same(CallInfo(*info), _attrs_twin(CallInfo)(*info))
    _same(CallInfo(*info[:4]), _attrs_twin(CallInfo)(*info[:4]))
    _same(Outcome(True, arguments), _attrs_twin(Outcome)(True, arguments))
    timeline = (seq, "t", "parallel", 0.5, 0.75, 1.0, True, 0.625, "", None)
    _same(CallRecord(*timeline), _attrs_twin(CallRecord)(*timeline))
    _same(CallRecord(seq, "t", "exclusive", 0.5), _attrs_twin(CallRecord)(seq, "t", "exclusive", 0.5))
    _same(CallUsage(seq, "t", 4, True), _attrs_twin(CallUsage)(seq, "t", 4, True))


def test_a_record_is_made_by_keyword_too_and_refuses_what_attrs_would():
    made = ToolCallEvent(id="r:code:3", tool="t", arguments={"a": [1]}, mode="exclusive", seq=3)
    assert made == ToolCallEvent("r:code:3", "t", {"a": [1]}, "exclusive", 3) and made.source == "code_mode"
    assert type(made.arguments) is FrozenDict and type(made.arguments["a"]) is FrozenList
    assert (
        repr(made)
        == "ToolCallEvent(id='r:code:3', tool='t', arguments={'a': [1]}, mode='exclusive', seq=3, source='code_mode')"
    )
    assert attrs.evolve(made, seq=4) == ToolCallEvent("r:code:3", "t", {"a": [1]}, "exclusive", 4)
    with pytest.raises(TypeError):
        ToolCallEvent("r:code:3", "t", {}, "exclusive")  # seq missing
    with pytest.raises(TypeError):
        ToolOutcomeEvent(1, "t", True, None, 0, (), "extra")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        made.tool = "u"
    later = ToolCallEvent("code:0", "t", frozen_later('{"b":null}'), "parallel", 0)
    assert later == ToolCallEvent("code:0", "t", {"b": None}, "parallel", 0)
    assert type(later.arguments) is FrozenDict

    class Mine(ToolCallEvent):
        pass

    mine = Mine("code:0", "t", frozen_later('{"b":null}'), "parallel", 0)
    assert mine.as_event() == later.as_event() and type(mine.arguments) is FrozenDict


def test_a_crossed_outcome_is_a_success_with_its_text():
    # Outcome.crossed sets the slots directly (once per call, on a tool thread).
    crossed = Outcome.crossed([1, {"a": None}], '[1,{"a":null}]')
    assert crossed == Outcome.success([1, {"a": None}]) and hash(Outcome.crossed(2, "2")) == hash(Outcome.success(2))
    assert (crossed.ok, crossed.value, crossed.error, crossed.text) == (True, [1, {"a": None}], None, '[1,{"a":null}]')
    assert [f.name for f in attrs.fields(Outcome)] == ["ok", "value", "error", "text", "blobs"]
    held = Outcome.held({"$blob": "b"}, "{}", ("a blob",))
    assert held == Outcome.success({"$blob": "b"}) and held.blobs == ("a blob",) and crossed.blobs == ()

    class Mine(Outcome):
        pass

    assert type(Mine.crossed(1, "1")) is Mine and Mine.crossed(1, "1").text == "1"


# -- snapshot's fast path: the same copy, or the same refusal, as the full walk ----------

# The module, not the function nous_sched re-exports under the same name.
snapshot_module = importlib.import_module("nous_sched.crossing._snapshot")

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**60), max_value=2**60),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
)
_keys = st.one_of(st.text(max_size=3), st.integers(-3, 3), st.booleans(), st.none())
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(_keys, inner, max_size=4),
        st.dictionaries(st.text(max_size=3), inner, max_size=4),
    ),
    max_leaves=20,
)


def _full_walk(value):
    # A snapshot with no fast path: the one walk, straight (no fast path is left in snapshot()).
    try:
        return ("copy", snapshot_module._walk(value, 0, snapshot_module._SNAPSHOT))
    except snapshot_module._Refused as refused:
        return ("refused", refused.message())


def _snapshot(value):
    try:
        return ("copy", snapshot_module.snapshot(value))
    except SnapshotError as exc:
        return ("refused", str(exc))


@settings(max_examples=400, deadline=None)
@given(_values)
def test_the_fast_path_copies_or_refuses_exactly_as_the_full_walk(value):
    assert _snapshot(value) == _full_walk(value)


def test_the_fast_path_hands_cycles_and_depth_to_the_full_walk():
    cyclic: list = []
    cyclic.append(cyclic)
    deep: list = []
    inner = deep
    for _ in range(snapshot_module.MAX_DEPTH + 5):
        inner.append([])
        inner = inner[0]
    for value in (cyclic, deep, {"a": {1, 2}}, {"when": (1, [2.5, None])}):
        assert _snapshot(value) == _full_walk(value)
    assert _snapshot(cyclic)[0] == "refused" and "cyclic" in _snapshot(cyclic)[1]


_json_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=3), inner, max_size=4)),
    max_leaves=20,
)


def _full_check(value):
    # check() without its fast path (_obeys): the walk under the strict table.
    try:
        snapshot_module._walk(value, 0, snapshot_module._JSON)
    except snapshot_module._Refused as refused:
        return refused.message()
    return None


@settings(max_examples=400, deadline=None)
@given(_json_values)
def test_check_passes_or_refuses_exactly_as_its_full_walk(value):
    try:
        snapshot_module.check(value)
        refused = None
    except SnapshotError as exc:
        refused = str(exc)
    expected = _full_check(value)
    assert (refused is None) == (expected is None)
    if refused is not None:
        assert refused.endswith(expected)


# -- a batch's frames: the fast paths make and take exactly what the protocol says -------


def _settle_frame_by_the_protocol(batch):
    # runtime/worker.py: per call b"<id> <1|0> <bytes> " then the payload's UTF-8 bytes.
    body = b"".join(
        b"%d %d %d " % (call_id, ok, len(payload.encode("utf-8", "surrogatepass")))
        + payload.encode("utf-8", "surrogatepass")
        for call_id, _, _, ok, payload in batch
    )
    return len(body + b"S").to_bytes(4, "big") + b"S" + body


_payloads = st.one_of(
    st.sampled_from(["null", "1", '{"a":[1,2]}', '"\\u00e9"', "x" * 5000]),
    st.text(max_size=20),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=2),
)


@given(batch=st.lists(st.tuples(st.integers(1, 10**9), st.booleans(), _payloads), min_size=1, max_size=8))
@settings(max_examples=200, deadline=None)
def test_a_settle_frame_is_the_protocols_for_any_batch(batch):
    # A batch of short ASCII payloads is made as one text; any other as bytes: the same frame.
    from nous_sched.runtime._remote import settle_frame

    items = [(call_id, None, None, ok, payload) for call_id, ok, payload in batch]
    assert settle_frame(items) == _settle_frame_by_the_protocol(items)


def _frame(op: bytes, body: bytes) -> bytes:
    return len(body + op).to_bytes(4, "big") + op + body


def test_a_batchs_answers_are_taken_whole_in_order_and_nothing_else_is():
    from nous_sched.runtime import procio
    from nous_sched.runtime.engine import QUIET

    worker = object.__new__(procio.Worker)  # its buffer only: no process is needed to split it
    quiet = QUIET.encode()
    three = _frame(b"E", quiet) + _frame(b"E", b"two") + _frame(b"E", quiet)
    worker.buf = bytearray(three + _frame(b"E", "é\udc80".encode("utf-8", "surrogatepass")) + _frame(b"X", b"{}"))
    taken = worker.envelopes(3, 1 << 20, QUIET)
    assert taken == [QUIET, "two", QUIET] and taken[0] is QUIET  # at most as many as asked; a quiet one not decoded
    assert worker.envelopes(5, 1 << 20, QUIET) == ["é\udc80"]  # never past another op: receive() reads it
    assert bytes(worker.buf) == _frame(b"X", b"{}")
    worker.buf = bytearray(_frame(b"E", b"whole") + _frame(b"E", quiet)[:-2])
    assert worker.envelopes(5, 1 << 20, QUIET) == ["whole"] and bytes(worker.buf) == _frame(b"E", quiet)[:-2]
    worker.buf = bytearray(_frame(b"E", b"x" * 100))
    assert worker.envelopes(5, 50, QUIET) == [] and len(worker.buf) == 105  # over the run's largest frame: receive()'s
    worker.buf = bytearray(_frame(b"E", b"ok") + _frame(b"E", b"\xff"))
    assert worker.envelopes(5, 1 << 20, QUIET) == ["ok"] and bytes(worker.buf) == _frame(b"E", b"\xff")  # not UTF-8
    worker.buf = bytearray(b"\x00\x00\x00\x00E")
    assert worker.envelopes(5, 1 << 20, QUIET) == [] and len(worker.buf) == 5  # an empty frame: receive()'s to refuse


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8),
    # (no key that is an array index: JavaScript puts those first, where a dict keeps insertion order)
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=4).filter(lambda k: not (k.isascii() and k.isdigit())), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_JSON_VALUES, min_size=1, max_size=6))
def test_each_calls_arguments_reach_the_host_as_the_json_text_the_program_made(values):
    # The prelude quotes an argument text with no string in it itself, and any
    # other with JSON.stringify: the host reads the same text either way.
    arguments = json.dumps(values)
    program = f"const values = {arguments};\nfor (const v of values) tools.a(v);\nreturn 1;"
    engine = Engine(program, ["a"], Limits(), time.monotonic() + 30)
    try:
        envelope = _checked(engine.start())
    finally:
        engine.close()
    texts = [c[2] for c in envelope["calls"]]
    assert [json.loads(text) for text in texts] == values
    assert texts == [json.dumps(v, ensure_ascii=False, separators=(",", ":")) for v in values]

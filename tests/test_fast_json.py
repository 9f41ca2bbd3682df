"""The payload fast paths change no answer: with ``orjson`` (the ``speed``
extra) and without it, every value and text crosses, or is refused, exactly as
the snapshot walk decides, in the same spelling; and the audit's copy of a
call's arguments, kept as text and frozen on first read, stays what the tool
got before it ran.

Every test here runs twice (``json_path``): with ``orjson`` imported, and with
it hidden, as on a machine without the extra.
"""

from __future__ import annotations

import datetime
import enum
import gc
import importlib
import json
import math
import pickle
import sys
import threading
import uuid

import attrs
import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nous_sched import Scheduler, SnapshotError, Tool, ToolCallEvent, run_code
from nous_sched.crossing import _fastjson
from nous_sched.events import Event, FrozenDict, FrozenList, freeze, frozen_later
from nous_sched.outcome import Outcome
from nous_sched.result import budget
from nous_sched.runtime import engine

# The module, not the function nous_sched re-exports under the same name.
snapshot_module = importlib.import_module("nous_sched.crossing._snapshot")
MAX_DEPTH = snapshot_module.MAX_DEPTH


@pytest.fixture(params=["orjson", "stdlib"], autouse=True)
def json_path(request, monkeypatch):
    """Once with orjson, once with it hidden (an import of it fails, as when it is not installed)."""
    _fastjson.reset()
    if request.param == "stdlib":
        monkeypatch.setitem(sys.modules, "orjson", None)
    assert _fastjson.available() == (request.param == "orjson")
    yield request.param
    monkeypatch.undo()
    _fastjson.reset()


# -- the reference: the walk and the standard library, with no fast path -----------------


def _reference_text(value):
    try:
        copy = snapshot_module._walk(value, 0, snapshot_module._SNAPSHOT)
    except snapshot_module._Refused as refused:
        return ("refused", refused.message())
    except RecursionError:
        return ("refused", "deep")
    text = json.dumps(copy, separators=(",", ":"), allow_nan=False)
    size = len(json.dumps(copy, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))
    return ("copy", copy, text, size)


def _snapshot_text(value):
    try:
        copy, text, size = snapshot_module.snapshot_text(value)
    except SnapshotError as exc:
        return ("refused", str(exc))
    return ("copy", copy, text, size)


def _same(a, b):
    # Equal as JSON values (NaN never crosses, so == is enough), and equal in type, all the way down.
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if type(a) is list:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a) is float:
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return a == b


def _agree(got, expected):
    assert got[0] == expected[0], (got, expected)
    if got[0] == "copy":
        assert _same(got[1], expected[1]) and got[2:] == expected[2:], (got, expected)
    else:
        assert got[1] == expected[1]


class Colour(enum.Enum):
    RED = 1
    ODD = float("nan")


class Level(enum.IntEnum):
    LOW = 1


class Name(str, enum.Enum):
    A = "a"


class Str(str):
    pass


class Int(int):
    pass


_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-5, 1e-4, 9.99e-5, 1e15, 1e16, 1e22, 5e-324, -0.0, 0.1 + 0.2, 1.7976931348623157e308]),
)
_ints = st.one_of(
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from([2**53 - 1, 2**53, -(2**53 - 1), -(2**53), 10**15, 10**16]),
)
_text = st.one_of(
    st.text(max_size=6),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x80), max_size=6),
    st.sampled_from(["\ud800", "a\udfffb", "\x7f", "\u2028", "null", "1e5", "0.00001", "\\u00e9", "é"]),
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    _ints,
    _floats,
    _text,
    st.sampled_from(
        [
            Colour.RED,
            Colour.ODD,
            Level.LOW,
            Name.A,
            Str("s"),
            Int(3),
            uuid.UUID(int=7),
            datetime.date(2024, 1, 2),
            b"x",
            orjson.Fragment(b"NaN"),
            orjson.Fragment(b'{"a":1,"a":2}'),
            orjson.Fragment(b"12345678901234567890"),
            orjson.Fragment(b"null"),
            orjson.Fragment(b"[1]"),
        ]
    ),
)
_keys = st.one_of(_text, st.integers(-3, 3), st.booleans(), st.none(), st.just(Str("k")), st.just(1.5))
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(_keys, inner, max_size=4),
        st.dictionaries(st.text(max_size=3), inner, max_size=4),
        st.frozensets(st.integers(0, 5), max_size=3),
    ),
    max_leaves=25,
)


@settings(max_examples=500, deadline=None)
@given(_values)
@example({"a": float("nan"), "b": None})
@example([None, float("inf")])
@example({"x": [1.5, "é", "\x7f", None]})
@example(2**53 - 1)
@example(-(2**53 - 1))
@example(2**53)
@example(-(2**53))
@example(0)
@example(True)
def test_a_result_crosses_exactly_as_the_walk_and_the_standard_library_say(value):
    _agree(_snapshot_text(value), _reference_text(value))


def _nested(levels, leaf=1):
    value = leaf
    for i in range(levels):
        value = [value] if i % 2 else {"k": value}
    return value


@pytest.mark.parametrize("levels", [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 254, 255, 300])
def test_nesting_crosses_up_to_max_depth_and_no_further(levels):
    value = _nested(levels)
    got = _snapshot_text(value)
    _agree(got, _reference_text(value))
    assert got[0] == ("copy" if levels <= MAX_DEPTH else "refused")
    text = json.dumps(value)
    assert _loads(text)[0] == ("value" if levels <= MAX_DEPTH else "refused")
    assert _loads(text) == _reference_loads(text)


def test_the_text_a_program_receives_is_the_engines_own_spelling():
    # runtime/engine.py encodes every value without its text the same way.
    for value in ([1.5, 1e-05, "é\ud800\x00\x7f", {"a": None}], 1e22, "x", None, {"k": [True, -0.0]}):
        assert snapshot_module.dumps(value) == engine._encode_value(value)
        copy, text, _ = snapshot_module.snapshot_text(value)
        assert text == engine._encode_value(copy)


def test_a_large_result_of_records_takes_one_text_and_keeps_no_shared_container():
    records = [{"id": i, "name": f"item-{i}", "tags": ["a", "b"], "score": i * 0.5} for i in range(2000)]
    copy, text, size = snapshot_module.snapshot_text(records)
    assert copy == records and copy is not records and copy[0] is not records[0]
    assert copy[0]["tags"] is not records[0]["tags"]
    assert text == json.dumps(records, separators=(",", ":")) and size == len(text)


def test_a_crossed_outcome_carries_its_text_to_the_program():
    copy, text, _ = snapshot_module.snapshot_text({"a": [1, "é"]})
    outcome = Outcome.crossed(copy, text)
    assert outcome == Outcome.success({"a": [1, "é"]}) and outcome.text == text
    assert Outcome.success(copy).text is None
    assert engine._payload(outcome) == (True, text) == engine._payload(Outcome.success(copy))
    assert engine._payload(Outcome.failure("t", "no")) == (False, '{"tool":"t","message":"no"}')


def test_the_fast_path_answers_for_plain_json_and_leaves_the_rest_to_the_walk(json_path):
    # Not a timing: which values orjson answers for at all, so the properties above test it.
    records = [{"id": i, "name": f"item-{i}", "tags": ["a"], "score": i * 0.5, "note": None} for i in range(50)]
    text = json.dumps(records)
    answers = _fastjson.encode(records, snapshot_module.dumps) is not _fastjson.UNSURE
    assert answers == (json_path == "orjson") == (_fastjson.parse(text) is not _fastjson.UNSURE)
    assert (_fastjson.encode({"é": "ü\x7f"}, snapshot_module.dumps) is not _fastjson.UNSURE) == answers
    assert (_fastjson.spaced_bytes({"logs": ["a, b"], "result": records}) is not _fastjson.UNSURE) == answers
    for value in (
        float("nan"),
        [1.0, float("inf")],
        [1e-05],
        [1e16],
        [3e-10],
        (1, 2),
        {"a": orjson.Fragment(b"[1]")},
        uuid.UUID(int=1),
        Colour.RED,
        {"a": Str("x")},
        {1: 2},
        [2**53],
        _nested(MAX_DEPTH + 1),
        "\ud800",
    ):
        assert _fastjson.encode(value, snapshot_module.dumps) is _fastjson.UNSURE, value
    deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    for text in ("18446744073709551616", "9007199254740992", "[1e400]", "NaN", '"\\ud800"', deep, "[1e16]"):
        assert _fastjson.parse(text) is _fastjson.UNSURE, text


# -- JSON text in: a program's arguments ---------------------------------------------------


def _reference_loads(text):
    try:
        value = snapshot_module._decode(text)
        snapshot_module._walk(value, 0, snapshot_module._JSON)
    except snapshot_module._Refused as refused:
        return ("refused", refused.message())
    except (ValueError, RecursionError):
        return ("refused", "bad")
    return ("value", value)


def _loads(text):
    try:
        return ("value", snapshot_module.loads(text))
    except SnapshotError as exc:
        return ("refused", "bad" if "not valid JSON" in str(exc) or "not JSON (JSON has no" in str(exc) else str(exc))


_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), _ints, _floats, _text),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_text, inner, max_size=4)),
    max_leaves=25,
)


def _as_text(value, ascii_only, spaced):
    separators = (", ", ": ") if spaced else (",", ":")
    return json.dumps(value, ensure_ascii=ascii_only, separators=separators)


@settings(max_examples=500, deadline=None)
@given(_json_values, st.booleans(), st.booleans())
@example(18446744073709551616, True, False)
@example({"a": 1, "b": [1e400]}, True, False)
def test_json_text_parses_exactly_as_the_standard_library_and_the_walk_say(value, ascii_only, spaced):
    text = _as_text(value, ascii_only, spaced)
    got, expected = _loads(text), _reference_loads(text)
    assert got[0] == expected[0]
    if got[0] == "value":
        assert _same(got[1], expected[1])
    else:
        assert got[1] == expected[1] or expected[1] == "bad"


_pieces = st.sampled_from(
    [
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        '"',
        "\\",
        "\\u",
        "d800",
        "00e9",
        "1",
        "0",
        "-",
        ".",
        "e",
        "E",
        "+",
        "5",
        " ",
        "\t",
        "\n",
        "\x00",
        "\x1f",
        "\ufeff",
        "é",
        "\ud800",
        "true",
        "null",
        "NaN",
        "Infinity",
        "a",
        "9007199254740993",
    ]
)


@settings(max_examples=1500, deadline=None)
@given(st.lists(_pieces, max_size=14).map("".join))
@example('{"a":1,"a":2}')
@example('"\\ud800"')
@example("-0")
@example("\ufeff[1]")
@example('["\x01"]')
@example(" [1] ")
def test_any_text_parses_or_is_refused_exactly_as_without_orjson(text):
    got, expected = _loads(text), _reference_loads(text)
    assert got[0] == expected[0], (text, got, expected)
    if got[0] == "value":
        assert _same(got[1], expected[1])


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False), st.integers(0, 25))
def test_numbers_parse_to_the_same_double(number, digits):
    for text in (repr(number), f"{number:.{digits}f}", f"[{number!r}, {number:.{digits}f}]"):
        got, expected = _loads(text), _reference_loads(text)
        assert got[0] == expected[0] and (got[0] == "refused" or _same(got[1], expected[1])), text


# -- the audit's copy of the arguments ---------------------------------------------------


def test_arguments_kept_as_text_read_as_their_frozen_copy():
    text = '{"a":[1,{"b":null}],"c":"é"}'
    event = ToolCallEvent("code:0", "t", frozen_later(text), "parallel", 0)
    args = event.arguments
    assert type(args) is FrozenDict and type(args["a"]) is FrozenList and type(args["a"][1]) is FrozenDict
    assert args == json.loads(text) and event.arguments is args  # built once
    with pytest.raises(TypeError):
        args["a"].append(2)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        event.arguments = {}
    eager = ToolCallEvent("code:0", "t", json.loads(text), "parallel", 0)
    assert event == eager and repr(event) == repr(eager)
    assert attrs.asdict(event, recurse=False) == attrs.asdict(eager, recurse=False)
    assert pickle.loads(pickle.dumps(event)) == eager


def test_arguments_kept_as_text_are_no_work_for_the_garbage_collector():
    # One per started call outlives the call in its record: once the collector
    # has looked at it, it stops tracking it (the full collections a run's
    # records bring on do not count it).
    later = frozen_later('{"a":[1]}')
    event = ToolCallEvent("code:0", "t", later, "parallel", 0)
    gc.collect()
    assert not gc.is_tracked(later)
    assert freeze(later) is later and event.arguments == {"a": [1]}


def test_the_session_form_of_arguments_kept_as_text_has_every_field_in_order():
    event = ToolCallEvent("r:code:0", "t", frozen_later('{"a":[1]}'), "parallel", 0)
    session = event.as_event()
    assert type(session) is Event and session.type == "tool_call"
    data = session.data
    assert list(data) == ["id", "name", "arguments", "mode", "seq", "source"]  # the tool under its wire name
    fields = attrs.asdict(event, recurse=False)
    assert data == {("name" if key == "tool" else key): value for key, value in fields.items()}
    assert session.data is data and type(data) is FrozenDict
    assert session == ToolCallEvent("r:code:0", "t", {"a": [1]}, "parallel", 0).as_event()


def test_two_first_readers_get_one_copy():
    event = ToolCallEvent("code:0", "t", frozen_later('{"a":[1,2,3]}'), "parallel", 0)
    start = threading.Barrier(8)
    seen = []

    def read():
        start.wait(30)
        seen.append(event.arguments)

    threads = [threading.Thread(target=read, name=f"reader-{i}") for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(seen) == 8 and all(copy is seen[0] for copy in seen)


def _mutating(args):
    # A tool that changes everything it was given, all the way down, before it answers.
    args["records"][0]["name"] = "changed"
    args["records"][1]["tags"].append("extra")
    args["records"].append({"id": 99})
    args["new"] = True
    return len(args["records"])


def test_a_tool_that_mutates_its_arguments_cannot_change_the_audit(runtime):
    program = (
        "const records = [{id: 1, name: 'a', tags: ['x']}, {id: 2, name: 'b', tags: ['y']}];\n"
        "const n = await tools.mutate({records});\n"
        "return [n, records[0].name];"
    )
    result = run_code(program, [Tool("mutate", _mutating)], description="a tool that mutates its arguments")
    assert result.ok and result.result == [3, "a"], result.error
    (call,) = [e for e in result.events if e.type == "tool_call"]
    assert call.arguments == {"records": [{"id": 1, "name": "a", "tags": ["x"]}, {"id": 2, "name": "b", "tags": ["y"]}]}
    assert call.as_event().data["arguments"] == call.arguments


def test_the_audit_read_after_the_tool_ran_and_before_are_the_same(make_scheduler, make_event):
    # Scheduler.submit snapshots a Python value: its audit copy is frozen at once; either way the
    # copy read after the tool mutated its own is what the tool got.
    release = make_event()
    s = make_scheduler()

    def slow(args):
        release.wait(30)
        return _mutating(args)

    records = [{"id": 1, "name": "a", "tags": ["x"]}, {"id": 2, "name": "b", "tags": ["y"]}]
    ticket = s.submit(Tool("slow", slow), {"records": records})
    release.set()
    assert s.wait(ticket).value == 3
    (call,) = s.logged_events()
    assert call.arguments == {"records": [{"id": 1, "name": "a", "tags": ["x"]}, {"id": 2, "name": "b", "tags": ["y"]}]}
    assert records[1]["tags"] == ["y"]  # nor the caller's own value


def test_a_result_the_tool_keeps_changing_reaches_the_program_as_returned(runtime):
    kept = {"items": [1, 2, 3]}

    def give(args):
        return kept

    def change(args):
        kept["items"].append(4)
        return None

    program = "const a = await tools.give({}); await tools.change({}); const b = await tools.give({}); return [a, b];"
    result = run_code(program, [Tool("give", give), Tool("change", change)], description="a result the tool keeps")
    assert result.ok and result.result == [{"items": [1, 2, 3]}, {"items": [1, 2, 3, 4]}], result.error


def test_a_scheduler_result_is_its_snapshot_with_its_text():
    with Scheduler(timeout=30) as s:
        outcome = s.call(Tool("t", lambda args: {"when": datetime.date(2024, 1, 2), "n": (1, 2)}), {})
    assert outcome == Outcome.success({"when": "2024-01-02", "n": [1, 2]})
    assert outcome.text == '{"when":"2024-01-02","n":[1,2]}'


# -- the bytes a model reads ----------------------------------------------------------

_model_text = st.one_of(
    _text,
    st.text(alphabet=st.sampled_from(list(',:"\\\n{}[] aé\u2028\U0001f600\ud800')), max_size=8),
)
_answers = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**53) + 1, 2**53 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        _model_text,
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_model_text, inner, max_size=4)),
    max_leaves=25,
)


@settings(max_examples=600, deadline=None)
@given(_answers)
@example({"logs": ["a, b: c", 'say "hi"'], "result": {"k:": [1, {}, []], '":': "\\"}})
@example({"logs": [], "result": [1e-05, 1e16, 0.5]})
@example(":")
@example({"a": ":b", "c:": [":", ",", "{"], "": ""})
@example(["", "", {"": ""}, [[]], {}])
@example({"a": "x,y", "b": "p"})
@example(["é,", "ü"])
def test_the_bytes_a_model_reads_are_counted_as_json_dumps_writes_them(value):
    text = json.dumps(value, ensure_ascii=False)
    assert snapshot_module.text_bytes(value) == len(text.encode("utf-8", "backslashreplace")) == budget.size(value)


def test_separators_are_counted_in_one_pass_unless_a_string_may_hold_one():
    # Which texts the one-pass count answers for (the property above pins every answer):
    # plain records do; a string holding a separator, or any escape, goes to the indented count.
    def count(value):
        return _fastjson._separators(orjson.dumps(value))

    records = [{"id": i, "name": f"item-{i}", "tags": ["a", ""], "score": 0.5} for i in range(3)]
    assert count(records) == len(json.dumps(records)) - len(json.dumps(records, separators=(",", ":")))
    assert count({"a": "x,y"}) is None and count([":"]) is None and count(['say "hi"']) is None


def test_a_runs_answer_is_counted_as_the_model_reads_it(runtime):
    program = 'console.log("a, b: \\"c\\""); return {"k: v": [1, 2.5, "x,y"], "n": null, "s": "é"};'
    result = run_code(program, [], description="an answer with separators in its strings")
    assert result.ok, result.error
    answer = {"logs": list(result.logs), "result": result.result}
    assert result.usage.answer_bytes == len(json.dumps(answer, ensure_ascii=False).encode("utf-8"))


def test_each_thread_encodes_inside_its_own_lists_and_keeps_no_value(json_path):
    # The fast path reuses one set of nesting lists per thread (_dumps_padded):
    # threads encoding at once each get their own value's text, and once a
    # value is encoded the lists hold nothing of it.
    values = [[{"t": t, "i": i, "deep": _nested(MAX_DEPTH - 2, leaf=t)}] for t in range(4) for i in range(3)]
    texts: dict[int, list[str]] = {}
    start = threading.Barrier(4)

    def encode(t):
        start.wait()
        texts[t] = [snapshot_module.snapshot_text(value)[1] for value in values if value[0]["t"] == t]

    threads = [threading.Thread(target=encode, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for t in range(4):
        assert texts[t] == [_reference_text(value)[2] for value in values if value[0]["t"] == t]
    chain = getattr(_fastjson._pads, "chain", None)
    assert json_path == "stdlib" or chain is None or chain[1] == [None]


# -- long JSON texts cross after the envelope, as they are ----------------------------------------


def test_long_arguments_and_a_long_result_cross_after_the_envelope_unchanged(runtime):
    # Past prelude.js's OUT_OF_LINE (512 units) a call's arguments and the result cross
    # unescaped after the envelope; what the tool and the caller get is the same value.
    got = []
    value = {
        "s": 'quote " back \\ nl \n tab \t ctl \x01 é \u2028 😀',
        "n": [1, 2.5, -0.0, None, True],
        "pad": "x" * 600,
    }
    program = (
        "const v = "
        + json.dumps(value)
        + ";\nconst a = await tools.keep(v);\nawait tools.keep({short: 1});\nreturn [v, a];"
    )
    tool = Tool("keep", lambda args: got.append(args) or args, concurrency_safe=lambda args: True)
    result = run_code(program, [tool], description="long texts")
    assert result.ok, result.error
    assert got == [value, {"short": 1}]
    assert result.result == [value, value]
    assert result.calls[0].arguments == value


def _envelope(calls, main, *pieces):
    head = json.dumps({"calls": calls, "logs": [], "dropped": 0, "main": main}, separators=(",", ":"))
    return head + "".join("\x01" + piece for piece in pieces)


def test_an_envelope_takes_its_long_texts_in_order_each_once():
    text = _envelope(
        [[1, "t", 0], [2, "t", "{}"], [3, "t", 1]], {"state": "fulfilled", "json": 2}, '{"a":1}', "[2]", "3"
    )
    envelope = engine._checked(text)
    assert [c[2] for c in envelope["calls"]] == ['{"a":1}', "{}", "[2]"] and envelope["main"]["json"] == "3"
    for bad in (
        _envelope([[1, "t", 0]], None),  # a piece missing
        _envelope([[1, "t", 0]], None, "{}", "{}"),  # one left over
        _envelope([[1, "t", 1], [2, "t", 0]], None, "{}", "{}"),  # out of order
        _envelope([[1, "t", True]], None, "{}"),  # not an index
        _envelope([[1, "t", 0.0]], None, "{}"),
        _envelope([], {"state": "fulfilled", "json": 1}, "1"),
        "\x01{}",  # no envelope before the pieces
    ):
        assert engine._checked(bad) is None, bad

"""snapshot(): the JSON-shaped copy of everything that crosses the lane.

One test per row of the table in ``nous_sched/crossing/_snapshot.py``, one per refusal
(the message names the path), independence, and a property test on JSON values.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import enum
import json
import math
import pathlib
import types
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_sched import ConfigError, SnapshotError, Tool, snapshot
from nous_sched.crossing import MAX_DEPTH


def refused(value, *fragments):
    with pytest.raises(SnapshotError) as info:
        snapshot(value)
    assert isinstance(info.value, ConfigError)
    for fragment in fragments:
        assert fragment in str(info.value), f"{fragment!r} not in {str(info.value)!r}"
    return str(info.value)


# --- the table, row by row ---------------------------------------------------------------


@pytest.mark.parametrize("value", [None, True, False, 0, -7, 2**53 - 1, "", "text", "ünïcode ✓"])
def test_scalars_are_themselves(value):
    out = snapshot(value)
    assert out == value and type(out) is type(value)


@pytest.mark.parametrize("value", [0.0, -0.0, 1.5, 1e308, -2.5e-308])
def test_finite_floats_are_themselves(value):
    out = snapshot(value)
    assert type(out) is float and (out == value and math.copysign(1, out) == math.copysign(1, value))


def test_dict_is_a_new_dict_with_str_keys_kept():
    value = {"a": 1, "b": {"c": [2]}}
    out = snapshot(value)
    assert out == value and out is not value and out["b"] is not value["b"]


@pytest.mark.parametrize(
    "key,spelled",
    [(1, "1"), (-3, "-3"), (1.5, "1.5"), (True, "true"), (False, "false"), (None, "null")],
)
def test_non_str_keys_are_spelled_as_json_spells_them(key, spelled):
    out = snapshot({key: "v"})
    assert out == {spelled: "v"}
    assert json.loads(json.dumps({key: "v"})) == out


def test_any_mapping_becomes_a_dict():
    for mapping in (
        types.MappingProxyType({"a": 1}),
        collections.OrderedDict([("b", 2), ("a", 1)]),
        collections.UserDict({"a": [1]}),
        collections.defaultdict(list, {"a": 1}),
    ):
        out = snapshot(mapping)
        assert type(out) is dict and out == dict(mapping)
    assert list(snapshot(collections.OrderedDict([("b", 2), ("a", 1)]))) == ["b", "a"], "order is kept"


def test_lists_and_tuples_become_new_lists():
    inner = [1, 2]
    value = [inner, (3, (4, 5)), ()]
    out = snapshot(value)
    assert out == [[1, 2], [3, [4, 5]], []]
    assert type(out[1]) is list and type(out[1][1]) is list
    assert out is not value and out[0] is not inner
    assert snapshot((1, "a")) == [1, "a"]


def test_sets_become_lists_sorted_by_json_text():
    assert snapshot({3, 1, 2}) == [1, 2, 3]
    assert snapshot(frozenset({"b", "a", "c"})) == ["a", "b", "c"]
    mixed = {"x", 10, 9, None, (1, 2)}
    out = snapshot(mixed)
    assert out == sorted(out, key=lambda v: json.dumps(v, sort_keys=True))
    assert sorted(map(json.dumps, out)) == sorted(map(json.dumps, ["x", 10, 9, None, [1, 2]]))
    # Reproducible: the same set built in a different order snapshots the same.
    assert snapshot(set(["b", "a", "c"])) == snapshot(set(["c", "b", "a"]))


class Colour(enum.Enum):
    RED = "red"
    BLUE = 2
    NESTED = ("a", 1)


class Level(enum.IntEnum):
    HIGH = 3


class Mode(str, enum.Enum):
    SAFE = "safe"


def test_enums_are_the_snapshot_of_their_value():
    assert snapshot(Colour.RED) == "red"
    assert snapshot(Colour.BLUE) == 2
    assert snapshot(Colour.NESTED) == ["a", 1]
    assert snapshot(Level.HIGH) == 3 and type(snapshot(Level.HIGH)) is int
    assert snapshot(Mode.SAFE) == "safe" and type(snapshot(Mode.SAFE)) is str
    assert snapshot({"c": [Colour.RED]}) == {"c": ["red"]}
    assert snapshot({Colour.RED: 1, Level.HIGH: 2}) == {"red": 1, "3": 2}


def test_str_mixin_enum_keys_are_their_value():
    assert snapshot({Mode.SAFE: 1}) == {"safe": 1}


def test_dates_and_times_are_isoformat():
    moment = datetime.datetime(2024, 5, 1, 12, 30, 15, 250, tzinfo=datetime.timezone.utc)
    assert snapshot(moment) == "2024-05-01T12:30:15.000250+00:00"
    assert snapshot(datetime.datetime(2024, 5, 1, 8, 0)) == "2024-05-01T08:00:00"
    assert snapshot(datetime.date(2024, 5, 1)) == "2024-05-01"
    assert snapshot(datetime.time(9, 5)) == "09:05:00"
    assert snapshot({"when": [datetime.date(2000, 1, 2)]}) == {"when": ["2000-01-02"]}


def test_uuid_and_paths_are_str():
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert snapshot(u) == "12345678-1234-5678-1234-567812345678"
    assert snapshot(pathlib.PurePosixPath("/tmp/x.txt")) == "/tmp/x.txt"
    assert snapshot(pathlib.Path("a") / "b") == str(pathlib.Path("a") / "b")
    assert snapshot(pathlib.PureWindowsPath("C:/dir/f")) == "C:\\dir\\f"


def test_subclasses_of_scalars_are_copied_down_to_the_base_type():
    class MyInt(int):
        pass

    class MyFloat(float):
        pass

    class MyStr(str):
        pass

    for value, base in [(MyInt(5), int), (MyFloat(1.5), float), (MyStr("s"), str)]:
        out = snapshot(value)
        assert type(out) is base and out == value
    with pytest.raises(SnapshotError):
        snapshot(MyFloat("nan"))


def test_the_scheduler_snapshots_arguments_with_this_function(make_scheduler):
    args = {"tags": {"b", "a"}, 1: (2, 3), "when": datetime.date(2024, 1, 2)}
    s = make_scheduler()
    assert s.call(Tool("echo", lambda a: a), args).value == snapshot(args)
    assert s.logged_events()[0].arguments == snapshot(args)


# --- refusals: each names the path -----------------------------------------------------


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_nan_and_infinities_are_refused(value):
    message = refused({"items": [0, {"when": value}]}, "$.items[1].when", "NaN or Infinity")
    assert repr(value) in message


@pytest.mark.parametrize(
    "value", [b"raw", bytearray(b"raw"), memoryview(b"raw")], ids=["bytes", "bytearray", "memoryview"]
)
def test_bytes_are_refused(value):
    refused({"blob": value}, "$.blob", "bytes are not JSON")


@pytest.mark.parametrize(
    "key,kind",
    [((1, 2), "tuple"), (frozenset(), "frozenset"), (b"k", "bytes"), (float("nan"), "float"), (object(), "object")],
    ids=["tuple", "frozenset", "bytes", "nan", "object"],
)
def test_other_key_types_are_refused(key, kind):
    refused({"outer": {key: 1}}, "$.outer", f"a key of type {kind} is not JSON")


def _f():
    return None


@pytest.mark.parametrize(
    "value,kind",
    [
        (_f, "function"),
        (lambda: 1, "function"),
        (len, "builtin_function_or_method"),
        (object(), "object"),
        (decimal.Decimal("1.5"), "Decimal"),
        (1 + 2j, "complex"),
        (types.SimpleNamespace(a=1), "SimpleNamespace"),
        (Ellipsis, "ellipsis"),
        (iter([1]), "list_iterator"),
    ],
    ids=["function", "lambda", "builtin", "object", "decimal", "complex", "namespace", "ellipsis", "iterator"],
)
def test_other_objects_are_refused_naming_path_and_type(value, kind):
    message = refused({"items": [1, 2, {"x": value}]}, "$.items[2].x", f"a value of type {kind} is not JSON")
    assert " at 0x" not in message, "no address leaks"


def test_top_level_refusal_names_the_root():
    refused(object(), "$: a value of type object")


def test_non_identifier_keys_are_quoted_in_the_path():
    # As a program writes the path (JSON-quoted), the same spelling schema errors use.
    refused({"a key": {"1x": [object()]}}, '$["a key"]["1x"][0]')
    refused({"café": [object()]}, '$["café"][0]')


def test_set_element_refusal_names_the_set():
    refused({"s": {b"x"}}, "$.s[*]", "bytes")


def test_cycles_are_refused():
    lst = [1]
    lst.append(lst)
    refused({"l": lst}, "$.l[1]", "cyclic reference")
    d = {"a": 1}
    d["self"] = d
    refused(d, "$.self", "cyclic reference")
    refused([{"x": [d]}], "$[0].x[0].self", "cyclic reference")


def test_shared_but_acyclic_references_are_fine_and_unshared_after():
    shared = {"k": [1]}
    out = snapshot({"a": shared, "b": [shared, shared]})
    assert out == {"a": {"k": [1]}, "b": [{"k": [1]}, {"k": [1]}]}
    assert out["a"] is not out["b"][0] and out["b"][0] is not out["b"][1]
    assert out["a"]["k"] is not out["b"][0]["k"]


def _nested(depth):
    value = []
    for _ in range(depth):
        value = [value]
    return value


def test_nesting_deeper_than_max_depth_is_refused():
    assert snapshot(_nested(MAX_DEPTH - 1)) == _nested(MAX_DEPTH - 1)
    message = refused(_nested(MAX_DEPTH * 3), f"nested deeper than {MAX_DEPTH} levels")
    assert message.startswith("$[0][0]")
    deep = {"a": {}}
    node = deep["a"]
    for _ in range(MAX_DEPTH + 5):
        node["n"] = {}
        node = node["n"]
    refused(deep, "$.a.n.n.n", "nested deeper")


@pytest.mark.parametrize("a,b", [(1, "1"), (True, "true"), (None, "null")], ids=["int", "bool", "None"])
def test_colliding_keys_are_refused_not_dropped(a, b):
    refused({"outer": {a: "first", b: "second"}}, "$.outer")


# --- independence -------------------------------------------------------------------------


def test_mutating_the_output_never_touches_the_input():
    value = {"list": [1, {"deep": [2, 3]}], "tuple": (4, [5]), "map": {"k": {"j": 1}}}
    original = json.loads(json.dumps(value))
    out = snapshot(value)
    out["list"][1]["deep"].append(99)
    out["tuple"][1].append(99)
    out["map"]["k"]["j"] = 2
    out["new"] = True
    assert json.loads(json.dumps(value)) == original
    assert value["tuple"][1] == [5]


def test_mutating_the_input_never_touches_the_output():
    value = {"a": [1, 2], "b": {"c": 3}}
    out = snapshot(value)
    value["a"].append(3)
    value["b"]["c"] = 4
    assert out == {"a": [1, 2], "b": {"c": 3}}


def _containers(value, acc):
    if isinstance(value, (dict, list)):
        acc.append(value)
        for item in value.values() if isinstance(value, dict) else value:
            _containers(item, acc)
    return acc


def test_two_snapshots_share_no_container():
    value = {"a": [1, [2, {"b": [3]}]], "c": {"d": {}}}
    one, two = snapshot(value), snapshot(value)
    assert one == two == value
    ids_one = {id(c) for c in _containers(one, [])}
    ids_two = {id(c) for c in _containers(two, [])}
    ids_in = {id(c) for c in _containers(value, [])}
    assert len(ids_one) == len(_containers(one, [])) == 7
    assert not ids_one & ids_two and not ids_one & ids_in and not ids_two & ids_in


# --- property ---------------------------------------------------------------------------

# Every int a double holds exactly crosses; the rest are refused (tested above).
safe_ints = st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)

json_values = st.recursive(
    st.none() | st.booleans() | safe_ints | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_json_values_snapshot_to_themselves(value):
    out = snapshot(value)
    assert out == value
    assert json.loads(json.dumps(out)) == value
    if isinstance(value, (dict, list)):
        assert not {id(c) for c in _containers(out, [])} & {id(c) for c in _containers(value, [])}


class _Color(enum.Enum):
    RED = "red"
    ONE = 1


_leaves = (
    json_values
    | st.floats()  # NaN and the infinities too
    | st.binary(max_size=4)
    | st.tuples(safe_ints, st.text(max_size=3))
    | st.frozensets(safe_ints, max_size=4)
    | st.sampled_from(list(_Color))
    | st.dates()
    | st.datetimes()
    | st.uuids()
    | st.decimals(allow_nan=False)
    | st.builds(object)
    | st.just(len)
)
_any_values = st.recursive(
    _leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.one_of(st.text(max_size=4), st.integers(), st.booleans(), st.none()), children, max_size=4)
        | st.sets(safe_ints, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_any_values)
def test_any_value_snapshots_to_strict_json_or_is_refused_by_path(value):
    try:
        out = snapshot(value)
    except SnapshotError as exc:
        assert str(exc).startswith("$"), "the refusal names the path of the offending value"
        return
    text = json.dumps(out, allow_nan=False)  # strict JSON: no NaN, no Infinity, str keys
    assert json.loads(text) == out
    assert snapshot(out) == out, "a snapshot is a fixed point"


# --- one spelling of a path -----------------------------------------------------------------


def test_describe_path_spells_a_path_as_a_program_writes_it():
    from nous_sched.crossing import describe_path

    assert describe_path([]) == "$"
    assert describe_path(["items", 2, "when"]) == "$.items[2].when"
    assert describe_path(["odd key", "café", "1x", 'q"']) == '$["odd key"]["café"]["1x"]["q\\""]'


def test_a_cycle_through_an_enum_member_is_named_where_it_closes():
    holder = enum.Enum("Holder", {"BOX": []})
    holder.BOX.value.append(holder.BOX)
    refused({"e": holder.BOX}, "$.e[0]", "cyclic reference")


def _lists_with_paths(value, parts, acc):
    if isinstance(value, list):
        acc.append((parts, value))
        for i, item in enumerate(value):
            _lists_with_paths(item, [*parts, i], acc)
    elif isinstance(value, dict):
        for key, item in value.items():
            _lists_with_paths(item, [*parts, key], acc)
    return acc


@settings(max_examples=150, deadline=None)
@given(json_values, st.data())
def test_a_cycle_is_refused_at_the_reference_that_closes_it(value, data):
    # The walk finds a cycle only once it has nested too deep, on the refused
    # path: the message must still name the reference that closes the cycle.
    from nous_sched.crossing import describe_path

    root = [value]
    parts, closing = data.draw(st.sampled_from(_lists_with_paths(root, [], [])))
    closing.append(root)
    where = describe_path([*parts, len(closing) - 1])
    message = refused(root, "cyclic reference (a container that contains itself)")
    if len(where) < 80:
        assert message.startswith(where + ": "), (where, message)

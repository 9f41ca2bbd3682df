"""Argument validation against a tool's JSON Schema (nous_sched.gate.schema): messages, drafts, caching, refusals."""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import urllib.request
from types import MappingProxyType

import pytest

from nous_sched import ConfigError, Tool, ToolError
from nous_sched.gate import schema
from nous_sched.outcome import MAX_MESSAGE, TRUNCATION_MARK

ORDER = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                "required": ["sku"],
                "additionalProperties": False,
            },
        },
        "mode": {"enum": ["fast", "cheap"]},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "odd key": {"type": "boolean"},
    },
    "required": ["items"],
}


def tool(parameters=ORDER, **options):
    return Tool("order", lambda args: args, parameters=parameters, **options)


def error(parameters, args):
    return schema.argument_error(tool(parameters), args)


# --- messages written for the program --------------------------------------------------


def test_a_wrong_type_names_the_path_and_what_was_expected():
    args = {"items": [{"sku": "a"}, {"sku": "b"}, {"sku": "c", "qty": "3"}]}
    assert error(ORDER, args) == 'invalid arguments: $.items[2].qty: expected integer, got "3"'


def test_valid_arguments_pass():
    assert error(ORDER, {"items": [{"sku": "a", "qty": 2}], "mode": "fast", "note": None, "odd key": True}) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, '$: missing required property "items"'),
        (
            {"items": [{"sku": "a", "qyt": 1}]},
            '$.items[0]: unexpected property "qyt" (expected only "qty", "sku")',
        ),
        ({"items": [], "mode": "slow"}, '$.mode: expected one of "fast", "cheap", got "slow"'),
        ({"items": [], "note": 3}, "$.note: expected string or null, got 3"),
        ({"items": [{"sku": "a", "qty": 0}]}, "$.items[0].qty: expected a number >= 1, got 0"),
        ({"items": [], "odd key": "yes"}, '$["odd key"]: expected boolean, got "yes"'),
        ([1, 2], "$: expected object, got [1, 2]"),
        (None, "$: expected object, got null"),
    ],
)
def test_each_kind_of_problem_reads_as_path_and_expectation(args, message):
    assert error(ORDER, args) == "invalid arguments: " + message


def test_keyword_messages():
    cases = [
        ({"type": "string", "minLength": 3}, "ab", '$: expected a string of at least 3 characters, got "ab"'),
        ({"type": "string", "maxLength": 1}, "ab", '$: expected a string of at most 1 character, got "ab"'),
        ({"type": "array", "minItems": 2}, [1], "$: expected at least 2 items, got [1]"),
        ({"type": "array", "uniqueItems": True}, [1, 1], "$: expected unique items"),
        ({"type": "string", "pattern": "^a"}, "b", '$: expected a string matching "^a", got "b"'),
        ({"type": "number", "multipleOf": 5}, 7, "$: expected a multiple of 5, got 7"),
        ({"type": "number", "exclusiveMaximum": 5}, 5, "$: expected a number < 5, got 5"),
        ({"const": "x"}, "y", '$: expected "x", got "y"'),
        ({"not": {"type": "null"}}, None, '$: expected a value not matching {"type": "null"}, got null'),
        ({"type": "object", "minProperties": 1}, {}, "$: expected at least 1 property, got {}"),
    ]
    for parameters, args, message in cases:
        assert error(parameters, args) == "invalid arguments: " + message


def test_a_failing_branch_of_a_union_of_shapes_is_named_by_its_deepest_path():
    parameters = {
        "type": "object",
        "properties": {"where": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/Point"}]}},
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
    }
    assert error(parameters, {"where": {"x": "1"}}) == 'invalid arguments: $.where.x: expected number, got "1"'
    assert error(parameters, {"where": 7}) == "invalid arguments: $.where: expected null or object, got 7"
    assert error(parameters, {"where": {"x": 1}}) is None


def test_several_problems_are_listed_in_path_order_and_capped():
    parameters = {"type": "object", "properties": {name: {"type": "integer"} for name in "abcdefg"}}
    args = {name: "x" for name in "gfedcba"}
    message = error(parameters, args)
    assert message.startswith('invalid arguments: $.a: expected integer, got "x"; $.b: ')
    assert message.count("expected integer") == schema.MAX_PROBLEMS
    assert message.endswith("; and 2 more")


def test_a_long_value_is_cut_and_the_whole_message_clamped():
    got = error({"type": "integer"}, "y" * 500)
    assert got.startswith('invalid arguments: $: expected integer, got "yyyy')
    assert got.endswith("…") and len(got) < 120
    names = [f"field_{i}_{'z' * 1000}" for i in range(5)]
    huge = {"type": "object", "properties": {name: {"type": "integer"} for name in names}}
    message = error(huge, {name: "x" for name in names})
    assert len(message) == MAX_MESSAGE + len(TRUNCATION_MARK) and message.endswith(TRUNCATION_MARK)


# --- drafts and references ----------------------------------------------------------------


def test_draft_2020_12_is_the_default():
    parameters = {"type": "array", "prefixItems": [{"type": "integer"}], "items": False}
    assert error(parameters, [1]) is None
    assert error(parameters, [1, 2]) == "invalid arguments: $: expected at most 1 item, got 2"


def test_a_declared_draft_is_respected():
    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array"}
    # Under draft 7, `items` as a list is a tuple and `prefixItems` means nothing.
    assert error({**draft7, "items": [{"type": "integer"}], "additionalItems": False}, [1, 2]) == (
        "invalid arguments: $: expected at most 1 item, got 2"
    )
    assert error({**draft7, "prefixItems": [{"type": "string"}]}, [1]) is None
    assert error({**draft7, "prefixItems": [{"type": "string"}], "$schema": "urn:unknown-draft"}, [1]) == (
        "invalid arguments: $[0]: expected string, got 1"
    )


def test_local_references_resolve():
    parameters = {
        "type": "object",
        "properties": {"tree": {"$ref": "#/$defs/Tree"}},
        "$defs": {
            "Tree": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Tree"}},
                },
            }
        },
    }
    assert error(parameters, {"tree": {"value": 1, "children": [{"value": 2, "children": []}]}}) is None
    assert error(parameters, {"tree": {"children": [{"value": "2"}]}}) == (
        'invalid arguments: $.tree.children[0].value: expected integer, got "2"'
    )


def test_a_remote_reference_is_never_fetched_and_the_call_is_refused(monkeypatch, caplog):
    def no_network(*args, **kwargs):
        raise AssertionError("validation tried to fetch a remote schema")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    with caplog.at_level(logging.WARNING, logger="nous_sched"):
        message = error({"$ref": "https://example.com/schema.json"}, {})
    assert message.startswith("the arguments could not be checked against the tool's schema")
    assert message.endswith("the call was refused")
    assert "https://example.com/schema.json" in caplog.text


def test_a_reference_cycle_without_end_refuses_rather_than_hangs():
    message = error({"$ref": "#"}, {})
    assert "RecursionError" in message and message.endswith("the call was refused")


def test_an_invalid_schema_refuses_every_call_and_says_why(caplog):
    bad = tool({"type": "quantum"})
    with caplog.at_level(logging.WARNING, logger="nous_sched"):
        first = schema.argument_error(bad, {})
        second = schema.argument_error(bad, {"anything": 1})
    assert first == second
    assert first.startswith(
        "the tool's parameters schema is invalid, so the call was refused (invalid JSON Schema at $.type"
    )
    assert caplog.text.count("has an invalid parameters schema") == 1  # compiled, and logged, once
    assert schema.schema_error({"type": "quantum"}).startswith("invalid JSON Schema at $.type:")
    assert schema.schema_error(ORDER) is None
    assert schema.schema_error(True) is None
    assert schema.schema_error("object") == "a JSON Schema must be an object or a boolean, got str"


def test_any_mapping_and_tuples_are_read_as_a_schema():
    parameters = MappingProxyType(
        {"type": "object", "required": ("a",), "properties": MappingProxyType({"a": {"enum": (1, 2)}})}
    )
    assert error(parameters, {"a": 1}) is None
    assert error(parameters, {"a": 3}) == "invalid arguments: $.a: expected one of 1, 2, got 3"


# --- opting out, raising, caching ----------------------------------------------------------


def test_a_tool_may_opt_out_and_one_without_a_schema_is_never_checked():
    assert schema.argument_error(tool(validate_arguments=False), {"items": "nope"}) is None
    assert schema.argument_error(tool(None), {"anything": object()}) is None
    assert tool().validate_arguments is True
    with pytest.raises(ConfigError, match="validate_arguments"):
        tool(validate_arguments="no")


def test_check_arguments_raises_a_tool_error_naming_the_tool():
    schema.check_arguments(tool(), {"items": []})
    with pytest.raises(ToolError) as raised:
        schema.check_arguments(tool(), {})
    assert raised.value.tool == "order"
    assert raised.value.message == 'invalid arguments: $: missing required property "items"'


def test_a_validator_is_compiled_once_per_tool_and_dropped_with_it(monkeypatch):
    compiled = []
    real = schema._compile
    monkeypatch.setattr(schema, "_compile", lambda name, parameters: compiled.append(name) or real(name, parameters))
    first, second = tool(), tool()
    for _ in range(20):
        schema.argument_error(first, {"items": []})
        schema.argument_error(first, {})
    assert compiled == ["order"]
    schema.argument_error(second, {"items": []})
    assert compiled == ["order", "order"]
    key = id(first)
    assert key in schema._compiled
    del first
    gc.collect()
    assert key not in schema._compiled


def test_checks_from_many_threads_agree():
    shared = tool()
    cases = [({"items": [{"sku": "a", "qty": i % 3}]}, i) for i in range(400)]
    expected = [error(ORDER, args) for args, _ in cases]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda case: schema.argument_error(shared, case[0]), cases))
    assert got == expected
    assert {message is None for message in got} == {True, False}

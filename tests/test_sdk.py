"""The tool SDK renderer (port of the original ``sdk_test.exs``, tests 1-29)."""

from __future__ import annotations

import itertools
import json
import os
import re
from collections import UserDict
from types import MappingProxyType, SimpleNamespace

import pytest
from tscheck import check_typescript

from nous_sched import sdk
from nous_sched.errors import ConfigError
from nous_sched.tooling import Tool

DEFAULT_PARAMETERS = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
_UNSET = object()


def tool(name, description=None, parameters=_UNSET):
    return Tool(
        name=name,
        function=lambda args: None,
        description=f"Does {name}." if description is None else description,
        parameters=DEFAULT_PARAMETERS if parameters is _UNSET else parameters,
    )


def _outside_strings(text):
    """``text`` with every JSON string literal blanked to ``""``."""
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)


def assert_wellformed(text):
    # A cheap stand-in for "a parser would accept this" (the fuzz test has the
    # thorough one): delimiters balance and no Python repr leaked in.
    code = _outside_strings(text)
    for open_, close in ["{}", "[]", "()"]:
        assert code.count(open_) == code.count(close), f"unbalanced {open_}{close}:\n{text}"
    for leak in ("{'", "<function", "object at 0x", "None,"):
        assert leak not in code, f"{leak!r} leaked into the SDK:\n{text}"
    return text


# --- byte stability -------------------------------------------------------------


def test_same_tool_set_renders_identical_bytes_every_time():
    tools = [tool("b"), tool("a"), tool("c")]
    first = sdk.render(tools)
    for _ in range(25):
        assert sdk.render(tools) == first


def test_input_order_does_not_change_a_single_byte():
    tools = [tool(name) for name in ("delta", "alpha", "charlie", "bravo")]
    expected = sdk.render(tools)
    permutations = list(itertools.permutations(tools))
    assert len(permutations) == 24
    for permutation in permutations:
        assert sdk.render(list(permutation)) == expected


def test_property_insertion_order_does_not_change_the_output():
    keys = [f"field_{i}" for i in range(1, 41)]

    def build(order):
        properties = {key: {"type": "string"} for key in order}
        return tool("wide", parameters={"type": "object", "properties": properties})

    forward, backward = sdk.render([build(keys)]), sdk.render([build(reversed(keys))])
    assert forward == backward
    positions = [forward.index(f'"{key}"?: string;') for key in sorted(keys)]
    assert positions == sorted(positions)


def test_changing_the_tool_set_changes_the_output():
    base = sdk.render([tool("a"), tool("b")])
    assert base != sdk.render([tool("a")])
    assert base != sdk.render([tool("a"), tool("b"), tool("c")])
    assert base != sdk.render([tool("a"), tool("b", description="changed")])


def test_a_duplicate_name_renders_once_keeping_the_first_occurrence():
    out = sdk.render([tool("dup", description="first"), tool("dup")])
    assert "first" in out
    assert "Does dup." not in out
    assert out.count('"dup"(args:') == 1
    assert_wellformed(out)


# --- ordering -------------------------------------------------------------------


def test_tools_are_in_lexicographic_order_regardless_of_input_order():
    names = ["zeta", "Alpha", "_underscore", "mid", "9nine"]
    out = sdk.render([tool(name) for name in names])
    rendered_order = sorted(names, key=lambda name: out.index(f'"{name}"('))
    assert rendered_order == sorted(names) == ["9nine", "Alpha", "_underscore", "mid", "zeta"]


# --- addressing by exact name ---------------------------------------------------


def test_names_that_are_not_identifiers_are_addressable():
    names = ["my-tool", "a.b", "with space", "日本語", "emoji-🙂", 'quote"inside']
    out = sdk.render([tool(name) for name in names])
    for name in ["my-tool", "a.b", "with space", "日本語", "emoji-🙂"]:
        assert f'"{name}"(args:' in out
    # The quote is escaped rather than closing the literal early.
    assert '"quote\\"inside"(args:' in out
    assert_wellformed(out)


def test_python_indexes_by_the_same_exact_names():
    out = sdk.render([tool("my-tool"), tool("a.b")], "python")
    assert '"my-tool": Callable[' in out
    assert '"a.b": Callable[' in out
    assert out.endswith("\ntools: Tools\n")


# --- descriptions ---------------------------------------------------------------


def test_the_tool_description_is_carried_into_the_sdk():
    out = sdk.render([tool("t", description="Reads a file, carefully.")])
    assert "  /**\n   * Reads a file, carefully.\n   */\n" in out


def test_a_description_containing_close_comment_cannot_close_the_comment_early():
    out = sdk.render([tool("t", description="glob **/*.ex then stop")])
    assert "*/ then stop" not in out
    assert "*\\/*.ex" in out
    assert_wellformed(out)


def test_parameter_descriptions_survive():
    parameters = {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "Absolute path"}},
        "required": ["path"],
    }
    assert '    /** Absolute path */\n    "path": string;' in sdk.render([tool("t", parameters=parameters)])
    assert "#   path: Absolute path" in sdk.render([tool("t", parameters=parameters)], "python")


# --- json_schema_to_type: supported nodes ----------------------------------------


def test_scalars():
    for schema_type, ts, py in [
        ("string", "string", "str"),
        ("number", "number", "float"),
        ("integer", "number", "int"),
        ("boolean", "boolean", "bool"),
        ("null", "null", "None"),
    ]:
        assert sdk.json_schema_to_type({"type": schema_type}) == ts
        assert sdk.json_schema_to_type({"type": schema_type}, "python") == py


def test_objects_carry_properties_and_required():
    schema = {
        "type": "object",
        "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
        "required": ["a"],
    }
    assert sdk.json_schema_to_type(schema) == '{ "a": string; "b"?: number }'


def test_an_object_with_no_properties_keeps_its_value_type():
    assert sdk.json_schema_to_type({"type": "object"}) == "Record<string, unknown>"
    assert (
        sdk.json_schema_to_type({"type": "object", "additionalProperties": {"type": "string"}})
        == "Record<string, string>"
    )
    assert sdk.json_schema_to_type({"type": "object"}, "python") == "dict[str, Any]"


def test_arrays_and_draft4_tuples():
    assert sdk.json_schema_to_type({"type": "array", "items": {"type": "string"}}) == "Array<string>"
    assert sdk.json_schema_to_type({"type": "array"}) == "Array<unknown>"
    tuple_schema = {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]}
    assert sdk.json_schema_to_type(tuple_schema) == "[string, number]"
    assert sdk.json_schema_to_type({"type": "array", "items": {"type": "string"}}, "python") == "list[str]"
    assert sdk.json_schema_to_type(tuple_schema, "python") == "tuple[str, int]"
    # An empty tuple: `[]` in TypeScript, and `tuple[()]` since `tuple[]` is not Python.
    assert sdk.json_schema_to_type({"type": "array", "items": []}) == "[]"
    assert sdk.json_schema_to_type({"type": "array", "items": []}, "python") == "tuple[()]"


def test_enums_become_literal_unions():
    schema = {"enum": ["a", "b", 1, True, None]}
    assert sdk.json_schema_to_type(schema) == '"a" | "b" | 1 | true | null'
    assert sdk.json_schema_to_type(schema, "python") == 'Literal["a", "b", 1, True, None]'
    # A float is a TypeScript literal type but not a Python one.
    assert sdk.json_schema_to_type({"enum": [1.5, 2]}) == "1.5 | 2"
    assert sdk.json_schema_to_type({"enum": [1.5, 2]}, "python") == "Any"
    # Quotes, backslashes and newlines stay inside a valid literal.
    assert sdk.json_schema_to_type({"enum": ['say "hi"\n\\']}) == json.dumps('say "hi"\n\\')


def test_one_of_and_any_of_become_unions_all_of_an_intersection():
    parts = [{"type": "string"}, {"type": "integer"}]
    assert sdk.json_schema_to_type({"oneOf": parts}) == "string | number"
    assert sdk.json_schema_to_type({"anyOf": parts}) == "string | number"
    assert sdk.json_schema_to_type({"allOf": parts}) == "string & number"
    assert sdk.json_schema_to_type({"anyOf": parts}, "python") == "str | int"
    # Python has no intersection type: it degrades rather than lying.
    assert sdk.json_schema_to_type({"allOf": parts}, "python") == "Any"
    # Members are unique: `integer` and `number` are both `number`.
    assert sdk.json_schema_to_type({"oneOf": [{"type": "integer"}, {"type": "number"}]}) == "number"


def test_a_type_list_is_a_union():
    assert sdk.json_schema_to_type({"type": ["string", "null"]}) == "string | null"
    assert sdk.json_schema_to_type({"type": ["string", "null"]}, "python") == "str | None"


def test_any_mapping_is_read_as_a_schema():
    # The analogue of the original's atom-keyed maps: the schema need not be a dict.
    proxy = MappingProxyType({"type": "array", "items": MappingProxyType({"type": "string"})})
    assert sdk.json_schema_to_type(proxy) == "Array<string>"

    class Key(str):
        pass

    user_dict = UserDict({Key("type"): "object", Key("properties"): {Key("a"): {"type": "string"}}})
    assert sdk.json_schema_to_type(user_dict) == '{ "a"?: string }'
    out = sdk.render([tool("t", parameters=MappingProxyType(DEFAULT_PARAMETERS))])
    assert '"t"(args: {\n    "q": string;\n  }): Promise<unknown>;' in out


# --- json_schema_to_type: the escape hatch ----------------------------------------


UNSUPPORTED = [
    {"$ref": "#/definitions/thing"},
    {"type": "somethingelse"},
    {"type": 42},
    {},
    {"description": "no type at all"},
    {"enum": "not a list", "type": "mystery"},
    {"enum": "not a list"},
    {"enum": [{"unrepresentable": True}]},
    {"oneOf": []},
    "a bare string",
    None,
    42,
    [1, 2, 3],
    ("tuple", "not", "json"),
]


@pytest.mark.parametrize("node", UNSUPPORTED, ids=repr)
def test_every_unsupported_node_yields_the_escape_hatch(node):
    assert len(UNSUPPORTED) == 14
    assert sdk.json_schema_to_type(node) == "unknown"
    assert sdk.json_schema_to_type(node, "python") == "Any"


def test_a_malformed_sub_field_costs_that_field_not_the_whole_node():
    malformed_object = {"type": "object", "properties": "not a map", "required": "not a list"}
    assert sdk.json_schema_to_type(malformed_object) == "Record<string, unknown>"
    assert sdk.json_schema_to_type({"type": "array", "items": "not a schema"}) == "Array<unknown>"
    assert sdk.json_schema_to_type({"type": "array", "items": 42}, "python") == "list[Any]"
    siblings = {"type": "object", "properties": {"bad": {"type": "frobnicate"}, "good": {"type": "string"}}}
    assert sdk.json_schema_to_type(siblings) == '{ "bad"?: unknown; "good"?: string }'


def test_nesting_deeper_than_the_cap_degrades_rather_than_blowing_the_stack():
    deep = {"type": "string"}
    for _ in range(80):
        deep = {"type": "array", "items": deep}
    rendered = sdk.json_schema_to_type(deep)
    assert rendered.startswith("Array<")
    assert "unknown" in rendered
    assert "string" not in rendered
    assert rendered == "Array<" * 13 + "unknown" + ">" * 13


def test_an_exotic_schema_still_yields_a_parseable_sdk_and_spares_its_neighbour():
    deep = {"type": "string"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    exotic = {
        "type": "object",
        "properties": {
            "ref": {"$ref": "#/definitions/loop"},
            "mystery": {"type": "quantum"},
            "malformed": "this is not a schema node at all",
            "empty": {},
            "deep": deep,
            "combo": {"allOf": [{"type": "object"}, {"$ref": "#/x"}]},
        },
        "required": ["ref", "mystery"],
    }
    alone = sdk.render([tool("normal")])
    out = sdk.render([tool("exotic", parameters=exotic), tool("normal")])

    assert '    "ref": unknown;' in out
    assert '    "mystery": unknown;' in out
    assert '    "combo"?: Record<string, unknown> & unknown;' in out
    # The healthy tool beside it is untouched.
    normal_member = alone[alone.index("  /**\n   * Does normal.") :]
    assert normal_member in out
    assert '"normal"(args: {' in out
    assert_wellformed(out)
    python = assert_wellformed(sdk.render([tool("exotic", parameters=exotic)], "python"))
    compile(python, "<sdk>", "exec")


def test_a_tool_with_no_parameters_at_all_is_still_declared():
    bare = SimpleNamespace(name="bare", description=None, parameters=None)
    out = sdk.render([bare])
    assert '  "bare"(args: unknown): Promise<unknown>;' in out
    assert "/**" not in out
    assert '"bare": Callable[[Any], Any],' in sdk.render([bare], "python")
    assert_wellformed(out)


def test_an_empty_tool_set_renders_a_valid_empty_sdk():
    ts = assert_wellformed(sdk.render([]))
    assert ts.endswith("\ndeclare const tools: {};\n")
    py = assert_wellformed(sdk.render([], "python"))
    assert 'Tools = TypedDict("Tools", {})' in py
    namespace: dict = {}
    exec(compile(py, "<sdk>", "exec"), namespace)
    assert namespace["Tools"].__annotations__ == {}


# --- languages ------------------------------------------------------------------


def test_javascript_and_typescript_render_the_same_declarations():
    tools = [tool("a")]
    outputs = {sdk.render(tools, language) for language in ("typescript", "ts", "javascript", "js")}
    assert outputs == {sdk.render(tools)}
    assert sdk.render(tools, "py") == sdk.render(tools, "python") != sdk.render(tools)


def test_coerce_language_accepts_known_names_and_refuses_the_rest_without_raising():
    assert sdk.coerce_language("python") == "python"
    assert sdk.coerce_language("py") == "python"
    assert sdk.coerce_language("javascript") == "typescript"
    assert sdk.coerce_language("ts") == "typescript"
    for unknown in ("ruby", "", None, 3, ["python"], {"python": 1}):
        assert sdk.coerce_language(unknown) is None
    assert set(sdk.languages()) == {"typescript", "ts", "javascript", "js", "python", "py"}
    assert all(sdk.coerce_language(name) for name in sdk.languages())


def test_an_unknown_language_is_a_configuration_error_naming_the_accepted_values():
    with pytest.raises(ConfigError, match="render: `language` must be one of .*, got 'brainfuck'") as raised:
        sdk.render([], "brainfuck")
    for name in sdk.languages():
        assert repr(name) in str(raised.value)
    with pytest.raises(ConfigError):
        sdk.json_schema_to_type({"type": "string"}, "ruby")
    assert isinstance(raised.value, ValueError)


def test_the_global_and_error_class_the_bindings_must_match_are_exposed():
    assert sdk.GLOBAL == "tools"
    assert sdk.ERROR_CLASS == "ToolError"
    assert f"declare const {sdk.GLOBAL}: " in sdk.render([])
    assert sdk.ERROR_CLASS in sdk.render([])
    assert f"{sdk.GLOBAL}: Tools" in sdk.render([], "python")
    assert sdk.ERROR_CLASS in sdk.render([], "python")


# --- the exact layout -----------------------------------------------------------


def test_the_typescript_layout_byte_for_byte():
    greet = tool(
        "greet",
        description="  Say hi.\r\nTwice.  ",
        parameters={
            "type": "object",
            "properties": {"name": {"type": "string", "description": "Who\n  to greet"}, "times": {"type": "integer"}},
            "required": ["name"],
        },
    )
    out = sdk.render([greet, SimpleNamespace(name="bare", description="", parameters=None)])
    assert out.startswith("// Tool SDK (generated). These declarations are the only description of the\n")
    assert out.endswith(
        "what the program returns, else its last expression's value.\n"
        "// A result too big to cross is a handle: pass it on, or blobs.read(h, i, n).\n"
        "//\n"
        '// SDK step "full": every tool is declared in full below.\n'
        "\n"
        "declare const tools: {\n"
        '  "bare"(args: unknown): Promise<unknown>;\n'
        "\n"
        "  /**\n"
        "   * Say hi.\n"
        "   * Twice.\n"
        "   */\n"
        '  "greet"(args: {\n'
        "    /** Who to greet */\n"
        '    "name": string;\n'
        '    "times"?: number;\n'
        "  }): Promise<unknown>;\n"
        "};\n"
    )


def test_the_python_layout_byte_for_byte():
    greet = tool(
        "greet",
        description="Say hi.\nTwice.",
        parameters={
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "Who to greet"},
                "mood": {"enum": ["warm", "cold"]},
            },
            "required": ["name"],
        },
    )
    out = sdk.render([greet, tool("a", parameters=None)], "python")
    assert out.startswith("# Tool SDK (generated).")
    assert out.endswith(
        "from typing import Any, Callable, Literal, NotRequired, TypedDict\n"
        "\n"
        "# greet — Say hi. Twice.\n"
        "#   name: Who to greet\n"
        'Args2 = TypedDict("Args2", {"name": str, "mood": NotRequired[Literal["warm", "cold"]]})\n'
        "\n"
        "\n"
        'Tools = TypedDict("Tools", {\n'
        '    "a": Callable[[Any], Any],\n'
        '    "greet": Callable[[Args2], Any],\n'
        "})\n"
        "\n"
        "tools: Tools\n"
    )
    namespace: dict = {}
    exec(compile(out, "<sdk>", "exec"), namespace)
    assert set(namespace["Tools"].__annotations__) == {"a", "greet"}
    assert namespace["Args2"].__required_keys__ == frozenset({"name"})


def test_tools_without_a_usable_name_are_skipped():
    nameless = [SimpleNamespace(name=name, description="x", parameters=None) for name in ("", None, 7)]
    assert sdk.render(nameless + [object()]) == sdk.render([])
    assert sdk.render(nameless + [tool("kept")]) == sdk.render([tool("kept")])


# --- references ($ref, $defs) -----------------------------------------------------


def refs_tool(name, properties, defs, key="$defs", **extra):
    return tool(name, parameters={"type": "object", "properties": properties, key: defs, **extra})


POINT = {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]}


def test_a_reference_used_once_is_written_inline():
    out = sdk.render([refs_tool("move", {"to": {"$ref": "#/$defs/Point"}}, {"Point": POINT})])
    assert '    "to"?: { "x": number; "y": number };' in out
    assert "type " not in out.split("declare const")[0].replace("// ", "")
    check_typescript(out)


def test_a_reference_used_twice_becomes_one_named_declaration_with_its_description():
    described = {**POINT, "description": "A point on the plane."}
    out = sdk.render(
        [refs_tool("line", {"a": {"$ref": "#/$defs/Point"}, "b": {"$ref": "#/$defs/Point"}}, {"Point": described})]
    )
    assert '/** A point on the plane. */\ntype Point = { "x": number; "y": number };\n\ndeclare const tools: {' in out
    assert '    "a"?: Point;\n    "b"?: Point;' in out
    check_typescript(out)


def test_a_recursive_model_gets_a_finite_exact_type():
    tree = {
        "type": "object",
        "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/Tree"}}},
        "required": ["value"],
    }
    out = sdk.render([refs_tool("plant", {"tree": {"$ref": "#/$defs/Tree"}}, {"Tree": tree}, required=["tree"])])
    assert 'type Tree = { "value": number; "children"?: Array<Tree> };' in out  # required first
    assert '    "tree": Tree;' in out
    check_typescript(out)
    # Python has no nested records: the cycle ends where a record would start.
    python = sdk.render([refs_tool("plant", {"tree": {"$ref": "#/$defs/Tree"}}, {"Tree": tree})], "python")
    assert '"tree": NotRequired[dict[str, Any]]' in python
    assert sdk.json_schema_to_type({"$ref": "#/$defs/Tree", "$defs": {"Tree": tree}}) == (
        '{ "value": number; "children"?: Array<unknown> }'
    )


def test_a_reference_to_the_root_and_draft_7_definitions_resolve():
    node = {
        "type": "object",
        "title": "Node",
        "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}, "tag": {"$ref": "#/definitions/Tag"}},
        "definitions": {"Tag": {"enum": ["a", "b"]}},
    }
    out = sdk.render([tool("walk", parameters=node)])
    assert 'type Node = { "next"?: Node | null; "tag"?: "a" | "b" };' in out
    assert '    "next"?: Node | null;\n    "tag"?: "a" | "b";' in out
    check_typescript(out)


def test_a_cycle_with_no_shape_is_unknown_and_never_a_self_referential_alias():
    defs = {
        "A": {"$ref": "#/$defs/B"},
        "B": {"$ref": "#/$defs/A"},
        "L": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/L"}]},
        "R": {"type": "object", "additionalProperties": {"$ref": "#/$defs/R"}},
    }
    properties = {name.lower(): {"$ref": f"#/$defs/{name}"} for name in defs}
    out = sdk.render([refs_tool("loops", properties, defs)])
    assert '    "a"?: unknown;' in out
    # TypeScript rejects `type L = null | L` and `type R = Record<string, R>`.
    assert "type L = null | unknown;" in out
    assert "type R = Record<string, unknown>;" in out
    check_typescript(out)


def test_pointers_are_unescaped_and_names_made_safe():
    defs = {"a/b": {"type": "string"}, "ty pe": {"type": "integer"}, "Array": POINT, "9lives": {"type": "boolean"}}
    refs = {"#/$defs/a~1b": "s", "#/$defs/ty%20pe": "i", "#/$defs/Array": "p", "#/$defs/9lives": "b"}
    properties = {field: {"$ref": ref} for ref, field in refs.items()}
    twice = {**properties, **{field + "2": {"$ref": ref} for ref, field in refs.items()}}
    out = sdk.render([refs_tool("odd", twice, defs)])
    for line in ("type Array_ = {", "type T9lives = boolean;", "type a_b = string;", "type ty_pe = number;"):
        assert line in out
    check_typescript(out)


def test_one_name_two_shapes_get_two_names_and_one_shape_in_two_tools_gets_one():
    address = {"type": "object", "properties": {"city": {"type": "string"}}}
    other = {"type": "object", "properties": {"zip": {"type": "string"}}}
    twice = {"from": {"$ref": "#/$defs/Address"}, "to": {"$ref": "#/$defs/Address"}}
    tools = [
        refs_tool("ship", twice, {"Address": address}),
        refs_tool("bill", twice, {"Address": address}),
        refs_tool("mail", twice, {"Address": other}),
    ]
    out = sdk.render(tools)
    assert out.count("type Address = ") == 1 and out.count("type Address_2 = ") == 1
    assert 'type Address = { "city"?: string };' in out  # "bill" sorts first
    assert 'type Address_2 = { "zip"?: string };' in out
    check_typescript(out)
    for order in itertools.permutations(tools):
        assert sdk.render(list(order)) == out


def test_unresolvable_and_remote_references_are_unknown():
    properties = {
        "a": {"$ref": "#/$defs/Missing"},
        "b": {"$ref": "https://example.com/s.json"},
        "c": {"$ref": "#anchor"},
    }
    out = sdk.render([refs_tool("dangling", properties, {})])
    assert '"a"?: unknown;' in out and '"b"?: unknown;' in out and '"c"?: unknown;' in out


# --- return types, const and 2020-12 tuples --------------------------------------------


def test_returns_become_the_promise_type_in_both_languages():
    returns = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
    out = sdk.render([Tool("make", lambda args: None, parameters=DEFAULT_PARAMETERS, returns=returns)])
    assert '  }): Promise<{ "id": string }>;' in out
    check_typescript(out)
    python = sdk.render([Tool("make", lambda args: None, parameters=DEFAULT_PARAMETERS, returns=returns)], "python")
    assert '"make": Callable[[Args1], dict[str, Any]],' in python
    listing = {"type": "array", "items": {"$ref": "#/$defs/Row"}, "$defs": {"Row": {"enum": [1, 2]}}}
    out = sdk.render([Tool("rows", lambda args: None, returns=listing)])
    assert '"rows"(args: unknown): Promise<Array<1 | 2>>;' in out
    assert '"rows": Callable[[Any], list[Literal[1, 2]]],' in sdk.render(
        [Tool("rows", lambda a: 0, returns=listing)], "py"
    )


def test_const_and_prefix_items():
    assert sdk.json_schema_to_type({"const": "on"}) == '"on"'
    assert sdk.json_schema_to_type({"const": 3}, "python") == "Literal[3]"
    closed = {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False}
    assert sdk.json_schema_to_type(closed) == "[string, number]"
    assert sdk.json_schema_to_type(closed, "python") == "tuple[str, int]"
    sized = {"prefixItems": [{"type": "string"}], "maxItems": 1}
    assert sdk.json_schema_to_type(sized) == "[string]"
    open_ = {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "boolean"}}
    assert sdk.json_schema_to_type(open_) == "[string, ...Array<boolean>]"
    assert sdk.json_schema_to_type({"prefixItems": [{"type": "null"}]}) == "[null, ...Array<unknown>]"
    assert sdk.json_schema_to_type(open_, "python") == "list[Any]"


# --- a pydantic model, as users hand them over -------------------------------------------


def test_a_pydantic_model_with_nested_models_a_list_of_them_and_an_enum():
    import enum

    from pydantic import BaseModel, Field

    class Status(str, enum.Enum):
        open = "open"
        shipped = "shipped"

    class Address(BaseModel):
        """Where a parcel goes."""

        street: str
        city: str

    class Line(BaseModel):
        sku: str
        qty: int = Field(1, description="How many.")

    class Order(BaseModel):
        ship_to: Address = Field(description="Delivery address.")
        bill_to: Address | None = None
        lines: list[Line]
        status: Status = Status.open

    out = sdk.render(
        [
            Tool(
                "place_order",
                lambda args: None,
                parameters=Order.model_json_schema(),
                returns=Order.model_json_schema(),
            )
        ]
    )
    check_typescript(out)
    assert "unknown" not in out.split("declare const tools")[1]
    assert '/** Where a parcel goes. */\ntype Address = { "city": string; "street": string };' in out
    assert (
        '  "place_order"(args: {\n'
        '    "lines": Array<{ "sku": string; "qty"?: number }>;\n'
        "    /** Delivery address. */\n"
        '    "ship_to": Address;\n'
        "    /** default: null */\n"
        '    "bill_to"?: Address | null;\n'
        '    /** default: "open" */\n'
        '    "status"?: "open" | "shipped";\n'
        '  }): Promise<{ "lines": Array<{ "sku": string; "qty"?: number }>; "ship_to": Address; '
        '"bill_to"?: Address | null; "status"?: "open" | "shipped" }>;'
    ) in out
    python = sdk.render([Tool("place_order", lambda args: None, parameters=Order.model_json_schema())], "python")
    compile(python, "<sdk>", "exec")
    assert '"status": NotRequired[Literal["open", "shipped"]]' in python


# --- large tool sets ---------------------------------------------------------------------


def many_tools(n=40):
    return [
        tool(
            f"tool_{i:02}",
            description=f"Does thing number {i}. Then more detail that the one-line form leaves out.",
            parameters={
                "type": "object",
                "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
                "required": ["a"],
            },
        )
        for i in range(n)
    ]


def test_under_the_budget_the_full_sdk_is_rendered():
    tools = many_tools(8)
    full = sdk.render(tools)
    assert len(full) >= sdk.MIN_BUDGET and sdk.step_of(full) == "full"
    assert sdk.render(tools, budget=len(full)) == full
    assert sdk.render(tools, budget=None) == full


def test_over_the_budget_each_tool_is_one_line_and_the_program_is_told_how_to_ask():
    tools = many_tools()
    full = sdk.render(tools)
    compact = sdk.render(tools, budget=len(full) - 1)
    assert len(compact) < len(full)
    check_typescript(compact)
    assert '  "tool_07"(args: object): Promise<unknown>; // Does thing number 7. Args: a, b?\n' in compact
    assert compact.count("(args: object)") == 40
    assert "more detail" not in compact
    assert f'return await {sdk.DISCOVERY_GLOBAL}.describe("<tool name>");' in compact
    assert f'return await {sdk.DISCOVERY_GLOBAL}.search("words");' in compact
    assert sdk.step_of(compact) == "lines"
    header = sdk.render([]).split('//\n// SDK step "full"')[0]
    assert compact.startswith(header + '//\n// SDK step "lines": the tool set is large')  # the same header first
    for order in (list(reversed(tools)), tools[::2] + tools[1::2]):
        assert sdk.render(order, budget=len(full) - 1) == compact
    python = sdk.render(tools, "python", budget=len(sdk.render(tools, "python")) - 1)
    assert sdk.step_of(python) == "lines"
    compile(python, "<sdk>", "exec")
    assert '    "tool_07": Callable[[Any], Any],  # Does thing number 7. Args: a, b?\n' in python


def test_a_bad_budget_is_a_configuration_error():
    for bad in (0, -1, 1.5, "10", True, sdk.MIN_BUDGET - 1):
        with pytest.raises(ConfigError, match="budget.*at least 1,500"):
            sdk.render([], budget=bad)
    assert sdk.step_of(sdk.render([], budget=sdk.MIN_BUDGET)) == "full"


def test_the_discovery_global_cannot_collide_with_a_tool_name():
    # Tools live under `tools[...]`; discovery has a global of its own.
    assert sdk.DISCOVERY_GLOBAL not in (sdk.GLOBAL, sdk.ERROR_CLASS)
    named_like_it = [tool(sdk.DISCOVERY_GLOBAL), tool("describe"), tool("search")]
    index = sdk.ToolIndex(named_like_it)
    assert index.names == ("describe", "sdk", "search")
    assert index.describe("describe") is not None


# --- ToolIndex: describe and search ----------------------------------------------------


def test_describe_gives_the_full_declaration_of_one_tool():
    address = {"type": "object", "properties": {"city": {"type": "string"}}}
    ship = refs_tool("ship", {"from": {"$ref": "#/$defs/A"}, "to": {"$ref": "#/$defs/A"}}, {"A": address})
    index = sdk.ToolIndex([ship, *many_tools(3)])
    text = index.describe("ship")
    check_typescript(text)
    assert text.startswith('type A = { "city"?: string };\n\ndeclare const tools: {\n')
    assert '"from"?: A;' in text and "tool_01" not in text
    member = index.describe("tool_01").removeprefix("declare const tools: {\n").removesuffix("\n};\n")
    assert member.startswith("  /**\n   * Does thing number 1.") and member in sdk.render(many_tools(3))
    assert index.describe("nope") is None and index.describe(None) is None
    python = sdk.ToolIndex([ship], "python").describe("ship")
    compile(python, "<describe>", "exec")
    assert '"ship": Callable[[Args1], Any],' in python


def test_search_ranks_name_matches_first_and_splits_identifiers():
    tools = [
        tool(
            "getWeather",
            description="Forecast for a city.",
            parameters={"type": "object", "properties": {"city": {"type": "string"}}},
        ),
        tool("send_email", description="Send an e-mail; mentions the weather in passing."),
        tool("list_cities", description="Every city we know."),
        tool("delete_user", description="Remove an account."),
    ]
    index = sdk.ToolIndex(tools)
    assert [hit["name"] for hit in index.search("weather")] == ["getWeather", "send_email"]
    assert index.search("weather")[0] == {"name": "getWeather", "summary": "Forecast for a city.", "args": ["city?"]}
    assert [hit["name"] for hit in index.search("cit")] == ["list_cities", "getWeather"]  # a prefix
    assert [hit["name"] for hit in index.search("EMAIL user")] == ["delete_user", "send_email"]
    assert index.search("zebra") == [] and index.search("") == []
    assert len(index.search("e", limit=1)) <= 1
    assert index.search("weather") == sdk.ToolIndex(list(reversed(tools))).search("weather")


def test_search_refuses_a_bad_query_or_limit():
    index = sdk.ToolIndex([tool("a")])
    with pytest.raises(ConfigError, match="query"):
        index.search(3)
    for limit in (0, 101, "5", True):
        with pytest.raises(ConfigError, match="limit"):
            index.search("a", limit=limit)


def test_the_bytes_do_not_depend_on_the_hash_seed():
    # Sets and dicts keyed by strings iterate in hash order, which changes per
    # process; the SDK (prompt-cache prefix) must not.
    import subprocess
    import sys

    script = """
import json, sys
from nous_sched import Tool, sdk
defs = {n: {"type": "object", "properties": {"next": {"$ref": f"#/$defs/{m}"}, "v": {"enum": ["a", "b"]}}}
        for n, m in [("A", "B"), ("B", "C"), ("C", "A"), ("D", "D"), ("E", "A")]}
refs = {k.lower(): {"$ref": f"#/$defs/{k}"} for k in defs}
tools = [Tool(f"t{i}", print, parameters={"type": "object", "properties": {**refs, **refs}, "$defs": defs},
              returns={"$ref": "#/$defs/D", "$defs": defs}) for i in range(3)]
sys.stdout.write(sdk.render(tools) + sdk.render(tools, "python") + sdk.render(tools, budget=1500))
"""
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("0", "1", "2")
    }
    assert len(outputs) == 1
    (text,) = outputs
    check_typescript(text.split("# Tool SDK")[0])
    assert "type A = " in text and "type D = " in text

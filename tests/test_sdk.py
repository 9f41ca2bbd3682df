"""The tool SDK renderer (port of the original ``sdk_test.exs``, tests 1-29)."""

from __future__ import annotations

import itertools
import json
import re
from collections import UserDict
from types import MappingProxyType, SimpleNamespace

import pytest

from nous_sched import sdk
from nous_sched.errors import ConfigError
from nous_sched.tool import Tool

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
    with pytest.raises(ConfigError, match="unsupported SDK language 'brainfuck'") as raised:
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
        "name and a message.\n"
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
        'Args2 = TypedDict("Args2", {"mood": NotRequired[Literal["warm", "cold"]], "name": str})\n'
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

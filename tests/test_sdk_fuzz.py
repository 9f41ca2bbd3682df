"""Property test: on any schema, ``render`` neither raises nor emits broken code."""

from __future__ import annotations

import random
from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tscheck import check_typescript

from nous_sched import sdk
from nous_sched.sdk import _render, _steps


def check_python(text: str) -> None:
    namespace: dict = {}
    exec(compile(text, "<sdk>", "exec"), namespace)
    tools = namespace["Tools"]
    # A TypedDict of every tool, or (a tool set too large to list) a dict of any name.
    assert isinstance(tools.__annotations__, dict) if hasattr(tools, "__annotations__") else tools.__origin__ is dict


# --- strategies -------------------------------------------------------------------

nasty_text = st.lists(
    st.one_of(
        st.text(max_size=6),
        st.sampled_from(
            ["*/", "/*", "**/", "*", "/", '"', "\\", "\n", "\r\n", "\r", "\u2028", "\x00", "日本", "🙂", "'"]
        ),
    ),
    max_size=5,
).map("".join)
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    nasty_text,
    st.lists(st.integers(), max_size=3),
    st.just(object()),
)


def or_junk(strategy):
    """``strategy``, or now and then junk (``one_of`` would flatten junk's branches and favour it)."""
    return st.integers(0, 3).flatmap(lambda pick: junk if pick == 0 else strategy)


SCALARS = ["string", "number", "integer", "boolean", "null"]
type_name = or_junk(st.sampled_from([*SCALARS, "object", "array", "frobnicate"]))
enum_member = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), nasty_text, st.dictionaries(st.text(), st.integers())
)
# A small pool of property names, so that `required` often names a real one.
prop_name = st.one_of(st.sampled_from(["a", "b", "c"]), nasty_text)


_DANGLING_REFS = ("#/definitions/x", 7)


def _node(children=None, refs=_DANGLING_REFS):
    """One schema node: a well-shaped body of each kind, decorated with noise."""
    shapes = [
        st.fixed_dictionaries({"type": st.sampled_from([*SCALARS, "frobnicate"])}),
        st.fixed_dictionaries({"enum": or_junk(st.lists(enum_member, max_size=4))}),
        st.fixed_dictionaries({"const": enum_member}),
        st.fixed_dictionaries({"$ref": st.sampled_from(refs)}),
        st.fixed_dictionaries({"type": st.lists(type_name, max_size=4)}),
        st.fixed_dictionaries({}, optional={"type": type_name, "properties": junk, "items": junk}),
    ]
    if children is not None:
        shapes += [
            st.fixed_dictionaries(
                {"properties": st.dictionaries(st.one_of(prop_name, st.integers()), children, max_size=4)},
                optional={
                    "type": st.sampled_from(["object", ["object", "null"]]),
                    "required": or_junk(st.lists(or_junk(prop_name), max_size=3)),
                    "additionalProperties": st.one_of(children, st.booleans()),
                },
            ),
            st.fixed_dictionaries(
                {"type": st.just("object")}, optional={"additionalProperties": st.one_of(children, st.booleans(), junk)}
            ),
            st.fixed_dictionaries(
                {"items": or_junk(st.one_of(children, st.lists(children, max_size=3)))},
                optional={"type": st.sampled_from(["array", ["array", "string", "array"]])},
            ),
            st.fixed_dictionaries(
                {"prefixItems": or_junk(st.lists(children, max_size=3))},
                optional={"items": st.one_of(children, st.booleans()), "maxItems": st.integers(0, 4)},
            ),
            *(
                st.fixed_dictionaries({key: or_junk(st.lists(children, max_size=3))})
                for key in ("oneOf", "anyOf", "allOf")
            ),
        ]
    noise = st.fixed_dictionaries(
        {},
        optional={
            "description": or_junk(nasty_text),
            "$ref": st.sampled_from([None, None, None, None, *refs]),
        },
    )
    return st.builds(lambda extra, body: {**extra, **body}, noise, st.one_of(shapes))


schemas = st.recursive(
    st.one_of(_node(), junk),
    lambda children: st.one_of(_node(children), _node(children), st.lists(children, max_size=2)),
    max_leaves=25,
)
object_schemas = st.builds(
    lambda properties, required: {"type": "object", "properties": properties, "required": required},
    st.dictionaries(prop_name, schemas, min_size=1, max_size=5),
    st.lists(prop_name, max_size=3),
)
tool_name = nasty_text.filter(bool)
tools = st.lists(
    st.builds(
        SimpleNamespace,
        name=or_junk(tool_name),
        description=or_junk(nasty_text),
        parameters=st.one_of(object_schemas, object_schemas, schemas),
    ),
    min_size=1,
    max_size=4,
)

# Documents whose references resolve: into `$defs` (names that need escaping,
# or are reserved in TypeScript, included), to the root, in cycles and chains.
DEF_NAMES = ["A", "B", "Node", "Array", "9lives", "a~b/c", "ty pe"]
LOCAL_REFS = (
    *(f"#/$defs/{name.replace('~', '~0').replace('/', '~1').replace(' ', '%20')}" for name in DEF_NAMES),
    "#",
    "#/properties/a",
    *_DANGLING_REFS,
)
linked_schemas = st.recursive(
    _node(refs=LOCAL_REFS),
    lambda children: st.one_of(_node(children, LOCAL_REFS), _node(children, LOCAL_REFS)),
    max_leaves=8,
)
documents = st.builds(
    lambda properties, defs, required: {
        "type": "object",
        "properties": properties,
        "required": required,
        "$defs": defs,
    },
    st.dictionaries(prop_name, linked_schemas, min_size=1, max_size=4),
    st.dictionaries(st.sampled_from(DEF_NAMES), linked_schemas, max_size=5),
    st.lists(prop_name, max_size=3),
)
linked_tools = st.lists(
    st.builds(
        SimpleNamespace,
        name=tool_name,
        description=or_junk(nasty_text),
        parameters=documents,
        returns=st.one_of(st.none(), documents, linked_schemas),
    ),
    min_size=1,
    max_size=4,
)

FUZZ = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
# Linked documents are slow to generate: fewer of them, the same coverage of shapes.
LINKED = settings(FUZZ, max_examples=80)


@FUZZ
@given(tools)
def test_render_never_raises_and_stays_well_formed(tool_list):
    check_typescript(sdk.render(tool_list))
    check_python(sdk.render(tool_list, "python"))


@FUZZ
@given(schemas)
def test_json_schema_to_type_is_total(schema):
    wrapped = sdk.render([SimpleNamespace(name="t", description="", parameters={"properties": {"p": schema}})])
    check_typescript(wrapped)
    assert sdk.json_schema_to_type(schema) in wrapped
    py_type = sdk.json_schema_to_type(schema, "python")
    compile(f"x: {py_type}", "<type>", "exec")


@FUZZ
@given(tools, st.randoms(use_true_random=False))
def test_output_depends_on_the_tool_set_not_its_order(tool_list, rnd: random.Random):
    unique = list({t.name: t for t in reversed(tool_list) if isinstance(t.name, str)}.values())
    shuffled = unique[:]
    rnd.shuffle(shuffled)
    assert sdk.render(unique) == sdk.render(shuffled) == sdk.render(tool_list)
    assert sdk.render(unique, "python") == sdk.render(shuffled, "python")


def test_the_checker_rejects_broken_output():
    good = sdk.render([SimpleNamespace(name="t", description="a", parameters={"properties": {"p": {}}})])
    check_typescript(good)
    broken = [
        good.replace("*\\/", "*/") if "*\\/" in good else good.replace("   * a", "   * a */ b"),
        good.replace('"t"', '"t\n"'),
        good.replace("Promise<unknown>", "Promise<unknown"),
        good.replace("unknown;", "unknown"),
        good.replace('"p"', "{'p'}"),
        good[:-1],
    ]
    for text in broken:
        try:
            check_typescript(text)
        except (AssertionError, ValueError, IndexError):
            continue
        raise AssertionError(f"the checker accepted broken output:\n{text}")


@LINKED
@given(linked_tools, st.randoms(use_true_random=False))
def test_references_and_return_types_render_well_formed_and_stable(tool_list, rnd: random.Random):
    text = sdk.render(tool_list)
    check_typescript(text)
    check_python(sdk.render(tool_list, "python"))
    shuffled = tool_list[:]
    rnd.shuffle(shuffled)
    unique = list({t.name: t for t in reversed(tool_list)}.values())
    assert sdk.render(unique) == text
    rnd.shuffle(unique)
    assert sdk.render(unique) == text


@LINKED
@given(linked_tools)
def test_describe_and_every_step_are_well_formed(tool_list):
    index = sdk.ToolIndex(tool_list)
    for name in index.names:
        check_typescript(index.describe(name))
        check_python(sdk.ToolIndex(tool_list, "python").describe(name))
    ordered = _render.unique_sorted(tool_list)
    for step in sdk.STEPS:  # every step, whichever a budget would choose
        for language, check in (("typescript", check_typescript), ("python", check_python)):
            text = _steps._render_step(step, ordered, language, [t.name for t in ordered], None)
            if text is not None:
                check(text)
                assert sdk.step_of(text) == step
    for text in ("a", "ty pe Node", "", "*/ \u2028"):
        for hit in index.search(text):
            assert hit["name"] in index.names and "\n" not in hit["summary"]

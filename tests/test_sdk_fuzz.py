"""Property test: on any schema, ``render`` neither raises nor emits broken code."""

from __future__ import annotations

import json
import random
import re
from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nous_sched import sdk

# --- a small TypeScript syntax checker --------------------------------------------

_CLOSERS = {")": "(", "]": "[", "}": "{", ">": "<"}
_PLAIN = re.compile(r"[A-Za-z0-9_ :;?|&,.+\-]")
_SIGNATURE_OPEN = re.compile(r'^""\(args: \{$')


def check_typescript(text: str) -> None:
    """Fail unless ``text`` has the shape of a well-formed TypeScript SDK.

    Outside comments and string literals only identifiers, numbers and type
    punctuation may appear; ``() [] {} <>`` balance; every string literal is a
    JSON string; each doc comment closes exactly where the layout puts it (so
    no ``*/`` hides in its body); each code line is a member ending in ``;``
    or opens a block.
    """
    assert text.endswith("};\n"), text[-40:]
    stack: list[str] = []
    lines: list[str] = []
    line: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("//", i):
            i = text.index("\n", i)
        elif text.startswith("/**", i):
            end = text.find("*/", i + 3)
            assert end != -1, "unclosed doc comment"
            body = text[i + 3 : end]
            assert text[end + 2] == "\n", f"text after a doc comment: {text[end : end + 30]!r}"
            if "\n" in body:
                assert body.startswith("\n") and body.rsplit("\n", 1)[1] == "   ", repr(body)
                assert all(row.startswith("   * ") for row in body.split("\n")[1:-1]), repr(body)
            else:
                assert body.startswith(" ") and body.endswith(" "), repr(body)
            assert "".join(line).strip() == "", "doc comment after code on one line"
            i = end + 2
        elif text[i] == '"':
            end = i + 1
            while text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            assert isinstance(json.loads(text[i : end + 1]), str)
            line.append('""')
            i = end + 1
        elif text[i] == "\n":
            if code := "".join(line).strip():
                lines.append(code)
            line = []
            i += 1
        else:
            char = text[i]
            if char in "([{<":
                stack.append(char)
            elif char in _CLOSERS:
                assert stack and stack.pop() == _CLOSERS[char], f"unbalanced {char!r} at {i}"
            else:
                assert _PLAIN.fullmatch(char), f"unexpected {char!r} in code at {i}: {text[i - 40 : i + 40]!r}"
            line.append(char)
            i += 1
    assert not stack, f"unclosed {stack}"
    if lines == ["declare const tools: {};"]:
        return
    assert lines[0] == "declare const tools: {", lines[0]
    assert lines[-1] == "};"
    for code in lines[1:-1]:
        assert code.endswith(";") or _SIGNATURE_OPEN.match(code), f"bad line {code!r}"
        if code.startswith('""('):
            assert code.endswith("): Promise<unknown>;") or code.endswith("{"), code


def check_python(text: str) -> None:
    namespace: dict = {}
    exec(compile(text, "<sdk>", "exec"), namespace)
    assert isinstance(namespace["Tools"].__annotations__, dict)


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


def _node(children=None):
    """One schema node: a well-shaped body of each kind, decorated with noise."""
    shapes = [
        st.fixed_dictionaries({"type": st.sampled_from([*SCALARS, "frobnicate"])}),
        st.fixed_dictionaries({"enum": or_junk(st.lists(enum_member, max_size=4))}),
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
            *(
                st.fixed_dictionaries({key: or_junk(st.lists(children, max_size=3))})
                for key in ("oneOf", "anyOf", "allOf")
            ),
        ]
    noise = st.fixed_dictionaries(
        {},
        optional={
            "description": or_junk(nasty_text),
            "$ref": st.sampled_from([None, None, None, None, "#/definitions/x", 7]),
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

FUZZ = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


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

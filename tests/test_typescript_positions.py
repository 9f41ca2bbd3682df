"""TypeScript removed with every position kept (nous_sched/runtime/_typescript.py, _program.py).

Generated annotated programs, each with one error placed somewhere: the
position QuickJS reports for the error in the stripped program is, in the
model's original text, the place of the error's token. Columns are UTF-8
bytes, as QuickJS counts them, so the generated types hold non-ASCII text.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nous_sched import QuickJSRuntime, run_code
from nous_sched.runtime._program import prepare, unfence
from nous_sched.runtime._typescript import strip

TYPES = st.sampled_from(
    [
        "number",
        "string[]",
        "Array<number>",
        "{ a: number; b?: string }",
        "Map<string, number[]>",
        '"lit" | 3',
        '"日本é" | null',
        "(x: number) => void",
        "Record<string, { deep: Array<[number, string]> }>",
    ]
)
VALUES = st.sampled_from(["1", '"s"', "[1, 2]", "{ a: 1 }", "(1 + 2)", '"日本"', "null"])
SEPARATORS = st.sampled_from(["\n", " ", "\n\n  ", ";\n", "\n\t"])
BOOM = "__boom.x"


def statement(kind: str, n: int, t: str, e: str) -> str:
    return {
        "annotated": f"const v{n}: {t} = {e};",
        "cast": f"let c{n} = ({e}) as {t};",
        "satisfies": f"const s{n} = {e} satisfies {t};",
        "function": f"function f{n}<X>(a: {t}, b?: {t}): {t} {{ return a; }}",
        "interface": f"interface I{n} {{ x: {t}; y?: {t} }}",
        "alias": f"type T{n} = {t};",
        "generic": f"const g{n} = id<{t}>({e});",
        "non_null": f"const u{n} = ({e})!;",
        "as_const": f"const o{n} = {{ k: {e} }} as const;",
        "plain": f'const p{n} = [{e}, "é日"];',
        "expression": f"({e});",
    }[kind]


KINDS = st.sampled_from(
    [
        "annotated",
        "cast",
        "satisfies",
        "function",
        "interface",
        "alias",
        "generic",
        "non_null",
        "as_const",
        "plain",
        "expression",
    ]
)
#: The statements whose expression runs: the error goes in one of them.
RUNS = ("annotated", "cast", "satisfies", "generic", "non_null", "as_const", "plain", "expression")


@st.composite
def programs(draw: st.DrawFn) -> str:
    count = draw(st.integers(1, 8))
    kinds = [draw(KINDS) for _ in range(count)]
    where = draw(st.integers(0, count))
    kinds.insert(where, draw(st.sampled_from(RUNS)))
    parts = ["function id<X>(x: X): X { return x }"]
    for n, kind in enumerate(kinds):
        value = BOOM if n == where else draw(VALUES)
        parts.append(statement(kind, n, draw(TYPES), value))
    text = parts[0]
    for part in parts[1:]:
        text += draw(SEPARATORS) + part
    if draw(st.booleans()):
        # Long enough that a plain program is parsed only at its end (_program._tail).
        text = "\n".join(f"const pad{i} = [{i}, 'é'].length;" for i in range(120)) + "\n" + text
    if draw(st.booleans()):
        text = "```ts\n" + text + "\n```"
    return text


_AT = re.compile(r"<input>:(\d+):(\d+)")
RUNTIME = QuickJSRuntime()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_the_error_position_in_the_stripped_program_is_the_errors_place_in_the_original(program: str) -> None:
    result = run_code(program, description="positions", runtime=RUNTIME)
    assert result.error is not None and result.error.message.startswith("ReferenceError: __boom is not defined")
    found = _AT.search(result.error.message)
    assert found is not None, result.error.message
    line, column = int(found.group(1)), int(found.group(2))
    original_line = program.split("\n")[line - 1].encode("utf-8")
    assert original_line[column - 1 :].startswith(b"__boom"), (program, result.error.message)


@settings(max_examples=300, deadline=None)
@given(programs())
def test_stripping_keeps_every_byte_that_stays_where_it_was(program: str) -> None:
    text = unfence(program)
    stripped = strip(text)
    before, after = text.encode("utf-8"), stripped.data
    assert len(after) == len(before) and after.count(b"\n") == before.count(b"\n")
    assert all(a == b or a == 0x20 for a, b in zip(after, before))
    assert stripped.changed and stripped.clean
    assert prepare(program).parsed


def test_a_syntax_error_after_types_points_into_the_models_text() -> None:
    # Not parsed up front (it ends in a return): QuickJS's SyntaxError sends it to the parser, then runs again.
    program = 'const a: Map<string, "日本"> = new Map();\nconst b = a.get("x") +* 2;\nreturn b'
    for runtime in (RUNTIME, None):
        result = run_code(program, description="positions", runtime=runtime)
        assert result.error is not None and result.error.message.startswith("SyntaxError"), result.error
        assert "<input>:2:23" in result.error.message, result.error.message  # the `*`
        assert program.split("\n")[1].encode()[22:23] == b"*"


@pytest.mark.parametrize(
    "last, result",
    [
        ("x0", 0),
        ("async function main() {\n  return x1 + 1\n}\nmain()", 3),
        ("const s = `\nx0\n`\ns.length", 4),  # a line inside the template looks like a statement
        ("/*\nx1\n*/\nx1", 2),  # and one inside a comment
        ("for (const a of [x0]) {\n  a\n}", None),  # not an expression: nothing
        ("const y: number = 5\ny", 5),  # TypeScript before the end: parsed whole after QuickJS refuses it
        ("[x0,\nx1]", [0, 2]),
    ],
)
def test_a_long_program_is_parsed_only_at_its_end(last: str, result: object) -> None:
    program = "\n".join(f"const x{i} = {i} * 2;" for i in range(400)) + "\n" + last
    assert len(program) > 2048
    source = prepare(program)
    assert not source.parsed or ":" in last  # (only what holds TypeScript goes to the parser whole)
    for runtime in (RUNTIME, None):
        run = run_code(program, description="tail", runtime=runtime)
        assert run.error is None and run.result == result, run


@pytest.mark.parametrize(
    "program, result",
    [
        ('const s: string = "\ud800\u202e"; s', "\ud800\u202e"),  # a lone surrogate and a bidi control in a string
        ("const t: `\ud800${number}` = `x`; t", "x"),  # ... in a type that is removed
        ("\ufeffconst a: number = 1; a", 1),  # a byte-order mark first
        ("const a: number[] = [" + "[" * 3000 + "]" * 3000 + "]; return 1", None),  # deep: the engine's stack stops it
    ],
)
def test_hostile_text_in_a_typescript_program(program: str, result: object) -> None:
    source = prepare(program)
    assert len(source.text.encode("utf-8", "surrogatepass")) >= len(program.encode("utf-8", "surrogatepass"))
    run = run_code(program, description="hostile", runtime=RUNTIME)
    if result is None:
        assert run.error is not None and run.error.kind == "abort", run.error
    else:
        assert run.error is None and run.result == result, run.error

"""The model's first try (issue 36): programs in the forms models write, each with the answer it must give.

Every row of :data:`CORPUS` is run through ``run_code`` on both runtimes and
checked on ``for_model()``, what the model reads: the right result, or an
error or hint that names the fix.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Optional

import pytest

from nous_sched import Limits, PermissionPolicy, Throttle, Tool, run_code, run_code_tool
from nous_sched.result._hints import MAX_HINT_CHARS, NOTHING_RETURNED
from nous_sched.result.budget import MIN_OUTPUT_BUDGET
from nous_sched.result.budget import size as budget_size
from nous_sched.sdk import render

pytestmark = pytest.mark.usefixtures("runtime")

CITIES = {
    "Tokyo": {"name": "Tokyo", "population": 37_400_000, "country": "JP"},
    "Paris": {"name": "Paris", "population": 11_000_000, "country": "FR"},
}


def _lookup_city(args: dict[str, Any]) -> Any:
    return CITIES.get(args.get("name"), {})


def _find_cities(args: dict[str, Any]) -> Any:
    prefix = args.get("prefix", "")
    return [c for c in CITIES if c.startswith(prefix)]


TOOLS = [
    Tool("lookup_city", _lookup_city, description="Look up a city by name."),
    Tool("list_cities", lambda args: list(CITIES), description="Every city's name."),
    Tool("find_cities", _find_cities, description="The names of the cities that start with a prefix."),
]


class Row:
    """One program and what the model must read: ``result`` (exactly), or
    ``error`` / ``hint`` / ``logs`` fragments that must all appear."""

    def __init__(
        self,
        name: str,
        program: str,
        result: Any = ...,
        *,
        error: tuple[str, ...] = (),
        hint: tuple[str, ...] = (),
        logs: Optional[list[str]] = None,
        no_hint: bool = False,
    ) -> None:
        self.name = name
        self.program = program
        self.result = result
        self.error = error
        self.hint = hint
        self.logs = logs
        self.no_hint = no_hint

    def check(self, answer: dict[str, Any]) -> None:
        text = json.dumps(answer)
        if self.error:
            assert "error" in answer, text
            for fragment in self.error:
                assert fragment in answer["error"]["message"], (fragment, text)
        else:
            assert "error" not in answer, text
            if self.result is not ...:
                assert answer["result"] == self.result, text
        for fragment in self.hint:
            assert fragment in answer.get("hint", ""), (fragment, text)
        if self.no_hint:
            assert "hint" not in answer, text
        if self.logs is not None:
            assert answer["logs"] == self.logs, text


TOKYO = CITIES["Tokyo"]
CORPUS = [
    # -- TypeScript: removed, positions kept ---------------------------------------------
    Row("ts-annotation", 'const names: string[] = ["Tokyo"]; return names.length', 1, no_hint=True),
    Row("ts-function-types", "function double(x: number): number { return x * 2 }\nreturn double(21)", 42),
    Row(
        "ts-interface",
        "interface City { name: string; population: number }\n"
        'const c: City = await tools.lookup_city({name: "Tokyo"});\nreturn c.population',
        37_400_000,
    ),
    Row("ts-type-alias", 'type Name = string;\nconst n: Name = "Paris";\nreturn n', "Paris"),
    Row(
        "ts-as-cast",
        'const c = (await tools.lookup_city({name: "Paris"})) as { population: number };\nreturn c.population',
        11_000_000,
    ),
    Row("ts-as-const", "const xs = [1, 2] as const;\nreturn xs", [1, 2]),
    Row("ts-non-null-and-generic-new", 'const m = new Map<string, number>([["a", 1]]);\nreturn m.get("a")! + 1', 2),
    Row(
        "ts-generic-call",
        'const c = await tools.lookup_city<{ population: number }>({name: "Tokyo"});\nreturn c.population',
        37_400_000,
    ),
    Row(
        "ts-generic-function",
        "function first<T>(xs: T[]): T | undefined { return xs[0] }\nreturn first(await tools.list_cities())",
        "Tokyo",
    ),
    Row(
        "ts-typed-async-arrow",
        "const names: string[] = await tools.list_cities();\n"
        "return await Promise.all(names.map(async (name: string): Promise<number> =>\n"
        "  (await tools.lookup_city({name})).population))",
        [37_400_000, 11_000_000],
    ),
    Row("ts-satisfies", "const cfg = { limit: 2 } satisfies { limit: number };\nreturn cfg.limit", 2),
    Row("ts-optional-parameter", 'function greet(name?: string) { return "hi " + (name ?? "you") }\ngreet()', "hi you"),
    Row(
        "ts-class-modifiers",
        "class Counter { private n: number = 0; inc(): number { return ++this.n } }\n"
        "const c = new Counter(); c.inc();\nreturn c.inc()",
        2,
    ),
    Row("ts-declare", "declare const DEBUG: boolean;\nreturn 1", 1),
    Row("ts-enum", "enum Color { Red, Green }\nreturn Color.Red", error=("enum", "plain object", "<input>:1:1")),
    Row("ts-namespace", "namespace Geo { export const x = 1 }\nreturn 1", error=("namespace", "plain object")),
    Row("ts-decorator", "@sealed\nclass A {}\nreturn 1", error=("decorator", "yourself", "<input>:1:1")),
    Row(
        "ts-real-error-keeps-its-place",
        "const a: number = 1;\nconst b: string = (a as any).foo.bar;\nreturn b",
        error=("TypeError", "<input>:2:"),
    ),
    # -- Markdown fences -----------------------------------------------------------------
    Row("fence-js", '```js\nconst c = await tools.lookup_city({name: "Tokyo"});\nreturn c.country\n```', "JP"),
    Row("fence-ts", "```ts\nconst n: number = (await tools.list_cities()).length;\nreturn n\n```", 2),
    Row("fence-with-prose-after", "```javascript\nreturn 7\n```\nThis returns seven.", 7),
    Row("fence-never-closed", "```typescript\nconst x: number = 3;\nreturn x", 3),
    # -- missing await -------------------------------------------------------------------
    Row(
        "no-await-property",
        'const c = tools.lookup_city({name: "Tokyo"});\nreturn c.population',
        None,
        hint=("`tools.lookup_city(...)`", "write `await` before the call", NOTHING_RETURNED),
    ),
    Row(
        "no-await-promise-passed-to-tool",
        "const names = tools.list_cities();\nreturn await tools.lookup_city({name: names})",
        error=("argument $.name is a Promise", "write `await` before that call"),
    ),
    Row(
        "no-await-promise-in-result",
        'return {city: tools.lookup_city({name: "Tokyo"})}',
        {},
        hint=("$.city: a Promise", "write `await` before it"),
    ),
    Row(
        "no-await-in-map",
        "const names = await tools.list_cities();\nreturn names.map(name => tools.lookup_city({name}))",
        [None, None],
        hint=("$[0]: a Promise", "write `await` before it"),
    ),
    Row(
        "floating-call-at-the-end",
        'tools.lookup_city({name: "Paris"});\nreturn "done"',
        "done",
        hint=("`tools.lookup_city(...)` was still running", "await"),
    ),
    # -- missing return ------------------------------------------------------------------
    Row("last-expression", 'const c = await tools.lookup_city({name: "Tokyo"});\nc.population', 37_400_000),
    Row("last-expression-one-line", 'await tools.lookup_city({name: "Tokyo"})', TOKYO, no_hint=True),
    Row(
        "last-expression-async-main",
        "async function main() {\n  return (await tools.list_cities()).length\n}\nmain()",
        2,
    ),
    Row("return-wins", 'if ((await tools.list_cities()).length) return "some"\n"none"', "some"),
    Row(
        "no-return-statement",
        'const c = await tools.lookup_city({name: "Tokyo"})',
        None,
        hint=(NOTHING_RETURNED,),
    ),
    Row("logs-instead-of-return", 'console.log("found", 2)', None, logs=["found 2"], no_hint=True),
    # -- Map, Set, Date and the rest of the rule -----------------------------------------
    Row("map-result", 'return new Map([["a", 1]])', {"a": 1}, hint=("$: a Map, sent as an object",)),
    Row("map-number-keys", "return new Map([[1, 'x']])", [[1, "x"]], hint=("list of [key, value] pairs",)),
    Row("set-result", "return new Set(await tools.list_cities())", ["Tokyo", "Paris"], hint=("$: a Set",)),
    Row("date-result", "return {when: new Date(0)}", {"when": "1970-01-01T00:00:00.000Z"}, hint=("$.when: a Date",)),
    Row("typed-array", "return new Uint8Array([1, 2])", [1, 2], hint=("$: a typed array",)),
    Row("bigint", "return 2n ** 64n", "18446744073709551616", hint=("$: a BigInt",)),
    Row("nan", "return {ratio: 0 / 0}", {"ratio": None}, hint=("$.ratio: NaN, sent as null",)),
    Row(
        "class-instance",
        "class P { constructor(x) { this.x = x } }\nreturn new P(1)",
        {"x": 1},
        hint=("an instance of P",),
    ),
    Row("cycle", "const a = {n: 1}; a.self = a;\nreturn a", {"n": 1, "self": None}, hint=("$.self", "a cycle")),
    Row("undefined-field", "return {a: 1, b: undefined}", {"a": 1}, hint=("$.b: undefined, dropped",)),
    Row("function-field", "return {a: 1, f() {}}", {"a": 1}, hint=("$.f: a function",)),
    Row(
        "logged-map",
        'console.log(new Map([["a", 1]])); return 1',
        1,
        logs=['{"a":1} [$: a Map, sent as an object]'],
        no_hint=True,
    ),
    # -- names: a tool as a bare function, a wrong tool name, the SDK --------------------
    Row(
        "bare-tool-function",
        'return await lookup_city({name: "Tokyo"})',
        error=("lookup_city is not defined", "call it as `await tools.lookup_city({...})`"),
    ),
    Row("bare-sdk-function", 'return await search("city")', error=("call it as `await sdk.search(...)`",)),
    Row(
        "wrong-tool-name",
        'return await tools.lookup_cty({name: "Tokyo"})',
        error=('unknown tool "lookup_cty"', 'did you mean "lookup_city"'),
    ),
    Row("tool-not-tools", 'return await tool.lookup_city({name: "Tokyo"})', error=("the global `tools`",)),
    # -- iterating a tool's result -------------------------------------------------------
    Row(
        "for-await-over-a-call",
        "const out = [];\nfor await (const name of tools.list_cities()) out.push(name);\nreturn out",
        ["Tokyo", "Paris"],
    ),
    Row(
        "for-await-over-awaited",
        "const out = [];\nfor await (const name of await tools.list_cities()) out.push(name);\nreturn out",
        ["Tokyo", "Paris"],
    ),
    Row(
        "for-of-over-a-call",
        "for (const name of tools.list_cities()) {}",
        error=("returns a Promise", "for (const item of await tools.name(args))", "<input>:1:"),
    ),
    Row("spread-a-call", "return [...tools.list_cities()]", error=("returns a Promise", "await")),
    Row(
        "for-await-over-an-object",
        'for await (const x of tools.lookup_city({name: "Tokyo"})) {}',
        error=("its result is not a list", "Object.entries"),
    ),
    # -- an empty result after data ------------------------------------------------------
    Row(
        "empty-after-data",
        'const a = await tools.find_cities({prefix: "T"});\n'
        'const b = await tools.find_cities({prefix: "Tkyo"});\nreturn [a.length, b.length]',
        [1, 0],
        hint=("`tools.find_cities(...)` returned an empty result (call 1)", "check that call's arguments"),
    ),
]


def test_the_corpus_holds_the_forms_the_issue_names():
    names = {row.name.split("-")[0] for row in CORPUS}
    assert len(CORPUS) >= 40 and len({row.name for row in CORPUS}) == len(CORPUS)
    for form in ("ts", "fence", "no", "last", "map", "set", "date", "bare", "wrong", "for", "empty"):
        assert form in names, form


@pytest.mark.parametrize("row", CORPUS, ids=lambda row: row.name)
def test_corpus(row: Row) -> None:
    result = run_code(row.program, TOOLS, description="corpus", timeout=10)
    answer = result.for_model()
    row.check(answer)
    # The hint is bounded and counted in the ledger.
    hint = answer.get("hint", "")
    assert len(hint) <= MAX_HINT_CHARS
    # (Its entry in the answer, `, "hint": "..."`, as long as `{"hint": "..."}`.)
    assert result.usage.hint_bytes == (budget_size({"hint": hint}) if hint else 0)
    assert result.usage.answer_bytes == budget_size(answer)


def test_the_run_code_tool_sends_the_same_answer() -> None:
    """What an adapter sends: run_code_tool's answer carries the hint too."""
    spec = run_code_tool(TOOLS)
    out = spec.function(
        {"code": 'const c = tools.lookup_city({name: "Tokyo"});\nreturn c.population', "description": "x"}
    )
    answer = getattr(out, "value", out)
    assert answer["result"] is None and "write `await` before the call" in answer["hint"]


def _deadline_message(program: str, tools: list[Tool], **options: Any) -> str:
    result = run_code(program, tools, description="deadline", limits=Limits(timeout=1.0), **options)
    assert result.error is not None and result.error.kind == "timeout", result
    return result.error.message


def test_a_deadline_while_waiting_for_a_throttle_names_it() -> None:
    throttle = Throttle("geo-api", max_running=1)
    tool = Tool("geocode", lambda args: "x", throttles=[throttle])
    with throttle.hold():  # its one place is taken for the whole run
        message = _deadline_message('return await tools.geocode({q: "Tokyo"})', [tool])
    assert "(waiting for a place in throttle 'geo-api' before tool 'geocode' (call 0))" in message
    assert "running JavaScript" not in message


def test_a_deadline_while_waiting_for_an_approval_names_it() -> None:
    release = threading.Event()

    def slow_approval(request: Any) -> bool:
        release.wait(30)
        return False

    tool = Tool("delete_city", lambda args: "gone", requires_approval=True)
    try:
        message = _deadline_message(
            'return await tools.delete_city({name: "Paris"})',
            [tool],
            policy=PermissionPolicy(),
            approval_handler=slow_approval,
        )
    finally:
        release.set()
    assert "(waiting for an approval of tool 'delete_city' (call 0))" in message


def test_a_deadline_while_a_tool_runs_names_it() -> None:
    release = threading.Event()
    tool = Tool("slow", lambda args: release.wait(30))
    try:
        message = _deadline_message("return await tools.slow({})", [tool])
    finally:
        release.set()
    assert "(waiting for tool 'slow' (call 0) to return)" in message


def test_a_deadline_in_javascript_says_so() -> None:
    message = _deadline_message("while (true) {}", [])
    assert "(running JavaScript)" in message and "Look for a loop that never ends" in message


@pytest.mark.parametrize(
    "program, kind, fix",
    [
        ("return 'x'.repeat(2000000)", "output_limit", "Return less"),
        ("return () => 1", "invalid_output", "Return plain data"),
        ("const a = []; while (true) a.push('x'.repeat(1000))", "abort", "Use less memory"),
        ("function f() { return f() + 1 }\nreturn f()", "abort", "Use less memory or recursion"),
    ],
)
def test_every_error_kind_says_what_to_change(program: str, kind: str, fix: str) -> None:
    limits = Limits(timeout=10, memory_bytes=16 * 1024 * 1024)
    result = run_code(program, description="kinds", limits=limits)
    assert result.error is not None and result.error.kind == kind, result.error
    assert fix in result.error.message


def test_the_sdk_says_which_forms_are_accepted() -> None:
    text = render(TOOLS, language="typescript")
    assert "Write JavaScript or TypeScript" in text and "not enum, namespace or decorators" in text
    assert "`await` every call" in text and "else its last expression's value" in text


def test_a_hint_survives_hostile_names() -> None:
    """A class name and a tool name the program chose cross into the hint inert."""
    program = (
        'const K = {["Evil\\u202e\\u0000\\ud800"]: class {}}["Evil\\u202e\\u0000\\ud800"];\n'
        'tools["x\\u2028y"]({});\nreturn [new K()]'
    )
    result = run_code(program, TOOLS, description="hostile")
    hint = result.for_model()["hint"]
    assert "\u202e" not in hint and "\x00" not in hint and "\u2028" not in hint
    assert "\\u202e" in hint and "an instance of Evil" in hint
    json.dumps(result.for_model()).encode("utf-8")  # no lone surrogate left to refuse


@pytest.mark.parametrize("budget", [MIN_OUTPUT_BUDGET, 300, 700, 5_000])
def test_the_hint_and_the_output_budget(budget: int) -> None:
    program = 'const c = tools.lookup_city({name: "Tokyo"});\nconsole.log("x".repeat(3000));\nreturn new Map([["a", "y".repeat(3000)]])'
    result = run_code(program, TOOLS, description="budget", output_budget=budget)
    answer = result.for_model()
    size = budget_size(answer)
    assert size <= budget, (size, answer)
    head = answer["hint"].split("… [", 1)[0]  # cut, its head kept and the rest counted
    known = "The program ended while `tools.lookup_city(...)` was still running"
    assert head == "…" or head.startswith(known) or known.startswith(head), answer["hint"]
    assert result.usage.model_bytes == size and result.usage.hint_bytes > 0


@pytest.mark.parametrize(
    "program, result",
    [
        ("Object.prototype.get = function () { return 5 };\nreturn {a: 1, b: [1, 2]}", {"a": 1, "b": [1, 2]}),
        ('Object.prototype.get = function () { return 5 };\nreturn {a: new Map([["x", 1]])}', {"a": {"x": 1}}),
        (
            'Object.defineProperty(Array.prototype, "0", {set(v) {}, configurable: true});\n'
            "return [[1], {m: new Set([2])}]",
            [[1], {"m": [2]}],
        ),
        # A getter runs once, as JSON.stringify runs it.
        ("let n = 0;\nreturn [{get a() { return ++n }}, n]", [{"a": 1}, 0]),
    ],
)
def test_a_polluted_prototype_does_not_change_the_conversion(program: str, result: Any) -> None:
    run = run_code(program, description="pollution")
    assert run.error is None and run.result == result, run.error


def test_a_big_result_is_converted_by_the_same_rule() -> None:
    """Past 2,048 values JSON.stringify writes the result; the rule's values are the same."""
    many = "Array.from({length: 3000}, (_, i) => i)"
    cases = [
        (f"return {{xs: {many}, m: new Map([['a', 1]])}}", lambda r: r["m"] == {"a": 1}, "$.m: a Map"),
        (f"return {{xs: {many}, n: NaN}}", lambda r: r["n"] is None, "$.n: NaN"),
        (f"return {{xs: {many}, b: 5n}}", lambda r: r["b"] == "5", "$.b: a BigInt"),
        (f"return {{xs: {many}, t: new Uint8Array([7])}}", lambda r: r["t"] == [7], "$.t: a typed array"),
        (f"return {{xs: {many}, d: new Date(0)}}", lambda r: r["d"] == "1970-01-01T00:00:00.000Z", None),
    ]
    for program, check, said in cases:
        result = run_code(program, description="big")
        assert result.ok and len(result.result["xs"]) == 3000 and check(result.result), result.error
        assert (said in result.hint) if said else result.hint == "", result.hint


def test_a_durable_run_gets_the_same_hints(tmp_path: Any) -> None:
    from nous_sched import SqliteApprovalStore

    store = SqliteApprovalStore(str(tmp_path / "approvals.db"))
    typed = run_code(
        "const x: number = (await tools.find_cities({prefix: 'T'})).length;\nx",
        TOOLS,
        description="d",
        approval_store=store,
    )
    assert typed.result == 1
    converted = run_code("return new Set([1])", TOOLS, description="d", approval_store=store)
    assert converted.result == [1] and "$: a Set, sent as an array" in converted.for_model()["hint"]

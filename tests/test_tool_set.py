"""A tool set's derived values are made once and shared, equal to a fresh build (issue 44, tool count).

``nous_sched.gate.toolset`` (partition, names, approval set, Bind references),
``nous_sched.sdk.fitted`` (the SDK text), ``WordIndex`` (the scores of recent
terms) and the prelude's lazy ``tools`` (names read in their JSON text). No
timing here: the costs are in ``benchmarks/bench_tool_count.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nous_sched import Bind, PermissionPolicy, QuickJSRuntime, State, Tool, WorkerPool, run_code, run_code_tool
from nous_sched.gate import toolset
from nous_sched.gate.policy import approval_names, partition
from nous_sched.runtime.engine import names_json
from nous_sched.sdk import ToolIndex, _steps
from nous_sched.tooling import missing_binds

FUZZ = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def _f(args: Any) -> Any:
    return args


NAMES = st.sampled_from(["a", "b", "get_x", "put.y", "then", "__proto__", 'q"uote', "co,mma", "[x]", "é", "a\nb"])


@st.composite
def tool_sets(draw: Any) -> list[Tool]:
    tools = []
    for name in draw(st.lists(NAMES, max_size=8)):
        bound = draw(st.sampled_from([{}, {"tenant": Bind("tenant")}, {"org": Bind("org"), "k": 1}]))
        callers = draw(st.sampled_from([{"model", "code"}, {"code"}, {"model"}]))
        tools.append(
            Tool(
                name,
                _f,
                description=draw(st.sampled_from(["", "Gets x.", "Puts y in z."])),
                requires_approval=draw(st.booleans()),
                category=draw(st.sampled_from(["read", "write"])),
                bound=bound,
                callers=callers,
                parameters={"type": "object", "properties": {"k": {"type": "integer"}, "tenant": {}, "org": {}}},
            )
        )
    return tools


POLICIES = st.one_of(
    st.none(),
    st.builds(
        PermissionPolicy,
        deny=st.frozensets(NAMES, max_size=3),
        require_approval=st.frozensets(NAMES, max_size=2),
        approval_categories=st.sampled_from([frozenset(), frozenset({"write"})]),
    ),
)


def _same(a: toolset.ToolSet, tools: list[Tool], policy: Any) -> None:
    granted, denied = partition(tools, policy, "t")
    assert a.granted == granted and list(a.granted) == list(granted)
    assert a.denied == denied and list(a.denied) == list(denied)
    assert a.names == tuple(sorted({*granted, *denied}))
    assert a.require_approval == approval_names(policy, granted.values())
    for bind in (None, {}, {"tenant": 1}, {"tenant": 1, "org": 2}):
        assert a.missing_binds(bind) == missing_binds(granted.values(), bind)


@FUZZ
@given(tool_sets(), POLICIES, POLICIES)
def test_a_kept_tool_set_equals_a_fresh_one_and_a_shaping_change_gives_a_fresh_one(tools, policy, other) -> None:
    kept = toolset.tool_set(tools, policy, "t")
    _same(kept, tools, policy)
    assert toolset.tool_set(list(tools), policy, "t") is kept  # the same tools, another list: the kept one
    as_tuple = tuple(tools)
    first = toolset.tool_set(as_tuple, policy, "t")
    assert toolset.tool_set(as_tuple, policy, "t") is first
    changed = toolset.tool_set(tools, other, "t")
    _same(changed, tools, other)
    assert (changed is kept) == (other == policy)
    if tools:  # a new tool object (equal fields) is another tool set
        copy = [Tool(**{**{f: getattr(tools[0], f) for f in ("name", "function", "description")}}), *tools[1:]]
        assert toolset.tool_set(copy, policy, "t") is not kept


def test_the_kept_tool_sets_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    toolset.clear()
    sets = [[Tool(f"t{i}_{k}", _f) for k in range(3)] for i in range(toolset.TOOL_SETS + 5)]
    for tools in sets:
        toolset.tool_set(tools, None, "t")
    count, held = toolset.cached_sets()
    assert count == toolset.TOOL_SETS and held == 3 * toolset.TOOL_SETS
    monkeypatch.setattr(toolset, "CACHED_TOOLS", 10)
    big = [Tool(f"big{k}", _f) for k in range(11)]
    made = toolset.tool_set(big, None, "t")
    assert toolset.tool_set(big, None, "t") is not made  # past the bound: never kept
    toolset.tool_set([Tool("one", _f)], None, "t")
    count, held = toolset.cached_sets()
    assert held <= 10  # the tools held stay under the bound whatever was kept before
    toolset.clear()
    assert toolset.cached_sets() == (0, 0)


def test_a_list_changed_in_place_is_its_new_tools_whatever_set_it_gave_before() -> None:
    toolset.clear()
    tools = [Tool(f"l{k}", _f) for k in range(4)]
    kept = toolset.tool_set(tools, None, "t")
    assert toolset.tool_set(tools, None, "t") is kept  # the same list, unchanged: the kept set
    tools[2] = Tool("other", _f)  # the same list object, one item replaced
    changed = toolset.tool_set(tools, None, "t")
    assert changed is not kept
    _same(changed, tools, None)
    tools.append(Tool("more", _f))
    longer = toolset.tool_set(tools, None, "t")
    assert longer is not changed
    _same(longer, tools, None)
    del tools[-1]
    assert toolset.tool_set(tools, None, "t") is changed  # back to the tools of a kept set
    tools[2] = Tool("other", _f)  # equal to the one it replaces, but another object: another set
    assert toolset.tool_set(tools, None, "t") is not changed
    toolset.clear()


def test_the_lists_a_kept_set_remembers_are_at_most_one_per_kept_set() -> None:
    toolset.clear()
    tools = [Tool(f"m{k}", _f) for k in range(3)]
    lists = [list(tools) for _ in range(50)]  # held, so no two share an id
    kept = toolset.tool_set(lists[0], None, "t")
    assert all(toolset.tool_set(each, None, "t") is kept for each in lists)
    assert all(toolset.tool_set(each, None, "t") is kept for each in lists)  # (each asked again)
    for i in range(toolset.TOOL_SETS + 3):  # other sets, each from a list: the first one is dropped
        toolset.tool_set([Tool(f"n{i}_{k}", _f) for k in range(2)], None, "t")
    count, _ = toolset.cached_sets()
    # (The cache's own table of lists, read here: no public figure says how big it is.)
    assert len(toolset._by_list) <= count == toolset.TOOL_SETS  # noqa: SLF001
    assert toolset.tool_set(lists[0], None, "t") is not kept  # dropped, and never answered by its old list
    toolset.clear()


def test_a_policy_subclass_is_never_kept() -> None:
    class Moody(PermissionPolicy):
        pass

    tools = [Tool("a", _f)]
    policy = Moody()
    assert toolset.tool_set(tools, policy, "t") is not toolset.tool_set(tools, policy, "t")


def test_a_bad_tool_set_is_refused_as_before() -> None:
    with pytest.raises(Exception, match="tools"):
        toolset.tool_set([Tool("a", _f), "b"], None, "run_code")  # type: ignore[list-item]
    with pytest.raises(Exception, match="tools"):
        toolset.tool_set("ab", None, "run_code")  # type: ignore[arg-type]


@FUZZ
@given(tool_sets(), st.sampled_from([None, 1_500, 3_000]), st.lists(NAMES, max_size=3))
def test_a_kept_sdk_text_equals_a_fresh_one(tools, budget, ranking) -> None:
    text = _steps.fitted(tools, "typescript", budget, ranking)
    assert text == _steps._fitted(tools, "typescript", budget, ranking)
    assert _steps.fitted(list(tools), "typescript", budget, ranking) is text
    other = None if budget is not None else 1_500
    assert _steps.fitted(tools, "typescript", other, ranking) == _steps._fitted(tools, "typescript", other, ranking)
    assert _steps.fitted(tools, "python", budget, ranking) == _steps._fitted(tools, "python", budget, ranking)


def test_the_kept_sdk_texts_are_bounded() -> None:
    for i in range(_steps.SDK_TEXTS + 4):
        _steps.fitted([Tool(f"x{i}", _f)], "typescript", None, ())
    assert len(_steps._texts) == _steps.SDK_TEXTS


def test_run_code_tool_built_twice_makes_its_sdk_once_and_the_state_note_each_time(tmp_path) -> None:
    tools = [Tool(f"tool_{i}", _f, description=f"Does {i}.") for i in range(50)]
    first = run_code_tool(tools, runtime=QuickJSRuntime())
    key = (tuple(map(id, tools)), "typescript")
    kept = [text for k, (_, text) in _steps._texts.items() if k[:2] == key]
    assert kept and kept[-1] in first.description
    second = run_code_tool(tools, runtime=QuickJSRuntime())
    assert second.description == first.description
    # The state's note lists its keys now: it is made for each build, never kept.
    state = State("scope-a")
    before = run_code_tool(tools, runtime=QuickJSRuntime(), state=state).description
    r = run_code("await state.set('fresh_key', 1); return 1;", tools, state=state, description="t")
    assert r.ok, r.error
    after = run_code_tool(tools, runtime=QuickJSRuntime(), state=state).description
    assert "fresh_key" in after and "fresh_key" not in before


def test_a_model_only_tool_stays_out_of_the_kept_sdk() -> None:
    tools = [Tool("shown", _f), Tool("model_only", _f, callers={"model"})]
    for _ in range(2):
        description = run_code_tool(tools, runtime=QuickJSRuntime()).description
        assert "shown" in description and "model_only" not in description


@FUZZ
@given(st.lists(st.text(st.sampled_from("ab _-xyéq"), min_size=1, max_size=6), max_size=5))
def test_kept_term_scores_rank_as_fresh_ones(queries) -> None:
    tools = [
        Tool(n, _f, description=d)
        for n, d in [("get_weather", "the weather in a city"), ("x_y", "why a b"), ("a_b", "ab xy"), ("qq", "é q")]
    ]
    warm = ToolIndex(tools)
    for query in queries:
        if query.strip():
            first = warm.search(query, 3)
            assert warm.search(query, 3) == first == ToolIndex(tools).search(query, 3)


# -- the prelude's tools: names read in their JSON text ----------------------------------------

HOSTILE = st.text(
    st.sampled_from(['"', ",", "[", "]", "\\", "\n", "\x00", "\x1f", "\x7f", "é", "\u2028", "a", "b", "\ud800", "😀"]),
    min_size=1,
    max_size=5,
)
PROBE = """
const names = %s, probes = %s;
const out = [];
for (const n of names) out.push(typeof tools[n] === "function" && tools[n] === tools[n]);
for (const p of probes) out.push(tools[p] === tools[p]);
out.push(JSON.stringify(Object.keys(tools)) === JSON.stringify(names));
for (const n of names) out.push(n in tools);
for (const p of probes) out.push(p in tools);
out.push(Object.isFrozen(tools));
return out;
"""


WORKER = WorkerPool(size=2)


@pytest.mark.parametrize("runtime", [QuickJSRuntime(), WORKER], ids=["in_process", "worker"])
@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=st.lists(HOSTILE, max_size=6, unique=True), probes=st.lists(HOSTILE, max_size=4))
def test_a_program_sees_exactly_the_declared_tools_whatever_their_names(runtime, names, probes) -> None:
    names = sorted(set(names))
    probes = [p for p in probes if p not in names and p not in ("then", "constructor")]
    tools = [Tool(n, _f) for n in names]
    program = PROBE % (json.dumps(names), json.dumps(probes))
    r = run_code(program, tools, runtime=runtime, description="t")
    if any("\ud800" <= c <= "\udfff" for n in names + probes for c in n):
        # A lone surrogate crosses as JSON escapes: the program's string is the same code units.
        assert r.ok, r.error
        return
    assert r.ok, r.error
    expected = [True] * len(names) + [False] * len(probes) + [True] + [True] * len(names) + [False] * len(probes)
    assert r.result == [*expected, True]


@pytest.mark.parametrize("runtime", [QuickJSRuntime(), WORKER], ids=["in_process", "worker"])
@pytest.mark.parametrize(
    "names, probes",
    [(["[", "]"], [","]), (["x[", "]y"], [","]), (["a,", ",b"], [","]), (['"', '""'], [","]), (["]", "["], ['"]"'])],
)
def test_a_name_made_of_the_text_between_two_declared_names_is_not_declared(runtime, names, probes) -> None:
    # `","` is in the names text of "[" and "]", between a [ and a ]: once seen as declared
    # (found by the property test above, which draws such names only now and then).
    names = sorted(names)
    r = run_code(
        PROBE % (json.dumps(names), json.dumps(probes)), [Tool(n, _f) for n in names], runtime=runtime, description="t"
    )
    assert r.ok, r.error
    expected = [True] * len(names) + [False] * len(probes) + [True] + [True] * len(names) + [False] * len(probes)
    assert r.result == [*expected, True]


def test_names_json_is_made_once_per_names_tuple() -> None:
    names = ("a", 'b"', "c")
    text, lazy = names_json(names)
    assert json.loads(text) == list(names) and lazy
    assert names_json(names)[0] is text
    assert names_json(("\ud800",))[1] is False  # a lone surrogate: every tool made at once


def test_a_lazy_tools_object_is_the_frozen_declared_object_once_its_shape_is_asked() -> None:
    tools = [Tool(n, _f) for n in ("b", "a", "c")]
    program = """
    const f = tools.a;                        // made on read, before the shape is asked
    const keys = Object.keys(tools);          // the whole shape: every tool made, frozen
    return [keys, f === tools.a, Object.isFrozen(tools), Reflect.ownKeys(tools).length,
            Object.getOwnPropertyDescriptor(tools, "b").enumerable, tools.nope === tools.nope,
            Reflect.set(tools, "d", 1), Reflect.defineProperty(tools, "d", { value: 1 })];
    """
    r = run_code(program, tools, runtime=QuickJSRuntime(), description="t")
    assert r.ok, r.error
    assert r.result == [["a", "b", "c"], True, True, 3, True, False, False, False]


def test_a_worker_reads_thousands_of_names_from_one_long_frame() -> None:
    # Past the pipe's default buffer and the worker's one read: the names' text in one frame, whole.
    names = [f"tool_with_a_rather_long_name_{i:05d}" for i in range(6000)]
    tools = [Tool(n, _f) for n in names]
    program = "return [Object.keys(tools).length, Object.keys(tools)[5999], await tools.tool_with_a_rather_long_name_00007({k: 1})];"
    r = run_code(program, tools, runtime=WORKER, description="t")
    assert r.ok, r.error
    assert r.result == [6000, names[-1], {"k": 1}]


def test_the_kept_term_scores_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from nous_sched.sdk import _tool_search

    monkeypatch.setattr(_tool_search, "KEPT_POSTINGS", 5)
    index = _tool_search.WordIndex([(["alpha", f"w{i}"], [], ["common"]) for i in range(4)])
    fresh = _tool_search.WordIndex([(["alpha", f"w{i}"], [], ["common"]) for i in range(4)])
    for term in ("alpha", "common", "w1", "w2", "alpha"):
        assert index.rank([term, "w3"], 4) == fresh.rank([term, "w3"], 4)
        assert index._kept <= 5 and sum(map(len, index._terms.values())) == index._kept


@pytest.mark.parametrize("runtime", [QuickJSRuntime(), WORKER], ids=["in_process", "worker"])
def test_a_program_reading_many_names_sees_the_same_tools(runtime: Any) -> None:
    # Past the prelude's 32 scans of the names' text it reads them from one table: the same answers.
    declared = ["__proto__", "constructor", "then", "toString", 'q"u', *(f"t{i}" for i in range(40))]
    tools = [Tool(n, _f) for n in declared]
    program = """
    const names = %s, others = %s, out = [];
    for (let round = 0; round < 2; round++) {
      for (const n of names) out.push(typeof tools[n] === "function" && tools[n] === tools[n]);
      for (const n of others) out.push([typeof tools[n], tools[n] === tools[n]]);
    }
    out.push(Object.keys(tools).length);
    return out;
    """ % (json.dumps(declared), json.dumps([f"u{i}" for i in range(40)] + ["valueOf"]))
    r = run_code(program, tools, runtime=runtime, description="t")
    assert r.ok, r.error
    # An undeclared name: a fresh function each read; a protocol name (valueOf) reads as absent.
    expected = [True] * len(declared) + [["function", False]] * 40 + [["undefined", True]]
    assert r.result == expected + expected + [len(declared)]

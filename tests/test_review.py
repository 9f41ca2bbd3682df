"""Program review (issue 41): ``summarize``, a program's static summary, and
``run_code(review=...)``, asked before anything of the run starts, failing closed.

The summary table holds programs (loops, ``Promise.all``, computed tool
names, dynamic arguments, aliases, comments and strings holding ``tools.x``)
with the summary each must give; the review tests run real programs through
the real doors (the worker pool, the in-process runtime, ``start_run``, the
durable store) with reviewers that allow, deny, ask, raise, hang and answer
nonsense.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_sched import (
    CodeRuntime,
    ConfigError,
    Dynamic,
    PermissionPolicy,
    ProgramSummary,
    QuickJSRuntime,
    ReviewDecision,
    ReviewRequest,
    RunOptions,
    SessionLog,
    SqliteApprovalStore,
    Tool,
    WorkerPool,
    arun_code,
    resume,
    run_code,
    run_code_tool,
    start_run,
    summarize,
)
from nous_sched.events import ReviewEvent
from nous_sched.gate import approval_text
from nous_sched.review import _summary

WAIT = 60


def _tools(calls=None):
    def record(name):
        def function(args):
            if calls is not None:
                calls.append((name, args))
            return [1, 2] if name == "list_rows" else {"ok": name, "args": args}

        return function

    return [
        Tool("list_rows", record("list_rows")),
        Tool("delete_rows", record("delete_rows"), requires_approval=True),
        Tool("lookup", record("lookup")),
        Tool("send", record("send")),
    ]


TOOLS = _tools()


def sites(summary):
    """Each call site as (tool, in_loop, in_parallel, called, arguments)."""
    return [(s.tool, s.in_loop, s.in_parallel, s.called, s.arguments) for s in summary.calls]


# -- the summary table ---------------------------------------------------------------------------

D = Dynamic

#: (id, program, expected call sites, expected dynamic: whether it may call any tool)
TABLE = [
    ("no_calls", "return 1 + 1", [], False),
    (
        "literal_arguments",
        'await tools.lookup({city: "Oslo", n: 3, f: -1.5, ok: true, none: null, tags: ["a", `b`], o: {k: 0x10}});',
        [
            (
                "lookup",
                False,
                False,
                True,
                {"city": "Oslo", "n": 3, "f": -1.5, "ok": True, "none": None, "tags": ["a", "b"], "o": {"k": 16}},
            )
        ],
        False,
    ),
    (
        "dynamic_arguments",
        "const id = 4; await tools.lookup({id, name: user.name, n: 1 + 1}); await tools.send(args); await tools.send();",
        [
            ("lookup", False, False, True, {"id": D("id"), "name": D("user.name"), "n": D("1 + 1")}),
            ("send", False, False, True, D("args")),
            ("send", False, False, True, None),
        ],
        False,
    ),
    (
        "spread_and_computed_keys_make_the_whole_argument_dynamic",
        "await tools.send({...base, a: 1}); await tools.send({[k]: 1}); await tools.send({f() {}});",
        [
            ("send", False, False, True, D("{...base, a: 1}")),
            ("send", False, False, True, D("{[k]: 1}")),
            ("send", False, False, True, D("{f() {}}")),
        ],
        False,
    ),
    (
        "template_with_a_substitution_is_dynamic",
        "await tools.send({to: `user-${id}`, escaped: 'a\\n\\u0041\\x42'});",
        [("send", False, False, True, {"to": D("`user-${id}`"), "escaped": "a\nAB"})],
        False,
    ),
    (
        "string_index_and_optional_chain",
        'await tools["delete_rows"]({t: 1}); await tools[`lookup`]({}); await tools?.send({});',
        [
            ("delete_rows", False, False, True, {"t": 1}),
            ("lookup", False, False, True, {}),
            ("send", False, False, True, {}),
        ],
        False,
    ),
    (
        "for_of_body_is_a_loop_its_iterable_is_not",
        "for (const r of await tools.list_rows({})) { await tools.delete_rows({id: r.id}); }",
        [("list_rows", False, False, True, {}), ("delete_rows", True, False, True, {"id": D("r.id")})],
        False,
    ),
    (
        "for_while_do_and_for_in",
        "for (let i = await tools.lookup({}); i < 3; i++) await tools.send({i});\n"
        "while (more) await tools.send({});\n"
        "do { await tools.send({}); } while (again);\n"
        "for (const k in obj) await tools.send({k});",
        [
            ("lookup", False, False, True, {}),
            ("send", True, False, True, {"i": D("i")}),
            ("send", True, False, True, {}),
            ("send", True, False, True, {}),
            ("send", True, False, True, {"k": D("k")}),
        ],
        False,
    ),
    (
        "callbacks_of_array_methods_are_loops",
        "rows.forEach(r => tools.send({r}));\nconst out = rows.filter(function (r) { return tools.lookup({r}); });",
        [("send", True, False, True, {"r": D("r")}), ("lookup", True, False, True, {"r": D("r")})],
        False,
    ),
    (
        "promise_all_is_parallel_and_its_map_a_loop",
        "await Promise.all([tools.lookup({a: 1}), tools.lookup({a: 2})]);\n"
        "await Promise.allSettled(ids.map(id => tools.delete_rows({id})));\n"
        "await Promise.race([tools.send({})]);",
        [
            ("lookup", False, True, True, {"a": 1}),
            ("lookup", False, True, True, {"a": 2}),
            ("delete_rows", True, True, True, {"id": D("id")}),
            ("send", False, True, True, {}),
        ],
        False,
    ),
    (
        "a_named_function_called_in_a_loop_runs_its_calls_in_a_loop",
        "async function drop(id) { return tools.delete_rows({id}); }\n"
        "const look = async (x) => tools.lookup({x});\n"
        "for (const id of ids) await drop(id);\n"
        "await look(1);",
        [("delete_rows", True, False, True, {"id": D("id")}), ("lookup", False, False, True, {"x": D("x")})],
        False,
    ),
    (
        "a_function_passed_to_map_or_recursive",
        "async function one(x) { return tools.send({x}); }\n"
        "await Promise.all(items.map(one));\n"
        "async function walk(n) { await tools.lookup({n}); if (n) await walk(n - 1); }",
        [("send", True, True, True, {"x": D("x")}), ("lookup", True, False, True, {"n": D("n")})],
        False,
    ),
    (
        "comments_and_strings_holding_tools_x_are_not_calls",
        '// await tools.delete_rows({all: true})\n/* tools.send({}) */\nconst s = "tools.delete_rows({})";\n'
        "const t = `tools.send()`;\nreturn s + t;",
        [],
        False,
    ),
    (
        "a_referenced_tool_may_run_any_number_of_times",
        "const drop = tools.delete_rows;\nawait drop({id: 1});",
        [("delete_rows", False, False, False, D("(referenced, not called here)"))],
        False,
    ),
    ("computed_tool_name_is_dynamic", "const n = 'delete_rows'; await tools[n]({});", [], True),
    ("the_tools_object_aliased_is_dynamic", "const t = tools; await t.delete_rows({});", [], True),
    ("the_tools_object_passed_on_is_dynamic", "await run(tools);", [], True),
    ("the_tools_object_destructured_is_dynamic", "const {delete_rows} = tools; await delete_rows({});", [], True),
    ("global_this_is_dynamic", "await globalThis.tools.delete_rows({});", [], True),
    ("eval_is_dynamic", "await eval('tools.delete_rows({})');", [], True),
    ("function_constructor_is_dynamic", "await [].map.constructor('return tools')().send({});", [], True),
    ("this_outside_a_class_is_dynamic", "function f() { return this.tools; }", [], True),
    ("a_call_of_a_computed_member_is_dynamic", "const F = x[a][b]('return 1');", [], True),
    (
        "this_inside_a_class_is_not",
        "class A { m() { return this.x; } }\nawait tools.send({});",
        [("send", False, False, True, {})],
        False,
    ),
    (
        "typescript_types_are_not_read",
        "```ts\nconst rows: Array<{id: number}> = await tools.list_rows({}) as any;\ntype T = typeof tools;\n"
        "interface I { tools: string }\nreturn rows!.length;\n```",
        [("list_rows", False, False, True, {})],
        False,
    ),
]


@pytest.mark.parametrize("program, expected, dynamic", [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_the_summary_of_each_program_in_the_table(program, expected, dynamic):
    summary = summarize(program, TOOLS)
    assert isinstance(summary, ProgramSummary)
    assert summary.error is None and summary.complete
    assert sites(summary) == expected
    assert summary.is_dynamic is dynamic, summary.dynamic
    json.dumps(summary.as_dict())  # JSON-shaped


def test_a_dynamic_reason_says_where():
    summary = summarize("const x = 1;\nawait tools[name]({});", TOOLS)
    assert summary.dynamic == ("a computed tool name (`tools[...]`) at 2:7",)
    assert "may call any granted tool" in "\n".join(summary.describe())


def test_positions_are_the_models_own_lines_and_columns():
    summary = summarize("```js\n\nconst a = 1;   await tools.send({});\n```", TOOLS)
    (site,) = summary.calls
    assert (site.line, site.column) == (3, 22)


def test_unknown_denied_and_gated_names():
    policy = PermissionPolicy(deny={"send"}, require_approval={"lookup"})
    summary = summarize(
        "await tools.nope({}); await tools.send({}); await tools.lookup({}); await tools.list_rows({});",
        TOOLS,
        policy=policy,
    )
    assert summary.unknown == ("nope",)
    assert summary.denied == ("send",)
    assert summary.gated == ("lookup",)  # the policy's names; delete_rows needs approval but is not named
    assert summary.reaches_gated
    assert [s.known for s in summary.calls] == [False, True, True, True]


def test_a_dynamic_program_reaches_any_gated_tool_and_a_plain_one_only_those_it_names():
    assert summarize("await tools[n]({})", TOOLS).reaches_gated
    assert not summarize("await tools.lookup({})", TOOLS).reaches_gated
    assert not summarize("await tools[n]({})", [Tool("lookup", lambda a: a)]).reaches_gated


def test_calls_to_counts_the_sites_of_a_tool_in_a_loop_or_not():
    summary = summarize(
        "await tools.delete_rows({id: 0});\nfor (const id of ids) await tools.delete_rows({id});\n"
        "await Promise.all([tools.lookup({}), tools.lookup({})]);",
        TOOLS,
    )
    deletes = summary.calls_to("delete_rows")
    assert (deletes.sites, deletes.in_loop, deletes.in_parallel, deletes.bounded) == (2, 1, 0, False)
    assert deletes.at_most is None
    lookups = summary.calls_to("lookup")
    assert (lookups.sites, lookups.in_loop, lookups.in_parallel, lookups.bounded, lookups.at_most) == (2, 0, 2, True, 2)
    assert summary.calls_to("send").sites == 0 and summary.calls_to("send").at_most == 0
    assert summarize("await tools[n]({})", TOOLS).calls_to("send").at_most is None  # dynamic: any tool
    assert "Calls delete_rows: 2 sites, 1 in a loop (needs approval)" in summary.describe()


def test_the_size_is_bytes_of_utf8_and_lines():
    summary = summarize("return 'é';\n// two\n", TOOLS)
    assert (summary.bytes, summary.lines) == (len("return 'é';\n// two\n".encode()), 3)


@pytest.mark.parametrize(
    "program, says",
    [
        ("await tools.send({);", "SyntaxError: the program does not parse"),
        ("for (;;", "SyntaxError"),
        ("enum Color { Red }", "SyntaxError: TypeScript that cannot run"),
        ("", None),
    ],
)
def test_a_syntax_error_is_a_summary_that_says_so_never_an_exception(program, says):
    summary = summarize(program, TOOLS)
    if says is None:
        assert summary.error is None and summary.calls == ()
    else:
        assert summary.error.startswith(says) and not summary.complete
        assert summary.is_dynamic  # not read: it may call anything


def test_a_bad_code_or_tools_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match="summarize.*code"):
        summarize(b"return 1", TOOLS)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="summarize.*tools"):
        summarize("return 1", ["send"])  # type: ignore[list-item]


@pytest.mark.parametrize(
    "program, bound",
    [
        ("(" * 50_000 + "1" + ")" * 50_000, "nests deeper"),
        ("x = " + "[" * 20_000 + "]" * 20_000, "nests deeper"),
        ("a;" * (_summary.MAX_NODES // 2), "syntax nodes"),
        ("await tools.send({});\n" * (_summary.MAX_SITES + 5), "places"),
        ("x" * (_summary.MAX_BYTES + 1), "bytes"),
    ],
    ids=["deep_parentheses", "deep_arrays", "many_nodes", "many_sites", "huge"],
)
def test_hostile_sizes_are_summarized_to_a_bound_and_made_dynamic(program, bound):
    started = time.perf_counter()
    summary = summarize(program, TOOLS)
    assert bound in summary.error and not summary.complete and summary.is_dynamic
    assert len(summary.calls) <= _summary.MAX_SITES + 1
    assert len(summary.dynamic) <= 33
    # Generous on a loaded 2-core box: the bound is what keeps it from minutes.
    assert time.perf_counter() - started < 30


def test_a_deep_literal_argument_is_dynamic_past_its_depth():
    summary = summarize("await tools.send(" + "{a: " * 40 + "1" + "}" * 40 + ");", TOOLS)
    value = summary.calls[0].arguments
    for _ in range(17):
        value = value["a"]
    assert isinstance(value, Dynamic)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_any_text_gives_a_summary(text):
    summary = summarize(text, TOOLS)
    assert isinstance(summary, ProgramSummary)
    json.dumps(summary.as_dict())
    for line in approval_text.program_lines(summary):
        assert line.isprintable() or "\\" in line


_NAMES = st.sampled_from(["list_rows", "delete_rows", "lookup", "send"])
_SHAPES = st.sampled_from(["plain", "loop", "parallel", "map"])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(_NAMES, _SHAPES, st.integers(-5, 5)), max_size=8))
def test_a_program_made_of_calls_is_summarized_as_made(calls):
    lines = []
    for name, shape, n in calls:
        call = f"tools.{name}({{n: {n}}})"
        lines.append(
            {
                "plain": f"await {call};",
                "loop": f"for (const x of xs) {{ await {call}; }}",
                "parallel": f"await Promise.all([{call}]);",
                "map": f"await xs.map(async x => {call});",
            }[shape]
        )
    summary = summarize("\n".join(lines), TOOLS)
    expected = [(name, shape in ("loop", "map"), shape == "parallel", True, {"n": n}) for name, shape, n in calls]
    assert sites(summary) == expected
    assert not summary.is_dynamic


# -- the review --------------------------------------------------------------------------------------


class Counting(CodeRuntime):
    """A real runtime that counts the programs it was handed (``begin`` or ``run``)."""

    language = "javascript"

    def __init__(self, inner):
        self.inner = inner
        self.started = 0

    def begin(self, program, names, limits, cancel=None):
        self.started += 1
        return self.inner.begin(program, names, limits, cancel)

    def run(self, program, host, limits):
        self.started += 1
        return self.inner.run(program, host, limits)


@pytest.fixture(scope="module")
def pool():
    pool = WorkerPool(size=1, spares=0)
    yield pool
    pool.close()


DELETES = "for (const r of await tools.list_rows({})) await tools.delete_rows({id: r});\nreturn 'done';"


def test_a_deny_returns_its_reason_to_the_model_and_runs_nothing(pool):
    calls, log, runtime = [], SessionLog(), Counting(pool)
    seen = []

    def reviewer(request):
        seen.append(request)
        return ReviewDecision.deny("no deletes in a loop, please")

    result = run_code(DELETES, _tools(calls), description="clean up", review=reviewer, session_log=log, runtime=runtime)
    assert result.error.kind == "review_denied"
    assert "no deletes in a loop, please" in result.error.message
    assert result.for_model()["error"]["message"] == result.error.message  # the model reads the reason
    assert runtime.started == 0 and calls == []  # no worker, no tool
    assert result.events == () and result.refused == () and result.trail == ()  # no audit call record
    assert [e.type for e in log.events] == ["review"]  # one review record
    assert [e.type for e in result.audit] == ["review"]
    record = log.events[0].data
    assert record["verdict"] == "deny" and record["reason"] == "no deletes in a loop, please"
    assert record["summary"]["calls"][1]["tool"] == "delete_rows" and record["summary"]["calls"][1]["in_loop"]
    (request,) = seen
    assert isinstance(request, ReviewRequest)
    assert request.code == DELETES and request.description == "clean up"
    assert request.summary.calls_to("delete_rows").in_loop == 1


def test_an_allowed_program_runs_and_its_audit_starts_with_the_review(pool):
    calls, log = [], SessionLog()
    result = run_code(
        DELETES,
        _tools(calls),
        description="d",
        review=lambda r: ReviewDecision.allow("looks fine"),
        session_log=log,
        runtime=pool,
        approval_handler=lambda r: True,
    )
    assert result.ok and result.result == "done"
    assert result.audit[0].type == "review" and result.audit[0].data["reason"] == "looks fine"
    assert log.events[0].type == "review" and [e.type for e in log.events].count("review") == 1
    assert [name for name, _ in calls] == ["list_rows", "delete_rows", "delete_rows"]


class _Hang:
    def __init__(self):
        self.release = threading.Event()
        self.entered = threading.Event()

    def __call__(self, request):
        self.entered.set()
        self.release.wait(WAIT)
        return ReviewDecision.allow()


@pytest.mark.parametrize(
    "reviewer, says",
    [
        (lambda r: 1 / 0, "the reviewer raised ZeroDivisionError: division by zero"),
        (lambda r: True, "the reviewer answered a bool, not a nous_sched.ReviewDecision"),
        (lambda r: None, "the reviewer answered a NoneType"),
        (lambda r: "allow", "the reviewer answered a str"),
        (lambda r: ReviewDecision.deny(""), "denied by the reviewer"),
        (lambda r: ReviewDecision.ask(), "the run has no approval handler to ask"),
    ],
    ids=["raises", "bool", "none", "string", "empty_deny", "ask_without_a_handler"],
)
def test_a_failing_or_malformed_reviewer_denies_saying_which(reviewer, says):
    calls, runtime = [], Counting(QuickJSRuntime())
    result = run_code(DELETES, _tools(calls), description="d", review=reviewer, runtime=runtime)
    assert result.error.kind == "review_denied" and says in result.error.message
    assert runtime.started == 0 and calls == []
    assert [e.type for e in result.audit] == ["review"]


def test_a_reviewer_that_hangs_denies_at_the_runs_timeout_and_nothing_runs():
    hang, calls, runtime = _Hang(), [], Counting(QuickJSRuntime())
    try:
        started = time.monotonic()
        result = run_code(DELETES, _tools(calls), description="d", review=hang, runtime=runtime, timeout=1)
        took = time.monotonic() - started
    finally:
        hang.release.set()
    assert hang.entered.is_set()
    assert result.error.kind == "review_denied"
    assert "the reviewer did not answer within 1 s (the run's timeout)" in result.error.message
    assert 0.9 <= took < WAIT and runtime.started == 0 and calls == []


def test_a_run_cancelled_while_its_reviewer_thinks_is_denied():
    hang, cancel = _Hang(), threading.Event()
    threading.Thread(target=lambda: (hang.entered.wait(WAIT), cancel.set()), daemon=True).start()
    try:
        result = run_code("return 1", TOOLS, description="d", review=hang, cancel=cancel, timeout=WAIT)
    finally:
        hang.release.set()
    assert result.error.kind == "review_denied" and "cancelled" in result.error.message


def test_ask_puts_the_whole_program_and_its_summary_to_the_approval_handler_as_one_question():
    asked = []

    def handler(request):
        asked.append(request)
        return request.tool == "" or request.tool == "delete_rows"

    calls = []
    result = run_code(
        DELETES,
        _tools(calls),
        description="drop them",
        review=lambda r: ReviewDecision.ask(),
        approval_handler=handler,
        runtime=QuickJSRuntime(),
    )
    assert result.ok, result.error
    program, *per_call = asked
    assert program.tool == "" and program.code == DELETES and program.program.calls_to("delete_rows").in_loop == 1
    question = program.question()
    assert question.startswith("A program asks to run.")
    assert "Calls delete_rows: 1 site, 1 in a loop (needs approval)" in question
    assert 'delete_rows({"id": <r>}) in a loop' in question  # each site, its literal arguments, <unknowns>
    assert "  | for (const r of await tools.list_rows({}))" in question
    assert "drop them" in question
    # Each call's own question says what the program as a whole does.
    assert per_call and all(r.tool == "delete_rows" for r in per_call)
    assert "Calls delete_rows: 1 site, 1 in a loop" in per_call[0].question()
    assert result.audit[0].data["asked"] is True and result.audit[0].data["verdict"] == "allow"


@pytest.mark.parametrize("answer", [False, None, "yes"])
def test_ask_answered_anything_but_true_denies(answer):
    calls = []
    result = run_code(
        DELETES,
        _tools(calls),
        description="d",
        review=lambda r: ReviewDecision.ask(),
        approval_handler=lambda r: answer,
        runtime=QuickJSRuntime(),
    )
    assert result.error.kind == "review_denied" and "rejected by the approval handler" in result.error.message
    assert calls == []


def test_ask_with_a_handler_that_raises_denies():
    def handler(request):
        raise RuntimeError("the desk is closed")

    result = run_code(
        "return 1", TOOLS, description="d", review=lambda r: ReviewDecision.ask(), approval_handler=handler
    )
    assert result.error.kind == "review_denied" and "RuntimeError: the desk is closed" in result.error.message


def test_the_review_runs_on_its_own_named_thread_never_the_runs():
    names = []

    def reviewer(request):
        names.append(threading.current_thread().name)
        return ReviewDecision.allow()

    assert run_code("return 1", TOOLS, description="d", review=reviewer, runtime=QuickJSRuntime()).ok
    assert names[0].startswith("nous-sched-review-")


def test_start_run_tells_the_review_first_and_a_deny_ends_the_run():
    run = start_run(DELETES, TOOLS, description="d", review=lambda r: ReviewDecision.deny("not today"))
    events = list(run.events())
    result = run.result(timeout=WAIT)
    assert [e.kind for e in events] == ["review", "end"]
    assert events[0].data["verdict"] == "deny" and events[0].data["reason"] == "not today"
    assert events[0].data["summary"]["calls"][1]["tool"] == "delete_rows"
    assert events[1].data["error"]["kind"] == "review_denied"
    assert result.error.kind == "review_denied"
    json.loads(events[0].to_json())


def test_start_run_allowed_tells_the_review_before_any_call():
    run = start_run(
        "return await tools.lookup({a: 1})", TOOLS, description="d", review=lambda r: ReviewDecision.allow()
    )
    kinds = [e.kind for e in run.events()]
    assert kinds[0] == "review" and "call" in kinds and kinds[-1] == "end"
    assert run.result(timeout=WAIT).ok


def test_every_door_takes_review_through_options():
    options = RunOptions(description="d", review=lambda r: ReviewDecision.deny("by options"))
    assert "by options" in run_code("return 1", TOOLS, options=options).error.message
    assert "by options" in asyncio.run(arun_code("return 1", TOOLS, options=options)).error.message
    tool = run_code_tool(TOOLS, review=lambda r: ReviewDecision.deny("by the tool"))
    answer = tool.function({"code": "return 1", "description": "d"})
    assert "by the tool" in json.dumps(answer)


def test_a_durable_run_is_reviewed_once_before_it_starts_never_on_resume(tmp_path):
    store = SqliteApprovalStore(str(tmp_path / "review.db"))
    reviewed = []

    def reviewer(request):
        reviewed.append(request.code)
        return ReviewDecision.allow()

    program = "await tools.delete_rows({id: 1}); return 'deleted';"
    first = run_code(program, TOOLS, description="d", review=reviewer, approval_store=store)
    assert first.suspended is not None and [e.type for e in first.audit] == ["review", "suspended"]
    done = resume(first.suspended.token, {0: True}, TOOLS, approval_store=store, review=reviewer)
    assert done.ok and done.result == "deleted"
    assert reviewed == [program]


def test_a_durable_run_denied_by_its_review_saves_nothing(tmp_path):
    store = SqliteApprovalStore(str(tmp_path / "deny.db"))
    calls = []
    result = run_code(
        "await tools.delete_rows({id: 1});",
        _tools(calls),
        description="d",
        review=lambda r: ReviewDecision.deny("no"),
        approval_store=store,
    )
    assert result.error.kind == "review_denied" and result.suspended is None and calls == []


def test_a_review_record_is_a_review_event():
    record = ReviewEvent("allow", "ok", False, {"calls": []})
    assert record.as_event().type == "review" and record.kind == "review"


def test_a_review_decision_checks_its_verdict():
    with pytest.raises(ConfigError):
        ReviewDecision("maybe")
    assert ReviewDecision.allow().verdict == "allow" and ReviewDecision.ask().verdict == "ask"
    assert ReviewDecision.deny("why") == ReviewDecision("deny", "why")


def test_a_bad_review_option_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match="run_code.*review"):
        run_code("return 1", TOOLS, description="d", review="strict")


# -- the command line and serve-mcp -------------------------------------------------------------------

REVIEWERS = """
from nous_sched import ReviewDecision, Tool

TOOLS = [Tool("echo", lambda args: args)]
NOT_CALLABLE = 3


def deny(request):
    return ReviewDecision.deny(f"no: {request.summary.calls_to('echo').sites} echo")


def allow(request):
    return ReviewDecision.allow()
"""


@pytest.fixture
def reviewers(tmp_path):
    module = tmp_path / "reviewers.py"
    module.write_text(REVIEWERS)
    program = tmp_path / "p.js"
    program.write_text("return await tools.echo({a: 1});\n")
    return str(module), str(program)


def test_the_cli_run_takes_review_module_callable(reviewers, capsys):
    from nous_sched.cli import main

    module, program = reviewers
    assert main(["run", program, "--tools", module, "--review", f"{module}:deny", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["error"]["kind"] == "review_denied" and "no: 1 echo" in out["error"]["message"]
    assert out["events"] == []
    assert main(["run", program, "--tools", module, "--review", f"{module}:allow", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["result"] == {"a": 1}


@pytest.mark.parametrize(
    "spec, says",
    [
        ("{module}", "expected MODULE:CALLABLE"),
        ("{module}:nope", "the module has no 'nope'"),
        ("{module}:NOT_CALLABLE", "'NOT_CALLABLE' is a int, not a callable"),
        ("no_such_module_here:deny", "--review no_such_module_here: no module named"),
    ],
)
def test_a_bad_review_spec_is_a_usage_error_naming_the_flag(reviewers, capsys, spec, says):
    from nous_sched.cli import main

    module, program = reviewers
    spec = spec.format(module=module)
    assert main(["run", program, "--tools", module, "--review", spec]) == 2
    assert says in capsys.readouterr().err
    assert main(["serve-mcp", "--tools", module, "--review", spec]) == 2
    assert says in capsys.readouterr().err


def test_serve_mcp_reviews_each_program_before_it_runs(tmp_path):
    pytest.importorskip("mcp")
    import anyio
    from mcp import Client

    from nous_sched.mcp import CodeModeServer

    calls = []
    audit = tmp_path / "audit.jsonl"
    server = CodeModeServer(
        _tools(calls), review=lambda r: ReviewDecision.deny(f"{len(r.summary.calls)} sites: no"), audit_log=str(audit)
    )

    logs = []

    async def on_log(params):
        logs.append(params.data)

    async def go():
        with anyio.fail_after(WAIT):
            async with Client(server.server, mode="legacy", logging_callback=on_log) as client:
                return await client.call_tool("run_code", {"code": DELETES, "description": "test"})

    try:
        result = anyio.run(go)
    finally:
        server.close()
    assert "program review: deny: 2 sites: no" in [str(line) for line in logs]  # the live review, forwarded
    assert result.structured_content["error"]["kind"] == "review_denied"
    assert "2 sites: no" in result.structured_content["error"]["message"]
    assert calls == []
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    reviews = [line for line in lines if line["event"] == "review"]
    assert len(reviews) == 1 and reviews[0]["verdict"] == "deny" and reviews[0]["reason"] == "2 sites: no"
    assert reviews[0]["summary"]["calls"][1]["tool"] == "delete_rows"
    assert not any(line["event"] in ("tool_call", "tool_outcome") for line in lines)


# -- ask, with a durable store: the run suspends before it starts --------------------------------------


def test_ask_with_a_store_and_no_handler_suspends_before_the_program_starts(tmp_path):
    from nous_sched import TokenError

    store = SqliteApprovalStore(str(tmp_path / "ask.db"))
    calls, log, runtime = [], SessionLog(), Counting(QuickJSRuntime())
    options = {"description": "drop them", "review": lambda r: ReviewDecision.ask(), "approval_store": store}
    first = run_code(DELETES, _tools(calls), session_log=log, runtime=runtime, **options)
    assert runtime.started == 0 and calls == []  # nothing of the program ran
    (pending,) = first.suspended.pending
    assert (pending.seq, pending.tool, pending.code) == (-1, "", DELETES)
    assert pending.program.calls_to("delete_rows").in_loop == 1
    question = pending.question()
    assert question.startswith("A program asks to run.") and "delete_rows" in question and "| for (const r" in question
    assert [e.type for e in first.audit] == ["review", "suspended"] == [e.type for e in log.events]
    assert first.audit[0].data["verdict"] == "ask" and first.audit[0].data["asked"] is True
    assert first.for_model()["suspended"]["pending"][0]["seq"] == -1
    (row,) = store.suspensions()
    assert row["pending"][0]["code"] == DELETES

    approve_all = {"approval_handler": lambda r: True, "runtime": QuickJSRuntime()}
    done = resume(first.suspended.token, {-1: True}, _tools(calls), approval_store=store, **approve_all)
    assert done.ok and done.result == "done" and [n for n, _ in calls] == ["list_rows", "delete_rows", "delete_rows"]
    review = [e for e in done.audit if e.type == "review"]
    assert len(review) == 1 and review[0].data["verdict"] == "allow" and review[0].data["asked"] is True
    with pytest.raises(TokenError):
        resume(first.suspended.token, {-1: True}, _tools(calls), approval_store=store)


def test_a_program_denied_in_the_store_ends_review_denied_and_runs_nothing(tmp_path):
    from nous_sched import ApprovalDecision, TokenError

    store = SqliteApprovalStore(str(tmp_path / "deny.db"))
    calls = []
    first = run_code(
        DELETES, _tools(calls), description="d", review=lambda r: ReviewDecision.ask(), approval_store=store
    )
    store.decide(first.suspended.token, -1, False, "not this week")
    denied = resume(first.suspended.token, {}, _tools(calls), approval_store=store)
    assert denied.error.kind == "review_denied" and "not this week" in denied.error.message
    assert calls == [] and denied.events == ()
    assert [(e.type, e.data["verdict"]) for e in denied.audit] == [("review", "deny")]
    with pytest.raises(TokenError):  # finished: a denied program is never run later
        resume(first.suspended.token, {-1: ApprovalDecision(True)}, _tools(calls), approval_store=store)


def test_a_handler_that_defers_the_programs_question_suspends_it(tmp_path):
    from nous_sched import DEFER

    store = SqliteApprovalStore(str(tmp_path / "defer.db"))
    asked = []

    def handler(request):
        asked.append(request.tool)
        return DEFER

    first = run_code(
        "return 1",
        TOOLS,
        description="d",
        review=lambda r: ReviewDecision.ask(),
        approval_handler=handler,
        approval_store=store,
    )
    assert asked == [""] and [p.seq for p in first.suspended.pending] == [-1]
    assert resume(first.suspended.token, {"-1": True}, TOOLS, approval_store=store).result == 1


def test_the_command_line_suspends_a_program_asked_about_and_resumes_it(reviewers, tmp_path, capsys):
    from nous_sched.cli import main

    module, program = reviewers
    with open(module, "a") as f:
        f.write("\n\ndef ask(request):\n    return ReviewDecision.ask()\n")
    store = str(tmp_path / "cli.db")
    assert main(["run", program, "--tools", module, "--review", f"{module}:ask", "--approval-store", store]) == 3
    out = capsys.readouterr().out
    assert "#-1 the program" in out and "A program asks to run." in out and "At 1:14: echo" in out
    token = out.split("token (expires", 1)[1].splitlines()[1].strip()
    assert main(["approvals", "approve", token, "-1", "--store", store]) == 0
    capsys.readouterr()
    assert main(["resume", token, "--approval-store", store, "--tools", module, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["result"] == {"a": 1}


# -- the other projections: OpenTelemetry, AG-UI, MCP log notifications -----------------------------


def test_a_denied_run_is_a_run_span_with_its_error_kind():
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from nous_sched.otel import traced_run_code

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        result = traced_run_code(
            DELETES,
            TOOLS,
            tracer=provider.get_tracer("test_review"),
            description="d",
            review=lambda r: ReviewDecision.deny("no"),
        )
    finally:
        provider.shutdown()
    assert result.error.kind == "review_denied"
    (span,) = exporter.get_finished_spans()  # the run's, and no call's
    assert span.attributes["error.type"] == "review_denied"


def test_agui_carries_the_review_as_its_custom_event_and_the_deny_as_the_runs_error():
    pytest.importorskip("ag_ui")
    from nous_sched import agui

    run = start_run(DELETES, TOOLS, description="d", review=lambda r: ReviewDecision.deny("no loops"))
    text = "".join(agui.sse(run))
    events = [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]
    custom = [e for e in events if e["type"] == "CUSTOM" and e["name"] == "nous_sched.review"]
    assert len(custom) == 1 and custom[0]["value"]["verdict"] == "deny"
    assert events[-1]["type"] == "RUN_ERROR" and events[-1]["code"] == "review_denied"

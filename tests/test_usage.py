"""The usage ledger (RunResult.usage), the same numbers in events and OTel spans,
and sdk.describe's observed shapes of results from tools with no output schema."""

from __future__ import annotations

import importlib
import json

import pytest

from nous_sched import CallUsage, Tool, ToolError, Usage, run_code, run_code_tool, start_run

WAIT = 60


def _ascii_json(value):
    return json.dumps(value, separators=(",", ":"))


def _fail():
    raise ToolError("nope", "fail")


def _rows(n):
    return [{"id": i, "name": f"row {i}"} for i in range(n)]


TOOLS = [
    Tool(name="rows", function=lambda a: _rows(a["n"]), description="rows"),
    Tool(name="fail", function=lambda a: _fail(), description="fails"),
]


def test_the_ledger_counts_what_each_sub_call_returned_to_the_program(runtime):
    result = run_code(
        "const a = await tools.rows({n: 3}); const b = await tools.rows({n: 50});"
        "let e; try { await tools.fail({}) } catch (x) { e = x.message }"
        "try { await tools.nope({}) } catch (x) {}"
        "return a.length + b.length",
        TOOLS,
        description="test",
    )
    assert result.result == 53
    calls = result.usage.calls
    assert [(c.seq, c.tool, c.ok) for c in calls] == [
        (0, "rows", True),
        (1, "rows", True),
        (2, "fail", False),
        (None, "nope", False),
    ]
    assert calls[0].chars == len(_ascii_json(_rows(3)))
    assert calls[1].chars == len(_ascii_json(_rows(50)))
    assert calls[2].chars == len(_ascii_json({"tool": "fail", "message": "nope"}))
    assert result.usage.received_chars == sum(c.chars for c in calls)
    # Without a budget the model gets the whole answer: nothing cut.
    answer = json.dumps(result.to_dict(), ensure_ascii=False)
    assert result.usage.answer_bytes == result.usage.model_bytes == len(answer.encode("utf-8"))
    assert result.usage.cut_bytes == 0


def test_sdk_questions_are_not_sub_calls_in_the_ledger():
    result = run_code('await sdk.describe("rows"); return await tools.rows({n: 1})', TOOLS, description="test")
    assert [c.tool for c in result.usage.calls] == ["rows"]


def test_the_ledger_says_what_the_model_got_and_what_the_budget_cut():
    result = run_code("return await tools.rows({n: 2000})", TOOLS, output_budget=1000, description="test")
    full = len(json.dumps(result.to_dict(), ensure_ascii=False).encode("utf-8"))
    model = len(json.dumps(result.for_model(), ensure_ascii=False).encode("utf-8"))
    assert result.usage.answer_bytes == full
    assert result.usage.model_bytes == model <= 1000
    assert result.usage.cut_bytes == full - model > 0
    as_dict = result.usage.as_dict()
    assert (
        as_dict["cut_bytes"] == result.usage.cut_bytes and as_dict["calls"][0]["chars"] == result.usage.calls[0].chars
    )


def test_the_same_numbers_in_the_events(runtime):
    run = start_run(
        "const xs = await Promise.all([tools.rows({n: 1}), tools.rows({n: 7}), tools.fail({})].map(p => p.catch(e => e.message)));"
        "return 'x'.repeat(5000)",
        TOOLS,
        output_budget=500,
        description="test",
    )
    events = list(run.events())
    result = run.result(timeout=WAIT)
    commits = {e.seq: e.data["chars"] for e in events if e.kind == "commit"}
    assert commits == {c.seq: c.chars for c in result.usage.calls}
    end = events[-1]
    assert end.kind == "end"
    assert end.data["usage"] == result.usage.as_dict()
    assert end.data["usage"]["cut_bytes"] > 0


def test_the_same_numbers_in_the_otel_run_span():
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    otel = importlib.import_module("nous_sched.otel")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        result = otel.traced_run_code(
            "await tools.rows({n: 4}); return await tools.rows({n: 300})",
            TOOLS,
            tracer=provider.get_tracer("test_usage"),
            output_budget=400,
            description="test",
        )
    finally:
        provider.shutdown()
    run_span = next(s for s in exporter.get_finished_spans() if s.name == otel.RUN_SPAN)
    attrs = run_span.attributes
    assert list(attrs[otel.ATTR_USAGE_CALLS]) == [c.chars for c in result.usage.calls]
    assert attrs[otel.ATTR_USAGE_RECEIVED] == result.usage.received_chars
    assert attrs[otel.ATTR_USAGE_ANSWER] == result.usage.answer_bytes
    assert attrs[otel.ATTR_USAGE_MODEL] == result.usage.model_bytes <= 400
    assert attrs[otel.ATTR_USAGE_CUT] == result.usage.cut_bytes > 0


def test_usage_values():
    usage = Usage(calls=(CallUsage(0, "a", 10, True), CallUsage(None, "b", 5, False)), answer_bytes=100, model_bytes=60)
    assert usage.received_chars == 15 and usage.cut_bytes == 40
    assert Usage().as_dict() == {
        "calls": [],
        "received_chars": 0,
        "answer_bytes": 0,
        "model_bytes": 0,
        "cut_bytes": 0,
        "hint_bytes": 0,
        "held_bytes": 0,
        "read_chars": 0,
    }


# -- sdk.describe: shapes observed this run ----------------------------------------------------------------


def _search(args):
    return {"hits": [{"id": 1, "title": "a", "score": 0.5}], "total": 1, "next": None}


def test_describe_shows_the_shape_of_results_already_received(runtime):
    tools = [Tool(name="search", function=_search, description="Search the docs.")]
    result = run_code(
        'const before = await sdk.describe("search"); await tools.search({});'
        'const after = await sdk.describe("search"); return [before, after]',
        tools,
        description="test",
    )
    before, after = result.result
    assert "look like" not in before  # nothing received yet
    assert after.startswith(before)
    assert "No output schema is declared" in after
    assert "{ hits: { id: number; title: string; score: number }[]; total: number; next: null }" in after


def test_describe_merges_shapes_of_several_results_optional_keys_and_unions():
    calls = iter([{"a": 1, "b": "x"}, {"a": "two"}, [1, "s"]])
    tools = [Tool(name="vary", function=lambda args: next(calls), description="varies")]
    result = run_code(
        'await tools.vary({}); await tools.vary({}); await tools.vary({}); return await sdk.describe("vary")',
        tools,
        description="test",
    )
    assert "(number | string)[] | { a: number | string; b?: string }" in result.result


def test_describe_adds_no_shape_for_a_tool_with_an_output_schema():
    schema = {"type": "object", "properties": {"total": {"type": "integer"}}}
    tools = [Tool(name="search", function=_search, description="s", returns=schema)]
    result = run_code('await tools.search({}); return await sdk.describe("search")', tools, description="test")
    assert "look like" not in result.result


def test_describe_shapes_through_the_agent_tool():
    tool = run_code_tool([Tool(name="search", function=_search, description="s")])
    out = tool.function({"code": 'await tools.search({}); return await sdk.describe("search")', "description": "shape"})
    value = out.value if hasattr(out, "value") else out
    assert "total: number" in value["result"]


def test_observed_shapes_belong_to_their_run():
    tools = [Tool(name="search", function=_search, description="s")]
    assert (
        "look like"
        in run_code('await tools.search({}); return await sdk.describe("search")', tools, description="test").result
    )
    assert "look like" not in run_code('return await sdk.describe("search")', tools, description="test").result


@pytest.mark.parametrize("durable", [False, True], ids=["plain", "durable"])
def test_a_refused_call_has_no_seq_and_a_call_that_ran_has_its_tickets(durable, tmp_path):
    # The host reads tool and seq of every pending call it handed out (a Ticket, or a refusal
    # settled at once, whose seq is None). A durable run keeps the same ledger: it used to pass on
    # only the calls its inner host started, so its refusal was missing (the ledger's promise is
    # every call the program received an answer to: see the parity tests below).
    from nous_sched import SqliteApprovalStore

    store = SqliteApprovalStore(str(tmp_path / "a.db")) if durable else None
    program = "await tools.ok({}); try { await tools.nope({}) } catch (e) {} await tools.ok({}); return 1"
    result = run_code(program, [Tool("ok", lambda a: 1)], description="test", approval_store=store)
    assert result.result == 1, result
    assert [(c.seq, c.tool, c.ok) for c in result.usage.calls] == [
        (0, "ok", True),
        (None, "nope", False),
        (1, "ok", True),
    ]


# -- a durable run keeps the same ledger as a plain run -----------------------------------

_LEDGER_PROGRAM = """
const a = await tools.ok({n: 1});
try { await tools.nope({}) } catch (e) {}
const paid = await tools.pay({amount: 5});
let denied = null;
try { await tools.pay({amount: 6}) } catch (e) { denied = e.message }
const b = await tools.ok({n: 2});
return {a, paid, b, denied};
"""


def _ledger_tools():
    return [
        Tool("ok", lambda a: {"n": a["n"], "pad": "x" * a["n"]}, description="ok"),
        Tool("pay", lambda a: {"paid": a["amount"]}, description="pay", requires_approval=True),
    ]


def _plain_approves_five(request):
    return request.arguments == {"amount": 5}


def _ledger_rows(result):
    """The ledger, the denial's size checked against the message the program got (a
    plain run's handler and a durable run's decision word their denials differently)."""
    rows = [c.as_dict() for c in result.usage.calls]
    denial = {"tool": "pay", "message": result.result["denied"]}
    assert rows[3]["chars"] == len(json.dumps(denial, separators=(",", ":"))), rows
    rows[3]["chars"] = "the denial's"
    return rows


def _plain_ledger():
    result = run_code(
        _LEDGER_PROGRAM, _ledger_tools(), approval_handler=_plain_approves_five, description="test", timeout=60
    )
    assert result.result["paid"] == {"paid": 5} and result.result["b"] == {"n": 2, "pad": "xx"}, result
    return _ledger_rows(result)


def test_the_plain_ledger_lists_every_call_the_program_received_an_answer_to():
    rows = _plain_ledger()
    assert [(r["seq"], r["tool"], r["ok"]) for r in rows] == [
        (0, "ok", True),
        (None, "nope", False),  # refused by the gate: never started
        (1, "pay", True),
        (2, "pay", False),  # denied approval: submitted, then refused by the approval handler
        (3, "ok", True),
    ]


def test_a_durable_run_whose_handler_decides_keeps_the_plain_ledger(tmp_path):
    from nous_sched import SqliteApprovalStore

    store = SqliteApprovalStore(str(tmp_path / "a.db"))
    result = run_code(
        _LEDGER_PROGRAM,
        _ledger_tools(),
        approval_handler=_plain_approves_five,
        approval_store=store,
        description="test",
        timeout=60,
    )
    assert result.result is not None and "denied approval" in result.result["denied"], result
    assert _ledger_rows(result) == _plain_ledger()


@pytest.mark.parametrize("park", [0, 120], ids=["replayed", "parked"])
def test_a_resumed_run_keeps_the_ledger_of_the_whole_program(tmp_path, park):
    # Suspended twice (one decision each); the resumed result's ledger is the whole program's,
    # replayed calls included, each once, as a plain run that decided the same gives.
    from nous_sched import SqliteApprovalStore, resume

    store = SqliteApprovalStore(str(tmp_path / "a.db"), park=park)
    tools = _ledger_tools()
    result = run_code(_LEDGER_PROGRAM, tools, approval_store=store, description="test", timeout=60)
    decisions = iter([True, False])
    while result.suspended is not None:
        (pending,) = result.suspended.pending
        result = resume(result.suspended.token, {pending.seq: next(decisions)}, tools, approval_store=store)
    assert result.result is not None and "denied approval" in result.result["denied"], result
    assert _ledger_rows(result) == _plain_ledger()


def test_a_replayed_result_is_observed_as_when_it_ran(tmp_path):
    # The shapes sdk.describe tells come from the results the run received: a replay
    # hands its inner host the replayed results too, so the program is told what it was
    # told before it suspended (it used to be told nothing of them after a resume).
    from nous_sched import SqliteApprovalStore, resume

    store = SqliteApprovalStore(str(tmp_path / "a.db"))
    tools = [*_ledger_tools(), Tool(name="search", function=_search, description="s")]
    program = 'await tools.search({}); const paid = await tools.pay({amount: 5}); return await sdk.describe("search")'
    suspended = run_code(program, tools, approval_store=store, description="test", timeout=60)
    (pending,) = suspended.suspended.pending
    done = resume(suspended.suspended.token, {pending.seq: True}, tools, approval_store=store)
    assert "look like" in done.result, done

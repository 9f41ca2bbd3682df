"""Every entry point makes OpenTelemetry spans once a tracer provider is configured, under the caller's span.

run_code, start_run, call_tool (run_code_tool and any other tool), the
adapters out (to_langchain, here) and serve-mcp: each makes a
``nous_sched.run_code`` span for a run, as a child of the span current where
it was called, and one ``execute_tool <name>`` span per nested call under it,
with the GenAI semantic conventions' attributes and the scheduling facts.
The frameworks' own agent spans above them: tests/test_code_mode.py.
"""

from __future__ import annotations

import anyio
import otel_global
import pytest
from mcp import Client
from otel_global import ancestors, named

from nous_sched import (
    PermissionPolicy,
    Tool,
    ToolCallEvent,
    _tracing,
    call_tool,
    run_code,
    run_code_tool,
    start_run,
)
from nous_sched.integrations import to_langchain
from nous_sched.mcp import CodeModeServer

WAIT = 30.0


@pytest.fixture
def global_spans():
    yield from otel_global.global_spans()


def _safe(args):
    return True


def _double(args):
    return args["x"] * 2


def _write(args):
    return {"wrote": args["x"]}


DOUBLE = Tool("double", _double, concurrency_safe=_safe)
WRITE = Tool("write", _write, requires_approval=True)  # exclusive, and it asks
TOOLS = [DOUBLE, WRITE]
PROGRAM = """
const d = await Promise.all([1, 2, 3].map((x) => tools.double({ x })));
const w = await tools.write({ x: 9 });
return { d, w };
"""
ANSWER = {"d": [2, 4, 6], "w": {"wrote": 9}}


def _approve(request):
    return True


def _tracer():
    from opentelemetry import trace

    return trace.get_tracer("test_traces")


def _check_run(spans, run_span, above):
    """``run_span`` sits under ``above`` (names, nearest first), and its nested calls under it."""
    assert ancestors(run_span, spans)[: len(above)] == above
    calls = sorted(
        (s for s in spans if s.parent is not None and s.parent.span_id == run_span.context.span_id),
        key=lambda s: s.attributes["nous_sched.seq"],
    )
    assert [s.name for s in calls] == ["execute_tool double"] * 3 + ["execute_tool write"]
    call_id = run_span.attributes["nous_sched.call_id"]
    for seq, span in enumerate(calls):
        a = span.attributes
        assert a["gen_ai.operation.name"] == "execute_tool"
        assert a["gen_ai.tool.name"] == span.name.split(" ", 1)[1]
        assert a["gen_ai.tool.call.id"] == f"{call_id}:code:{seq}"
        assert a["nous_sched.mode"] == ("parallel" if seq < 3 else "exclusive")
        assert a["nous_sched.waited"] >= 0
        assert a["nous_sched.outcome"] == "ok"
        assert span.context.trace_id == run_span.context.trace_id
    assert "nous_sched.approved" not in calls[0].attributes
    assert calls[3].attributes["nous_sched.approved"] is True  # the gated call asked, and was approved
    assert run_span.attributes["nous_sched.calls"] == 4
    return calls


def test_without_a_configured_provider_there_is_no_tracing():
    import opentelemetry.trace  # noqa: F401  (imported, but nothing configured)

    assert _tracing.active() is None
    result = run_code(PROGRAM, TOOLS, description="t", approval_handler=_approve, timeout=WAIT)
    assert result.ok and result.result == ANSWER


def test_run_code_spans_nest_under_the_callers_span(global_spans):
    with _tracer().start_as_current_span("agent"):
        result = run_code(PROGRAM, TOOLS, description="t", approval_handler=_approve, timeout=WAIT, call_id="r1")
    assert result.ok and result.result == ANSWER
    spans = global_spans.get_finished_spans()
    (run_span,) = named(spans, "nous_sched.run_code")
    assert run_span.attributes["nous_sched.call_id"] == "r1"
    calls = _check_run(spans, run_span, ["agent"])
    # The span ids are the audit's: the same ids the run's tool_call events carry.
    audit_ids = [e.id for e in result.events if isinstance(e, ToolCallEvent)]
    assert sorted(audit_ids) == sorted(s.attributes["gen_ai.tool.call.id"] for s in calls)


def test_start_run_spans_nest_under_the_span_current_where_it_started(global_spans):
    with _tracer().start_as_current_span("agent"):
        run = start_run(PROGRAM, TOOLS, description="t", approval_handler=_approve, timeout=WAIT)
    result = run.result()
    assert result.ok and result.result == ANSWER
    spans = global_spans.get_finished_spans()
    (run_span,) = named(spans, "nous_sched.run_code")
    _check_run(spans, run_span, ["agent"])


def test_call_tool_of_run_code_tool_is_a_tool_span_with_the_run_under_it(global_spans):
    tool = run_code_tool(TOOLS, approval_handler=_approve, timeout=WAIT)
    with _tracer().start_as_current_span("agent"):
        text = call_tool(tool, {"code": PROGRAM, "description": "t"}, call_id="model-call-7")
    assert '"wrote": 9' in text
    spans = global_spans.get_finished_spans()
    (outer,) = named(spans, "execute_tool run_code")
    assert outer.attributes["gen_ai.operation.name"] == "execute_tool"
    assert outer.attributes["gen_ai.tool.name"] == "run_code"
    assert outer.attributes["gen_ai.tool.call.id"] == "model-call-7"
    assert outer.attributes["nous_sched.outcome"] == "ok"
    assert ancestors(outer, spans) == ["agent"]
    (run_span,) = named(spans, "nous_sched.run_code")
    _check_run(spans, run_span, ["execute_tool run_code", "agent"])


def test_call_tool_of_any_tool_records_its_approval(global_spans):
    with _tracer().start_as_current_span("agent"):
        asked = call_tool(WRITE, {"x": 1}, approval_handler=lambda request: False, call_id="c1")
    assert "rejected" in asked
    (span,) = named(global_spans.get_finished_spans(), "execute_tool write")
    assert span.attributes["nous_sched.approved"] is False
    assert span.attributes["gen_ai.tool.call.id"] == "c1"
    from opentelemetry.trace import StatusCode

    assert span.status.status_code == StatusCode.ERROR  # the refusal is the call's failure


def test_an_adapter_out_nests_its_run_under_the_awaiting_task_span(global_spans):
    lc = to_langchain(run_code_tool(TOOLS, approval_handler=_approve, timeout=WAIT))

    async def go():
        with _tracer().start_as_current_span("agent"):
            return await lc.ainvoke({"code": PROGRAM, "description": "t"})

    assert '"wrote": 9' in anyio.run(go)
    spans = global_spans.get_finished_spans()
    (run_span,) = named(spans, "nous_sched.run_code")
    _check_run(spans, run_span, ["execute_tool run_code", "agent"])


def test_serve_mcp_runs_nest_under_the_clients_span_across_the_protocol(global_spans):
    # The MCP SDK carries the client's trace context in the request (_meta.traceparent) and
    # makes a server span for the call; the run's spans go under it.
    server = CodeModeServer(TOOLS, policy=PermissionPolicy(), approve=["write"], timeout=WAIT)

    async def go():
        with _tracer().start_as_current_span("agent"):
            async with Client(server.server) as client:
                return await client.call_tool("run_code", {"code": PROGRAM, "description": "t"})

    try:
        result = anyio.run(go)
    finally:
        server.close()
    assert result.structured_content["result"] == ANSWER
    spans = global_spans.get_finished_spans()
    (run_span,) = named(spans, "nous_sched.run_code")
    above = ancestors(run_span, spans)
    assert above and above[0] == "tools/call run_code" and above[-1] == "agent", (
        above,
        [(x.name, x.parent) for x in spans],
    )
    calls = sorted(
        (s for s in spans if s.parent is not None and s.parent.span_id == run_span.context.span_id),
        key=lambda s: s.attributes["nous_sched.seq"],
    )
    assert [s.attributes["gen_ai.tool.name"] for s in calls] == ["double"] * 3 + ["write"]

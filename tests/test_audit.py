"""The audit says what happened: an approved, a rejected, a failed and a succeeded call told apart.

One program makes four calls, one of each kind. ``RunResult.events``, the
``SessionLog`` and serve-mcp's ``--audit-log`` record each approval decision
(``approval``: seq, tool, approved, reason) and each started call's outcome
(``tool_outcome``: seq, tool, ok, error {kind, message} or null, bytes) with the
same fields (``nous_sched.events``).
"""

from __future__ import annotations

import json
import threading

import anyio
import pytest
from mcp import Client
from mcp_types import ElicitResult

from nous_sched import (
    ApprovalEvent,
    PermissionPolicy,
    QuickJSRuntime,
    SessionLog,
    Tool,
    ToolCallEvent,
    ToolError,
    ToolOutcomeEvent,
    call_tool,
    run_code,
)
from nous_sched.mcp import CodeModeServer
from nous_sched.mcp.serve import AuditLog

PROGRAM = """
const paid = await tools.pay({ amount: 1 });
let rejected, failed;
try { await tools.pay({ amount: 2 }); } catch (e) { rejected = e.message; }
try { await tools.boom({}); } catch (e) { failed = e.message; }
const found = await tools.lookup({ key: "k" });
return { paid, rejected, failed, found };
"""

APPROVAL = ["seq", "tool", "approved", "reason"]
OUTCOME = ["seq", "tool", "ok", "error", "bytes"]


def tools():
    def boom(args):
        raise ToolError("the disk is full")

    return [
        Tool("pay", lambda args: {"paid": args["amount"]}, requires_approval=True),
        Tool("boom", boom),
        Tool("lookup", lambda args: "value"),
    ]


def only_amount_one(request):
    return request.arguments == {"amount": 1}


def expected_outcomes():
    return [
        {"seq": 0, "tool": "pay", "ok": True, "error": None, "bytes": len('{"paid":1}')},
        {
            "seq": 1,
            "tool": "pay",
            "ok": False,
            "error": {"kind": "denied", "message": 'tool "pay" was rejected by the approval handler'},
            "bytes": 0,
        },
        {
            "seq": 2,
            "tool": "boom",
            "ok": False,
            "error": {"kind": "tool_error", "message": "the disk is full"},
            "bytes": 0,
        },
        {"seq": 3, "tool": "lookup", "ok": True, "error": None, "bytes": len('"value"')},
    ]


@pytest.mark.parametrize("runtime", [None, QuickJSRuntime()], ids=["worker", "in_process"])
def test_run_result_and_session_log_tell_the_four_calls_apart(runtime):
    log = SessionLog()
    result = run_code(
        PROGRAM, tools(), description="pay twice", approval_handler=only_amount_one, session_log=log, runtime=runtime
    )
    assert result.error is None, result.error
    assert result.result["rejected"] == 'tool "pay" was rejected by the approval handler'
    assert result.result["failed"] == "the disk is full"
    # RunResult.events: the records, typed.
    kinds = [type(e) for e in result.events]
    assert kinds.count(ToolCallEvent) == 4 and kinds.count(ToolOutcomeEvent) == 4 and kinds.count(ApprovalEvent) == 2
    approvals = [e for e in result.events if isinstance(e, ApprovalEvent)]
    assert [(a.seq, a.tool, a.approved) for a in approvals] == [(0, "pay", True), (1, "pay", False)]
    assert approvals[0].reason == "approved by the approval handler"
    assert approvals[1].reason == "rejected by the approval handler"
    outcomes = [e.as_event().data for e in result.events if isinstance(e, ToolOutcomeEvent)]
    assert outcomes == expected_outcomes()
    # Each call's tool_call comes before its approval, which comes before its outcome.
    order = [(e.type, e.seq) for e in result.events]
    for seq in (0, 1):
        assert order.index(("tool_call", seq)) < order.index(("approval", seq)) < order.index(("tool_outcome", seq))
    # The SessionLog holds the same records, as events of the same types and data.
    logged = log.events
    assert [e.type for e in logged] == [e.type for e in result.events]
    assert [e.data for e in logged] == [e.as_event().data for e in result.events]
    assert [list(e.data) for e in logged if e.type == "approval"] == [APPROVAL, APPROVAL]
    assert [list(e.data) for e in logged if e.type == "tool_outcome"] == [OUTCOME] * 4
    assert log.messages() == []  # bookkeeping, never model messages
    # The caller's own log gets them too, through the context update.
    mine = SessionLog()
    result.context_update().apply_to(mine)
    assert [e.type for e in mine.events] == [e.type for e in result.events]


def test_no_handler_and_a_raising_handler_are_recorded_as_denials():
    def raises(request):
        raise RuntimeError("approval service down")

    program = "try { await tools.pay({ amount: 1 }) } catch (e) { return e.message }"
    for handler, reason, message in [
        (None, "no approval handler is configured", 'tool "pay" requires approval and no approval handler'),
        (raises, "the approval handler raised RuntimeError", "approval service down"),
    ]:
        result = run_code(program, tools(), description="pay", approval_handler=handler, runtime=QuickJSRuntime())
        assert message in result.result
        (approval,) = [e for e in result.events if isinstance(e, ApprovalEvent)]
        assert (approval.approved, approval.reason) == (False, reason)
        (outcome,) = [e for e in result.events if isinstance(e, ToolOutcomeEvent)]
        assert outcome.error["kind"] == "denied" and message in outcome.error["message"]


def test_a_policy_that_requires_approval_is_recorded_like_the_tools_own_flag():
    lookup = Tool("lookup", lambda args: 1)
    result = run_code(
        "return await tools.lookup({})",
        [lookup],
        description="look up",
        policy=PermissionPolicy(require_approval=["lookup"]),
        approval_handler=lambda r: True,
        runtime=QuickJSRuntime(),
    )
    assert [e.type for e in result.events] == ["tool_call", "approval", "tool_outcome"]


def test_call_tool_audits_its_approval_and_outcome_with_the_same_schema():
    log = SessionLog()
    pay = tools()[0]
    assert json.loads(call_tool(pay, {"amount": 1}, log, approval_handler=only_amount_one)) == {"paid": 1}
    assert "rejected" in json.loads(call_tool(pay, {"amount": 2}, log, approval_handler=only_amount_one))["error"]
    assert [e.type for e in log.events] == ["tool_call", "approval", "tool_outcome"] * 2
    approvals = [dict(e.data) for e in log.events if e.type == "approval"]
    assert [list(a) for a in approvals] == [APPROVAL, APPROVAL]
    assert [a["approved"] for a in approvals] == [True, False]
    outcomes = [dict(e.data) for e in log.events if e.type == "tool_outcome"]
    assert [list(o) for o in outcomes] == [OUTCOME, OUTCOME]
    assert [(o["ok"], (o["error"] or {}).get("kind")) for o in outcomes] == [(True, None), (False, "denied")]


class _Sink(AuditLog):
    def __init__(self, lines):
        self._lines = lines
        self._lock = threading.Lock()

    def write(self, event, **fields):
        with self._lock:
            self._lines.append(json.loads(json.dumps({"event": event, **fields}, default=str)))

    def close(self):
        pass


def test_serve_mcp_audit_log_has_the_same_records():
    lines = []
    server = CodeModeServer(tools(), audit_log=_Sink(lines), timeout=30)

    async def approve_amount_one(ctx, params):
        return ElicitResult(action="accept", content={"approve": '"amount": 1' in params.message})

    async def go():
        with anyio.fail_after(60):
            async with Client(server.server, elicitation_callback=approve_amount_one) as client:
                return await client.call_tool("run_code", {"code": PROGRAM, "description": "pay twice"})

    try:
        result = anyio.run(go)
    finally:
        server.close()
    assert not result.is_error, result
    assert result.structured_content["result"]["failed"] == "the disk is full"
    approvals = [line for line in lines if line["event"] == "approval"]
    assert [{k: a[k] for k in APPROVAL if k != "reason"} for a in approvals] == [
        {"seq": 0, "tool": "pay", "approved": True},
        {"seq": 1, "tool": "pay", "approved": False},
    ]
    assert all(set(APPROVAL) <= set(a) and isinstance(a["reason"], str) for a in approvals)
    outcomes = [line for line in lines if line["event"] == "tool_outcome"]
    assert [{k: o[k] for k in OUTCOME} for o in outcomes] == expected_outcomes()
    assert not [line for line in lines if line["event"] == "tool_result"]


def test_serve_mcp_audits_an_oversized_program_by_its_size_only():
    lines = []
    server = CodeModeServer(tools(), audit_log=_Sink(lines), timeout=30)
    program = "// " + "x" * (2 * 1024 * 1024)  # over Limits.max_code_bytes (1 MiB)

    async def go():
        with anyio.fail_after(60):
            async with Client(server.server) as client:
                return await client.call_tool("run_code", {"code": program, "description": "too big"})

    try:
        result = anyio.run(go)
    finally:
        server.close()
    assert result.is_error or "error" in (result.structured_content or {}), result
    (start,) = [line for line in lines if line["event"] == "run_start"]
    assert start["code"] is None and start["code_chars"] == len(program)
    assert len(json.dumps(lines)) < 100_000


def test_serve_mcp_close_ends_a_run_going_and_writes_its_run_end_before_closing_the_log(tmp_path, caplog):
    started, release = threading.Event(), threading.Event()

    def block(args):
        started.set()
        release.wait(5)  # bounded: a close that did not end the run would see it end on its own
        return 1

    path = tmp_path / "audit.jsonl"
    server = CodeModeServer([Tool("block", block)], audit_log=path, timeout=60)

    async def go():
        results = []
        with anyio.fail_after(60):
            async with Client(server.server) as client:

                async def call():
                    results.append(
                        await client.call_tool(
                            "run_code", {"code": "return await tools.block({})", "description": "blocks"}
                        )
                    )

                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(call)
                    assert await anyio.to_thread.run_sync(started.wait, 30)
                    await anyio.to_thread.run_sync(server.close)
                    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        return lines, results

    try:
        lines, results = anyio.run(go)
    finally:
        release.set()
        server.close()
    # When close() returned the run had ended, cancelled, and its run_end was the log's last line.
    assert [line["event"] for line in lines][0] == "run_start"
    assert lines[-1]["event"] == "run_end" and lines[-1]["error"]["kind"] == "cancelled", lines[-1]
    assert results[0].structured_content["error"]["kind"] == "cancelled"
    assert not [r for r in caplog.records if "audit log" in r.getMessage()]

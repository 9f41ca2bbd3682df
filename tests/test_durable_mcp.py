"""serve-mcp with an approval store: a client that cannot answer elicitation gets
the run's suspension as structured output; an operator decides with
``nous-sched approvals``; the run resumes by replay."""

import os
import subprocess
import sys

import anyio
import pytest

pytest.importorskip("mcp")

from mcp import Client  # noqa: E402

from nous_sched import SqliteApprovalStore, Tool, resume  # noqa: E402
from nous_sched.mcp import CodeModeServer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tools(ran):
    return [
        Tool("quote", lambda args: {"price": 7}, description="A price.", parameters={"type": "object"}),
        Tool(
            "buy",
            lambda args: ran.append(args) or {"bought": args["item"]},
            description="Buy an item.",
            parameters={"type": "object"},
            requires_approval=True,
        ),
    ]


def test_a_client_that_cannot_be_asked_gets_the_suspension_then_an_operator_decides(tmp_path):
    ran = []
    path = str(tmp_path / "approvals.db")
    server = CodeModeServer(_tools(ran), approval_store=SqliteApprovalStore(path), audit_log=str(tmp_path / "a.jsonl"))
    program = "const q = await tools.quote({}); return await tools.buy({item: 'pen', price: q.price});"

    async def go():
        with anyio.fail_after(60):
            async with Client(server.server) as client:
                return await client.call_tool("run_code", {"code": program, "description": "buy a pen"})

    result = anyio.run(go)
    assert result.is_error is False
    suspended = result.structured_content["suspended"]
    (pending,) = suspended["pending"]
    assert (pending["seq"], pending["tool"], pending["arguments"]) == (1, "buy", {"item": "pen", "price": 7})
    assert ran == []

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    operator = subprocess.run(
        [sys.executable, "-m", "nous_sched", "approvals", "approve", suspended["token"], "1", "--store", path],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert operator.returncode == 0, operator.stderr

    done = resume(suspended["token"], {}, _tools(ran), approval_store=SqliteApprovalStore(path))
    assert done.result == {"bought": "pen"}
    assert ran == [{"item": "pen", "price": 7}]

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


# -- run_result: the resumed run's result reaches the client that started it ---------------

_TOOLS_MODULE = """
import os
from nous_sched import Tool

def _buy(args):
    with open(os.environ["BOUGHT_FILE"], "a") as f:
        f.write(args["item"] + "\\n")
    return {"bought": args["item"]}

TOOLS = [
    Tool("quote", lambda args: {"price": 7}, description="A price.", parameters={"type": "object"}),
    Tool("buy", _buy, description="Buy an item.", parameters={"type": "object"}, requires_approval=True),
]
"""


def _serve_mcp_http(tmp_path, store, *extra):
    module = tmp_path / "shop_tools.py"
    module.write_text(_TOOLS_MODULE)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["BOUGHT_FILE"] = str(tmp_path / "bought.txt")
    argv = ["serve-mcp", "--tools", str(module), "--approval-store", store, "--http", "127.0.0.1:0", *extra]
    process = subprocess.Popen([sys.executable, "-m", "nous_sched", *argv], env=env, stderr=subprocess.PIPE, text=True)
    line = process.stderr.readline()  # printed once the socket listens
    assert " at http://127.0.0.1:" in line, line
    return process, line.split(" at ", 1)[1].split(";", 1)[0]


def _approve(store, token, seq):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = [sys.executable, "-m", "nous_sched", "approvals", "approve", token, str(seq), "--store", store]
    operator = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert operator.returncode == 0, operator.stderr


def test_run_result_delivers_the_resumed_run_to_the_client_that_started_it(tmp_path):
    store = str(tmp_path / "approvals.db")
    bought = tmp_path / "bought.txt"
    process, url = _serve_mcp_http(tmp_path, store)
    program = "const q = await tools.quote({}); return await tools.buy({item: 'pen', price: q.price});"
    try:

        async def go():
            with anyio.fail_after(120):
                async with Client(url) as client, Client(url) as other:
                    names = [t.name for t in (await client.list_tools()).tools]
                    assert names == ["run_code", "run_result"]
                    first = await client.call_tool("run_code", {"code": program, "description": "buy a pen"})
                    assert first.is_error is False
                    suspended = first.structured_content["suspended"]
                    token, claim = suspended["token"], suspended["claim"]
                    poll = {"token": token, "claim": claim}

                    waiting = await client.call_tool("run_result", poll)
                    assert waiting.is_error is False
                    assert waiting.structured_content["waiting"] == [1]
                    assert waiting.structured_content["suspended"]["token"] == token
                    assert not bought.exists()

                    # Another client, or a wrong claim: refused the same way, before and after the approval.
                    hostile = [
                        {"token": token, "claim": "x" * 32},
                        {"token": token},
                        {"token": token, "claim": ["nested" * 1000]},
                        {"token": "\x00\u202e" * 50_000, "claim": "\U000e0041" * 1000},
                    ]
                    for caller, arguments in [(other, a) for a in hostile]:
                        refused = await caller.call_tool("run_result", arguments)
                        assert refused.is_error is True

                    await anyio.to_thread.run_sync(_approve, store, token, 1)  # the operator, another process

                    stolen = await other.call_tool("run_result", {"token": token, "claim": claim[:-1] + "A"})
                    assert stolen.is_error is True and "no run of yours" in stolen.content[0].text
                    assert not bought.exists()  # a refused poll starts nothing

                    done = await client.call_tool("run_result", poll)
                    again = await client.call_tool("run_result", poll)
                    return done, again

        done, again = anyio.run(go)
    finally:
        process.terminate()
        try:
            process.wait(30)
        finally:
            process.kill()
            process.stderr.close()
    assert done.is_error is False, done.content
    assert done.structured_content == {"logs": [], "result": {"bought": "pen"}}
    assert again.structured_content == done.structured_content  # a repeated poll: the same result
    assert bought.read_text() == "pen\n"  # the approved call ran once


def test_run_result_is_bound_to_the_principal_where_bearer_tokens_are_configured():
    from nous_sched.mcp.deliver import Deliveries

    deliveries = Deliveries()
    alice, bob = ("principal", "client-a", "issuer", "alice"), ("principal", "client-b", "issuer", "bob")
    told = deliveries.register({"token": "t1", "expires_at": 4e9, "pending": []}, (alice,))
    claim = told["claim"]
    assert deliveries.owned("t1", claim, (alice,)) is not None
    assert deliveries.owned("t1", claim, (bob,)) is None  # the claim alone is not enough
    assert deliveries.owned("t1", claim, (("connection", "127.0.0.1", 5000),)) is None
    assert deliveries.owned("t1", claim + "x", (alice,)) is None
    assert deliveries.owned("t2", claim, (alice,)) is None
    assert deliveries.owned("t1", None, (alice,)) is None
    # Without authorization the claim is the proof: a new connection of the same client may poll.
    told = deliveries.register({"token": "t3", "expires_at": 4e9, "pending": []}, (("connection", "127.0.0.1", 1),))
    assert deliveries.owned("t3", told["claim"], (("connection", "127.0.0.1", 2),)) is not None
    # An expired suspension is forgotten at the next registration.
    deliveries.register({"token": "old", "expires_at": 1.0, "pending": []}, (alice,))
    deliveries.register({"token": "t4", "expires_at": 4e9, "pending": []}, (alice,))
    assert len(deliveries) == 3


def test_run_result_of_a_run_that_suspends_again_is_a_new_suspension_for_the_same_client(tmp_path):
    store = str(tmp_path / "approvals.db")
    bought = tmp_path / "bought.txt"
    process, url = _serve_mcp_http(tmp_path, store)
    program = "await tools.buy({item: 'pen'}); return await tools.buy({item: 'ink'});"
    try:

        async def go():
            with anyio.fail_after(120):
                async with Client(url) as client:
                    first = await client.call_tool("run_code", {"code": program, "description": "buy two things"})
                    one = first.structured_content["suspended"]
                    await anyio.to_thread.run_sync(_approve, store, one["token"], 0)
                    again = await client.call_tool("run_result", {"token": one["token"], "claim": one["claim"]})
                    two = again.structured_content["suspended"]
                    assert two["token"] != one["token"] and two["claim"] != one["claim"]
                    assert [p["tool"] for p in two["pending"]] == ["buy"]
                    assert bought.read_text() == "pen\n"
                    seq = two["pending"][0]["seq"]
                    # The first token's claim does not open the second suspension.
                    crossed = await client.call_tool("run_result", {"token": two["token"], "claim": one["claim"]})
                    assert crossed.is_error is True
                    await anyio.to_thread.run_sync(_approve, store, two["token"], seq)
                    return await client.call_tool("run_result", {"token": two["token"], "claim": two["claim"]})

        done = anyio.run(go)
    finally:
        process.terminate()
        try:
            process.wait(30)
        finally:
            process.kill()
            process.stderr.close()
    assert done.structured_content == {"logs": [], "result": {"bought": "ink"}}
    assert bought.read_text() == "pen\nink\n"


def test_with_bearer_tokens_only_the_same_principal_reads_the_result_even_with_the_claim(tmp_path):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    alice, bob = "alice-" + "a" * 24, "bob-" + "b" * 24
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {alice}\nbob {bob}\n")
    store = str(tmp_path / "approvals.db")
    process, url = _serve_mcp_http(tmp_path, store, "--auth-token-file", str(tokens))
    program = "return await tools.buy({item: 'pen'});"

    async def as_client(token, name, arguments):
        """A fresh SDK client (its own connection) with ``token``: one call."""
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(120)) as http:
            async with Client(streamable_http_client(url, http_client=http)) as client:
                return await client.call_tool(name, arguments)

    try:

        async def go():
            with anyio.fail_after(120):
                first = await as_client(alice, "run_code", {"code": program, "description": "buy a pen"})
                suspended = first.structured_content["suspended"]
                poll = {"token": suspended["token"], "claim": suspended["claim"]}
                await anyio.to_thread.run_sync(_approve, store, suspended["token"], 0)
                stolen = await as_client(bob, "run_result", poll)  # the claim leaked to another principal
                assert stolen.is_error is True and "no run of yours" in stolen.content[0].text
                return await as_client(alice, "run_result", poll)  # alice again, on a new connection

        done = anyio.run(go)
    finally:
        process.terminate()
        try:
            process.wait(30)
        finally:
            process.kill()
            process.stderr.close()
    assert done.structured_content == {"logs": [], "result": {"bought": "pen"}}
    assert (tmp_path / "bought.txt").read_text() == "pen\n"

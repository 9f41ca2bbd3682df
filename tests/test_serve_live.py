"""serve-mcp shows a run live (issue 25): progress as calls commit, console lines as log messages.

The clients are the SDK's own ``Client``; the subprocess tests start
``nous-sched serve-mcp`` as an MCP host would (stdio, and Streamable HTTP on
a loopback port), with the lab server as upstream. Every test records the
client's callbacks and the result in one list, so order is checked, not timed.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import uuid

import anyio
import httpx
import pytest
from mcp import Client
from mcp_servers import lab
from mcp_types import ElicitResult
from test_mcp_serve import serve_mcp_params

from nous_sched import Limits
from nous_sched.mcp import CodeModeServer, ServerSpec, connect
from nous_sched.mcp.event_store import PrimingEventStore
from nous_sched.mcp.live_forward import line_level
from nous_sched.mcp.serve import RETRY_MS

PROGRAM = """
const found = await Promise.all(["a", "b", "c"].map((key) => tools.lookup({ key })));
console.log("found", found.length);
console.warn("careful");
console.error("bad");
return found.length;
"""
COMMITTED = [
    ("progress", 1.0, '#0 lookup(key: "a") committed in N ms'),
    ("progress", 2.0, '#1 lookup(key: "b") committed in N ms'),
    ("progress", 3.0, '#2 lookup(key: "c") committed in N ms'),
]
LOGGED = [("log", "info", "found 3"), ("log", "warning", "careful"), ("log", "error", "bad")]


def watch(make_client, code=PROGRAM, *, progress=True, level=None, elicit=None):
    """Call run_code once; return the progress/log callbacks and the result, in the order they came."""
    seen = []

    async def on_progress(value, total, message):
        seen.append(("progress", value, re.sub(r" \d+ ms", " N ms", message)))  # durations vary

    async def on_log(params):
        seen.append(("log", params.level, params.data))

    async def go():
        with anyio.fail_after(60):
            async with make_client(on_log) as client:
                if level is not None:
                    await client.set_logging_level(level)
                result = await client.call_tool(
                    "run_code",
                    {"code": code, "description": "live"},
                    progress_callback=on_progress if progress else None,
                )
                seen.append(("result", result.structured_content))

    anyio.run(go)
    return seen


def test_progress_in_commit_order_and_log_lines_come_before_the_result_over_stdio():
    tag = f"live-{uuid.uuid4().hex[:8]}"
    params = serve_mcp_params("--trust", "lab", tag=tag)
    seen = watch(lambda on_log: Client(params, mode="legacy", logging_callback=on_log))
    assert seen == [
        *COMMITTED,
        *LOGGED,
        ("result", {"logs": ["found 3", "[warn] careful", "[error] bad"], "result": 3}),
    ]


@contextlib.contextmanager
def serve_http():
    """``nous-sched serve-mcp --http 127.0.0.1:0`` over the lab server; yields its URL."""
    tag = f"live-http-{uuid.uuid4().hex[:8]}"
    command = " ".join([sys.executable, str(lab.__file__), "--tag", tag, "--linger"])
    process = subprocess.Popen(
        [sys.executable, "-m", "nous_sched", "serve-mcp", "--server", f"lab={command}", "--trust", "lab"]
        + ["--http", "127.0.0.1:0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stderr.readline()  # printed once the socket listens
        assert " at http://127.0.0.1:" in line, line
        yield line.split(" at ", 1)[1].split(";", 1)[0]
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        finally:
            process.kill()
            process.stderr.close()


def test_progress_in_commit_order_and_log_lines_come_before_the_result_over_http():
    with serve_http() as url:
        seen = watch(lambda on_log: Client(url, mode="legacy", logging_callback=on_log))
    assert seen == [
        *COMMITTED,
        *LOGGED,
        ("result", {"logs": ["found 3", "[warn] careful", "[error] bad"], "result": 3}),
    ]


def test_post_sse_streams_start_with_a_priming_event_with_an_id_and_a_retry():
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    with serve_http() as url, httpx.Client(timeout=30) as http:
        opened = http.post(
            url, headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}
        )
        headers |= {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        listed = http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    first = listed.text.split("\r\n\r\n" if "\r\n\r\n" in listed.text else "\n\n", 1)[0]
    fields = dict(line.split(":", 1) for line in first.splitlines())
    assert fields["id"].strip() and fields["data"].strip() == "" and fields["retry"].strip() == str(RETRY_MS)
    assert '"tools"' in listed.text


@pytest.fixture
def server():
    with connect(ServerSpec(lab.build(), trusted=True)) as conn:
        served = CodeModeServer(conn.tools(), timeout=30)
        yield served
        served.close()


def test_set_level_error_filters_out_info_and_warning_lines(server):
    seen = watch(lambda on_log: Client(server.server, mode="legacy", logging_callback=on_log), level="error")
    assert [s for s in seen if s[0] == "log"] == [("log", "error", "bad")]
    assert seen[-1][0] == "result" and seen[-1][1]["logs"] == ["found 3", "[warn] careful", "[error] bad"]


def test_no_progress_token_no_progress_notifications(server):
    seen = watch(lambda on_log: Client(server.server, mode="legacy", logging_callback=on_log), progress=False)
    assert seen[:-1] == LOGGED


def test_a_run_that_waits_for_approval_says_so_as_progress(server):
    async def approve(ctx, params):
        return ElicitResult(action="accept", content={"approve": True})

    code = "const r = await tools.put({ key: 'x', value: 1 }); return r;"
    seen = watch(
        lambda on_log: Client(server.server, mode="legacy", logging_callback=on_log, elicitation_callback=approve), code
    )
    assert seen == [
        ("progress", 0.0, '#0 waiting for approval of put(key: "x", value: 1)'),
        ("progress", 1.0, '#0 put(key: "x", value: 1) committed in N ms'),
        ("result", {"logs": [], "result": {"stored": "x", "value": 1}}),
    ]


def test_a_refused_call_is_a_warning_and_a_failed_one_says_why(server):
    code = (
        "try { await tools.lookup({}); } catch (e) {} try { await tools.nothing({}); } catch (e) {}"
        " try { await tools.fail({message: 'no <b>luck</b>'}); } catch (e) {} return 1;"
    )
    seen = watch(lambda on_log: Client(server.server, mode="legacy", logging_callback=on_log), code)
    (failed,) = [s for s in seen if s[0] == "progress"]
    assert failed[:2] == ("progress", 1.0)
    assert failed[2].startswith('#0 fail(message: "no <b>luck</b>") failed after N ms (tool_error): ')
    assert "no <b>luck</b>" in failed[2].split("(tool_error): ", 1)[1]
    refusals = [s for s in seen if s[0] == "log"]
    assert [r[1] for r in refusals] == ["warning", "warning"]
    assert refusals[0][2].startswith("refused lookup (schema): ") and "key" in refusals[0][2]
    assert refusals[1][2].startswith('refused nothing (unknown): unknown tool "nothing"')
    assert seen[-1] == ("result", {"logs": [], "result": 1})


def test_console_levels():
    assert line_level("plain") == ("info", "plain")
    assert line_level("[warn] w") == ("warning", "w")
    assert line_level("[error] e") == ("error", "e")


def test_one_client_cannot_replay_another_sessions_stream():
    """The SDK names a POST's stream by its JSON-RPC id, one store for every session:
    a store that replayed would hand client A, reconnecting with the id of its own
    priming event, what session B stored later on a stream of the same id."""
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}

    def initialize(http, url, client):
        hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": client, "version": "0"}}
        opened = http.post(
            url, headers=headers, json={"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": hello}
        )
        session = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        http.post(url, headers=headers | session, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        priming = [line[3:].strip() for line in opened.text.splitlines() if line.startswith("id:")][0]
        return session, priming

    with serve_http() as url, httpx.Client(timeout=60) as http:
        a, a_priming = initialize(http, url, "a")
        b, _ = initialize(http, url, "b")
        arguments = {"code": "return 'B-SECRET';", "description": "b's run"}
        call = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "run_code", "arguments": arguments},
        }
        assert "B-SECRET" in http.post(url, headers=headers | b, json=call).text
        replay = {"Accept": "text/event-stream", **a, "last-event-id": a_priming}
        heard = ""
        with http.stream("GET", url, headers=replay, timeout=httpx.Timeout(60, read=3)) as response:
            try:
                for chunk in response.iter_text():
                    heard += chunk
            except httpx.ReadTimeout:  # a stream that stays open with nothing to say: the expected case
                pass
    assert "B-SECRET" not in heard and '"b"' not in heard


def test_the_event_store_gives_random_ids_and_replays_nothing():
    async def go():
        store = PrimingEventStore()
        assert store  # the SDK tests it for truth
        ids = {await store.store_event("1", None) for _ in range(100)}
        heard = []

        async def hear(event):
            heard.append(event)

        assert len(ids) == 100
        assert await store.replay_events_after(next(iter(ids)), hear) is None and heard == []

    anyio.run(go)


def test_log_messages_are_bounded_like_the_logs_and_the_result_keeps_them():
    with connect(ServerSpec(lab.build(), trusted=True)) as conn:
        served = CodeModeServer(conn.tools(), timeout=30, limits=Limits(max_log_lines=2))
        code = "for (let i = 0; i < 5; i++) console.log('line', i); return 1;"
        seen = watch(lambda on_log: Client(served.server, mode="legacy", logging_callback=on_log), code)
        served.close()
    assert [s[2] for s in seen if s[0] == "log"] == ["line 0", "line 1"]  # what the logs keep, no more
    assert seen[-1][1]["logs"] == ["line 0", "line 1", "[output truncated at 2 lines]"]


def test_a_2026_client_that_answers_a_question_hears_each_line_once_in_order(server):
    async def approve(ctx, params):
        return ElicitResult(action="accept", content={"approve": True})

    code = "console.log('before'); const r = await tools.put({ key: 'x', value: 1 }); console.log('after'); return r;"
    seen = watch(
        lambda on_log: Client(
            server.server, mode="auto", log_level="info", logging_callback=on_log, elicitation_callback=approve
        ),
        code,
        progress=False,
    )
    assert seen == [
        ("log", "info", "before"),
        ("log", "info", "after"),
        ("result", {"logs": ["before", "after"], "result": {"stored": "x", "value": 1}}),
    ]

"""Code Mode served over MCP: ``CodeModeServer`` and the ``nous-sched serve-mcp`` command.

The clients are the SDK's own ``Client``. The subprocess tests start
``nous-sched serve-mcp`` exactly as an MCP host would (stdio, or Streamable
HTTP on a port the server picks and prints), with the lab server
(``tests/mcp_servers/lab.py``) as its upstream; the in-process tests speak to
a ``CodeModeServer`` directly, over both protocol eras.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp_servers import lab, loop_threads, processes_running, wait_until
from mcp_types import ElicitResult
from toolsets import api_tools

from nous_sched import ApprovalRequest, ConfigError, PermissionPolicy, Tool, sdk
from nous_sched.cli import main
from nous_sched.mcp import CodeModeServer, ServerSpec, connect
from nous_sched.mcp.serve import OUTPUT_SCHEMA, AuditLog, _Run

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FANOUT = """
const keys = ["k0", "k1", "k2", "k3"];
const met = await Promise.all(keys.map((key) => tools.meet({ group: GROUP, n: 4, key })));
console.log("met", met.filter((m) => m.met).length, "of", met.length);
const entries = await Promise.all(keys.map((key) => tools.lookup({ key })));
return { met: met.map((m) => m.key), values: entries.map((e) => e.value) };
"""


def call_run_code(client_factory, code, description="test program", *, seconds=60):
    """Open ``client_factory()``, list its tools, call run_code; return (tools, result)."""

    async def go():
        with anyio.fail_after(seconds):
            async with client_factory() as client:
                listed = await client.list_tools()
                result = await client.call_tool("run_code", {"code": code, "description": description})
                return listed.tools, result

    return anyio.run(go)


def audit_events(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def approve_value_one(asked):
    async def on_elicit(ctx, params):
        asked.append(params.message)
        approve = '"value": 1' in params.message
        return ElicitResult(action="accept", content={"approve": approve})

    return on_elicit


# -- the command, as an MCP host runs it ------------------------------------------------------


def serve_mcp_params(*args, tag):
    command = " ".join([sys.executable, str(lab.__file__), "--tag", tag])
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "nous_sched", "serve-mcp", "--server", f"lab={command}", *args],
        cwd=str(Path(__file__).resolve().parent.parent),
    )


def test_serve_mcp_over_stdio_fans_out_over_an_upstream_server(tmp_path):
    tag = f"serve-{uuid.uuid4().hex[:8]}"
    audit = tmp_path / "audit.jsonl"
    params = serve_mcp_params("--trust", "lab", "--audit-log", str(audit), tag=tag)
    program = f"const GROUP = {json.dumps(uuid.uuid4().hex)};" + FANOUT

    tools, result = call_run_code(lambda: Client(params), program, "fan out over the lab server")

    # One tool, whose description carries the SDK of the upstream tools.
    assert [t.name for t in tools] == ["run_code"]
    assert tools[0].output_schema == OUTPUT_SCHEMA
    assert '"meet"(args: {' in tools[0].description and '"lookup"(args: {' in tools[0].description
    # ...with the upstream output schemas as return types.
    assert 'Promise<{ "key": string; "value": number; "tags"?: Array<string> }>' in tools[0].description
    assert set(tools[0].input_schema["required"]) == {"code", "description"}
    # The result and the program's logs, structured and as text.
    assert not result.is_error
    expected = {"logs": ["met 4 of 4"], "result": {"met": ["k0", "k1", "k2", "k3"], "values": [2, 2, 2, 2]}}
    assert result.structured_content == expected
    assert json.loads(result.content[0].text) == expected
    # The audit log: the run, then each call before its result, then the run's end.
    events = audit_events(audit)
    assert [e["event"] for e in events][0] == "run_start" and events[-1]["event"] == "run_end"
    assert events[0]["description"] == "fan out over the lab server" and "Promise.all" in events[0]["code"]
    # Written by each call's own thread as it starts: parallel calls may land in any order, each with its seq.
    calls = sorted((e for e in events if e["event"] == "tool_call"), key=lambda e: e["seq"])
    assert [c["seq"] for c in calls] == list(range(8))
    assert [(c["tool"], c["arguments"]["key"], c["mode"]) for c in calls] == [
        *[("meet", f"k{i}", "parallel") for i in range(4)],
        *[("lookup", f"k{i}", "parallel") for i in range(4)],
    ]
    results = [e for e in events if e["event"] == "tool_outcome"]
    assert len(results) == 8 and all(r["ok"] and r["error"] is None and r["bytes"] > 0 for r in results)
    assert {c["id"] for c in calls} == {r["call"] for r in results}
    assert not [e for e in events if e["event"] == "tool_result"]  # renamed tool_outcome (CHANGELOG)
    assert len({e["run"] for e in events}) == 1 and events[-1]["ok"] is True
    # serve-mcp exited with its client, and stopped the upstream server it started.
    wait_until(lambda: processes_running(tag) == [], what="the upstream server to exit")


def test_serve_mcp_asks_for_approval_through_elicitation_and_audits_it(tmp_path):
    audit = tmp_path / "audit.jsonl"
    params = serve_mcp_params("--trust", "lab", "--audit-log", str(audit), tag=f"ask-{uuid.uuid4().hex[:8]}")
    asked = []
    program = """
    const ok = await tools.put({ key: "a", value: 1 });
    let refused;
    try { await tools.put({ key: "a", value: 2 }); } catch (e) { refused = e.message; }
    return { ok, refused };
    """
    _, result = call_run_code(lambda: Client(params, elicitation_callback=approve_value_one(asked)), program)
    assert result.structured_content["result"] == {
        "ok": {"stored": "a", "value": 1},
        "refused": 'tool "put" was rejected by the approval handler',
    }
    assert len(asked) == 2 and 'the tool "put"' in asked[0] and '"value": 2' in asked[1]
    approvals = [(e["arguments"], e["decision"], e["by"]) for e in audit_events(audit) if e["event"] == "approval"]
    assert approvals == [
        ({"key": "a", "value": 1}, "approved", "client"),
        ({"key": "a", "value": 2}, "denied", "client"),
    ]


def test_serve_mcp_denies_by_default_when_the_client_cannot_be_asked(tmp_path):
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"approve": ["note"], "require_approval": ["note", "lookup"], "deny": ["crash"]}))
    params = serve_mcp_params("--trust", "lab", "--policy", str(policy), tag=f"deny-{uuid.uuid4().hex[:8]}")
    program = """
    const out = {};
    for (const [name, args] of [["put", { key: "b", value: 1 }], ["lookup", { key: "x" }], ["note", { text: "n" }], ["crash", {}]]) {
      try { out[name] = await tools[name](args); } catch (e) { out[name] = e.message; }
    }
    return out;
    """
    tools, result = call_run_code(lambda: Client(params), program)
    assert '"crash"' not in tools[0].description  # denied tools are not declared to the model
    out = result.structured_content["result"]
    for name in ("put", "lookup"):  # destructive by its trusted hints; gated by the policy file
        assert out[name] == (
            f'tool "{name}" needs approval, and this MCP client cannot be asked '
            "(it did not declare the elicitation capability); the call was refused"
        )
    assert out["note"] == {"notes": 1}  # pre-approved by the policy file
    assert out["crash"] == 'tool "crash" is denied by the permission policy'


def test_serve_mcp_reads_upstream_servers_from_a_config_file_and_takes_policy_flags(tmp_path):
    tag = f"config-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "servers.json"
    config.write_text(
        json.dumps(
            {"mcpServers": {"lab": {"command": sys.executable, "args": [lab.__file__, "--tag", tag], "trusted": True}}}
        )
    )
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "nous_sched",
            "serve-mcp",
            "--mcp-config",
            str(config),
            "--deny",
            "fail",
            "--require-approval",
            "lookup",
        ],
    )
    program = """
    const out = {};
    for (const [name, args] of [["meet", { group: "solo", n: 1, key: "m" }], ["lookup", { key: "x" }], ["fail", { message: "m" }]]) {
      try { out[name] = await tools[name](args); } catch (e) { out[name] = e.message; }
    }
    return out;
    """
    tools, result = call_run_code(lambda: Client(params), program)
    assert '"meet"' in tools[0].description and '"fail"' not in tools[0].description
    assert result.structured_content["result"] == {
        "meet": {"key": "m", "met": True},  # trusted from the config: read-only needs no approval
        "lookup": 'tool "lookup" needs approval, and this MCP client cannot be asked '
        "(it did not declare the elicitation capability); the call was refused",
        "fail": 'tool "fail" is denied by the permission policy',
    }
    wait_until(lambda: processes_running(tag) == [], what="the upstream server to exit")


def test_serve_mcp_serves_a_tools_module(tmp_path):
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "nous_sched", "serve-mcp", "--tools", str(EXAMPLES / "tools.py"), "--approve", "add_note"],
    )
    program = """
    const counts = await Promise.all(["one two", "three"].map((text) => tools.word_count({ text })));
    await tools.add_note({ title: "mcp", text: "from MCP" });
    return counts.map((c) => c.words);
    """
    _, result = call_run_code(lambda: Client(params), program)
    assert result.structured_content == {"logs": [], "result": [2, 1]}


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_serve_mcp_over_streamable_http(stop):
    tag = f"http-{uuid.uuid4().hex[:8]}"
    # --linger: the upstream outlives the end of its input, so only serve-mcp's own close stops it.
    command = " ".join([sys.executable, str(lab.__file__), "--tag", tag, "--linger"])
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nous_sched",
            "serve-mcp",
            "--server",
            f"lab={command}",
            "--trust",
            "lab",
            "--http",
            "127.0.0.1:0",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stderr.readline()  # printed once the socket listens
        assert " at http://127.0.0.1:" in line, line
        url = line.split(" at ", 1)[1].split(";", 1)[0]
        _, result = call_run_code(lambda: Client(url), "return await tools.lookup({ key: 'abc' });")
        assert result.structured_content == {"logs": [], "result": {"key": "abc", "value": 3, "tags": ["lab", "abc"]}}
    finally:
        process.send_signal(stop)
        try:
            process.wait(30)
        finally:
            process.kill()
            process.stderr.close()
    assert process.returncode == 130  # stopped as by Ctrl-C, whichever signal
    wait_until(lambda: processes_running(tag) == [], what="the upstream server to exit")


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "give the tools to serve: --tools MODULE, --server NAME=TARGET or --mcp-config FILE"),
        (["--server", "lab"], "--server lab: expected NAME=TARGET"),
        (["--server", "lab=/nonexistent/server"], "MCP server 'lab' \\(/nonexistent/server\\)"),
        (["--tools", "examples/tools.py", "--trust", "web"], "--trust web: no upstream server of that name"),
        (["--tools", "examples/tools.py", "--http", "localhost:http"], "--http localhost:http: expected"),
        (["--tools", "examples/tools.py", "--policy", "missing.json"], "policy missing.json: cannot read it"),
        (
            ["--tools", "examples/tools.py", "--description-budget", "900"],
            "`budget` must be None or a number of characters of at least 1,500, got 900",
        ),
    ],
)
def test_serve_mcp_usage_errors_exit_2_with_a_message(args, message, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    assert main(["serve-mcp", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nous-sched: ") and len(err.strip().splitlines()) == 1
    assert re.search(message, err), err


def test_serve_mcp_without_the_sdk_names_the_extra():
    script = "import sys; sys.modules['mcp'] = None; from nous_sched.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", script, "serve-mcp", "--tools", "examples/tools.py"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
        timeout=60,
    )
    assert done.returncode == 2
    from nous_sched._extras import install_command

    assert f"serve-mcp: nous_sched.mcp needs the MCP SDK; install it with: {install_command('mcp')}" in done.stderr
    # The rest of the command line works without it.
    assert subprocess.run([sys.executable, "-c", script, "--help"], capture_output=True, timeout=60).returncode == 0


# -- CodeModeServer in-process: both protocol eras ---------------------------------------------------


@pytest.fixture
def upstream():
    with connect(ServerSpec(lab.build(), trusted=True)) as conn:
        yield conn.tools()
    wait_until(lambda: not [t for t in loop_threads() if t.startswith("nous-sched-mcp-")], what="loop threads")


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_approval_questions_reach_the_user_in_both_protocol_eras(upstream, mode):
    audit = []
    server = CodeModeServer(upstream, audit_log=AuditSink(audit), timeout=30)
    asked = []
    program = """
    const [a, b] = await Promise.all([tools.put({ key: "x", value: 1 }), tools.put({ key: "x", value: 2 }).catch((e) => e.message)]);
    return { a, b };
    """

    def client():
        return Client(server.server, mode=mode, elicitation_callback=approve_value_one(asked))

    _, result = call_run_code(client, program)
    assert result.structured_content["result"] == {
        "a": {"stored": "x", "value": 1},
        "b": 'tool "put" was rejected by the approval handler',
    }
    assert len(asked) == 2
    decisions = [(e["arguments"]["value"], e["decision"]) for e in audit if e["event"] == "approval"]
    assert decisions == [(1, "approved"), (2, "denied")]
    server.close()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_question_nobody_answers_in_time_is_refused_and_the_run_times_out(upstream, mode):
    audit = []
    server = CodeModeServer(upstream, audit_log=AuditSink(audit), timeout=1.0)

    async def slow_user(ctx, params):
        await anyio.sleep(4)  # past the run's deadline and its grace
        return ElicitResult(action="accept", content={"approve": True})

    def client():
        return Client(server.server, mode=mode, elicitation_callback=slow_user)

    _, result = call_run_code(client, "return await tools.put({ key: 'late', value: 1 });")
    assert result.is_error and result.structured_content["error"]["kind"] == "timeout"
    assert [(e["decision"], e["by"]) for e in audit if e["event"] == "approval"] == [("denied", "run over")]
    assert not [e for e in audit if e["event"] == "tool_outcome" and e["ok"]]  # the write never ran


def test_a_client_that_cancels_its_call_stops_the_run_at_once(upstream):
    # The program would spin until its 120 s deadline; the client's cancel
    # (notifications/cancelled) must end it now, as run_code's cancel= does.
    audit = []
    server = CodeModeServer(upstream, audit_log=AuditSink(audit), timeout=120)

    def ran(event):
        return [e for e in list(audit) if e["event"] == event]

    async def go():
        with anyio.fail_after(60):
            async with Client(server.server) as client, anyio.create_task_group() as tg:

                async def call():
                    spin = {"code": "console.log('spinning'); for (;;) {}", "description": "spin"}
                    await client.call_tool("run_code", spin)

                tg.start_soon(call)
                while not ran("run_start"):
                    await anyio.sleep(0.01)
                tg.cancel_scope.cancel()

    t0 = time.monotonic()
    anyio.run(go)
    wait_until(lambda: ran("run_end"), timeout=60, what="the run's end")
    (end,) = ran("run_end")
    assert end["error"]["kind"] == "cancelled", end
    assert time.monotonic() - t0 < 60, "ended long before its deadline"
    server.close()


def test_served_sub_calls_pass_the_gate_and_refusals_are_audited(upstream):
    # The gate's own audit events reach the file: a denied tool and a call whose
    # arguments cannot cross are written as tool_refused, a granted call as tool_call.
    audit = []
    server = CodeModeServer(upstream, policy=PermissionPolicy(deny="put"), audit_log=AuditSink(audit), timeout=30)
    program = """
    const out = [];
    try { await tools.put({ key: "x", value: 1 }); } catch (e) { out.push(e.message); }
    try { await tools.lookup({ key: JSON.rawJSON("1e400") }); } catch (e) { out.push(e.message); }
    out.push(await tools.lookup({ key: "k0" }));
    return out;
    """
    _, result = call_run_code(lambda: Client(server.server), program)
    denied, bad, _looked_up = result.structured_content["result"]
    assert denied == 'tool "put" is denied by the permission policy'
    assert bad.startswith("arguments cannot cross: $.key: inf is not JSON")
    gate = [(e["event"], e["tool"]) for e in audit if e["event"] in ("tool_call", "tool_refused")]
    assert gate == [("tool_refused", "put"), ("tool_refused", "lookup"), ("tool_call", "lookup")]
    refused = [e for e in audit if e["event"] == "tool_refused"]
    assert [e["message"] for e in refused] == [denied, bad]
    assert len({e["run"] for e in audit}) == 1
    server.close()


def test_nothing_ran_is_an_error_result_and_logged(upstream):
    audit = []
    server = CodeModeServer(upstream, audit_log=AuditSink(audit))

    async def go():
        async with Client(server.server) as client:
            blank = await client.call_tool("run_code", {"code": "return 1", "description": " "})
            other = await client.call_tool("lookup", {"key": "x"})
            thrown = await client.call_tool("run_code", {"code": "throw new Error('no')", "description": "d"})
            return blank, other, thrown

    blank, other, thrown = anyio.run(go)
    assert blank.is_error and "non-empty `description`" in blank.content[0].text
    assert other.is_error and other.content[0].text == "unknown tool 'lookup'; this server has one tool, 'run_code'"
    assert thrown.is_error and thrown.structured_content["error"]["kind"] == "exception"
    ends = [e for e in audit if e["event"] == "run_end"]
    assert [e["error"]["kind"] for e in ends] == ["refused", "exception"]


def test_a_forged_request_state_never_reaches_a_run(upstream):
    server = CodeModeServer(upstream)

    async def go():
        async with Client(server.server) as client:
            return await client.session.call_tool(
                "run_code", {"code": "return 1", "description": "d"}, request_state="not-a-run"
            )

    with pytest.raises(BaseException) as caught:  # the SDK's seal refuses it before the handler runs
        anyio.run(go)
    assert "Invalid or expired requestState" in " ".join(str(e) for e in leaves(caught.value))


def leaves(exc):
    """The exceptions inside ``exc``, unwrapping the exception groups anyio raises."""
    inner = getattr(exc, "exceptions", None)
    return [leaf for e in inner for leaf in leaves(e)] if inner else [exc]


def test_bad_server_options_are_config_errors(upstream):
    with pytest.raises(ConfigError, match="`approval_handler` is set per run by the server"):
        CodeModeServer(upstream, approval_handler=lambda r: True)
    with pytest.raises(ConfigError, match="CodeModeServer: `policy` must be None or a nous_sched.PermissionPolicy"):
        CodeModeServer(upstream, policy={"deny": ["x"]})
    with pytest.raises(ConfigError, match="CodeModeServer: `approve` must be a tool name or an iterable"):
        CodeModeServer(upstream, approve=[3])
    with pytest.raises(ConfigError, match="audit log /nonexistent/dir/a.jsonl: cannot open it"):
        CodeModeServer(upstream, audit_log="/nonexistent/dir/a.jsonl")


# -- the paused run, on its own ------------------------------------------------------------------


def test_an_unanswered_question_is_refused_at_the_deadline_and_withdrawn():
    run = _Run("r", "d", can_ask=True)
    ask = run.ask(ApprovalRequest("put", {"k": 1}), time.monotonic() + 0.05)
    assert (ask.approved, ask.by) == (False, "timeout")
    run.answer(ask.key, True, "client")  # too late: changes nothing
    assert ask.approved is False
    run.finish(("ran", {"logs": []}))
    assert run.next() == ("done", ("ran", {"logs": []}))  # the stale question never goes out


def test_questions_asked_together_go_out_together_and_abandon_refuses_all():
    run = _Run("r", "d", can_ask=True)
    answers = {}

    def asker(n):
        answers[n] = run.ask(ApprovalRequest("put", {"n": n}), time.monotonic() + 30)

    threads = [threading.Thread(target=asker, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    asked = []
    while len(asked) < 3:
        kind, asks = run.next()
        asked.extend(asks)
    run.answer(asked[0].key, True, "client")
    run.abandon("cancelled")
    for t in threads:
        t.join(10)
    assert sorted((a.approved, a.by) for a in answers.values()) == [
        (False, "cancelled"),
        (False, "cancelled"),
        (True, "client"),
    ]
    late = run.ask(ApprovalRequest("put", {}), time.monotonic() + 30)
    assert (late.approved, late.by) == (False, "cancelled")
    run.finish(("ran", {"logs": []}))
    assert run.next() == ("done", ("ran", {"logs": []}))


class AuditSink(AuditLog):
    """An AuditLog into a list, for in-process tests."""

    def __init__(self, events):
        self._events = events
        self._lock = threading.Lock()

    def write(self, event, **fields):
        with self._lock:
            self._events.append(json.loads(json.dumps({"event": event, **fields}, default=str)))

    def close(self):
        pass


def test_the_audit_log_is_json_lines_appended_and_flushed(tmp_path):
    path = tmp_path / "a.jsonl"
    log = AuditLog(path)
    log.write("run_start", run="r1", code="return 1")
    assert json.loads(path.read_text())["event"] == "run_start"  # flushed at once
    log.close()
    AuditLog(path).write("run_end", run="r1", ok=True)
    assert [e["event"] for e in audit_events(path)] == ["run_start", "run_end"]


def test_plain_python_tools_serve_in_process():
    tools = [Tool("double", lambda args: args["x"] * 2, concurrency_safe=lambda args: True)]
    server = CodeModeServer(tools, policy=PermissionPolicy(deny={"nothing"}))
    _, result = call_run_code(lambda: Client(server.server), "return await tools.double({ x: 21 });")
    assert result.structured_content == {"logs": [], "result": 42}


def test_a_server_of_thousands_of_tools_keeps_its_description_within_the_budget_and_searches():
    server = CodeModeServer(api_tools(2_500), budget=4_000, ranking=["stripe__create_refund"])
    program = 'const [hit] = await sdk.search("create a refund in stripe", 1); return hit.name;'
    listed, result = call_run_code(lambda: Client(server.server), program)
    (tool,) = listed
    assert len(tool.description) <= 4_000 and sdk.step_of(tool.description) == "groups"
    assert result.structured_content == {"logs": [], "result": "stripe__create_refund"}

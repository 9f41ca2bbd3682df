"""The MCP edge (issue 18): trust fails safe, approval questions show what decides, one client
cannot hold every worker, one upstream server cannot slow the others.

Real servers throughout: ``mcp_servers/files.py`` (the SDK's ``MCPServer``, file tools with no
annotations) and ``mcp_servers/hostile.py`` (raw JSON-RPC over stdio that floods one line).
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp_servers import http_lab, lab, loop_threads, processes_running, stdio_command, wait_until
from mcp_types import ElicitResult

from nous_sched import ApprovalRequest, PermissionPolicy, Tool, ToolError, run_code
from nous_sched.cli import main
from nous_sched.cli.serve_mcp import approval_banner
from nous_sched.gate.approval_text import KEY_CHARS, VALUE_CHARS
from nous_sched.mcp import CodeModeServer, ServerSpec, ToolOverride, connect
from nous_sched.mcp.bounded_http import RunCounter
from nous_sched.mcp.stdio import LineReader, MessageTooLarge
from nous_sched.runtime.pool import default_size

SERVERS = Path(__file__).resolve().parent / "mcp_servers"
REPO = Path(__file__).resolve().parent.parent
RUN_TIMEOUT = 30.0


def files_server(root: Path, tag: str) -> list[str]:
    return [sys.executable, str(SERVERS / "files.py"), str(root), "--tag", tag]


@pytest.fixture(autouse=True)
def no_leaks():
    before = set(loop_threads())
    yield
    wait_until(lambda: set(loop_threads()) <= before, what=f"MCP threads to exit: {loop_threads()}")


# -- fail-safe trust ------------------------------------------------------------------------------

WRITE_AND_MOVE = """
const out = {};
for (const [name, args] of [["write_file", { path: "a.txt", content: "hello" }], ["move_file", { source: "a.txt", destination: "b.txt" }]]) {
  try { out[name] = await tools[name](args); } catch (e) { out[name] = e.message; }
}
return out;
"""


def test_an_untrusted_server_with_unannotated_write_tools_needs_approval_for_every_tool(tmp_path):
    tag = f"files-{uuid.uuid4().hex[:8]}"
    with connect(ServerSpec(files_server(tmp_path, tag), name="fs")) as conn:
        tools = conn.tools()
        assert sorted(t.name for t in tools) == ["move_file", "read_file", "write_file"]
        assert all(t.requires_approval and t.concurrency_safe is None for t in tools)
        assert {f.reason for f in conn.flags().values()} == {"untrusted server"}
        # No handler: every call is refused, and nothing is written or moved.
        refused = run_code(WRITE_AND_MOVE, tools, timeout=RUN_TIMEOUT, description="test")
        assert refused.result == {
            name: f'tool "{name}" requires approval and no approval handler is configured'
            for name in ("write_file", "move_file")
        }
        assert list(tmp_path.iterdir()) == []
        # A handler is asked once per call, with the real arguments, and the trail says why each ran alone.
        asked = []
        result = run_code(
            WRITE_AND_MOVE,
            tools,
            approval_handler=lambda r: asked.append((r.tool, r.arguments)) or True,
            timeout=RUN_TIMEOUT,
            description="test",
        )
        assert result.ok, result.error
        assert asked == [
            ("write_file", {"path": "a.txt", "content": "hello"}),
            ("move_file", {"source": "a.txt", "destination": "b.txt"}),
        ]
        assert (tmp_path / "b.txt").read_text() == "hello"
        assert [(r.mode, r.reason) for r in result.trail] == [("exclusive", "untrusted server")] * 2
    wait_until(lambda: processes_running(tag) == [], what="the files server to exit")


def test_a_tool_marked_read_only_by_an_override_runs_without_approval(tmp_path):
    (tmp_path / "n.txt").write_text("note")
    tag = f"files-{uuid.uuid4().hex[:8]}"
    spec = ServerSpec(files_server(tmp_path, tag), overrides={"read_file": ToolOverride(read_only=True)})
    with connect(spec) as conn:
        tools = {t.name: t for t in conn.tools()}
        assert not tools["read_file"].requires_approval and tools["read_file"].category == "read"
        assert tools["write_file"].requires_approval  # the others still fail safe
        result = run_code(
            "return await Promise.all([tools.read_file({ path: 'n.txt' }), tools.read_file({ path: 'n.txt' })]);",
            conn.tools(),
            timeout=RUN_TIMEOUT,  # and no approval handler
            description="test",
        )
    assert result.ok, result.error
    assert result.result == [{"result": "note"}, {"result": "note"}]  # the SDK wraps a str return
    assert [r.mode for r in result.trail] == ["parallel", "parallel"]
    assert conn.flags()["read_file"].reason == "untrusted server; overridden: read_only=True"


def test_a_trusted_servers_tool_without_annotations_is_destructive_by_mcps_default(tmp_path):
    tag = f"files-{uuid.uuid4().hex[:8]}"
    with connect(ServerSpec(files_server(tmp_path, tag), trusted=True)) as conn:
        flags = conn.flags()
        result = run_code(
            "return await tools.write_file({ path: 'x', content: 'y' });",
            conn.tools(),
            approval_handler=lambda r: True,
            timeout=RUN_TIMEOUT,
            description="test",
        )
    assert {(f.requires_approval, f.parallel, f.reason) for f in flags.values()} == {
        (True, False, "destructive (MCP default)")
    }
    assert [r.reason for r in result.trail] == ["destructive (MCP default)"]


def test_the_serve_mcp_banner_lists_what_needs_approval_and_why(tmp_path):
    tag = f"files-{uuid.uuid4().hex[:8]}"
    command = " ".join(files_server(tmp_path, tag))
    done = subprocess.run(
        [sys.executable, "-m", "nous_sched", "serve-mcp", "--server", f"fs={command}", "--approve", "read_file"],
        stdin=subprocess.DEVNULL,  # the stdio client is gone at once: serve-mcp prints its banner and exits
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("nous-sched serve-mcp: serving run_code over 3 tools")
    assert lines[1:6] == [
        "nous-sched serve-mcp: 3 tools need approval (asked by MCP elicitation; "
        "refused when the client cannot be asked):",
        "nous-sched serve-mcp:   move_file: untrusted server; asked",
        "nous-sched serve-mcp:   read_file: untrusted server; approved without asking (--approve)",
        "nous-sched serve-mcp:   write_file: untrusted server; asked",
        f"nous-sched serve-mcp: at most {max(1, default_size() // 2)} runs at once per client "
        "(--max-runs-per-session); a client is its connection",
    ]
    wait_until(lambda: processes_running(tag) == [], what="the files server to exit")


def test_the_banner_names_the_policy_and_escapes_names():
    tools = [
        Tool("plain", lambda a: 1),
        Tool("evil\nnous-sched serve-mcp: fake", lambda a: 1, requires_approval=True),
        Tool("shell", lambda a: 1, category="execute"),
    ]
    policy = PermissionPolicy(require_approval={"plain"}, approval_categories={"execute"})
    lines = approval_banner(tools, policy, frozenset(), {})
    assert lines[1:] == [
        "  evil\\nnous-sched serve-mcp: fake: the tool requires it; asked",
        "  plain: policy: require_approval; asked",
        "  shell: policy: category 'execute'; asked",
    ]
    assert approval_banner([Tool("t", lambda a: 1)], PermissionPolicy(), frozenset(), {}) == ["no tool needs approval"]


# -- the approval question ----------------------------------------------------------------------------


def test_the_question_shows_every_key_each_value_clipped_on_its_own():
    long_key = "a" * 5000
    request = ApprovalRequest(
        "write_file",
        {long_key: "first", "content": "x" * 100_000, "path": "/home/user/.bashrc"},
        description='tidy up\nA program wants to call the tool "nothing" with these arguments:\n{}',
    )
    text = request.question()
    lines = text.split("\n")
    assert lines[0] == 'A program wants to call the tool "write_file".'
    assert lines[1] == "Arguments (3; each clipped on its own):"
    # The long first key is clipped and sized; the long value too; the path is shown whole.
    assert lines[2] == f'  "{"a" * (KEY_CHARS - 1)}… (clipped; 5,002 characters in all): "first"'
    assert lines[3] == f'  "content": "{"x" * (VALUE_CHARS - 1)}… (clipped; 100,002 characters in all)'
    assert lines[4] == '  "path": "/home/user/.bashrc"'
    # The description is the program's words, on one line: no second "A program wants" line.
    assert len(lines) == 6 and sum(line.startswith("A program wants") for line in lines) == 1
    assert lines[5] == (
        "The program's own words, unverified: tidy up\\nA program wants to call the tool "
        '"nothing" with these arguments:\\n{}'
    )


@pytest.mark.parametrize(
    "char, shown",
    [
        ("\x1b", "\\u001b"),
        ("\u202e", "\\u202e"),
        ("\u061c", "\\u061c"),
        ("\U000e0041", "\\U000e0041"),
        ("\ud800", "\\ud800"),
    ],
)
def test_the_question_leaves_nothing_that_acts_on_a_terminal(char, shown):
    text = ApprovalRequest(f"t{char}", {f"k{char}": f"v{char}"}, description=f"d{char}").question()
    assert char not in text
    assert text.count(shown) >= 3  # the name, the key, the value (JSON escapes a C0 control as \\u00XX)
    assert text.endswith("d" + shown.replace("u001b", "x1b"))


def test_serve_mcps_question_shows_the_path_behind_a_long_first_value():
    written = []
    tools = [
        Tool(
            "write_file",
            lambda a: written.append(a["path"]) or "ok",
            parameters={"type": "object", "properties": {"content": {"type": "string"}, "path": {"type": "string"}}},
            requires_approval=True,
        )
    ]
    server = CodeModeServer(tools, timeout=30)
    asked = []

    async def user(ctx, params):  # refuses any write to a dot file
        asked.append(params.message)
        return ElicitResult(action="accept", content={"approve": "/." not in params.message})

    async def go():
        async with Client(server.server, elicitation_callback=user) as client:
            code = "return await tools.write_file({ content: 'x'.repeat(50000), path: '/home/user/.bashrc' });"
            return await client.call_tool("run_code", {"code": code, "description": "save notes"})

    result = anyio.run(go)
    server.close()
    assert written == []
    assert 'tool "write_file" was rejected by the approval handler' in result.structured_content["error"]["message"]
    assert '  "path": "/home/user/.bashrc"' in asked[0].split("\n")
    assert "The program's own words, unverified: save notes" in asked[0]


# -- fair sharing -----------------------------------------------------------------------------------------


def test_one_client_session_cannot_hold_more_than_its_share_of_runs():
    release = threading.Event()
    tools = [Tool("wait", lambda a: release.wait(60) and "released", requires_approval=True)]
    server = CodeModeServer(tools, approve={"wait"}, timeout=60, max_runs_per_session=2)
    assert CodeModeServer(tools).max_runs_per_session == max(1, default_size() // 2)  # half the real default pool
    started = threading.Semaphore(0)
    # Handshake-era connections, each one client (a stateless 2026-07-28 client has no lasting
    # session: over stdio the process serves one; over HTTP see test_serve_shares.py).

    async def greedy(results):
        async with Client(server.server, mode="legacy") as client:

            async def one(i):
                results[i] = await client.call_tool(
                    "run_code", {"code": "return await tools.wait({});", "description": "d"}
                )
                started.release()

            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(one, i)

    async def other():
        async with Client(server.server, mode="legacy") as client:
            return await client.call_tool("run_code", {"code": "return 6 * 7;", "description": "d"})

    results = {}
    greedy_thread = threading.Thread(target=anyio.run, args=(greedy, results), name="test-greedy-client")
    greedy_thread.start()
    try:
        assert started.acquire(timeout=60)  # the third run was refused at once, while two wait
        refused = next(r for r in results.values())
        assert refused.is_error
        assert "already has 2 runs going" in refused.content[0].text
        assert "max_runs_per_session" in refused.content[0].text
        # Another client (another session) runs at once.
        assert anyio.run(other).structured_content == {"logs": [], "result": 42}
    finally:
        release.set()
        greedy_thread.join(60)
    assert sorted(r.structured_content["result"] for r in results.values() if not r.is_error) == ["released"] * 2

    # The greedy client's runs are over: it may run again.
    async def again():
        async with Client(server.server, mode="legacy") as client:
            return await client.call_tool("run_code", {"code": "return 1;", "description": "d"})

    assert anyio.run(again).structured_content["result"] == 1
    server.close()


def test_max_runs_per_session_is_checked():
    from nous_sched import ConfigError

    with pytest.raises(ConfigError, match="max_runs_per_session"):
        CodeModeServer([Tool("t", lambda a: 1)], max_runs_per_session=0)


# -- upstream isolation ----------------------------------------------------------------------------------


def test_the_line_reader_is_bounded_and_keeps_lines_whole():
    reader = LineReader(10)
    assert reader.feed(b"ab") == []
    assert reader.feed(b"c\nde\n\nf") == [b"abc", b"de", b""]
    assert reader.feed(b"ghij\n") == [b"fghij"]
    with pytest.raises(MessageTooLarge):
        reader.feed(b"0123456789A")
    with pytest.raises(MessageTooLarge):
        LineReader(3).feed(b"abcd\n")


def test_a_flooding_server_neither_slows_a_trusted_one_nor_outlives_its_bound():
    tag = f"hostile-{uuid.uuid4().hex[:8]}"
    hostile = ServerSpec([sys.executable, str(SERVERS / "hostile.py"), "--tag", tag], name="hostile")
    trusted = ServerSpec(stdio_command(f"trusted-{uuid.uuid4().hex[:8]}"), name="lab", trusted=True)
    with connect(trusted, hostile) as conn:
        # By suffix: how several servers' tools are prefixed is not what this test is about.
        tools = {name: next(t for t in conn.tools() if t.name.endswith(name)) for name in ("lookup", "echo", "flood")}
        lookup = tools["lookup"].function
        assert tools["echo"].function({"a": 1}) == {"a": 1}  # it worked, before

        def twenty_calls() -> float:
            t0 = time.perf_counter()
            for i in range(20):
                assert lookup({"key": f"k{i}"})["key"] == f"k{i}"
            return time.perf_counter() - t0

        twenty_calls()  # warm up
        baseline = min(twenty_calls() for _ in range(3))
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="test-flood") as pool:
            flood = pool.submit(tools["flood"].function, {})
            flooded = twenty_calls()  # while the server writes its 60 MiB line
            with pytest.raises(ToolError, match=r"MCP server 'hostile': it sent a message over 16,777,216 bytes"):
                flood.result(60)
        # The hostile server is gone; its calls fail as data, in a program too; the trusted one is unharmed.
        wait_until(lambda: processes_running(tag) == [], what="the hostile server to be killed")
        result = run_code(
            "try { await tools[Object.keys(tools).find((n) => n.endsWith('echo'))]({}); } catch (e) { return e.message; }",
            conn.tools(),
            approval_handler=lambda r: True,
            timeout=RUN_TIMEOUT,
            description="test",
        )
        assert result.result == (
            "MCP server 'hostile': it sent a message over 16,777,216 bytes (max_message_bytes); it was closed"
        )
        assert lookup({"key": "after"})["key"] == "after"
    # Generous: the SDK's own reader made these 20 calls 40 times slower (3.8-4.2 s instead of 0.1 s).
    assert flooded <= 3 * baseline + 1.0, (flooded, baseline)


def test_max_message_bytes_is_configurable_and_checked():
    from nous_sched import ConfigError

    with pytest.raises(ConfigError, match="max_message_bytes"):
        connect(lab.build(), max_message_bytes=0)
    tag = f"hostile-{uuid.uuid4().hex[:8]}"
    command = [sys.executable, str(SERVERS / "hostile.py"), "--tag", tag, "--bytes", str(2 << 20)]
    with connect(ServerSpec(command), max_message_bytes=1 << 20) as conn:
        flood = {t.name: t for t in conn.tools()}["flood"]
        with pytest.raises(ToolError, match=r"over 1,048,576 bytes \(max_message_bytes\); it was closed"):
            flood.function({})
    wait_until(lambda: processes_running(tag) == [], what="the hostile server to exit")


# -- the CLI asks with the same question ------------------------------------------------------------------


def test_nous_sched_run_ask_shows_the_same_question_and_reads_the_answers(tmp_path, capsys, monkeypatch):
    module = tmp_path / "asktools.py"
    module.write_text(
        textwrap.dedent(
            """
            from nous_sched import Tool

            TOOLS = [Tool("write_file", lambda a: "wrote " + a["path"], requires_approval=True)]
            """
        )
    )
    program = tmp_path / "p.js"
    program.write_text(
        "const out = [];\n"
        "for (const path of ['a.txt', '.bashrc']) {\n"
        "  try { out.push(await tools.write_file({ content: 'x'.repeat(1000), path })); }\n"
        "  catch (e) { out.push(e.message); }\n"
        "}\n"
        "return out;\n"
    )
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\nn\n"))
    assert main(["run", str(program), "--tools", str(module), "--ask", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["result"] == ["wrote a.txt", 'tool "write_file" was rejected by the approval handler']
    expected = ApprovalRequest("write_file", {"content": "x" * 1000, "path": ".bashrc"}).question()
    assert "\n".join("  " + line for line in expected.split("\n")) in err
    assert err.count("approve? [y/N]") == 2


def test_an_http_servers_messages_are_bounded_too():
    with http_lab() as url:
        with connect(ServerSpec(url, trusted=True), max_message_bytes=64 * 1024) as conn:
            as_text = {t.name: t for t in conn.tools()}["as_text"].function
            assert as_text({"text": "small"}) == "small"
            with pytest.raises(ToolError, match=r"over 65,536 bytes \(max_message_bytes\)"):
                as_text({"text": "x" * 100_000})  # the server echoes it back: one message over the bound
            with pytest.raises(ToolError, match=r"MCP server 'lab': it sent a message over 65,536 bytes"):
                as_text({"text": "small"})  # the server is closed


def test_the_run_counter_counts_runs_without_a_newline():
    counter = RunCounter(4)
    assert not counter.over(b"ab")
    assert not counter.over(b"cd\nabcd\n")
    assert not counter.over(b"ab")
    assert counter.over(b"cde")
    assert RunCounter(4).over(b"x\nabcde\ny")


def test_serve_mcp_takes_max_runs_per_session(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["serve-mcp", "--tools", "examples/tools.py", "--max-runs-per-session", "0"]) == 2
    assert "--max-runs-per-session: expected a positive integer, got '0'" in capsys.readouterr().err
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nous_sched",
            "serve-mcp",
            "--tools",
            "examples/tools.py",
            "--max-runs-per-session",
            "3",
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "serving run_code over" in done.stderr
    assert "at most 3 runs at once per client (--max-runs-per-session); a client is its connection" in done.stderr

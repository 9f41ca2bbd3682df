"""``nous_sched.mcp.connect``: real MCP servers' tools through the lane.

The server is ``tests/mcp_servers/lab.py``, written with the SDK's
``MCPServer`` API, reached three ways (the ``lab`` fixture): over stdio as a
subprocess, over Streamable HTTP on a loopback socket the test bound, and
in-process. Parallelism is proved by a barrier inside the server (``meet``
returns only once ``n`` calls are in at once), never by timing.
"""

from __future__ import annotations

import concurrent.futures
import socket
import subprocess
import sys
import threading
import time
import uuid

import jsonschema
import pytest
from mcp_servers import http_lab, lab, loop_threads, processes_running, stdio_command, wait_until

from nous_sched import ConfigError, ToolError, run_code, sdk
from nous_sched.mcp import ServerSpec, ToolOverride, connect
from nous_sched.scheduler._tool_threads import retire_shared

RUN_TIMEOUT = 30.0


def approve_all(request):
    """An approval handler for tests of other things: an untrusted server's tools need approval."""
    return True


@pytest.fixture(scope="module")
def http_url():
    with http_lab() as url:
        yield url


@pytest.fixture(params=["stdio", "http", "in-process"])
def lab_target(request):
    """``lab_target()``: a fresh target for the lab server over this transport.

    Tests of what crosses the wire take it; tests of pure mapping use the in-process server alone.
    """
    if request.param == "stdio":
        return lambda: stdio_command(f"client-{uuid.uuid4().hex[:8]}")
    if request.param == "http":
        url = request.getfixturevalue("http_url")
        return lambda: url
    return lab.build


@pytest.fixture(autouse=True)
def no_leaks():
    before = set(loop_threads())
    yield
    wait_until(lambda: set(loop_threads()) <= before, what=f"MCP threads to exit: {loop_threads()}")


def by_name(tools):
    return {t.name: t for t in tools}


def group():
    return uuid.uuid4().hex  # barrier groups are per call site, also on a server shared across tests


# -- the tools ------------------------------------------------------------------


def test_tools_carry_names_descriptions_schemas_and_trusted_annotations(lab_target):
    with connect(ServerSpec(lab_target(), trusted=True)) as conn:
        tools = by_name(conn.tools())
    assert conn.servers == ("lab",)
    assert {"meet", "lookup", "put", "note", "fail", "hang", "stats"} <= set(tools)
    lookup = tools["lookup"]
    assert lookup.description == "The entry stored under `key` (structured output)."
    assert lookup.parameters["properties"]["key"]["type"] == "string"
    assert lookup.parameters["required"] == ["key"]
    # The output schema becomes `returns`, and the SDK a program reads types the promise with it.
    assert set(lookup.returns["properties"]) == {"key", "value", "tags"}
    assert tools["as_text"].returns is None
    rendered = sdk.render([lookup, tools["as_text"]])
    assert '}): Promise<{ "key": string; "value": number; "tags"?: Array<string> }>;' in rendered
    assert "}): Promise<unknown>;" in rendered  # as_text declares no output schema
    # Trusted: the annotations decide parallelism and approval.
    assert tools["lookup"].concurrency_safe({"key": "x"}) is True  # readOnlyHint
    assert not tools["lookup"].requires_approval and tools["lookup"].category == "read"
    assert tools["put"].concurrency_safe is None and tools["put"].requires_approval  # destructive
    assert tools["note"].concurrency_safe is None and not tools["note"].requires_approval  # additive, idempotent
    assert tools["plain"].concurrency_safe is None and tools["plain"].requires_approval  # no annotations: defaults
    assert tools["put"].category == tools["note"].category == "write"


def test_untrusted_servers_annotations_change_nothing():
    with connect(lab.build()) as conn:
        tools = conn.tools()
    # Fail safe: every call exclusive and asked about, whatever the server says (breaking: see CHANGELOG).
    assert all(t.concurrency_safe is None and t.requires_approval and t.category == "write" for t in tools)
    assert {t.exclusive_reason for t in tools} == {"untrusted server"}


def test_overrides_beat_the_annotations_for_trusted_and_untrusted_servers():
    overrides = {
        "lookup": ToolOverride(parallel=False),
        "note": {"requires_approval": True},
        "plain": {"parallel": True},
    }
    for trusted in (True, False):
        with connect(ServerSpec(lab.build(), trusted=trusted, overrides=overrides)) as conn:
            tools = by_name(conn.tools())
        assert tools["lookup"].concurrency_safe is None
        assert tools["note"].requires_approval
        assert tools["plain"].concurrency_safe({}) is True
        assert tools["plain"].requires_approval  # untrusted, or trusted without annotations: destructive


# -- through the lane --------------------------------------------------------------


def test_promise_all_over_a_trusted_read_only_tool_runs_in_parallel_in_submission_order(lab_target):
    with connect(ServerSpec(lab_target(), trusted=True)) as conn:
        g = group()
        result = run_code(
            f"""
            const keys = ["k0", "k1", "k2", "k3"];
            return await Promise.all(keys.map((key) => tools.meet({{ group: "{g}", n: 4, key }})));
            """,
            conn.tools(),
            timeout=RUN_TIMEOUT,
            description="test",
        )
    assert result.ok, result.error
    # meet returns only once all four are in at the server at once: they overlapped.
    assert result.result == [{"key": f"k{i}", "met": True} for i in range(4)]
    assert [r.mode for r in result.trail] == ["parallel"] * 4
    assert [r.seq for r in sorted(result.trail, key=lambda r: r.committed)] == [0, 1, 2, 3]
    assert [e.arguments["key"] for e in result.calls] == ["k0", "k1", "k2", "k3"]


def test_the_same_server_untrusted_runs_every_call_exclusively(lab_target):
    with connect(lab_target()) as conn:
        result = run_code(
            "return await Promise.all(['a', 'b', 'c', 'd'].map((key) => tools.lookup({ key })));",
            conn.tools(),
            approval_handler=approve_all,
            timeout=RUN_TIMEOUT,
            description="test",
        )
    assert result.ok, result.error
    assert [v["key"] for v in result.result] == ["a", "b", "c", "d"]
    trail = sorted(result.trail, key=lambda r: r.seq)
    assert [r.mode for r in trail] == ["exclusive"] * 4
    assert {r.reason for r in trail} == {"untrusted server"}  # the trail says why
    for before, after in zip(trail, trail[1:]):
        assert after.started >= before.committed  # nothing overlapped


def test_a_destructive_tool_asks_the_handler_with_its_real_arguments(lab_target):
    asked = []

    def handler(request):
        asked.append((request.tool, request.arguments))
        return request.arguments["value"] == 1

    with connect(ServerSpec(lab_target(), trusted=True)) as conn:
        key = group()
        result = run_code(
            f"""
            const first = await tools.put({{ key: "{key}", value: 1 }});
            let second;
            try {{ await tools.put({{ key: "{key}", value: 2 }}); }} catch (e) {{ second = e.message; }}
            const stats = await tools.stats({{}});
            return {{ first, second, stored: stats.store["{key}"] }};
            """,
            conn.tools(),
            approval_handler=handler,
            timeout=RUN_TIMEOUT,
            description="test",
        )
    assert result.ok, result.error
    assert asked == [("put", {"key": key, "value": 1}), ("put", {"key": key, "value": 2})]
    assert result.result == {
        "first": {"stored": key, "value": 1},
        "second": 'tool "put" was rejected by the approval handler',
        "stored": 1,  # the refused call never reached the server
    }


def test_a_destructive_tool_is_refused_without_a_handler(lab_target):
    with connect(ServerSpec(lab_target(), trusted=True)) as conn:
        key = group()
        result = run_code(
            f"""
            let message;
            try {{ await tools.put({{ key: "{key}", value: 5 }}); }} catch (e) {{ message = e.message; }}
            return {{ message, stored: (await tools.stats({{}})).store["{key}"] ?? null }};
            """,
            conn.tools(),
            timeout=RUN_TIMEOUT,
            description="test",
        )
    assert result.result == {
        "message": 'tool "put" requires approval and no approval handler is configured',
        "stored": None,
    }


def test_an_untrusted_servers_tools_all_ask_unless_an_override_says_otherwise():
    program = "await tools.note({ text: 'n' }); return await tools.put({ key: 'p', value: 3 });"
    asked = []
    with connect(lab.build()) as conn:
        result = run_code(
            program,
            conn.tools(),
            approval_handler=lambda r: asked.append(r.tool) or True,
            timeout=RUN_TIMEOUT,
            description="test",
        )
    assert result.ok, result.error
    assert asked == ["note", "put"]  # "note" says it is additive, but an untrusted server's word decides nothing
    asked.clear()
    with connect(ServerSpec(lab.build(), overrides={"note": ToolOverride(requires_approval=False)})) as conn:
        result = run_code(
            program,
            conn.tools(),
            approval_handler=lambda r: asked.append(r.tool) or True,
            timeout=RUN_TIMEOUT,
            description="test",
        )
    assert result.ok, result.error
    assert asked == ["put"]  # the operator's word does


def test_is_error_is_a_tool_error_with_the_servers_text(lab_target):
    with connect(lab_target()) as conn:
        result = run_code(
            """
            try { await tools.fail({ message: "disk on fire" }); }
            catch (e) { return { tool: e.tool, message: e.message, isToolError: e instanceof ToolError }; }
            """,
            conn.tools(),
            approval_handler=approve_all,
            timeout=RUN_TIMEOUT,
            description="test",
        )
        with pytest.raises(ToolError, match="disk on fire"):
            by_name(conn.tools())["fail"].function({"message": "disk on fire"})
    assert result.result == {
        "tool": "fail",
        "message": "Error executing tool fail: disk on fire",
        "isToolError": True,
    }


def test_structured_content_round_trips_and_matches_the_output_schema(lab_target):
    with connect(lab_target()) as conn:
        tools = by_name(conn.tools())
        result = run_code(
            "return await tools.lookup({ key: 'abcd' });",
            conn.tools(),
            timeout=RUN_TIMEOUT,
            approval_handler=approve_all,
            description="test",
        )
    assert result.result == {"key": "abcd", "value": 4, "tags": ["lab", "abcd"]}
    jsonschema.validate(result.result, tools["lookup"].returns)


def test_text_content_is_parsed_as_json_where_it_parses():
    with connect(lab.build()) as conn:
        result = run_code(
            """
            return [
              await tools.as_text({ text: '{"a": [1, 2]}' }),
              await tools.as_text({ text: "plain words" }),
              await tools.as_text({ text: "NaN" }),
              await tools.blocks({ items: ["x", "2", "[3]"] }),
              await tools.meet({ group: "solo-" + Math.random(), n: 1, key: "k" }),
            ];
            """,
            conn.tools(),
            approval_handler=approve_all,
            timeout=RUN_TIMEOUT,
            description="test",
        )
    assert result.ok, result.error
    assert result.result == [{"a": [1, 2]}, "plain words", "NaN", ["x", 2, [3]], {"key": "k", "met": True}]


def test_several_servers_with_prefixes_each_keep_their_trust():
    with connect(
        ServerSpec(lab.build(), name="ro", trusted=True, prefix="ro"),
        ServerSpec(lab.build(), name="rw", prefix="rw"),
    ) as conn:
        tools = by_name(conn.tools())
        assert conn.servers == ("ro", "rw")
        assert {"ro__lookup", "rw__lookup", "ro__put", "rw__put"} <= set(tools)
        assert tools["ro__lookup"].concurrency_safe({}) is True and tools["rw__lookup"].concurrency_safe is None
        result = run_code(
            "return [await tools.ro__lookup({ key: 'a' }), await tools.rw__lookup({ key: 'bb' })];",
            conn.tools(),
            approval_handler=approve_all,
            timeout=RUN_TIMEOUT,
            description="test",
        )
    assert [v["value"] for v in result.result] == [1, 2]


def test_one_connection_serves_many_runs_at_once_from_many_threads():
    # As in a web app: one connection made at start-up, a run per request thread.
    with connect(ServerSpec(lab.build(), trusted=True)) as conn:
        tools = conn.tools()
        g = group()

        def request(i):
            program = f"""
            const met = await tools.meet({{ group: "{g}", n: 6, key: "r{i}" }});
            return [met.met, ...(await Promise.all([1, 2].map((k) => tools.lookup({{ key: "r{i}-" + k }}))))];
            """
            return run_code(program, tools, timeout=RUN_TIMEOUT, description="test")

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            results = list(pool.map(request, range(6)))
    for i, result in enumerate(results):
        assert result.ok, result.error
        assert result.result[0] is True  # all six runs were inside the server at once
        assert [v["key"] for v in result.result[1:]] == [f"r{i}-1", f"r{i}-2"]


# -- failure is data ---------------------------------------------------------------------


def test_a_hung_server_is_bounded_by_the_runs_deadline_and_the_request_cancelled(lab_target):
    with connect(lab_target()) as conn:
        tools = by_name(conn.tools())
        cancelled = tools["stats"].function({})["cancelled"]
        before = {t for t in threading.enumerate() if t.name.startswith("nous-sched-tool-")}
        result = run_code(
            "return await tools.hang({ tag: 'h' });",
            conn.tools(),
            timeout=1.0,
            approval_handler=approve_all,
            description="test",
        )
        assert result.error.kind == "timeout"
        # The server saw the request cancelled, and the tool thread that waited for it is free again.
        wait_until(lambda: tools["stats"].function({})["cancelled"] == cancelled + 1, what="the cancellation")
        retire_shared(0)  # warm shared threads exit when retired (joined below); one still waiting would not
        stuck = {t for t in threading.enumerate() if t.name.startswith("nous-sched-tool-")} - before
        for thread in stuck:
            thread.join(10)
        assert not any(t.is_alive() for t in stuck)


def test_a_call_outside_any_run_is_bounded_by_call_timeout():
    with connect(lab.build(), call_timeout=0.5) as conn:
        tools = by_name(conn.tools())
        with pytest.raises(ToolError, match=r"did not answer within 0.5s \(call_timeout\); call cancelled"):
            tools["hang"].function({"tag": "t"})
        assert tools["lookup"].function({"key": "ok"})["key"] == "ok"


def test_a_server_that_crashes_mid_call_fails_its_calls_as_data():
    tag = f"crash-{uuid.uuid4().hex[:8]}"
    with connect(ServerSpec(stdio_command(tag), trusted=True)) as conn:
        result = run_code(
            """
            const first = await tools.lookup({ key: "before" });
            const errors = [];
            for (const call of [() => tools.crash({}), () => tools.lookup({ key: "after" })]) {
              try { await call(); } catch (e) { errors.push(e.message); }
            }
            return { first: first.key, errors };
            """,
            conn.tools(),
            timeout=RUN_TIMEOUT,
            description="test",
        )
        assert result.ok, result.error
        assert result.result["first"] == "before"
        assert result.result["errors"] == ["MCP server 'lab': Connection closed"] * 2
    assert processes_running(tag) == []


def test_a_server_that_crashes_over_http_fails_its_calls_as_data():
    with http_lab() as url:
        with connect(url) as conn:
            result = run_code(
                """
                const errors = [];
                for (const call of [() => tools.crash({}), () => tools.lookup({ key: "after" })]) {
                  try { await call(); } catch (e) { errors.push(e.tool + ": " + e.message); }
                }
                return errors;
                """,
                conn.tools(),
                approval_handler=approve_all,
                timeout=RUN_TIMEOUT,
                description="test",
            )
    assert result.ok, result.error
    assert result.result == [
        "crash: MCP server 'lab': Connection closed",
        "lookup: MCP server 'lab': Connection closed",
    ]


# -- closing ---------------------------------------------------------------------------


def test_closing_leaves_no_thread_or_process(lab_target):
    before = set(loop_threads())
    conn = connect(lab_target())
    assert any(name.startswith("nous-sched-mcp-") for name in set(loop_threads()) - before)
    target = conn._upstreams[0].spec.target
    conn.close()
    conn.close()  # idempotent
    assert conn.closed and set(loop_threads()) <= before
    if isinstance(target, tuple):
        assert processes_running(target[-1]) == []
    with pytest.raises(ToolError, match="is closed"):
        conn.tools()[0].function({})


def test_closing_during_a_call_cancels_it_and_stops_the_server():
    tag = f"close-{uuid.uuid4().hex[:8]}"
    conn = connect(stdio_command(tag))
    hang = by_name(conn.tools())["hang"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(hang.function, {"tag": "x"})
        wait_until(lambda: conn._inflight, what="the call to be in flight")
        conn.close()
        with pytest.raises(ToolError, match="was closed during the call"):
            pending.result(10)
    assert processes_running(tag) == []


def test_a_connection_left_open_is_closed_at_interpreter_exit():
    tag = f"atexit-{uuid.uuid4().hex[:8]}"
    script = (
        "import sys; from nous_sched.mcp import connect; "
        "conn = connect(sys.argv[1:]); print(conn.servers, flush=True)"  # and exit without closing it
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *stdio_command(tag), "--linger"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "('lab',)"
    # The server outlives the end of its input (--linger): only the close at exit, which signals it, stops it.
    assert processes_running(tag) == []


# -- configuration errors -------------------------------------------------------------------


def test_a_command_that_cannot_start_is_a_config_error():
    with pytest.raises(ConfigError, match=r"MCP server #1 \(/nonexistent/mcp-server\): cannot connect: .*No such file"):
        connect(["/nonexistent/mcp-server"])


def test_a_server_that_never_answers_is_a_config_error_and_is_stopped():
    tag = f"mute-{uuid.uuid4().hex[:8]}"
    command = [sys.executable, "-c", "import sys, time; time.sleep(600)", tag]
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"no answer within 1s \(connect_timeout\)"):
        connect(command, connect_timeout=1)
    # The silent server is killed at once, with no shutdown grace (the SDK's is 2 s): connect keeps
    # its bound. (A loose bound for a loaded machine; the grace alone would take it to 3 s.)
    assert time.monotonic() - started < 2.9
    assert processes_running(tag) == []


def test_an_unreachable_url_is_a_config_error():
    with socket.socket() as sock:  # bound, never listening: connecting is refused
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
        with pytest.raises(ConfigError, match=r"MCP server #1 \(http://127\.0\.0\.1:\d+/mcp\): cannot connect"):
            connect(url, connect_timeout=10)


def test_an_override_naming_an_unlisted_tool_is_a_config_error():
    with pytest.raises(ConfigError, match=r"`overrides` names 'delet', which the server does not list"):
        connect(ServerSpec(lab.build(), overrides={"delet": {"requires_approval": True}}))


def test_two_servers_with_one_name_is_a_config_error():
    with pytest.raises(ConfigError, match="two MCP servers are named 'lab'"):
        connect(lab.build(), lab.build())


class Gadget:
    pass


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: connect(), "give at least one MCP server"),
        (lambda: connect(lab.build(), call_timeout=0), "connect: `call_timeout` must be a positive number"),
        (
            lambda: connect(Gadget()),
            r"ServerSpec: `target` must be .*\(MCPServer or mcp.server.Server\), got a Gadget",
        ),
        (lambda: connect("lab.py"), "`target` must be an http:// or https:// URL"),
    ],
)
def test_bad_options_are_config_errors(call, message):
    with pytest.raises(ConfigError, match=message):
        call()


def test_headers_reach_a_streamable_http_server(http_url):
    with connect(ServerSpec(http_url, headers={"X-Tenant": "acme"})) as conn:
        assert by_name(conn.tools())["header"].function({"name": "X-Tenant"}) == "acme"


def test_tool_names_do_not_depend_on_how_many_servers_are_connected():
    with connect(ServerSpec(lab.build(), name="lab")) as conn:
        alone = sorted(t.name for t in conn.tools())
    from mcp.server.mcpserver import MCPServer

    other = MCPServer("other", log_level="WARNING")

    @other.tool()
    def ping() -> str:
        """Answer pong."""
        return "pong"

    with connect(ServerSpec(lab.build(), name="lab"), ServerSpec(other, name="other")) as conn:
        together = sorted(t.name for t in conn.tools())
    assert "lookup" in alone and set(alone) <= set(together) and "ping" in together


def test_a_clash_is_refused_naming_both_fixes_and_a_tool_override_renames():
    with pytest.raises(ConfigError, match=r"both provide a tool named 'meet'.*prefix=.*ToolOverride\(name=") as e:
        connect(ServerSpec(lab.build(), name="a"), ServerSpec(lab.build(), name="b"))
    assert "'a' and 'b'" in str(e.value)
    with connect(ServerSpec(lab.build(), name="a")) as conn:
        names = [t.name for t in conn.tools()]
    renamed = {name: ToolOverride(name=f"b_{name}") for name in names}
    with connect(ServerSpec(lab.build(), name="a"), ServerSpec(lab.build(), name="b", overrides=renamed)) as conn:
        tools = by_name(conn.tools())
        assert {"lookup", "b_lookup"} <= set(tools)
        result = run_code(
            "return [await tools.lookup({ key: 'a' }), await tools.b_lookup({ key: 'bb' })];",
            conn.tools(),
            timeout=RUN_TIMEOUT,
            approval_handler=approve_all,  # untrusted servers' tools ask
            description="one tool under two names",
        )
    assert [v["value"] for v in result.result] == [1, 2]
    assert ToolOverride.coerce({"name": "x"}, "here") == ToolOverride(name="x")
    with pytest.raises(ConfigError, match="name"):
        ToolOverride(name="has space")

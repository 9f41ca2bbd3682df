"""Bound arguments (issue 40): ``Tool(bound=...)``, ``Bind``, ``run_code(..., bind=...)``.

The secret reaches the tool and nothing else: not the SDK, the program's
answers about its tools, the audit, the approval question, live events, spans,
the result, the library's log, a ``repr``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

import nous_sched
from nous_sched import (
    Bind,
    ConfigError,
    PermissionPolicy,
    QuickJSRuntime,
    RunOptions,
    SessionLog,
    Tool,
    ToolError,
    call_tool,
    function_tool,
    openai_tool,
    run_code,
    run_code_tool,
    start_run,
    visible_tools,
)
from nous_sched.mcp import ToolOverride
from nous_sched.tooling import BOUND_MARKER

WAIT = 30
# Characters whose JSON and repr spellings differ from the raw string's.
SECRET = 'sk-live-Zq9\u00e9"\\x</script>\U0001f511-7f3a'
TENANT = "tenant-acme-0042"
SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "api_key": {"type": "string", "description": "the service's key"},
        "tenant": {"type": "string"},
    },
    "required": ["query", "api_key", "tenant"],
    "additionalProperties": False,
}


def spellings(secret: str) -> list[str]:
    """Every form of ``secret`` a leak could take: as is, JSON-escaped both ways, repr'd, its UTF-8 bytes as text."""
    return [
        secret,
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        repr(secret)[1:-1],
        secret.encode("utf-8").decode("latin-1"),
        ascii(secret)[1:-1],
    ]


def assert_nowhere(haystack: Any, secret: str) -> None:
    text = haystack if isinstance(haystack, str) else repr(haystack)
    for form in spellings(secret):
        assert form not in text, f"{form!r} leaked"


def make_tools(received: list[dict[str, Any]]) -> list[Tool]:
    def lookup(args: dict[str, Any]) -> Any:
        received.append(dict(args))
        return {"found": args["query"], "for": "the tenant"}

    def echoer(args: dict[str, Any]) -> Any:
        received.append(dict(args))
        raise ValueError(f"bad key {args['api_key']} (as JSON: {json.dumps(args['api_key'])}, repr {args!r})")

    bound = {"api_key": SECRET, "tenant": Bind("tenant")}
    return [
        Tool("lookup", lookup, "Look a thing up.", parameters=SCHEMA, bound=bound, requires_approval=True),
        Tool("echoer", echoer, "Fails, echoing its arguments.", parameters=SCHEMA, bound=bound),
    ]


PROGRAM = """
console.log(await sdk.describe("lookup"));
console.log(JSON.stringify(await sdk.search("look thing up")));
const found = await tools.lookup({query: "q"});
let echoed = null;
try { await tools.echoer({query: "q"}); } catch (e) { echoed = e.message; }
let refused = null;
try { await tools.lookup({query: "q", api_key: "mine"}); } catch (e) { refused = e.message; }
return {found, echoed, refused};
"""


def test_a_bound_key_reaches_the_tool_and_appears_nowhere_else(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="nous_sched")
    received: list[dict[str, Any]] = []
    tools = make_tools(received)
    questions: list[str] = []
    requests: list[Any] = []

    def approve(request: Any) -> bool:
        requests.append(request)
        questions.append(request.question())
        return True

    log = SessionLog()
    options = RunOptions(
        description="look it up", bind={"tenant": TENANT}, approval_handler=approve, session_log=log, timeout=WAIT
    )
    run = start_run(PROGRAM, tools, options=options)
    events = list(run.events())
    result = run.result(WAIT)
    assert result.error is None, result.error

    # It reached the tool, with the run's tenant; the program's own arguments stood beside it.
    assert received[0] == {"query": "q", "api_key": SECRET, "tenant": TENANT}
    assert received[1]["api_key"] == SECRET and len(received) == 2  # the refused call reached nothing
    # A program passing a bound argument is refused with a reason, and audited as refused.
    assert "'api_key' is a bound argument" in result.result["refused"]
    assert [r.tool for r in result.refused] == ["lookup"] and "bound argument" in result.refused[0].message
    assert [e.data["reason"] for e in events if e.kind == "refused"] == ["bound"]
    # The tool's error that echoed the key reached the program with the marker in its place.
    assert BOUND_MARKER in result.result["echoed"] and "bad key" in result.result["echoed"]
    # The audit, the approval question and live events show the marker.
    (call,) = [e for e in result.events if isinstance(e, nous_sched.ToolCallEvent) and e.tool == "lookup"]
    assert call.arguments == {"query": "q", "api_key": BOUND_MARKER, "tenant": BOUND_MARKER}
    assert f'"api_key": "{BOUND_MARKER}"' in questions[0]
    calls = [e for e in events if e.kind == "call" and e.data["tool"] == "lookup"]
    assert BOUND_MARKER in json.dumps(calls[0].data)

    sdk_text = run_code_tool(tools, bind={"tenant": TENANT}).description
    assert "api_key" not in sdk_text and "tenant" not in sdk_text.split("lookup", 1)[1].split("\n")[0]
    assert "api_key" not in "\n".join(result.logs)  # sdk.describe and sdk.search answers

    haystacks: list[Any] = [
        sdk_text,
        nous_sched.sdk.render(tools),
        result.logs,
        result.result,
        repr(result),
        json.dumps(result.for_model(), ensure_ascii=False),
        [e.as_event() for e in result.events],
        [e.as_event() for e in result.refused],
        result.audit,
        log.events,
        questions,
        [repr(r) for r in requests],
        [r.arguments for r in requests],
        [(e.kind, e.seq, e.data) for e in events],
        [json.dumps(e.data, ensure_ascii=False, default=repr) for e in events],
        repr(tools),
        repr(options),
        caplog.text,
        [r.getMessage() for r in caplog.records],
        [openai_tool(t) for t in tools],
        result.trail,
    ]
    for haystack in haystacks:
        assert_nowhere(haystack, SECRET)
    assert_nowhere(repr(options), TENANT)
    assert_nowhere([e.as_event() for e in result.events], TENANT)


def test_otel_spans_carry_the_marker_not_the_key() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from nous_sched import otel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    received: list[dict[str, Any]] = []
    result = otel.traced_run_code(
        PROGRAM,
        make_tools(received),
        tracer=provider.get_tracer("test_bound"),
        timeout=WAIT,
        description="traced",
        bind={"tenant": TENANT},
        approval_handler=lambda request: True,
    )
    assert result.error is None and received[0]["api_key"] == SECRET
    spans = exporter.get_finished_spans()
    assert spans
    text = repr(
        [(s.name, dict(s.attributes or {}), [(e.name, dict(e.attributes or {})) for e in s.events]) for s in spans]
    )
    assert_nowhere(text, SECRET)


def test_a_direct_call_is_checked_without_the_bound_argument_and_the_tool_gets_it() -> None:
    received: list[dict[str, Any]] = []
    lookup = make_tools(received)[0]
    log = SessionLog()
    answer = call_tool(lookup, '{"query": "q"}', log, bind={"tenant": TENANT}, approval_handler=lambda request: True)
    assert json.loads(answer)["found"] == "q"
    assert received == [{"query": "q", "api_key": SECRET, "tenant": TENANT}]
    assert_nowhere(log.events, SECRET)
    refused = call_tool(lookup, {"query": "q", "tenant": "other"}, bind={"tenant": TENANT})
    assert "'tenant' is a bound argument" in json.loads(refused)["error"]
    with pytest.raises(ConfigError, match=r"Bind\('tenant'\)"):
        call_tool(lookup, {"query": "q"})
    schema = openai_tool(lookup)["function"]["parameters"]
    assert set(schema["properties"]) == {"query"} and schema["required"] == ["query"]


def test_a_missing_bind_is_a_config_error_naming_it_before_the_program_starts() -> None:
    received: list[dict[str, Any]] = []
    with pytest.raises(ConfigError, match=r"tool 'lookup' binds its argument 'tenant' to Bind\('tenant'\).*bind="):
        run_code("return 1", make_tools(received)[:1], description="d", bind={"other": 1}, timeout=WAIT)
    # A tool the policy denies is not checked: it never runs.
    assert (
        run_code(
            "return 1",
            make_tools(received),
            description="d",
            policy=PermissionPolicy(deny=["lookup", "echoer"]),
            timeout=WAIT,
        ).result
        == 1
    )


def test_bad_bound_callers_and_bind_values_are_config_errors_naming_them_never_the_values() -> None:
    with pytest.raises(ConfigError, match="`bound` must be a mapping"):
        Tool("t", lambda a: a, bound=[SECRET])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="`bound` names 'apikey', which is not among its parameters"):
        Tool("t", lambda a: a, parameters=SCHEMA, bound={"apikey": SECRET})
    with pytest.raises(ConfigError, match="`bind` must be None or a mapping") as raised:
        RunOptions(bind=[SECRET])  # type: ignore[arg-type]
    assert_nowhere(str(raised.value), SECRET)
    with pytest.raises(ConfigError, match="run_code: `bind`"):
        run_code("1", [], description="d", bind=SECRET)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Bind: `name`"):
        Bind("")
    override = ToolOverride(bound={"api_key": SECRET})
    assert_nowhere(repr(override), SECRET)
    with pytest.raises(ConfigError, match="ToolOverride: `bound`"):
        ToolOverride(bound=SECRET)  # type: ignore[arg-type]


def test_a_function_tool_binds_and_its_validation_error_does_not_echo_the_secret() -> None:
    @function_tool
    def charge(amount: int, api_key: int) -> int:
        """Charge an amount."""
        return amount

    bound = Tool(**{**_fields(charge), "bound": {"api_key": SECRET}})
    result = run_code(
        "return await tools.charge({amount: 3})", [bound], description="d", timeout=WAIT, runtime=QuickJSRuntime()
    )
    assert result.error is not None  # api_key is not an int: the function's own check refused it
    assert_nowhere(repr(result), SECRET)
    assert_nowhere([e.as_event() for e in result.events], SECRET)


def _fields(tool: Tool) -> dict[str, Any]:
    import attrs

    return {f.name: getattr(tool, f.name) for f in attrs.fields(Tool) if f.init}


def test_a_redacted_tool_error_stays_a_tool_error_and_names_no_secret() -> None:
    def fails(args: dict[str, Any]) -> Any:
        raise ToolError(f"the key {args['key']} was refused upstream")

    tool = Tool("fails", fails, bound={"key": SECRET})
    message = json.loads(call_tool(tool, {}))["error"]
    assert message == f"the key {BOUND_MARKER} was refused upstream"


def test_visible_tools_offers_the_model_the_schema_without_bound_arguments() -> None:
    received: list[dict[str, Any]] = []
    tools = make_tools(received)
    offered = visible_tools("native", tools)
    assert [openai_tool(t)["function"]["parameters"]["required"] for t in offered] == [["query"], ["query"]]


def test_an_mcp_tool_bound_through_its_override_reaches_the_server_and_its_error_is_redacted() -> None:
    from mcp_servers import lab

    from nous_sched.mcp import ServerSpec, connect

    overrides = {
        "as_text": ToolOverride(bound={"text": Bind("t")}, callers={"code"}),
        "fail": ToolOverride(bound={"message": f"upstream refused {SECRET}"}),
    }
    with connect(ServerSpec(lab.build(), trusted=True, overrides=overrides)) as conn:
        tools = {t.name: t for t in conn.tools()}
        assert tools["as_text"].callers == frozenset({"code"})
        assert "text" not in (tools["as_text"].caller_schema or {}).get("properties", {})
        result = run_code(
            "const said = await tools.as_text({});\n"
            "let failed = null; try { await tools.fail({}); } catch (e) { failed = e.message; }\n"
            "return {said, failed};",
            list(tools.values()),
            description="mcp",
            bind={"t": "per-run text"},
            timeout=WAIT,
        )
    assert result.error is None, result.error
    assert result.result["said"] == "per-run text"  # the server got the run's value (and returned it: its word)
    assert result.result["failed"] == f"Error executing tool fail: {BOUND_MARKER}"  # the server echoed it whole
    assert_nowhere(repr(result), SECRET)
    assert "as_text" not in [t.name for t in visible_tools("native", list(tools.values()))]


def test_a_durable_run_keeps_no_bound_value_and_resume_takes_bind_again(tmp_path: Any) -> None:
    from nous_sched import ApprovalDecision, SqliteApprovalStore, resume

    received: list[dict[str, Any]] = []
    tools = make_tools(received)
    path = tmp_path / "approvals.db"
    store = SqliteApprovalStore(str(path))
    program = 'const r = await tools.lookup({query: "q"});\nreturn r;'
    suspended = run_code(
        program, tools, approval_store=store, description="durable", bind={"tenant": TENANT}, timeout=WAIT
    )
    assert suspended.suspended is not None and received == []
    token = suspended.suspended.token
    with pytest.raises(ConfigError, match=r"Bind\('tenant'\)"):
        resume(token, {0: ApprovalDecision(True, "ok")}, tools, approval_store=store, timeout=WAIT)
    done = resume(
        token, {0: ApprovalDecision(True, "ok")}, tools, approval_store=store, bind={"tenant": TENANT}, timeout=WAIT
    )
    assert done.error is None, done.error
    assert received == [{"query": "q", "api_key": SECRET, "tenant": TENANT}]
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    for form in spellings(SECRET) + spellings(TENANT):
        assert form.encode("utf-8", "surrogatepass") not in stored
    assert_nowhere(repr(suspended), SECRET)
    assert_nowhere(repr(done), SECRET)
    assert_nowhere([e.as_event() if hasattr(e, "as_event") else e for e in done.audit], SECRET)


CLI_TOOLS = f"""
import json
from nous_sched import Tool

SECRET = {SECRET!r}


def lookup(args):
    assert args["api_key"] == SECRET
    return {{"found": args["query"]}}


def echoer(args):
    raise ValueError("bad key " + args["api_key"])


SCHEMA = { ({k: v for k, v in SCHEMA.items() if k != "required"})!r}
TOOLS = [
    Tool("lookup", lookup, parameters=SCHEMA, bound={{"api_key": SECRET, "tenant": "t-1"}}),
    Tool("echoer", echoer, parameters=SCHEMA, bound={{"api_key": SECRET, "tenant": "t-1"}}),
]
"""


@pytest.mark.parametrize("flags", [["--json"], ["--events"], ["--events", "--json"], []])
def test_the_cli_shows_the_marker_never_the_key(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    from nous_sched.cli import main

    (tmp_path / "bound_cli_tools.py").write_text(CLI_TOOLS, encoding="utf-8")
    program = tmp_path / "p.js"
    program.write_text(
        'const r = await tools.lookup({query: "q"});\n'
        'try { await tools.echoer({query: "q"}); } catch (e) { console.log(e.message); }\n'
        "console.log(JSON.stringify(r));\nreturn r;\n",
        encoding="utf-8",
    )
    status = main(
        ["run", str(program), "--tools", str(tmp_path / "bound_cli_tools.py"), "--runtime", "in-process", *flags]
    )
    out, err = capsys.readouterr()
    assert status == 0, err
    assert '"found"' in out or "found" in out
    assert_nowhere(out + err, SECRET)
    if "--json" in flags or "--events" in flags:
        assert BOUND_MARKER in out


def test_serve_mcp_binds_per_request_through_bind_for_and_shows_the_marker_only(tmp_path: Any) -> None:
    import anyio
    from mcp import Client
    from mcp_types import ElicitResult

    from nous_sched.mcp import CodeModeServer

    received: list[dict[str, Any]] = []
    principals: list[Any] = []
    path = tmp_path / "audit.jsonl"

    def bind_for(principal: Any) -> dict[str, Any]:
        principals.append(principal)
        return {"tenant": TENANT}

    server = CodeModeServer(make_tools(received), audit_log=str(path), timeout=WAIT, bind_for=bind_for)
    seen: list[Any] = []

    async def on_progress(value: Any, total: Any, message: Any) -> None:
        seen.append(("progress", message))

    async def on_log(params: Any) -> None:
        seen.append(("log", params.data))

    async def on_elicit(ctx: Any, params: Any) -> Any:
        seen.append(("asked", params.message))
        return ElicitResult(action="accept", content={"approve": True})

    async def go() -> Any:
        with anyio.fail_after(WAIT):
            async with Client(
                server.server, mode="legacy", logging_callback=on_log, elicitation_callback=on_elicit
            ) as client:
                listed = await client.list_tools()
                result = await client.call_tool(
                    "run_code", {"code": PROGRAM, "description": "served"}, progress_callback=on_progress
                )
                return listed, result

    listed, result = anyio.run(go)
    server.close()
    audit = path.read_text(encoding="utf-8").splitlines()
    assert result.structured_content.get("error") is None, result.structured_content
    assert received[0] == {"query": "q", "api_key": SECRET, "tenant": TENANT}
    assert principals == [None]  # no bearer token: no principal
    assert any(kind == "asked" and BOUND_MARKER in text for kind, text in seen)
    assert any(BOUND_MARKER in line for line in audit)
    for haystack in (listed, result, seen, audit):
        assert_nowhere(repr(haystack), SECRET)
        assert_nowhere(repr(haystack), TENANT)


def test_serve_mcp_without_bind_for_checks_its_binds_at_start_and_a_failing_bind_for_runs_nothing() -> None:
    import anyio
    from mcp import Client

    from nous_sched.mcp import CodeModeServer

    received: list[dict[str, Any]] = []
    with pytest.raises(ConfigError, match=r"CodeModeServer: tool 'lookup' binds its argument 'tenant'"):
        CodeModeServer(make_tools(received), timeout=WAIT)

    def broken(principal: Any) -> Any:
        raise RuntimeError(f"no tenant for {SECRET}")

    server = CodeModeServer(make_tools(received), timeout=WAIT, bind_for=broken)

    async def go() -> Any:
        with anyio.fail_after(WAIT):
            async with Client(server.server, mode="legacy") as client:
                return await client.call_tool("run_code", {"code": PROGRAM, "description": "served"})

    result = anyio.run(go)
    server.close()
    assert result.is_error and "bind_for raised RuntimeError" in repr(result) and received == []
    assert_nowhere(repr(result), SECRET)


def test_function_tool_takes_bound_and_callers_and_checks_them_where_written() -> None:
    @function_tool(bound={"api_key": SECRET}, callers={"code"})
    def fetch(url: str, api_key: str) -> str:
        """Fetch a URL with the service's key."""
        return f"{url} fetched with a key of {len(api_key)} characters"

    assert set(fetch.caller_schema["properties"]) == {"url"} and fetch.callers == frozenset({"code"})
    result = run_code(
        'return await tools.fetch({url: "u"})', [fetch], description="d", timeout=WAIT, runtime=QuickJSRuntime()
    )
    assert result.result == f"u fetched with a key of {len(SECRET)} characters"
    with pytest.raises(ConfigError, match="function_tool: `callers`"):
        function_tool(callers="code")
    with pytest.raises(ConfigError, match="function_tool: `bound` must be a mapping"):
        function_tool(bound=[SECRET])  # type: ignore[arg-type]


def test_concurrency_safe_sees_the_markers_and_the_tool_the_values() -> None:
    predicate_saw: list[dict[str, Any]] = []
    tool_saw: list[dict[str, Any]] = []

    def safe(args: dict[str, Any]) -> bool:
        predicate_saw.append(dict(args))
        return True

    tool = Tool("t", lambda args: tool_saw.append(dict(args)) or 1, concurrency_safe=safe, bound={"key": SECRET})
    result = run_code(
        "return await Promise.all([tools.t({n: 1}), tools.t({n: 2})])",
        [tool],
        description="d",
        timeout=WAIT,
        runtime=QuickJSRuntime(),
    )
    assert result.result == [1, 1]
    assert sorted(p["n"] for p in predicate_saw) == [1, 2] and {p["key"] for p in predicate_saw} == {BOUND_MARKER}
    assert {t["key"] for t in tool_saw} == {SECRET}

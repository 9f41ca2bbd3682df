"""State across runs (``run_code(state=State(scope))``, ``nous_sched.state``): what a
program reads and writes through ``state``, across processes and stores, at once,
within its limits; audited and live, never a tool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid

import pytest

from nous_sched import (
    ConfigError,
    Limits,
    QuickJSRuntime,
    RedisStateStore,
    SessionLog,
    SqliteStateStore,
    State,
    Tool,
    run_code,
    run_code_tool,
    sdk,
    start_run,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _scope() -> str:
    return "test-" + uuid.uuid4().hex


def _store(kind: str, tmp_path, redis_url):
    if kind == "memory":
        return None
    if kind == "sqlite":
        return SqliteStateStore(tmp_path / "state.db")
    return RedisStateStore(redis_url)


def _run(code: str, state, **options):
    return run_code(code, [], description="state test", state=state, **options)


# -- the program's API ------------------------------------------------------------------


def test_a_program_sets_gets_lists_and_deletes(runtime):
    state = State(_scope())
    result = _run(
        """
        const before = await state.get("n");
        await state.set("n", {count: 1, tags: ["a"]});
        await state.set("other", "x");
        const after = await state.get("n");
        const keys = await state.keys();
        await state.delete("other");
        return {before, after, keys, gone: await state.get("other"), left: await state.keys()};
        """,
        state,
    )
    assert result.error is None, result.error
    assert result.result == {
        "before": None,
        "after": {"count": 1, "tags": ["a"]},
        "keys": [{"key": "n", "size": 24}, {"key": "other", "size": 3}],
        "gone": None,
        "left": [{"key": "n", "size": 24}],
    }
    assert state.get("n") == {"count": 1, "tags": ["a"]}


def test_two_runs_naming_one_scope_share_the_default_memory_store():
    scope = _scope()
    assert _run('await state.set("k", [1, 2]); return 1', State(scope)).ok
    assert _run('return await state.get("k")', State(scope)).result == [1, 2]
    assert _run('return await state.get("k")', State(_scope())).result is None  # another scope: apart


SECOND_PROCESS = """
import json, sys
from nous_sched import RedisStateStore, SqliteStateStore, State, run_code
kind, where, scope = sys.argv[1:4]
store = SqliteStateStore(where) if kind == "sqlite" else RedisStateStore(where)
result = run_code('return await state.get("records")', description="read", state=State(scope, store))
print(json.dumps({"result": result.result, "error": None if result.error is None else result.error.message}))
"""


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_the_second_run_in_another_process_reads_what_the_first_stored(kind, tmp_path, redis_url):
    scope = _scope()
    where = str(tmp_path / "state.db") if kind == "sqlite" else redis_url
    state = State(scope, _store(kind, tmp_path, redis_url))
    first = _run('await state.set("records", [{id: 1, name: "Oslo"}, {id: 2, name: "Bergen"}]); return "stored"', state)
    assert first.result == "stored", first.error
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, "-c", SECOND_PROCESS, kind, where, scope], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer == {"result": [{"id": 1, "name": "Oslo"}, {"id": 2, "name": "Bergen"}], "error": None}


# -- concurrency: versioned writes that fail on conflict ---------------------------------

INCREMENT = """
let conflicts = 0;
for (;;) {
  const n = await state.get("counter");
  try {
    await state.set("counter", (n ?? 0) + 1);
    return conflicts;
  } catch (e) {
    if (!(e instanceof ToolError) || !e.message.startsWith("conflict:")) throw e;
    conflicts++;
  }
}
"""


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis"])
def test_concurrent_runs_of_one_scope_keep_every_write(kind, tmp_path, redis_url):
    state = State(_scope(), _store(kind, tmp_path, redis_url))
    runs = 8
    results: list = [None] * runs
    gate = threading.Barrier(runs)

    def one(i: int) -> None:
        gate.wait()
        own = f'await state.set("run-{i}", {i});'
        results[i] = _run(own + INCREMENT, state, limits=Limits(timeout=120, max_calls=10_000))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.error is None for r in results), [r.error for r in results]
    assert state.get("counter") == runs  # every read-modify-write landed, none lost
    assert {k.key for k in state.keys()} == {"counter", *(f"run-{i}" for i in range(runs))}
    assert all(state.get(f"run-{i}") == i for i in range(runs))
    conflicts = [e for r in results for e in r.audit if e.data.get("error") == "conflict"]
    assert len(conflicts) == sum(r.result for r in results)  # each conflict the programs saw is audited


def test_a_write_of_a_key_read_before_another_run_changed_it_is_a_conflict_nothing_written():
    state = State(_scope())
    state.set("k", 1)
    changed = threading.Event()

    def changer(args):
        state.set("k", 100)  # another run (here: the host) writes between the read and the write
        changed.set()
        return None

    result = run_code(
        """
        const k = await state.get("k");
        await tools.change({});
        try { await state.set("k", k + 1); } catch (e) { return [e.tool, e.message]; }
        """,
        [Tool("change", changer)],
        description="conflict",
        state=state,
    )
    assert changed.is_set()
    tool, message = result.result
    assert tool == "state.set" and message.startswith('conflict: another run changed the key "k"')
    assert state.get("k") == 100
    # a key never read is written whatever it holds (last writer wins)
    assert _run('await state.set("k", 5); return await state.get("k")', state).result == 5


# -- limits and bad keys ------------------------------------------------------------------


def test_an_oversized_value_is_refused_with_a_clear_error_the_program_can_catch():
    state = State(_scope())
    result = _run(
        """
        try { await state.set("big", "x".repeat(5000)); } catch (e) { return [e.name, e.tool, e.message]; }
        """,
        state,
        limits=Limits(state_value_bytes=4096),
    )
    assert result.result == [
        "ToolError",
        "state.set",
        "the value is 5002 bytes of JSON, over the run's limit of 4096 (Limits.state_value_bytes): nothing was written",
    ]
    assert state.keys() == []
    (event,) = result.audit
    assert event.data == {"op": "set", "key": "big", "size": 5002, "version": 0, "ok": False, "error": "limit"}


def test_too_many_keys_or_bytes_are_refused_nothing_written():
    state = State(_scope())
    code = """
    const out = [];
    for (const k of ["a", "b", "c"]) {
      try { await state.set(k, 1); out.push("ok"); } catch (e) { out.push(e.message); }
    }
    try { await state.set("a", "y".repeat(40)); out.push("ok"); } catch (e) { out.push(e.message); }
    return out;
    """
    result = _run(code, state, limits=Limits(state_keys=2, state_bytes=30))
    assert result.result[:2] == ["ok", "ok"]
    assert result.result[2].startswith("the scope holds its most keys (2, Limits.state_keys)")
    assert result.result[3].startswith("the scope's values would pass 30 bytes of JSON in all (Limits.state_bytes)")
    assert [k.key for k in state.keys()] == ["a", "b"] and state.get("a") == 1


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ('""', "must not be empty"),
        ('"x".repeat(257)', "at most 256 characters"),
        ('"a\\u0000b"', "control characters"),
        ('"a\\ud800b"', "lone surrogates"),
        ("42", "must be a string, not int"),
        ("null", "must be a string, not null"),
    ],
)
def test_a_bad_key_is_refused_naming_why(key, says):
    result = _run(f"try {{ await state.set({key}, 1); }} catch (e) {{ return [e.tool, e.message]; }}", State(_scope()))
    tool, message = result.result
    assert tool == "state.set" and says in message
    assert result.audit[0].data["key"] is None  # a key refused is never written to the audit


def test_set_without_a_value_is_refused():
    result = _run('try { await state.set("k"); } catch (e) { return e.message; }', State(_scope()))
    assert result.result.startswith("state.set takes a key and a JSON value")


def test_a_run_without_state_says_how_to_give_it_one():
    result = run_code('try { await state.get("k"); } catch (e) { return [e.tool, e.message]; }', description="x")
    assert result.result[0] == "state.get" and "run_code(..., state=nous_sched.State(scope))" in result.result[1]


def test_state_is_never_a_tool_name():
    state = State(_scope())
    state.set("k", 1)
    result = run_code(
        'try { await tools["state.get"]("k"); } catch (e) { return e.message; }',
        [Tool("echo", lambda a: a)],
        description="x",
        state=state,
    )
    assert result.result.startswith('unknown tool "state.get"')
    assert result.audit == ()  # no state operation happened


def test_a_program_may_name_its_own_variable_state():
    result = _run("const state = {n: 1}; return state.n", State(_scope()))
    assert result.result == 1


def test_state_counts_against_the_call_budget():
    result = _run('for (let i = 0; i < 5; i++) { await state.get("k"); }', State(_scope()), limits=Limits(max_calls=3))
    assert result.error is not None and "max_calls" in result.error.message


# -- the audit and the live stream --------------------------------------------------------


def test_every_operation_is_audited_in_the_result_and_the_session_log_never_the_value():
    log = SessionLog()
    secret = "value-that-stays-out-of-the-audit"
    result = _run(
        f'await state.set("k", "{secret}"); await state.get("k"); await state.keys(); await state.delete("k");',
        State(_scope()),
        session_log=log,
    )
    ops = [(e.type, e.data["op"], e.data["key"], e.data["ok"]) for e in result.audit]
    assert ops == [("state", "set", "k", True), ("state", "get", "k", True), ("state", "keys", None, True)] + [
        ("state", "delete", "k", True)
    ]
    assert [e for e in log.events if e.type == "state"] == list(result.audit)
    assert secret not in json.dumps([dict(e.data) for e in result.audit])
    set_event, get_event = result.audit[0], result.audit[1]
    assert set_event.data["size"] == len(json.dumps(secret)) and set_event.data["version"] > 0
    assert get_event.data["version"] == set_event.data["version"]


def test_state_operations_are_live_events_in_order():
    run = start_run(
        'await state.set("k", 1); return await state.get("k")', [], description="live", state=State(_scope())
    )
    seen = [e for e in run.events() if e.kind == "state"]
    assert run.result().result == 1
    assert [(e.data["op"], e.data["key"], e.data["ok"], e.data["error"]) for e in seen] == [
        ("set", "k", True, None),
        ("get", "k", True, None),
    ]


# -- the options, the SDK text --------------------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "says"),
    [("", "non-empty"), ("a\x00b", "no control characters"), (42, "non-empty string"), ("x" * 257, "at most 256")],
)
def test_a_bad_scope_is_a_config_error_naming_it(scope, says):
    with pytest.raises(ConfigError, match=r"State: `scope` must be .*" + says):
        State(scope)


def test_a_store_that_is_not_one_is_a_config_error():
    with pytest.raises(ConfigError, match=r"State: `store` must be None or a state store"):
        State("s", store="redis://x")


def test_the_host_side_methods_are_bounded_by_limits():
    state = State(_scope())
    with pytest.raises(ConfigError, match="Limits.state_value_bytes"):
        state.set("k", "x" * 100, limits=Limits(state_value_bytes=50))
    with pytest.raises(ConfigError, match="`key`"):
        state.set("", 1)
    state.set("k", {"a": 1})
    state.delete("k")
    assert state.get("k") is None


def test_the_sdk_text_says_the_state_exists_and_what_it_holds_within_the_budget():
    state = State(_scope())
    state.set("records", list(range(50)))
    state.set("cursor\u202e", "x")
    tool = run_code_tool([Tool("echo", lambda a: a)], state=state)
    text = tool.description
    assert "await state.get(key)" in text and "await state.keys()" in text
    assert '"records" (141)' in text and '"cursor\\u202e" (3)' in text  # escaped: no bidi reaches the model
    for budget in (sdk.MIN_BUDGET, sdk.MIN_BUDGET + 300, 4000):
        many = State(_scope())
        for i in range(300):
            many.set(f"key-{i:03}", i)
        tight = run_code_tool([Tool(f"t{i}", lambda a: a) for i in range(200)], state=many, budget=budget).description
        assert len(tight) <= budget
        assert "state" in tight
    without = run_code_tool([Tool("echo", lambda a: a)]).description
    assert "state.get" not in without


def test_the_run_code_tool_passes_the_state_to_its_runs():
    state = State(_scope())
    tool = run_code_tool([], state=state)
    tool.function({"code": 'await state.set("k", 7); return 1', "description": "x"})
    assert state.get("k") == 7


def test_quickjs_runtime_reaches_the_same_state():
    state = State(_scope())
    result = _run('await state.set("k", 2); return await state.get("k")', state, runtime=QuickJSRuntime())
    assert result.result == 2


# -- durable runs: state replays exactly ---------------------------------------------------

DURABLE = """
const before = await state.get("n");
await state.set("n", (before ?? 0) + 1);
const paid = await tools.pay({amount: 5});
await state.set("after", paid);
return {before, now: await state.get("n"), keys: (await state.keys()).map(k => k.key)};
"""


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_resumed_run_sees_what_its_first_part_saw_and_writes_nothing_twice(kind, tmp_path, redis_url):
    from nous_sched import SqliteApprovalStore, resume

    approvals = SqliteApprovalStore(tmp_path / "approvals.db")
    state = State(_scope(), _store(kind, tmp_path, redis_url))
    paid = []
    tools = [Tool("pay", lambda args: paid.append(args) or "receipt-1", requires_approval=True)]
    first = run_code(DURABLE, tools, description="durable", state=state, approval_store=approvals)
    assert first.suspended is not None, first.error
    assert state.get("n") == 1
    version = state.keys()[0].version
    assert [e.data["op"] for e in first.audit if e.type == "state"] == ["get", "set"]
    # meanwhile another run moves on
    state.set("other", "x")
    result = resume(
        first.suspended.token, {first.suspended.pending[0].seq: True}, tools, approval_store=approvals, state=state
    )
    assert result.error is None, result.error
    # the replayed get answers what the first part read (absent), its set is not done again
    assert result.result == {"before": None, "now": 1, "keys": ["after", "n", "other"]}
    assert [k.version for k in state.keys() if k.key == "n"] == [version]
    assert paid == [{"amount": 5}]
    assert [e.data["op"] for e in result.audit if e.type == "state"] == ["set", "get", "keys"]  # only the live ones


def test_a_resumed_runs_write_of_a_key_its_first_part_read_is_a_conflict_when_it_changed(tmp_path):
    from nous_sched import SqliteApprovalStore, resume

    approvals = SqliteApprovalStore(tmp_path / "approvals.db")
    state = State(_scope())
    state.set("n", 1)
    tools = [Tool("pay", lambda args: "ok", requires_approval=True)]
    program = """
    const n = await state.get("n");
    await tools.pay({});
    try { await state.set("n", n + 1); return "written"; } catch (e) { return e.message; }
    """
    first = run_code(program, tools, description="durable", state=state, approval_store=approvals)
    state.set("n", 50)  # changed while the run waited for its approval
    result = resume(
        first.suspended.token, {first.suspended.pending[0].seq: True}, tools, approval_store=approvals, state=state
    )
    assert result.result.startswith("conflict:")
    assert state.get("n") == 50


def test_a_resume_replays_the_recorded_answers_whatever_state_it_is_given(tmp_path):
    from nous_sched import SqliteApprovalStore, resume

    approvals = SqliteApprovalStore(tmp_path / "approvals.db")
    state = State(_scope())
    tools = [Tool("pay", lambda args: "ok", requires_approval=True)]
    first = run_code(
        'await state.get("a"); return await tools.pay({})',
        tools,
        description="d",
        state=state,
        approval_store=approvals,
    )
    record = approvals.load(first.suspended.token)
    assert record["state"][0][:2] == ['["state.get",["a"]]', True]
    # the record's state operations are sealed with it: replayed as recorded, whatever the state passed
    other = State(_scope())
    result = resume(
        first.suspended.token, {first.suspended.pending[0].seq: True}, tools, approval_store=approvals, state=other
    )
    assert result.ok  # the program asked the same question: the recorded answer is given, not other's


# -- serve-mcp: a scope per client ------------------------------------------------------------


def _served(server, *codes, mode="auto"):
    import anyio
    from mcp import Client

    async def go():
        out = []
        with anyio.fail_after(120):
            async with Client(server.server, mode=mode) as client:
                for code in codes:
                    result = await client.call_tool("run_code", {"code": code, "description": "state"})
                    out.append(result.structured_content)
        return out

    return anyio.run(go)


def test_serve_mcp_gives_each_session_its_own_scope_and_audits_its_operations(tmp_path):
    from nous_sched.mcp import CodeModeServer
    from nous_sched.mcp.serve import AuditLog

    store = SqliteStateStore(tmp_path / "state.db")
    audit = tmp_path / "audit.jsonl"
    server = CodeModeServer([Tool("echo", lambda a: a)], state_store=store, audit_log=AuditLog(str(audit)))
    first = _served(server, 'await state.set("seen", 1); return 1', 'return await state.get("seen")', mode="legacy")
    assert [r["result"] for r in first] == [1, 1]  # one session: one scope across its runs
    second = _served(server, 'return await state.get("seen")', mode="legacy")
    assert second[0]["result"] is None  # another session: its own scope
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    states = [line for line in lines if line["event"] == "state"]
    assert [(s["op"], s["key"], s["ok"]) for s in states] == [("set", "seen", True), ("get", "seen", True)] + [
        ("get", "seen", True)
    ]
    # in-process without a handshake is the one client a stdio process serves: one scope, every process alike
    assert [
        r["result"] for r in _served(server, 'await state.set("n", 2); return 1', 'return await state.get("n")')
    ] == [1, 2]
    assert State("mcp-stdio", store).get("n") == 2
    assert "State across programs" in server._template.description  # noqa: SLF001


def test_serve_mcp_without_a_state_store_gives_no_state():
    from nous_sched.mcp import CodeModeServer

    server = CodeModeServer([Tool("echo", lambda a: a)])
    (answer,) = _served(server, 'try { await state.get("k"); } catch (e) { return e.message; }')
    assert answer["result"].startswith("this run has no state")


def test_a_bad_state_store_is_a_config_error():
    from nous_sched.mcp import CodeModeServer

    with pytest.raises(ConfigError, match="CodeModeServer: `state_store` must be"):
        CodeModeServer([], state_store="state.db")


# -- the command -------------------------------------------------------------------------------


def test_the_command_keeps_a_scope_across_invocations(tmp_path):
    program = tmp_path / "count.js"
    program.write_text('const n = await state.get("n"); await state.set("n", (n ?? 0) + 1); return n;')
    tools = tmp_path / "notools.py"
    tools.write_text("TOOLS = []\n")
    env = {**os.environ, "PYTHONPATH": ROOT}
    store = str(tmp_path / "state.db")

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "nous_sched", "run", str(program), "--tools", str(tools), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    first = run("--state", "conv-1", "--state-store", store, "--json")
    second = run("--state", "conv-1", "--state-store", store, "--json")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert json.loads(first.stdout)["result"] is None and json.loads(second.stdout)["result"] == 1
    assert [e["op"] for e in json.loads(second.stdout)["state"]] == ["get", "set"]
    alone = run("--state-store", store)
    assert alone.returncode == 2 and "--state-store needs --state SCOPE" in alone.stderr
    bad = run("--state", "s", "--state-store", str(tmp_path / "missing" / "x.db"))
    assert bad.returncode == 2 and "state store" in bad.stderr and "SQLite" in bad.stderr


# -- every door, and a store that is down ----------------------------------------------------


def test_the_state_reaches_the_asyncio_door_and_options():
    import asyncio

    from nous_sched import RunOptions, arun_code

    state = State(_scope())
    options = RunOptions(description="async", state=state)
    result = asyncio.run(arun_code('await state.set("k", "async"); return await state.get("k")', options=options))
    assert result.result == "async" and state.get("k") == "async"


def test_the_state_reaches_traced_run_code():
    from nous_sched.otel import traced_run_code

    state = State(_scope())
    result = traced_run_code('await state.set("k", 3); return await state.get("k")', [], description="t", state=state)
    assert result.result == 3


def test_a_redis_store_that_is_down_fails_the_operation_fast_naming_redis():
    import time

    from redis_server import redis_process

    with redis_process() as server:
        state = State(_scope(), RedisStateStore(server.url))
        assert _run('await state.set("k", 1); return 1', state).ok
        server.kill()
        began = time.monotonic()
        result = _run('try { await state.get("k"); } catch (e) { return [e.tool, e.message]; }', state)
        assert time.monotonic() - began < 20  # one connect timeout, no retries
    tool, message = result.result
    assert tool == "state.get" and message.startswith(f"the Redis state store at {server.url} could not answer")
    assert result.audit[0].data["error"] == "store"


def test_a_parked_durable_run_shows_its_state_operations_and_goes_on_with_them(tmp_path):
    from nous_sched import SqliteApprovalStore, resume

    approvals = SqliteApprovalStore(tmp_path / "approvals.db", park=60)
    state = State(_scope())
    tools = [Tool("pay", lambda args: "ok", requires_approval=True)]
    program = 'await state.set("a", 1); await tools.pay({}); await state.set("b", 2); return await state.get("a")'
    first = run_code(program, tools, description="parked", state=state, approval_store=approvals, timeout=120)
    assert first.suspended is not None
    assert [(e.data["op"], e.data["key"]) for e in first.audit if e.type == "state"] == [("set", "a")]
    result = resume(first.suspended.token, {first.suspended.pending[0].seq: True}, tools, approval_store=approvals)
    assert result.result == 1 and state.get("b") == 2
    assert [(e.data["op"], e.data["key"]) for e in result.audit if e.type == "state"][-2:] == [
        ("set", "b"),
        ("get", "a"),
    ]


def test_serve_mcp_over_stdio_keeps_its_clients_state_across_a_restart(tmp_path):
    import anyio
    from mcp import Client, StdioServerParameters

    tools = tmp_path / "notools.py"
    tools.write_text("TOOLS = []\n")
    store = str(tmp_path / "state.db")
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "nous_sched", "serve-mcp", "--tools", str(tools), "--state-store", store],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    code = 'const n = await state.get("n"); await state.set("n", (n ?? 0) + 1); return n;'

    async def one_process():
        with anyio.fail_after(120):
            async with Client(params) as client:
                listed = await client.list_tools()
                result = await client.call_tool("run_code", {"code": code, "description": "count"})
                return listed.tools[0].description, result.structured_content["result"]

    described, first = anyio.run(one_process)
    _, second = anyio.run(one_process)  # a new server process, the same store
    assert (first, second) == (None, 1)
    assert "State across programs (one per client: its own scope)" in described
    assert State("mcp-stdio", SqliteStateStore(store)).get("n") == 2


TAKEN_OVER = """
import json, os, sys
from nous_sched import RunOptions, SqliteApprovalStore, SqliteStateStore, State, Tool, resume, run_code

stage, folder, scope = sys.argv[1:4]


class DiesAtCallOne(SqliteApprovalStore):
    # The resume dies as the start of call #1 is about to be written: after its state operations.
    def write_progress(self, token, by, progress):
        if stage == "resume-dies" and "1" in progress["started"]:
            os._exit(17)
        return super().write_progress(token, by, progress)


approvals = DiesAtCallOne(os.path.join(folder, "approvals.db"))
state = State(scope, SqliteStateStore(os.path.join(folder, "state.db")))
tools = [Tool("pay", lambda a: "paid", requires_approval=True), Tool("read", lambda a: "read")]
program = '''
await tools.pay({});
const n = await state.get("k");
await state.set("k", (n ?? 0) + 1);
await tools.read({});
return [n, await state.get("k")];
'''
if stage == "run":
    result = run_code(program, tools, description="crash", state=state, approval_store=approvals)
    print(json.dumps({"token": result.suspended.token}))
else:
    result = resume(sys.argv[4], {0: True}, tools, approval_store=approvals, state=state)
    print(json.dumps({"result": result.result, "error": None if result.error is None else result.error.message}))
"""


def test_a_resume_that_takes_over_a_dead_one_replays_its_state_operations(tmp_path):
    scope = _scope()
    env = {**os.environ, "PYTHONPATH": ROOT}

    def stage(*args):
        return subprocess.run(
            [sys.executable, "-c", TAKEN_OVER, *args], capture_output=True, text=True, env=env, timeout=120
        )

    token = json.loads(stage("run", str(tmp_path), scope).stdout.strip().splitlines()[-1])["token"]
    died = stage("resume-dies", str(tmp_path), scope, token)
    assert died.returncode == 17, died.stderr
    state = State(scope, SqliteStateStore(tmp_path / "state.db"))
    assert state.get("k") == 1  # the dead resume's write
    done = stage("resume", str(tmp_path), scope, token)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    # the taking-over resume replays the dead one's get (null) and set: k is written once
    assert answer == {"result": [None, 1], "error": None}
    assert state.get("k") == 1


def test_serve_mcp_scopes_a_principal_by_its_name_and_gives_a_stateless_request_none():
    from nous_sched import MemoryStateStore
    from nous_sched.mcp import CodeModeServer

    server = CodeModeServer([], state_store=MemoryStateStore())
    alice = server._state_of((("principal", "issuer", "alice"),))  # noqa: SLF001
    again = server._state_of((("principal", "issuer", "alice"),))  # noqa: SLF001
    bob = server._state_of((("principal", "issuer", "bob"),))  # noqa: SLF001
    assert alice.scope == again.scope != bob.scope and alice.scope.startswith("mcp-principal-")
    assert server._state_of((("connection", "127.0.0.1", 50123),)) is None  # noqa: SLF001
    assert server._state_of(("peer unknown",)) is None  # noqa: SLF001
    assert server._state_of(("stdio",)).scope == "mcp-stdio"  # noqa: SLF001


def test_the_command_resumes_a_durable_run_with_its_state(tmp_path):
    program = tmp_path / "pay.js"
    program.write_text(
        'await state.set("a", 1); await tools.pay({}); await state.set("b", 2); return await state.get("a");'
    )
    tools = tmp_path / "paytools.py"
    tools.write_text("from nous_sched import Tool\nTOOLS = [Tool('pay', lambda a: 'ok', requires_approval=True)]\n")
    env = {**os.environ, "PYTHONPATH": ROOT}
    store, approvals = str(tmp_path / "state.db"), str(tmp_path / "approvals.db")
    both = ["--tools", str(tools), "--approval-store", approvals, "--state", "conv", "--state-store", store, "--json"]

    def command(*args):
        return subprocess.run(
            [sys.executable, "-m", "nous_sched", *args], capture_output=True, text=True, env=env, timeout=120
        )

    first = command("run", str(program), *both)
    assert first.returncode == 3, first.stderr  # suspended
    token = json.loads(first.stdout)["suspended"]["token"]
    done = command("resume", token, "--approve", "0", *both)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == 1
    state = State("conv", SqliteStateStore(store))
    assert (state.get("a"), state.get("b")) == (1, 2)

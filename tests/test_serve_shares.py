"""Fair shares and who may reach serve-mcp over HTTP (issue 34, items 6 and 9; issue 43, item 6).

Real parts throughout: the SDK's own ``Client`` over real HTTP, either to an
in-process ``CodeModeServer`` served by uvicorn on a loopback socket (so a
tool can hold a worker until the test lets go, deterministically) or to a
``nous-sched serve-mcp --http`` subprocess; a real ``WorkerPool`` of two
workers, so the default per-client cap is one.

The hostile client declares elicitation and never answers: on the default
(2026-07-28) protocol its run waits, holding a worker, for a retry that never
comes.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import anyio
import httpx
import httpx2
import pytest
import uvicorn
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp_servers import wait_until
from mcp_types import ElicitResult
from starlette.requests import Request

from nous_sched import ConfigError, Tool
from nous_sched.cli import main
from nous_sched.mcp import BearerTokens, CodeModeServer
from nous_sched.mcp.access import is_loopback
from nous_sched.mcp.shares import Shares, client_keys, default_cap, pool_size
from nous_sched.runtime.pool import WorkerPool, default_size

REPO = Path(__file__).resolve().parent.parent
HOLD = {"code": "return await tools.hold({});", "description": "waits for an approval nobody gives"}
ANSWER = {"code": "return 6 * 7;", "description": "the answer"}
ALICE, BOB = "alice-" + "a" * 24, "bob-" + "b" * 24
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run_code", "arguments": ANSWER}}


# -- the cap and who a client is, as pure logic ------------------------------------------------------


def test_the_default_cap_is_half_the_real_pool_and_at_least_one():
    tools = [Tool("t", lambda a: 1)]
    assert CodeModeServer(tools).max_runs_per_session == max(1, default_size() // 2)
    for size, cap in [(1, 1), (2, 1), (3, 1), (7, 3), (8, 4)]:
        pool = WorkerPool(size=size)
        try:
            assert CodeModeServer(tools, runtime=pool).max_runs_per_session == cap
            assert CodeModeServer(tools, runtime=pool.domain("tenant")).max_runs_per_session == cap
        finally:
            pool.close()
    assert CodeModeServer(tools, max_runs_per_session=5).max_runs_per_session == 5  # given: as given
    assert pool_size(None) == pool_size(object()) == default_size()


@given(st.integers(min_value=1, max_value=10_000))
def test_the_default_cap_leaves_at_least_half_the_pool_to_others(size):
    cap = default_cap(size)
    assert cap >= 1
    assert size == 1 or size - cap >= size // 2


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=1, max_value=4),
    st.lists(st.tuples(st.booleans(), st.sets(st.sampled_from("abc"), min_size=1))),
)
def test_no_key_ever_has_more_than_the_cap_going(cap, steps):
    shares, admitted = Shares(cap), []
    for admit, keys in steps:
        ordered = tuple(sorted(keys))
        if admit:
            full = any(sum(k in run for run in admitted) >= cap for k in ordered)
            assert (shares.admit(ordered) is not None) == full
            if not full:
                admitted.append(ordered)
        elif admitted:
            shares.release(admitted.pop(0))
        for key in "abc":
            assert shares.going(key) == sum(key in run for run in admitted) <= cap
    for run in admitted:
        shares.release(run)
    assert [shares.going(k) for k in "abc"] == [0, 0, 0]


def request_context(client, headers, user=None):
    """The parts of the SDK's request context :func:`client_keys` reads: a real Starlette request."""
    scope = {"type": "http", "method": "POST", "path": "/mcp", "client": client, "headers": headers}
    if user is not None:
        scope["user"] = user
    return SimpleNamespace(session=SimpleNamespace(), protocol_version="2026-07-28", request=Request(scope))


HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["mcp-session-id", "x-forwarded-for", "host", "user-agent"]), HEADER_TEXT)),
    st.integers(min_value=1, max_value=65535),
)
def test_no_header_a_client_chooses_changes_who_it_is(headers, port):
    raw = [(name.encode(), value.encode("latin-1")) for name, value in headers]
    assert client_keys(request_context(("127.0.0.1", port), raw)) == (("connection", "127.0.0.1", port),)
    alice = AuthenticatedUser(AccessToken(token="t" * 20, client_id="alice", scopes=[]))
    assert client_keys(request_context(("127.0.0.1", port), raw, alice)) == (("principal", "alice", None, None),)


# -- an in-process server over real HTTP ------------------------------------------------------------


@contextlib.contextmanager
def served(server, host="127.0.0.1", token_verifier=None):
    """``server`` over Streamable HTTP on ``host`` (uvicorn on a thread); yields its URL."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(64)
    app = server.http_app(host=host, token_verifier=token_verifier)
    web = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=anyio.run, args=(web.serve, [sock]), name="test-uvicorn")
    thread.start()
    try:
        wait_until(lambda: web.started, what="uvicorn to start")
        shown = f"[{host}]" if ":" in host else host
        yield f"http://{shown}:{sock.getsockname()[1]}/mcp"
    finally:
        server.close()  # refuses every open question: held runs end
        web.should_exit = True
        thread.join(60)
        sock.close()


class Lab:
    """Two tools: ``hold`` needs an approval; ``block`` runs until :attr:`free` is set."""

    def __init__(self):
        self.free = threading.Event()
        self.blocking = threading.Event()
        self.calls = []

        def hold(args):
            self.calls.append("hold")
            return "approved"

        def block(args):
            self.calls.append("block")
            self.blocking.set()
            return "freed" if self.free.wait(120) else "never freed"

        self.tools = [Tool("hold", hold, requires_approval=True), Tool("block", block)]


@pytest.fixture
def lab(tmp_path):
    lab = Lab()
    lab.audit = tmp_path / "audit.jsonl"
    lab.pool = WorkerPool(size=2)
    lab.server = CodeModeServer(lab.tools, runtime=lab.pool, timeout=120, audit_log=str(lab.audit))
    assert lab.server.max_runs_per_session == 1  # half of two workers
    with served(lab.server) as url:
        lab.url = url
        yield lab
    lab.pool.close()


def runs_started(audit):
    if not audit.exists():
        return []
    return [e for e in map(json.loads, audit.read_text().splitlines()) if e["event"] == "run_start"]


class Hostile:
    """A client that declares elicitation and never answers: each held run keeps a worker."""

    def __init__(self, url, *, rotate_session_ids=False, token=None, mode="auto"):
        self.url = url
        self.mode = mode
        self.asked = threading.Semaphore(0)
        self.session_ids = []
        self.rotate = rotate_session_ids
        self.token = token
        self.results = []
        self.held = False

    async def _never(self, ctx, params):
        self.asked.release()
        if self.held:  # a run admitted past the cap (it should not be): declined, so it ends, and shows
            return ElicitResult(action="decline")
        self.held = True
        await anyio.sleep_forever()

    async def _fresh_session_id(self, request):
        if self.rotate:
            request.headers["mcp-session-id"] = sid = uuid.uuid4().hex
            self.session_ids.append(sid)

    async def session(self, tg, calls, done):
        """Start one held run, then make ``calls`` more calls on the same client; set ``done``."""
        headers = {} if self.token is None else {"Authorization": f"Bearer {self.token}"}
        async with httpx2.AsyncClient(
            headers=headers, timeout=httpx2.Timeout(120), event_hooks={"request": [self._fresh_session_id]}
        ) as http:
            transport = streamable_http_client(self.url, http_client=http)
            async with Client(transport, elicitation_callback=self._never, mode=self.mode) as client:
                tg.start_soon(client.call_tool, "run_code", HOLD)
                await anyio.to_thread.run_sync(self.asked.acquire)
                for _ in range(calls):
                    self.results.append(await client.call_tool("run_code", HOLD))
                done.set()
                await anyio.sleep_forever()


@contextlib.contextmanager
def hostile_client(url, calls=0, **options):
    """A :class:`Hostile` client on its own thread, holding its cap until the block ends."""
    hostile = Hostile(url, **options)
    done = threading.Event()
    stop = threading.Event()

    async def go():
        async with anyio.create_task_group() as tg:
            tg.start_soon(hostile.session, tg, calls, done)
            await anyio.to_thread.run_sync(stop.wait)
            tg.cancel_scope.cancel()

    thread = threading.Thread(target=anyio.run, args=(go,), name="test-hostile-client")
    thread.start()
    try:
        assert done.wait(120), "the hostile client never got its run held"
        yield hostile
    finally:
        stop.set()
        thread.join(60)


def calls(url, each, token=None, headers=None):
    """One fresh SDK client (its own connection) calls ``run_code`` with each of ``each`` in turn; the results."""

    async def go():
        sent = dict(headers or {}) | ({} if token is None else {"Authorization": f"Bearer {token}"})
        async with httpx2.AsyncClient(headers=sent, timeout=httpx2.Timeout(120)) as http:
            async with Client(streamable_http_client(url, http_client=http)) as client:
                return [await client.call_tool("run_code", arguments) for arguments in each]

    return anyio.run(go)


def call(url, arguments=ANSWER, token=None, headers=None):
    """One ``run_code`` call by a fresh SDK client; its result."""
    return calls(url, [arguments], token, headers)[0]


def refused_for_its_cap(result):
    return result.is_error and "max_runs_per_session" in result.content[0].text


# -- fair shares over HTTP ----------------------------------------------------------------------------------


def test_a_client_holding_its_cap_leaves_an_honest_client_served_as_soon_as_a_worker_frees(lab):
    with hostile_client(lab.url, calls=1) as hostile:
        assert refused_for_its_cap(hostile.results[0])  # its cap is held: one run, waiting on nobody
        busy = {}
        busy_thread = threading.Thread(
            target=lambda: busy.update(
                result=call(lab.url, {"code": "return await tools.block({});", "description": "b"})
            ),
            name="test-busy-client",
        )
        busy_thread.start()
        assert lab.blocking.wait(60)  # both workers are taken: the hostile's and this one
        honest, served_at = {}, threading.Event()

        def honest_call():
            honest["result"] = call(lab.url)
            honest["at"] = time.monotonic()
            served_at.set()

        honest_thread = threading.Thread(target=honest_call, name="test-honest-client")
        honest_thread.start()
        wait_until(lambda: len(runs_started(lab.audit)) == 3, timeout=60, what="the honest run to start")
        assert not served_at.is_set()  # it waits for a worker: none is free
        freed = time.monotonic()  # the busy run's worker frees after this
        lab.free.set()
        assert served_at.wait(60)
        # Served within a second of the worker freeing, while the hostile client still holds its own.
        assert honest["at"] - freed < 1.0, honest["at"] - freed
        assert honest["result"].structured_content == {"logs": [], "result": 42}
        ended = [e["run"] for e in map(json.loads, lab.audit.read_text().splitlines()) if e["event"] == "run_end"]
        assert runs_started(lab.audit)[0]["run"] not in ended and len(ended) == 2  # the hostile's still holds
        honest_thread.join(60)
        busy_thread.join(60)
        assert busy["result"].structured_content == {"logs": [], "result": "freed"}


def test_fresh_session_ids_do_not_raise_the_cap(lab):
    with hostile_client(lab.url, calls=4, rotate_session_ids=True) as hostile:
        assert len(set(hostile.session_ids)) == len(hostile.session_ids) >= 5  # every request its own id
        assert all(refused_for_its_cap(r) for r in hostile.results), [r.content for r in hostile.results]
        assert len(runs_started(lab.audit)) == 1  # only the first ever started


def test_two_clients_without_a_session_do_not_share_a_quota(lab):
    with hostile_client(lab.url, calls=1) as hostile:
        assert refused_for_its_cap(hostile.results[0])
        # Another client, on its own connection from the same address, with no session id either.
        assert call(lab.url).structured_content == {"logs": [], "result": 42}
        assert call(lab.url).structured_content == {"logs": [], "result": 42}


def test_a_handshake_era_session_is_capped_on_every_connection_it_uses(lab):
    # Its held call keeps its POST (and so its connection) open: each further call comes on
    # another connection, and is refused for the session's cap all the same.
    with hostile_client(lab.url, calls=2, mode="legacy") as hostile:
        assert all(refused_for_its_cap(r) for r in hostile.results), [r.content for r in hostile.results]
        assert len(runs_started(lab.audit)) == 1
        assert call(lab.url).structured_content == {"logs": [], "result": 42}  # another client is served


def test_sixteen_clients_on_one_address_are_all_served():
    """Issue 43 item 6: sixteen SDK clients at once on the default (stateless) protocol, two of them
    running programs that spin to their deadline: every honest call is answered, none refused."""
    pool = WorkerPool(size=8)
    server = CodeModeServer([Tool("t", lambda a: 1)], runtime=pool, timeout=5)
    spin = {"code": "while (true) {}", "description": "spins to its deadline"}
    answers: dict[int, list] = {}
    start = threading.Barrier(16)

    def client(i):
        start.wait(60)
        hostile = i in (3, 11)
        answers[i] = calls(url, [spin if hostile else ANSWER, ANSWER, ANSWER])

    try:
        with served(server) as url:
            threads = [threading.Thread(target=client, args=(i,), name=f"test-client-{i}") for i in range(16)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(300)
    finally:
        pool.close()
    assert sorted(answers) == list(range(16))
    results = [r for i in answers for r in answers[i]]
    assert not [r for r in results if refused_for_its_cap(r)]
    honest = [r for i in answers for n, r in enumerate(answers[i]) if not (i in (3, 11) and n == 0)]
    assert [r.structured_content for r in honest] == [{"logs": [], "result": 42}] * 46
    assert [answers[i][0].structured_content["error"]["kind"] for i in (3, 11)] == ["timeout", "timeout"]


def test_with_bearer_tokens_the_principal_is_the_client(tmp_path):
    lab = Lab()
    pool = WorkerPool(size=4)
    server = CodeModeServer(lab.tools, runtime=pool, timeout=120, max_runs_per_session=1)
    tokens = BearerTokens({"alice": ALICE, "bob": BOB})
    try:
        with served(server, token_verifier=tokens) as url:
            for headers in ({}, {"Authorization": "Bearer " + "x" * 30}, {"Authorization": f"Basic {ALICE}"}):
                answer = httpx.post(url, headers=MCP_HEADERS | headers, json=CALL, timeout=60)
                assert answer.status_code == 401, answer.text
            with hostile_client(url, calls=1, token=ALICE) as alice:
                assert refused_for_its_cap(alice.results[0])
                # Alice on a fresh connection is still Alice: her cap is held.
                assert refused_for_its_cap(call(url, token=ALICE))
                assert call(url, token=BOB).structured_content == {"logs": [], "result": 42}
    finally:
        pool.close()


# -- Host and Origin on every loopback binding; the rule for the others -----------------------------------


@contextlib.contextmanager
def serve_mcp(*args):
    """``nous-sched serve-mcp --tools examples/tools.py ARGS``; yields its URL and its banner's cap line."""
    process = subprocess.Popen(
        [sys.executable, "-m", "nous_sched", "serve-mcp", "--tools", "examples/tools.py", *args],
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        line = process.stderr.readline()  # printed once the socket listens
        assert " at http://" in line, line + process.stderr.read()
        cap = next(more for more in iter(process.stderr.readline, "") if "runs at once per client" in more)
        yield line.split(" at ", 1)[1].split(";", 1)[0], cap
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        finally:
            process.kill()
            process.stderr.close()


def audited_runs(path):
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == "run_start"]


@pytest.mark.parametrize("host", ["127.0.0.2", "::1", "localhost"])
def test_a_forged_host_or_origin_is_refused_on_every_loopback_binding(host, tmp_path):
    audit = tmp_path / "audit.jsonl"
    shown = f"[{host}]" if ":" in host else host
    with serve_mcp("--http", f"{shown}:0", "--audit-log", str(audit)) as (url, cap):
        assert cap.endswith("per client (--max-runs-per-session); a client is its connection\n"), cap
        port = url.rsplit(":", 1)[1].split("/", 1)[0]
        with httpx.Client(timeout=60) as http:
            forged_host = http.post(url, headers=MCP_HEADERS | {"Host": f"evil.example:{port}"}, json=CALL)
            assert forged_host.status_code == 421, forged_host.text
            forged_origin = http.post(url, headers=MCP_HEADERS | {"Origin": f"http://evil.example:{port}"}, json=CALL)
            assert forged_origin.status_code == 403, forged_origin.text
        assert audited_runs(audit) == []  # no program ran
        # The address itself, and the other loopback names, are served (any port, or none).
        assert call(url).structured_content == {"logs": [], "result": 42}
        for name in sorted({shown, "127.0.0.1", "localhost", "[::1]"}):
            for named in (f"{name}:{port}", name):
                sent = {"Host": named, "Origin": f"http://{named}"}
                assert call(url, headers=sent).structured_content == {"logs": [], "result": 42}, sent
        assert len(audited_runs(audit)) == 1 + 2 * len({shown, "127.0.0.1", "localhost", "[::1]"})


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.255.0.9", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("LocalHost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("localhost.evil.example", False),
        ("example.com", False),
    ],
)
def test_which_bindings_are_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_a_binding_that_is_not_loopback_needs_bearer_tokens(tmp_path, capsys, monkeypatch):
    with pytest.raises(ConfigError, match="token_verifier"):
        CodeModeServer([Tool("t", lambda a: 1)]).http_app(host="0.0.0.0")
    monkeypatch.chdir(REPO)
    assert main(["serve-mcp", "--tools", "examples/tools.py", "--http", "0.0.0.0:0"]) == 2
    assert "needs bearer-token authorization (token_verifier; --auth-token-file" in capsys.readouterr().err
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# who may call\nalice {ALICE}\n\nbob {BOB}\n")
    with serve_mcp("--http", "0.0.0.0:0", "--auth-token-file", str(tokens)) as (url, cap):
        assert cap.endswith("per client (--max-runs-per-session); a client is its bearer token's name\n"), cap
        local = url.replace("0.0.0.0", "127.0.0.1")
        assert httpx.post(local, headers=MCP_HEADERS, json=CALL, timeout=60).status_code == 401
        assert call(local, token=BOB).structured_content == {"logs": [], "result": 42}


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "cannot read it"),
        ("", "no bearer tokens given"),
        ("alice short\n", "must be at least 16 characters"),
        (f"alice {ALICE} extra\n", "line 1: expected NAME TOKEN"),
        (f"alice {ALICE}\nalice {BOB}\n", "line 2: client 'alice' is named twice"),
        (f"alice {ALICE}\nbob {ALICE}\n", "two clients have the same token"),
        (b"alice \xff" * 10, "cannot read it"),
    ],
)
def test_a_bad_token_file_is_a_usage_error_naming_the_option(content, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    path = tmp_path / "tokens"
    if isinstance(content, str):
        path.write_text(content)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    assert main(["serve-mcp", "--tools", "examples/tools.py", "--http", "0", "--auth-token-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"--auth-token-file {path}" in err and message in err, err


def test_bearer_tokens_are_for_http(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    path = tmp_path / "tokens"
    path.write_text(f"alice {ALICE}\n")
    assert main(["serve-mcp", "--tools", "examples/tools.py", "--auth-token-file", str(path)]) == 2
    assert "--auth-token-file: bearer tokens are for --http" in capsys.readouterr().err


def test_the_verifier_knows_each_token_and_nothing_else():
    tokens = BearerTokens({"alice": ALICE, "bob": BOB})

    async def verify(token):
        found = await tokens.verify_token(token)
        return None if found is None else found.client_id

    assert anyio.run(verify, ALICE) == "alice"
    assert anyio.run(verify, BOB) == "bob"
    for other in ["", ALICE[:-1], ALICE + "x", "\ud800" * 20, "\x00" * 30, ALICE.upper()]:
        assert anyio.run(verify, other) is None
    assert tokens.names == ["alice", "bob"]

"""A tool set's names text crosses to the worker side once (issue 44, the 5,000-tools row).

The host offers a names text to its fork server once (``ForkServer.offer_names``);
the server keeps the last few (``worker._keep_names``: bounded in entries and
bytes, each checked against its key), every child forked afterwards holds
them, and a run frame names its text by key alone when its worker holds it (a
fresh child: its server's; a reused worker: its last run's). Each run still
sees exactly its own grant: a child unmaps every inherited text at its first
run, a key selects only the text it is the digest of, and a worker asked for
a text it does not hold exits, so the run starts again on another worker with
the text in its frame. A text shorter than ``worker.NAMES_OFFER_MIN`` is never
offered (it goes in each run frame, as before). The compromised-engine side is in ``tests/test_wall.py``
(``test_a_compromised_worker_never_sees_another_tool_sets_names``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from nous_sched import Tool, WorkerPool, run_code
from nous_sched.runtime import engine, procio, worker

pytestmark = pytest.mark.timeout(180)

PROGRAM = """
const own = %s, other = %s;
// (Before anything asks for the whole shape: each name looked up in the text. A declared name
// reads as one function each time, an undeclared one as a new stand-in that rejects.)
const out = {own: own.map((n) => tools[n] === tools[n]), other: other.map((n) => tools[n] === tools[n])};
try { await tools[other[0]]({}); out.call = "called"; } catch (e) { out.call = e.name; }
out.first = await tools[own[0]]({});
out.keys = Object.keys(tools);
out.in = other.some((n) => n in tools);
return out;
"""


class Frames:
    """The run frames the host writes (a spy on the real pipe's writer): whether each carried the names' text."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.texts: list[bool] = []
        self.workers: list[procio.Worker] = []
        send = procio.Worker.send

        def spy(w: procio.Worker, data, until):
            if bytes(data[4:5]) == worker.RUN:
                self.texts.append(b"\n" in bytes(data[5:]))
                self.workers.append(w)
            return send(w, data, until)

        monkeypatch.setattr(procio.Worker, "send", spy)


def tool_set(prefix: str, n: int, called: list[str]) -> tuple[Tool, ...]:
    def make(name: str) -> Tool:
        return Tool(name, lambda args: called.append(name) or name, concurrency_safe=lambda args: True)

    return tuple(make(f"{prefix}_{i}") for i in range(n))


def check(result, own: tuple[Tool, ...], other: tuple[Tool, ...], called: list[str]) -> None:
    assert result.ok, result.error
    out = result.result
    assert out["own"] == [True] * len(own)
    assert out["other"] == [False] * len(other)
    assert out["in"] is False
    assert out["call"] == "ToolError"
    assert out["first"] == own[0].name
    assert sorted(out["keys"]) == sorted(t.name for t in own) and len(out["keys"]) == len(own)
    assert called == [own[0].name]  # never the other set's tool


def program(own: tuple[Tool, ...], other: tuple[Tool, ...]) -> str:
    return PROGRAM % (json.dumps([t.name for t in own]), json.dumps([t.name for t in other]))


@pytest.mark.parametrize("reuse", [False, True], ids=["fresh workers", "pool.domain"])
def test_runs_of_sets_a_then_b_then_a_in_one_pool_each_see_exactly_their_own_names(monkeypatch, reuse):
    called: list[str] = []
    a = tool_set("alpha", 500, called)
    b = tool_set("beta", 400, called)
    frames = Frames(monkeypatch)
    order = ((a, b), (b, a), (a, b), (a, b), (b, a), (a, b))
    with WorkerPool(size=2, spares=1) as pool:
        rt = pool.domain("d") if reuse else pool
        for own, other in order:
            called.clear()
            check(run_code(program(own, other), own, runtime=rt, description="t"), own, other, called)
            pool.wait_for_spares(30.0)
    assert frames.texts[:2] == [True, True]  # each set's first run carried its text
    workers = frames.workers
    if reuse:  # a warm worker's run of the set its last run had needs no text; of the other set, the text
        again = [i for i in range(1, len(order)) if workers[i] is workers[i - 1]]
        assert len(again) >= 3
        for i in again:
            assert frames.texts[i] == (order[i][0] is not order[i - 1][0]), (i, frames.texts)
    else:  # a fresh worker per run; those forked after a set's first run hold its text
        assert len(set(map(id, workers))) == len(order)
        assert frames.texts[2:].count(False) >= 2, frames.texts


def test_hostile_names_behave_alike_whether_their_text_or_its_key_crosses(monkeypatch):
    # Lone surrogates (the text then ASCII, made eager), NUL, bidi controls, quotes, a huge name.
    names = ["\ud800", "a\x00b", "\u202eevil", '"q",\n', "x" * 200_000, "\U0001f600", "[", "]"]
    probes = ["\udc00", "a", '","', "x" * 199_999, "\u202e"]
    called: list[str] = []
    tools = tuple(Tool(n, lambda args, n=n: called.append(n) or 1) for n in names)
    text = """
    const names = %s, probes = %s;
    const out = names.map((n) => tools[n] === tools[n]);
    for (const p of probes) out.push(tools[p] !== tools[p]);
    out.push(JSON.stringify(Object.keys(tools).sort()) === JSON.stringify(names.slice().sort()));
    out.push(await tools[names[0]]({}));
    return out;
    """ % (json.dumps(names), json.dumps(probes))
    frames = Frames(monkeypatch)
    with WorkerPool(size=2, spares=1) as pool:
        for _ in range(4):
            r = run_code(text, tools, runtime=pool, description="t")
            assert r.ok, r.error
            assert r.result == [True] * (len(names) + len(probes) + 1) + [1]
            pool.wait_for_spares(30.0)
    assert frames.texts[0] is True and False in frames.texts
    assert called == ["\ud800"] * 4


def _spawn(server: procio.ForkServer) -> frozenset[bytes]:
    """Fork a child of ``server`` (which then exits: its pipes close); the keys it holds."""
    pipes = [os.pipe() for _ in range(3)]
    try:
        pid, pidfd, held = server.spawn("nous-sched-worker-names-test", (pipes[0][0], pipes[1][1], pipes[2][0]))
    finally:
        for r, w in pipes:
            os.close(r)
            os.close(w)
    os.close(pidfd)
    return held


def _offer_raw(server: procio.ForkServer, key: bytes, text: bytes, size: int) -> None:
    """An offer as the socket carries it, whatever the host would send (``size`` claimed)."""
    fd = os.memfd_create("test-names")
    try:
        os.write(fd, text)
        socket.send_fds(server.sock, [b"N %s %d" % (key, size)], [fd])
    finally:
        os.close(fd)


@pytest.fixture
def fork_server() -> Iterator[procio.ForkServer]:
    """A one-place pool's fork server, held for the test (its children are the test's to spawn)."""
    with WorkerPool(size=1, spares=0) as pool:
        server = pool._fork_server()
        assert server is not None
        try:
            yield server
        finally:
            server.release()


def test_the_fork_servers_names_cache_is_bounded_and_keeps_only_texts_matching_their_keys(fork_server):
    server = fork_server
    assert _spawn(server) == frozenset()
    # Entries: many distinct sets, the last NAMES_ENTRIES kept.
    keys = []
    for i in range(worker.NAMES_ENTRIES + 5):
        text = engine.names_utf8(tuple(f"set{i}_{j}" for j in range(40)))[0]
        keys.append(engine.names_key(text))
        server.offer_names(keys[-1], text)
        held = _spawn(server)
        assert held == frozenset(keys[-worker.NAMES_ENTRIES :])
    # Bytes: texts of a third of the bound each, at most two of them kept.
    big = []
    for i in range(3):
        text = bytes([65 + i]) * (worker.NAMES_BYTES // 3 + 1)
        big.append(engine.names_key(text))
        server.offer_names(big[-1], text)
    held = _spawn(server)
    assert big[0] not in held and {big[1], big[2]} <= held
    assert len(held) <= worker.NAMES_ENTRIES
    # A key that is not its text's digest, a size that is not the text's, one over the bound:
    # none kept, nor any other text given for them.
    text = b'[\n"mine"]'
    forged = engine.names_key(b'[\n"theirs"]')
    _offer_raw(server, forged, text, len(text))
    _offer_raw(server, engine.names_key(text), text, len(text) + 1)
    huge = b"y" * (worker.NAMES_BYTES + 1)
    _offer_raw(server, engine.names_key(huge), huge, len(huge))
    server.offer_names(engine.names_key(huge), huge)  # (the host does not even send it)
    again = _spawn(server)
    assert forged not in again and engine.names_key(text) not in again
    assert engine.names_key(huge) not in again
    assert again == held


def test_offers_made_while_a_spawn_holds_the_server_never_wait_and_the_next_child_holds_them(fork_server):
    server = fork_server
    texts = [engine.names_utf8(tuple(f"busy{i}_{j}" for j in range(40)))[0] for i in range(6)]
    keys = [engine.names_key(t) for t in texts]
    with server._lock:  # (as a spawn holds it: the offers are left for the spawn to send)
        threads = [threading.Thread(target=server.offer_names, args=(k, t)) for k, t in zip(keys, texts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), "an offer waited for the spawn"
        server.offer_names(keys[0], texts[0])  # (waiting already: not queued twice)
    held = _spawn(server)
    assert set(keys[-worker.NAMES_ENTRIES :]) <= held
    server.offer_names(keys[-1], texts[-1])  # (held: nothing to send)
    assert _spawn(server) == held


def test_a_worker_asked_for_a_text_it_does_not_hold_exits_and_the_run_starts_again_with_the_text(monkeypatch):
    called: list[str] = []
    a = tool_set("alpha", 50, called)
    b = tool_set("beta", 60, called)
    frames = Frames(monkeypatch)
    with WorkerPool(size=2, spares=1) as pool:
        rt = pool.domain("d")
        check(run_code(program(a, b), a, runtime=rt, description="t"), a, b, called)
        warm = frames.workers[0]
        pid = warm.proc.pid
        # The host's record of what the worker holds, wrong: it names B's key, the worker holds A's text.
        warm.names_held = frozenset((engine.names_keyed(tuple(sorted(t.name for t in b)))[2],))
        called.clear()
        check(run_code(program(b, a), b, runtime=rt, description="t"), b, a, called)
        assert frames.texts == [True, False, True]  # A's text; B's key alone (refused); B's text, elsewhere
        assert pid not in pool.pids()


def test_a_fork_server_lost_or_replaced_means_texts_again_never_a_wrong_set(monkeypatch):
    called: list[str] = []
    a = tool_set("alpha", 500, called)
    b = tool_set("beta", 400, called)
    frames = Frames(monkeypatch)
    with WorkerPool(size=2, spares=1) as pool:
        for _ in range(3):
            called.clear()
            check(run_code(program(a, b), a, runtime=pool, description="t"), a, b, called)
        assert frames.texts[0] is True and frames.texts[-1] is False
        server = pool._server
        assert server is not None
        os.kill(server.proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while server.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        del frames.texts[:]
        for own, other in ((b, a), (a, b), (a, b), (a, b)):
            called.clear()
            check(run_code(program(own, other), own, runtime=pool, description="t"), own, other, called)
        assert pool._server is not server
        # The new server held nothing: each set's first run there carried its text.
        assert frames.texts[:2] == [True, True]


def test_a_small_tool_sets_text_is_never_offered_and_goes_in_each_fresh_run_frame(monkeypatch):
    # (An offer costs the server more than such a frame carries, and must not push out large sets' texts.)
    called: list[str] = []
    small = tool_set("s", 10, called)
    other = tool_set("o", 3, called)
    assert len(engine.names_utf8(tuple(sorted(t.name for t in small)))[0]) < worker.NAMES_OFFER_MIN
    frames = Frames(monkeypatch)
    with WorkerPool(size=2, spares=1) as pool:
        for _ in range(4):
            called.clear()
            check(run_code(program(small, other), small, runtime=pool, description="t"), small, other, called)
        server = pool._server
        assert server is not None
        assert server.names_held == frozenset()
    assert frames.texts == [True] * 4


def test_names_that_are_not_a_tuple_go_in_every_frame_unkeyed():
    # (Nothing is kept for them: a digest per run would cost more than the text it saves.)
    names = [f"n_{i}" for i in range(1000)]
    text, lazy, key = engine.names_keyed(names)
    assert key is None and (text, lazy) == engine.names_utf8(tuple(names))
    assert engine.names_keyed(tuple(names))[2] == engine.names_key(text)


@pytest.mark.parametrize("children", [3, 8], ids=["replaced-at-its-count", "successor-started-ahead"])
def test_a_fork_servers_successor_holds_the_names_texts_it_replaces_was_sent(monkeypatch, children):
    # A server is replaced every SERVER_CHILDREN children: at its count (3: a quarter of
    # it is no child ahead), or by a successor started a quarter of them ahead (8). Each
    # new server is offered the texts the one it replaces was sent, so no run on its
    # children carries one.
    from nous_sched.runtime import pool as pool_module

    monkeypatch.setitem(pool_module.WALL, "server_children", children)
    called: list[str] = []
    a = tool_set("alpha", 500, called)
    b = tool_set("beta", 400, called)
    frames = Frames(monkeypatch)
    servers: set[object] = set()
    with WorkerPool(size=1, spares=1) as pool:
        for own, other in ((a, b), (a, b), (a, b)):  # the text offered, and held by the children after
            called.clear()
            check(run_code(program(own, other), own, runtime=pool, description="t"), own, other, called)
            servers.add(pool._server)
        del frames.texts[:]
        runs = 3 * children
        for _ in range(runs):
            called.clear()
            check(run_code(program(a, b), a, runtime=pool, description="t"), a, b, called)
            servers.add(pool._server)
        assert len(servers) >= 3  # (replaced at least twice while these ran; the servers held, so no id reused)
    assert frames.texts == [False] * runs, frames.texts


def test_the_names_cache_rule_keeps_the_newest_within_both_bounds_and_says_what_it_dropped():
    # worker.keep_newest: the fork server's cache and the host's record of what it sent one.
    kept: dict[bytes, bytes] = {}
    dropped = []
    for i in range(worker.NAMES_ENTRIES + 2):
        dropped += worker.keep_newest(kept, b"k%d" % i, b"t%d" % i)
    assert list(kept) == [b"k%d" % i for i in range(2, worker.NAMES_ENTRIES + 2)]
    assert dropped == [b"t0", b"t1"], "the least recently offered first"
    assert worker.keep_newest(kept, b"k2", b"t2") == [] and list(kept)[-1] == b"k2", "offered again: the most recent"
    third = worker.NAMES_BYTES // 3 + 1
    big = [worker.keep_newest(kept, b"b%d" % i, bytes([65 + i]) * third) for i in range(3)]
    assert sum(map(len, kept.values())) <= worker.NAMES_BYTES and list(kept)[-2:] == [b"b1", b"b2"]
    assert len(big[2]) >= 1 and big[2][-1] == b"A" * third, "the bytes bound dropped the oldest big text"
    before = dict(kept)
    assert worker.keep_newest(kept, b"huge", b"y" * (worker.NAMES_BYTES + 1)) == [] and kept == before

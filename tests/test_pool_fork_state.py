"""What a fork server makes before its first fork, and what its children may see of it.

A fork server prepares one context (the prelude evaluated, the converter
compiled) and the worker's fixed Python state once; each child inherits a
copy-on-write copy. No program ever runs in the server, and a child runs one
program: nothing one run does is visible to the next, whatever it changed.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from nous_sched import Tool, WorkerPool, run_code
from nous_sched.runtime import engine, worker
from nous_sched.runtime import pool as pool_module

pytestmark = pytest.mark.timeout(120)


def echo_tool() -> Tool:
    return Tool("echo", lambda args: args, concurrency_safe=lambda args: True)


# Run A changes everything a program can reach: globals, the intrinsics the
# converter was handed copies of, the prototypes of plain values.
_RUN_A = """
globalThis.leak = "from run A";
Object.prototype.polluted = "from run A";
Array.prototype.push = function () { return "from run A"; };
Map.prototype.entries = function () { throw new Error("from run A"); };
JSON.stringify = function () { return '"from run A"'; };
const echoed = await tools.echo({});
return [typeof echoed, Object.keys(echoed).length];
"""

# Run B, in another child of the same fork server: none of it is there.
_RUN_B = """
const echoed = await tools.echo({});
return {
  leak: typeof globalThis.leak,
  polluted: typeof ({}).polluted,
  push: [].push(1),
  stringify: JSON.stringify({a: 1}),
  echoed: echoed,
  map: new Map([["k", 1]]),
};
"""


def test_a_run_in_a_fork_servers_child_sees_nothing_of_the_run_before():
    with WorkerPool(size=2, spares=0) as pool:
        a = run_code(_RUN_A, [echo_tool()], runtime=pool, description="test")
        assert a.ok, a.error
        assert a.result == ["object", 0]
        b = run_code(_RUN_B, [echo_tool()], runtime=pool, description="test")
        assert b.ok, b.error
        assert b.result == {
            "leak": "undefined",
            "polluted": "undefined",
            "push": 1,
            "stringify": '{"a":1}',
            "echoed": {},
            "map": {"k": 1},
        }


def test_a_promise_in_a_calls_arguments_is_still_refused_in_a_fork_servers_child():
    # (The converter that finds it was compiled by the fork server, before any run.)
    with WorkerPool(size=2, spares=0) as pool:
        r = run_code(
            "try { await tools.echo({p: Promise.resolve(1), q: {}}); return 'sent'; } catch (e) { return e.message; }",
            [echo_tool()],
            runtime=pool,
            description="test",
        )
    assert r.ok, r.error
    assert "argument $.p is a Promise, not a value" in r.result


def test_a_context_prepared_with_its_converter_converts_as_one_prepared_without():
    program = (
        'return [new Map([["k", 1]]), new Set([1, 2]), 10n, new Date(0), undefined, NaN, '
        "new Uint8Array([1, 2]), {f() {}}];"
    )
    results = []
    for converter in (False, True):
        ctx, bridge = engine.prepare(converter)
        ctx.set_time_limit(5.0)
        bridge("configure", '["echo"]', "[10000,10000,10000,100,100,100000,1]", 1)
        bridge("started", bridge("start", ctx.eval(engine._HEADER + program + "\n})"))())
        while ctx.execute_pending_job():
            pass
        results.append(json.loads(bridge("drain"))["main"])
    assert results[0] == results[1]
    assert results[0]["state"] == "fulfilled"


def test_the_limits_type_is_made_once_per_process():
    assert worker._limits_type() is worker._limits_type()
    assert worker._limits_type()._fields == worker.LIMIT_FIELDS


def test_the_collectors_headroom_leaves_nothing_in_a_shared_context():
    # A fork server's context is made with room for a run without a
    # collection: the allocations that make that room are all gone again.
    ctx, bridge = engine.prepare(False)
    bridge("load converter")
    plain = ctx.memory()
    shared = engine.prepare(True)[0].memory()
    for field in ("obj_count", "js_func_count", "array_count", "str_count", "shape_count"):
        assert shared[field] <= plain[field], field
    assert shared["malloc_size"] < plain["malloc_size"] + 4096


def test_the_workers_json_codec_writes_and_reads_what_the_json_module_does():
    loads, dumps = worker._json()
    assert worker._json() == (loads, dumps)
    hello = {
        "pid": 123,
        "os_bounds": {"rlimits": {"RLIMIT_CORE": 0}, "seccomp": {"arch": "x86_64", "allowed": ["read"]}},
        "prepared": True,
        "text": 'quotes " and \\ and \u00e9 and \ud83d\ude00 and \x00',
        "none": None,
        "float": 1.5,
        "nan": float("nan"),
    }
    assert dumps(hello) == json.dumps(hello)
    spec = {"program": "return '\u00e9\U0001f600 \ud800';", "limits": [1.5, 2, None], "names_lazy": True}
    text = json.dumps(spec).encode("utf-8", "surrogatepass")
    assert loads(text) == json.loads(text) == spec
    raw = json.dumps(spec, ensure_ascii=False).encode("utf-8", "surrogatepass")
    assert loads(raw) == spec
    assert loads(bytearray(text)) == spec
    with pytest.raises(TypeError):
        dumps({"x": object()})


def test_a_fork_servers_child_gets_a_performance_clock_of_its_own_run():
    # The context was prepared by the fork server well before the run: the
    # run's clock counts from the run's start all the same.
    with WorkerPool(size=2, spares=1) as pool:
        pool.prestart(1)
        assert pool.wait_for_spares(30.0)
        time.sleep(1.5)
        r = run_code(
            "return [performance.now(), Date.now() - performance.timeOrigin]",
            [echo_tool()],
            runtime=pool,
            description="test",
        )
    assert r.ok, r.error
    assert 0 <= r.result[0] < 1000 and 0 <= r.result[1] < 1000


def _zombies_under(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as fh:
            for child in fh.read().split():
                try:
                    with open(f"/proc/{child}/stat", encoding="ascii") as st:
                        if st.read().rsplit(")", 1)[1].split()[0] == "Z":
                            found.append(int(child))
                except FileNotFoundError:
                    pass
    return found


def test_a_fork_server_reaps_its_discarded_workers_once_the_pool_is_idle():
    # Exited children are reaped at the server's next message: a spawn, a
    # status asked for, or the nudge of the spares thread that reaped them
    # as it ends (here no spare replaces the last run's worker).
    pool = WorkerPool(size=2, spares=0)
    try:
        for _ in range(6):
            assert run_code("return 1", runtime=pool, description="test").result == 1
        server = pool._server.proc.pid
        deadline = time.monotonic() + 30.0
        while _zombies_under(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _zombies_under(server) == []
    finally:
        pool.close()


def test_a_closed_fork_server_reaps_its_children_and_exits_by_itself():
    pool = WorkerPool(size=2, spares=1)
    for _ in range(3):
        assert run_code("return 1", runtime=pool, description="test").result == 1
    server = pool._server
    pool.close()
    assert server.proc.returncode == 0, "it exited at end of file, not killed with its zombies"


def test_a_workers_exit_status_comes_from_its_fork_server_on_request():
    # The server reports a child's status when asked (it reaps at each message).
    with WorkerPool(size=1, spares=0) as pool:
        pool.prestart(1)
        w = next(iter(pool._workers.values()))
        os.kill(w.proc.pid, signal.SIGKILL)
        assert w.proc.wait(10.0) == -signal.SIGKILL


def _switches(pid: int) -> int:
    """How often ``pid`` has gone to sleep (each wake-up ends in one more)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("voluntary_ctxt_switches:"))


def test_an_idle_fork_server_sleeps():
    # It looks for exited children for a while after its last message, then
    # sleeps until the next one, though it has a child (the spare) alive.
    with WorkerPool(size=2, spares=1) as pool:
        assert run_code("return 1", runtime=pool, description="test").result == 1
        assert pool.wait_for_spares(30.0)
        server = pool._server.proc.pid
        quiet = pool_module.SPARES_LINGER + worker.REAP_EVERY * worker.REAP_LOOKS + 1.0
        time.sleep(quiet)
        before = _switches(server)
        time.sleep(2 * worker.REAP_EVERY + 0.5)
        assert _switches(server) == before, "the server woke with nothing to do"


def _minor_faults(pid: int) -> int:
    """Page faults ``pid`` has taken (every thread's), copies on write among them."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[7])


def _first_step_faults(program: str, runs: int = 3) -> list[int]:
    """The page faults of ``program``'s first step (from its run frame to its
    first tool call) in each of ``runs`` spares of one fork server. (The
    server's first child is forked before the rehearsal: a run takes it first.)"""
    faulted = []
    with WorkerPool(size=2, spares=1) as pool:
        assert run_code("return 1", runtime=pool, description="test").result == 1
        for _ in range(runs):
            assert pool.wait_for_spares(30.0)
            (pid,) = pool.pids()
            before = _minor_faults(pid)
            seen: list[int] = []

            def probe(args: object, seen: list[int] = seen, pid: int = pid) -> int:
                if not seen:
                    seen.append(_minor_faults(pid))
                return 1

            r = run_code(program, [Tool("probe", probe)], runtime=pool, description="test")
            assert r.ok, r.error
            faulted.append(seen[0] - before)
    return faulted


def test_a_spare_has_made_the_copies_its_runs_first_step_would_make():
    # The fork server's rehearsal found the pages a run's first step writes;
    # each spare wrote them while it booted. Without that, the step in a
    # fresh worker faulted 130 times (each a copy of the server's page);
    # with it, about 25 (the pages no rehearsal predicts).
    for faulted in _first_step_faults("return await tools.probe({});"):
        assert faulted < 90, f"the first step faulted {faulted} times"


def test_a_spare_has_made_the_pages_a_fan_outs_first_step_writes():
    # A 50-call Promise.all's first step puts its new objects on about 45
    # pages at the heap's top, which the server leaves unwritten and the
    # rehearsal's own fan-out names: each spare wrote them while it booted.
    # Without that, the step faulted about 70 times; with it, about 30.
    program = "return (await Promise.all(Array.from({ length: 50 }, (_, i) => tools.probe({ i })))).length;"
    for faulted in _first_step_faults(program):
        assert faulted < 50, f"the fan-out's first step faulted {faulted} times"


def test_write_ahead_ranges_are_whole_pages_of_the_servers_private_mappings_or_none():
    page = os.sysconf("SC_PAGE_SIZE")
    write, read = worker._POPULATE_WRITE, worker._POPULATE_READ
    regions = [(16 * page, 32 * page, write), (32 * page, 40 * page, read), (100 * page, 101 * page, write)]
    at = [17 * page, 18 * page, 20 * page, 23 * page, 31 * page, 32 * page, 100 * page]
    # A one-page gap is bridged; never across two mappings, though they touch;
    # each range with its mapping's advice.
    assert worker._ranges(at, regions) == (
        (17 * page, 4 * page, write),
        (23 * page, page, write),
        (31 * page, page, write),
        (32 * page, page, read),
        (100 * page, page, write),
    )
    assert worker._ranges([], regions) == ()
    assert worker._ranges([17 * page + 8], regions) == (), "not a page"
    assert worker._ranges([17 * page, 50 * page], regions) == (), "not the server's"
    many = [16 * page + i * 2 * page for i in range(worker.WRITE_AHEAD_PAGES + 1)]
    assert worker._ranges(many, [(16 * page, 16 * page + len(many) * 2 * page, write)]) == (), "too many"


def test_a_fork_server_maps_no_openssl_library_and_keys_names_as_hashlib_does():
    # The names cache's digest comes from CPython's own BLAKE2 module:
    # hashlib would load OpenSSL's library into the server (about 2.5 ms of
    # its boot) and its mappings into every worker it forks.
    with WorkerPool(size=1, spares=0) as pool:
        assert run_code("return 1", runtime=pool, description="test").result == 1
        with open(f"/proc/{pool._server.proc.pid}/maps", encoding="ascii", errors="replace") as fh:
            mapped = fh.read()
    assert "libcrypto" not in mapped and "_hashlib" not in mapped
    import hashlib

    text = engine.names_json(["a", "b"])[0].encode()
    assert engine.names_key(text) == hashlib.blake2b(text, digest_size=16).hexdigest().encode("ascii")

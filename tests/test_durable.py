"""Durable approval (nous_sched/durable/).

Most tests run each step in a process of its own (tests/durable/proc.py): one
process suspends, another resumes, and the tools count every run in a file
both share (tests/durable/durable_tools.py), so "ran exactly once" is counted
across processes, not assumed.
"""

import json
import os
import sqlite3
import subprocess
import sys

import pytest

import nous_sched
from nous_sched import (
    DEFER,
    ApprovalDecision,
    QuickJSRuntime,
    SqliteApprovalStore,
    TokenError,
    resume,
    run_code,
)
from nous_sched.durable import approval_store as approval_store_module

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durable")
sys.path.insert(0, HERE)

import durable_tools  # noqa: E402

PROC = os.path.join(HERE, "proc.py")
BOUND = 120  # generous: a loaded 2-core machine


@pytest.fixture
def env(tmp_path, monkeypatch):
    count = str(tmp_path / "ran.jsonl")
    monkeypatch.setenv("NOUS_DURABLE_COUNT", count)
    environ = dict(os.environ, NOUS_DURABLE_COUNT=count)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environ["PYTHONPATH"] = root + os.pathsep + environ.get("PYTHONPATH", "")
    return {"count": count, "env": environ, "tmp": tmp_path, "store": "sqlite:" + str(tmp_path / "approvals.db")}


def _proc(env, *args):
    done = subprocess.run(
        [sys.executable, PROC, *args], env=env["env"], capture_output=True, text=True, timeout=BOUND, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _run(env, program, *extra):
    path = env["tmp"] / "program.js"
    path.write_text(program, encoding="utf-8")
    return _proc(env, "run", env["store"], str(path), *extra)


def _resume(env, token, decisions):
    return _proc(env, "resume", env["store"], token, json.dumps({str(k): d for k, d in decisions.items()}))


def _reseal(db, token, record):
    """Write ``record`` into ``token``'s row sealed with the store's own key: what
    only the key's holder can do (a test of replay, not of tampering)."""
    sid, expires, _ = token.split(".")
    (key,) = db.execute("SELECT value FROM nous_meta WHERE name = 'hmac_key'").fetchone()
    seal = approval_store_module._mac(bytes(key), approval_store_module._record_body(sid, float(expires), record))
    db.execute("UPDATE nous_suspensions SET record = ?, seal = ? WHERE id = ?", (record, seal, sid))
    db.commit()


def _ran(env):
    return durable_tools.ran(env["count"])


def _pending(shown):
    return shown["out"]["suspended"]["pending"]


PROMISE_ALL = """
const first = await tools.read({i: 1});
const stamp = Date.now();
const noise = Math.random();
console.log("noise", noise);
const [a, paid, b] = await Promise.all([tools.read({i: 2}), tools.pay({amount: 5}), tools.read({i: 3})]);
const last = await tools.read({i: 4, after: paid.paid});
return {first, a, paid, b, last, stamp, noise};
"""


def test_suspends_in_one_process_and_resumes_in_another(env):
    suspended = _run(env, PROMISE_ALL)
    (request,) = _pending(suspended)
    assert request["tool"] == "pay" and request["arguments"] == {"amount": 5}
    assert request["seq"] == 2 and request["description"] == "a test"
    assert request["site"] == "6:67"  # where the program names tools.pay
    assert [c["seq"] for c in request["committed"]] == [0, 1]
    assert suspended["audit"][0][0] == "suspended"
    # Before the suspension: the two reads that started, once; not the read after the gated call.
    assert _ran(env) == [["read", {"i": 1}], ["read", {"i": 2}]]

    done = _resume(env, suspended["token"], {2: True})
    out = done["out"]
    assert out["result"]["paid"] == {"paid": 5}
    assert out["result"]["last"] == {"read": 4}
    assert out["logs"] == suspended["out"]["logs"] == [f"noise {out['result']['noise']}"]
    # Each call ran exactly once across both processes.
    assert _ran(env) == [
        ["read", {"i": 1}],
        ["read", {"i": 2}],
        ["pay", {"amount": 5}],
        ["read", {"i": 3}],
        ["read", {"after": 5, "i": 4}],
    ]
    # The replayed calls are not audited again as started: only the calls that ran in this process.
    assert done["started"] == [["pay", {"amount": 5}], ["read", {"i": 3}], ["read", {"after": 5, "i": 4}]]
    assert suspended["started"] == [["read", {"i": 1}], ["read", {"i": 2}]]
    kinds = [event[0] for event in done["audit"]]
    assert kinds == ["resumed", "approval"]
    assert done["audit"][1][1] == {"seq": 2, "tool": "pay", "approved": True, "reason": "approved"}


def test_promise_all_commits_are_those_of_an_unsuspended_auto_approving_run(env):
    baseline = _run(env, PROMISE_ALL, "auto")
    baseline_ran = _ran(env)
    os.remove(env["count"])
    suspended = _run(env, PROMISE_ALL)
    done = _resume(env, suspended["token"], {2: True})
    assert _ran(env) == baseline_ran
    result, expected = done["out"]["result"], baseline["out"]["result"]
    # Everything but the clock values the two runs read (each its own, replayed in the second).
    for key in ("first", "a", "paid", "b", "last"):
        assert result[key] == expected[key]


def test_two_gated_calls_in_sequence_suspend_twice(env):
    program = """
    const one = await tools.pay({amount: 1});
    const two = await tools.pay({amount: 2});
    return [one.paid, two.paid];
    """
    first = _run(env, program)
    assert [p["seq"] for p in _pending(first)] == [0]
    second = _resume(env, first["token"], {0: True})
    assert [p["arguments"] for p in _pending(second)] == [{"amount": 2}]
    assert [c["seq"] for c in _pending(second)[0]["committed"]] == [0]
    done = _resume(env, second["token"], {1: True})
    assert done["out"]["result"] == [1, 2]
    assert _ran(env) == [["pay", {"amount": 1}], ["pay", {"amount": 2}]]


def test_a_parallel_window_with_two_gated_calls_is_one_suspension_with_two_pending(env):
    program = """
    const r = await Promise.all([tools.pay({amount: 1}), tools.read({i: 0}), tools.pay({amount: 2})]);
    return r;
    """
    suspended = _run(env, program)
    assert [(p["seq"], p["arguments"]) for p in _pending(suspended)] == [(0, {"amount": 1}), (2, {"amount": 2})]
    assert _ran(env) == []  # the read comes after the first gated call: not started
    done = _resume(env, suspended["token"], {0: True, 2: False})
    assert done["out"]["error"]["kind"] == "exception"
    assert "was denied approval" in done["out"]["error"]["message"]
    assert _ran(env) == [["pay", {"amount": 1}], ["read", {"i": 0}]]


def test_denial_rejects_in_the_program_with_the_reason_and_is_audited(env, tmp_path):
    store = SqliteApprovalStore(str(tmp_path / "deny.db"))
    program = """
    try { await tools.pay({amount: 9}); return "paid"; }
    catch (e) { return [e.name, e.tool, e.message]; }
    """
    suspended = run_code(
        program, durable_tools.TOOLS, approval_store=store, runtime=QuickJSRuntime(), description="test"
    )
    assert suspended.suspended is not None and not suspended.ok
    done = resume(
        suspended.suspended.token,
        {0: ApprovalDecision(False, "over budget")},
        durable_tools.TOOLS,
        approval_store=store,
        runtime=QuickJSRuntime(),
    )
    assert done.result == ["ToolError", "pay", 'tool "pay" was denied approval: over budget']
    approval = [e for e in done.audit if e.type == "approval"]
    assert [dict(e.data) for e in approval] == [{"seq": 0, "tool": "pay", "approved": False, "reason": "over budget"}]
    assert _ran(env) == []


def test_a_call_that_differs_from_the_ledger_is_replay_diverged_and_runs_nothing(env):
    suspended = _run(env, PROMISE_ALL)
    before = _ran(env)
    db = sqlite3.connect(env["store"].partition(":")[2])
    (record,) = db.execute("SELECT record FROM nous_suspensions").fetchone()
    changed = json.loads(record)
    changed["ledger"][0][2] = '{"i":99}'  # the run that suspended called read({i: 99}) first
    _reseal(db, suspended["token"], json.dumps(changed))  # as the key's holder would: not tampering
    db.close()
    done = _resume(env, suspended["token"], {2: True})
    assert done["out"]["error"]["kind"] == "replay_diverged"
    assert "call #0" in done["out"]["error"]["message"]
    assert _ran(env) == before


def test_another_tool_set_is_replay_diverged_and_keeps_the_token(env, tmp_path):
    store = SqliteApprovalStore(str(tmp_path / "tools.db"))
    suspended = run_code(
        "return await tools.pay({amount: 1})", durable_tools.TOOLS, approval_store=store, description="test"
    )
    other = [*durable_tools.TOOLS[:1], nous_sched.Tool("pay", lambda a: 0, requires_approval=True)]
    wrong = resume(suspended.suspended.token, {0: True}, other, approval_store=store)
    assert wrong.error.kind == "replay_diverged"
    right = resume(suspended.suspended.token, {0: True}, durable_tools.TOOLS, approval_store=store)
    assert right.result == {"paid": 1}


def _race(env, store_spec, token):
    procs = [
        subprocess.Popen(
            [sys.executable, PROC, "resume", store_spec, token, '{"0": true}', "wait"],
            env=env["env"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for p in procs:  # both are ready: open the barrier for both at once
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=BOUND)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def _spec(env, kind, request):
    """A store's spec for tests/durable/proc.py: the test's SQLite file, the session's Redis, a fresh Postgres database."""
    if kind == "sqlite":
        return env["store"]
    if kind == "redis":
        return "redis:" + request.getfixturevalue("redis_url")
    return "postgres:" + request.getfixturevalue("postgres_dsn")


@pytest.mark.parametrize("kind", ["sqlite", "redis", "postgres"])
def test_two_racing_resumes_exactly_one_wins(env, kind, request):
    spec = _spec(env, kind, request)
    path = env["tmp"] / "program.js"
    path.write_text("return await tools.pay({amount: 3})", encoding="utf-8")
    suspended = _proc(env, "run", spec, str(path))
    outs = _race(env, spec, suspended["token"])
    winners = [o for o in outs if "out" in o]
    losers = [o for o in outs if "token_error" in o]
    assert len(winners) == 1 and len(losers) == 1
    assert winners[0]["out"]["result"] == {"paid": 3}
    assert "already" in losers[0]["token_error"]
    assert _ran(env) == [["pay", {"amount": 3}]]


@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_a_shared_store_suspends_and_resumes_across_processes(env, kind, request):
    env["store"] = _spec(env, kind, request)
    suspended = _run(env, PROMISE_ALL)
    done = _resume(env, suspended["token"], {2: True})
    assert done["out"]["result"]["last"] == {"read": 4}
    assert len(_ran(env)) == 5


def test_a_tampered_or_forged_token_is_refused(env, tmp_path):
    store = SqliteApprovalStore(str(tmp_path / "t.db"))
    suspended = run_code(
        "return await tools.pay({amount: 1})", durable_tools.TOOLS, approval_store=store, description="test"
    )
    token = suspended.suspended.token
    sid, expires, mac = token.split(".")
    for bad in (
        f"{sid}.{int(expires) + 3600}.{mac}",  # a later expiry
        f"{sid[:-1]}{'y' if sid[-1] == 'x' else 'x'}.{expires}.{mac}",  # another suspension (never the same id)
        "made.up.token",
        "nonsense",
    ):
        with pytest.raises(TokenError):
            resume(bad, {0: True}, durable_tools.TOOLS, approval_store=store)
    other = SqliteApprovalStore(str(tmp_path / "other.db"))  # another key
    with pytest.raises(TokenError, match="not signed by this store"):
        resume(token, {0: True}, durable_tools.TOOLS, approval_store=other)
    assert _ran(env) == []
    assert resume(token, {0: True}, durable_tools.TOOLS, approval_store=store).result == {"paid": 1}


def test_an_expired_token_is_refused(env, tmp_path, monkeypatch):
    store = SqliteApprovalStore(str(tmp_path / "e.db"), ttl=60)
    suspended = run_code(
        "return await tools.pay({amount: 1})", durable_tools.TOOLS, approval_store=store, description="test"
    )
    later = approval_store_module.time.time() + 61
    monkeypatch.setattr(approval_store_module, "_now", lambda: later)
    with pytest.raises(TokenError, match="expired"):
        resume(suspended.suspended.token, {0: True}, durable_tools.TOOLS, approval_store=store)
    assert _ran(env) == []


def test_a_resuming_process_that_dies_mid_call_waits_for_a_person_then_finishes(env):
    program = """
    const paid = await tools.pay({amount: 4});
    try { await tools.crash({}); } catch (e) { return [paid, e.message]; }
    return paid;
    """
    suspended = _run(env, program)
    died = subprocess.run(
        [sys.executable, PROC, "resume", env["store"], suspended["token"], '{"0": true}'],
        env=env["env"],
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=False,
    )
    assert died.returncode == 17
    # Not handed out blindly: the call in flight when the process died may have run.
    again = _resume(env, suspended["token"], {0: True})
    assert again["unsettled"] == [1] and "crash" in again["token_error"]
    store = SqliteApprovalStore(env["store"].partition(":")[2])
    (row,) = store.suspensions()
    assert row["state"] == "claimed" and row["claimed_by"].startswith("pid ")
    assert row["resume"]["alive"] is False and row["resume"]["committed"] == [0]
    assert row["resume"]["in_flight"] == [{"seq": 1, "tool": "crash", "arguments": {}, "settled": None}]
    with pytest.raises(nous_sched.ConfigError, match="fate is unknown"):
        store.settle(suspended["token"], 0, True)  # committed: not a call to settle
    assert store.settle(suspended["token"], 1, True)["settled"] == "ran"
    done = _resume(env, suspended["token"], {0: True})
    paid, message = done["out"]["result"]
    assert paid == {"paid": 4} and "result was lost" in message
    assert [e[1].get("took_over", "")[:4] for e in done["audit"] if e[0] == "resumed"] == ["pid "]
    assert _ran(env) == [["pay", {"amount": 4}], ["crash", {}]]


def test_a_live_resume_is_never_taken_over_or_settled(env, tmp_path):
    store = SqliteApprovalStore(str(tmp_path / "live.db"))
    suspended = run_code(
        "return await tools.pay({amount: 1})", durable_tools.TOOLS, approval_store=store, description="test"
    )
    token = suspended.suspended.token
    store.claim(token, {"tracked": True, "started": {"0": ["pay", '{"amount":1}']}, "settled": {}})
    # This process holds the claim and is alive: neither a resume nor a settle may touch it.
    with pytest.raises(TokenError, match="has not finished"):
        resume(token, {0: True}, durable_tools.TOOLS, approval_store=store)
    with pytest.raises(TokenError, match="still running"):
        store.settle(token, 0, False)
    assert _ran(env) == []


def test_a_forged_not_ran_is_refused(env):
    # A writer without the key rewrites the progress to say the call in flight never started.
    program = "const paid = await tools.pay({amount: 4});\nawait tools.crash({});\nreturn paid;"
    suspended = _run(env, program)
    subprocess.run(
        [sys.executable, PROC, "resume", env["store"], suspended["token"], '{"0": true}'],
        env=env["env"],
        capture_output=True,
        timeout=BOUND,
        check=False,
    )
    sid = suspended["token"].split(".")[0]
    db = sqlite3.connect(env["store"].partition(":")[2])
    (text,) = db.execute("SELECT progress FROM nous_suspensions WHERE id = ?", (sid,)).fetchone()
    forged = json.loads(text)
    forged["settled"] = {"1": "not-ran"}
    db.execute("UPDATE nous_suspensions SET progress = ? WHERE id = ?", (json.dumps(forged), sid))
    db.commit()
    db.close()
    again = _resume(env, suspended["token"], {0: True})
    assert "progress in the store was changed without the store's key" in again["token_error"]
    (row,) = SqliteApprovalStore(env["store"].partition(":")[2]).suspensions()
    assert row["state"] == "tampered"
    assert _ran(env) == [["pay", {"amount": 4}], ["crash", {}]]


def test_a_handler_that_defers_suspends_and_one_that_approves_does_not(env, tmp_path, runtime):
    store = SqliteApprovalStore(str(tmp_path / "h.db"))
    program = "const a = await tools.pay({amount: 1}); const b = await tools.pay({amount: 2}); return [a, b]"
    asked = []

    def handler(request):
        asked.append((request.seq, request.arguments))
        return True if request.arguments["amount"] == 1 else DEFER

    suspended = run_code(
        program, durable_tools.TOOLS, approval_store=store, approval_handler=handler, description="test"
    )
    assert [p.seq for p in suspended.suspended.pending] == [1]
    assert asked == [(0, {"amount": 1}), (1, {"amount": 2})]
    done = resume(suspended.suspended.token, {1: True}, durable_tools.TOOLS, approval_store=store)
    assert done.result == [{"paid": 1}, {"paid": 2}]
    assert _ran(env) == [["pay", {"amount": 1}], ["pay", {"amount": 2}]]


def test_the_clock_is_replayed(env, tmp_path, runtime):
    store = SqliteApprovalStore(str(tmp_path / "c.db"))
    program = """
    const before = [Date.now(), new Date().getTime(), Math.random(), performance.now(), String(new Date())];
    console.log(JSON.stringify(before));
    await tools.pay({amount: 1});
    return {before, after: [Date.now(), Math.random()]};
    """
    suspended = run_code(program, durable_tools.TOOLS, approval_store=store, description="test")
    (line,) = suspended.logs
    done = resume(suspended.suspended.token, {0: True}, durable_tools.TOOLS, approval_store=store)
    assert done.logs == (line,)
    assert done.result["before"] == json.loads(line)
    assert all(isinstance(x, (int, float)) for x in done.result["after"])


def test_decisions_must_cover_every_pending_call_and_the_token_survives(env, tmp_path):
    store = SqliteApprovalStore(str(tmp_path / "d.db"))
    suspended = run_code(
        "return await tools.pay({amount: 1})", durable_tools.TOOLS, approval_store=store, description="test"
    )
    with pytest.raises(nous_sched.ConfigError, match="no decision for seq"):
        resume(suspended.suspended.token, {}, durable_tools.TOOLS, approval_store=store)
    store.decide(suspended.suspended.token, 0, True, "operator said so")
    done = resume(suspended.suspended.token, {}, durable_tools.TOOLS, approval_store=store)
    assert done.result == {"paid": 1}
    assert [dict(e.data)["reason"] for e in done.audit if e.type == "approval"] == ["operator said so"]


PARKED_PROGRAM = """
const r = await tools.read({i: 1});
console.log("stamp", Date.now() > 0, Math.random() < 1);
const [a, paid, b] = await Promise.all([tools.read({i: 2}), tools.pay({amount: 5}), tools.read({i: 3})]);
return {r, a, paid, b};
"""


def _parked_threads():
    import threading

    return [t for t in threading.enumerate() if t.name.startswith("nous-sched-parked-")]


def test_a_run_parked_in_this_process_resumes_without_replay(env, tmp_path, runtime):
    store = SqliteApprovalStore(str(tmp_path / "park.db"), park=120)
    suspended = run_code(PARKED_PROGRAM, durable_tools.TOOLS, approval_store=store, timeout=120, description="test")
    assert [p.seq for p in suspended.suspended.pending] == [2]
    done = resume(suspended.suspended.token, {2: True}, durable_tools.TOOLS, approval_store=store)
    assert done.result == {"r": {"read": 1}, "a": {"read": 2}, "paid": {"paid": 5}, "b": {"read": 3}}
    assert done.logs == ("stamp true true",)
    assert dict(done.audit[0].data)["parked"] is True and dict(done.audit[0].data)["replayed"] == 0
    assert _ran(env) == [["read", {"i": 1}], ["read", {"i": 2}], ["pay", {"amount": 5}], ["read", {"i": 3}]]
    with pytest.raises(TokenError, match="already used"):
        resume(suspended.suspended.token, {2: True}, durable_tools.TOOLS, approval_store=store)


def test_a_parked_run_whose_time_passed_is_replayed_with_the_same_result(env, tmp_path):
    before = set(_parked_threads())
    store = SqliteApprovalStore(str(tmp_path / "late.db"), park=0.01)
    suspended = run_code(
        PARKED_PROGRAM, durable_tools.TOOLS, approval_store=store, runtime=QuickJSRuntime(), description="test"
    )
    for thread in set(_parked_threads()) - before:
        thread.join(BOUND)  # the park time passes: the parked run ends
    done = resume(suspended.suspended.token, {2: True}, durable_tools.TOOLS, approval_store=store)
    assert "parked" not in dict(done.audit[0].data) and dict(done.audit[0].data)["replayed"] == 2
    assert done.result == {"r": {"read": 1}, "a": {"read": 2}, "paid": {"paid": 5}, "b": {"read": 3}}
    assert done.logs == ("stamp true true",)
    assert _ran(env) == [["read", {"i": 1}], ["read", {"i": 2}], ["pay", {"amount": 5}], ["read", {"i": 3}]]


def test_the_recorded_clock_is_bounded(env, tmp_path, monkeypatch):
    from nous_sched.durable import _replay as durable

    monkeypatch.setattr(durable, "MAX_CLOCK_VALUES", 50)
    store = SqliteApprovalStore(str(tmp_path / "bound.db"))
    program = "let s = 0; for (let i = 0; i < 1000; i++) s += Math.random(); await tools.pay({amount: 1}); return s;"
    result = run_code(program, durable_tools.TOOLS, approval_store=store, runtime=QuickJSRuntime(), description="test")
    assert result.error.kind == "abort" and "more than 50 times" in result.error.message
    assert result.suspended is None and store.suspensions() == []


def test_a_damaged_record_is_refused_before_the_token_is_claimed(env, tmp_path):
    path = str(tmp_path / "damaged.db")
    store = SqliteApprovalStore(path)
    suspended = run_code(
        PROMISE_ALL, durable_tools.TOOLS, approval_store=store, runtime=QuickJSRuntime(), description="test"
    )
    db = sqlite3.connect(path)
    (good,) = db.execute("SELECT record FROM nous_suspensions").fetchone()
    damaged = (
        good[:-1],  # not JSON
        good.replace('"clock":[', '"clock":[NaN,', 1),  # not strict JSON
        json.dumps({**json.loads(good), "ledger": [[0]]}),  # a ledger entry of the wrong shape
    )
    for bad in damaged:
        db.execute("UPDATE nous_suspensions SET record = ?", (bad,))
        db.commit()
        with pytest.raises(TokenError, match="tampered"):  # changed without the key
            resume(suspended.suspended.token, {2: True}, durable_tools.TOOLS, approval_store=store)
        _reseal(db, suspended.suspended.token, bad)  # written so by the key's holder: damaged all the same
        with pytest.raises(TokenError, match="damaged"):
            resume(suspended.suspended.token, {2: True}, durable_tools.TOOLS, approval_store=store)
    _reseal(db, suspended.suspended.token, good)
    db.close()
    assert resume(suspended.suspended.token, {2: True}, durable_tools.TOOLS, approval_store=store).ok


def test_a_resume_with_a_bad_option_runs_nothing_and_keeps_the_token(env, tmp_path):
    store = SqliteApprovalStore(str(tmp_path / "option.db"))
    suspended = run_code(
        "return await tools.pay({amount: 1})", durable_tools.TOOLS, approval_store=store, description="test"
    )
    with pytest.raises(nous_sched.ConfigError, match="timeout"):
        resume(suspended.suspended.token, {0: True}, durable_tools.TOOLS, approval_store=store, timeout=-1)
    assert _ran(env) == []
    assert resume(suspended.suspended.token, {0: True}, durable_tools.TOOLS, approval_store=store).result == {"paid": 1}


def _store_paused_after_load(kind, tmp_path, request):
    """A store whose ``load`` (decide's first read) stops, once, until told to go on:
    so another operator's decision, or a claim, lands between decide's read and its write."""
    import threading

    base = {
        "sqlite": SqliteApprovalStore,
        "redis": nous_sched.RedisApprovalStore,
        "postgres": nous_sched.PostgresApprovalStore,
    }[kind]

    class Paused(base):  # type: ignore[misc, valid-type]
        read = threading.Event()
        go = threading.Event()
        paused = False

        def load(self, token):
            record = super().load(token)
            if not Paused.paused:
                Paused.paused = True
                Paused.read.set()
                assert Paused.go.wait(BOUND)
            return record

    if kind == "sqlite":
        return Paused(str(tmp_path / "paused.db"))
    if kind == "postgres":
        return Paused(request.getfixturevalue("postgres_dsn"))
    return Paused(request.getfixturevalue("redis_url"), prefix=f"paused-{os.getpid()}-{id(Paused)}")


def _suspension_of_two(store):
    token, _ = store.save({"description": "two gated calls", "pending": [{"seq": 0}, {"seq": 1}]})
    return token


@pytest.mark.parametrize("kind", ["sqlite", "redis", "postgres"])
def test_two_operators_deciding_two_calls_at_once_both_land(kind, tmp_path, request):
    import threading

    store = _store_paused_after_load(kind, tmp_path, request)
    token = _suspension_of_two(store)
    first = threading.Thread(target=store.decide, args=(token, 0, True, "first"))
    first.start()
    assert type(store).read.wait(BOUND)  # the first decide has read the decisions
    store.decide(token, 1, False, "second")  # and the second decides in between
    type(store).go.set()
    first.join(BOUND)
    assert store.load(token)["decisions"] == {
        "0": {"approved": True, "reason": "first"},
        "1": {"approved": False, "reason": "second"},
    }


@pytest.mark.parametrize("kind", ["sqlite", "redis", "postgres"])
def test_a_decision_that_loses_the_race_with_a_claim_is_refused(kind, tmp_path, request):
    import threading

    store = _store_paused_after_load(kind, tmp_path, request)
    token = _suspension_of_two(store)
    refused = []

    def decide():
        try:
            store.decide(token, 0, True, "too late")
        except TokenError as exc:
            refused.append(str(exc))

    late = threading.Thread(target=decide)
    late.start()
    assert type(store).read.wait(BOUND)
    claimed = store.claim(token)  # a resume begins between the decision's read and its write
    type(store).go.set()
    late.join(BOUND)
    assert claimed["decisions"] == {}
    assert len(refused) == 1 and "already claimed" in refused[0]
    assert [row["decisions"] for row in store.suspensions() if row["token"] == token] == [{}]


def test_a_token_never_starts_with_a_dash_so_a_shell_command_takes_it_as_an_argument(tmp_path):
    # (One token in 64 did: `nous-sched approvals approve -x...` read it as an option.)
    store = SqliteApprovalStore(str(tmp_path / "tokens.db"))
    tokens = [store.save({"n": n})[0] for n in range(300)]
    assert all(token[0] in "0123456789abcdef" for token in tokens), [t for t in tokens if t[0] == "-"]
    assert [store.load(token)["n"] for token in tokens[:3]] == [0, 1, 2]


def test_a_store_that_only_implements_the_seam_suspends_and_resumes(env, tmp_path):
    # RunOptions takes any ApprovalStoreSeam; resume takes the same (not only the library's stores).
    from nous_sched import ApprovalStoreSeam

    class Delegating(ApprovalStoreSeam):
        def __init__(self, inner):
            self.inner, self.park = inner, inner.park

        def save(self, record):
            return self.inner.save(record)

        def load(self, token):
            return self.inner.load(token)

        def claim(self, token, first_progress=None):
            return self.inner.claim(token, first_progress)

        def finish(self, token):
            self.inner.finish(token)

        def release(self, token):
            self.inner.release(token)

        def decide(self, token, seq, approved, reason=""):
            self.inner.decide(token, seq, approved, reason)

        def suspensions(self):
            return self.inner.suspensions()

        def write_progress(self, token, by, progress):
            return self.inner.write_progress(token, by, progress)

        def claimed(self, token):
            return self.inner.claimed(token)

        def take_over(self, token, found):
            return self.inner.take_over(token, found)

        def settle(self, token, seq, ran):
            return self.inner.settle(token, seq, ran)

    store = Delegating(SqliteApprovalStore(str(tmp_path / "seam.db")))
    suspended = run_code(
        PARKED_PROGRAM, durable_tools.TOOLS, approval_store=store, runtime=QuickJSRuntime(), description="test"
    )
    assert [p.seq for p in suspended.suspended.pending] == [2]
    done = resume(suspended.suspended.token, {2: True}, durable_tools.TOOLS, approval_store=store)
    assert done.result == {"r": {"read": 1}, "a": {"read": 2}, "paid": {"paid": 5}, "b": {"read": 3}}
    assert _ran(env) == [["read", {"i": 1}], ["read", {"i": 2}], ["pay", {"amount": 5}], ["read", {"i": 3}]]

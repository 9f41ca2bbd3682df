"""Grants (nous_sched/gate/grants.py): one approval answer for many calls.

The live handler's answers (run_code, start_run, call_tool), the durable
stores' (across two processes: tests/durable/proc.py), and the audit records
that point at the grant.
"""

import json
import os
import sqlite3
import subprocess
import sys
import threading
from typing import Any

import pytest

import nous_sched
from nous_sched import (
    ApprovalDecision,
    ConfigError,
    Grant,
    SqliteApprovalStore,
    TokenError,
    call_tool,
    function_tool,
    resume,
    run_code,
    start_run,
)
from nous_sched.gate import approval_text
from nous_sched.gate.grants import Grants, answer_of

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durable")
sys.path.insert(0, HERE)

import durable_tools  # noqa: E402

PROC = os.path.join(HERE, "proc.py")
BOUND = 120

FORTY_THEN_ONE = """
for (let i = 0; i < 40; i++) await tools.write({table: "orders", row: i});
let last;
try { last = await tools.write({table: "users", row: 99}); } catch (e) { last = e.message; }
return last;
"""


class Handler:
    """An approval handler that answers from a list (the last answer repeats) and keeps every request."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.asked = []
        self.lock = threading.Lock()

    def __call__(self, request):
        with self.lock:
            self.asked.append(request)
            return self.answers[min(len(self.asked), len(self.answers)) - 1]


def _writer():
    ran = []
    lock = threading.Lock()

    @function_tool(requires_approval=True)
    def write(table: str, row: int) -> int:
        """Write one row."""
        with lock:
            ran.append((table, row))
        return row

    return write, ran


@function_tool(requires_approval=True)
def drop(table: str) -> str:
    """Drop a table."""
    return table


def _approvals(result):
    return [dict(e.as_event().data) for e in result.events if e.type == "approval"]


def _run(code, tools, handler, **options):
    return run_code(code, tools, approval_handler=handler, description="writes rows", **options)


# -- the live handler -------------------------------------------------------------


def test_forty_writes_answered_by_one_grant_and_the_41st_outside_it_asks_again():
    write, ran = _writer()
    handler = Handler(Grant(matching={"table": "orders"}), False)
    result = _run(FORTY_THEN_ONE, [write], handler)
    assert result.error is None, result.error
    assert [r.arguments for r in handler.asked] == [{"table": "orders", "row": 0}, {"table": "users", "row": 99}]
    assert ran == [("orders", i) for i in range(40)]
    assert "rejected by the approval handler" in result.result
    records = _approvals(result)
    assert len(records) == 41
    granted, covered, refused = records[0], records[1:40], records[40]
    assert granted["grant"] == "g0" and granted["granted"] == {"calls": None, "matching": {"table": "orders"}, "by": ""}
    assert granted["approved"] is True and "granting" in granted["reason"]
    assert [r["seq"] for r in covered] == list(range(1, 40))
    assert all(r["grant"] == "g0" and r["approved"] and "covered by grant g0" in r["reason"] for r in covered)
    assert all("granted" not in r for r in covered)
    assert refused["approved"] is False and "grant" not in refused
    assert sum(1 for r in records if r.get("grant") == "g0") == 40


def test_calls_n_counts_exactly_the_n_plus_first_asks():
    write, ran = _writer()
    handler = Handler(Grant(calls=5), False)
    code = """
    const out = [];
    for (let i = 0; i < 7; i++) {
      try { out.push(await tools.write({table: "t", row: i})); } catch (e) { out.push("no"); }
    }
    return out;
    """
    result = _run(code, [write], handler)
    assert result.result == [0, 1, 2, 3, 4, "no", "no"]
    assert [r.arguments["row"] for r in handler.asked] == [0, 5, 6]
    assert [r.get("grant") for r in _approvals(result)] == ["g0"] * 5 + [None, None]


def test_a_grant_never_outlives_its_run():
    write, ran = _writer()
    handler = Handler(Grant())  # every call to the tool, in this run
    code = "for (let i = 0; i < 3; i++) await tools.write({table: 't', row: i}); return 1"
    first = _run(code, [write], handler)
    second = _run(code, [write], handler)
    assert first.result == second.result == 1
    assert len(handler.asked) == 2  # once per run: the second run asked again
    assert [r["grant"] for r in _approvals(second)] == ["g0"] * 3


def test_a_grant_covers_only_its_tool():
    write, ran = _writer()
    handler = Handler(Grant(), True)
    code = "await tools.write({table: 't', row: 1}); await tools.drop({table: 't'}); await tools.drop({table: 'u'});"
    result = _run(code, [write, drop], handler)
    assert result.error is None
    assert [r.tool for r in handler.asked] == ["write", "drop", "drop"]


def test_matching_is_json_equality_on_the_listed_keys():
    grant = Grant(matching={"id": 1, "where": {"a": [1, 2], "b": None}})
    assert grant.refusal({"id": 1.0, "where": {"b": None, "a": [1, 2]}, "other": "x"}) is None
    assert "differs" in grant.refusal({"id": True, "where": {"a": [1, 2], "b": None}})
    assert "differs" in grant.refusal({"id": "1", "where": {"a": [1, 2], "b": None}})
    assert "does not have" in grant.refusal({"where": {"a": [1, 2], "b": None}})
    assert "differs" in grant.refusal({"id": 1, "where": {"a": [2, 1], "b": None}})


def test_a_grant_the_asked_call_does_not_match_refuses_it():
    write, ran = _writer()
    handler = Handler(Grant(matching={"table": "users"}))
    result = _run("return await tools.write({table: 'orders', row: 1})", [write], handler)
    assert ran == []
    assert "'table'" in result.error.message and "differs" in result.error.message
    (record,) = _approvals(result)
    assert record["approved"] is False and "grant" not in record


@pytest.mark.parametrize(
    "answer, said",
    [
        ({"calls": 3}, "{'calls': 3}"),
        ("yes", "'yes'"),
        (1, "1"),
        (Grant, "a type"),
    ],
)
def test_a_malformed_answer_denies_naming_it(answer, said):
    write, ran = _writer()
    result = _run("return await tools.write({table: 't', row: 1})", [write], Handler(answer))
    assert ran == []
    assert 'tool "write" was rejected by the approval handler (tool' in result.error.message
    (record,) = _approvals(result)
    assert record["approved"] is False
    assert said in record["reason"] and "not True, False or a nous_sched.Grant" in record["reason"]


def test_a_handler_whose_grant_is_bad_denies():
    write, ran = _writer()

    def handler(request):
        return Grant(calls=0)

    result = _run("return await tools.write({table: 't', row: 1})", [write], handler)
    assert ran == [] and "`calls`" in result.error.message


@pytest.mark.parametrize(
    "kwargs, option",
    [
        ({"calls": 0}, "calls"),
        ({"calls": -1}, "calls"),
        ({"calls": True}, "calls"),
        ({"calls": 2.0}, "calls"),
        ({"calls": 10**7}, "calls"),
        ({"matching": {}}, "matching"),
        ({"matching": {"": 1}}, "matching"),
        ({"matching": {1: 1}}, "matching"),
        ({"matching": {"a": float("nan")}}, "matching"),
        ({"matching": {"a": {1, 2}}}, "matching"),
        ({"matching": ["table"]}, "matching"),
        ({"matching": {f"k{i}": i for i in range(33)}}, "matching"),
        ({"by": 3}, "by"),
    ],
)
def test_a_bad_grant_is_a_config_error_naming_the_option(kwargs, option):
    with pytest.raises(ConfigError, match=f"Grant: `{option}` must be"):
        Grant(**kwargs)


def test_a_grant_keeps_its_own_copy_of_matching():
    wanted = {"table": ["a"]}
    grant = Grant(matching=wanted)
    wanted["table"].append("b")
    assert grant.matching == {"table": ["a"]}
    assert Grant.from_dict(grant.as_dict()) == grant
    with pytest.raises(ConfigError, match="from_dict"):
        Grant.from_dict({"calls": 2, "extra": 1})


def test_answer_of_says_what_approves():
    assert answer_of(True) == (True, None, "")
    assert answer_of(False) == (False, None, "")
    assert answer_of(None) == (False, None, "")
    assert answer_of(Grant(calls=2))[:2] == (True, Grant(calls=2))
    assert answer_of("y")[0] is False


PROMISE_ALL = """
const all = await Promise.allSettled(
  Array.from({length: 40}, (_, i) => tools.write({table: "t", row: i})));
return all.map(s => s.status === "fulfilled" ? s.value : "no");
"""


def test_promise_all_of_40_one_grant_of_40_asks_once():
    write, ran = _writer()
    handler = Handler(Grant(calls=40))
    result = _run(PROMISE_ALL, [write], handler)
    assert result.result == list(range(40))
    assert len(handler.asked) == 1 and len(ran) == 40
    grants = [r.get("grant") for r in _approvals(result)]
    assert len(grants) == 40 and len(set(grants)) == 1 and grants[0] is not None


def test_promise_all_of_40_never_over_grants():
    write, ran = _writer()
    handler = Handler(Grant(calls=10), False)
    result = _run(PROMISE_ALL, [write], handler)
    assert len(ran) == 10
    assert sum(1 for v in result.result if v == "no") == 30
    assert len(handler.asked) == 31  # the grant's answer, then each of the 30 it did not cover
    records = _approvals(result)
    (gid,) = {r["grant"] for r in records if "grant" in r}
    assert sum(1 for r in records if r.get("grant") == gid) == 10


def test_promise_all_of_40_grants_of_10_ask_four_times_and_count_each_to_ten():
    write, ran = _writer()
    handler = Handler(Grant(calls=10))
    result = _run(PROMISE_ALL, [write], handler)
    assert result.result == list(range(40))
    assert len(handler.asked) == 4
    counts = {}
    for record in _approvals(result):
        counts[record["grant"]] = counts.get(record["grant"], 0) + 1
    assert sorted(counts.values()) == [10, 10, 10, 10]


def test_turns_go_lowest_seq_first_and_a_passed_deadline_gives_none():
    import time

    book = Grants()
    order = []
    with book.turn("t", 5, None) as had:
        assert had
        threads = [
            threading.Thread(target=lambda s=s: _take(book, s, order), name=f"nous-sched-test-{s}") for s in (9, 7, 8)
        ]
        for t in threads:
            t.start()
        while sum(len(w) for w in book._waiting.values()) < 3:  # noqa: SLF001
            time.sleep(0.01)
    for t in threads:
        t.join(10)
    assert order == [7, 8, 9]
    with book.turn("t", 1, None):
        with book.turn("t", 2, time.monotonic() + 0.05) as had:
            assert had is False
        with book.turn("u", 3, None) as other:  # another tool is not held
            assert other is True


def _take(book, seq, order):
    with book.turn("t", seq, None) as had:
        assert had
        order.append(seq)


def test_live_events_show_the_grant_and_each_covered_call():
    write, ran = _writer()
    handler = Handler(Grant(calls=3))
    run = start_run(
        "for (let i = 0; i < 3; i++) await tools.write({table: 't', row: i});",
        [write],
        approval_handler=handler,
        description="writes",
    )
    events = [e for e in run.events() if e.kind == "approval"]
    run.result()
    assert [e.data["state"] for e in events] == ["asked", "approved", "covered", "covered"]
    assert events[1].data["grant"] == "g0" and events[1].data["granted"]["calls"] == 3
    assert [e.data.get("grant") for e in events[2:]] == ["g0", "g0"]


def test_call_tool_records_a_grant_it_is_answered_with():
    log = nous_sched.SessionLog()
    out = call_tool(drop, {"table": "t"}, approval_handler=lambda request: Grant(calls=2, by="ops"), session_log=log)
    assert json.loads(out) == "t"
    (record,) = [dict(e.data) for e in log.events if e.type == "approval"]
    assert record["grant"] == "g0" and record["granted"]["by"] == "ops"


def test_the_question_shows_what_is_coming_escaped():
    request = nous_sched.ApprovalRequest("write", {"row": 1}, coming="40 more calls\n\u202eevil")
    text = request.question()
    assert "Coming, per the program's static summary: 40 more calls\\n\\u202eevil" in text
    assert "\u202e" not in text and text.count("\n") == 3
    assert "Coming" not in nous_sched.ApprovalRequest("write", {"row": 1}).question()
    assert approval_text.coming_line("x") == "Coming, per the program's static summary: x"


# -- durable: one suspension answers a batch ---------------------------------------

DURABLE_FORTY = """
for (let i = 0; i < 40; i++) await tools.pay({table: "orders", amount: i});
await tools.pay({table: "users", amount: 99});
return "done";
"""


@pytest.fixture
def env(tmp_path, monkeypatch):
    count = str(tmp_path / "ran.jsonl")
    monkeypatch.setenv("NOUS_DURABLE_COUNT", count)
    environ = dict(os.environ, NOUS_DURABLE_COUNT=count)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environ["PYTHONPATH"] = root + os.pathsep + environ.get("PYTHONPATH", "")
    db = tmp_path / "approvals.db"
    return {"count": count, "env": environ, "tmp": tmp_path, "store": "sqlite:" + str(db), "db": str(db)}


def _proc(env, *args):
    done = subprocess.run(
        [sys.executable, PROC, *args], env=env["env"], capture_output=True, text=True, timeout=BOUND, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _durable_run(env, program):
    path = env["tmp"] / "program.js"
    path.write_text(program, encoding="utf-8")
    return _proc(env, "run", env["store"], str(path))


def _durable_resume(env, token, decisions):
    return _proc(env, "resume", env["store"], token, json.dumps({str(k): d for k, d in decisions.items()}))


def _paid(env):
    return [args["amount"] for name, args in durable_tools.ran(env["count"]) if name == "pay"]


def test_durable_one_suspension_grants_forty_across_two_processes(env):
    first = _durable_run(env, DURABLE_FORTY)
    assert [p["seq"] for p in first["out"]["suspended"]["pending"]] == [0]
    assert _paid(env) == []
    grant = {"calls": None, "matching": {"table": "orders"}, "by": "ops"}
    second = _durable_resume(env, first["token"], {0: {"grant": grant}})
    assert _paid(env) == list(range(40))
    approvals = [data for kind, data in second["audit"] if kind == "approval"]
    assert len(approvals) == 40 and all(a["grant"] == "g0" for a in approvals)
    assert approvals[0]["granted"] == grant
    # The 41st, outside the grant, suspends again: one new question, not 40.
    (pending,) = second["out"]["suspended"]["pending"]
    assert pending["seq"] == 40 and pending["arguments"] == {"table": "users", "amount": 99}
    third = _durable_resume(env, second["token"], {40: True})
    assert third["out"]["result"] == "done"
    assert _paid(env) == [*range(40), 99]


def test_durable_decide_with_a_grant_in_the_store_is_sealed_and_resumed_elsewhere(env):
    first = _durable_run(env, DURABLE_FORTY)
    store = SqliteApprovalStore(env["db"])
    with pytest.raises(ConfigError, match="`grant`"):
        store.decide(first["token"], 0, False, grant=Grant(calls=2))
    with pytest.raises(ConfigError, match="`grant`"):
        store.decide(first["token"], 0, True, grant={"calls": 2})
    store.decide(first["token"], 0, True, "by the on-call", grant=Grant(calls=40, by="on-call"))
    (shown,) = store.suspensions()
    assert shown["decisions"]["0"]["grant"] == {"calls": 40, "matching": None, "by": "on-call"}
    # The seal covers the grant: widening it in the database is tampering.
    db = sqlite3.connect(env["db"])
    (decisions,) = db.execute("SELECT decisions FROM nous_suspensions").fetchone()
    db.execute("UPDATE nous_suspensions SET decisions = ?", (decisions.replace('"calls":40', '"calls":41'),))
    db.commit()
    with pytest.raises(TokenError, match="decision on call 0"):
        store.load(first["token"])
    db.execute("UPDATE nous_suspensions SET decisions = ?", (decisions,))
    db.commit()
    second = _durable_resume(env, first["token"], {})
    assert _paid(env) == list(range(40))
    assert [p["seq"] for p in second["out"]["suspended"]["pending"]] == [40]


def test_durable_promise_all_one_grant_answers_the_whole_batch(env, tmp_path):
    code = """
    const paid = await Promise.all(Array.from({length: 40}, (_, i) => tools.pay({table: "t", amount: i})));
    return paid.length;
    """
    store = SqliteApprovalStore(str(tmp_path / "one.db"))
    first = run_code(code, durable_tools.TOOLS, approval_store=store, description="t")
    assert [p.seq for p in first.suspended.pending] == list(range(40))
    with pytest.raises(ConfigError, match="no decision"):
        resume(first.suspended.token, {0: True}, durable_tools.TOOLS, approval_store=store)
    done = resume(first.suspended.token, {0: Grant(calls=40)}, durable_tools.TOOLS, approval_store=store)
    assert done.result == 40 and sorted(_paid(env)) == list(range(40))
    assert [dict(e.data).get("grant") for e in done.audit if e.type == "approval"] == ["g0"] * 40


def test_durable_grant_of_ten_suspends_again_for_the_eleventh(env, tmp_path):
    code = "for (let i = 0; i < 12; i++) await tools.pay({amount: i}); return 1"
    store = SqliteApprovalStore(str(tmp_path / "ten.db"))
    first = run_code(code, durable_tools.TOOLS, approval_store=store, description="t")
    decision = ApprovalDecision(True, "ten", grant=Grant(calls=10))
    second = resume(first.suspended.token, {0: decision}, durable_tools.TOOLS, approval_store=store)
    assert _paid(env) == list(range(10))
    assert [p.seq for p in second.suspended.pending] == [10]
    # The grant is spent: the next resume's later calls ask again, one by one.
    third = resume(second.suspended.token, {10: True}, durable_tools.TOOLS, approval_store=store)
    assert [p.seq for p in third.suspended.pending] == [11]


def test_durable_grants_survive_a_second_suspension(env, tmp_path):
    code = """
    await tools.pay({table: "a", amount: 1});
    await tools.pay({table: "b", amount: 2});
    await tools.pay({table: "a", amount: 3});
    return 1;
    """
    store = SqliteApprovalStore(str(tmp_path / "two.db"))
    first = run_code(code, durable_tools.TOOLS, approval_store=store, description="t")
    second = resume(
        first.suspended.token, {0: Grant(matching={"table": "a"})}, durable_tools.TOOLS, approval_store=store
    )
    assert [p.seq for p in second.suspended.pending] == [1]
    third = resume(second.suspended.token, {1: True}, durable_tools.TOOLS, approval_store=store)
    assert third.result == 1 and _paid(env) == [1, 2, 3]
    (covered,) = [dict(e.data) for e in third.audit if e.type == "approval" and dict(e.data)["seq"] == 2]
    assert covered["grant"] == "g0"


def test_durable_handler_may_answer_with_a_grant(env):
    handler = Handler(Grant(calls=3))
    code = "for (let i = 0; i < 3; i++) await tools.pay({amount: i}); return 1"
    store = SqliteApprovalStore(str(env["tmp"] / "h.db"))
    result = run_code(code, durable_tools.TOOLS, approval_store=store, approval_handler=handler, description="t")
    assert result.result == 1 and len(handler.asked) == 1
    assert [dict(e.data)["grant"] for e in result.audit if e.type == "approval"] == ["g0"] * 3


def test_approval_decision_grant_is_checked():
    with pytest.raises(ConfigError, match="ApprovalDecision: `grant`"):
        ApprovalDecision(False, grant=Grant())
    with pytest.raises(ConfigError, match="ApprovalDecision: `grant`"):
        ApprovalDecision(True, grant={"calls": 1})
    assert ApprovalDecision.from_dict({"approved": True, "reason": "", "grant": {"calls": 0}}).approved is False


# -- the command line: approvals approve --grant-*, resume --approve --grant-* --------------

CLI_TOOLS = os.path.join(HERE, "durable_tools.py")


def _cli(env, *args):
    return subprocess.run(
        [sys.executable, "-m", "nous_sched", *args],
        env={k: v for k, v in env["env"].items() if k != "NOUS_SCHED_APPROVAL_KEY"},
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=False,
    )


def _cli_suspend(env, program):
    path = env["tmp"] / "p.js"
    path.write_text(program, encoding="utf-8")
    ran = _cli(env, "run", str(path), "--tools", CLI_TOOLS, "--approval-store", env["db"], "--json")
    assert ran.returncode == 3, ran.stderr
    return json.loads(ran.stdout)["suspended"]["token"]


def test_cli_approvals_approve_with_grant_match_covers_the_loop(env):
    token = _cli_suspend(env, DURABLE_FORTY)
    bad = _cli(env, "approvals", "approve", token, "0", "--store", env["db"], "--grant-match", "nope")
    assert bad.returncode == 2 and "no argument 'nope'" in bad.stderr
    deny = _cli(env, "approvals", "deny", token, "0", "--store", env["db"], "--grant-all")
    assert deny.returncode == 2 and "grant approves" in deny.stderr
    zero = _cli(env, "approvals", "approve", token, "0", "--store", env["db"], "--grant-calls", "0")
    assert zero.returncode == 2 and "Grant: `calls`" in zero.stderr
    ok = _cli(env, "approvals", "approve", token, "0", "--store", env["db"], "--grant-match", "table", "--by", "ops")
    assert ok.returncode == 0, ok.stderr
    assert 'granting the calls whose arguments match "table"="orders"' in ok.stdout
    listed = _cli(env, "approvals", "list", "--store", env["db"])
    assert "(approved, with a grant)" in listed.stdout
    resumed = _cli(env, "resume", token, "--tools", CLI_TOOLS, "--approval-store", env["db"], "--json")
    assert resumed.returncode == 3, resumed.stderr
    assert _paid(env) == list(range(40))
    assert [p["seq"] for p in json.loads(resumed.stdout)["suspended"]["pending"]] == [40]


def test_cli_resume_approve_with_grant_calls(env):
    token = _cli_suspend(env, "for (let i = 0; i < 5; i++) await tools.pay({amount: i}); return 'ok'")
    alone = _cli(env, "resume", token, "--grant-calls", "5", "--tools", CLI_TOOLS, "--approval-store", env["db"])
    assert alone.returncode == 2 and "go with --approve" in alone.stderr
    args = ("--approve", "0", "--grant-calls", "5", "--tools", CLI_TOOLS, "--approval-store", env["db"], "--json")
    resumed = _cli(env, "resume", token, *args)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["result"] == "ok" and _paid(env) == list(range(5))


def test_cli_ask_answers_a_number_all_and_all_matching(tmp_path, capsys, monkeypatch):
    import io

    from nous_sched.cli.ask import answer
    from nous_sched.cli.main import main

    args = {"table": "orders", "row": 1}
    assert answer("y\n", args) is True and answer("n\n", args) is False and answer("", args) is False
    assert answer("40\n", args) == Grant(calls=40, by="terminal")
    assert answer("0\n", args) is False and answer("٣\n", args) is False and answer("-3", args) is False
    assert answer("all\n", args) == Grant(by="terminal")
    assert answer("all matching table\n", args) == Grant(matching={"table": "orders"}, by="terminal")
    assert answer("ALL MATCHING table, row", args) == Grant(matching=args, by="terminal")
    assert answer("all matching nope", args) is False and answer("all matching ,", args) is False

    module = tmp_path / "asktools.py"
    module.write_text(
        "from nous_sched import Tool\nTOOLS = [Tool('write', lambda a: a['row'], requires_approval=True)]\n"
    )
    program = tmp_path / "p.js"
    program.write_text(FORTY_THEN_ONE)
    monkeypatch.setattr(sys, "stdin", io.StringIO("all matching table\nn\n"))
    assert main(["run", str(program), "--tools", str(module), "--ask", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["result"] == 'tool "write" was rejected by the approval handler'
    assert err.count("approve? [y/N]") == 2


# -- a web page's desk: examples/flask_events.py's grant choices ---------------------


def _flask_example():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "flask_events.py"
    spec = importlib.util.spec_from_file_location("nous_sched_flask_events_grants", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _asked(client, run_id):
    """The run's approval questions, as its event stream tells them."""
    for chunk in client.get(f"/runs/{run_id}/events", buffered=False).response:
        for block in chunk.decode().split("\n\n"):
            if block:
                event = json.loads(block[len("data: ") :])
                if event["kind"] == "approval" and event["data"]["state"] == "asked":
                    yield event


def test_the_page_approves_all_matching_with_one_answer():
    import html

    write, ran = _writer()
    app = _flask_example().create_app(tools=[write])
    client = app.test_client()
    run_id = client.post("/runs", json={"code": FORTY_THEN_ONE, "description": "d"}).get_json()["id"]
    page = client.get(f"/runs/{run_id}").get_data(as_text=True)
    assert 'id = "approve-matching-" + seq' in page
    csrf = json.loads(html.unescape(page.split('data-run="', 1)[1].split('"', 1)[0]))["csrf"]
    headers = {"X-CSRF-Token": csrf}
    questions = _asked(client, run_id)
    event = next(questions)
    body = {"seq": event["seq"], "call_id": event["data"]["call_id"], "approved": True}
    for bad in ({"match": ["nope"]}, {"calls": 0}, {"all": True, "calls": 2}, "x", {}):
        answered = client.post(f"/runs/{run_id}/decisions", json=dict(body, grant=bad), headers=headers)
        assert answered.status_code == 400, bad
    ok = client.post(f"/runs/{run_id}/decisions", json=dict(body, grant={"match": ["table"]}), headers=headers)
    assert ok.status_code == 200 and ok.get_json()["grant"] is True
    event = next(questions)  # the 41st, outside the grant, asks again
    assert event["seq"] == 40
    body = {"seq": 40, "call_id": event["data"]["call_id"], "approved": False}
    assert client.post(f"/runs/{run_id}/decisions", json=body, headers=headers).status_code == 200
    result = app.config["NOUS_SCHED_RUNS"][run_id]["run"].result(timeout=BOUND)
    assert len(ran) == 40
    records = _approvals(result)
    assert sum(1 for r in records if r.get("grant") == "g0") == 40
    assert records[0]["granted"]["by"] == "the page"


def test_the_runs_coming_fills_each_question_and_a_raising_one_gives_nothing():
    from nous_sched.gate.dispatch import RunContext, approve

    write, ran = _writer()
    asked = Handler(True)
    approve(write, {"table": "t", "row": 1}, RunContext(approval_handler=asked, coming=lambda t: f"40 calls to {t}"))
    assert asked.asked[-1].coming == "40 calls to write"
    assert "Coming, per the program's static summary: 40 calls to write" in asked.asked[-1].question()

    def broken(tool):
        raise RuntimeError("no summary")

    approve(write, {"table": "t", "row": 1}, RunContext(approval_handler=asked, coming=broken))
    assert asked.asked[-1].coming == ""


def test_durable_parked_run_spends_the_grant_without_replay(env, tmp_path):
    store = SqliteApprovalStore(str(tmp_path / "park.db"), park=60)
    code = "for (let i = 0; i < 6; i++) await tools.pay({amount: i}); return 'parked'"
    first = run_code(code, durable_tools.TOOLS, approval_store=store, description="t")
    assert [p.seq for p in first.suspended.pending] == [0]
    done = resume(first.suspended.token, {0: Grant(calls=6)}, durable_tools.TOOLS, approval_store=store)
    assert done.result == "parked" and _paid(env) == list(range(6))
    assert any(e.type == "resumed" and dict(e.data).get("parked") for e in done.audit)
    assert [dict(e.data).get("grant") for e in done.audit if e.type == "approval"] == ["g0"] * 6


def test_requested_makes_the_grant_a_page_asks_for_or_says_why_not():
    from nous_sched.gate.grants import requested

    args = {"table": "orders", "row": 1}
    assert requested({"calls": 5}, args, by="p") == Grant(calls=5, by="p")
    assert requested({"match": ["table"]}, args) == Grant(matching={"table": "orders"})
    assert requested({"match": ["table"], "calls": 2}, args) == Grant(calls=2, matching={"table": "orders"})
    assert requested({"all": True}, args) == Grant()
    for bad in (
        {},
        "x",
        {"calls": 0},
        {"calls": "5"},
        {"match": []},
        {"match": ["nope"]},
        {"match": "table"},
        {"all": True, "calls": 2},
        {"all": False},
        {"calls": None},
        {"other": 1},
    ):
        assert isinstance(requested(bad, args), str), bad


@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_every_store_keeps_a_decisions_grant_sealed(kind, env, request):
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        store = nous_sched.RedisApprovalStore(url, prefix=f"grants-{os.getpid()}-{id(env)}:")
    else:
        store = nous_sched.PostgresApprovalStore(request.getfixturevalue("postgres_dsn"))
    code = "for (let i = 0; i < 5; i++) await tools.pay({table: 't', amount: i}); return 'ok'"
    first = run_code(code, durable_tools.TOOLS, approval_store=store, description="t")
    store.decide(first.suspended.token, 0, True, "ops", grant=Grant(matching={"table": "t"}, by="ops"))
    (shown,) = [s for s in store.suspensions() if s["token"] == first.suspended.token]
    assert shown["decisions"]["0"]["grant"] == {"calls": None, "matching": {"table": "t"}, "by": "ops"}
    done = resume(first.suspended.token, {}, durable_tools.TOOLS, approval_store=store)
    assert done.result == "ok" and _paid(env) == list(range(5))
    assert [dict(e.data).get("grant") for e in done.audit if e.type == "approval"] == ["g0"] * 5


def test_the_question_says_what_the_programs_text_says_is_coming() -> None:
    """ApprovalRequest.coming is filled from the program's static summary (nous_sched.summarize),
    reviewed or not: how many calls at most, or that they are unbounded."""
    from nous_sched import Grant, Tool, run_code

    asked: list[Any] = []
    tools = [Tool("write_row", lambda args: 1, requires_approval=True), Tool("read", lambda args: 2)]

    def grant_all(request: Any) -> Any:
        asked.append(request)
        return Grant()

    looped = "for (let i = 0; i < 3; i++) await tools.write_row({ i }); await tools.write_row({ i: 9 });"
    assert run_code(looped, tools, description="loop", approval_handler=grant_all).ok
    (request,) = asked
    assert request.coming == (
        "the program's text has 2 call sites (1 in a loop), and a call site that repeats: "
        "no bound on how many calls may come"
    )
    assert request.coming in request.question()
    asked.clear()
    bounded = "await Promise.all([tools.write_row({ i: 1 }), tools.write_row({ i: 2 }), tools.read({})]);"
    assert run_code(bounded, tools, description="two", approval_handler=grant_all).ok
    assert asked[0].coming == "the program's text has 2 call sites (2 in parallel): at most 2 calls in all"
    asked.clear()
    dynamic = "const name = 'write_' + 'row'; await tools[name]({ i: 1 });"
    assert run_code(dynamic, tools, description="dyn", approval_handler=grant_all).ok
    assert asked[0].coming.endswith("dynamic access to the tools: no bound on how many calls may come")

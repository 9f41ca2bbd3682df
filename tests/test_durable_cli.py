"""The command line's durable approval: `run --approval-store`, `resume`, `approvals` (real processes)."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durable")
TOOLS = os.path.join(HERE, "durable_tools.py")
sys.path.insert(0, HERE)

import durable_tools  # noqa: E402

PROGRAM = "const a = await tools.read({i: 1});\nconst p = await tools.pay({amount: 2});\nreturn [a, p];\n"


def _cli(tmp_path, *args, key=None):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, NOUS_DURABLE_COUNT=str(tmp_path / "ran.jsonl"))
    env.pop("NOUS_SCHED_APPROVAL_KEY", None)
    if key is not None:
        env["NOUS_SCHED_APPROVAL_KEY"] = key
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "nous_sched", *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_run_suspends_an_operator_approves_and_resume_finishes(tmp_path, kind, request):
    program = tmp_path / "p.js"
    program.write_text(PROGRAM, encoding="utf-8")
    # A SQLite file, or a postgresql:// URL (a fresh database on the session's real server).
    store = str(tmp_path / "approvals.db") if kind == "sqlite" else request.getfixturevalue("postgres_dsn")
    ran = _cli(tmp_path, "run", str(program), "--tools", TOOLS, "--approval-store", store, "--json")
    assert ran.returncode == 3, ran.stderr
    suspension = json.loads(ran.stdout)["suspended"]
    assert [(p["seq"], p["tool"], p["site"]) for p in suspension["pending"]] == [(1, "pay", "2:23")]
    token = suspension["token"]

    listed = _cli(tmp_path, "approvals", "list", "--store", store)
    assert listed.returncode == 0 and token in listed.stdout and "  #1 pay\n" in listed.stdout
    assert 'A program wants to call the tool "pay".' in listed.stdout and '"amount": 2' in listed.stdout
    approved = _cli(tmp_path, "approvals", "approve", token, "1", "--store", store, "--reason", "ok by ops")
    assert approved.returncode == 0, approved.stderr

    resumed = _cli(tmp_path, "resume", token, "--tools", TOOLS, "--approval-store", store, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["result"] == [{"read": 1}, {"paid": 2}]
    assert durable_tools.ran(str(tmp_path / "ran.jsonl")) == [["read", {"i": 1}], ["pay", {"amount": 2}]]

    again = _cli(tmp_path, "resume", token, "--approve", "1", "--tools", TOOLS, "--approval-store", store)
    assert again.returncode == 2 and "already used" in again.stderr


def test_resume_with_deny_rejects_the_call_in_the_program(tmp_path):
    program = tmp_path / "p.js"
    program.write_text(PROGRAM, encoding="utf-8")
    store = str(tmp_path / "approvals.db")
    ran = _cli(tmp_path, "run", str(program), "--tools", TOOLS, "--approval-store", store)
    assert ran.returncode == 3 and "#1 pay at line:col 2:23" in ran.stdout
    token = ran.stdout.split("token (expires")[1].splitlines()[1].strip()
    resumed = _cli(
        tmp_path, "resume", token, "--deny", "1", "--reason", "no", "--tools", TOOLS, "--approval-store", store
    )
    assert resumed.returncode == 1
    assert 'tool "pay" was denied approval: no' in resumed.stdout
    tampered = _cli(tmp_path, "resume", token[:-2] + "xx", "--deny", "1", "--tools", TOOLS, "--approval-store", store)
    assert tampered.returncode == 2 and "changed or made up" in tampered.stderr


def test_approvals_list_shows_a_huge_value_clipped_as_the_approval_question_does(tmp_path):
    # issue 34, item 10: a 200,000-character value printed whole hid the argument after it.
    from nous_sched import QuickJSRuntime, run_code
    from nous_sched.approval_store import SqliteApprovalStore

    store = str(tmp_path / "approvals.db")
    program = 'return await tools.pay({note: "x".repeat(200000) + "\\u202e", path: "/etc/passwd"});'
    result = run_code(
        program,
        durable_tools.TOOLS,
        approval_store=SqliteApprovalStore(store),
        runtime=QuickJSRuntime(),
        description="d" * 100_000,
    )
    assert result.suspended is not None
    question = result.suspended.pending[0].question()
    listed = _cli(tmp_path, "approvals", "list", "--store", store)
    assert listed.returncode == 0, listed.stderr
    # Every line of the question is in the listing, the huge value clipped and sized, the path in sight.
    for line in question.splitlines()[:-1]:  # the question's last line is the description, listed once per run
        assert line in listed.stdout, line
    assert len(listed.stdout) < 3000
    assert "(clipped; 200,003 characters in all)" in listed.stdout and '"path": "/etc/passwd"' in listed.stdout
    assert "(clipped; 100,000 characters in all)" in listed.stdout
    assert "\u202e" not in listed.stdout
    # --json keeps the whole value, for a program to read.
    whole = json.loads(_cli(tmp_path, "approvals", "list", "--store", store, "--json").stdout)
    assert len(whole[0]["pending"][0]["arguments"]["note"]) == 200_001


def test_a_key_from_the_environment_seals_what_the_store_cannot_forge(tmp_path):
    # The key kept out of the store: someone who can write the file (and its
    # nous_meta key) still cannot make an edited row pass.
    import sqlite3

    key = "k" * 40
    program = tmp_path / "p.js"
    program.write_text(PROGRAM, encoding="utf-8")
    store = str(tmp_path / "approvals.db")
    ran = _cli(tmp_path, "run", str(program), "--tools", TOOLS, "--approval-store", store, "--json", key=key)
    assert ran.returncode == 3, ran.stderr
    token = json.loads(ran.stdout)["suspended"]["token"]
    without = _cli(tmp_path, "approvals", "approve", token, "1", "--store", store)
    assert without.returncode == 2 and "not signed by this store's key" in without.stderr
    short = _cli(tmp_path, "approvals", "list", "--store", store, key="short")
    assert short.returncode == 2 and "NOUS_SCHED_APPROVAL_KEY" in short.stderr

    db = sqlite3.connect(store)
    (record,) = db.execute("SELECT record FROM nous_suspensions").fetchone()
    db.execute("UPDATE nous_suspensions SET record = ?", (record.replace('"amount":2', '"amount":5000'),))
    db.commit()
    db.close()
    listed = _cli(tmp_path, "approvals", "list", "--store", store, key=key)
    assert listed.returncode == 0 and listed.stdout.startswith("tampered"), listed.stdout
    resumed = _cli(tmp_path, "resume", token, "--approve", "1", "--tools", TOOLS, "--approval-store", store, key=key)
    assert resumed.returncode == 2 and "tampered" in resumed.stderr
    assert durable_tools.ran(str(tmp_path / "ran.jsonl")) == [["read", {"i": 1}]]


def test_approvals_settle_needs_a_fate_and_a_token_a_resume_holds(tmp_path):
    program = tmp_path / "p.js"
    program.write_text(PROGRAM, encoding="utf-8")
    store = str(tmp_path / "approvals.db")
    ran = _cli(tmp_path, "run", str(program), "--tools", TOOLS, "--approval-store", store, "--json")
    token = json.loads(ran.stdout)["suspended"]["token"]
    no_fate = _cli(tmp_path, "approvals", "settle", token, "1", "--store", store)
    assert no_fate.returncode == 2 and "--ran or --not-ran" in no_fate.stderr
    both = _cli(tmp_path, "approvals", "settle", token, "1", "--ran", "--not-ran", "--store", store)
    assert both.returncode == 2
    pending = _cli(tmp_path, "approvals", "settle", token, "1", "--ran", "--store", store)
    assert pending.returncode == 2 and "nothing to settle" in pending.stderr
    hostile = _cli(tmp_path, "approvals", "settle", "\u202e\x01" + token, "1", "--not-ran", "--store", store)
    assert hostile.returncode == 2 and "Traceback" not in hostile.stderr
    assert durable_tools.ran(str(tmp_path / "ran.jsonl")) == [["read", {"i": 1}]]

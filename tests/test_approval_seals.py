"""The record bound to its token (nous_sched/durable/approval_store.py, "The record bound to its token").

Each test plays someone who can write the store's rows (SQL on the file,
commands to Redis) but has no key: they edit a suspended ``pay`` from
``{to: alice, amount: 20}`` to ``{to: mallory, amount: 5000}``, swap in
another suspension's record, flip an operator's denial, or set a used token's
row back to ``pending``. Every such row is refused as tampered and nothing
runs, on SQLite, on a real Redis server and on a real Postgres server. The tools count every run in a
file (tests/durable/durable_tools.py), so "nothing ran" is counted, not assumed.
"""

import json
import os
import sqlite3
import subprocess
import sys
import uuid

import pytest

from nous_sched import (
    PostgresApprovalStore,
    QuickJSRuntime,
    RedisApprovalStore,
    SqliteApprovalStore,
    TokenError,
    resume,
    run_code,
)

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durable")
sys.path.insert(0, HERE)

import durable_tools  # noqa: E402

PROC = os.path.join(HERE, "proc.py")
BOUND = 120  # generous: a loaded 2-core machine
PAY_ALICE = 'return await tools.pay({to: "alice", amount: 20});'


class _SqliteRows:
    """The rows of a SQLite store, written with SQL as anyone with the file can."""

    def __init__(self, tmp_path):
        self.path = str(tmp_path / "approvals.db")
        self.spec = "sqlite:" + self.path

    def store(self):
        return SqliteApprovalStore(self.path)

    def get(self, sid):
        db = sqlite3.connect(self.path)
        try:
            db.row_factory = sqlite3.Row
            return dict(db.execute("SELECT * FROM nous_suspensions WHERE id = ?", (sid,)).fetchone())
        finally:
            db.close()

    def put(self, sid, **fields):
        db = sqlite3.connect(self.path)
        try:
            sets = ", ".join(f"{name} = ?" for name in fields)
            db.execute(f"UPDATE nous_suspensions SET {sets} WHERE id = ?", (*fields.values(), sid))
            db.commit()
        finally:
            db.close()


class _RedisRows:
    """The hashes of a Redis store, written with HSET as anyone with the server can."""

    def __init__(self, url):
        import redis

        self.url = url
        self.prefix = f"seals-{uuid.uuid4().hex}"
        self.spec = "redis:" + url
        self.redis = redis.Redis.from_url(url, decode_responses=True)

    def store(self):
        return RedisApprovalStore(self.url, prefix=self.prefix)

    def get(self, sid):
        fields = self.redis.hgetall(f"{self.prefix}:s:{sid}")
        decisions = {k.split(":", 1)[1]: json.loads(v) for k, v in fields.items() if k.startswith("decision:")}
        return {**fields, "decisions": json.dumps(decisions)}

    def put(self, sid, **fields):
        if "decisions" in fields:  # each decision is a field of its own
            fields.update({f"decision:{k}": json.dumps(v) for k, v in json.loads(fields.pop("decisions")).items()})
        self.redis.hset(f"{self.prefix}:s:{sid}", mapping={k: str(v) for k, v in fields.items()})


class _PostgresRows:
    """The rows of a Postgres store, written with SQL as anyone with the database can
    (what its typed columns can hold: no NUL in text, a number, NaN or infinity as an expiry)."""

    def __init__(self, dsn):
        self.dsn = dsn
        self.spec = "postgres:" + dsn

    def store(self):
        return PostgresApprovalStore(self.dsn)

    def get(self, sid):
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(self.dsn, row_factory=dict_row) as db:
            return db.execute("SELECT * FROM nous_sched_suspensions WHERE id = %s", (sid,)).fetchone()

    def put(self, sid, **fields):
        import psycopg

        values = {k: (v.replace("\x00", "") if isinstance(v, str) else v) for k, v in fields.items()}
        if "expires" in values and not isinstance(values["expires"], (int, float)):
            values["expires"] = float("nan")
        sets = ", ".join(f"{name} = %s" for name in values)
        with psycopg.connect(self.dsn, autocommit=True) as db:
            db.execute(f"UPDATE nous_sched_suspensions SET {sets} WHERE id = %s".encode(), (*values.values(), sid))


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def rows(request, tmp_path, monkeypatch):
    monkeypatch.setenv("NOUS_DURABLE_COUNT", str(tmp_path / "ran.jsonl"))
    if request.param == "sqlite":
        return _SqliteRows(tmp_path)
    if request.param == "postgres":
        return _PostgresRows(request.getfixturevalue("postgres_dsn"))
    return _RedisRows(request.getfixturevalue("redis_url"))


def _ran():
    return durable_tools.ran(os.environ["NOUS_DURABLE_COUNT"])


def _suspend(store, program=PAY_ALICE):
    result = run_code(program, durable_tools.TOOLS, approval_store=store, runtime=QuickJSRuntime(), description="pay")
    assert result.suspended is not None, result
    token = result.suspended.token
    return token, token.split(".")[0]


def _resume(store, token, decisions=None):
    return resume(token, decisions or {0: True}, durable_tools.TOOLS, approval_store=store, runtime=QuickJSRuntime())


def _to_mallory(record_text):
    record = json.loads(record_text)
    for pending in record["pending"]:
        pending["arguments"] = {"to": "mallory", "amount": 5000}
        pending["text"][1] = json.dumps(pending["arguments"], separators=(",", ":"))
    return json.dumps(record, separators=(",", ":"))


def test_edited_arguments_are_refused_as_tampered_and_nothing_runs(rows):
    store = rows.store()
    token, sid = _suspend(store)
    good = rows.get(sid)["record"]
    rows.put(sid, record=_to_mallory(good))
    for attempt in (store.load, lambda t: _resume(store, t)):
        with pytest.raises(TokenError, match="tampered"):
            attempt(token)
    assert [row["state"] for row in store.suspensions()] == ["tampered"]
    assert _ran() == []
    rows.put(sid, record=good)  # the key's own record back: the token was never claimed
    assert _resume(store, token).result == {"paid": 20}
    assert _ran() == [["pay", {"amount": 20, "to": "alice"}]]


def test_a_record_edited_between_load_and_claim_is_refused_and_the_token_spent(rows):
    store = rows.store()
    token, sid = _suspend(store)
    store.load(token)
    rows.put(sid, record=_to_mallory(rows.get(sid)["record"]))
    with pytest.raises(TokenError, match="tampered"):
        store.claim(token)
    with pytest.raises(TokenError, match="already claimed"):
        _resume(store, token)
    assert _ran() == []


def test_a_record_and_its_seal_copied_from_another_suspension_are_refused(rows):
    store = rows.store()
    token, sid = _suspend(store)
    _, other_sid = _suspend(store, 'return await tools.pay({to: "mallory", amount: 5000});')
    other = rows.get(other_sid)
    rows.put(sid, record=other["record"], seal=other["seal"], state_seal=other["state_seal"])
    with pytest.raises(TokenError, match="tampered"):
        _resume(store, token)
    assert _ran() == []


def test_a_flipped_operator_decision_is_refused(rows):
    store = rows.store()
    token, sid = _suspend(store)
    store.decide(token, 0, False, "not today")
    assert store.load(token)["decisions"] == {"0": {"approved": False, "reason": "not today"}}
    decisions = json.loads(rows.get(sid)["decisions"])
    decisions["0"]["approved"] = True
    rows.put(sid, decisions=json.dumps(decisions))
    with pytest.raises(TokenError, match="tampered"):
        resume(token, {}, durable_tools.TOOLS, approval_store=store, runtime=QuickJSRuntime())
    assert _ran() == []


def _resume_elsewhere(rows, token):
    """A resume in a process of its own: it has no memory of this one's claims."""
    done = subprocess.run(
        [sys.executable, PROC, "resume", rows.spec + _prefix_of(rows), token, '{"0": true}'],
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=False,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _prefix_of(rows):
    return f"#{rows.prefix}" if isinstance(rows, _RedisRows) else ""


@pytest.mark.parametrize("state", ["claimed", "done"])
def test_a_used_token_set_back_to_pending_is_refused_in_any_process(rows, state):
    store = rows.store()
    token, sid = _suspend(store)
    if state == "done":
        assert _resume(store, token).result == {"paid": 20}
    else:
        store.claim(token)  # a resume that began (its process may have died)
    rows.put(sid, state="pending", claimed_by="")
    with pytest.raises(TokenError):
        _resume(store, token)
    refused = _resume_elsewhere(rows, token)
    assert "tampered" in refused["token_error"]
    assert len(_ran()) == (1 if state == "done" else 0)


def test_a_whole_row_rolled_back_is_refused_by_the_process_that_claimed_it(rows):
    # The limit of what a key can prove, as approval_store.py documents: the row's exact
    # bytes from before the claim, written back, carry valid seals; the process that
    # claimed the token remembers, and refuses.
    store = rows.store()
    token, sid = _suspend(store)
    before = rows.get(sid)
    assert _resume(store, token).result == {"paid": 20}
    rows.put(sid, **{k: before[k] for k in ("state", "claimed_by", "state_seal")})
    with pytest.raises(TokenError, match="rolled back"):
        _resume(store, token)
    with pytest.raises(TokenError, match="rolled back"):
        rows.store().claim(token)  # another store object of the same process
    assert _ran() == [["pay", {"amount": 20, "to": "alice"}]]


def test_a_row_saved_before_the_seals_is_refused(tmp_path, monkeypatch):
    # A store file made by an earlier version: no seal columns, an unsealed row.
    monkeypatch.setenv("NOUS_DURABLE_COUNT", str(tmp_path / "ran.jsonl"))
    path = str(tmp_path / "old.db")
    fresh = SqliteApprovalStore(str(tmp_path / "fresh.db"))
    token, sid = _suspend(fresh)
    key = sqlite3.connect(str(tmp_path / "fresh.db")).execute("SELECT value FROM nous_meta").fetchone()[0]
    (record,) = sqlite3.connect(str(tmp_path / "fresh.db")).execute("SELECT record FROM nous_suspensions").fetchone()
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE nous_meta (name TEXT PRIMARY KEY, value BLOB NOT NULL)")
    old.execute(
        "CREATE TABLE nous_suspensions (id TEXT PRIMARY KEY, record TEXT NOT NULL, expires REAL NOT NULL, "
        "state TEXT NOT NULL, decisions TEXT NOT NULL DEFAULT '{}', claimed_by TEXT NOT NULL DEFAULT '')"
    )
    old.execute("INSERT INTO nous_meta VALUES ('hmac_key', ?)", (key,))
    old.execute(
        "INSERT INTO nous_suspensions (id, record, expires, state) VALUES (?, ?, ?, 'pending')",
        (sid, record, float(token.split(".")[1])),
    )
    old.commit()
    old.close()
    store = SqliteApprovalStore(path)  # adds the seal columns, empty
    with pytest.raises(TokenError, match="tampered"):
        _resume(store, token)
    assert _ran() == []
    assert _resume(store, _suspend(store)[0]).ok  # the upgraded file keeps working


@pytest.mark.parametrize(
    "reason",
    ["é 😀", "\ud800 lone, \u202e bidi, \x00 NUL, tag \U000e0041", "x" * 100_000, '"}, {"approved": true'],
)
def test_a_decision_with_any_reason_is_kept_and_sealed(rows, reason):
    store = rows.store()
    token, _ = _suspend(store)
    store.decide(token, 0, False, reason)
    assert store.load(token)["decisions"] == {"0": {"approved": False, "reason": reason}}
    done = resume(token, {}, durable_tools.TOOLS, approval_store=store, runtime=QuickJSRuntime())
    assert done.error is not None and "was denied approval" in done.error.message
    assert _ran() == []


def test_a_row_with_garbage_in_every_column_is_refused_cleanly(rows):
    store = rows.store()
    token, sid = _suspend(store)
    rows.put(sid, expires="soon", state="pending\x00", claimed_by="\xff\u202e", seal="", state_seal="x" * 10_000)
    with pytest.raises(TokenError):
        _resume(store, token)
    assert all(row["state"] in ("tampered", "pending\x00") for row in store.suspensions())
    assert _ran() == []

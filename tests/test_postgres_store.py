"""PostgresApprovalStore's own promises (nous_sched/durable/postgres_store.py), on a real Postgres server.

The contract it shares with the SQLite and Redis stores is the same suite
theirs is (tests/test_durable.py, tests/test_approval_seals.py,
tests/test_durable_crash.py, each parametrized with ``postgres``). Here: the
migrations applied once under concurrency, Django's settings, a connection
factory, and a server that is down, slow or silent (SIGSTOP): each fails fast
with an error naming Postgres and its address, and never hangs a run.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psycopg
import pytest

import nous_sched
from nous_sched import ConfigError, PostgresApprovalStore, QuickJSRuntime, run_code
from nous_sched.durable.postgres_store import dsn_from_django, migrations

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durable")
sys.path.insert(0, HERE)

import durable_tools  # noqa: E402
from postgres_server import postgres_process  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOUND = 120  # generous: a loaded 2-core machine
# A fault must be said within the store's timeout plus the watchdog's grace; "fast" is judged well
# below the run's own timeout (60 s) and the test's BOUND, never against a tight wall-clock figure.
FAST = 30


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _schema(dsn):
    with psycopg.connect(dsn) as db:
        return db.execute("SELECT version, name FROM nous_sched_schema ORDER BY version").fetchall()


def test_the_migrations_are_applied_once_by_racing_first_users(postgres_dsn):
    # Processes opening one new database at the same moment: one applies the SQL, the others find it applied.
    code = (
        "import sys; import nous_sched; sys.stdin.readline(); "
        "s = nous_sched.PostgresApprovalStore(sys.argv[1]); print(s.save({'n': 1})[0])"
    )
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, postgres_dsn],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    tokens = []
    for p in procs:
        out, err = p.communicate(timeout=BOUND)
        assert p.returncode == 0, err
        tokens.append(out.strip())
    assert _schema(postgres_dsn) == [(number, name) for number, name, _ in migrations()]
    assert [number for number, _, _ in migrations()] == [1, 2]
    store = PostgresApprovalStore(postgres_dsn)  # and once more, later: nothing to apply
    assert sorted(store.load(t)["n"] for t in tokens) == [1, 1, 1]  # one key for all of them
    assert _schema(postgres_dsn) == [(1, "0001_approval_store.sql"), (2, "0002_state_store.sql")]


def test_a_connection_factory_is_used_for_every_connection(postgres_dsn):
    opened = []

    def connect():
        opened.append(1)
        return psycopg.connect(postgres_dsn)

    store = PostgresApprovalStore(connect)
    token, _ = store.save({"pending": [{"seq": 0}]})
    store.decide(token, 0, True, "ok")
    assert store.claim(token)["decisions"] == {"0": {"approved": True, "reason": "ok"}}
    assert opened and "a connection factory" in repr(store)


def test_threads_share_a_store_and_each_claim_is_won_once(postgres_dsn):
    store = PostgresApprovalStore(postgres_dsn)
    tokens = [store.save({"n": n})[0] for n in range(5)]
    won, lost = [], []
    barrier = threading.Barrier(8)

    def claim_all():
        barrier.wait(BOUND)
        for token in tokens:
            try:
                won.append(store.claim(token)["n"])
            except nous_sched.TokenError:
                lost.append(token)

    threads = [threading.Thread(target=claim_all) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND)
    assert sorted(won) == [0, 1, 2, 3, 4] and len(lost) == 5 * 7


def test_django_settings_name_the_database(postgres_server):
    dsn = postgres_server.new_database()
    database = dsn.rsplit("/", 1)[1]
    config = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": database,
        "USER": postgres_server.user,
        "HOST": "127.0.0.1",
        "PORT": str(postgres_server.port),
        "OPTIONS": {"application_name": "it's a test"},
    }
    assert "application_name='it\\'s a test'" in dsn_from_django(config)
    code = f"""
import json, sys
import django
from django.conf import settings
settings.configure(DATABASES={{"default": {config!r}, "other": {{"ENGINE": "django.db.backends.sqlite3", "NAME": "x"}}}})
django.setup()
import nous_sched
store = nous_sched.PostgresApprovalStore.from_django("default")
token, _ = store.save({{"from": "django"}})
try:
    nous_sched.PostgresApprovalStore.from_django("other")
except nous_sched.ConfigError as exc:
    refused = str(exc)
print(json.dumps([store.load(token), refused]))
"""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=BOUND)
    assert done.returncode == 0, done.stderr
    loaded, refused = json.loads(done.stdout)
    assert loaded == {"from": "django", "decisions": {}}
    assert "alias" in refused and "postgresql" in refused


@pytest.mark.parametrize("dsn", ["", "   ", 5, None])
def test_a_bad_dsn_is_a_config_error_naming_it(dsn):
    with pytest.raises(ConfigError, match="dsn"):
        PostgresApprovalStore(dsn)


def test_a_postgres_that_is_down_fails_fast_naming_it_and_its_address():
    port = _free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"Postgres at 127\.0\.0\.1:{port}/app: cannot connect"):
        PostgresApprovalStore(f"postgresql://nous:secret@127.0.0.1:{port}/app", timeout=1)
    assert time.monotonic() - started < FAST


def test_the_command_line_says_postgres_is_down_without_its_password(tmp_path):
    port = _free_port()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nous_sched",
            "approvals",
            "list",
            "--store",
            f"postgresql://u:hunter2@127.0.0.1:{port}/db",
        ],
        capture_output=True,
        text=True,
        timeout=BOUND,
        env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")),
    )
    assert done.returncode == 2, done.stderr
    assert f"Postgres at 127.0.0.1:{port}/db" in done.stderr and "hunter2" not in done.stderr
    assert "Traceback" not in done.stderr


def test_a_slow_postgres_is_a_timeout_naming_it(postgres_dsn):
    # Slow: a statement that cannot finish in time (here, the row is locked by another session).
    store = PostgresApprovalStore(postgres_dsn, timeout=1)
    token, _ = store.save({"pending": [{"seq": 0}]})
    sid = token.split(".")[0]
    with psycopg.connect(postgres_dsn) as holder:
        holder.execute("SELECT 1 FROM nous_sched_suspensions WHERE id = %s FOR UPDATE", (sid,))
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=r"Postgres at 127\.0\.0\.1:\d+/\w+: a statement took longer than 1 s"):
            store.claim(token)
        assert time.monotonic() - started < FAST
    assert store.claim(token) == {
        "pending": [{"seq": 0}],
        "decisions": {},
        "claimed_by": store.claimed(token)["claimed_by"],
    }


def test_a_silent_postgres_never_hangs_a_run_and_the_store_recovers():
    count = os.environ.get("NOUS_DURABLE_COUNT")
    with postgres_process() as server:
        dsn = server.new_database()
        store = PostgresApprovalStore(dsn, timeout=1)
        token, _ = store.save({"pending": [{"seq": 0}]})
        os.environ["NOUS_DURABLE_COUNT"] = os.path.join(server.folder, "ran.jsonl")
        try:
            server.signal(signal.SIGSTOP)  # silent: its sockets stay open, nothing answers
            try:
                # An open connection that goes silent: the watchdog cuts it.
                started = time.monotonic()
                with pytest.raises(TimeoutError, match=r"Postgres at 127\.0\.0\.1:\d+/\w+ did not answer within 2 s"):
                    store.load(token)
                assert time.monotonic() - started < FAST
                # A run that suspends on it: an error naming Postgres, within the bound, never a hang.
                started = time.monotonic()
                with pytest.raises(OSError, match=r"Postgres at 127\.0\.0\.1:\d+/\w+"):
                    run_code(
                        "return await tools.pay({amount: 3})",
                        durable_tools.TOOLS,
                        approval_store=store,
                        runtime=QuickJSRuntime(),
                        description="a payment",
                        timeout=60,
                    )
                assert time.monotonic() - started < FAST
                # A new connection to a silent server: the connect timeout.
                started = time.monotonic()
                with pytest.raises(ConnectionError, match=r"Postgres at 127\.0\.0\.1:\d+/\w+: cannot connect"):
                    PostgresApprovalStore(dsn, timeout=1)
                assert time.monotonic() - started < FAST
            finally:
                server.signal(signal.SIGCONT)
            assert store.load(token) == {"pending": [{"seq": 0}], "decisions": {}}  # it answers again
        finally:
            if count is None:
                os.environ.pop("NOUS_DURABLE_COUNT", None)
            else:
                os.environ["NOUS_DURABLE_COUNT"] = count


def test_a_forked_child_opens_its_own_connections_and_leaves_the_parents_alone(postgres_dsn):
    # In a process of its own, so that the child ends as any process does (its objects finalized):
    # neither its use of the store nor its exit may end the parent's session.
    code = """
import os, sys
import nous_sched
store = nous_sched.PostgresApprovalStore(sys.argv[1])
token, _ = store.save({"n": 1})
assert store.load(token)["n"] == 1  # the parent now keeps an open connection
pid = os.fork()
# Both use the store at once: on one shared connection their messages would interleave.
for _ in range(200):
    assert store.load(token)["n"] == 1
if pid == 0:
    assert store.save({"n": 2})
    sys.exit(0)  # a normal exit: every object finalized
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert store.load(token)["n"] == 1  # the parent's connection still answers
assert len(store.suspensions()) == 2
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, "-c", code, postgres_dsn], capture_output=True, text=True, env=env, timeout=BOUND
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_watchdog_thread_exits_once_idle_and_comes_back_with_the_next_statement(postgres_dsn):
    from nous_sched import PostgresApprovalStore

    def watchdogs():
        return [t for t in threading.enumerate() if t.name == "nous-sched-postgres-watchdog"]

    store = PostgresApprovalStore(postgres_dsn)
    store.save({"n": 1})
    for thread in watchdogs():  # it waits WATCHDOG_IDLE (1 s) for the next statement, then exits
        thread.join(30)
    assert watchdogs() == []
    token, _ = store.save({"n": 2})  # the next statement is watched again
    assert token
    assert len(watchdogs()) <= 1

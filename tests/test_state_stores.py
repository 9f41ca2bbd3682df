"""The built-in state stores keep the store contract (``tests/state_contract.py``):
each check, once per store (memory, SQLite, Redis, Postgres); and a Redis or
Postgres store whose server is down or silent fails fast with an error naming it."""

from __future__ import annotations

import signal
import time

import pytest
from redis_server import redis_process
from state_contract import CHECKS

from nous_sched import ConfigError
from nous_sched.state import (
    MemoryStateStore,
    PostgresStateStore,
    RedisStateStore,
    SqliteStateStore,
    StateStoreError,
    StateStoreSeam,
)


@pytest.fixture(scope="module", params=["memory", "sqlite", "redis", "postgres"])
def factory(request, tmp_path_factory):
    if request.param == "postgres":  # a real server (tests/postgres_server.py), one database for the module
        dsn = request.getfixturevalue("postgres_server").new_database()
        return lambda: PostgresStateStore(dsn)
    redis_url = request.getfixturevalue("redis_url") if request.param == "redis" else ""
    if request.param == "memory":
        store = MemoryStateStore()
        return lambda: store
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp("state") / "state.db"
        return lambda: SqliteStateStore(path)
    return lambda: RedisStateStore(redis_url)


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_state_store_contract(factory, check) -> None:
    check(factory)


def test_each_store_is_a_seam(tmp_path, redis_url) -> None:
    for store in (MemoryStateStore(), SqliteStateStore(tmp_path / "s.db"), RedisStateStore(redis_url)):
        assert isinstance(store, StateStoreSeam)


def test_redis_down_fails_fast_naming_redis() -> None:
    with redis_process() as server:
        store = RedisStateStore(server.url)
        store.write("s", "k", "1")
        server.kill()
        for op in (lambda: store.read("s", "k"), lambda: store.write("s", "k", "2"), lambda: store.keys("s")):
            began = time.monotonic()
            with pytest.raises(StateStoreError, match="Redis state store at redis://127.0.0.1:"):
                op()
            assert time.monotonic() - began < 10  # one connect timeout, no retries (the default is 0.5 s)


def test_redis_silent_fails_fast_naming_redis() -> None:
    with redis_process() as server:
        store = RedisStateStore(server.url, timeout=0.3)
        store.write("s", "k", "1")
        server.signal(signal.SIGSTOP)
        try:
            began = time.monotonic()
            with pytest.raises(StateStoreError, match="Redis state store.*Timeout"):
                store.read("s", "k")
            assert time.monotonic() - began < 10
        finally:
            server.signal(signal.SIGCONT)


def test_sqlite_unopenable_names_the_file(tmp_path) -> None:
    with pytest.raises(StateStoreError, match="SQLite state store"):
        SqliteStateStore(tmp_path / "missing-folder" / "s.db")


def test_open_state_store_names_each_kind(tmp_path, redis_url) -> None:
    from nous_sched.state import SHARED_MEMORY, open_state_store

    assert open_state_store("memory") is SHARED_MEMORY
    assert isinstance(open_state_store(str(tmp_path / "s.db")), SqliteStateStore)
    redis_store = open_state_store(redis_url)
    assert isinstance(redis_store, RedisStateStore) and redis_store.url == redis_url
    with pytest.raises(ConfigError, match="open_state_store: `spec` must be a non-empty string"):
        open_state_store("")


def test_open_state_store_opens_a_postgres_url(postgres_server) -> None:
    from nous_sched.state import open_state_store

    dsn = postgres_server.new_database()
    assert dsn.startswith(("postgresql://", "postgres://"))
    store = open_state_store(dsn)
    assert isinstance(store, PostgresStateStore)
    store.write("s", "k", "1")
    assert store.read("s", "k").text == "1"


def test_postgres_down_or_silent_fails_fast_naming_postgres() -> None:
    from postgres_server import postgres_process

    with postgres_process() as server:
        store = PostgresStateStore(server.new_database(), timeout=1)
        assert isinstance(store, StateStoreSeam)
        store.write("s", "k", "1")
        server.signal(signal.SIGSTOP)
        try:
            for op in (lambda: store.read("s", "k"), lambda: store.write("s", "k", "2"), lambda: store.keys("s")):
                began = time.monotonic()
                with pytest.raises(StateStoreError, match=r"Postgres state store.*Postgres at 127\.0\.0\.1:\d+"):
                    op()
                assert time.monotonic() - began < 30  # the timeout (1 s) and the watchdog's grace, never a hang
        finally:
            server.signal(signal.SIGCONT)
        assert store.read("s", "k").text == "1"  # it answers again
        server.stop()
        with pytest.raises(StateStoreError, match=r"Postgres state store.*Postgres at 127\.0\.0\.1:\d+"):
            store.read("s", "k")

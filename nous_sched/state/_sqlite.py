"""SqliteStateStore: state in one SQLite file (WAL mode), shared by the processes of one machine."""

from __future__ import annotations

import os
import sqlite3
from typing import Any, Optional

from .. import _validators as v
from .._validators import require
from ._seam import Entry, KeyInfo, StateStoreError, check_write

__all__ = ["SqliteStateStore"]

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS nous_state (scope TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, "
    "version INTEGER NOT NULL, PRIMARY KEY (scope, key))",
    "CREATE TABLE IF NOT EXISTS nous_state_scopes (scope TEXT PRIMARY KEY, counter INTEGER NOT NULL)",
)


class SqliteStateStore:
    """A :class:`~nous_sched.StateStoreSeam` in one SQLite file (WAL mode),
    shared by any number of processes on one machine. Each operation opens its
    own connection (so a store may be used from many threads), and each write
    is one ``BEGIN IMMEDIATE`` transaction: its check and its write are one step.

    :param path: the database file (created, with its tables, when missing).
    :param timeout: seconds a write waits for another process's transaction.
    """

    def __init__(self, path: Any, *, timeout: float = 30.0) -> None:
        require("SqliteStateStore", "path", path, v.Check("a file path", lambda p: isinstance(p, (str, os.PathLike))))
        require("SqliteStateStore", "timeout", timeout, v.SECONDS)
        self.path = os.fspath(path)
        self.timeout = float(timeout)
        try:
            with self._connect() as db:
                db.execute("PRAGMA journal_mode=WAL")
                for statement in _SCHEMA:
                    db.execute(statement)
        except sqlite3.Error as exc:
            raise self._failed(exc) from None

    def __repr__(self) -> str:
        return f"SqliteStateStore({self.path!r})"

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)

    def _failed(self, exc: Exception) -> StateStoreError:
        return StateStoreError(f"the SQLite state store {self.path!r} could not answer: {exc}")

    def read(self, scope: str, key: str) -> Optional[Entry]:
        try:
            db = self._connect()
            try:
                row = db.execute(
                    "SELECT value, version FROM nous_state WHERE scope = ? AND key = ?", (scope, key)
                ).fetchone()
            finally:
                db.close()
        except sqlite3.Error as exc:
            raise self._failed(exc) from None
        return None if row is None else Entry(str(row[0]), int(row[1]))

    def write(
        self,
        scope: str,
        key: str,
        text: Optional[str],
        *,
        expect: Optional[int] = None,
        max_keys: Optional[int] = None,
        max_bytes: Optional[int] = None,
    ) -> int:
        try:
            db = self._connect()
        except sqlite3.Error as exc:
            raise self._failed(exc) from None
        try:
            db.execute("BEGIN IMMEDIATE")  # one writer at a time: the check and the write are one step
            try:
                version = _write(db, scope, key, text, expect, max_keys, max_bytes)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return version
        except sqlite3.Error as exc:
            raise self._failed(exc) from None
        finally:
            db.close()

    def keys(self, scope: str) -> list[KeyInfo]:
        try:
            db = self._connect()
            try:
                rows = db.execute(
                    "SELECT key, length(value), version FROM nous_state WHERE scope = ? ORDER BY key", (scope,)
                ).fetchall()
            finally:
                db.close()
        except sqlite3.Error as exc:
            raise self._failed(exc) from None
        # SQLite orders by its own collation (UTF-8 bytes); Python's order is by code point, the same for
        # well-formed text, but sorted once more so every store answers alike.
        return sorted((KeyInfo(str(k), int(n), int(ver)) for k, n, ver in rows), key=lambda i: i.key)


def _write(
    db: sqlite3.Connection,
    scope: str,
    key: str,
    text: Optional[str],
    expect: Optional[int],
    max_keys: Optional[int],
    max_bytes: Optional[int],
) -> int:
    row = db.execute(
        "SELECT length(value), version FROM nous_state WHERE scope = ? AND key = ?", (scope, key)
    ).fetchone()
    old_size, found = (0, 0) if row is None else (int(row[0]), int(row[1]))
    check_write(
        key,
        expect=expect,
        found=found,
        old_size=old_size,
        size=None if text is None else len(text),
        max_keys=max_keys,
        max_bytes=max_bytes,
        count=lambda: int(db.execute("SELECT count(*) FROM nous_state WHERE scope = ?", (scope,)).fetchone()[0]),
        total=lambda: int(
            db.execute("SELECT coalesce(sum(length(value)), 0) FROM nous_state WHERE scope = ?", (scope,)).fetchone()[0]
        ),
    )
    if text is None:
        if row is None:
            return 0
        db.execute("DELETE FROM nous_state WHERE scope = ? AND key = ?", (scope, key))
        _bump(db, scope)
        return 0
    version = _bump(db, scope)
    db.execute(
        "INSERT INTO nous_state (scope, key, value, version) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value, version = excluded.version",
        (scope, key, text, version),
    )
    return version


def _bump(db: sqlite3.Connection, scope: str) -> int:
    db.execute(
        "INSERT INTO nous_state_scopes (scope, counter) VALUES (?, 1) "
        "ON CONFLICT (scope) DO UPDATE SET counter = counter + 1",
        (scope,),
    )
    (counter,) = db.execute("SELECT counter FROM nous_state_scopes WHERE scope = ?", (scope,)).fetchone()
    return int(counter)

"""How the library talks to Postgres: bounded connections, the schema's migrations, Django's settings.

Shared by :class:`~nous_sched.PostgresApprovalStore` and
:class:`~nous_sched.PostgresStateStore`. What they rely on:

* **Migrations, once.** The schema is the plain SQL files in
  ``nous_sched/migrations/postgres/`` (``0001_approval_store.sql``,
  ``0002_state_store.sql``, ...), each applied once, in one transaction, by
  the first store that opens the database, its number then kept in the table
  ``nous_sched_schema``. Processes opening a new database at once are
  serialized by a transaction advisory lock: one applies, the others find
  them applied. Every table's name starts with ``nous_sched_``.
* **Never a hang.** Connecting takes at most ``timeout`` seconds (libpq's
  ``connect_timeout``, at least 2), each statement at most ``timeout`` on the
  server (``statement_timeout``, ``lock_timeout``), and each operation at most
  ``timeout`` plus one second on this side: a server that stops answering
  (stopped, a dead network) has its connection cut by a watchdog thread
  (``nous-sched-postgres-watchdog``, which exits once idle for ``WATCHDOG_IDLE``
  seconds). Down, slow or silent, the operation
  raises an :class:`OSError` (``ConnectionError``, or ``TimeoutError``) whose
  message names Postgres and its address, never its password; nothing retries
  on its own.
* **Threads and forks.** :class:`Connections` keeps a few open connections
  and lends each to one operation at a time; a forked child never touches its
  parent's connections (it opens its own).
"""

from __future__ import annotations

import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any, Callable, Optional

from . import _validators as v
from ._extras import install_command
from .errors import RunCodeError

__all__ = ["Connections", "DEFAULT_TIMEOUT", "dsn_from_django", "django_dsn", "migrations", "is_dsn", "DSN"]

#: Seconds to connect, and for each statement, unless a store is given ``timeout=``.
DEFAULT_TIMEOUT = 5.0
#: Connections kept open between operations (more are opened while more operations run at once).
_IDLE = 4
#: Seconds the watchdog thread waits, idle, for the next operation before it exits.
WATCHDOG_IDLE = 1.0
#: Seconds past ``timeout`` before the watchdog cuts a connection the server stopped answering on.
_GRACE = 1.0
#: The advisory lock the migrations are applied under (any constant; "nous" in ASCII).
_MIGRATION_LOCK = 0x6E6F7573


def migrations() -> list[tuple[int, str, str]]:
    """The schema's migrations, ``(number, file name, SQL)``, in the order they are applied."""
    folder = resources.files("nous_sched").joinpath("migrations").joinpath("postgres")
    found = []
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:4].isdigit():
            found.append((int(name[:4]), name, entry.read_text(encoding="utf-8")))
    return sorted(found)


def is_dsn(value: Any) -> bool:
    """A connection string or URL (non-blank text), or a callable that makes a connection."""
    return callable(value) or (isinstance(value, str) and bool(value.strip()))


#: The check of a store's ``dsn`` argument.
DSN = v.Check("a Postgres connection string or URL, or a callable returning a psycopg connection", is_dsn)


class Connections:
    """The connections of one store: lent one per operation, each watched, the schema applied on the first.

    :param dsn: a libpq connection string or URL, or a callable returning a new open ``psycopg.Connection``.
    :param timeout: seconds (see the module's "Never a hang").
    :param who: the store's name, for the message when ``psycopg`` is missing.
    """

    def __init__(self, dsn: Any, timeout: float, who: str) -> None:
        try:
            import psycopg  # noqa: F401  (here for the message below)
        except ImportError:
            raise RunCodeError(f"{who} needs psycopg; install it with: {install_command('postgres')}") from None
        self.timeout = float(timeout)
        self._connect_with: Optional[Callable[[], Any]] = dsn if callable(dsn) else None
        self.dsn = "" if callable(dsn) else str(dsn)
        #: Where the store is, for messages: ``host:port/dbname`` (never a password).
        self.where = _address(self.dsn) if self.dsn else "(a connection factory)"
        self._lock = threading.Lock()
        self._idle: list[Any] = []
        self._pid = os.getpid()
        with self.transaction() as cursor:
            _migrate(cursor)

    def _open(self) -> Any:
        import psycopg

        try:
            if self._connect_with is not None:
                connection = self._connect_with()
            else:
                connection = psycopg.connect(self.dsn, connect_timeout=max(2, round(self.timeout)))
            connection.autocommit = True
        except psycopg.Error as exc:
            raise ConnectionError(f"Postgres at {self.where}: cannot connect: {_first_line(exc)}") from None
        return connection

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A connection for one operation, watched; back to the idle ones after, unless it failed."""
        import psycopg

        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's connections are the parent's
                _ORPHANS.extend(self._idle)  # never closed here (closing would end the parent's sessions)
                self._idle, self._pid = [], os.getpid()
            kept: Any = self._idle.pop() if self._idle else None
        fresh = kept is None or kept.closed
        connection: Any = self._open() if fresh else kept
        watch = _WATCHDOG.watch(connection.fileno(), self.timeout + _GRACE)
        try:
            if fresh:
                ms = max(1, int(self.timeout * 1000))
                connection.execute(f"SET statement_timeout = {ms}; SET lock_timeout = {ms}".encode("ascii"))
            yield connection
        except psycopg.Error as exc:
            cut = _WATCHDOG.unwatch(watch)
            connection.close()
            raise self._said(exc, cut) from None
        except BaseException:  # the caller's own (a conflict): the connection is kept if it is clean
            self._give_back(connection, _WATCHDOG.unwatch(watch))
            raise
        self._give_back(connection, _WATCHDOG.unwatch(watch))

    def _give_back(self, connection: Any, cut: bool) -> None:
        from psycopg.pq import TransactionStatus

        if not cut and not connection.closed and connection.info.transaction_status == TransactionStatus.IDLE:
            with self._lock:
                if self._pid == os.getpid() and len(self._idle) < _IDLE:
                    self._idle.append(connection)
                    return
        connection.close()

    def _said(self, exc: Exception, cut: bool) -> Exception:
        import psycopg

        if cut:
            return TimeoutError(
                f"Postgres at {self.where} did not answer within {self.timeout + _GRACE:g} s "
                "(stopped, or the network is down): its connection was cut"
            )
        if isinstance(exc, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable):
            return TimeoutError(
                f"Postgres at {self.where}: a statement took longer than {self.timeout:g} s: {_first_line(exc)}"
            )
        if isinstance(exc, psycopg.OperationalError):
            return ConnectionError(f"Postgres at {self.where}: {_first_line(exc)}")
        return exc

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A cursor inside one transaction (committed when the block ends, rolled back if it raises)."""
        with self.connection() as connection, connection.transaction(), connection.cursor() as cursor:
            yield cursor

    def one(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        """One statement on its own (autocommit); its cursor."""
        with self.connection() as connection:
            return connection.execute(query, params)

    def close(self) -> None:
        """Close the connections kept open (new ones are opened if used again)."""
        with self._lock:
            idle, self._idle = (self._idle, []) if self._pid == os.getpid() else ([], [])
        for connection in idle:
            connection.close()


def django_dsn(alias: str, who: str) -> str:
    """The connection string of ``settings.DATABASES[alias]``, a Postgres database.

    :raises ConfigError: ``alias`` is not a Postgres database of the settings.
    """
    from django.conf import settings  # type: ignore[import-untyped]  # (no stubs)

    databases = getattr(settings, "DATABASES", {})
    config = databases.get(alias) if isinstance(databases, dict) else None
    if not isinstance(config, dict) or "postgresql" not in str(config.get("ENGINE", "")):
        v.fail(f"{who}.from_django", "alias", alias, "a postgresql database in settings.DATABASES")
    assert isinstance(config, dict)
    return dsn_from_django(config)


def dsn_from_django(config: dict[str, Any]) -> str:
    """A libpq connection string from one entry of Django's ``settings.DATABASES``
    (``NAME``, ``USER``, ``PASSWORD``, ``HOST``, ``PORT``; ``OPTIONS`` as libpq
    parameters, e.g. ``sslmode``), each value quoted as libpq reads it."""
    from psycopg.conninfo import make_conninfo

    parts: dict[str, Any] = {}
    for setting, name in (("NAME", "dbname"), ("USER", "user"), ("PASSWORD", "password")):
        if config.get(setting):
            parts[name] = str(config[setting])
    if config.get("HOST"):
        parts["host"] = str(config["HOST"])
    if config.get("PORT"):
        parts["port"] = str(config["PORT"])
    options = config.get("OPTIONS") or {}
    for name, value in options.items() if isinstance(options, dict) else ():
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            parts[str(name)] = str(value)
    return str(make_conninfo("", **parts))


def _migrate(cursor: Any) -> None:
    """Apply each migration not applied yet, under the advisory lock (in the caller's transaction)."""
    cursor.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
    cursor.execute(
        "CREATE TABLE IF NOT EXISTS nous_sched_schema (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
        "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
    )
    applied = {row[0] for row in cursor.execute("SELECT version FROM nous_sched_schema").fetchall()}
    for number, name, sql in migrations():
        if number not in applied:
            cursor.execute(sql.encode("utf-8"))  # bytes: a plain SQL script, not a query with placeholders
            cursor.execute("INSERT INTO nous_sched_schema (version, name) VALUES (%s, %s)", (number, name))


def _address(dsn: str) -> str:
    """Where a connection string points, for messages: ``host:port/dbname``, never its password."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(dsn)
    except Exception:  # an unparsable string: psycopg's own error says so on connect
        return "(an unparsable connection string)"
    host = str(params.get("host") or os.environ.get("PGHOST") or "localhost")
    port = str(params.get("port") or os.environ.get("PGPORT") or "5432")
    database = str(params.get("dbname") or os.environ.get("PGDATABASE") or "")
    return f"{host}:{port}" + (f"/{database}" if database else "")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


#: Connections a forked child inherited: kept, never closed or freed (that would end the parent's sessions).
_ORPHANS: list[Any] = []


class _Watchdog:
    """Cuts the connection of an operation past its deadline (the server stopped
    answering): a shutdown of a duplicate of its socket, so the client's read ends."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._due: dict[int, tuple[float, int]] = {}
        self._heap: list[tuple[float, int]] = []
        self._cut: set[int] = set()
        self._ids = itertools.count()
        self._thread: Optional[threading.Thread] = None
        self._pid = os.getpid()

    def watch(self, fd: int, seconds: float) -> int:
        deadline = time.monotonic() + seconds
        with self._cond:
            if self._pid != os.getpid():  # a forked child: no thread yet, nothing of the parent's to watch
                self._due, self._heap, self._cut, self._thread, self._pid = {}, [], set(), None, os.getpid()
            ident = next(self._ids)
            self._due[ident] = (deadline, fd)
            heapq.heappush(self._heap, (deadline, ident))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="nous-sched-postgres-watchdog", daemon=True)
                self._thread.start()
            self._cond.notify()
        return ident

    def unwatch(self, ident: int) -> bool:
        """Stop watching; whether the watchdog had cut the connection."""
        with self._cond:
            self._due.pop(ident, None)
            if ident in self._cut:
                self._cut.discard(ident)
                return True
            return False

    def _loop(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._due:
                    heapq.heappop(self._heap)
                if not self._heap:
                    # Idle: it waits a little for the next operation, then exits (watch
                    # starts another), so a process done with Postgres keeps no thread.
                    if not self._cond.wait(WATCHDOG_IDLE) and not self._heap:
                        self._thread = None
                        return
                    continue
                deadline, ident = self._heap[0]
                wait = deadline - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                _, fd = self._due.pop(ident)
                self._cut.add(ident)
                _shut(fd)  # under the lock: the operation still holds its connection, so fd is its socket


def _shut(fd: int) -> None:
    try:
        with socket.socket(fileno=os.dup(fd)) as duplicate:
            duplicate.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by the server: the client's read ends anyway


_WATCHDOG = _Watchdog()

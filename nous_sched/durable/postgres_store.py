"""An approval store in Postgres (:class:`PostgresApprovalStore`), for records that must outlive a Redis restart.

The contract is the other stores' (:mod:`nous_sched.durable.approval_store`:
signed claim-once tokens, expiry, the record, its pending state, each
decision and a resume's progress sealed to the token, the threat model);
only where the rows live differs. What a caller may rely on here:

* **At most once.** :meth:`~PostgresApprovalStore.claim` is one conditional
  ``UPDATE ... RETURNING``: of two resumes of one token racing from any
  processes or machines, the second waits on the row's lock and then finds it
  claimed. A decision is a ``SELECT ... FOR UPDATE`` and its write in one
  transaction, so it lands before a claim or is refused.
* **Migrations, once.** The schema is the plain SQL files in
  ``nous_sched/durable/migrations/`` (``0001_approval_store.sql``, ...), each
  applied once, in one transaction, by the first store that opens the
  database, its number then kept in the table ``nous_sched_schema``. Two
  processes opening a new database at once are serialized by a transaction
  advisory lock: one applies, the other finds them applied. Every table's
  name starts with ``nous_sched_``, so a Django project's database holds them
  beside its own.
* **Byte for byte.** Every column a seal covers holds ASCII JSON text (a NUL,
  which Postgres ``text`` cannot hold, a lone surrogate or any other character
  is a JSON escape in it), and the key is ``bytea``: a record is read back
  exactly as it was sealed.
* **Never a hang.** Connecting takes at most ``timeout`` seconds (libpq's
  ``connect_timeout``, at least 2), each statement at most ``timeout`` on the
  server (``statement_timeout``, ``lock_timeout``), and each operation at
  most ``timeout`` plus one second on this side: a server that stops
  answering (stopped, a dead network) has its connection cut by a watchdog
  thread (``nous-sched-postgres-watchdog``). A Postgres that is down, slow or
  silent fails the operation with an :class:`OSError` (``ConnectionError``,
  or ``TimeoutError``) whose message names Postgres and its address; nothing
  retries on its own.
* **Threads and forks.** A store keeps a few open connections and lends each
  to one operation at a time, so it may be used from many threads; a forked
  child never touches its parent's connections (it opens its own).
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any, Callable, Optional

from .. import _validators as v
from .._extras import install_command
from .._validators import require
from ..errors import RunCodeError
from .approval_store import DEFAULT_TTL, ApprovalStore

__all__ = ["PostgresApprovalStore", "DEFAULT_TIMEOUT", "dsn_from_django", "migrations"]

#: Seconds to connect, and for each statement, unless the store is given ``timeout=``.
DEFAULT_TIMEOUT = 5.0
#: Connections a store keeps open between operations (more are opened while more operations run at once).
_IDLE = 4
#: Seconds past ``timeout`` before the watchdog cuts a connection the server stopped answering on.
_GRACE = 1.0
#: The advisory lock the migrations are applied under (any constant; "nous" in ASCII).
_MIGRATION_LOCK = 0x6E6F7573
_KEY_BYTES = 32
_COLUMNS = (
    "record",
    "expires",
    "state",
    "decisions",
    "claimed_by",
    "seal",
    "state_seal",
    "progress",
    "progress_seal",
)
_SELECT = "SELECT " + ", ".join(_COLUMNS) + " FROM nous_sched_suspensions WHERE id = %s"
_SETTABLE = frozenset(_COLUMNS) - {"record", "expires", "seal"}


def migrations() -> list[tuple[int, str, str]]:
    """The schema's migrations, ``(number, file name, SQL)``, in the order they are applied."""
    folder = resources.files(__package__).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:4].isdigit():
            found.append((int(name[:4]), name, entry.read_text(encoding="utf-8")))
    return sorted(found)


class PostgresApprovalStore(ApprovalStore):
    """An approval store in a Postgres database, shared by every process and machine
    that reaches it (needs ``psycopg``: ``pip install -e '.[postgres]'`` from a checkout).

    :param dsn: a libpq connection string or URL (``postgresql://user@host:5432/db``,
        ``"host=/run/postgresql dbname=app"``); or a callable that returns a new open
        ``psycopg.Connection`` (a Django project's own settings: :meth:`from_django`).
        With a callable, the connect timeout is the callable's to set.
    :param key: the HMAC key for tokens; by default one made at random and kept in the database.
    :param ttl: seconds a suspension waits for its approvals.
    :param park: seconds this process holds a run it suspended (see :class:`~nous_sched.SqliteApprovalStore`).
    :param timeout: seconds to connect and for each statement (see the module's "Never a hang").

    The schema is applied when the store is made (so a database that cannot be
    reached fails here, naming Postgres and its address).
    """

    def __init__(
        self,
        dsn: Any,
        *,
        key: Optional[bytes] = None,
        ttl: float = DEFAULT_TTL,
        park: float = 0.0,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        require(
            "PostgresApprovalStore",
            "dsn",
            dsn,
            v.Check("a Postgres connection string or URL, or a callable returning a psycopg connection", _is_dsn),
        )
        require("PostgresApprovalStore", "timeout", timeout, v.SECONDS)
        super().__init__(key, ttl, park)
        try:
            import psycopg  # noqa: F401  (here for the message below)
        except ImportError:
            raise RunCodeError(
                f"PostgresApprovalStore needs psycopg; install it with: {install_command('postgres')}"
            ) from None
        self.timeout = float(timeout)
        self._connect_with: Optional[Callable[[], Any]] = dsn if callable(dsn) else None
        self.dsn = "" if callable(dsn) else str(dsn)
        self._where = _address(self.dsn) if self.dsn else "(a connection factory)"
        self._lock = threading.Lock()
        self._idle: list[Any] = []
        self._pid = os.getpid()
        with self._transaction() as cursor:
            _migrate(cursor)

    @classmethod
    def from_django(cls, alias: str = "default", **options: Any) -> PostgresApprovalStore:
        """A store in the database ``settings.DATABASES[alias]`` names (a ``django.db.backends.postgresql``
        one), on connections of its own, made from the same settings (``NAME``, ``USER``, ``PASSWORD``,
        ``HOST``, ``PORT`` and ``OPTIONS``); ``options`` as for the constructor.

        :raises ConfigError: ``alias`` is not a Postgres database of the settings.
        """
        from django.conf import settings  # type: ignore[import-untyped]  # (no stubs)

        databases = getattr(settings, "DATABASES", {})
        config = databases.get(alias) if isinstance(databases, dict) else None
        if not isinstance(config, dict) or "postgresql" not in str(config.get("ENGINE", "")):
            v.fail("PostgresApprovalStore.from_django", "alias", alias, "a postgresql database in settings.DATABASES")
        assert isinstance(config, dict)
        return cls(dsn_from_django(config), **options)

    def __repr__(self) -> str:
        return f"PostgresApprovalStore({self._where!r})"

    # -- connections -------------------------------------------------------------

    def _open(self) -> Any:
        import psycopg

        try:
            if self._connect_with is not None:
                connection = self._connect_with()
            else:
                connection = psycopg.connect(self.dsn, connect_timeout=max(2, round(self.timeout)))
            connection.autocommit = True
        except psycopg.Error as exc:
            raise ConnectionError(f"Postgres at {self._where}: cannot connect: {_first_line(exc)}") from None
        return connection

    @contextmanager
    def _connection(self) -> Iterator[Any]:
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
            if cut:
                raise TimeoutError(
                    f"Postgres at {self._where} did not answer within {self.timeout + _GRACE:g} s "
                    "(stopped, or the network is down): its connection was cut"
                ) from None
            if isinstance(exc, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable):
                raise TimeoutError(
                    f"Postgres at {self._where}: a statement took longer than {self.timeout:g} s: {_first_line(exc)}"
                ) from None
            if isinstance(exc, psycopg.OperationalError):
                raise ConnectionError(f"Postgres at {self._where}: {_first_line(exc)}") from None
            raise
        except BaseException:
            _WATCHDOG.unwatch(watch)
            connection.close()
            raise
        if _WATCHDOG.unwatch(watch):
            connection.close()
            return
        with self._lock:
            if self._pid == os.getpid() and len(self._idle) < _IDLE:
                self._idle.append(connection)
                return
        connection.close()

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        with self._connection() as connection, connection.transaction(), connection.cursor() as cursor:
            yield cursor

    def _one(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        with self._connection() as connection:
            return connection.execute(query, params)

    def close(self) -> None:
        """Close the connections this store keeps open (it opens new ones if used again)."""
        with self._lock:
            idle, self._idle = (self._idle, []) if self._pid == os.getpid() else ([], [])
        for connection in idle:
            connection.close()

    # -- rows --------------------------------------------------------------------

    def _stored_key(self) -> bytes:
        with self._transaction() as cursor:
            cursor.execute(
                "INSERT INTO nous_sched_meta (name, value) VALUES ('hmac_key', %s) ON CONFLICT (name) DO NOTHING",
                (secrets.token_bytes(_KEY_BYTES),),
            )
            row = cursor.execute("SELECT value FROM nous_sched_meta WHERE name = 'hmac_key'").fetchone()
        return bytes(row[0])

    def _put(self, sid: str, record: str, expires: float, seal: str, state_seal: str) -> None:
        self._one(
            "INSERT INTO nous_sched_suspensions (id, record, expires, state, seal, state_seal) "
            "VALUES (%s, %s, %s, 'pending', %s, %s)",
            (sid, record, expires, seal, state_seal),
        )

    def _get(self, sid: str) -> Optional[dict[str, Any]]:
        row = self._one(_SELECT, (sid,)).fetchone()
        return None if row is None else _row_of(row)

    def _claim(self, sid: str, now: float, by: str, state_seal: str, after: dict[str, str]) -> Optional[dict[str, Any]]:
        # The conditional UPDATE is the claim: a second one waits for the first's row
        # lock, then finds the row claimed and changes nothing.
        with self._transaction() as cursor:
            won = cursor.execute(
                "UPDATE nous_sched_suspensions SET state = 'claimed', claimed_by = %s, state_seal = %s, "
                "progress = %s, progress_seal = %s "
                "WHERE id = %s AND state = 'pending' AND state_seal = %s AND expires > %s RETURNING "
                + ", ".join(_COLUMNS),
                (by, after["claimed_seal"], after["progress"], after["progress_seal"], sid, state_seal, now),
            ).fetchone()
            row = won if won is not None else cursor.execute(_SELECT, (sid,)).fetchone()
        if row is None:
            return None
        found = _row_of(row)
        found["won"] = won is not None
        return found

    def _swap(self, sid: str, expect: dict[str, str], fields: dict[str, str]) -> bool:
        assert set(fields) | set(expect) <= set(_COLUMNS), (fields, expect)
        assignments = ", ".join(f"{name} = %s" for name in fields)
        conditions = "".join(f" AND {name} = %s" for name in expect)
        changed = self._one(
            f"UPDATE nous_sched_suspensions SET {assignments} WHERE id = %s{conditions}",
            (*fields.values(), sid, *expect.values()),
        ).rowcount
        return bool(changed == 1)

    def _set(self, sid: str, **fields: str) -> None:
        assert set(fields) <= _SETTABLE, fields
        assignments = ", ".join(f"{name} = %s" for name in fields)
        self._one(f"UPDATE nous_sched_suspensions SET {assignments} WHERE id = %s", (*fields.values(), sid))

    def _decide(self, sid: str, seq: str, decision: str) -> Optional[dict[str, Any]]:
        with self._transaction() as cursor:
            row = cursor.execute(_SELECT + " FOR UPDATE", (sid,)).fetchone()
            if row is None:
                return None
            found = _row_of(row)
            if found["state"] == "pending":
                decisions = _decisions_of(found["decisions"])
                decisions[seq] = json.loads(decision)
                found["decisions"] = json.dumps(decisions, separators=(",", ":"))
                cursor.execute(
                    "UPDATE nous_sched_suspensions SET decisions = %s WHERE id = %s", (found["decisions"], sid)
                )
        return found

    def _rows(self) -> list[tuple[str, dict[str, Any]]]:
        with self._transaction() as cursor:
            cursor.execute("DELETE FROM nous_sched_suspensions WHERE expires <= %s", (time.time(),))
            rows = cursor.execute(
                "SELECT id, " + ", ".join(_COLUMNS) + " FROM nous_sched_suspensions ORDER BY expires"
            ).fetchall()
        return [(row[0], _row_of(row[1:])) for row in rows]


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


def _is_dsn(value: Any) -> bool:
    return callable(value) or (isinstance(value, str) and bool(value.strip()))


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


def _row_of(values: Any) -> dict[str, Any]:
    """A row as a dict of columns; an expiry written by hand as NaN or infinite is treated as
    expired (the token's own expiry is what counts)."""
    row: dict[str, Any] = dict(zip(_COLUMNS, values, strict=True))
    expires = float(row["expires"])
    row["expires"] = expires if math.isfinite(expires) else 0.0
    return row


def _decisions_of(text: str) -> dict[str, Any]:
    try:
        found = json.loads(text or "{}")
    except ValueError:
        return {}  # damaged: the decision replaces it, and its seal still says what is real
    return found if isinstance(found, dict) else {}


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
                    self._cond.wait()
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

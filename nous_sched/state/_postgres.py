"""PostgresStateStore: state in a Postgres database, shared by every process and machine that reaches it."""

from __future__ import annotations

from typing import Any, Optional

from .. import _validators as v
from .._postgres_client import DEFAULT_TIMEOUT, DSN, Connections, django_dsn
from .._validators import require
from ._seam import Entry, KeyInfo, StateStoreError, check_write

__all__ = ["PostgresStateStore"]


class PostgresStateStore:
    """A :class:`~nous_sched.StateStoreSeam` in a Postgres database (needs
    ``psycopg``: ``pip install -e '.[postgres]'`` from a checkout).

    Each write is one transaction that first locks its scope's row
    (``SELECT ... FOR UPDATE`` on ``nous_sched_state_scopes``, which also
    holds the scope's version counter): the expectation, the bounds and the
    write are one step against every other writer of the scope, from any
    process or machine; writers of other scopes never wait for it. The
    schema, the timeouts and the errors are every Postgres store's
    (``nous_sched._postgres_client``): a Postgres that is down, slow or silent
    fails the operation with :class:`StateStoreError` naming Postgres and its
    address, never a hang.

    :param dsn: a libpq connection string or URL, or a callable returning a new open
        ``psycopg.Connection``; :meth:`from_django` for a Django project's database.
    :param timeout: seconds to connect and for each statement.
    """

    def __init__(self, dsn: Any, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        require("PostgresStateStore", "dsn", dsn, DSN)
        require("PostgresStateStore", "timeout", timeout, v.SECONDS)
        self.timeout = float(timeout)
        try:
            self._db = Connections(dsn, timeout, "PostgresStateStore")
        except OSError as exc:
            raise _failed(exc) from None

    @classmethod
    def from_django(cls, alias: str = "default", **options: Any) -> PostgresStateStore:
        """A store in the database ``settings.DATABASES[alias]`` names, on connections of its own
        (as :meth:`PostgresApprovalStore.from_django <nous_sched.PostgresApprovalStore.from_django>`)."""
        return cls(django_dsn(alias, "PostgresStateStore"), **options)

    def __repr__(self) -> str:
        return f"PostgresStateStore({self._db.where!r})"

    def close(self) -> None:
        """Close the connections this store keeps open (it opens new ones if used again)."""
        self._db.close()

    def read(self, scope: str, key: str) -> Optional[Entry]:
        try:
            row = self._db.one(
                "SELECT value, version FROM nous_sched_state WHERE scope = %s AND key = %s", (scope, key)
            ).fetchone()
        except (OSError, _psycopg_error()) as exc:
            raise _failed(exc) from None
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
            with self._db.transaction() as cursor:
                return _write(cursor, scope, key, text, expect, max_keys, max_bytes)
        except (OSError, _psycopg_error()) as exc:
            raise _failed(exc) from None

    def keys(self, scope: str) -> list[KeyInfo]:
        try:
            rows = self._db.one(
                "SELECT key, octet_length(value), version FROM nous_sched_state WHERE scope = %s", (scope,)
            ).fetchall()
        except (OSError, _psycopg_error()) as exc:
            raise _failed(exc) from None
        # Sorted here, by code point, as every store answers (the database's collation may differ).
        return sorted((KeyInfo(str(k), int(n), int(ver)) for k, n, ver in rows), key=lambda i: i.key)


def _write(
    cursor: Any,
    scope: str,
    key: str,
    text: Optional[str],
    expect: Optional[int],
    max_keys: Optional[int],
    max_bytes: Optional[int],
) -> int:
    # The scope's row is its lock: every writer of the scope takes it first, so the
    # count and the sum below cannot change under this write.
    cursor.execute(
        "INSERT INTO nous_sched_state_scopes (scope, counter) VALUES (%s, 0) ON CONFLICT (scope) DO NOTHING",
        (scope,),
    )
    cursor.execute("SELECT counter FROM nous_sched_state_scopes WHERE scope = %s FOR UPDATE", (scope,))
    row = cursor.execute(
        "SELECT octet_length(value), version FROM nous_sched_state WHERE scope = %s AND key = %s", (scope, key)
    ).fetchone()
    old_size, found = (0, 0) if row is None else (int(row[0]), int(row[1]))
    check_write(
        key,
        expect=expect,
        found=found,
        old_size=old_size,
        size=None if text is None else len(text.encode("utf-8")),
        max_keys=max_keys,
        max_bytes=max_bytes,
        count=lambda: int(
            cursor.execute("SELECT count(*) FROM nous_sched_state WHERE scope = %s", (scope,)).fetchone()[0]
        ),
        total=lambda: int(
            cursor.execute(
                "SELECT coalesce(sum(octet_length(value)), 0) FROM nous_sched_state WHERE scope = %s", (scope,)
            ).fetchone()[0]
        ),
    )
    if text is None:
        if row is None:
            return 0
        cursor.execute("DELETE FROM nous_sched_state WHERE scope = %s AND key = %s", (scope, key))
        _bump(cursor, scope)
        return 0
    version = _bump(cursor, scope)
    cursor.execute(
        "INSERT INTO nous_sched_state (scope, key, value, version) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value, version = excluded.version",
        (scope, key, text, version),
    )
    return version


def _bump(cursor: Any, scope: str) -> int:
    (counter,) = cursor.execute(
        "UPDATE nous_sched_state_scopes SET counter = counter + 1 WHERE scope = %s RETURNING counter", (scope,)
    ).fetchone()
    return int(counter)


def _psycopg_error() -> type[Exception]:
    import psycopg

    return psycopg.Error


def _failed(exc: BaseException) -> StateStoreError:
    text = str(exc)
    said = text if text.startswith("Postgres at ") else f"Postgres: {type(exc).__name__}: {text}"
    return StateStoreError(f"the Postgres state store could not answer: {said}")

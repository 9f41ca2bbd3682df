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
* **Migrations, once; never a hang; threads and forks**: as every Postgres
  store of the library (``nous_sched._postgres_client``: the schema's plain
  SQL files applied once under an advisory lock; connect, statement and
  operation timeouts, a watchdog for a silent server; an :class:`OSError`
  naming Postgres and its address).
* **Byte for byte.** Every column a seal covers holds ASCII JSON text (a NUL,
  which Postgres ``text`` cannot hold, a lone surrogate or any other character
  is a JSON escape in it), and the key is ``bytea``: a record is read back
  exactly as it was sealed.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from typing import Any, Optional

from .. import _validators as v
from .._postgres_client import DEFAULT_TIMEOUT, DSN, Connections, django_dsn, dsn_from_django, migrations
from .._validators import require
from ._progress import DEFAULT_LEASE
from .approval_store import DEFAULT_TTL, ApprovalStore

__all__ = ["PostgresApprovalStore", "DEFAULT_TIMEOUT", "dsn_from_django", "migrations"]

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
    :param lease: seconds a resume holds its claim without renewing it (see :class:`~nous_sched.SqliteApprovalStore`).

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
        lease: float = DEFAULT_LEASE,
    ) -> None:
        require("PostgresApprovalStore", "dsn", dsn, DSN)
        require("PostgresApprovalStore", "timeout", timeout, v.SECONDS)
        super().__init__(key, ttl, park, lease)
        self.timeout = float(timeout)
        self._db = Connections(dsn, timeout, "PostgresApprovalStore")
        self.dsn = self._db.dsn

    @classmethod
    def from_django(cls, alias: str = "default", **options: Any) -> PostgresApprovalStore:
        """A store in the database ``settings.DATABASES[alias]`` names (a ``django.db.backends.postgresql``
        one), on connections of its own, made from the same settings (``NAME``, ``USER``, ``PASSWORD``,
        ``HOST``, ``PORT`` and ``OPTIONS``); ``options`` as for the constructor.

        :raises ConfigError: ``alias`` is not a Postgres database of the settings.
        """
        return cls(django_dsn(alias, "PostgresApprovalStore"), **options)

    def __repr__(self) -> str:
        return f"PostgresApprovalStore({self._db.where!r})"

    def close(self) -> None:
        """Close the connections this store keeps open (it opens new ones if used again)."""
        self._db.close()

    # -- rows --------------------------------------------------------------------

    def _stored_key(self) -> bytes:
        with self._db.transaction() as cursor:
            cursor.execute(
                "INSERT INTO nous_sched_meta (name, value) VALUES ('hmac_key', %s) ON CONFLICT (name) DO NOTHING",
                (secrets.token_bytes(_KEY_BYTES),),
            )
            row = cursor.execute("SELECT value FROM nous_sched_meta WHERE name = 'hmac_key'").fetchone()
        return bytes(row[0])

    def _put(self, sid: str, record: str, expires: float, seal: str, state_seal: str) -> None:
        self._db.one(
            "INSERT INTO nous_sched_suspensions (id, record, expires, state, seal, state_seal) "
            "VALUES (%s, %s, %s, 'pending', %s, %s)",
            (sid, record, expires, seal, state_seal),
        )

    def _get(self, sid: str) -> Optional[dict[str, Any]]:
        row = self._db.one(_SELECT, (sid,)).fetchone()
        return None if row is None else _row_of(row)

    def _claim(self, sid: str, now: float, by: str, state_seal: str, after: dict[str, str]) -> Optional[dict[str, Any]]:
        # The conditional UPDATE is the claim: a second one waits for the first's row
        # lock, then finds the row claimed and changes nothing.
        with self._db.transaction() as cursor:
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
        changed = self._db.one(
            f"UPDATE nous_sched_suspensions SET {assignments} WHERE id = %s{conditions}",
            (*fields.values(), sid, *expect.values()),
        ).rowcount
        return bool(changed == 1)

    def _set(self, sid: str, **fields: str) -> None:
        assert set(fields) <= _SETTABLE, fields
        assignments = ", ".join(f"{name} = %s" for name in fields)
        self._db.one(f"UPDATE nous_sched_suspensions SET {assignments} WHERE id = %s", (*fields.values(), sid))

    def _decide(self, sid: str, seq: str, decision: str) -> Optional[dict[str, Any]]:
        with self._db.transaction() as cursor:
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
        with self._db.transaction() as cursor:
            cursor.execute("DELETE FROM nous_sched_suspensions WHERE expires <= %s", (time.time(),))
            rows = cursor.execute(
                "SELECT id, " + ", ".join(_COLUMNS) + " FROM nous_sched_suspensions ORDER BY expires"
            ).fetchall()
        return [(row[0], _row_of(row[1:])) for row in rows]


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

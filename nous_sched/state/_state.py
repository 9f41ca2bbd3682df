"""State: one scope's keys, and what one run does with them (a session)."""

from __future__ import annotations

import re
from typing import Any, Optional

import attrs

from .. import _validators as v
from .._validators import require
from ..crossing import dumps, loads, snapshot
from ..limits import Limits
from ._memory import SHARED
from ._seam import KeyInfo, StateConflict, StateFull, StateStoreError, StateStoreSeam

__all__ = ["State", "StateSession", "StateAnswer", "MAX_KEY_CHARS", "key_problem", "OPS", "open_state_store"]

#: The longest key or scope name, in characters.
MAX_KEY_CHARS = 256

#: What a program may do with its state: ``state.get``, ``state.set``, ``state.delete``, ``state.keys``.
OPS = ("get", "set", "delete", "keys")

# C0 and C1 controls (NUL among them) and lone surrogates: a key is a name people read and stores keep as UTF-8.
_BAD = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def key_problem(key: Any, what: str = "key") -> Optional[str]:
    """Why ``key`` cannot name a key (or, ``what="scope"``, a scope), or ``None`` when it can."""
    if not isinstance(key, str):
        return f"a {what} must be a string, not {type(key).__name__ if key is not None else 'null'}"
    if not key:
        return f"a {what} must not be empty"
    if len(key) > MAX_KEY_CHARS:
        return f"a {what} must be at most {MAX_KEY_CHARS} characters (this one has {len(key)})"
    if _BAD.search(key):
        return f"a {what} must not hold control characters or lone surrogates"
    return None


def _scope(value: Any) -> bool:
    return key_problem(value, "scope") is None


_SCOPE = v.Check(f"a non-empty string of at most {MAX_KEY_CHARS} characters, no control characters", _scope)
_STORE = v.optional(
    v.Check("a state store (StateStoreSeam: read, write, keys)", lambda s: isinstance(s, StateStoreSeam))
)


class State:
    """One scope's state (a conversation, a user): JSON values by key, kept in
    ``store`` (by default this process's memory, shared by every ``State`` of
    the same scope; or a :class:`~nous_sched.SqliteStateStore`, a :class:`~nous_sched.RedisStateStore`,
    any :class:`~nous_sched.StateStoreSeam`). Pass it as ``run_code(..., state=...)``: the
    program reads and writes it through ``state.get/set/delete/keys``.

    The methods here are the host's own view (no session: a ``set`` here is
    never a conflict), bounded by ``limits``' ``state_*`` fields.

    :raises ConfigError: ``scope`` is not a non-empty string of at most
        ``nous_sched.state.MAX_KEY_CHARS`` (256) characters without control characters or lone
        surrogates, or ``store`` is not a state store.
    """

    __slots__ = ("scope", "store")

    def __init__(self, scope: str, store: Optional[StateStoreSeam] = None) -> None:
        require("State", "scope", scope, _SCOPE)
        require("State", "store", store, _STORE)
        #: The scope's name.
        self.scope: str = scope
        #: Where its keys are kept.
        self.store: StateStoreSeam = SHARED if store is None else store

    def __repr__(self) -> str:
        return f"State({self.scope!r}, store={self.store!r})"

    def get(self, key: str) -> Any:
        """The key's value (a fresh copy), or ``None`` when absent."""
        _require_key("State.get", key)
        entry = self.store.read(self.scope, key)
        return None if entry is None else loads(entry.text)

    def set(self, key: str, value: Any, limits: Optional[Limits] = None) -> None:
        """Write ``value`` (a snapshot, :func:`nous_sched.snapshot`'s rules) at ``key``.

        :raises ConfigError: a bad key, a value that cannot cross, or one past ``limits``' ``state_*`` fields.
        """
        _require_key("State.set", key)
        bounds = limits or Limits()
        text = dumps(snapshot(value))
        if len(text) > bounds.state_value_bytes:
            v.fail(
                "State.set",
                "value",
                value,
                f"at most {bounds.state_value_bytes} bytes of JSON (Limits.state_value_bytes)",
            )
        try:
            self.store.write(self.scope, key, text, max_keys=bounds.state_keys, max_bytes=bounds.state_bytes)
        except StateFull as exc:
            v.fail("State.set", "key", key, f"room in the scope: {_full_message(exc)}")

    def delete(self, key: str) -> None:
        """Remove the key (nothing happens when it is absent)."""
        _require_key("State.delete", key)
        self.store.write(self.scope, key, None)

    def keys(self) -> list[KeyInfo]:
        """Every key with its size and version, sorted by key."""
        return self.store.keys(self.scope)


def _require_key(owner: str, key: Any) -> None:
    problem = key_problem(key)
    if problem is not None:
        v.fail(owner, "key", key, problem)


def _full_message(exc: StateFull) -> str:
    if exc.bound == "keys":
        return f"the scope holds its most keys ({exc.limit}, Limits.state_keys): delete one first"
    return f"the scope's values would pass {exc.limit} bytes of JSON in all (Limits.state_bytes): delete some first"


@attrs.frozen
class StateAnswer:
    """What one state operation of a program did: ``ok`` and the program's
    ``value`` (or the failure's ``message``), and for the audit its ``op``,
    ``key`` (``None`` for ``keys``), ``size`` (bytes of the value's JSON read,
    written, or of every key's for ``keys``) and ``version`` (0: absent).
    ``error``: why it failed (``conflict``: another run changed the key;
    ``limit``, ``invalid``, ``store``, ``no_state``), ``None`` when ok."""

    op: str
    ok: bool
    value: Any = None
    message: str = ""
    key: Optional[str] = None
    size: int = 0
    version: int = 0
    error: Optional[str] = None


class StateSession:
    """One run's use of a :class:`~nous_sched.State`: the versions it read, so a write of a
    key it read fails when another run changed that key since (``conflict``)."""

    def __init__(self, state: State, limits: Limits) -> None:
        self.state = state
        self.limits = limits
        #: key -> the version this run last read or wrote (0: absent)
        self.seen: dict[str, int] = {}

    def remember(self, key: str, version: int) -> None:
        """Take ``version`` as this run's last read or write of ``key`` (a durable run's
        replayed operation: a later write of the key is checked against it)."""
        self.seen[key] = version

    def answer(self, op: str, args: Any) -> StateAnswer:
        """Do ``state.<op>(*args)`` (``args``: the program's arguments, parsed); never raises."""
        if op not in OPS:
            return StateAnswer(
                "?", False, message=f"state has no such operation; it has {', '.join(OPS)}", error="invalid"
            )
        if not isinstance(args, list):
            args = []
        try:
            if op == "keys":
                return self._keys(args)
            key = args[0] if args else None
            problem = key_problem(key)
            if problem is not None or not isinstance(key, str):
                return StateAnswer(op, False, message=problem or "", error="invalid")
            if op == "get":
                return self._get(key)
            if op == "delete":
                return self._write(op, key, None)
            if len(args) < 2:
                return StateAnswer(
                    op,
                    False,
                    key=key,
                    message="state.set takes a key and a JSON value (use state.delete to remove a key)",
                    error="invalid",
                )
            return self._set(key, args[1])
        except Exception as exc:  # a store's failure is the program's error to catch, never the run's end
            key = args[0] if op != "keys" and args and key_problem(args[0]) is None else None
            message = str(exc) if isinstance(exc, StateStoreError) else f"the state store failed: {type(exc).__name__}"
            return StateAnswer(op, False, key=key, message=message, error="store")

    def _keys(self, args: list[Any]) -> StateAnswer:
        infos = self.state.store.keys(self.state.scope)
        return StateAnswer(
            "keys", True, value=[{"key": i.key, "size": i.size} for i in infos], size=sum(i.size for i in infos)
        )

    def _get(self, key: str) -> StateAnswer:
        entry = self.state.store.read(self.state.scope, key)
        if entry is None:
            self.seen[key] = 0
            return StateAnswer("get", True, value=None, key=key)
        self.seen[key] = entry.version
        return StateAnswer("get", True, value=loads(entry.text), key=key, size=len(entry.text), version=entry.version)

    def _set(self, key: str, value: Any) -> StateAnswer:
        text = dumps(value)  # the gate parsed it under the snapshot rules: it crosses as it is
        limit = self.limits.state_value_bytes
        if len(text) > limit:
            message = f"the value is {len(text)} bytes of JSON, over the run's limit of {limit} (Limits.state_value_bytes): nothing was written"
            return StateAnswer("set", False, key=key, size=len(text), message=message, error="limit")
        return self._write("set", key, text)

    def _write(self, op: str, key: str, text: Optional[str]) -> StateAnswer:
        size = 0 if text is None else len(text)
        try:
            version = self.state.store.write(
                self.state.scope,
                key,
                text,
                expect=self.seen.get(key),
                max_keys=self.limits.state_keys,
                max_bytes=self.limits.state_bytes,
            )
        except StateConflict as exc:
            message = (
                f"conflict: another run changed the key {dumps(key)} since this run read it "
                "(nothing was written): read it again with state.get and retry"
            )
            return StateAnswer(op, False, key=key, size=size, version=exc.found, message=message, error="conflict")
        except StateFull as exc:
            return StateAnswer(
                op, False, key=key, size=size, message=_full_message(exc) + ": nothing was written", error="limit"
            )
        self.seen[key] = version
        return StateAnswer(op, True, value=None, key=key, size=size, version=version)


def open_state_store(spec: Any) -> StateStoreSeam:
    """The state store ``spec`` names (what ``--state-store`` takes): a
    ``redis://`` (``rediss://``, ``unix://``) URL, a ``postgresql://``
    (``postgres://``) URL, ``memory`` (this process's shared store), or a
    SQLite file.

    :raises ConfigError: ``spec`` is not a non-empty string, or the store cannot be opened (the message names it).
    """
    from ._postgres import PostgresStateStore
    from ._redis import RedisStateStore
    from ._sqlite import SqliteStateStore

    require("open_state_store", "spec", spec, v.NON_EMPTY_STR)
    if spec == "memory":
        return SHARED
    if spec.startswith(("postgresql://", "postgres://")):
        return PostgresStateStore(spec)
    if spec.startswith(("redis://", "rediss://", "unix://")):
        return RedisStateStore(spec)
    return SqliteStateStore(spec)

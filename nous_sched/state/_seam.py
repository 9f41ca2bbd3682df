"""What a state store must implement (:class:`~nous_sched.StateStoreSeam`), and what it answers.

A store keeps, per *scope* (a conversation, a user), keys holding JSON text,
each with a *version*: a number the store gives every write of the scope,
never given twice in one scope (a per-scope counter), so a key deleted and
written again never comes back at a version a reader saw before.

Every :meth:`StateStoreSeam.write` is one atomic compare-and-set: the
expectation (``expect``), the bounds (``max_keys``, ``max_bytes``) and the
write itself are checked and done as one step, whatever other processes
write to the same scope at once (memory: one lock; SQLite: one
``BEGIN IMMEDIATE`` transaction; Redis: one Lua script). The contract every
store keeps is ``tests/state_contract.py``: run each of its checks against a
new store, as ``tests/test_state_stores.py`` does for the three built in.
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol, runtime_checkable

import attrs

from ..errors import RunCodeError

__all__ = ["StateStoreSeam", "Entry", "KeyInfo", "StateConflict", "StateFull", "StateStoreError"]


@attrs.frozen
class Entry:
    """A key's value as a store holds it: its JSON ``text`` and its ``version``."""

    text: str
    version: int


@attrs.frozen
class KeyInfo:
    """A key of a scope: its name (``key``), the bytes of its JSON text (``size``) and its ``version``."""

    key: str
    size: int
    version: int


class StateConflict(Exception):
    """A write whose expectation failed: the key is at ``found`` (0: absent), not the version expected."""

    def __init__(self, key: str, expected: int, found: int) -> None:
        super().__init__(f"state key {key!r} is at version {found}, not {expected}")
        self.key = key
        self.expected = expected
        self.found = found


class StateFull(Exception):
    """A write refused by a bound of its scope: ``bound`` is ``"keys"`` or ``"bytes"``, ``limit`` its value."""

    def __init__(self, bound: str, limit: int) -> None:
        super().__init__(f"the scope would hold more than {limit} {bound}")
        self.bound = bound
        self.limit = limit


def check_write(
    key: str,
    *,
    expect: Optional[int],
    found: int,
    old_size: int,
    size: Optional[int],
    max_keys: Optional[int],
    max_bytes: Optional[int],
    count: Callable[[], int],
    total: Callable[[], int],
) -> None:
    """The one rule every store applies inside its atomic write, before it writes:
    :class:`StateConflict` when ``expect`` is not the key's version ``found`` (0:
    absent); for a set (``size``: the new value's size, ``None`` for a delete),
    :class:`StateFull` when a new key would pass ``max_keys`` (``count()``: the
    scope's keys now) or a bigger value would pass ``max_bytes`` (``total()``: the
    scope's size now, ``old_size`` the key's). A value no bigger than the old one
    is always let through, so a full scope can still shrink."""
    if expect is not None and expect != found:
        raise StateConflict(key, expect, found)
    if size is None:
        return
    if found == 0 and max_keys is not None and count() + 1 > max_keys:
        raise StateFull("keys", max_keys)
    if max_bytes is not None and size > old_size and total() - old_size + size > max_bytes:
        raise StateFull("bytes", max_bytes)


class StateStoreError(RunCodeError):
    """A state store that could not answer (down, silent, damaged); the message names the store."""


@runtime_checkable
class StateStoreSeam(Protocol):
    """What ``State(scope, store=...)`` takes: versioned keys of JSON text, per scope.

    ``scope`` and ``key`` are non-empty strings without control characters or
    lone surrogates (:class:`~nous_sched.State` checks them before a store
    sees them); ``text`` is compact JSON, ASCII only. A store that cannot
    answer raises :class:`~nous_sched.StateStoreError` naming itself.
    """

    def read(self, scope: str, key: str) -> Optional[Entry]:
        """The key's value and version, or ``None`` when the scope has no such key."""
        ...

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
        """Set the key to ``text`` (``None``: delete it), in one atomic step; the
        key's new version (0 once deleted, or when deleting a key that was absent).

        ``expect``: ``None`` writes whatever the key holds; ``0`` only while the
        key is absent; any other number only while the key is at that version.
        ``max_keys`` / ``max_bytes``: the most keys, and bytes of text in all,
        the scope may hold after the write (``None``: no bound); a write that
        would pass one is refused (one that shrinks the scope never is).

        It raises ``nous_sched.state.StateConflict`` when the key is not at
        ``expect``, ``nous_sched.state.StateFull`` when the write would pass
        ``max_keys`` or ``max_bytes``; either way nothing was written.
        """
        ...

    def keys(self, scope: str) -> list[KeyInfo]:
        """Every key of the scope with its size and version, sorted by key."""
        ...

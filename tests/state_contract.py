"""The state store contract: every promise of :class:`nous_sched.state.StateStoreSeam`,
as checks any store can be run against.

A new store's checklist: run each check of :data:`CHECKS` with a *factory*,
a callable that returns a store; every store one factory returns reaches the
same storage (as two processes sharing a file or a server would), e.g.
``pytest.mark.parametrize("check", CHECKS)`` as ``tests/test_state_stores.py``
does for the memory, SQLite and Redis stores. Each check works in scopes of
its own (a fresh random name), so a factory need not empty its storage.

What a store must do, check by check:

- an absent key reads as ``None``; a new scope has no keys;
- a write is read back as it was written, with a positive version; ``keys``
  lists every key, sorted, with the bytes of its text and its version;
- versions grow with every write of a scope and are never given twice, a key
  deleted and written again included;
- ``expect``: ``0`` only while absent, a number only at that version; a
  failed expectation raises :class:`StateConflict` (``found``: the version
  it is at) and writes nothing; deleting absent keys is no error;
- ``max_keys`` and ``max_bytes`` refuse a write that would pass them
  (:class:`StateFull`, ``bound`` ``"keys"`` or ``"bytes"``), never an overwrite
  that keeps the count or a write that shrinks the scope;
- scopes are apart, whatever characters their names hold (a scope named
  like another's part included); keys may hold any character but controls
  and lone surrogates (quotes, colons, bidi, astral characters);
- atomic across clients: threads doing read-modify-write with ``expect`` and
  retrying on conflict keep every increment; threads adding keys at once
  never pass ``max_keys`` together.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any, Callable

from nous_sched.state import StateConflict, StateFull, StateStoreSeam

Factory = Callable[[], StateStoreSeam]


def _scope(tag: str = "") -> str:
    return f"contract-{tag}{uuid.uuid4().hex}"


def absent_is_none(factory: Factory) -> None:
    store, scope = factory(), _scope()
    assert store.read(scope, "nothing") is None
    assert store.keys(scope) == []


def write_then_read(factory: Factory) -> None:
    store, scope = factory(), _scope()
    version = store.write(scope, "b", '{"x":[1,2]}')
    assert version > 0
    entry = store.read(scope, "b")
    assert entry is not None and entry.text == '{"x":[1,2]}' and entry.version == version
    store.write(scope, "a", '"hi"')
    infos = store.keys(scope)
    assert [(i.key, i.size) for i in infos] == [("a", 4), ("b", 11)]
    assert infos[1].version == version
    # another client of the same storage sees it
    assert factory().read(scope, "b") == entry


def versions_never_repeat(factory: Factory) -> None:
    store, scope = factory(), _scope()
    first = store.write(scope, "k", "1")
    second = store.write(scope, "k", "2")
    assert second > first
    assert store.write(scope, "k", None) == 0
    assert store.read(scope, "k") is None
    third = store.write(scope, "k", "1")
    assert third > second  # a key written again never comes back at a version a reader saw
    other = store.write(scope, "j", "1")
    assert other > third  # one counter per scope


def expectations(factory: Factory) -> None:
    store, scope = factory(), _scope()
    assert store.write(scope, "k", "1", expect=0) > 0
    version = store.read(scope, "k").version  # type: ignore[union-attr]
    try:
        store.write(scope, "k", "2", expect=0)
    except StateConflict as exc:
        assert exc.found == version and exc.key == "k"
    else:
        raise AssertionError("a write expecting an absent key overwrote it")
    try:
        store.write(scope, "k", "2", expect=version + 1000)
    except StateConflict as exc:
        assert exc.found == version
    else:
        raise AssertionError("a write expecting another version wrote")
    assert store.read(scope, "k").text == "1"  # type: ignore[union-attr]
    newer = store.write(scope, "k", "3", expect=version)
    assert newer > version
    try:
        store.write(scope, "k", None, expect=version)
    except StateConflict:
        pass
    else:
        raise AssertionError("a delete expecting an old version deleted")
    assert store.write(scope, "k", None, expect=newer) == 0
    assert store.write(scope, "k", None) == 0  # absent: no error
    assert store.write(scope, "never", None, expect=0) == 0
    try:
        store.write(scope, "gone", "1", expect=5)
    except StateConflict as exc:
        assert exc.found == 0
    else:
        raise AssertionError("a write expecting a version of an absent key wrote")


def bounds(factory: Factory) -> None:
    store, scope = factory(), _scope()
    store.write(scope, "a", "1", max_keys=2)
    store.write(scope, "b", "1", max_keys=2)
    try:
        store.write(scope, "c", "1", max_keys=2)
    except StateFull as exc:
        assert exc.bound == "keys" and exc.limit == 2
    else:
        raise AssertionError("a third key passed max_keys=2")
    assert store.read(scope, "c") is None
    store.write(scope, "a", "22", max_keys=2)  # an overwrite keeps the count
    # bytes: a (2) + b (1) = 3
    try:
        store.write(scope, "b", "12345", max_bytes=5)
    except StateFull as exc:
        assert exc.bound == "bytes" and exc.limit == 5
    else:
        raise AssertionError("a write passed max_bytes")
    assert store.read(scope, "b").text == "1"  # type: ignore[union-attr]
    store.write(scope, "b", "123", max_bytes=5)  # 2 + 3 = 5: at the bound is fine
    store.write(scope, "b", "1", max_bytes=1)  # shrinking is never refused
    assert [(i.key, i.size) for i in store.keys(scope)] == [("a", 2), ("b", 1)]


def scopes_apart(factory: Factory) -> None:
    store = factory()
    base = _scope()
    names = [base, base + ":v", base + ":n", "v:" + base, base + "\u202e", base + " "]
    for i, scope in enumerate(names):
        store.write(scope, "k", str(i))
    for i, scope in enumerate(names):
        assert store.read(scope, "k").text == str(i)  # type: ignore[union-attr]
        assert [info.key for info in store.keys(scope)] == ["k"]


def any_key(factory: Factory) -> None:
    store, scope = factory(), _scope()
    keys = ['a"b', "a:b", "a\\b", "\u202eevil", "\U0001f600", "\U000e0041tag", "x" * 256, "%s{}*?[]", "é"]
    for i, key in enumerate(keys):
        store.write(scope, key, str(i))
    for i, key in enumerate(keys):
        assert store.read(scope, key).text == str(i)  # type: ignore[union-attr]
    assert [i.key for i in store.keys(scope)] == sorted(keys)


def _increment(factory: Factory, scope: str, times: int, conflicts: list[int]) -> None:
    store = factory()
    for _ in range(times):
        while True:
            entry = store.read(scope, "counter")
            value = 0 if entry is None else int(entry.text)
            try:
                store.write(scope, "counter", str(value + 1), expect=0 if entry is None else entry.version)
                break
            except StateConflict:
                conflicts.append(1)


def concurrent_increments(factory: Factory) -> None:
    scope = _scope()
    conflicts: list[int] = []
    threads = [threading.Thread(target=_increment, args=(factory, scope, 25, conflicts)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entry = factory().read(scope, "counter")
    assert entry is not None and int(entry.text) == 150, (entry, len(conflicts))


def concurrent_bound(factory: Factory) -> None:
    scope = _scope()
    refused: list[Any] = []

    def add(n: int) -> None:
        store = factory()
        for i in range(10):
            try:
                store.write(scope, f"k{n}-{i}", "1", max_keys=25)
            except StateFull:
                refused.append(1)

    threads = [threading.Thread(target=add, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(factory().keys(scope)) == 25
    assert len(refused) == 60 - 25


CHECKS = [
    absent_is_none,
    write_then_read,
    versions_never_repeat,
    expectations,
    bounds,
    scopes_apart,
    any_key,
    concurrent_increments,
    concurrent_bound,
]

"""MemoryStateStore: state in this process, one lock per store."""

from __future__ import annotations

import threading
from typing import Optional

from ._seam import Entry, KeyInfo, check_write

__all__ = ["MemoryStateStore", "SHARED"]


class MemoryStateStore:
    """A :class:`~nous_sched.StateStoreSeam` in this process's memory:
    gone when the process ends. Every operation holds the store's one lock,
    so each write is atomic against every thread of the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scopes: dict[str, dict[str, Entry]] = {}
        self._counters: dict[str, int] = {}

    def __repr__(self) -> str:
        return "MemoryStateStore()"

    def read(self, scope: str, key: str) -> Optional[Entry]:
        with self._lock:
            return self._scopes.get(scope, {}).get(key)

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
        with self._lock:
            entries = self._scopes.setdefault(scope, {})
            old = entries.get(key)
            found = 0 if old is None else old.version
            old_size = 0 if old is None else len(old.text)
            check_write(
                key,
                expect=expect,
                found=found,
                old_size=old_size,
                size=None if text is None else len(text),
                max_keys=max_keys,
                max_bytes=max_bytes,
                count=lambda: len(entries),
                total=lambda: sum(len(e.text) for e in entries.values()),
            )
            if text is None:
                if old is None:
                    return 0
                del entries[key]
                self._counters[scope] = self._counters.get(scope, 0) + 1
                return 0
            version = self._counters.get(scope, 0) + 1
            self._counters[scope] = version
            entries[key] = Entry(text, version)
            return version

    def keys(self, scope: str) -> list[KeyInfo]:
        with self._lock:
            entries = dict(self._scopes.get(scope, {}))
        return [KeyInfo(k, len(e.text), e.version) for k, e in sorted(entries.items())]


#: The process-wide store of ``State(scope)`` without a store: two runs naming one scope share it.
SHARED = MemoryStateStore()

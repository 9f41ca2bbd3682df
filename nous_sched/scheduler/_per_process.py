"""A value made once per process on first use, and made afresh in a forked child.

The shared thread sets (:mod:`._tool_threads`, :mod:`._driver_threads`) are
one per process: their threads do not exist in a child forked while they run,
and a lock of theirs may have been held at the fork, so a child starts over
with a fresh one.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Generic, Optional, TypeVar

__all__ = ["PerProcess", "join_all"]

T = TypeVar("T")


class PerProcess(Generic[T]):
    """``make()``, called once per process by the first :meth:`get`; thread-safe.

    In a forked child the parent's value is handed to ``forsake`` (if given)
    and forgotten; the child's first :meth:`get` makes its own.
    """

    def __init__(self, make: Callable[[], T], forsake: Optional[Callable[[T], None]] = None) -> None:
        self._make = make
        self._forsake = forsake
        self._value: Optional[T] = None
        self._lock = threading.Lock()  # guards making _value
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork_in_child)

    def get(self) -> T:
        value = self._value
        if value is None:
            with self._lock:
                if self._value is None:
                    self._value = self._make()
                value = self._value
        return value

    def _after_fork_in_child(self) -> None:
        if self._value is not None and self._forsake is not None:
            self._forsake(self._value)
        self._value = None
        self._lock = threading.Lock()  # it may have been held at the fork


def join_all(threads: list[threading.Thread], timeout: float) -> list[threading.Thread]:
    """Wait up to ``timeout`` seconds in all for ``threads`` (but the caller) to exit; those still alive."""
    deadline = time.monotonic() + timeout
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
    return [t for t in threads if t.is_alive()]

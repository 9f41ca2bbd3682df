"""Waiting in tests for a state another thread reaches: a predicate polled
until it holds, with a bound that only a hang reaches."""

from __future__ import annotations

import time
from typing import Callable


def until(predicate: Callable[[], object], timeout: float = 60.0) -> bool:
    """Whether ``predicate()`` held within ``timeout`` seconds (asked every 10 ms, and once more at the end)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())

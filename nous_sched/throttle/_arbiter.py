"""The pure core of throttles: who gets places, in what order. No threads, no clocks, no Redis.

:class:`Limit` is one throttle's state: how many of its places are taken
(``max_running``) and when recent calls started (the rate window).
:class:`Arbiter` queues requests, each for places in one or more limits, and
grants them. Its owner (:mod:`nous_sched.throttle`, under one lock) passes
the time in as a number, so a test drives it with any clock it likes.

The rules, each checked by ``tests/test_throttle.py``:

* **All or none.** A request is granted a place in every limit it names at
  once, or waits holding none: a waiting request never holds a place, so
  requests cannot deadlock each other, whatever limits they combine.
* **First come, first served per limit.** A request is granted only when no
  earlier request that is still waiting shares a limit with it. An earlier
  request is never overtaken on a limit it waits for, so none starves.
* **Bounds.** At most ``max_running`` places of a limit are taken at once,
  and at most ``burst`` grants fall in any window of ``burst / per_second``
  seconds (with the default ``burst``, ``per_second`` rounded up: at most
  ``per_second`` starts in any one second).

Not thread-safe, by design: one lock owns an arbiter.
"""

from __future__ import annotations

import collections
import math
from typing import Generic, Iterable, Optional, TypeVar

__all__ = ["Limit", "Arbiter", "Request"]

T = TypeVar("T")


class Limit:
    """One throttle's places and rate window (see the module docstring)."""

    __slots__ = ("max_running", "burst", "window", "running", "waiting", "_starts")

    def __init__(
        self, max_running: Optional[int] = None, per_second: Optional[float] = None, burst: Optional[int] = None
    ) -> None:
        self.max_running = max_running
        if per_second is None:
            self.burst: Optional[int] = None
            self.window = 0.0
        else:
            self.burst = burst if burst is not None else max(1, math.ceil(per_second))
            self.window = self.burst / per_second
        self.running = 0  #: places taken now
        self.waiting = 0  #: requests naming this limit that are still queued
        self._starts: collections.deque[float] = collections.deque()

    def _expire(self, now: float) -> None:
        starts = self._starts
        window = self.window
        # The same sum as opens_at's, so the instant it names is the instant a start leaves.
        while starts and starts[0] + window <= now:
            starts.popleft()

    def opens_at(self, now: float) -> Optional[float]:
        """``None`` if a place is free at ``now``; else when the rate window next frees one
        (``math.inf`` when only a release can free one)."""
        if self.max_running is not None and self.running >= self.max_running:
            return math.inf
        if self.burst is None:
            return None
        self._expire(now)
        if len(self._starts) < self.burst:
            return None
        return self._starts[0] + self.window

    def take(self, now: float) -> None:
        self.running += 1
        if self.burst is not None:
            self._starts.append(now)


class Request(Generic[T]):
    """One call's request for places in ``limits``; ``item`` is its owner's, never looked at."""

    __slots__ = ("limits", "item", "state")

    def __init__(self, limits: Iterable[Limit], item: T) -> None:
        if type(limits) is not tuple or len(limits) != 1:
            limits = tuple(dict.fromkeys(limits))  # a limit named twice is one place
        self.limits: tuple[Limit, ...] = limits
        self.item = item
        self.state = "new"  # -> "waiting" -> "granted" -> "released", or "waiting" -> "cancelled"


class Arbiter(Generic[T]):
    """Grants places to queued requests, all or none, first come first served per limit."""

    __slots__ = ("_queue", "wake")

    def __init__(self) -> None:
        self._queue: dict[Request[T], None] = {}  # insertion-ordered: the arrival order
        self.wake = math.inf  #: the earliest instant a rate window frees a place someone waits for

    def request(self, request: Request[T], now: float) -> list[Request[T]]:
        """Queue ``request``; return the requests granted now (``request`` among them, maybe)."""
        if not self._queue and self._free(request.limits, now):
            request.state = "granted"  # no one waits: the uncontended case, without a scan
            for limit in request.limits:
                limit.take(now)
            return [request]
        request.state = "waiting"
        self._queue[request] = None
        for limit in request.limits:
            limit.waiting += 1
        return self.grant(now)

    @staticmethod
    def _free(limits: tuple[Limit, ...], now: float) -> bool:
        for limit in limits:
            if limit.opens_at(now) is not None:
                return False
        return True

    def cancel(self, request: Request[T], now: float) -> list[Request[T]]:
        """Take back a waiting ``request`` (no-op otherwise); return the requests its leaving lets through."""
        if request.state != "waiting":
            return []
        self._dequeue(request)
        request.state = "cancelled"
        return self.grant(now)

    def release(self, request: Request[T], now: float) -> list[Request[T]]:
        """Give back a granted ``request``'s places (no-op otherwise); return the requests granted now."""
        if request.state != "granted":
            return []
        request.state = "released"
        for limit in request.limits:
            limit.running -= 1
        return self.grant(now) if self._queue else []

    def grant(self, now: float) -> list[Request[T]]:
        """Grant every request that may go at ``now``, in arrival order; set :attr:`wake`."""
        granted: list[Request[T]] = []
        blocked: set[Limit] = set()
        wake = math.inf
        for request in list(self._queue):
            opens = self._opens_at(request, blocked, now)
            if opens is None:
                self._dequeue(request)
                request.state = "granted"
                for limit in request.limits:
                    limit.take(now)
                granted.append(request)
            else:
                blocked.update(request.limits)
                wake = min(wake, opens)
        self.wake = wake
        return granted

    @staticmethod
    def _opens_at(request: Request[T], blocked: set[Limit], now: float) -> Optional[float]:
        """``None`` if ``request`` may be granted now; else when a rate window may let it (or inf)."""
        latest: Optional[float] = None
        for limit in request.limits:
            if limit in blocked:
                return math.inf  # an earlier request waits for this limit: it goes first
            opens = limit.opens_at(now)
            if opens is not None:
                latest = opens if latest is None else max(latest, opens)
        return latest

    def _dequeue(self, request: Request[T]) -> None:
        del self._queue[request]
        for limit in request.limits:
            limit.waiting -= 1

    def waiting(self) -> list[Request[T]]:
        """The queued requests, in arrival order."""
        return list(self._queue)

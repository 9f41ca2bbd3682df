"""Throttles: named limits on concurrency and rate, shared by every run that uses them.

``max_parallel`` bounds one run. A :class:`Throttle` bounds every run in the
process that names it (or, with ``redis_url``, every process that names it),
so sixteen request threads each fanning out ten queries still make at most,
say, four at once::

    db = Throttle("db", max_running=4)
    query = Tool("query", run_query, throttles=(db,))

What a caller may rely on (``tests/test_throttle.py``):

* **Queued, never failed.** A call whose throttles are full waits for places;
  it fails only when its run's deadline passes first (``"deadline passed
  while waiting for throttle ..."``) or its run is stopped or cancelled.
  In a ``run_code`` run the program never sees that failure: its run is
  over, a ``timeout`` naming the throttle it waited for.
* **All places at once, or none.** A call waits for a place in every throttle
  its tool names and takes them together, never holding one while it waits
  for another: calls cannot deadlock over throttles, whatever they combine.
* **First come, first served per throttle, across runs**: a call never
  overtakes an earlier call waiting for a throttle it names.
* **Places come back.** When the tool returns or raises; at once for a call
  still waiting when its run is stopped, cancelled or timed out. A tool that
  is already running keeps its place until it returns (Python cannot stop a
  thread, and the throttle counts what really runs).
* **Rate**: ``per_second`` allows at most ``burst`` starts in any window of
  ``burst / per_second`` seconds; ``burst`` defaults to ``per_second`` rounded
  up, which is at most ``per_second`` starts in any one second.
* **Inside a run** nothing changes: calls start in order, an exclusive call
  stays exclusive, ``max_parallel`` still bounds the run; a call waiting for
  a throttle counts against its run's ``max_parallel``, and waits on its tool
  thread, never on the scheduler's driver.
* **Visible**: :attr:`Throttle.running` and :attr:`Throttle.waiting`; each
  call's :attr:`~nous_sched.CallRecord.throttled` (seconds spent waiting for
  its throttles, apart from waiting for a thread).

**Across processes** (``redis_url``, the ``redis`` extra): places are leases
in a sorted set in Redis, taken and given back by Lua scripts (atomic on the
server, timed by the server's clock), and the rate window is a sorted set of
start times there too. A holder renews its leases every ``lease / 3``
seconds from a thread named ``nous-sched-throttle-lease``; a process that dies
holding places (even by SIGKILL) stops renewing, and its places come back at
most ``lease`` seconds after its last renewal. Within a process calls are
first come, first served as above; across processes a freed place goes to the
first process to ask again (each waiting process asks every few ms, up to
100 ms). A call holding a place for longer than ``lease`` is safe only while
its process keeps renewing. Every throttle of one tool with a ``redis_url``
is taken in one script per server (all or none there too).

**When Redis fails** (``tests/test_throttle_redis.py``): every connect and
reply takes at most ``redis_timeout`` seconds (0.5 by default). A server
that is down or does not answer in time counts as a full throttle: the call
waits (it never runs unthrottled) and tries again, until it gets its places
or its run's deadline passes; then the refusal, and the run's timeout
message, name the server (``Redis at 127.0.0.1:6399 did not answer within
0.5 s``). The trouble is logged once per throttle per 10 s, without a
traceback; :attr:`Throttle.redis_trouble` says what is wrong now. A call
stopped or cancelled while it waits gives its places here back at once; a
tool that returns gives them back here at once too, then in Redis (a try
that takes at most ``redis_timeout``; a lease it cannot give back expires).
A lease is renewed only while it has not expired, on a fresh connection
after a failed try; keep ``lease`` well above ``3 * redis_timeout`` so a
renewal can fail and be tried again before its lease runs out. A lease that
ran out anyway is logged as lost (the call keeps running: Python cannot
stop it). A server that restarted and lost its leases hands out no place for
``lease`` seconds after it started, while holders register theirs again
(``nous_sched.throttle._redis_throttle``, "A restart").

**One name, one limit**: the limits of a throttle in Redis are the fleet's
(kept in ``...:config`` while any process uses it); a process that names it
with another ``max_running``, ``per_second`` or ``burst`` gets a
:class:`~nous_sched.ConfigError` naming the option (from the call, or
``Throttle.hold``), not a second limit.

A throttle is applied by the scheduler's own tool threads and by executors
that run tasks in this process (thread pools); an executor that pickles its
tasks to run them elsewhere (Dask, a process pool) runs them unthrottled.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Iterable, Optional

from .. import _validators as v
from .._validators import require
from ..errors import ConfigError
from ._arbiter import Arbiter, Limit, Request

__all__ = ["Throttle", "Hold", "DEADLINE_PASSED", "STOPPED"]

log = logging.getLogger("nous_sched")

DEADLINE_PASSED = "the run's deadline passed while waiting for throttle {names}"
STOPPED = "code run is over; tool call abandoned while waiting for throttle {names}"

_POSITIVE_NUMBER = v.Check("None or a positive number", lambda x: x is None or (v.is_seconds(x, zero=False) and x == x))
_OPTIONAL_POSITIVE_INT = v.optional(v.POSITIVE_INT)

# _LOCK guards _ARBITER, every Limit's fields and every Request's state: the
# one lock of every in-process throttle, so one request can take places in
# several throttles at once. It is held only to decide (microseconds), never
# while a thread waits or talks to Redis.
_LOCK = threading.Lock()
_ARBITER: Arbiter[Hold] = Arbiter()
_clock = time.monotonic
_POLL_FIRST = 0.002
_POLL_MAX = 0.1


class Throttle:
    """A named bound on concurrency and rate, shared by every run whose tools name it.

    :param name: names it in messages, and in Redis (``nous_sched:throttle:{name}:...``):
        processes that pass the same ``name`` and ``redis_url`` share it.
    :param max_running: at most this many calls at once (positive int).
    :param per_second: at most this many starts per second (positive number).
    :param burst: with ``per_second``: at most ``burst`` starts in any window of
        ``burst / per_second`` seconds (default: ``per_second`` rounded up).
    :param redis_url: share the limits across processes through this Redis server.
    :param lease: with ``redis_url``: seconds after which a place whose holder stopped
        renewing (a crashed process) comes back.
    :param redis_timeout: with ``redis_url``: seconds to connect to Redis and for each of its
        replies; a server that takes longer counts as not reachable for that try.
    :raises ConfigError: a bad option, or neither ``max_running`` nor ``per_second``.

    See the module docstring for what a caller may rely on.
    """

    def __init__(
        self,
        name: str,
        *,
        max_running: Optional[int] = None,
        per_second: Optional[float] = None,
        burst: Optional[int] = None,
        redis_url: Optional[str] = None,
        lease: float = 10.0,
        redis_timeout: float = 0.5,
    ) -> None:
        require("Throttle", "name", name, v.NON_EMPTY_STR)
        require("Throttle", "max_running", max_running, _OPTIONAL_POSITIVE_INT)
        require("Throttle", "per_second", per_second, _POSITIVE_NUMBER)
        require("Throttle", "burst", burst, _OPTIONAL_POSITIVE_INT)
        require("Throttle", "redis_url", redis_url, v.OPTIONAL_STR)
        require("Throttle", "lease", lease, v.SECONDS)
        require("Throttle", "redis_timeout", redis_timeout, v.SECONDS)
        if max_running is None and per_second is None:
            v.fail("Throttle", "max_running", None, "a positive integer (or per_second): a throttle needs a limit")
        if burst is not None and per_second is None:
            v.fail("Throttle", "burst", burst, "None without per_second")
        self.name = name
        self.max_running = max_running
        self.per_second = None if per_second is None else float(per_second)
        self.burst = burst
        self.redis_url = redis_url
        self.lease = float(lease)
        self.redis_timeout = float(redis_timeout)
        # In Redis the window is the server's; here only the places are counted (a local pre-check).
        self._limit = Limit(max_running, None if redis_url else self.per_second, burst)
        self._redis: Any = None
        if redis_url is not None:
            from ._redis_throttle import RedisLimit

            self._redis = RedisLimit(self)

    def hold(self, timeout: Optional[float] = None) -> Hold:
        """``with throttle.hold():`` the block holds a place, taken in the same queue as tools' calls
        (for work outside a run that must count against the same limit). Waits at most ``timeout``
        seconds (None: no limit).

        :raises TimeoutError: no place within ``timeout`` seconds (on entering the block).
        :raises ConfigError: ``timeout`` is not None or a number of seconds.
        """
        require("Throttle.hold", "timeout", timeout, v.WAIT_SECONDS)
        hold = Hold((self,))
        hold.timeout = timeout
        return hold

    @property
    def redis_trouble(self) -> Optional[str]:
        """What is wrong with this throttle's Redis server now (``"Redis at host:port did not answer
        within 0.5 s"``), or None: set when a try to take or renew places fails to reach it,
        cleared when one succeeds."""
        return None if self._redis is None else self._redis.trouble

    @property
    def running(self) -> int:
        """How many calls hold a place now, in this process."""
        with _LOCK:
            return self._limit.running

    @property
    def waiting(self) -> int:
        """How many calls wait for a place now, in this process."""
        with _LOCK:
            return self._limit.waiting

    def __repr__(self) -> str:
        limits = [f"{k}={getattr(self, k)!r}" for k in ("max_running", "per_second", "burst", "redis_url")]
        shown = " ".join(x for x in limits if not x.endswith("=None"))
        return f"<Throttle {self.name!r} {shown} running={self.running} waiting={self.waiting}>"


def throttle_names(throttles: Iterable[Throttle]) -> str:
    return ", ".join(repr(t.name) for t in throttles)


class Hold:
    """One call's claim on its throttles: :meth:`wait` for the places, :meth:`release` them.

    :meth:`cancel` (any thread) ends a wait at once. Each step is idempotent,
    so the scheduler may cancel a hold that was granted or released meanwhile.
    """

    __slots__ = (
        "throttles",
        "request",
        "gate",
        "aborted",
        "abort",
        "lease_id",
        "leased",
        "timeout",
        "lost",
        "error",
        "in_redis",
    )

    def __init__(self, throttles: Iterable[Throttle]) -> None:
        throttles = self.throttles = tuple(throttles)
        limits = (throttles[0]._limit,) if len(throttles) == 1 else [t._limit for t in throttles]  # noqa: SLF001
        self.request: Request[Hold] = Request(limits, self)
        # Made (held) only when the request queues, under _LOCK, before any other thread can grant it;
        # released once, when it is granted or cancelled.
        self.gate: Optional[threading.Lock] = None
        self.aborted = False  # set by cancel(), under _LOCK
        self.abort: Optional[threading.Event] = None  # made for a wait on Redis; set by cancel()
        self.lease_id = ""  # named by the Redis half when it first takes a lease
        self.leased: list[Any] = []  # the RedisLimits' groups holding a lease of ours
        self.timeout: Optional[float] = None  # for `with`: Throttle.hold's
        self.in_redis = False  # trying for leases in Redis, holding the local places (under _LOCK)
        self.lost = False  # set by the lease thread when Redis no longer held a lease of ours
        self.error: Optional[Exception] = None  # a ConfigError from Redis (the fleet's limits differ)

    def __enter__(self) -> None:
        timeout = self.timeout
        refusal = self.wait(None if timeout is None else _clock() + timeout)
        if self.error is not None:
            raise self.error
        if refusal is not None:
            trouble = "".join(f": {t.redis_trouble}" for t in self.throttles[:1] if t.redis_trouble)
            raise TimeoutError(f"no place in throttle {throttle_names(self.throttles)} within {timeout}s{trouble}")

    def __exit__(self, *exc: object) -> None:
        self.release()

    def wait(self, deadline: Optional[float]) -> Optional[str]:
        """Wait until ``deadline`` (``time.monotonic()``; None: until cancelled)
        for every place; ``None`` once they are held, else why not."""
        request = self.request
        with _LOCK:
            if self.aborted:  # cancelled before it asked: it never queues
                return STOPPED.format(names=throttle_names(self.throttles))
            granted = _ARBITER.request(request, _clock())
            gate = None
            if request.state != "granted":
                gate = self.gate = threading.Lock()
                gate.acquire()
            _open(granted, request)
            wake = _ARBITER.wake
        if gate is not None:  # queued: wait
            while not gate.acquire(True, _seconds_until(deadline, wake)):
                wake = self._recheck(deadline)
            if request.state != "granted":
                return self._refusal(deadline)
        for throttle in self.throttles:
            if throttle._redis is not None:  # noqa: SLF001
                return self._wait_redis(deadline)
        return None

    def _recheck(self, deadline: Optional[float]) -> float:
        """A wait timed out: the deadline passed (cancel), or a rate window opened (grant)."""
        now = _clock()
        with _LOCK:
            if self.request.state == "waiting" and deadline is not None and now >= deadline:
                self._cancel_locked(now)
            else:
                _open(_ARBITER.grant(now))
            return _ARBITER.wake

    def _refusal(self, deadline: Optional[float]) -> str:
        names = throttle_names(self.throttles)
        if deadline is not None and _clock() >= deadline and not self.aborted:
            return DEADLINE_PASSED.format(names=names)
        return STOPPED.format(names=names)

    def _wait_redis(self, deadline: Optional[float]) -> Optional[str]:
        """Holding the places here, take the leases in Redis, trying again until the deadline.

        A server that cannot be reached or does not answer within ``redis_timeout`` counts
        as a full throttle (the call waits, never runs unthrottled), logged once per
        throttle per interval; the refusal at the deadline names the server.
        """
        from ._redis_throttle import RedisUnavailable, take_leases

        with _LOCK:
            abort = self.abort = threading.Event()
            self.in_redis = True
            aborted = self.aborted
        if aborted:  # cancelled between the local grant and here: no try at all
            self.release()
            return self._refusal(deadline)
        pause = _POLL_FIRST
        while True:
            trouble = None
            try:
                if take_leases(self):
                    self._trouble(None)
                    with _LOCK:
                        self.in_redis = False
                        aborted = self.aborted
                    if aborted:  # cancelled while the try was on its way: the places go back
                        self.release()
                        return self._refusal(deadline)
                    return None
            except RedisUnavailable as exc:
                trouble = str(exc)
            except ConfigError as exc:
                self.error = exc
                self.release()
                return str(exc)
            self._trouble(trouble)
            if abort.wait(_seconds_until(deadline, _clock() + pause)) or (
                deadline is not None and _clock() >= deadline
            ):
                refusal = self._refusal(deadline) + ("" if trouble is None else f": {trouble}")
                self.release()
                return refusal
            pause = min(_POLL_MAX, pause * 2)

    def _trouble(self, trouble: Optional[str]) -> None:
        """Note (and log, once per interval) what is wrong with the throttles' Redis, or that nothing is."""
        for throttle in self.throttles:
            if throttle._redis is not None:  # noqa: SLF001
                throttle._redis.trouble = trouble  # noqa: SLF001
                if trouble is not None:
                    throttle._redis.tell(f"{trouble}; its calls wait (never run unthrottled)")  # noqa: SLF001

    def cancel(self) -> None:
        """End a wait at once (any thread); a call that holds its places keeps them."""
        with _LOCK:
            self.aborted = True
            if self.abort is not None:
                self.abort.set()
            if self.in_redis:  # its local places come back now, not when Redis answers
                self.in_redis = False
                _open(_ARBITER.release(self.request, _clock()))
            self._cancel_locked(_clock())

    def _cancel_locked(self, now: float) -> None:
        if self.request.state == "waiting":
            _open(_ARBITER.cancel(self.request, now))
            assert self.gate is not None  # made when it queued
            self.gate.release()

    def release(self) -> None:
        """Give every place back (idempotent)."""
        with _LOCK:
            self.in_redis = False
            _open(_ARBITER.release(self.request, _clock()))
        if self.leased:
            from ._redis_throttle import give_leases

            give_leases(self)


def _open(granted: list[Request[Hold]], own: Optional[Request[Hold]] = None) -> None:
    """Wake the waiting requests that were just granted (``own``, granted while asking, never waited)."""
    for request in granted:
        gate = request.item.gate
        if request is not own and gate is not None:
            gate.release()


def _seconds_until(deadline: Optional[float], wake: float) -> float:
    """The wait until the earlier of ``deadline`` and ``wake`` (-1: no limit), for ``Lock.acquire``."""
    until = wake if deadline is None else min(deadline, wake)
    if until == math.inf:
        return -1
    return min(max(0.0, until - _clock()), threading.TIMEOUT_MAX)

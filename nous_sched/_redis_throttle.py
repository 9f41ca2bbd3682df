"""The Redis half of a :class:`~nous_sched.Throttle` with a ``redis_url`` (the ``redis`` extra).

Per throttle two sorted sets, ``nous_sched:throttle:{name}:running`` (lease
id -> expiry, in ms of the server's clock) and ``...:starts`` (lease id ->
start time). One Lua script takes a place in every throttle of a call that
lives on one server, all or none, after dropping expired leases and starts
older than the window; another renews; ``ZREM`` gives back. The server's
clock times everything, so machines need not agree on the time.

A process-wide thread, ``nous-sched-throttle-lease``, renews every lease held
in this process every ``lease / 3`` seconds (the shortest lease among them).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .throttle import Throttle, _Hold

__all__ = ["RedisLimit", "take_leases", "give_leases"]

log = logging.getLogger("nous_sched")

# KEYS: running_1, starts_1, running_2, starts_2, ...
# ARGV: lease id, then per throttle: max_running (0: none), burst (0: none), window ms, lease ms.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = ARGV[1]
local n = #KEYS / 2
for i = 1, n do
  local b = 1 + (i - 1) * 4
  local maxr, burst, window = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  redis.call('ZREMRANGEBYSCORE', KEYS[2 * i - 1], '-inf', now)
  if maxr > 0 and redis.call('ZCARD', KEYS[2 * i - 1]) >= maxr then return 0 end
  if burst > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[2 * i], '-inf', now - window)
    if redis.call('ZCARD', KEYS[2 * i]) >= burst then return 0 end
  end
end
for i = 1, n do
  local b = 1 + (i - 1) * 4
  local maxr, burst, window, lease = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  if maxr > 0 then
    redis.call('ZADD', KEYS[2 * i - 1], now + lease, id)
    redis.call('PEXPIRE', KEYS[2 * i - 1], lease * 2)
  end
  if burst > 0 then
    redis.call('ZADD', KEYS[2 * i], now, id)
    redis.call('PEXPIRE', KEYS[2 * i], math.ceil(window) + 1000)
  end
end
return 1
"""

# KEYS: running keys; ARGV: lease id, then each key's lease ms. Renews only leases still there.
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, #KEYS do
  local lease = tonumber(ARGV[i + 1])
  if redis.call('ZADD', KEYS[i], 'XX', 'CH', now + lease, ARGV[1]) then
    redis.call('PEXPIRE', KEYS[i], lease * 2)
  end
end
return 1
"""

_clients: dict[str, tuple[Any, Any, Any]] = {}
_clients_lock = threading.Lock()  # guards _clients


def _client(url: str) -> tuple[Any, Any, Any]:
    """The client for ``url`` (one per process, thread-safe: a connection pool) and its two scripts (EVALSHA)."""
    with _clients_lock:
        entry = _clients.get(url)
        if entry is None:
            try:
                import redis
            except ImportError as exc:
                raise ImportError(
                    "Throttle(redis_url=...) needs the redis client; install it with: pip install -e '.[redis]'"
                ) from exc
            client = redis.Redis.from_url(url)
            entry = _clients[url] = (client, client.register_script(_ACQUIRE), client.register_script(_RENEW))
        return entry


class RedisLimit:
    """Where one throttle lives in Redis, and the arguments its scripts take."""

    __slots__ = ("url", "running_key", "starts_key", "args", "lease_ms")

    def __init__(self, throttle: Throttle) -> None:
        assert throttle.redis_url is not None
        self.url = throttle.redis_url
        prefix = "nous_sched:throttle:{" + throttle.name + "}:"
        self.running_key = prefix + "running"
        self.starts_key = prefix + "starts"
        burst = 0
        window_ms = 0
        if throttle.per_second is not None:
            burst = throttle.burst if throttle.burst is not None else max(1, -int(-throttle.per_second // 1))
            window_ms = max(1, round(burst / throttle.per_second * 1000))
        self.lease_ms = max(1, round(throttle.lease * 1000))
        self.args = (throttle.max_running or 0, burst, window_ms, self.lease_ms)


def _groups(hold: _Hold) -> dict[str, list[RedisLimit]]:
    groups: dict[str, list[RedisLimit]] = {}
    for throttle in hold.throttles:
        if throttle._redis is not None:
            groups.setdefault(throttle._redis.url, []).append(throttle._redis)
    return groups


def take_leases(hold: _Hold) -> bool:
    """Try once to take ``hold``'s places in every Redis server it names; True if all were taken.

    Server by server, each all or none; when one refuses, the leases already
    taken from the others are given back before this returns: nothing is
    held while waiting.
    """
    if not hold.lease_id:
        hold.lease_id = uuid.uuid4().hex
    try:
        for url, limits in _groups(hold).items():
            keys = [k for limit in limits for k in (limit.running_key, limit.starts_key)]
            argv = [hold.lease_id, *(a for limit in limits for a in limit.args)]
            if not _client(url)[1](keys, argv):
                give_leases(hold)
                return False
            hold.leased.append((url, limits))
            _RENEWER.add(hold)
    except BaseException:
        give_leases(hold)  # a server that failed to answer: nothing is held while waiting
        raise
    return True


def give_leases(hold: _Hold) -> None:
    """Give back every lease ``hold`` holds (a failure to reach Redis is logged: the lease expires)."""
    _RENEWER.discard(hold)
    leased, hold.leased = hold.leased, []
    for url, limits in leased:
        try:
            pipe = _client(url)[0].pipeline(transaction=False)
            for limit in limits:
                pipe.zrem(limit.running_key, hold.lease_id)
            pipe.execute()
        except Exception:
            log.warning("could not give back throttle leases in %s; they expire by themselves", url, exc_info=True)


class _Renewer:
    """The thread that renews every lease held in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _holds, _thread and _due
        self._holds: dict[_Hold, None] = {}
        self._thread: threading.Thread | None = None
        self._due = math.inf  # when the thread renews next (time.monotonic())
        self._wake = threading.Event()

    def add(self, hold: _Hold) -> None:
        """Renew ``hold``'s leases from now on (woken only when they are due before its next round)."""
        period = min(limit.lease_ms for _, limits in hold.leased for limit in limits) / 3000
        with self._lock:
            self._holds[hold] = None
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="nous-sched-throttle-lease", daemon=True)
                self._thread.start()
            wake = time.monotonic() + period < self._due
        if wake:
            self._wake.set()

    def discard(self, hold: _Hold) -> None:
        with self._lock:
            self._holds.pop(hold, None)

    def _period(self) -> float:
        with self._lock:
            holds = list(self._holds)
        leases = [limit.lease_ms for hold in holds for _, limits in list(hold.leased) for limit in limits]
        return min(leases) / 3000 if leases else math.inf

    def _run(self) -> None:
        while True:
            period = self._period()
            with self._lock:
                due = self._due = time.monotonic() + period
            woken = self._wake.wait(None if due == math.inf else max(0.0, due - time.monotonic()))
            self._wake.clear()
            if woken:  # a lease due sooner: take the new period first
                continue
            with self._lock:
                holds = list(self._holds)
            for hold in holds:
                self._renew(hold)

    @staticmethod
    def _renew(hold: _Hold) -> None:
        for url, limits in list(hold.leased):
            keys = [limit.running_key for limit in limits]
            try:
                _client(url)[2](keys, [hold.lease_id, *(limit.lease_ms for limit in limits)])
            except Exception:
                log.warning("could not renew throttle leases in %s", url, exc_info=True)


_RENEWER = _Renewer()

"""The Redis half of a :class:`~nous_sched.Throttle` with a ``redis_url`` (the ``redis`` extra).

Per throttle three keys, ``nous_sched:throttle:{name}:running`` (lease id ->
expiry, in ms of the server's clock), ``...:starts`` (lease id -> start time)
and ``...:config`` (the fleet's limits). One Lua script takes a place in every
throttle of a call that lives on one server, all or none, after dropping
expired leases and starts older than the window; another renews leases that
have not expired; ``ZREM`` gives back. The server's clock times everything,
so machines need not agree on the time.

Every client made here has a connect and a reply timeout (the throttle's
``redis_timeout``) and no retries of its own: a server that is down or
silent is a :class:`RedisUnavailable` naming it within that time, never a
hang. Trouble is logged once per throttle per :data:`LOG_INTERVAL`.

A process-wide thread, ``nous-sched-throttle-lease``, renews every lease held
in this process every ``lease / 3`` seconds (the shortest lease among them),
one script per server for all of them, and sooner after a failed round. A
lease it could not renew in time is lost: logged, and never renewed again
(the server may have given its place to someone else).

**A restart.** A server that restarts without its data (or from an older
snapshot) has lost the leases of calls still running. The scripts read the
server's run id (``INFO server``); each process remembers the last one it
saw, and the throttle's config records the one read last (``run``, and
when: ``checked``). A process that sees another run id than it saw, or than
the config records, declares the restart in the throttle's ``...:born`` key:
until ``lease`` ms (for a rate, the window, if longer) after the server
started, the throttle hands out no place (a call waits, as for a server that
is down, and is told why), and a holder's renewal registers again a lease
the server lost. Every holder renews within a third of its lease, and a
lease that ran out by its holder's clock is never sent (:func:`_ran_out`), so
when the grace ends every call still running holds its place again: the
count is whole before anyone is let in.

Reading the run id costs (``INFO`` builds a page of text), so a renewal
always reads it but a take only where the config does not record one read
within a third of the lease: a throttle's first take, every take after a
restart without data (the config is gone with the rest) or while a grace is
declared (it drops the config's ``run``), and one take per third of a lease
otherwise. The limits: a process that never saw the old server (started
during the window) and asks before any process that did cannot know there
was one, and after a restart from a snapshot (the config comes back with
the old run id) takes go by the config until a renewal, or a take a third
of a lease after the snapshot's last check, reads the new run id (within a
third of a lease of the first holder's renewal); the grace begins then.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import urllib.parse
import uuid
from typing import Any, Optional, Protocol

from .. import _redis_client
from .._extras import install_command
from ..errors import ConfigError

__all__ = ["RedisLimit", "RedisUnavailable", "take_leases", "give_leases", "where", "LOG_INTERVAL"]


class Throttle(Protocol):
    """What this half reads of a :class:`~nous_sched.Throttle` (typed here, so it need not import that side)."""

    @property
    def name(self) -> str: ...
    @property
    def redis_url(self) -> Optional[str]: ...
    @property
    def redis_timeout(self) -> float: ...
    @property
    def per_second(self) -> Optional[float]: ...
    @property
    def burst(self) -> Optional[int]: ...
    @property
    def lease(self) -> float: ...
    @property
    def max_running(self) -> Optional[int]: ...
    @property
    def _redis(self) -> Optional[RedisLimit]: ...


class _Hold(Protocol):
    """What this half reads and writes of one call's hold on its throttles."""

    lease_id: str
    leased: list[Any]
    lost: bool

    @property
    def throttles(self) -> tuple[Throttle, ...]: ...


log = logging.getLogger("nous_sched")

#: Seconds between two log lines about one throttle's Redis trouble.
LOG_INTERVAL = 10.0

# The server's life and a throttle's grace after a restart (see the module's "A restart"): the run
# id and uptime from INFO; a client that saw another run id of this server, or a throttle whose data
# records another (`recorded`: its config's `run`, from a snapshot of the old server), declares the
# restart. The grace, until `grace` ms after the server started, is kept in the throttle's `born` key
# (a hash {run, until}) while it lasts, and the config's `run` is dropped, so that every take reads
# INFO again until a take after the grace records the new run id. Returns the grace's end (ms of the
# server's clock; 0: none).
_LIFE = """
local function life()
  local ok, info = pcall(redis.call, 'INFO', 'server')
  if not ok or type(info) ~= 'string' then return '', 0 end
  return string.match(info, 'run_id:(%x+)') or '', tonumber(string.match(info, 'uptime_in_seconds:(%d+)') or '0')
end
local function grace_until(now, run, up, seen, recorded, born, config, grace)
  if run == '' then return 0 end
  local have = redis.call('HMGET', born, 'run', 'until')
  local till = 0
  if have[1] == run then till = tonumber(have[2]) or 0 end
  if (seen ~= '' and seen ~= run) or (recorded ~= '' and recorded ~= run) then
    local t = now - (up + 1) * 1000 + grace
    if t > till then
      till = t
      redis.call('HSET', born, 'run', run, 'until', till)
      redis.call('PEXPIRE', born, math.max(1, till - now) + 1000)
      redis.call('HDEL', config, 'run')
    end
  end
  return till
end
"""

# KEYS: running_1, starts_1, config_1, born_1, running_2, ...
# ARGV: lease id, the run id this process last saw of the server ('' if none), then per throttle:
# max_running (0: none), burst (0: none), window ms, lease ms.
# Returns {code, run id, ...}: code 1 (taken), 0 (full), 2 (a restart's grace: ms left, uptime s),
# 3 (throttle i's limits differ from the fleet's: i, field, fleet's value).
# The server's run id is read (INFO, and the grace's key) only for a throttle whose config does not
# record one read in the last third of its lease (`run`, `checked`): its first use, a restart
# without data, a declared grace, or once per third of a lease; otherwise the recorded one is used.
_ACQUIRE = (
    _LIFE
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id, seen = ARGV[1], ARGV[2]
local n = #KEYS / 4
local fields = {'max_running', 'burst', 'window_ms', 'run', 'checked'}
local haves = {}
for i = 1, n do
  local b = 2 + (i - 1) * 4
  local have = redis.call('HMGET', KEYS[4 * i - 1], unpack(fields))
  for f = 1, 3 do
    if have[f] and tonumber(have[f]) ~= tonumber(ARGV[b + f]) then return {3, have[4] or '', i, fields[f], have[f]} end
  end
  haves[i] = have
end
local run, up = nil, 0
local read = {}
for i = 1, n do
  local b = 2 + (i - 1) * 4
  local maxr, burst, window, lease = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  local have = haves[i]
  if not (have[4] and have[5] and now - tonumber(have[5]) < lease / 3) then
    if run == nil then run, up = life() end
    local grace = 0
    if maxr > 0 then grace = lease end
    if burst > 0 then grace = math.max(grace, window) end
    local till = grace_until(now, run, up, seen, have[4] or '', KEYS[4 * i], KEYS[4 * i - 1], grace)
    if now < till then return {2, run, till - now, up} end
    read[i] = run ~= ''
  end
end
if run == nil then run = haves[1][4] end
for i = 1, n do
  local b = 2 + (i - 1) * 4
  local maxr, burst, window = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  redis.call('ZREMRANGEBYSCORE', KEYS[4 * i - 3], '-inf', now)
  if maxr > 0 and redis.call('ZCARD', KEYS[4 * i - 3]) >= maxr then return {0, run} end
  if burst > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[4 * i - 2], '-inf', now - window)
    if redis.call('ZCARD', KEYS[4 * i - 2]) >= burst then return {0, run} end
  end
end
for i = 1, n do
  local b = 2 + (i - 1) * 4
  local maxr, burst, window, lease = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  if maxr > 0 then
    redis.call('ZADD', KEYS[4 * i - 3], now + lease, id)
    redis.call('PEXPIRE', KEYS[4 * i - 3], lease * 2)
  end
  if burst > 0 then
    redis.call('ZADD', KEYS[4 * i - 2], now, id)
    redis.call('PEXPIRE', KEYS[4 * i - 2], math.ceil(window) + 1000)
  end
  if read[i] then
    redis.call('HSET', KEYS[4 * i - 1], 'max_running', maxr, 'burst', burst, 'window_ms', window, 'run', run, 'checked', now)
  else
    redis.call('HSET', KEYS[4 * i - 1], 'max_running', maxr, 'burst', burst, 'window_ms', window)
  end
  redis.call('PEXPIRE', KEYS[4 * i - 1], math.max(lease * 2, math.ceil(window) + 1000))
end
return {1, run}
"""
)

# KEYS: running_1, config_1, born_1, running_2, ...; ARGV: n lease ids, the ids, then per throttle its
# lease ms (0: no max_running), then the run id this process last saw. Renews leases that have not
# expired; in a restart's grace, one the server lost is registered again (its call still runs);
# returns {run id, the ids it could not renew...}. A renewal always reads the server's run id.
_RENEW = (
    _LIFE
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = tonumber(ARGV[1])
local m = #KEYS / 3
local seen = ARGV[2 + n + m]
local run, up = life()
local out = {run}
for i = 1, m do
  local lease = tonumber(ARGV[1 + n + i])
  if lease > 0 then
    local recorded = redis.call('HGET', KEYS[3 * i - 1], 'run') or ''
    local till = grace_until(now, run, up, seen, recorded, KEYS[3 * i], KEYS[3 * i - 1], lease)
    for j = 1, n do
      local id = ARGV[1 + j]
      local expiry = redis.call('ZSCORE', KEYS[3 * i - 2], id)
      if (expiry and tonumber(expiry) > now) or now < till then
        redis.call('ZADD', KEYS[3 * i - 2], now + lease, id)
        redis.call('PEXPIRE', KEYS[3 * i - 2], lease * 2)
        if redis.call('PTTL', KEYS[3 * i - 1]) < lease * 2 then redis.call('PEXPIRE', KEYS[3 * i - 1], lease * 2) end
      else
        out[#out + 1] = id
      end
    end
  end
end
return out
"""
)


class RedisUnavailable(Exception):
    """The throttle's Redis server could not be reached or did not answer in time; the message names it."""


def where(url: str) -> str:
    """``url``'s server as a message names it (``Redis at host:port``), never its password."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme == "unix":
            return f"Redis at {parts.path}"
        return f"Redis at {parts.hostname or 'localhost'}:{parts.port or 6379}"
    except ValueError:
        return "Redis (an unparsable redis_url)"


def _unavailable(url: str, timeout: float, exc: BaseException) -> RedisUnavailable:
    import redis

    if isinstance(exc, (redis.exceptions.TimeoutError, TimeoutError)):
        return RedisUnavailable(f"{where(url)} did not answer within {timeout:g} s")
    detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    return RedisUnavailable(f"{where(url)} could not be reached ({detail})")


_Client = tuple[Any, Any, Any]
_clients: dict[tuple[str, float], _Client] = {}
_clients_lock = threading.Lock()  # guards _clients


def _client(url: str, timeout: float) -> _Client:
    """The client for ``url`` (one per process and timeout, thread-safe: a connection pool) and its two scripts."""
    with _clients_lock:
        entry = _clients.get((url, timeout))
        if entry is None:
            client = _redis_client.connect(url, timeout)
            entry = _clients[(url, timeout)] = (
                client,
                client.register_script(_ACQUIRE),
                client.register_script(_RENEW),
            )
        return entry


def _call(url: str, timeout: float, what: Any) -> Any:
    """``what(client entry)``; a failure to reach the server becomes :class:`RedisUnavailable`."""
    try:
        import redis
    except ImportError as exc:  # the first thing every use of the server does: the one place to say so
        raise ImportError(
            f"Throttle(redis_url=...) needs the redis client; install it with: {install_command('redis')}"
        ) from exc

    try:
        return what(_client(url, timeout))
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        raise _unavailable(url, timeout, exc) from None


def _run_script(which: int, keys: list[str], argv: list[Any]) -> Any:
    """What :func:`_call` runs for script ``which`` (1: take, 2: renew) of a client entry."""
    return lambda c: c[which](keys, argv)


class RedisLimit:
    """Where one throttle lives in Redis, and the arguments its scripts take."""

    __slots__ = (
        "name",
        "url",
        "timeout",
        "running_key",
        "starts_key",
        "config_key",
        "born_key",
        "args",
        "lease_ms",
        "said",
        "trouble",
    )

    def __init__(self, throttle: Throttle) -> None:
        assert throttle.redis_url is not None
        self.name = throttle.name
        self.url = throttle.redis_url
        self.timeout = throttle.redis_timeout
        prefix = "nous_sched:throttle:{" + throttle.name + "}:"
        self.running_key = prefix + "running"
        self.starts_key = prefix + "starts"
        self.config_key = prefix + "config"
        self.born_key = prefix + "born"
        burst = 0
        window_ms = 0
        if throttle.per_second is not None:
            burst = throttle.burst if throttle.burst is not None else max(1, -int(-throttle.per_second // 1))
            window_ms = max(1, round(burst / throttle.per_second * 1000))
        self.lease_ms = max(1, round(throttle.lease * 1000))
        self.args = (throttle.max_running or 0, burst, window_ms, self.lease_ms)
        self.said: dict[str, float] = {}  # kind of trouble -> when it was last logged (time.monotonic())
        #: What is wrong with the server now, or None: set by a failed try (to take or renew), cleared by a good one.
        self.trouble: str | None = None

    def tell(self, message: str, kind: str = "trouble") -> None:
        """Log ``message`` about this throttle, at most once per :data:`LOG_INTERVAL` per ``kind``
        ("trouble" reaching the server, "lost" leases), without a traceback."""
        now = time.monotonic()
        with _said_lock:
            if now - self.said.get(kind, -math.inf) < LOG_INTERVAL:
                return
            self.said[kind] = now
        log.warning("throttle %r: %s", self.name, message)


_said_lock = threading.Lock()  # guards every RedisLimit's `said`

_OPTION = {"max_running": "max_running", "burst": "per_second/burst", "window_ms": "per_second/burst"}


def _mismatch(limit: RedisLimit, field: str, fleet: Any) -> ConfigError:
    mine = dict(zip(("max_running", "burst", "window_ms"), limit.args[:3], strict=True))[field]
    fleet = fleet.decode() if isinstance(fleet, bytes) else fleet
    return ConfigError(
        f"Throttle {limit.name!r}: `{_OPTION[field]}` gives {field}={mine}, but the processes sharing it in "
        f"{where(limit.url)} use {field}={fleet} (one name, one limit: give every process the same limits, "
        "or use another name)"
    )


def _groups(hold: _Hold) -> dict[tuple[str, float], list[RedisLimit]]:
    groups: dict[tuple[str, float], list[RedisLimit]] = {}
    for throttle in hold.throttles:
        if throttle._redis is not None:  # noqa: SLF001
            limit = throttle._redis  # noqa: SLF001
            groups.setdefault((limit.url, limit.timeout), []).append(limit)
    return groups


def take_leases(hold: _Hold) -> bool:
    """Try once to take ``hold``'s places in every Redis server it names; True if all were taken.

    Server by server, each all or none; when one refuses, the leases already
    taken from the others are given back before this returns: nothing is
    held while waiting.

    :raises RedisUnavailable: a server could not be reached or did not answer in time.
    :raises ConfigError: a throttle's limits differ from those the fleet uses under its name.
    """
    if not hold.lease_id:
        hold.lease_id = uuid.uuid4().hex
    for (url, timeout), limits in _groups(hold).items():
        keys = [k for limit in limits for k in (limit.running_key, limit.starts_key, limit.config_key, limit.born_key)]
        argv = [hold.lease_id, _RUNS.get(url, ""), *(a for limit in limits for a in limit.args)]
        sent = time.monotonic()
        try:
            answer = _call(url, timeout, _run_script(1, keys, argv))
        except RedisUnavailable as exc:
            give_leases(hold)
            if "did not answer" in str(exc):  # the script may have run and its answer been lost: give that back too
                hold.leased.append((url, timeout, limits, sent))
                give_leases(hold, quiet=True)
            raise
        except BaseException:
            give_leases(hold)
            raise
        code, run = int(answer[0]), _text(answer[1])
        if run:
            _RUNS[url] = run
        if code == 3:
            give_leases(hold)
            raise _mismatch(limits[int(answer[2]) - 1], _text(answer[3]), answer[4])
        if code == 2:
            give_leases(hold)
            raise RedisUnavailable(
                f"{where(url)} restarted {int(answer[3])} s ago and lost the places it held: it hands out none "
                f"for {int(answer[2]) / 1000:.1f} s more, while the processes holding places register them again"
            )
        if code == 0:
            give_leases(hold)
            return False
        hold.leased.append((url, timeout, limits, sent))
    if hold.leased:
        _RENEWER.add(hold)
    return True


def give_leases(hold: _Hold, quiet: bool = False) -> None:
    """Give back every lease ``hold`` holds; a server that cannot be reached is logged (unless ``quiet``):
    the lease expires by itself."""
    _RENEWER.discard(hold)
    leased, hold.leased = hold.leased, []
    for url, timeout, limits, _ in leased:

        def zrem(c: _Client, limits: list[RedisLimit] = limits) -> Any:
            pipe = c[0].pipeline(transaction=False)
            for limit in limits:
                pipe.zrem(limit.running_key, hold.lease_id)
            return pipe.execute()

        try:
            _call(url, timeout, zrem)
        except RedisUnavailable as exc:
            for limit in () if quiet else limits:
                limit.tell(f"{exc}; could not give back a place there (it comes back when its lease ends)")


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
        period = min(limit.lease_ms for *_, limits, _sent in hold.leased for limit in limits) / 3000
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
        leases = [limit.lease_ms for hold in holds for *_, limits, _sent in list(hold.leased) for limit in limits]
        return min(leases) / 3000 if leases else math.inf

    def _run(self) -> None:
        failed = False
        while True:
            period = self._period()
            if failed:  # try again soon: the lease is running out
                period = min(period, 0.1)
            with self._lock:
                due = self._due = time.monotonic() + period
            woken = self._wake.wait(None if due == math.inf else max(0.0, due - time.monotonic()))
            self._wake.clear()
            if woken:  # a lease due sooner: take the new period first
                continue
            with self._lock:
                holds = list(self._holds)
            failed = self.renew(holds)

    @staticmethod
    def renew(holds: list[_Hold]) -> bool:
        """One round: renew ``holds``' leases, one script per server and throttle group; True if one failed."""
        rounds: dict[tuple[str, float, tuple[RedisLimit, ...]], list[tuple[_Hold, int]]] = {}
        for hold in holds:
            for i, (url, timeout, limits, _sent) in enumerate(list(hold.leased)):
                if not limits:  # lost: never renewed again
                    continue
                rounds.setdefault((url, timeout, tuple(limits)), []).append((hold, i))
        failed = False
        for (url, timeout, limits), owners in rounds.items():
            failed |= not _renew_group(url, timeout, limits, owners)
        return failed


def _renew_group(url: str, timeout: float, limits: tuple[RedisLimit, ...], owners: list[tuple[_Hold, int]]) -> bool:
    # A lease that ran out by this process's clock is lost, never sent: a restarted server would
    # register it again in its grace, after the grace's bound (the lease) had passed here.
    owners = [(hold, i) for hold, i in owners if not _ran_out(hold, i)]
    if not owners:
        return True
    keys = [k for limit in limits for k in (limit.running_key, limit.config_key, limit.born_key)]
    ids = [hold.lease_id for hold, _ in owners]
    argv = [len(ids), *ids, *(limit.lease_ms if limit.args[0] else 0 for limit in limits), _RUNS.get(url, "")]
    sent = time.monotonic()
    try:
        answer = _call(url, timeout, _run_script(2, keys, argv))
        if answer and _text(answer[0]):
            _RUNS[url] = _text(answer[0])
        lost = {_text(x) for x in answer[1:]}
    except RedisUnavailable as exc:
        for limit in limits:
            limit.trouble = str(exc)
        for hold, i in owners:
            _check_expiry(hold, i, exc)
        return False
    for limit in limits:
        limit.trouble = None
    for hold, i in owners:
        try:
            entry = hold.leased[i]
        except IndexError:  # given back meanwhile
            continue
        if hold.lease_id in lost:
            _lose(hold, i, f"{where(url)} no longer had this process's lease (it expired)")
        elif entry[0] == url:
            hold.leased[i] = (*entry[:3], sent)
    return True


def _ran_out(hold: _Hold, i: int) -> bool:
    """Whether lease ``i`` of ``hold`` ran out by this process's clock (then it is lost)."""
    try:
        url, timeout, limits, sent = hold.leased[i]
    except (IndexError, ValueError):
        return True
    if not limits:
        return True
    if time.monotonic() - sent < min(limit.lease_ms for limit in limits) / 1000:
        return False
    _lose(hold, i, f"{where(url)} was not asked to renew it before it ran out (this process was stalled)")
    return True


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


#: The run id of each server (by URL) this process last saw: a script told another one declares a restart.
_RUNS: dict[str, str] = {}


def _check_expiry(hold: _Hold, i: int, exc: RedisUnavailable) -> None:
    """A renewal failed: once the lease has run out by our own clock, it is lost."""
    try:
        url, timeout, limits, sent = hold.leased[i]
    except (IndexError, ValueError):
        return
    lease = min(limit.lease_ms for limit in limits) / 1000
    if time.monotonic() - sent >= lease:
        _lose(hold, i, f"{exc}; the lease ran out before it could be renewed")
    else:
        for limit in limits:
            limit.tell(f"{exc}; could not renew a lease (it runs out in {lease - (time.monotonic() - sent):.1f} s)")


def _lose(hold: _Hold, i: int, why: str) -> None:
    """Stop renewing a lease the server no longer holds for us; the call keeps running (it cannot be stopped)."""
    try:
        url, timeout, limits, sent = hold.leased[i]
    except IndexError:
        return
    hold.leased[i] = (url, timeout, [], sent)
    hold.lost = True
    for limit in limits:
        limit.tell(f"lease lost: {why}; a call still running may now be over the fleet's limit", "lost")


_RENEWER = _Renewer()

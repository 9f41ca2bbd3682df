"""RedisStateStore: state in Redis, for a fleet of servers; each write one Lua script."""

from __future__ import annotations

from typing import Any, Optional

from .. import _redis_client
from .. import _validators as v
from .._extras import install_command
from .._validators import require
from ._seam import Entry, KeyInfo, StateConflict, StateFull, StateStoreError

__all__ = ["RedisStateStore"]

# KEYS: the scope's values hash, versions hash, meta hash (counter, bytes).
# ARGV: key, text ("" with ARGV[3] = "del": delete), op, expect (-1: none), max_keys (-1), max_bytes (-1).
# Returns {"ok", version} | {"conflict", found} | {"full", bound}.
_WRITE = """
local found = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
local expect = tonumber(ARGV[4])
if expect >= 0 and expect ~= found then return {'conflict', found} end
local old = redis.call('HGET', KEYS[1], ARGV[1])
local old_size = 0
if old then old_size = string.len(old) end
if ARGV[3] == 'del' then
  if not old then return {'ok', 0} end
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('HINCRBY', KEYS[3], 'bytes', -old_size)
  redis.call('HINCRBY', KEYS[3], 'counter', 1)
  return {'ok', 0}
end
local size = string.len(ARGV[2])
local max_keys = tonumber(ARGV[5])
if not old and max_keys >= 0 and redis.call('HLEN', KEYS[1]) + 1 > max_keys then return {'full', 'keys'} end
local max_bytes = tonumber(ARGV[6])
if max_bytes >= 0 and size > old_size then
  local total = tonumber(redis.call('HGET', KEYS[3], 'bytes') or '0')
  if total - old_size + size > max_bytes then return {'full', 'bytes'} end
end
local version = redis.call('HINCRBY', KEYS[3], 'counter', 1)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], version)
redis.call('HINCRBY', KEYS[3], 'bytes', size - old_size)
return {'ok', version}
"""

# Every key of a scope with its size and version, flat: key, size, version, ... (one moment: one script).
_KEYS = """
local out = {}
for _, key in ipairs(redis.call('HKEYS', KEYS[1])) do
  local version = redis.call('HGET', KEYS[2], key)
  if version then
    out[#out + 1] = key
    out[#out + 1] = redis.call('HSTRLEN', KEYS[1], key)
    out[#out + 1] = version
  end
end
return out
"""


class RedisStateStore:
    """A :class:`~nous_sched.StateStoreSeam` in Redis, for a fleet of servers
    (needs ``redis``: ``pip install -e '.[redis]'`` from a checkout). A scope is
    three hashes (values, versions, and its counter and bytes), each write one
    Lua script, atomic against every client of the server. Connects and replies
    each time out (``timeout`` seconds), with no retries: a server that is down
    or silent fails the operation at once with :class:`~nous_sched.StateStoreError`
    naming Redis and the URL.

    :param url: a ``redis://`` URL.
    :param prefix: the prefix of every key this store writes.
    :param timeout: seconds to connect and for each reply.
    """

    def __init__(
        self, url: Any, *, prefix: str = "nous_sched:state", timeout: float = _redis_client.DEFAULT_TIMEOUT
    ) -> None:
        require("RedisStateStore", "url", url, v.NON_EMPTY_STR)
        require("RedisStateStore", "prefix", prefix, v.NON_EMPTY_STR)
        require("RedisStateStore", "timeout", timeout, v.SECONDS)
        try:
            import redis  # noqa: F401  (here for the message below)
        except ImportError:
            raise StateStoreError(
                f"RedisStateStore needs the redis client; install it with: {install_command('redis')}"
            ) from None
        self.url = url
        self.prefix = prefix
        self._redis = _redis_client.connect(url, timeout)
        self._write_script = self._redis.register_script(_WRITE)
        self._keys_script = self._redis.register_script(_KEYS)

    def __repr__(self) -> str:
        return f"RedisStateStore({self.url!r})"

    def _names(self, scope: str) -> list[str]:
        # The part's kind before the scope: no scope's name can end where another's part begins.
        return [f"{self.prefix}:{part}:{scope}" for part in ("v", "n", "m")]

    def _failed(self, exc: Exception) -> StateStoreError:
        return StateStoreError(f"the Redis state store at {self.url} could not answer: {type(exc).__name__}: {exc}")

    def read(self, scope: str, key: str) -> Optional[Entry]:
        import redis

        values, versions, _ = self._names(scope)
        try:
            pipe = self._redis.pipeline(transaction=True)  # MULTI: the value and its version of one moment
            pipe.hget(values, key)
            pipe.hget(versions, key)
            text, version = pipe.execute()
        except redis.RedisError as exc:
            raise self._failed(exc) from None
        if text is None or version is None:
            return None
        return Entry(bytes(text).decode("ascii", "replace"), int(version))

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
        import redis

        args = [
            key,
            "" if text is None else text,
            "del" if text is None else "set",
            -1 if expect is None else expect,
            -1 if max_keys is None else max_keys,
            -1 if max_bytes is None else max_bytes,
        ]
        try:
            answer = self._write_script(keys=self._names(scope), args=args)
        except redis.RedisError as exc:
            raise self._failed(exc) from None
        what, value = answer[0], answer[1]
        what = what.decode() if isinstance(what, bytes) else str(what)
        if what == "conflict":
            raise StateConflict(key, int(expect or 0), int(value))
        if what == "full":
            bound = value.decode() if isinstance(value, bytes) else str(value)
            raise StateFull(bound, int((max_keys if bound == "keys" else max_bytes) or 0))
        return int(value)

    def keys(self, scope: str) -> list[KeyInfo]:
        import redis

        try:
            flat = self._keys_script(keys=self._names(scope)[:2])
        except redis.RedisError as exc:
            raise self._failed(exc) from None
        out = [
            KeyInfo(bytes(flat[i]).decode("utf-8", "replace"), int(flat[i + 1]), int(flat[i + 2]))
            for i in range(0, len(flat) - 2, 3)
        ]
        return sorted(out, key=lambda info: info.key)

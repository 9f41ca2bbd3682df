"""Fair shares in serve-mcp: who a client is, and how many runs one client may have going.

**The cap.** One client may have at most ``cap`` runs going at once (waiting
for a worker, running, or waiting on an approval question); a ``run_code``
call past it is refused at once, as data. The default (:func:`default_cap`) is
half the worker pool's real size, at least 1, so a client that never answers
its approval questions holds at most half the workers and the others go to
everyone else, first come, first served, as soon as one is free.

**Who a client is** (:func:`client_keys`): what it cannot change for free.

* With bearer-token authorization configured on the HTTP app, the
  authenticated principal (the token's client id, issuer and subject): every
  connection and session of one principal share one quota.
* Otherwise, over HTTP, the TCP connection the request came on (the peer's
  address and port), and, on a handshake-era connection, also its MCP session
  (issued and checked by the server): a run counts against each, and is
  refused when either is full. A header the client chooses freely counts for
  nothing: a fresh ``Mcp-Session-Id`` on every stateless request gives no
  fresh quota, and two clients that send none, each on its own connection,
  never share one (issue 34, and issue 43's sixteen clients on one address).
* Without HTTP: the SDK's connection on a handshake-era session; a stateless
  request is the one client a stdio process serves.

Without authorization a client that opens more connections gets more quota,
and behind a reverse proxy that pools its connections to serve-mcp, clients
riding one pooled connection share its quota: where clients are not trusted,
or behind such a proxy, configure bearer tokens (``serve-mcp
--auth-token-file``).
"""

from __future__ import annotations

import threading
from typing import Any, Hashable, Optional, Sequence

from mcp.server.auth.provider import AccessToken, principal_components
from mcp_types.version import is_version_at_least

from ..runtime.pool import default_size

__all__ = ["Shares", "client_keys", "default_cap", "pool_size", "STDIO_CLIENT"]

_MODERN = "2026-07-28"  # the first stateless revision: no connection lasts beyond a request
#: The key of a stateless request with no HTTP request: stdio, whose process serves one client.
STDIO_CLIENT = _ONE_CLIENT = "stdio"
_UNKNOWN_PEER = "peer unknown"  # an ASGI server that does not say (a unix socket): such requests share one quota


def pool_size(runtime: Any) -> int:
    """The number of workers ``runtime`` runs programs on: a ``WorkerPool``'s (or
    a pool domain's) ``size``; the default pool's size (:func:`default_size`)
    for ``None`` and for a runtime without a pool."""
    size = getattr(runtime, "size", None)
    if size is None:
        size = getattr(getattr(runtime, "pool", None), "size", None)
    if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
        return size
    return default_size()


def default_cap(size: int) -> int:
    """The default per-client cap for a pool of ``size`` workers: half of it, at least 1."""
    return max(1, size // 2)


def client_keys(ctx: Any) -> tuple[Hashable, ...]:
    """Who makes this request (the SDK's request context ``ctx``), as the keys
    whose quotas a run it starts counts against; see the module docstring."""
    request = getattr(ctx, "request", None)
    scope = getattr(request, "scope", None)
    principal = _principal(scope)
    if principal is not None:
        return (principal,)
    keys: list[Hashable] = []
    connection = getattr(ctx.session, "_connection", None)
    if connection is not None and not is_version_at_least(ctx.protocol_version, _MODERN):
        keys.append(connection)
    if isinstance(scope, dict):
        peer = scope.get("client")
        keys.append(("connection", *peer) if peer else _UNKNOWN_PEER)
    return tuple(keys) or (_ONE_CLIENT,)


def _principal(scope: Any) -> Optional[tuple[Optional[str], ...]]:
    """The authenticated principal the SDK's bearer-token middleware put in ``scope``, if any."""
    if not isinstance(scope, dict):
        return None
    access = getattr(scope.get("user"), "access_token", None)
    if not isinstance(access, AccessToken):
        return None
    return ("principal", *principal_components(access))


class Shares:
    """Runs going per client key, each key at most ``cap``; thread-safe.

    A key's entry goes when its last run ends, so the map is as big as the
    clients with runs going.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._going: dict[Hashable, int] = {}
        self._lock = threading.Lock()  # admissions come from the event loop, releases from run threads

    def admit(self, keys: Sequence[Hashable]) -> Optional[int]:
        """Count one more run against every key in ``keys``; or, when one of them
        already has ``cap`` runs going, count nothing and return that number."""
        with self._lock:
            full = max((self._going.get(key, 0) for key in keys), default=0)
            if full >= self.cap:
                return full
            for key in keys:
                self._going[key] = self._going.get(key, 0) + 1
        return None

    def release(self, keys: Sequence[Hashable]) -> None:
        """One run of ``keys`` (as admitted) is over."""
        with self._lock:
            for key in keys:
                going = self._going.pop(key, 0) - 1
                if going > 0:
                    self._going[key] = going

    def going(self, key: Hashable) -> int:
        """How many runs ``key`` has going."""
        with self._lock:
            return self._going.get(key, 0)

"""How the library makes a Redis client: with connect and reply timeouts, and no retries of its own.

A server that is down or silent then costs one timeout per try, never a hang
(redis-py sets no socket timeout by default, so a silent server would block
a call for good). The caller decides whether and when to try again.
"""

from __future__ import annotations

from typing import Any

__all__ = ["connect", "DEFAULT_TIMEOUT"]

#: Seconds to connect and for each reply, unless the caller says otherwise.
DEFAULT_TIMEOUT = 0.5


def connect(url: str, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """A ``redis.Redis`` for ``url`` whose connects and replies each take at most ``timeout`` seconds.

    :raises ImportError: the ``redis`` extra is not installed.
    """
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        url,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        retry_on_timeout=False,
        retry=Retry(NoBackoff(), 0),
    )

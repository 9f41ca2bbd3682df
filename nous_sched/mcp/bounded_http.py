"""Streamable HTTP to one upstream MCP server, with every message bounded in size.

An MCP message over HTTP is a JSON body, or one ``data:`` line of an event
stream: either way a run of bytes without a newline. :class:`BoundedTransport`
wraps the HTTP transport so that each response's bytes are counted as they
arrive (linear, nothing kept), and a run longer than ``max_message_bytes``
fails the read with ``httpx2.StreamError`` (the SDK turns it into that call's
error) after calling ``on_overflow(why)``, which closes the server, as
:mod:`nous_sched.mcp.stdio` does for a server started as a command.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Callable

import httpx2

__all__ = ["BoundedTransport", "RunCounter"]


class RunCounter:
    """The length of the current run of bytes without a newline, and whether it passed ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.run = 0

    def over(self, chunk: bytes) -> bool:
        """Count ``chunk``; True once some run of it (with what came before) is longer than ``limit``."""
        start = 0
        newline = chunk.find(b"\n")
        while newline >= 0:
            if self.run + newline - start > self.limit:
                return True
            self.run, start = 0, newline + 1
            newline = chunk.find(b"\n", start)
        self.run += len(chunk) - start
        return self.run > self.limit


class _BoundedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, limit: int, on_overflow: Callable[[str], None]) -> None:
        self._inner = inner
        self._counter = RunCounter(limit)
        self._on_overflow = on_overflow

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            if self._counter.over(chunk):
                why = f"it sent a message over {self._counter.limit:,} bytes (max_message_bytes)"
                self._on_overflow(why)
                raise httpx2.StreamError(why)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class BoundedTransport(httpx2.AsyncBaseTransport):
    """``inner`` (an ``httpx2.AsyncHTTPTransport``), each response's messages bounded at ``limit`` bytes."""

    def __init__(self, inner: Any, limit: int, on_overflow: Callable[[str], None]) -> None:
        self._inner = inner
        self._limit = limit
        self._on_overflow = on_overflow

    async def handle_async_request(self, request: Any) -> Any:
        response = await self._inner.handle_async_request(request)
        response.stream = _BoundedStream(response.stream, self._limit, self._on_overflow)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()

"""Runs' live events served from an asyncio server, a viewer holding no thread.

:func:`sse_app` is an ASGI application: mount it in any ASGI app (Starlette's
``Mount("/runs", app=sse_app(runs))``, FastAPI's ``app.mount``, a Django
ASGI router) or serve it alone (``uvicorn``). It answers

* ``GET <run id>/events``: the run's events as server-sent events
  (:func:`nous_sched.live.asse`: ``data: <RunEvent JSON>`` each, ``end`` last,
  then the response ends);
* ``GET <run id>/agui``: the same run in the AG-UI protocol
  (:func:`nous_sched.agui.asse`), when made with ``agui=True``;
* 404 for a run it does not know or another path, 405 for another method.

Each viewer is one coroutine: while it waits for events it awaits a future
the run's next event sets (:meth:`~nous_sched.Run.aevent_batches`); while its
client does not read, it waits in the server's flow control (``send``) and
the run goes on without it. What a stalled viewer holds is one batch of text
in its write and its place in the stream: at most ``buffer`` events later it
skips to the newest and is told by a ``gap`` event. A viewer that disconnects
stops at once (the app listens for ``http.disconnect`` while it writes).
Neither costs a thread, so the number of watchers is bounded by memory and
sockets, not by a thread pool.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Optional, Union

from . import _validators as v
from .live import MEDIA_TYPE, SSE_BUFFER, Run, asse

__all__ = ["sse_app", "Runs"]

#: Where :func:`sse_app` finds a run by its id: a mapping (a ``dict`` the app's
#: other routes fill) or a function answering ``None`` for an unknown id.
Runs = Union[Mapping[str, Run], Callable[[str], Optional[Run]]]
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_HEADERS = [
    (b"content-type", f"{MEDIA_TYPE}; charset=utf-8".encode()),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # a proxy in front passes each batch on as it comes
]
_BUFFER = v.int_at_least(1, "a positive number of events")
_RUNS = v.Check(
    "a mapping of run ids to runs, or a function of a run id", lambda r: isinstance(r, Mapping) or callable(r)
)


def sse_app(runs: Runs, *, buffer: int = SSE_BUFFER, agui: bool = False) -> ASGIApp:
    """An ASGI app serving the live events of the runs ``runs`` finds (see the module docstring).

    ``buffer``: how many events one viewer may fall behind before it skips (a
    ``gap``). ``agui``: also serve ``<run id>/agui`` (needs the ``agui`` extra,
    imported here).

    :raises ConfigError: ``buffer`` is not a positive integer, or ``runs`` is
        neither a mapping nor callable.
    """
    v.require("sse_app", "buffer", buffer, _BUFFER)
    v.require("sse_app", "runs", runs, _RUNS)
    find: Callable[[str], Optional[Run]] = runs.get if isinstance(runs, Mapping) else runs
    streams: dict[str, Callable[[Run], AsyncIterator[str]]] = {"events": lambda run: asse(run, buffer=buffer)}
    if agui:
        from . import agui as ag_ui  # the agui extra: its error names it

        streams["agui"] = lambda run: ag_ui.asse(run, buffer=buffer)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        parts = _route_path(scope).strip("/").split("/")
        run = find(parts[0]) if len(parts) == 2 and parts[1] in streams else None
        if run is None:
            await _plain(send, 404, b"no such run or stream")
            return
        if scope.get("method", "GET") not in ("GET", "HEAD"):
            await _plain(send, 405, b"only GET", [(b"allow", b"GET, HEAD")])
            return
        await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
        if scope.get("method") == "HEAD":
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await _stream(streams[parts[1]](run), receive, send)

    return app


def _route_path(scope: Scope) -> str:
    """The path below where the app is mounted (Starlette's ``Mount`` keeps the whole
    ``path`` and extends ``root_path``)."""
    path = str(scope.get("path", "/"))
    root = str(scope.get("root_path", ""))
    return path[len(root) :] if root and path.startswith(root) else path


async def _stream(texts: AsyncIterator[str], receive: Receive, send: Send) -> None:
    """Write ``texts``, one body message each, until they end or the client leaves."""
    writer = asyncio.ensure_future(_write(texts, send))
    listener = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait({writer, listener}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (writer, listener):
            task.cancel()
        for task in (writer, listener):
            with contextlib.suppress(asyncio.CancelledError):
                await task  # re-raises what the writer raised (a broken stream)


async def _write(texts: AsyncIterator[str], send: Send) -> None:
    try:
        async for text in texts:
            await send({"type": "http.response.body", "body": text.encode("utf-8"), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        close = getattr(texts, "aclose", None)
        if close is not None:
            await close()  # stops its wait for the run's next event at once


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _plain(send: Send, status: int, body: bytes, headers: Optional[list[tuple[bytes, bytes]]] = None) -> None:
    start = [(b"content-type", b"text/plain; charset=utf-8"), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _lifespan(receive: Receive, send: Send) -> None:
    # Served alone (uvicorn app), it has nothing to start or stop.
    while True:
        message = (await receive())["type"]
        if message == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return

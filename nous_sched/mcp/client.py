"""A synchronous connection to a set of MCP servers, whose tools become :class:`~nous_sched.Tool` values.

The official SDK is async-only. A :class:`Connection` runs it on one event-loop
thread of its own, ``nous-sched-mcp-<n>`` (anyio's blocking portal), and
exposes blocking methods that any thread may call: a Flask view, a script, the
scheduler's tool threads. One task per server holds that server's SDK
``Client`` open, so one server failing never takes the others down.

Lifetime: :func:`connect` returns once every server is connected and has
listed its tools, or raises. :meth:`Connection.close` (or leaving the
``with`` block) cancels the calls still in flight, closes every server (a
server process it started gets its stdin closed, then SIGTERM, then
SIGKILL, as the SDK's stdio transport does) and joins the loop thread.
Connections still open at interpreter exit are closed then.

Calls: a tool's function blocks its thread until the server answers. The wait
is bounded by the run's deadline (:attr:`~nous_sched.RunContext.deadline`,
plus :data:`DEADLINE_GRACE`, so the run reports its own ``timeout`` first)
when called inside :func:`~nous_sched.run_code`, and by ``call_timeout``
always; when the bound passes the request is cancelled (the server receives
``notifications/cancelled``) and the call fails. Every failure is a
:class:`~nous_sched.ToolError`, so a program sees it as data: a tool result
with ``isError`` (the server's text), a server that crashed or closed the
connection, a timeout, a closed connection.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import itertools
import logging
import sys
import threading
import time
import weakref
from contextlib import AsyncExitStack
from typing import Any, Optional

import anyio
import anyio.from_thread
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server as LowLevelServer
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import Implementation

from .._validators import POSITIVE_INT, SECONDS, Check, require
from ..errors import ConfigError, ToolError
from ..gate.dispatch import current_call
from ..tooling import CALLERS, Tool
from . import mapping
from .spec import ServerSpec
from .stdio import DEFAULT_MAX_MESSAGE_BYTES, bounded_stdio

__all__ = ["connect", "Connection"]

log = logging.getLogger("nous_sched")

DEFAULT_CONNECT_TIMEOUT = 30.0
DEFAULT_CALL_TIMEOUT = 300.0
#: Seconds past the run's deadline before a call still waiting is cancelled. The run
#: itself ends at the deadline (a ``timeout``); the grace lets it, not the call's own
#: error, be what the run reports.
DEADLINE_GRACE = 1.0
_CLOSE_WAIT = 10.0  # the SDK bounds a stdio server's shutdown at about 6 s
_LIST_PAGES = 100  # a server that pages forever cannot hang connect()

_ids = itertools.count(1)
_open: "weakref.WeakSet[Connection]" = weakref.WeakSet()


_SERVER_OBJECT = Check(
    "a URL, a command (a list of strings), or an MCP SDK server object (MCPServer or mcp.server.Server)",
    lambda target: isinstance(target, (str, tuple, MCPServer, LowLevelServer)),
)


def _always(args: Any) -> bool:
    return True


def connect(
    *servers: Any,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    call_timeout: float = DEFAULT_CALL_TIMEOUT,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> "Connection":
    """Connect to ``servers`` and list their tools; use the result as a context manager.

    Each server is a :class:`ServerSpec`, or anything a ``ServerSpec``
    accepts as its ``target`` (a URL, a command as a list of strings, an SDK
    server object), which is then untrusted and named as it reports itself.
    Servers connect concurrently, each within ``connect_timeout`` seconds.
    ``call_timeout`` bounds every call, inside a run or not.

    ``max_message_bytes`` bounds each message a server sends (default 16
    MiB): one line of a command's stdout, one HTTP body or event-stream line.
    A server started as a command has its own reader, linear in what it
    writes (:mod:`nous_sched.mcp.stdio`), so one flooding server does not
    slow the others; HTTP responses are counted as they arrive
    (:mod:`nous_sched.mcp.bounded_http`). A server whose message passes the
    bound is closed at once (a command is killed), and its calls fail as
    data (a :class:`~nous_sched.ToolError` saying why), the other servers
    unharmed.

    :raises ConfigError: a bad option, two servers with one name, an override
        naming a tool the server does not list, or a server that cannot be
        reached (the message names it and says why). Nothing is left running.
    """
    specs = [server if isinstance(server, ServerSpec) else ServerSpec(server) for server in servers]
    if not specs:
        raise ConfigError("connect: give at least one MCP server")
    require("connect", "connect_timeout", connect_timeout, SECONDS)
    require("connect", "call_timeout", call_timeout, SECONDS)
    require("connect", "max_message_bytes", max_message_bytes, POSITIVE_INT)
    for spec in specs:
        require("ServerSpec", "target", spec.target, _SERVER_OBJECT)
    return Connection(
        specs,
        connect_timeout=float(connect_timeout),
        call_timeout=float(call_timeout),
        max_message_bytes=max_message_bytes,
    )


def _claim(owners: dict[str, "_Upstream"], name: str, up: "_Upstream") -> None:
    """Record that ``up`` provides tool ``name``; two servers providing one name is a :class:`ConfigError`."""
    other = owners.setdefault(name, up)
    if other is not up:
        raise ConfigError(
            f"MCP servers {other.name!r} and {up.name!r} both provide a tool named {name!r}; give one a "
            f"prefix (ServerSpec(prefix=...): its tools become <prefix>__<tool>) or rename the tool "
            f"(ServerSpec(overrides={{{name!r}: ToolOverride(name=...)}}))"
        )


class _Upstream:
    """One server of a connection: its spec and, once connected, its SDK client and tools."""

    def __init__(self, spec: ServerSpec, index: int) -> None:
        self.spec = spec
        self.label = f"{spec.name!r} ({spec.describe()})" if spec.name else f"#{index + 1} ({spec.describe()})"
        self.name = spec.name or ""
        self.client: Any = None
        self.listing: list[Any] = []
        self.ready: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()
        self.closing: Optional[anyio.Event] = None  # made on the loop thread
        self.holder: Optional[concurrent.futures.Future[None]] = None
        self.broken: Optional[str] = None  # why the connection closed it (set on the loop thread)


class Connection:
    """Open connections to a set of MCP servers; see the module docstring.

    Thread-safety: every method may be called from any thread, and the tools'
    functions from many at once. ``_lock`` guards ``_closed`` and
    ``_inflight``, the futures of calls still waiting for their server.
    """

    def __init__(
        self,
        specs: list[ServerSpec],
        *,
        connect_timeout: float,
        call_timeout: float,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._n = next(_ids)
        self._call_timeout = call_timeout
        self._max_message_bytes = max_message_bytes
        self._lock = threading.Lock()
        self._closed = False
        self._inflight: set[concurrent.futures.Future[Any]] = set()
        self._upstreams = [_Upstream(spec, i) for i, spec in enumerate(specs)]
        self._flags: dict[str, mapping.Flags] = {}
        self._portal_cm = anyio.from_thread.start_blocking_portal(name=f"nous-sched-mcp-{self._n}")
        self._portal = self._portal_cm.__enter__()
        _open.add(self)
        try:
            self._connect(connect_timeout)
            self._tools = self._build_tools()
        except BaseException:
            self.close()
            raise

    # -- public API ---------------------------------------------------------

    @property
    def servers(self) -> tuple[str, ...]:
        """The servers' names, in the order they were given."""
        return tuple(up.name for up in self._upstreams)

    @property
    def closed(self) -> bool:
        return self._closed

    def tools(self) -> list[Tool]:
        """Every tool of every server, as :class:`~nous_sched.Tool` values (listed once, at connect).

        Names are the servers' own, or ``<prefix>__<tool>`` for a server with a
        ``prefix`` (:class:`ServerSpec`), renamed by ``ToolOverride(name=...)``;
        they do not depend on how many servers are connected. ``parameters`` is the tool's input schema, ``returns`` its
        output schema (when it has one); ``concurrency_safe``,
        ``requires_approval``, ``category`` and ``exclusive_reason`` follow
        :func:`mapping.flags`: a tool of an untrusted server is exclusive and
        needs approval unless an override says otherwise.
        """
        return list(self._tools)

    def flags(self) -> dict[str, mapping.Flags]:
        """What was decided for each tool, and why: ``{tool name: Flags}`` (names as :meth:`tools` has them).

        ``Flags.reason`` is what ``serve-mcp``'s banner shows for a tool that
        needs approval, and the trail for a call that ran exclusive.
        """
        return dict(self._flags)

    def close(self) -> None:
        """Cancel calls in flight, close every server, stop the loop thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            inflight, self._inflight = list(self._inflight), set()
        for future in inflight:
            future.cancel()
        holders = [up.holder for up in self._upstreams if up.holder is not None]
        for up in self._upstreams:
            self._ask_to_close(up)
        _, stuck = concurrent.futures.wait(holders, timeout=_CLOSE_WAIT)
        for future in stuck:  # a server that ignores a graceful close
            log.warning("MCP server %s did not close within %.0fs; cancelling it", self._label(future), _CLOSE_WAIT)
            future.cancel()
        concurrent.futures.wait(stuck, timeout=_CLOSE_WAIT)
        try:
            self._portal_cm.__exit__(None, None, None)  # stops the portal and joins the loop thread
        except Exception:
            log.warning("MCP connection %d: the loop thread did not stop cleanly", self._n, exc_info=True)
        _open.discard(self)

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<nous_sched.mcp.Connection {self._n} {state} servers={list(self.servers)}>"

    # -- connecting -----------------------------------------------------------

    def _connect(self, timeout: float) -> None:
        for up in self._upstreams:
            up.holder = self._portal.start_task_soon(self._hold, up)
        deadline = time.monotonic() + timeout
        for up in self._upstreams:
            try:
                up.listing = up.ready.result(max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                raise ConfigError(
                    f"MCP server {up.label}: no answer within {timeout:g}s (connect_timeout); is it an MCP server?"
                ) from None
            except ConfigError:
                raise
            except BaseException as exc:
                raise ConfigError(f"MCP server {up.label}: cannot connect: {_reason(exc)}") from None
        seen: dict[str, _Upstream] = {}
        for i, up in enumerate(self._upstreams):
            if not up.name:
                info = getattr(up.client, "server_info", None)
                up.name = mapping.server_name(getattr(info, "name", None), f"server{i + 1}")
                up.label = f"{up.name!r} ({up.spec.describe()})"
            if up.name in seen:
                raise ConfigError(
                    f"two MCP servers are named {up.name!r} ({seen[up.name].spec.describe()} and "
                    f"{up.spec.describe()}); give each a distinct ServerSpec(name=...)"
                )
            seen[up.name] = up
            listed = {tool.name for tool in up.listing}
            for tool in up.spec.overrides:
                if tool not in listed:
                    raise ConfigError(
                        f"MCP server {up.name!r}: `overrides` names {tool!r}, which the server does not list "
                        f"(it lists {', '.join(sorted(listed)) or 'no tools'})"
                    )

    async def _hold(self, up: _Upstream) -> None:
        """The task that owns one server's SDK client, from connect to close."""
        up.closing = anyio.Event()
        try:
            async with AsyncExitStack() as stack:
                transport = await self._transport(up, stack)
                client = await stack.enter_async_context(Client(transport, client_info=_client_info()))
                listing = await _list_tools(client)
                up.client = client
                up.ready.set_result(listing)
                await up.closing.wait()
        except BaseException as exc:
            if not up.ready.done():
                up.ready.set_exception(exc if isinstance(exc, Exception) else ConfigError("connecting was cancelled"))
            elif not isinstance(exc, anyio.get_cancelled_exc_class()):
                log.warning("MCP server %s: the connection ended with an error: %s", up.label, _reason(exc))
            raise

    async def _transport(self, up: _Upstream, stack: AsyncExitStack) -> Any:
        spec = up.spec
        if spec.transport == "stdio":
            params = StdioServerParameters(
                command=spec.target[0], args=list(spec.target[1:]), env=dict(spec.env or {}) or None, cwd=spec.cwd
            )
            return bounded_stdio(
                params,
                errlog=_errlog(),
                max_message_bytes=self._max_message_bytes,
                on_overflow=lambda why: self._overflowed(up, why),
            )
        if spec.transport == "http":
            import httpx2

            from .bounded_http import BoundedTransport

            transport = BoundedTransport(
                httpx2.AsyncHTTPTransport(), self._max_message_bytes, lambda why: self._overflowed(up, why)
            )
            http = await stack.enter_async_context(
                httpx2.AsyncClient(
                    headers=dict(spec.headers or {}), timeout=httpx2.Timeout(30.0, read=300.0), transport=transport
                )
            )
            return streamable_http_client(spec.target, http_client=http)
        return spec.target

    def _overflowed(self, up: _Upstream, why: str) -> None:
        """A server sent a message over the bound: it is killed; close its client too (loop thread)."""
        up.broken = f"{why}; it was closed"
        log.warning("MCP server %s %s", up.label, up.broken)
        if up.closing is not None:
            up.closing.set()

    def _ask_to_close(self, up: _Upstream) -> None:
        if up.closing is None or not up.ready.done():
            if up.holder is not None:
                up.holder.cancel()  # still connecting: nothing to close gracefully, stop trying
            return
        try:
            self._portal.call(up.closing.set)
        except RuntimeError:
            pass  # the loop has already stopped

    def _label(self, holder: concurrent.futures.Future[None]) -> str:
        return next((up.label for up in self._upstreams if up.holder is holder), "?")

    # -- the tools -----------------------------------------------------------

    def _build_tools(self) -> list[Tool]:
        tools = []
        owners: dict[str, _Upstream] = {}
        for up in self._upstreams:
            for listed in up.listing:
                override = up.spec.overrides.get(listed.name)
                f = mapping.flags(listed.annotations, trusted=up.spec.trusted, override=override)
                title = getattr(listed.annotations, "title", None) or getattr(listed, "title", None)
                name = mapping.stable_name(up.spec.prefix, listed.name, override)
                _claim(owners, name, up)
                self._flags[name] = f
                tools.append(
                    Tool(
                        name=name,
                        function=self._function(up, listed.name),
                        description=listed.description or title or "",
                        parameters=listed.input_schema,
                        returns=listed.output_schema,
                        requires_approval=f.requires_approval,
                        category=f.category,
                        concurrency_safe=_always if f.parallel else None,
                        exclusive_reason="" if f.parallel else f.reason,
                        throttles=up.spec.throttles,
                        bound=override.bound if override is not None else None,
                        callers=override.callers if override is not None and override.callers else CALLERS,
                    )
                )
        return tools

    def _function(self, up: _Upstream, name: str) -> Any:
        def call(args: dict[str, Any]) -> Any:
            return self._call(up, name, args)

        call.__qualname__ = call.__name__ = f"mcp:{up.name}:{name}"
        return call

    def _call(self, up: _Upstream, name: str, args: dict[str, Any]) -> Any:
        timeout, by_deadline = self._call_timeout, False
        info = current_call.get()
        deadline = getattr(getattr(info, "run_ctx", None), "deadline", None)
        if deadline is not None and deadline + DEADLINE_GRACE - time.monotonic() < timeout:
            timeout, by_deadline = deadline + DEADLINE_GRACE - time.monotonic(), True
            if timeout <= 0:
                raise ToolError("the run's deadline passed before the call could start")
        with self._lock:
            if self._closed:
                raise ToolError(f"the connection to MCP server {up.name!r} is closed")
            if up.broken is not None:
                raise ToolError(f"MCP server {up.name!r}: {up.broken}")
            future = self._portal.start_task_soon(up.client.call_tool, name, args)
            self._inflight.add(future)
        try:
            result = future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            if by_deadline:
                raise ToolError(
                    f"MCP server {up.name!r} did not answer before the run's deadline; call cancelled"
                ) from None
            raise ToolError(
                f"MCP server {up.name!r} did not answer within {self._call_timeout:g}s (call_timeout); call cancelled"
            ) from None
        except concurrent.futures.CancelledError:
            if up.broken is not None:
                raise ToolError(f"MCP server {up.name!r}: {up.broken}") from None
            raise ToolError(f"the connection to MCP server {up.name!r} was closed during the call") from None
        except Exception as exc:
            raise ToolError(f"MCP server {up.name!r}: {up.broken or _reason(exc)}") from None
        finally:
            with self._lock:
                self._inflight.discard(future)
        return mapping.result_value(result)


def _client_info() -> Implementation:
    from .._version import __version__

    return Implementation(name="nous_sched", version=__version__)


def _errlog() -> Any:
    """Where a server process's standard error goes: ours, when it is a real file."""
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__


async def _list_tools(client: Any) -> list[Any]:
    tools: list[Any] = []
    cursor = None
    for _ in range(_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _reason(exc: BaseException) -> str:
    """The innermost message of ``exc``, unwrapping the exception groups anyio raises."""
    while len(getattr(exc, "exceptions", ())) == 1 and isinstance(exc.exceptions[0], BaseException):  # type: ignore[attr-defined]
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    text = str(exc)
    if isinstance(exc, MCPError) and text:
        return text  # the protocol's own error: its message says it all
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@atexit.register
def _close_all() -> None:
    for connection in list(_open):
        connection.close()

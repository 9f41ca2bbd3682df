"""A real MCP server for the tests, written with the SDK's server API (MCPServer).

Run it over stdio (``python lab.py``) or Streamable HTTP on a socket the test
already bound (``python lab.py --http-fd N``); tests/test_mcp*.py also build
it in-process with :func:`build`.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field

READ_ONLY = ToolAnnotations(read_only_hint=True)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True)
ADDITIVE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True)
BARRIER_WAIT = 60.0


class Entry(BaseModel):
    key: str
    value: int
    tags: list[str] = Field(default_factory=list)


def build() -> MCPServer:
    server = MCPServer("lab", instructions="Tools for nous_sched MCP tests.", log_level="WARNING")
    groups: dict[str, list] = {}
    state = {"running": 0, "peak": 0, "calls": 0, "cancelled": 0, "store": {}}

    class _Count:
        def __enter__(self):
            state["calls"] += 1
            state["running"] += 1
            state["peak"] = max(state["peak"], state["running"])

        def __exit__(self, *exc):
            state["running"] -= 1

    @server.tool(annotations=READ_ONLY)
    async def meet(group: str, n: int, key: str) -> dict:
        """Wait until `n` calls of `group` are in at once, then return; proves they overlapped."""
        with _Count():
            arrived, event = groups.setdefault(group, [0, anyio.Event()])
            groups[group][0] = arrived + 1
            if arrived + 1 >= n:
                event.set()
            with anyio.move_on_after(BARRIER_WAIT):
                await event.wait()
            return {"key": key, "met": event.is_set()}

    @server.tool(annotations=READ_ONLY)
    async def lookup(key: str) -> Entry:
        """The entry stored under `key` (structured output)."""
        with _Count():
            await anyio.lowlevel.checkpoint()
            return Entry(key=key, value=len(key), tags=["lab", key])

    @server.tool(annotations=READ_ONLY, structured_output=False)
    def as_text(text: str) -> str:
        """Returns `text` as plain text content, no structured output."""
        return text

    @server.tool(annotations=READ_ONLY, structured_output=False)
    def blocks(items: list[str]) -> list[str]:
        """Returns one text block per item."""
        return items

    @server.tool(annotations=READ_ONLY)
    def fail(message: str) -> str:
        """Always fails with `message` (is_error)."""
        raise ToolError(message)

    @server.tool(annotations=DESTRUCTIVE)
    async def put(key: str, value: int) -> dict:
        """Overwrite `key` with `value` (destructive)."""
        with _Count():
            await anyio.lowlevel.checkpoint()
            state["store"][key] = value
            return {"stored": key, "value": value}

    @server.tool(annotations=ADDITIVE)
    async def note(text: str) -> dict:
        """Append a note (additive, idempotent)."""
        with _Count():
            await anyio.lowlevel.checkpoint()
            state["store"].setdefault("notes", []).append(text)
            return {"notes": len(state["store"]["notes"])}

    @server.tool()
    def plain(x: int) -> int:
        """No annotations at all."""
        return x * 2

    @server.tool(annotations=READ_ONLY)
    async def hang(tag: str) -> str:
        """Never returns on its own; counts the cancellations it receives."""
        try:
            await anyio.sleep_forever()
        finally:
            state["cancelled"] += 1
        return tag  # pragma: no cover

    @server.tool(annotations=READ_ONLY)
    def crash(code: int = 3) -> str:
        """Kills the server process mid-call."""
        sys.stdout.flush()
        os._exit(code)

    @server.tool(annotations=READ_ONLY, structured_output=False)
    def header(name: str, ctx: Context) -> str:
        """The value of request header `name` ("" when absent or not over HTTP)."""
        return (ctx.headers or {}).get(name.lower(), "")

    @server.tool(annotations=READ_ONLY)
    def stats() -> dict:
        """Counters: calls, peak concurrent calls, cancellations seen, the store."""
        return {k: state[k] for k in ("calls", "peak", "cancelled", "store")}

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http-fd", type=int, help="serve Streamable HTTP on this already-bound listening socket")
    parser.add_argument("--tag", help="ignored: marks the process so a test can find it")
    parser.add_argument("--linger", action="store_true", help="stay alive after stdin closes, until killed")
    args = parser.parse_args(argv)
    server = build()
    if args.http_fd is None:
        server.run("stdio")
        if args.linger:  # a server that ignores the end of its input: only a signal stops it
            time.sleep(600)
        return
    import uvicorn

    sock = socket.socket(fileno=args.http_fd)
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    anyio.run(uvicorn.Server(config).serve, [sock])


if __name__ == "__main__":
    main()

"""The stdio transport to one upstream MCP server, with every message bounded in size.

The SDK's ``stdio_client`` joins a partial line to each new chunk and splits
the whole again, so a server that writes one long line without a newline
costs its reader time quadratic in the line's length, on the event-loop
thread every server of a :class:`~nous_sched.mcp.Connection` shares: a 60 MiB
line slowed the other servers' calls 40-fold. :func:`bounded_stdio` is the
same transport (the SDK's process start and its spec-ordered shutdown:
stdin closed, then SIGTERM, then SIGKILL) with its own reader:

* each chunk is searched for a newline once and kept as it came, so reading
  is linear in what the server writes;
* a message (a line) over ``max_message_bytes`` is never assembled: the
  server is killed at once, ``on_overflow(why)`` is called, and the session
  sees the connection end, so its calls fail (as data, in the tools).

Needs the MCP SDK (imported by :mod:`nous_sched.mcp.client` only).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any, Callable

import anyio
import anyio.lowlevel
import mcp_types
from mcp.client import stdio as sdk_stdio
from mcp.shared.message import SessionMessage

__all__ = ["bounded_stdio", "LineReader", "MessageTooLarge", "DEFAULT_MAX_MESSAGE_BYTES"]

log = logging.getLogger("nous_sched")

#: The default bound on one message from an upstream server (one line of its stdout).
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_CHUNK = 1 << 16  # bytes asked of the pipe per read
_WRITER_FLUSH = 0.5  # seconds the writer gets to flush accepted messages at close, as the SDK gives


class MessageTooLarge(Exception):
    """A server's message grew past the bound before its newline came."""


class LineReader:
    """Splits a byte stream into lines, holding at most ``limit`` bytes of a line not yet ended.

    Each byte is searched once and copied once (when its line is joined), so
    the work is linear in the input whatever the line lengths.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines ``chunk`` ends (without their newlines), in order.

        :raises MessageTooLarge: a line is longer than ``limit`` bytes.
        """
        lines = []
        start = 0
        newline = chunk.find(b"\n")
        while newline >= 0:
            lines.append(self._end(chunk[start:newline]))
            start = newline + 1
            newline = chunk.find(b"\n", start)
        if start < len(chunk):
            self._keep(chunk[start:])
        return lines

    def _keep(self, piece: bytes) -> None:
        self._size += len(piece)
        if self._size > self.limit:
            raise MessageTooLarge(f"a message of more than {self.limit:,} bytes (max_message_bytes)")
        self._parts.append(piece)

    def _end(self, piece: bytes) -> bytes:
        if not self._parts:
            if len(piece) > self.limit:
                raise MessageTooLarge(f"a message of {len(piece):,} bytes, over {self.limit:,} (max_message_bytes)")
            return piece
        self._keep(piece)
        line = b"".join(self._parts)
        self._parts, self._size = [], 0
        return line


def _parse(line: bytes) -> Any:
    """One line as the session reads it: a message, or the parse error as a value (as the SDK does)."""
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


def _kill_group(process: Any) -> None:
    """SIGKILL the server's process group at once (it was started in a session of its own)."""
    if sys.platform == "win32":  # pragma: no cover
        process.kill()
        return
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


async def _read(stdout: Any, read_writer: Any, limit: int, overflow: Callable[[], None], spoke: anyio.Event) -> bool:
    """Pass each line of ``stdout`` to the session until it ends; True when a line passed ``limit``
    (``overflow()`` is called then, before the session sees the stream end). ``spoke`` is set at
    the server's first message."""
    lines = LineReader(limit)
    async with read_writer:
        try:
            while True:
                for line in lines.feed(await stdout.receive(_CHUNK)):
                    if line.strip():
                        spoke.set()
                        await read_writer.send(_parse(line))
        except MessageTooLarge:
            overflow()
            return True
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            return False  # the server closed its stdout, or our shutdown closed the stream


@asynccontextmanager
async def bounded_stdio(
    params: Any, *, errlog: Any, max_message_bytes: int, on_overflow: Callable[[str], None]
) -> AsyncIterator[tuple[Any, Any]]:
    """Start the server ``params`` describes (an SDK ``StdioServerParameters``); yield its (read, write) streams."""
    # The MCP SDK's own steps of stdio_client (its privates: it has no public ones), minus its unbounded reader.
    command = await sdk_stdio._get_executable_command(params.command)  # noqa: SLF001
    process = await sdk_stdio._create_platform_compatible_process(  # noqa: SLF001
        command=command,
        args=list(params.args),
        env=sdk_stdio.get_default_environment() | (params.env or {}),
        errlog=errlog,
        cwd=params.cwd,
    )
    stdout, stdin = process.stdout, process.stdin
    assert stdout is not None and stdin is not None, "the server is started with pipes"
    # No awaits until the task group is entered, or a cancellation in the gap would leak the process.
    read_writer, read_stream = anyio.create_memory_object_stream[Any](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()
    spoke = anyio.Event()

    def overflow() -> None:
        _kill_group(process)
        on_overflow(f"it sent a message over {max_message_bytes:,} bytes (max_message_bytes)")

    async def reader() -> None:
        if not await _read(stdout, read_writer, max_message_bytes, overflow, spoke):
            await sdk_stdio._drain_stdout(process)  # noqa: SLF001 (lets a server flushing its output exit)

    async def writer() -> None:
        try:
            async with write_reader:
                async for message in write_reader:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await stdin.send((text + "\n").encode("utf-8"))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # the session sees the connection end, not a request hanging
        finally:
            writer_done.set()

    async def shutdown() -> None:
        read_stream.close()
        write_stream.close()
        with anyio.move_on_after(_WRITER_FLUSH):
            await writer_done.wait()
        if not spoke.is_set():
            # A server that never said a word has nothing to flush: no grace, so a
            # silent one costs connect() its connect_timeout and no more.
            _kill_group(process)
        await sdk_stdio._stop_server_process(process)  # noqa: SLF001
        for stream in (read_stream, write_stream, read_writer, write_reader):
            await stream.aclose()
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):  # every wait inside is bounded; the process must not leak
                await shutdown()
            tg.cancel_scope.cancel()

"""Real MCP servers for the tests, and the helpers that start them and look for leaks.

``lab.py`` is written with the SDK's server API. Tests speak to it over stdio
(a subprocess per connection), over Streamable HTTP (a subprocess serving a
loopback socket the test bound, so no port is ever guessed), and in-process.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

LAB = Path(__file__).with_name("lab.py")
STDIO_COMMAND = [sys.executable, str(LAB)]


def stdio_command(tag: str) -> list[str]:
    """The command that starts a lab server over stdio, marked with ``tag`` so leaks can be found."""
    return [*STDIO_COMMAND, "--tag", tag]


@contextlib.contextmanager
def http_lab() -> Iterator[str]:
    """A lab server subprocess serving Streamable HTTP on 127.0.0.1; yields its URL, stops it after."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    # The server inherits the listening socket itself: it is accepting (queued) before uvicorn even starts.
    process = subprocess.Popen([*STDIO_COMMAND, "--http-fd", str(sock.fileno())], pass_fds=[sock.fileno()])
    sock.close()
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def processes_running(marker: str) -> list[int]:
    """Live processes (zombies included) whose command line mentions ``marker``, other than this one."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if marker in cmdline:
                found.append(int(entry.name))
            elif (entry / "stat").read_text().split(") ", 1)[1].startswith("Z"):
                # A zombie has lost its command line; count it when it is our unreaped child.
                ppid = int((entry / "stat").read_text().split(") ", 1)[1].split()[1])
                if ppid == os.getpid():
                    found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue  # it exited while we looked
    return found


def loop_threads() -> list[str]:
    """Names of live threads an MCP connection could have left behind."""
    prefixes = ("nous-sched-mcp", "asyncio_", "AnyIO worker thread")
    return sorted(t.name for t in threading.enumerate() if t.name.startswith(prefixes))


def wait_until(predicate, timeout: float = 15.0, what: str = "condition") -> None:
    """Poll ``predicate`` until it holds; a state kept in another process has no event to wait on."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)

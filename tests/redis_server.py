"""A real Redis server for the tests, started by the tests themselves.

``redis_server()`` starts the distribution's ``redis-server`` (``.ci/run``
installs it) on a free loopback port in a temporary folder, with no
persistence, and stops it when the context exits. Tests that need one use
the session-wide ``redis_url`` fixture of ``conftest.py``; tests that stop,
kill or restart a server use their own ``redis_process()``.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

from procs import stop


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisProcess:
    """One ``redis-server`` on a fixed loopback port that a test may stop (SIGSTOP), kill and start again."""

    def __init__(self, folder: str, port: int | None = None) -> None:
        self.folder = folder
        self.port = port or _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.proc = proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            + ["--dir", self.folder],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the server; ``SIGSTOP`` returns once every thread of it is stopped (silent from
        then on: the main thread may still be answering, and the io and bio threads working, when
        ``kill`` returns)."""
        assert self.proc is not None
        if sig == signal.SIGSTOP:
            stop(self.proc.pid)
        else:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL, and wait until it is gone (its port is free again)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stopped server cannot act on SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def redis_process() -> Iterator[RedisProcess]:
    """A started :class:`RedisProcess`, stopped when the context exits."""
    with tempfile.TemporaryDirectory(prefix="nous-sched-redis-") as folder:
        server = RedisProcess(folder)
        try:
            server.start()
            yield server
        finally:
            server.stop()


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """Start ``redis-server`` on loopback; yield its ``redis://`` URL."""
    with redis_process() as server:
        yield server.url

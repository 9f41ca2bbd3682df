"""A real Redis server for the tests, started by the tests themselves.

``redis_server()`` starts the distribution's ``redis-server`` (``.ci/run``
installs it) on a free loopback port in a temporary folder, with no
persistence, and stops it when the context exits. Tests that need one use
the session-wide ``redis_url`` fixture of ``conftest.py``.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """Start ``redis-server`` on loopback; yield its ``redis://`` URL."""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    with tempfile.TemporaryDirectory(prefix="nous-sched-redis-") as folder:
        port = _free_port()
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", folder],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                        s.sendall(b"PING\r\n")
                        if s.recv(16).startswith(b"+PONG"):
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {port}")
                time.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

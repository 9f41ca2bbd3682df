"""A real Postgres server for the tests, started by the tests themselves.

``postgres_process()`` makes a throwaway cluster with the distribution's
``initdb`` (``.ci/system-deps`` installs ``postgresql``) in a temporary
folder, starts ``postgres`` on a free loopback port with its socket in that
folder, waits for ``pg_isready``, and removes it all when the context exits.
Postgres refuses to run as root: as root, every step runs as ``nobody``
(``setpriv``), which owns the folder. Tests that need one use the
session-wide ``postgres_dsn`` fixture of ``conftest.py`` (a fresh database
per call of ``new_database()``); tests that stop or kill a server use their
own ``postgres_process()``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

from procs import stop


def bindir() -> str:
    """The folder of the server's programs: ``pg_config --bindir``, else the newest ``/usr/lib/postgresql/*/bin``."""
    config = shutil.which("pg_config")
    if config:
        path = subprocess.run([config, "--bindir"], capture_output=True, text=True, check=False).stdout.strip()
        if path and os.path.exists(os.path.join(path, "initdb")):
            return path
    for found in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True):
        if os.path.exists(os.path.join(found, "initdb")):
            return found
    raise RuntimeError("no Postgres server programs (initdb): install the distribution's postgresql (.ci/system-deps)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user() -> list[str]:
    """The command prefix that runs a program as an unprivileged user (as root), else nothing."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]


class PostgresProcess:
    """One ``postgres`` on a fixed loopback port that a test may stop (SIGSTOP), kill and start again."""

    def __init__(self, folder: str, settings: tuple[str, ...] = ()) -> None:
        self.folder = folder
        self.settings = settings  # more ``-c name=value`` for the server (the benchmarks' pg_stat_statements)
        self.data = os.path.join(folder, "data")
        self.port = _free_port()
        self.bin = bindir()
        self.proc: subprocess.Popen[bytes] | None = None
        self.user = "nous"
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.chown(folder, nobody.pw_uid, nobody.pw_gid)
        os.chmod(folder, 0o700)
        subprocess.run(
            [*_as_server_user(), os.path.join(self.bin, "initdb"), "-D", self.data, "-U", self.user]
            + ["--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"],
            check=True,
            capture_output=True,
        )

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [*_as_server_user(), os.path.join(self.bin, "postgres"), "-D", self.data, "-p", str(self.port)]
            + ["-k", self.folder, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"]
            + ["-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "max_connections=200"]
            + [arg for setting in self.settings for arg in ("-c", setting)],
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.folder, "server.log"), "ab"),  # noqa: SIM115  (the server's, closed with it)
        )
        deadline = time.monotonic() + 60
        ready = os.path.join(self.bin, "pg_isready")
        while True:
            done = subprocess.run([ready, "-h", "127.0.0.1", "-p", str(self.port), "-q"], check=False)
            if done.returncode == 0:
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(self.folder, "server.log"), encoding="utf-8", errors="replace") as f:
                    log = f.read()[-2000:]
                raise RuntimeError(f"postgres did not start on port {self.port}: {log}")
            time.sleep(0.05)

    def new_database(self) -> str:
        """A fresh, empty database's DSN (each test its own: no test sees another's rows)."""
        import psycopg

        name = f"t_{os.getpid()}_{next(_numbers)}"
        with psycopg.connect(self.dsn(), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"'.encode())
        return self.dsn(name)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the whole server: the postmaster and every backend. ``SIGSTOP`` returns once
        all of them are stopped (silent from then on: each may still be answering when ``kill`` returns);
        the postmaster first, so that it starts no backend after its children are listed."""
        assert self.proc is not None
        if sig == signal.SIGSTOP:
            stop(self.proc.pid)
            for pid in _children(self.proc.pid):
                stop(pid)
            return
        for pid in [self.proc.pid, *_children(self.proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGCONT)  # a stopped server cannot act on SIGTERM
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_numbers = iter(range(1, 1 << 30))


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


@contextlib.contextmanager
def postgres_process(settings: tuple[str, ...] = ()) -> Iterator[PostgresProcess]:
    """A started :class:`PostgresProcess` (``settings``: more ``name=value`` for it), stopped and removed
    when the context exits."""
    with tempfile.TemporaryDirectory(prefix="nous-sched-pg-") as folder:
        server = PostgresProcess(folder, settings)
        try:
            server.start()
            yield server
        finally:
            server.stop()

"""A real Celery fleet for the tests: ``celery worker`` subprocesses on a Redis broker the tests start.

:class:`Fleet` starts each worker as ``celery -A celery_app worker --concurrency 1 -P <pool> -n <name>@%h
-Q celery,<name>`` (its own hostname and its own queue, so a test can route a task to it), waits until
it answers a ping, and stops it (SIGTERM, then SIGKILL) when the fleet closes. Each worker's output goes
to a log file the failing test prints.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent
WORKER_SCRIPT = str(ROOT / "nous_sched" / "runtime" / "worker.py")


class Worker:
    def __init__(self, name: str, proc: subprocess.Popen[bytes], log: pathlib.Path) -> None:
        self.name, self.proc, self.log = name, proc, log
        self.node = f"{name}@{socket.gethostname()}"

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Fleet:
    def __init__(
        self,
        redis_url: str,
        folder: pathlib.Path,
        app: str = "celery_app",
        tools: str = "celery_tools",
        cwd: pathlib.Path = TESTS,
    ):
        self.redis_url, self.folder, self.app_module, self.tools, self.cwd = redis_url, folder, app, tools, cwd
        self.workers: dict[str, Worker] = {}
        self.env = {
            **os.environ,
            "NOUS_SCHED_CELERY_REDIS": redis_url,
            "NOUS_SCHED_CELERY_TOOLS": tools,
            "REDIS_URL": redis_url,
            "PYTHONPATH": os.pathsep.join([str(cwd), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }

    def start(self, name: str, pool: str = "prefork") -> Worker:
        log = self.folder / f"{name}.log"
        argv = [sys.executable, "-m", "celery", "-A", self.app_module, "worker", "--concurrency", "1"]
        argv += ["-P", pool, "-n", f"{name}@%h", "-Q", f"celery,{name}", "--loglevel", "INFO", "--without-gossip"]
        argv += ["--without-mingle", "--without-heartbeat"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, env=self.env, cwd=str(self.cwd), stdout=out, stderr=subprocess.STDOUT)
        worker = self.workers[name] = Worker(name, proc, log)
        return worker

    def wait_ready(self, app, names: list[str], timeout: float = 90.0) -> None:
        """Until every worker in ``names`` answers a ping."""
        wanted = {self.workers[n].node for n in names}
        deadline = time.monotonic() + timeout
        while True:
            replies = app.control.ping(destination=sorted(wanted), timeout=1.0) or []
            answered = {node for reply in replies for node in reply}
            if wanted <= answered:
                return
            for n in names:
                if self.workers[n].proc.poll() is not None:
                    raise RuntimeError(f"celery worker {n} exited:\n{self.workers[n].output()}")
            if time.monotonic() > deadline:
                logs = "\n".join(self.workers[n].output() for n in names)
                raise RuntimeError(f"celery workers {sorted(wanted - answered)} did not answer a ping:\n{logs}")

    def close(self) -> None:
        for worker in self.workers.values():
            worker.stop()


@contextlib.contextmanager
def fleet(redis_url: str, folder: pathlib.Path, **options: Any) -> Iterator[Fleet]:
    made = Fleet(redis_url, folder, **options)
    try:
        yield made
    finally:
        made.close()


def descendants(pid: int) -> set[int]:
    """The pids of every live process below ``pid`` (by /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def ours(pids: set[int]) -> set[int]:
    """Those of ``pids`` that are nous_sched worker processes or fork servers (their command line runs
    runtime/worker.py, or names a nous-sched-worker)."""
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read()
        except OSError:
            continue
        if WORKER_SCRIPT.encode() in argv or b"nous-sched-worker-" in argv:
            found.add(pid)
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (a zombie is not)."""
    left = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.add(pid)
    return left

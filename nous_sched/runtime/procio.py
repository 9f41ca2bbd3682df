"""Worker processes and the frame protocol, as the host sees them.

:class:`Worker` is one worker process and its three pipes (standard input,
standard output, the lifeline); it reads and writes frames
(:mod:`nous_sched.runtime.worker` defines them), bounded by the caller's
``max_frame`` and holding about one copy of a large frame while it reads it.
A worker is started one of two ways:

* ``"forkserver"`` (the default on Linux): a :class:`ForkServer`, one
  single-threaded process per pool that has loaded the engine and forks a
  fresh child for each worker (a few milliseconds of CPU, against tens for
  a new interpreter). The host receives a pidfd of each child, so its signals reach
  exactly that process, never a recycled pid; the server reaps the children
  and reports how each ended.
* ``"spawn"``: a fresh interpreter (``python -I -S -B -c BOOT worker.py``) per worker,
  started with ``subprocess`` in a process group of its own.

No module here knows about runs or the pool's decisions.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
from typing import Any, Optional

from ..errors import RunCodeError
from . import Cancel, worker
from .engine import CANCEL_POLL, CANCELLED, Stopped, clip

WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
#: How a worker or a fork server starts: ``python -I -S -B -c BOOT WORKER_SCRIPT
#: ARGS...`` loads ``worker.py`` by its path as a module, not as the script: a
#: script is compiled on every start, a module's code is read from the
#: ``__pycache__`` an install wrote (about 10 ms of a fork server's boot).
#: By the import system's own frozen modules, which ``importlib.util``
#: re-exports (the same functions): that module's import (``contextlib``,
#: ``importlib._abc``, ``warnings``) is about 1 ms more of every boot. The
#: collector is off until ``worker.main`` has loaded the rest (see there).
BOOT = (
    "import gc, _frozen_importlib as b, _frozen_importlib_external as e, sys; gc.disable(); "
    "s = e.spec_from_file_location('nous_sched_worker', sys.argv[1]); "
    "m = b.module_from_spec(s); sys.modules[s.name] = m; s.loader.exec_module(m); m.main(sys.argv[1:])"
)


class NotStarted(Exception):
    """The worker was gone before it received the run."""


class StartTimeout(Exception):
    pass


class Expired(Exception):
    pass


class Died(Exception):
    pass


class Garbled(Exception):
    pass


class CpuSpent(Exception):
    """The worker used the CPU time its run may use (:class:`CpuWatch`), grace included."""


#: What a worker's CPU clock runs at, at most, against the wall: it has two threads.
WORKER_TASKS = 2
#: The shortest wait between two looks at a worker's CPU time (the kernel counts it in ticks).
CPU_LOOK = 0.05
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> Optional[tuple[float, int]]:
    """A process's CPU time (user and system, in seconds) and its start time
    (in ticks since boot: what tells it from a later process with its pid),
    from ``/proc/<pid>/stat``; ``None`` where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        fields = data[data.rindex(b")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS, int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


class CpuWatch:
    """The host's own check of a worker's CPU time while it waits for the
    worker's answer (:meth:`Worker.receive`): from the run's start, the
    worker may use ``limit`` seconds (its budget plus the kill grace). Read
    from ``/proc`` at the earliest moment the worker could have used them,
    (it runs at most :data:`WORKER_TASKS` threads), so nothing wakes the host
    while a program computes little, and never while the worker waits for
    the host. ``None`` from :meth:`start` where the worker's CPU cannot be read
    (the kernel's ``RLIMIT_CPU`` still holds)."""

    __slots__ = ("pid", "limit", "base", "born", "due", "used")

    def __init__(self, pid: int, limit: float, base: float, born: int) -> None:
        self.pid = pid
        self.limit = limit
        self.base = base
        self.born = born
        self.used = 0.0
        self.due = time.monotonic() + limit / WORKER_TASKS

    @classmethod
    def start(cls, pid: int, limit: float) -> Optional["CpuWatch"]:
        now = cpu_seconds(pid)
        return None if now is None else cls(pid, limit, now[0], now[1])

    def spent(self) -> bool:
        """Look at the worker's CPU time now: whether it used its limit (else the next look is set)."""
        now = cpu_seconds(self.pid)
        if now is None or now[1] != self.born:  # gone: its end of file says so
            self.due = float("inf")
            return False
        self.used = now[0] - self.base
        left = self.limit - self.used
        if left <= 0:
            return True
        self.due = time.monotonic() + max(left / WORKER_TASKS, CPU_LOOK)
        return False


def ms(seconds: float) -> int:
    return max(1, int(seconds * 1000) + 1)


def worker_env() -> dict[str, str]:
    env = {"MALLOC_ARENA_MAX": "1"}
    for name in ("LD_LIBRARY_PATH", worker.PAYLOAD_ENV):  # the first: some Python builds need it to start
        if name in os.environ:
            env[name] = os.environ[name]
    return env


#: The largest answer of a fork server to a spawn request: ``P``, the pid, the
#: keys of the names texts it holds (33 bytes each) and the request.
_ANSWER_BYTES = 1024
#: How often :meth:`ForkServer.status` asks the server again to reap its
#: exited children while it waits for one's status.
NUDGE = 0.05
#: Seconds :meth:`ForkServer.close` gives the server to reap its exited
#: children and exit, after its socket's end of file, before killing it (a
#: killed server's unreaped children would be left to ``init`` to reap).
CLOSE_GRACE = 2.0
#: The host-to-worker pipe's buffer (Linux's default is 64 KiB): a run frame naming
#: thousands of tools (its names' text, about 25 bytes a name) goes in one write,
#: with no wait for the worker to read its first part.
PIPE_BYTES = 1 << 20


def _widen(fd: int) -> None:
    """Ask for a :data:`PIPE_BYTES` buffer on pipe ``fd``; where the system refuses
    (not Linux, a user over its pipe allowance, a lower ``pipe-max-size``), the
    default stays: only a long frame's speed depends on it."""
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except OSError:
        pass


def _close_all(fds: Any) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def quickjs_origin() -> str:
    spec = importlib.util.find_spec("_quickjs")
    if spec is None or not spec.origin:
        raise RunCodeError(
            "no code runtime is configured: the worker processes need quickjs-ng "
            "(`pip install quickjs-ng`), which provides the `_quickjs` module"
        )
    return spec.origin


class ForkServer:
    """One fork server process and the socket to it (see the module docstring).

    ``spawn`` is serialised by a lock; the same lock guards reading the
    socket, where the server's ``W`` reports of exited children arrive
    between answers and are kept in ``statuses`` (the most recent ones).

    **A bounded life.** A fork server's children share its address layout
    (the kernel randomises it at ``execve`` only), so an address one run
    leaks holds for every child of the same server. After ``children``
    children a server is *retired* (:meth:`retire`, or its last spawn):
    :attr:`retired` turns true, the pool forks the next worker from a new
    one, and this one is closed as soon as no child of it and no
    :meth:`hold` on it is left (its children die with it). One leak then
    tells about at most ``children`` workers."""

    def __init__(
        self,
        python: str,
        quickjs_path: str,
        cwd: str,
        options: dict[str, Any],
        timeout: float,
        children: int = 0,
    ) -> None:
        self._lock = threading.Lock()  # guards the socket's request-answer turns and the counts below
        self.statuses: dict[int, int] = {}
        self.limit = children  # 0: no limit
        self.spawned = 0
        self.retired = False
        self._held = 0  # handed out by hold(), or a child's, not yet released
        self._closed = False
        self.gone = False  # its socket said end of file: never ask it again
        # The names texts it held at its last fork, and those offered since (see offer_names).
        self.names_held: frozenset[bytes] = frozenset()
        # Guards the two offer fields below and nothing else; taken after _lock, never
        # before it, and never held across a send (an offer must never wait for a spawn).
        self._offers_lock = threading.Lock()
        self._names_offered: set[bytes] = set()  # sent since the last answer
        self._names_waiting: dict[bytes, bytes] = {}  # not sent yet, oldest first
        # Sent, the most recent last, as many as the server keeps: what its successor is offered.
        self._names_sent: dict[bytes, bytes] = {}
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [python, "-I", "-S", "-B", "-c", BOOT, WORKER_SCRIPT, "--fork-server", quickjs_path, json.dumps(options)]
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=theirs.fileno(),
                stdout=theirs.fileno(),
                stderr=subprocess.DEVNULL,
                close_fds=True,
                cwd=cwd,
                env=worker_env(),
                start_new_session=True,  # a process group of its own
            )
        except OSError as exc:
            ours.close()
            raise RunCodeError(f"could not start a worker process ({python}): {exc}") from None
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        try:
            self._ready(timeout, python)
        except BaseException:
            self.close()
            raise

    def _ready(self, timeout: float, python: str) -> None:
        self.sock.settimeout(timeout)
        try:
            first = self.sock.recv(1 << 16)
        except socket.timeout:
            raise RunCodeError(f"a worker process did not start within {timeout:g}s ({python})") from None
        finally:
            self.sock.settimeout(None)
        if first == b"R":
            return
        if not first:
            try:
                code = self.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                code = -9
            raise RunCodeError(f"a worker process exited before it started ({_exit_text(code)})")
        if first[4:5] == worker.FATAL:
            raise RunCodeError("a worker process could not start: " + clip(first[5:].decode("utf-8", "replace"), 2000))
        raise RunCodeError("a worker process broke the protocol while starting")

    def alive(self) -> bool:
        return not self.gone and self.proc.poll() is None

    def hold(self) -> bool:
        """Keep this server open until :meth:`release` (a worker about to be
        spawned from it; its child, once spawned); false if it is retired or
        closed, so another must be used."""
        with self._lock:
            if self.retired or self._closed:
                return False
            self._held += 1
            return True

    def retire(self) -> None:
        """Fork no more (another server has taken over); closed at once if
        nothing holds it, else when the last :meth:`release` comes."""
        with self._lock:
            self.retired = True
            done = self._held <= 0 and not self._closed
        if done:
            self.close()

    def release(self) -> None:
        """A :meth:`hold` is over (the child is gone, or was never made); a
        retired server with none left is closed."""
        with self._lock:
            self._held -= 1
            done = self.retired and self._held <= 0 and not self._closed
        if done:
            self.close()

    def spawn(
        self, name: str, fds: tuple[int, int, int], background: bool = False
    ) -> tuple[int, int, frozenset[bytes]]:
        """A fresh child serving ``fds``; its ``(pid, pidfd, names)``, ``names``
        the keys of the names texts it holds (see :meth:`offer_names`).
        ``background``: it boots at the lowest priority (see
        ``worker._boot_policy``). The answer names the request: one left unread
        by an interrupted spawn is recognised as stale, and that child killed."""
        request = name.encode("ascii") + (b" " + worker.BACKGROUND if background else b"")
        with self._lock:
            self.spawned += 1
            if self.limit and self.spawned >= self.limit:
                self.retired = True
            self._send_names()
            try:
                socket.send_fds(self.sock, [request], list(fds))
            except OSError:  # (a broken pipe: it is gone, though it may not have exited yet)
                self.gone = True
                raise
            while True:
                try:
                    msg, got, _, _ = socket.recv_fds(self.sock, _ANSWER_BYTES, 1)
                except OSError:
                    self.gone = True
                    raise
                if not msg:
                    _close_all(got)
                    self.gone = True
                    raise OSError("the fork server is gone")
                parts = msg.split()
                if parts[0] == b"P" and len(got) == 1 and len(parts) > 3:
                    if parts[3:] == request.split():
                        held = frozenset(parts[2].split(b",")) - {b"-"}
                        self.names_held = held
                        with self._offers_lock:
                            self._names_offered.clear()
                        return int(parts[1]), got[0], held
                    _kill_stale(got[0])
                    continue
                _close_all(got)
                self._note(msg)

    def offer_names(self, key: bytes, text: bytes) -> None:
        """Offer the server a names text (``key``: ``engine.names_key`` of it),
        so the children it forks from now on hold it (``worker._keep_names``
        keeps the last few) and their runs' frames carry only the key. Sent
        now if no spawn holds the lock, else by that spawn before its request
        (so every child forked after this call holds it, if the server kept
        it); once until the server's next answer says whether it kept it.
        Never waits; a failure is nobody's error (the runs send the text)."""
        if key in self.names_held or not 0 < len(text) <= worker.NAMES_BYTES or self.gone or self.retired:
            return
        with self._offers_lock:
            if key in self._names_offered:
                return
            self._names_waiting[key] = text
            while len(self._names_waiting) > worker.NAMES_ENTRIES:  # (the oldest would be dropped there anyway)
                del self._names_waiting[next(iter(self._names_waiting))]
        if self._lock.acquire(blocking=False):
            try:
                self._send_names()
            finally:
                self._lock.release()

    def names_sent(self) -> list[tuple[bytes, bytes]]:
        """``(key, text)`` of the names texts sent to this server, oldest first,
        as many as it keeps (``worker.keep_newest``, its own rule): what a successor
        is offered before it forks (see ``WorkerPool``), so the runs on its
        children carry only their keys, as on this server's."""
        with self._offers_lock:
            return list(self._names_sent.items())

    def _send_names(self) -> None:
        """(The lock held.) Send the waiting names offers, oldest first."""
        while True:
            with self._offers_lock:
                if not self._names_waiting:
                    return
                key = next(iter(self._names_waiting))
                text = self._names_waiting.pop(key)
                self._names_offered.add(key)
                worker.keep_newest(self._names_sent, key, text)  # (the server's own rule: what it holds)
            try:
                fd = os.memfd_create("nous_sched names", os.MFD_CLOEXEC)
            except (OSError, AttributeError):  # (AttributeError: no memfd_create on this platform)
                continue
            try:
                worker.write_all(fd, text)
                socket.send_fds(self.sock, [b"%s %s %d" % (worker.NAMES, key, len(text))], [fd], socket.MSG_DONTWAIT)
            except OSError:
                pass
            finally:
                os.close(fd)

    def _note(self, msg: bytes) -> None:
        parts = msg.split()
        if len(parts) == 3 and parts[0] == b"W":
            if len(self.statuses) > 4096:
                self.statuses.clear()
            self.statuses[int(parts[1])] = int(parts[2])

    def status(self, pid: int, until: float) -> Optional[int]:
        """How child ``pid`` ended, once the server has reported it by ``until``.

        The server reaps its exited children, and reports them, when a
        message comes (see ``worker._fork_server``): this sends it ``?``,
        again every :data:`NUDGE` seconds while it waits."""
        with self._lock:
            nudged = -NUDGE
            while pid not in self.statuses:
                now = time.monotonic()
                left = until - now
                try:
                    if left <= 0:
                        return None
                    if now - nudged >= NUDGE:
                        nudged = now
                        self.sock.send(b"?", socket.MSG_DONTWAIT)
                    if not select.select([self.sock], [], [], min(left, NUDGE))[0]:
                        continue
                    msg = self.sock.recv(256)
                except (OSError, ValueError):  # the server is closed
                    return None
                if not msg:
                    return None
                self._note(msg)
            return self.statuses.pop(pid)

    def nudge(self) -> None:
        """Have the server reap its exited children now (it does at each
        message, and looks for a while after one, then sleeps): the pool's
        spares thread, ending, after it has reaped the workers it discarded."""
        try:
            self.sock.send(b"?", socket.MSG_DONTWAIT)
        except OSError:  # (closed, or its buffer full: it reaps at the next message)
            pass

    def forget(self) -> None:
        """In a forked child: drop the parent's server without touching it."""
        self.sock.close()

    def close(self) -> None:
        """Close the socket: the server reaps its exited children and exits
        (killed if it has not within :data:`CLOSE_GRACE` seconds)."""
        with self._lock:
            self._closed = self.retired = True
        try:
            self.sock.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=CLOSE_GRACE)
            except subprocess.TimeoutExpired:
                try:
                    self.proc.kill()
                    self.proc.wait(timeout=5.0)
                except (OSError, subprocess.TimeoutExpired):
                    pass


def _kill_stale(pidfd: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(pidfd)


class ForkedProc:
    """A fork server's child as a :class:`subprocess.Popen` look-alike: ``pid``,
    ``returncode``, ``poll``, ``wait``, ``kill``, ``send_signal``; every signal
    goes through the pidfd, so it reaches this process or none."""

    def __init__(self, server: ForkServer, pid: int, pidfd: int) -> None:
        self.server = server
        self.pid = pid
        self.pidfd = pidfd
        self.returncode: Optional[int] = None

    def send_signal(self, sig: int) -> None:
        if self.pidfd >= 0:
            try:
                signal.pidfd_send_signal(self.pidfd, sig)
            except OSError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def exited(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the process to be gone (a zombie counts)."""
        return self.pidfd < 0 or bool(select.select([self.pidfd], [], [], timeout)[0])

    def poll(self) -> Optional[int]:
        if self.returncode is None and self.pidfd >= 0 and select.select([self.pidfd], [], [], 0)[0]:
            return self.wait(2.0)
        return self.returncode

    def wait(self, timeout: float) -> int:
        if self.returncode is not None:
            return self.returncode
        if self.pidfd >= 0 and not select.select([self.pidfd], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired("worker", timeout)
        code = self.server.status(self.pid, time.monotonic() + timeout)
        self.returncode = -signal.SIGKILL if code is None else code
        self.close()
        return self.returncode

    def close(self, release: bool = True) -> None:
        """Close the pidfd (the process is gone, or no longer ours) and, the
        first time, give back its hold on the server (``release``: false in a
        forked copy of the host, which must leave the server alone)."""
        fd, self.pidfd = self.pidfd, -1
        if fd >= 0:
            os.close(fd)
            if release:
                self.server.release()


def poll_seconds(until: float, cancel: Optional[Cancel]) -> float:
    """How long one poll may last: until ``until``, or :data:`CANCEL_POLL`
    when there is a ``cancel`` to look at; :class:`Expired` past ``until``,
    :class:`Stopped` once ``cancel`` is set."""
    timeout = until - time.monotonic()
    if timeout <= 0:
        raise Expired
    if cancel is not None:
        if cancel.is_set():
            raise Stopped("cancelled", CANCELLED)
        timeout = min(timeout, CANCEL_POLL)
    return timeout


class Worker:
    """One worker process and its pipes. One run at a time uses it; the pool's
    lock guards the hand-over between runs."""

    #: :meth:`wait_readable`'s poll of the answers' pipe and a wake pipe: ((fds), poll).
    _both_poll: Optional[tuple[tuple[int, int], Any]] = None

    def __init__(
        self,
        name: str,
        python: str,
        cwd: str,
        server: Optional[ForkServer],
        options: dict[str, Any],
        background: bool = False,
    ) -> None:
        """Start the process (``background``: a spare, booting at the lowest
        priority until it is ready); :meth:`hello` says when it is. A
        ``server`` must be held (:meth:`ForkServer.hold`): the child takes
        the hold over, or it is released here if there is none."""
        self.name = name
        self._server = server
        self.runs = 0
        self.domain: Any = None  # the trust domain it has served, if any
        self.cap: Optional[int] = None  # RLIMIT_AS, set by the worker's first run
        self.ready = False  # its hello has been read
        self.prepared = False  # its hello said the first run's context is ready
        self.busy = False  # a run or its starter holds it (the pool's lock guards this)
        #: The keys of the names texts it holds: from its fork server at its
        #: fork, then its last run's (``worker.py``'s run frame).
        self.names_held: frozenset[bytes] = frozenset()
        self.os_bounds: Optional[dict[str, Any]] = None
        self.buf = bytearray()
        self.fd_in = self.fd_out = self.lifeline = -1
        fds: list[int] = []
        self.proc: Any = None
        try:
            to_worker = os.pipe()
            fds += to_worker
            from_worker = os.pipe()
            fds += from_worker
            lifeline = os.pipe()
            fds += lifeline
            self.proc = self._start(
                python, cwd, server, {**options, "background": background}, to_worker[0], from_worker[1], lifeline[0]
            )
            _close_all((to_worker[0], from_worker[1], lifeline[0]))
            fds = [to_worker[1], from_worker[0], lifeline[1]]
            os.set_blocking(to_worker[1], False)
            _widen(to_worker[1])
            # Read only once poll() says a frame is there, or while spinning (see _spin).
            os.set_blocking(from_worker[0], False)
            self._in_poll = select.poll()
            self._in_poll.register(to_worker[1], select.POLLOUT)
            self._out_poll = select.poll()
            self._out_poll.register(from_worker[0], select.POLLIN)
        except BaseException:  # KeyboardInterrupt included: nothing leaks
            self._abandon(fds)
            raise
        self.fd_in, self.fd_out, self.lifeline = fds
        self.missed = False  # the last receive's spin ran out before the answer came
        #: The host's check of the running program's CPU time (a run with a budget), or None.
        self.cpu_watch: Optional[CpuWatch] = None

    def _abandon(self, fds: list[int]) -> None:
        """Start-up failed part way: kill the process if there is one, close every descriptor."""
        _close_all(fds)
        proc = self.proc
        if isinstance(proc, ForkedProc):
            proc.kill()
            proc.close()
        elif proc is None and self._server is not None:
            self._server.release()  # the caller's hold, which no child took
        elif proc is not None:
            proc.kill()
            proc.wait()

    def _start(
        self,
        python: str,
        cwd: str,
        server: Optional[ForkServer],
        options: dict[str, Any],
        fd_in: int,
        fd_out: int,
        life: int,
    ) -> Any:
        if server is not None:
            # (The caller's hold on the server passes to the child.)
            try:
                pid, pidfd, self.names_held = server.spawn(self.name, (fd_in, fd_out, life), options["background"])
            except OSError as exc:
                raise RunCodeError(f"could not start a worker process ({python}): {exc}") from None
            return ForkedProc(server, pid, pidfd)
        argv = [python, "-I", "-S", "-B", "-c", BOOT, WORKER_SCRIPT, self.name, quickjs_origin(), str(life)]
        argv.append(json.dumps(options))
        try:
            return subprocess.Popen(
                argv,
                stdin=fd_in,
                stdout=fd_out,
                stderr=subprocess.DEVNULL,
                pass_fds=(life,),
                close_fds=True,
                cwd=cwd,
                env=worker_env(),
                start_new_session=True,  # a process group of its own
            )
        except OSError as exc:
            raise RunCodeError(f"could not start a worker process ({python}): {exc}") from None

    def offer_names(self, key: bytes, text: bytes) -> None:
        """Offer a names text this worker was sent to its fork server, if it
        has one (see :meth:`ForkServer.offer_names`)."""
        if self._server is not None:
            self._server.offer_names(key, text)

    def hello(self, until: float) -> None:
        try:
            op, body = self.receive(until, None, max_frame=1 << 20)
        except Expired:
            raise StartTimeout from None
        except (Died, Garbled):
            raise RunCodeError(f"a worker process exited before it started ({self.exit_reason()})") from None
        if op == worker.FATAL:
            raise RunCodeError("a worker process could not start: " + clip(body.decode("utf-8", "replace"), 2000))
        if op != worker.HELLO:
            raise RunCodeError("a worker process broke the protocol while starting")
        try:
            hello = json.loads(body)
            bounds = hello["os_bounds"]
        except (ValueError, KeyError, TypeError):
            raise RunCodeError("a worker process broke the protocol while starting") from None
        if isinstance(bounds, dict):
            self.os_bounds = bounds
        self.prepared = hello.get("prepared") is True
        self.ready = True

    def send(self, data: "bytes | memoryview", until: float) -> None:
        """Write one frame; :class:`Expired` if the pipe stays full past ``until``."""
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd_in, view) :]
                continue
            except BlockingIOError:
                pass
            timeout = until - time.monotonic()
            if timeout <= 0 or not self._in_poll.poll(ms(timeout)):
                if time.monotonic() >= until:
                    raise Expired

    def offer(self, data: bytes) -> int:
        """Write what the pipe takes of ``data`` now, without waiting; how many
        bytes that was (a frame the pipe's free buffer holds goes whole).
        ``OSError`` (``BrokenPipeError``: the worker is gone) as ``os.write``."""
        try:
            return os.write(self.fd_in, data)
        except BlockingIOError:
            return 0

    def wait_readable(self, until: float, cancel: Optional[Cancel], wake: int) -> bool:
        """Wait until the worker has written (true) or ``wake`` is readable
        (false; what it held is read); :class:`Expired` past ``until``,
        :class:`Stopped` once ``cancel`` is set, as :meth:`receive`."""
        if self.buf:
            return True
        key = (self.fd_out, wake)
        both = self._both_poll
        if both is None or both[0] != key:
            poll = select.poll()
            poll.register(self.fd_out, select.POLLIN)
            poll.register(wake, select.POLLIN)
            both = self._both_poll = (key, poll)
        poll = both[1]
        while True:
            ready = poll.poll(ms(poll_seconds(until, cancel)))
            if not ready:
                continue
            woken = False
            for fd, _ in ready:
                if fd != wake:
                    return True
                woken = True
            if woken:
                try:
                    os.read(wake, 64)
                except BlockingIOError:
                    pass
                return False

    def receive(
        self, until: float, cancel: Optional[Cancel], max_frame: int, spin: float = 0.0, ready: bool = False
    ) -> tuple[bytes, bytes]:
        """One frame; :class:`Expired` past ``until``, :class:`Died` at end of
        file, :class:`Garbled` for a frame over ``max_frame`` bytes, and
        :class:`Stopped` (``cancelled``) once ``cancel`` is set. ``spin``: seconds
        to look for the frame before sleeping (see ``_Remote._spin``);
        ``ready``: the caller knows the worker has written (read before any
        poll). A large frame is read straight into one buffer of its size: the
        host holds one copy of it while reading."""
        if not self.buf:
            data = self._spin(spin) if spin else None
            if data is None and ready:
                try:
                    data = os.read(self.fd_out, 65536)
                except BlockingIOError:
                    pass
                else:
                    if not data:
                        raise Died
            if data is None:
                data = self._read_some(until, cancel, 65536)
            if len(data) >= 5 and worker.HEADER.unpack_from(data)[0] == len(data) - 4:
                return data[4:5], data[5:]  # the usual case: one read, one whole frame
            self.buf += data
        return self._assemble(until, cancel, max_frame)

    def envelopes(self, at_most: int, max_frame: int, quiet: str) -> list[str]:
        """The texts of the whole ``E`` frames at the head of what has been
        read already, at most ``at_most``, taken off it without reading more:
        a batch's answers, which the worker writes at once. ``quiet`` is the
        text most of them hold (a step that changed nothing): each of those is
        that very string, told by its bytes, not decoded. Stops at anything
        else (another op, a frame cut short, a header :meth:`receive`
        refuses, a body that is not UTF-8), which stays for :meth:`receive`."""
        buf = self.buf
        end = len(buf)
        texts: list[str] = []
        if end < 5:
            return texts
        quiet_frame = worker.frame(worker.ENVELOPE, quiet.encode("utf-8", "surrogatepass"))
        size = len(quiet_frame)
        starts = buf.startswith
        unpack = worker.HEADER.unpack_from
        envelope = worker.ENVELOPE[0]
        at = 0
        while len(texts) < at_most:
            if starts(quiet_frame, at):
                texts.append(quiet)
                at += size
                continue
            if end - at < 5:
                break
            (n,) = unpack(buf, at)
            stop = at + 4 + n
            if n == 0 or n > max_frame or stop > end or buf[at + 4] != envelope:
                break
            try:
                texts.append(str(memoryview(buf)[at + 5 : stop], "utf-8", "surrogatepass"))
            except UnicodeDecodeError:
                break  # (not UTF-8: receive() hands it on, to fail as any answer that is not)
            at = stop
        if at:
            del buf[:at]  # once per batch, not once per frame
        return texts

    def _read_some(self, until: float, cancel: Optional[Cancel], n: int) -> bytes:
        while not self._readable(until, cancel):
            pass
        data = os.read(self.fd_out, n)
        if not data:
            raise Died
        return data

    def _assemble(self, until: float, cancel: Optional[Cancel], max_frame: int) -> tuple[bytes, bytes]:
        buf = self.buf
        while len(buf) < 4:
            buf += self._read_some(until, cancel, 65536)
        (n,) = worker.HEADER.unpack_from(buf)
        if n == 0 or n > max_frame:
            raise Garbled
        while len(buf) < 5:
            buf += self._read_some(until, cancel, 65536)
        op = bytes(buf[4:5])
        if len(buf) >= 4 + n:
            body = bytes(buf[5 : 4 + n])
            del buf[: 4 + n]
            return op, body
        large = bytearray(n - 1)
        have = len(buf) - 5
        large[:have] = buf[5:]
        view = memoryview(large)
        try:
            while have < len(large):
                while not self._readable(until, cancel):
                    pass
                got = os.readv(self.fd_out, [view[have:]])
                if not got:
                    raise Died
                have += got
        except BaseException:
            # Cut mid-frame (the deadline, a cancel: the caller reads on after a
            # soft stop; an interrupt): what was read of it stays at the head of
            # the buffer, so the next read goes on with this frame, not inside it.
            del view
            buf[5:] = large[:have]
            raise
        del view
        buf.clear()
        return op, large  # type: ignore[return-value]

    def _readable(self, until: float, cancel: Optional[Cancel]) -> bool:
        """Whether the worker's pipe has data after one poll, which lasts until
        ``until`` or :data:`CANCEL_POLL`, whichever is sooner; :class:`Expired`
        past ``until``, :class:`Stopped` once ``cancel`` is set; with a
        :attr:`cpu_watch`, no later than its next look, and :class:`CpuSpent`
        once the worker has used its CPU time."""
        watch = self.cpu_watch
        if watch is not None and watch.due < until:
            if time.monotonic() >= watch.due and watch.spent():
                raise CpuSpent
            return bool(self._out_poll.poll(ms(poll_seconds(min(until, watch.due), cancel))))
        return bool(self._out_poll.poll(ms(poll_seconds(until, cancel))))

    def _spin(self, seconds: float) -> Optional[bytes]:
        """What the worker has written within ``seconds``, looking without
        sleeping; ``None`` (and :attr:`missed` set) if nothing came."""
        read, fd, clock = os.read, self.fd_out, time.perf_counter
        end = clock() + seconds
        while True:
            try:
                data = read(fd, 65536)
            except BlockingIOError:
                if clock() < end:
                    continue
                self.missed = True
                return None
            self.missed = False
            return data

    def park(self, parked: bool) -> None:
        """Stop the process where it is (``SIGSTOP``: its CPU share is another
        run's for a while), or let it go on (``SIGCONT``). Nothing once it is
        reaped. The program cannot tell: a stop is no signal it can catch,
        and its clock (its deadline's) goes on meanwhile."""
        self.signal(signal.SIGSTOP if parked else signal.SIGCONT)

    def signal(self, sig: int) -> None:
        """``SIGUSR1``: the run's deadline has passed; ``SIGUSR2``: it is
        cancelled; ``SIGSTOP``, ``SIGCONT``: see :meth:`park`."""
        if self.proc.returncode is None:  # not reaped, so the pid is still this process
            try:
                self.proc.send_signal(sig)
            except OSError:
                pass

    def finish_run(self) -> bool:
        """Tell the worker the run is over (it frees the context); false if it is gone."""
        try:
            os.write(self.fd_in, worker.frame(worker.DONE, b""))
        except OSError:
            return False
        return self.proc.poll() is None

    def exit_reason(self) -> str:
        try:
            code = self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            return "it stopped answering"
        return _exit_text(code)

    def terminate(self) -> None:
        """Kill the process (``SIGKILL``), as a process group when it was spawned, and nothing more."""
        if self.proc.returncode is None:
            try:
                if isinstance(self.proc, ForkedProc):
                    self.proc.kill()  # it cannot start processes: its group is itself
                else:
                    os.killpg(self.proc.pid, signal.SIGKILL)  # not reaped, so the group is still its
            except OSError:
                pass

    @property
    def forked(self) -> bool:
        """A fork server's child (:meth:`discard` leaves it to :meth:`gone`), not a spawned process."""
        return isinstance(self.proc, ForkedProc)

    def discard(self) -> bool:
        """After a finished run: kill it and close the pipes. True if it is a
        fork server's child, to be waited for with :meth:`gone` (its pidfd
        stays open until then); a spawned worker is reaped here."""
        if isinstance(self.proc, ForkedProc):
            self.terminate()
            self._close_fds()
            return True
        self.kill()
        return False

    def gone(self, timeout: float) -> None:
        """Wait (up to ``timeout``) until a discarded fork server's child has exited."""
        if isinstance(self.proc, ForkedProc):
            self.proc.exited(timeout)
            self.proc.close()

    def kill(self) -> None:
        """Kill the process, reap it, close the pipes. Idempotent."""
        if self.proc.returncode is None:
            self.terminate()
            try:
                self.proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:  # in the kernel's hands; reaped by a later Popen
                pass
        self._close_fds()

    def forget(self) -> None:
        """In a forked child: drop this (the parent's) worker without touching it."""
        self._close_fds()
        if isinstance(self.proc, ForkedProc):
            self.proc.close(release=False)

    def _close_fds(self) -> None:
        for name in ("fd_in", "fd_out", "lifeline"):
            fd = getattr(self, name, -1)
            if fd >= 0:
                setattr(self, name, -1)
                try:
                    os.close(fd)
                except OSError:
                    pass

"""The worker-process runtime: a pool of warm worker processes that run programs.

:class:`WorkerPool` is a :class:`~nous_sched.CodeRuntime`. Each run borrows one
idle worker (:mod:`nous_sched.runtime.worker`) for its whole length, one run
per worker at a time. The JavaScript runs in the worker; everything else stays
in the host, on the calling thread: :func:`~nous_sched.runtime.engine.drive`
checks every envelope the worker sends, keeps the logs within budget, hands
calls to the :class:`~nous_sched.runtime.Host` (scheduler, tools, approval,
audit) and sends back the oldest call's outcome. One step is one pipe round
trip, and no timer wakes anything. ``run_code`` starts the program in
its worker (:meth:`WorkerPool.begin`) before it builds the run's scheduler, so
the worker compiles it and runs it to its first call meanwhile. On an
otherwise idle machine the driving thread looks for each answer for up to
:data:`SPIN` before it sleeps on the pipe (see ``_Remote._spin``).

The deadline holds whatever the program does. The engine's own limit stops a
runaway program first (a soft stop: the worker drains the logs it still held
and stays in the pool). If the worker has not answered by the deadline plus
:attr:`WorkerPool.kill_grace`, the host kills it with ``SIGKILL``, answers
``timeout`` with the logs of every step so far, and replaces it.

A worker that dies (a signal, the OOM killer, an engine crash) gives its run
an ``abort`` error with its logs; the pool replaces it. Workers are retired
after a memory stop (the freed heap goes back to the OS with the process) and
after :attr:`WorkerPool.runs_per_worker` runs.
"""

from __future__ import annotations

import atexit
import importlib.util
import itertools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Any, Optional, Sequence

from .. import _validators as v
from .._validators import require
from ..errors import RunCodeError
from ..result import RunError
from . import Cancel, Host, Limits, RuntimeOutcome, worker
from .engine import CANCEL_POLL, CANCELLED, Finish, Stopped, clip, drive, memory_message, timeout_message

__all__ = ["Begun", "WorkerPool", "default_pool"]

_WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
_MIB = 1024 * 1024
_KINDS_FROM_WORKER = frozenset({"exception", "timeout", "abort"})
_numbers = itertools.count(1)
_START_METHODS = v.one_of(("spawn",))
_GRACE = v.Check("a number of seconds from 0 to 60", lambda x: v.WAIT_SECONDS.accepts(x) and x is not None and x <= 60)
_HEADROOM = v.int_at_least(16 * _MIB, "an int of at least 16 MiB (16777216)")
#: How long the driving thread looks for a worker's answer before it sleeps
#: (see :meth:`_Remote._spin`), and the fewest and most steps it then sleeps
#: at once after an answer took longer than that (doubling while they do).
SPIN = 100e-6
SPIN_BACKOFF = 16
SPIN_BACKOFF_MAX = 4096
#: How often the host repeats the deadline signal until the worker answers.
#: The worker ignores a signal that arrives before *its* deadline, which is
#: later than the host's by the run frame's transit, and one that arrives
#: before the run is armed: a single signal is easily lost on a loaded machine.
RESIGNAL = 0.05
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class WorkerPool:
    """A pool of warm worker processes that run programs: the default runtime.

    Thread-safe: any number of threads may call :meth:`run` at once; each run
    gets a worker of its own, waiting for one when all ``size`` are busy.
    **Waiting for a free worker counts against the run's deadline**: a run
    that waits out its whole ``timeout`` in the queue returns ``timeout``
    without starting.

    :param size: most worker processes alive at once, so most runs at once
        (default 32). Workers start lazily, on first need, and stay warm: an
        idle worker holds about 15 MB of RSS, half of it shared with the others.
    :param start_method: ``"spawn"``: each worker is a fresh interpreter
        (``python -I -S -B``), started with ``subprocess``; the only method.
    :param runs_per_worker: a worker is replaced after this many runs.
    :param kill_grace: seconds past a run's deadline before its worker is
        killed, giving the engine's own limit time to stop the program
        softly, with its last logs.
    :param memory_headroom: the OS limit on a worker's memory (``RLIMIT_DATA``),
        set by its first run, is twice that run's ``Limits.memory_bytes`` (the
        engine's heap, and one copy of the largest message the host sends it)
        plus this many bytes for the interpreter itself. A later run that
        needs more gets another worker.
    :param start_timeout: seconds a new worker may take to say hello before
        :meth:`run` raises :class:`~nous_sched.RunCodeError`.
    :param python: the interpreter to run workers with (default
        ``sys.executable``); set it when that is not a Python (an embedding
        server such as uWSGI).
    """

    language = "javascript"

    def __init__(
        self,
        size: Optional[int] = None,
        *,
        start_method: str = "spawn",
        runs_per_worker: int = 1000,
        kill_grace: float = 0.5,
        memory_headroom: int = 64 * _MIB,
        start_timeout: float = 10.0,
        python: Optional[str] = None,
    ) -> None:
        if size is None:
            size = 32
        require("WorkerPool", "size", size, v.POSITIVE_INT)
        require("WorkerPool", "start_method", start_method, _START_METHODS)
        require("WorkerPool", "runs_per_worker", runs_per_worker, v.POSITIVE_INT)
        require("WorkerPool", "kill_grace", kill_grace, _GRACE)
        require("WorkerPool", "memory_headroom", memory_headroom, _HEADROOM)
        require("WorkerPool", "start_timeout", start_timeout, v.SECONDS)
        require("WorkerPool", "python", python, v.OPTIONAL_STR)
        self.size = size
        self.start_method = start_method
        self.runs_per_worker = runs_per_worker
        self.kill_grace = float(kill_grace)
        self.memory_headroom = memory_headroom
        self.start_timeout = float(start_timeout)
        self.python = python or sys.executable
        self._reset()
        _POOLS.add(self)

    def _reset(self) -> None:
        # _lock guards _idle, _workers, _closed and _empty_dir; _cond (on _lock)
        # is notified whenever a worker becomes idle or a place frees up.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        # FIFO: the worker idle longest has had the most time to prepare the
        # next run's context (it does so after each run).
        self._idle: list[_Worker] = []
        self._workers: set[_Worker] = set()  # every live worker, idle or busy
        self._starting = 0  # places held for workers whose process is being started
        self._closed = False
        self._empty_dir: Optional[str] = None
        self._owner = os.getpid()
        # When to look for a worker's answer without sleeping (_Remote._spin):
        # steps left to sleep at once, and the next miss's count. Pool-wide, as
        # what they judge (is there a CPU to spare?) is the machine's, and
        # unguarded: a lost update only moves the next spin by a step.
        self._spin_cool = 0
        self._spin_backoff = SPIN_BACKOFF
        self._load_read = float("-inf")  # when _load_low was last read
        self._load_low = False
        self.os_bounds: Optional[dict[str, Any]] = None

    # -- the runtime ---------------------------------------------------------

    def run(self, program: str, host: Host, limits: Limits) -> RuntimeOutcome:
        """Run ``program`` in a worker; the calling thread drives it.

        :raises RunCodeError: no worker could be started, or the pool is closed.
        """
        return self.begin(program, host.names, limits, getattr(host, "cancel", None)).run(host)

    def begin(self, program: str, names: Sequence[str], limits: Limits, cancel: Optional[Cancel] = None) -> "Begun":
        """Start ``program`` in a worker now, before the host that will serve its
        calls exists; :meth:`run` in two halves.

        The worker compiles and starts the program while the caller builds the
        host (``run_code`` builds the run's scheduler meanwhile). Then exactly
        one of :meth:`Begun.run` (with a host whose ``names`` are ``names`` and
        whose ``cancel`` is ``cancel``) or :meth:`Begun.abandon` must follow.
        The run's deadline counts from here.

        :raises RunCodeError: no worker could be started, or the pool is closed.
        """
        deadline = time.monotonic() + limits.timeout
        need = self._cap(limits)
        while True:
            try:
                worker_ = self._acquire(need, limits, deadline, cancel)
            except Stopped as stop:
                return Begun(self, None, limits, deadline, cancel, Finish((), error=(stop.kind, stop.message)))
            remote = _Remote(self, worker_, program, names, limits, deadline, cancel)
            try:
                remote.send_run()
            except _NotStarted:
                self._release(worker_, False)
                continue  # the worker was dead before the run began: take another
            except BaseException:
                self._release(worker_, False, replace=False)
                raise
            return Begun(self, remote, limits, deadline, cancel)

    def close(self) -> None:
        """Kill every worker and refuse new runs. Runs in flight end with ``abort``.
        Idempotent; called for every pool at interpreter exit."""
        with self._lock:
            self._closed = True
            idle = self._idle
            busy = [w for w in self._workers if w not in idle]
            self._workers.clear()
            self._idle = []
            self._cond.notify_all()
            empty, self._empty_dir = self._empty_dir, None
        for w in idle:
            w.kill()
        for w in busy:
            # Its run owns the pipes: it reads end-of-file, answers ``abort``
            # and closes them (closing them here could hand their numbers to
            # another open while that run still uses them).
            w.terminate()
        if empty is not None and self._owner == os.getpid():
            shutil.rmtree(empty, ignore_errors=True)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _idle_machine(self) -> bool:
        """Whether the 1-minute load average leaves a CPU idle (re-read once a second)."""
        now = time.monotonic()
        if now >= self._load_read + 1.0:
            self._load_read = now
            try:
                self._load_low = os.getloadavg()[0] < _CPUS - 0.25
            except (AttributeError, OSError):
                self._load_low = False
        return self._load_low

    def _cap(self, limits: Limits) -> int:
        # The engine's heap, one copy of the largest message the host sends
        # (the host refuses larger), and the interpreter itself.
        return 2 * limits.memory_bytes + self.memory_headroom

    def prestart(self, n: Optional[int] = None) -> None:
        """Start ``n`` workers (default ``size``) now and wait for each to say hello,
        so the first runs find them warm.

        :raises RunCodeError: a worker could not start.
        """
        n = self.size if n is None else min(n, self.size)
        started = []
        with self._lock:
            room = n - len(self._workers) - self._starting
        for _ in range(max(room, 0)):
            w = self._spawn()
            if w is None:
                break
            started.append(w)
        for w in started:
            try:
                w.hello(time.monotonic() + self.start_timeout)
            except BaseException:
                self._release(w, False, replace=False)
                raise
            with self._lock:
                if w in self._workers:
                    self._idle.append(w)
                    self._cond.notify()

    def pids(self) -> list[int]:
        """The process ids of the live workers (for monitoring and tests)."""
        with self._lock:
            return sorted(w.proc.pid for w in self._workers)

    def __repr__(self) -> str:
        return f"WorkerPool(size={self.size}, runs_per_worker={self.runs_per_worker})"

    # -- workers ---------------------------------------------------------------

    def _acquire(self, need: int, limits: Limits, deadline: float, cancel: Any) -> "_Worker":  # noqa: C901 - owned by the pool/engine rework
        while True:
            spawn = False
            retire: Optional[_Worker] = None
            with self._lock:
                while True:
                    if self._closed:
                        raise RunCodeError("the worker pool is closed")
                    fit = self._best_fit(need)
                    if fit is not None:
                        w = self._idle.pop(fit)
                        break
                    if len(self._workers) + self._starting < self.size:
                        spawn = True
                        break
                    if self._idle:
                        # Every idle worker's memory cap is too low for this run: replace one.
                        retire = self._idle.pop()
                        self._workers.discard(retire)
                        spawn = True
                        break
                    remaining = deadline - time.monotonic()
                    if cancel is not None and cancel.is_set():
                        raise Stopped("cancelled", CANCELLED)
                    if remaining <= 0:
                        raise Stopped("timeout", timeout_message(limits.timeout, "waiting for a free worker process"))
                    self._cond.wait(min(remaining, CANCEL_POLL) if cancel is not None else remaining)
            if retire is not None:
                retire.kill()
            if spawn:
                fresh = self._spawn()
                if fresh is None:
                    raise RunCodeError("the worker pool is closed")
                w = fresh
            elif w.proc.poll() is not None:
                self._release(w, False, replace=False)
                continue
            try:
                if not w.ready:
                    w.hello(min(deadline, time.monotonic() + self.start_timeout))
            except _StartTimeout:
                self._release(w, False, replace=False)
                if time.monotonic() >= deadline:
                    raise Stopped(
                        "timeout", timeout_message(limits.timeout, "waiting for a worker process to start")
                    ) from None
                raise RunCodeError(
                    f"a worker process did not start within {self.start_timeout:g}s ({self.python})"
                ) from None
            except BaseException:  # RunCodeError (it could not start), KeyboardInterrupt
                self._release(w, False, replace=False)
                raise
            return w

    def _best_fit(self, need: int) -> Optional[int]:
        """The index of the idle worker to use for a run that needs a memory cap
        of ``need``: the one idle longest (it has had the most time to prepare
        the next context) among those whose cap holds it or that have none yet.
        Called with ``_lock`` held."""
        for i, idle in enumerate(self._idle):
            if idle.cap is None or idle.cap >= need:
                return i
        return None

    def _spawn(self) -> Optional["_Worker"]:
        with self._lock:
            refused = self._closed  # (a local, so the check below reads the field again)
            if refused:
                return None
            if self._empty_dir is None:
                self._empty_dir = tempfile.mkdtemp(prefix="nous-sched-cwd-")
            cwd = self._empty_dir
            self._starting += 1  # hold the place while the process starts
        try:
            w = _Worker(self, next(_numbers), cwd)
        except BaseException:
            with self._lock:
                self._starting -= 1
                self._cond.notify()
            raise
        with self._lock:
            self._starting -= 1
            closed = self._closed
            if not closed:
                self._workers.add(w)
        if closed:
            w.kill()
            return None
        return w

    def _release(self, w: "_Worker", reusable: bool, replace: bool = True) -> None:
        if reusable:
            w.runs += 1
            reusable = w.runs < self.runs_per_worker and w.finish_run()
        if reusable:
            with self._lock:
                if not self._closed and w in self._workers:
                    self._idle.append(w)
                    self._cond.notify()
                    return
        with self._lock:
            known = w in self._workers
            self._workers.discard(w)
            self._cond.notify()
            replace = replace and known and not self._closed
        w.kill()
        if replace:
            # Keep the pool warm: the replacement starts now and says hello by
            # the time the next run needs it.
            try:
                fresh = self._spawn()
            except (OSError, RunCodeError):
                return
            if fresh is not None:
                with self._lock:
                    if fresh in self._workers and not self._closed:
                        self._idle.append(fresh)
                        self._cond.notify()

    def _after_fork_in_child(self) -> None:
        # The workers belong to the parent: forget them (closing our copies of
        # their pipes) without killing them. The child starts its own on demand.
        for w in list(self._workers):
            w.forget()
        self._reset()


class Begun:
    """A program started in a worker by :meth:`WorkerPool.begin`, waiting for its host."""

    def __init__(
        self,
        pool: WorkerPool,
        remote: Optional["_Remote"],
        limits: Limits,
        deadline: float,
        cancel: Any,
        early: Optional[Finish] = None,
    ) -> None:
        self._pool = pool
        self._remote = remote
        self._limits = limits
        self._deadline = deadline
        self._cancel = cancel
        self._early = early  # how it ended before it began (no worker in time, cancelled)

    def run(self, host: Host) -> RuntimeOutcome:
        """Drive the program to its end with ``host``, on the calling thread."""
        remote, self._remote = self._remote, None
        if remote is None:
            if self._early is None:
                raise RuntimeError("this run was already driven or abandoned")
            return _outcome(self._early)
        w = remote.worker
        try:
            finish = drive(remote, host, self._limits, self._deadline, self._cancel)
        except BaseException:
            # KeyboardInterrupt (or a host bug): the worker may be mid-step. Kill
            # it, replace it later, and let the exception go on at once.
            self._pool._release(w, False, replace=False)
            raise
        # After any abort (memory, stack, a tampered bridge) the worker is retired.
        self._pool._release(w, remote.reusable and (finish.error is None or finish.error[0] != "abort"))
        return _outcome(finish)

    def abandon(self) -> None:
        """Never drive it: its worker is killed (the answer it is writing will never
        be read) and replaced. Idempotent."""
        remote, self._remote = self._remote, None
        if remote is not None:
            self._pool._release(remote.worker, False)


def _outcome(finish: Finish) -> RuntimeOutcome:
    error = None if finish.error is None else RunError(*finish.error)
    return RuntimeOutcome(finish.logs, result=finish.result, error=error)


class _NotStarted(Exception):
    """The worker was gone before it received the run."""


class _StartTimeout(Exception):
    pass


class _Expired(Exception):
    pass


class _Died(Exception):
    pass


class _Garbled(Exception):
    pass


class _Worker:
    """One worker process and its pipes. One run at a time uses it; the pool's
    lock guards the hand-over between runs."""

    def __init__(self, pool: WorkerPool, number: int, cwd: str) -> None:
        self.name = f"nous-sched-worker-{number}"
        self.pool = pool
        self.runs = 0
        self.cap: Optional[int] = None  # RLIMIT_DATA, set by the worker's first run
        self.ready = False
        self.buf = bytearray()
        self.max_frame = 0
        spec = importlib.util.find_spec("_quickjs")
        if spec is None or not spec.origin:
            raise RunCodeError(
                "no code runtime is configured: the worker processes need quickjs-ng "
                "(`pip install quickjs-ng`), which provides the `_quickjs` module"
            )
        to_worker = os.pipe()
        from_worker = os.pipe()
        lifeline = os.pipe()
        env = {"MALLOC_ARENA_MAX": "1"}
        if "LD_LIBRARY_PATH" in os.environ:  # some Python builds need it to start
            env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
        argv = [pool.python, "-I", "-S", "-B", _WORKER_SCRIPT, self.name, spec.origin, str(lifeline[0])]
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=to_worker[0],
                stdout=from_worker[1],
                stderr=subprocess.DEVNULL,
                pass_fds=(lifeline[0],),
                close_fds=True,
                cwd=cwd,
                env=env,
            )
        except OSError as exc:
            for fd in (*to_worker, *from_worker, *lifeline):
                os.close(fd)
            raise RunCodeError(f"could not start a worker process ({pool.python}): {exc}") from None
        os.close(to_worker[0])
        os.close(from_worker[1])
        os.close(lifeline[0])
        self.fd_in = to_worker[1]
        self.fd_out = from_worker[0]
        self.lifeline = lifeline[1]
        os.set_blocking(self.fd_in, False)
        # Read only once poll() says a frame is there, or while spinning (see _spin).
        os.set_blocking(self.fd_out, False)
        self.missed = False  # the last receive's spin ran out before the answer came
        self._in_poll = select.poll()
        self._in_poll.register(self.fd_in, select.POLLOUT)
        self._out_poll = select.poll()
        self._out_poll.register(self.fd_out, select.POLLIN)

    def hello(self, until: float) -> None:
        try:
            op, body = self.receive(until, None, max_frame=1 << 20)
        except _Expired:
            raise _StartTimeout from None
        except (_Died, _Garbled):
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
            self.pool.os_bounds = bounds
        self.ready = True

    def send(self, data: bytes, until: float) -> None:
        """Write one frame; :class:`_Expired` if the pipe stays full past ``until``."""
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd_in, view) :]
                continue
            except BlockingIOError:
                pass
            timeout = until - time.monotonic()
            if timeout <= 0 or not self._in_poll.poll(_ms(timeout)):
                if time.monotonic() >= until:
                    raise _Expired

    def receive(self, until: float, cancel: Any, max_frame: int, spin: float = 0.0) -> tuple[bytes, bytes]:  # noqa: C901 - owned by the pool/engine rework
        """One frame; :class:`_Expired` past ``until``, :class:`_Died` at end of
        file, :class:`_Garbled` for a frame over ``max_frame`` bytes, and
        :class:`Stopped` (``cancelled``) once ``cancel`` is set. ``spin``: seconds
        to look for the frame before sleeping (see :meth:`_Remote._spin`)."""
        buf = self.buf
        data = self._spin(spin) if spin and not buf else None
        while True:
            want = 4
            if not buf:
                # The usual case: one read brings exactly one whole frame.
                if data is None:
                    if not self._readable(until, cancel):
                        continue
                    data = os.read(self.fd_out, 65536)
                if not data:
                    raise _Died
                if len(data) >= 5:
                    (n,) = worker.HEADER.unpack_from(data)
                    if n == len(data) - 4:
                        return data[4:5], data[5:]
                buf += data
                data = None
            if len(buf) >= 4:
                (n,) = worker.HEADER.unpack_from(buf)
                if n == 0 or n > max_frame:
                    raise _Garbled
                if len(buf) >= 4 + n:
                    op = bytes(buf[4:5])
                    body = bytes(buf[5 : 4 + n])
                    del buf[: 4 + n]
                    return op, body
                want = 4 + n - len(buf)
            if not self._readable(until, cancel):
                continue
            data = os.read(self.fd_out, max(want, 65536))
            if not data:
                raise _Died
            buf += data

    def _readable(self, until: float, cancel: Any) -> bool:
        """Whether the worker's pipe has data after one poll, which lasts until
        ``until`` or :data:`CANCEL_POLL`, whichever is sooner; :class:`_Expired`
        past ``until``, :class:`Stopped` once ``cancel`` is set."""
        timeout = until - time.monotonic()
        if timeout <= 0:
            raise _Expired
        if cancel is not None:
            if cancel.is_set():
                raise Stopped("cancelled", CANCELLED)
            timeout = min(timeout, CANCEL_POLL)
        return bool(self._out_poll.poll(_ms(timeout)))

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

    def signal_deadline(self) -> None:
        """Tell the worker its run's deadline has passed (``SIGUSR1``)."""
        if self.proc.returncode is None:  # not reaped, so the pid is still this process
            try:
                os.kill(self.proc.pid, signal.SIGUSR1)
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
        if code < 0:
            try:
                sig = signal.Signals(-code).name
            except ValueError:
                sig = f"signal {-code}"
            return f"killed by {sig}"
        return f"exit status {code}"

    def terminate(self) -> None:
        """Kill the process (``SIGKILL``) and nothing more."""
        if self.proc.returncode is None:
            try:
                self.proc.kill()
            except OSError:
                pass

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

    def _close_fds(self) -> None:
        for name in ("fd_in", "fd_out", "lifeline"):
            fd = getattr(self, name, -1)
            if fd >= 0:
                setattr(self, name, -1)
                try:
                    os.close(fd)
                except OSError:
                    pass


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000) + 1)


class _Remote:
    """The engine's steps, run in a worker: what :func:`drive` calls in the host."""

    def __init__(
        self,
        pool: WorkerPool,
        w: _Worker,
        program: str,
        names: Any,
        limits: Limits,
        deadline: float,
        cancel: Any,
    ) -> None:
        self.pool = pool
        self.worker = w
        self.program = program
        self.names = names
        self.limits = limits
        self.deadline = deadline
        self.until = deadline + pool.kill_grace
        self.cancel = cancel
        self.reusable = True
        self.unsent = False  # the run frame could not be sent by the kill deadline
        # The envelope is a string inside the engine's heap; its UTF-8 form is
        # at most 1.5 times the heap's size. Anything larger is a lie.
        self.max_frame = 2 * limits.memory_bytes + _MIB

    def send_run(self) -> None:
        """Send the run frame. :class:`_NotStarted` if the worker is gone."""
        w = self.worker
        limits = self.limits
        # A worker's memory cap is set by its first run, for good: a later run
        # that needs less may use it, one that needs more gets another worker.
        cap = self.pool._cap(limits) if w.cap is None else 0
        body = json.dumps(
            {
                "program": self.program,
                "names": list(self.names),
                "limits": [getattr(limits, f) for f in worker.LIMIT_FIELDS],
                "remaining": max(self.deadline - time.monotonic(), 0.0),
                "memory_cap": cap,
            }
        ).encode("utf-8", "surrogatepass")
        try:
            w.send(worker.frame(worker.RUN, body), self.until)
        except BrokenPipeError:
            self.reusable = False
            raise _NotStarted from None
        except _Expired:
            self.unsent = True  # a timeout, said by start() (inside drive)
            return
        if cap:
            w.cap = cap

    def start(self) -> str:
        """The first step: the answer to the run frame :meth:`send_run` sent."""
        if self.unsent:
            return self._expired()
        return self._answer()

    def settle(self, call_id: int, ok: bool, payload: str) -> str:
        if len(payload) > self.limits.memory_bytes:
            # It cannot fit in the program's memory (in-process, parsing it
            # fails the same way): never send it.
            raise Stopped("abort", memory_message(self.limits.memory_bytes))
        data = worker.frame(worker.SETTLE, b"%d %d " % (call_id, ok), payload.encode("utf-8", "surrogatepass"))
        try:
            self.worker.send(data, self.until)
        except BrokenPipeError:
            return self._died()
        except _Expired:
            return self._expired()
        return self._answer()

    def _spin(self) -> float:
        """Seconds to look for the worker's answer before sleeping on the pipe.

        A worker's step after a settle takes tens of microseconds. Sleeping
        for it costs a wake-up when it answers, and on an idle machine (a
        virtual CPU halted, to be woken by the hypervisor) that wake-up alone
        costs as much as the step; every call pays it. So the driving thread
        looks for the answer for up to :data:`SPIN` first, but only while
        this pool runs fewer programs than there are CPUs and the machine is
        otherwise idle (the load average says so), so the worker has a CPU of
        its own meanwhile; on a busy machine no CPU halts and wake-ups are
        cheap, and a spin would take the worker's CPU. Not for
        :data:`SPIN_BACKOFF` steps after an answer that took longer, twice as
        many after each further miss (a program computing between calls is
        not waited for busily).
        """
        pool = self.pool
        if pool._spin_cool:
            pool._spin_cool -= 1
            return 0.0
        if len(pool._workers) - len(pool._idle) >= _CPUS or not pool._idle_machine():
            return 0.0
        return SPIN

    def _answer(self) -> str:  # noqa: C901 - owned by the pool/engine rework
        w = self.worker
        try:
            try:
                spin = self._spin()
                op, body = w.receive(self.deadline, self.cancel, self.max_frame, spin)
                if spin:
                    if w.missed:
                        w.missed = False
                        pool = self.pool
                        pool._spin_cool = pool._spin_backoff
                        pool._spin_backoff = min(2 * pool._spin_backoff, SPIN_BACKOFF_MAX)
                    else:
                        self.pool._spin_backoff = SPIN_BACKOFF
            except _Expired:
                # The deadline passed mid-step: the worker's engine stops now,
                # keeping its logs; the kill comes only if it has not by the grace.
                op, body = self._stop_softly()
        except _Expired:
            return self._expired()
        except _Died:
            return self._died()
        except _Garbled:
            return self._broken()
        except Stopped:
            self._kill()
            raise
        if op == worker.ENVELOPE:
            return body.decode("utf-8", "surrogatepass")
        if op == worker.STOPPED:
            head, _, tail = body.partition(b"\n")
            try:
                stop = json.loads(head)
                kind, message, memory = stop["kind"], stop["message"], stop["memory"]
            except (ValueError, KeyError, TypeError):
                return self._broken()
            if kind not in _KINDS_FROM_WORKER or not isinstance(message, str) or not isinstance(memory, bool):
                return self._broken()
            if memory:
                self.reusable = False
            envelope = tail.decode("utf-8", "surrogatepass") or None
            raise Stopped(kind, clip(message), envelope=envelope, memory=memory)
        return self._broken()

    def _stop_softly(self) -> tuple[bytes, bytes]:
        """Signal the worker every :data:`RESIGNAL` seconds until it answers;
        :class:`_Expired` at the kill deadline or if it dies meanwhile."""
        w = self.worker
        while True:
            w.signal_deadline()
            try:
                return w.receive(min(self.until, time.monotonic() + RESIGNAL), self.cancel, self.max_frame)
            except _Died:  # past the deadline, however it ended: a timeout
                raise _Expired from None
            except _Expired:
                if time.monotonic() >= self.until:
                    raise

    def _kill(self) -> None:
        self.reusable = False
        self.worker.kill()

    def _expired(self) -> str:
        self._kill()
        raise Stopped(
            "timeout",
            timeout_message(
                self.limits.timeout,
                f"running JavaScript; its worker process was killed {self.pool.kill_grace:g}s later",
            ),
        )

    def _died(self) -> str:
        self.reusable = False
        reason = self.worker.exit_reason()
        self.worker.kill()
        if self.worker.proc.returncode == worker.EXIT_MEMORY:
            raise Stopped("abort", memory_message(self.limits.memory_bytes, " (its worker process ran out of memory)"))
        raise Stopped("abort", f"the worker process running the program died ({reason})")

    def _broken(self) -> str:
        self._kill()
        raise Stopped("abort", "the worker process broke the protocol; it was killed")


# -- every pool in the process -----------------------------------------------------

_POOLS: "weakref.WeakSet[WorkerPool]" = weakref.WeakSet()
_default: Optional[WorkerPool] = None
_default_lock = threading.Lock()


def default_pool() -> WorkerPool:
    """The process's default :class:`WorkerPool`, created on first use."""
    global _default
    pool = _default
    if pool is None:
        with _default_lock:
            if _default is None:
                _default = WorkerPool()
            pool = _default
    return pool


def _close_all() -> None:
    for pool in list(_POOLS):
        pool.close()


def _after_fork_in_child() -> None:
    global _default_lock
    _default_lock = threading.Lock()
    for pool in list(_POOLS):
        pool._after_fork_in_child()


atexit.register(_close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

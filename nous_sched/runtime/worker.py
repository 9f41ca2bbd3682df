"""The worker process: runs programs for one host, one at a time.

The host (:mod:`nous_sched.runtime.pool`) starts it as::

    python -I -S -B worker.py NAME QUICKJS_PATH LIFELINE_FD

It imports only the standard library, the C module ``_quickjs`` (by file
path) and ``engine.py`` and ``oslimits.py`` (by file path, beside this file),
never the ``nous_sched`` package. It applies its OS bounds
(:func:`oslimits.apply`), says hello, and serves frames on standard input and
output from one thread whose stack is sized for the largest
``Limits.stack_bytes`` plus a margin, so runaway recursion always stops at the
engine's own stack limit.

Its main thread is the :class:`_Watchdog`. It waits on the *lifeline*, a pipe
the host never writes: when the host dies, it reads end-of-file and the worker
exits at once, whatever the program is doing. And it makes the engine's own
stop fire at the run's *wall-clock* deadline. The binding's only interrupt
counts process CPU time, which a starved worker accrues slower than the clock
runs, so the host's kill would often come first and lose the logs the engine
still held. When a run's deadline passes with no answer, the host sends the
worker ``SIGUSR1``; the watchdog then sets the running call's CPU budget to
zero, in the binding's context struct, and the engine stops at its next
interrupt check (within microseconds, except inside one long builtin call,
which only the host's kill ends). The struct's layout is verified when the
worker starts (:func:`_budget_offset`); where it does not match, the signal
does nothing and the engine's CPU-time limit is the soft stop.

Protocol: frames both ways, each a 4-byte big-endian length, then one ASCII
op byte, then the body. Bodies are JSON text, except where noted. Nothing is
ever unpickled.

Host to worker:

* ``R`` run: ``{"program", "names", "limits": [LIMIT_FIELDS...],
  "remaining": seconds, "memory_cap": bytes or 0}``; closes any previous
  run. A first run's ``memory_cap`` sets ``RLIMIT_DATA`` for good.
* ``S`` settle: ``b"<call id> <1|0> "`` then the payload's JSON text (the
  value, or the ``{tool, message}`` error).
* ``D`` done: free the run's context. No answer. The worker then frees it and
  prepares the next run's context as ``SCHED_BATCH``, after yielding, so this
  work never preempts the host (see :func:`_between_runs`).

Worker to host (exactly one answer to each ``R`` and ``S``):

* ``H`` hello, once: ``{"pid", "os_bounds"}``.
* ``E`` envelope: the prelude's envelope text, unchanged.
* ``X`` stopped: ``{"kind", "message", "memory"}``, a newline, then the
  salvaged envelope text (possibly empty). The run's context is gone.
* ``F`` fatal: a message (the worker could not start); then it exits.
"""

from __future__ import annotations

import os
import struct
import sys
from typing import Any

HEADER = struct.Struct(">I")
RUN = b"R"
SETTLE = b"S"
DONE = b"D"
HELLO = b"H"
ENVELOPE = b"E"
STOPPED = b"X"
FATAL = b"F"

#: The order of the limits in a ``R`` frame.
LIMIT_FIELDS = (
    "timeout",
    "memory_bytes",
    "stack_bytes",
    "max_log_bytes",
    "max_output_bytes",
    "max_args_bytes",
    "max_log_lines",
)
#: The largest ``Limits.stack_bytes`` (nous_sched.Limits refuses more).
MAX_STACK_BYTES = 4 * 1024 * 1024
#: The JS thread's stack beyond the engine's limit: the interpreter's own
#: frames below the engine, and C code that overshoots the limit check.
STACK_MARGIN = 2 * 1024 * 1024
JS_STACK = MAX_STACK_BYTES + STACK_MARGIN
#: The exit status of a worker that ran out of memory outside the engine.
EXIT_MEMORY = 3


def frame(op: bytes, *parts: bytes) -> bytes:
    """One frame whose body is ``parts`` joined (copied once)."""
    return b"".join((HEADER.pack(sum(map(len, parts)) + 1), op, *parts))


def write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    if written < len(data):  # a frame bigger than the pipe's buffer
        view = memoryview(data)[written:]
        while view:
            view = view[os.write(fd, view) :]


class _Reader:
    """Frames from a blocking descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()

    def read(self) -> tuple[bytes, bytes]:
        buf = self.buf
        if not buf:
            # The usual case: one read brings exactly one whole frame.
            data = os.read(self.fd, 65536)
            if not data:
                raise EOFError
            if len(data) >= 5 and HEADER.unpack_from(data)[0] == len(data) - 4:
                return data[4:5], data[5:]
            buf += data
        while True:
            if len(buf) >= 4:
                (n,) = HEADER.unpack_from(buf)
                if len(buf) >= 4 + n:
                    op = bytes(buf[4:5])
                    body = bytes(buf[5 : 4 + n])
                    del buf[: 4 + n]
                    return op, body
                if n > 1 << 20 and len(buf) >= 5:
                    return self._read_large(n)
            data = os.read(self.fd, 65536)
            if not data:
                raise EOFError
            buf += data

    def _read_large(self, n: int) -> tuple[bytes, bytes]:
        # A big payload: read it straight into one buffer of its size, so the
        # worker holds one copy of it, not three.
        body = bytearray(n - 1)
        have = len(self.buf) - 5
        body[:have] = self.buf[5:]
        op = bytes(self.buf[4:5])
        self.buf = bytearray()
        view = memoryview(body)
        while have < len(body):
            got = os.readv(self.fd, [view[have:]])
            if not got:
                raise EOFError
            have += got
        return op, body  # type: ignore[return-value]


def _set_thread_name(name: str) -> None:
    # prctl(PR_SET_NAME): what `top -H` and /proc/<pid>/task/*/comm show (15 bytes).
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)
        except Exception:
            pass


def _load(name: str, path: str, extension: bool = False) -> Any:
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader(name, path) if extension else None
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name} from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class _Watchdog:
    """Stops the engine at the run's wall-clock deadline; exits when the host dies.

    It runs on the main thread, which otherwise blocks reading the lifeline.
    The host sends ``SIGUSR1`` when a run's deadline passes with no answer;
    the handler (on the main thread, while the serving thread is inside the
    engine without the GIL) zeroes the running call's CPU budget. Nothing
    happens per run but two assignments under ``_lock``, which guards
    ``_target`` and is held while the budget is zeroed, so the handler never
    writes into a freed context; a late signal finds its run gone, or a run
    whose deadline is still ahead, and does nothing. A run that stopped
    disarms it before its logs are drained (the engine's ``before_salvage``):
    the host's signal often lands just as the engine stops itself, and would
    otherwise cut the drain short and lose every line the program printed.
    """

    def __init__(self, lifeline: int, offset: Any) -> None:
        import threading

        self._lifeline = lifeline
        self._offset = offset  # of the running call's CPU budget in the context, or None
        self._lock = threading.Lock()
        self._target: Any = None  # (engine, deadline)

    def arm(self, engine: Any, deadline: float) -> None:
        with self._lock:
            self._target = (engine, deadline)

    def disarm(self) -> None:
        with self._lock:
            self._target = None

    def _on_deadline(self, signum: int, frame: Any) -> None:
        import ctypes
        import time

        if self._offset is None:
            return
        with self._lock:
            target = self._target
            if target is None or time.monotonic() < target[1]:
                return
            ctx = target[0].ctx
            if ctx is not None:
                ctypes.c_int64.from_address(id(ctx) + self._offset).value = 0
            del ctx, target

    def install(self) -> None:
        """On the main thread, before any run: from here on ``SIGUSR1`` is ours."""
        import signal

        signal.signal(signal.SIGUSR1, self._on_deadline)

    def watch(self) -> None:
        """Serve the deadline signal until the host is gone (end of file)."""
        while True:
            try:
                if not os.read(self._lifeline, 1):
                    os._exit(0)
            except OSError:
                os._exit(0)


def _budget_offset(quickjs: Any) -> Any:
    """Where the binding keeps the running call's CPU budget in a context
    (quickjs-ng's ``RuntimeData.interrupt_data.limit``), or ``None`` unless
    the layout is exactly the one expected."""
    import ctypes

    if ctypes.sizeof(ctypes.c_long) != 8 or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    try:
        ctx = quickjs.Context()
        base = id(ctx)

        def i32(offset: int) -> int:
            return ctypes.c_int32.from_address(base + offset).value

        def i64(offset: int) -> int:
            return ctypes.c_int64.from_address(base + offset).value

        # runtime and context pointers, has_time_limit, time_limit, then interrupt_data {start, limit}.
        if not i64(16) or not i64(24) or i32(32) != 0:
            return None
        ctx.set_time_limit(12.5)
        if i32(32) != 1 or i64(40) != 12_500_000:
            return None
        ctx.eval("1")
        if i64(64) != 12_500_000:
            return None
        ctx.set_time_limit(7.25)
        ctx.eval("2")
        if i64(64) != 7_250_000 or i64(40) != 7_250_000:
            return None
        ctx.set_time_limit(-1)
        if i32(32) != 0:
            return None
        return 64
    except Exception:
        return None


def _prepare(engine: Any) -> Any:
    try:
        return engine.prepare()
    except Exception:  # the run's Engine tries again, and reports what stops it
        return None


def _between_runs(engine: Any, done: Any, prepare: bool) -> Any:
    """Free the finished run's engine ``done`` (or ``None``) and, if ``prepare``,
    the next run's context; that context, or ``None``.

    This is most of a worker's CPU per run (the prelude's compilation alone
    is about 0.6 ms), and none of it is urgent: the next run usually goes to
    another worker. So it must not take the CPU from the host, which is
    finishing the run that just ended. Woken by ``D`` on the host's CPU, the
    thread would preempt the host for the whole preparation; instead it
    yields first and works as ``SCHED_BATCH`` (no preemption on wake-up, the
    same CPU share), then returns to the normal policy, which an unprivileged
    thread may do, so the next run's frames wake it as promptly as ever.
    """
    batch = _SCHED_BATCH is not None and _set_policy(_SCHED_BATCH)
    try:
        os.sched_yield()
        if done is not None:
            done.close()
            del done
        return _prepare(engine) if prepare else None
    finally:
        if batch:
            _set_policy(_SCHED_OTHER)


_SCHED_BATCH = getattr(os, "SCHED_BATCH", None)
_SCHED_OTHER = getattr(os, "SCHED_OTHER", 0)


def _set_policy(policy: int) -> bool:
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))  # 0: this thread (Linux)
    except (AttributeError, OSError):
        return False
    return True


def serve(engine: Any, oslimits: Any, watchdog: _Watchdog, fd_in: int, fd_out: int) -> None:  # noqa: C901 - owned by the pool/engine rework
    """Answer frames until the host closes the pipe."""
    import collections
    import json
    import time

    Limits = collections.namedtuple("Limits", LIMIT_FIELDS)  # type: ignore[misc]
    Engine, Stopped = engine.Engine, engine.Stopped
    reader = _Reader(fd_in)
    current: Any = None
    # The next run's fresh context, its prelude evaluated while this worker
    # waits (the prelude's compilation is most of a run's start-up).
    spare = _prepare(engine)
    while True:
        try:
            op, body = reader.read()
        except EOFError:
            os._exit(0)
        except MemoryError:  # half a frame read: the stream cannot be trusted any more
            os._exit(EXIT_MEMORY)
        try:
            if op == SETTLE:
                first = body.index(b" ")
                second = body.index(b" ", first + 1)
                call_id = int(body[:first])
                ok = body[first + 1 : second] == b"1"
                payload = str(memoryview(body)[second + 1 :], "utf-8", "surrogatepass")
                del body  # one copy of a big payload at a time
                text = current.settle(call_id, ok, payload)
                del payload
            elif op == RUN:
                if current is not None:
                    watchdog.disarm()
                    current.close()
                    current = None
                spec = json.loads(body)
                if spec["memory_cap"]:
                    oslimits.cap_memory(spec["memory_cap"])
                deadline = time.monotonic() + spec["remaining"]
                current = Engine(
                    spec["program"],
                    spec["names"],
                    Limits(*spec["limits"]),
                    deadline,
                    spare,
                    before_salvage=watchdog.disarm,
                )
                spare = None
                watchdog.arm(current, deadline)
                text = current.start()
            elif op == DONE:
                done, current = current, None
                if done is not None:
                    watchdog.disarm()
                spare = _between_runs(engine, done, spare is None) or spare
                del done
                continue
            else:
                raise ValueError(f"unknown op {op!r}")
        except Stopped as stop:
            done, current = current, None
            if done is not None:
                watchdog.disarm()
            head = json.dumps({"kind": stop.kind, "message": stop.message, "memory": stop.memory})
            tail = stop.envelope or ""
            write_all(fd_out, frame(STOPPED, (head + "\n" + tail).encode("utf-8", "surrogatepass")))
            # After a memory stop the host retires this worker: prepare nothing.
            prepare = spare is None and not stop.memory
        except MemoryError:
            # Outside the engine's own accounting (a huge payload's copies): the
            # OS limit. Say so, and let the host retire this worker.
            watchdog.disarm()
            current = None
            head = '{"kind": "abort", "message": "the worker process ran out of memory", "memory": true}\n'
            write_all(fd_out, frame(STOPPED, head.encode()))
            continue
        else:
            write_all(fd_out, frame(ENVELOPE, text.encode("utf-8", "surrogatepass")))
            continue
        # Out of the except block, whose exception's traceback holds the engine's frames.
        spare = _between_runs(engine, done, prepare) or spare
        del done


def main(argv: list[str]) -> None:
    name, quickjs_path, lifeline = argv[1], argv[2], int(argv[3])
    import json
    import signal
    import threading

    # The terminal's Ctrl-C is the host's to handle: it kills this worker if it must.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _set_thread_name(name.replace("nous-sched-worker-", "nous-worker-"))
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        quickjs = _load("_quickjs", quickjs_path, extension=True)
        engine = _load("nous_sched_engine", os.path.join(here, "engine.py"))
        oslimits = _load("nous_sched_oslimits", os.path.join(here, "oslimits.py"))
        # Everything serve() imports, before the OS bounds forbid opening files.
        import collections  # noqa: F401
        import ctypes  # noqa: F401
        import time  # noqa: F401
    except BaseException as exc:
        write_all(1, frame(FATAL, f"the worker could not load the engine: {exc!r}".encode("utf-8", "replace")))
        os._exit(1)
    watchdog = _Watchdog(lifeline, _budget_offset(quickjs))
    bounds = oslimits.apply()
    bounds["wall_clock_stop"] = watchdog._offset is not None

    def run() -> None:
        _set_thread_name("nous-js-" + name.rsplit("-", 1)[-1])
        # The deadline signal is for the main thread: only there does it
        # interrupt the blocking read that lets its handler run.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        try:
            # This thread writes every frame, the hello included: one writer.
            write_all(1, frame(HELLO, json.dumps({"pid": os.getpid(), "os_bounds": bounds}).encode()))
            serve(engine, oslimits, watchdog, 0, 1)
        finally:
            os._exit(0)

    watchdog.install()
    threading.stack_size(JS_STACK)
    thread = threading.Thread(target=run, name="nous-sched-js", daemon=True)
    thread.start()
    try:
        watchdog.watch()
    finally:
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv)

"""The in-process runtime: runs each program in a fresh ``quickjs-ng`` context
inside this process, for trusted code and the lowest latency. Opt in with
``runtime=QuickJSRuntime()``; the default is the worker-process runtime
(:class:`~nous_sched.WorkerPool`).

Both runtimes step the engine the same way (:mod:`nous_sched.runtime.engine`);
what this one gives up is the process boundary:

* **The deadline inside long JavaScript is CPU time.** The binding's only
  interrupt is a slice of *process* CPU time, re-armed with the run's
  remaining time before each step, so a runaway loop is stopped early when
  other threads of the process burn CPU alongside it (concurrent runs draw on
  one budget) and late when other processes starve it; one builtin call (a
  huge ``slice``, a BigInt power) is not interrupted at all. The deadline is
  exact while the run waits for tools and between JavaScript jobs.
* **Cancellation** (``run_code(..., cancel=event)``) and ``KeyboardInterrupt``
  take effect between steps, not inside one.
* **Memory**: the engine's heap is this process's; freed memory may stay with
  the allocator rather than return to the OS.
* **Stack**: the engine runs on the calling thread when that thread's stack
  holds ``Limits.stack_bytes`` plus :data:`STACK_MARGIN`; otherwise (a thread
  made after ``threading.stack_size(512 * 1024)``, musl's 128 KiB default
  threads, a platform where the size cannot be read) on a helper thread
  ``nous-sched-engine-<n>`` sized for it, which the calling thread waits for.
  Runaway recursion is an ``abort`` either way, never a crash.
"""

from __future__ import annotations

import ctypes
import itertools
import sys
import threading
import time
from typing import Any, Optional

from ..result import RunError
from . import Host, Limits, RuntimeOutcome
from .engine import Engine, Finish, drive

__all__ = ["QuickJSRuntime", "STACK_MARGIN"]

#: Stack a thread needs beyond ``Limits.stack_bytes``: what the caller has
#: used already, and C code that overshoots the engine's check.
STACK_MARGIN = 1024 * 1024
_numbers = itertools.count(1)
_stack_size_lock = threading.Lock()  # threading.stack_size() is process-wide
_local = threading.local()
_PLATFORM: str = sys.platform


class QuickJSRuntime:
    """Runs JavaScript programs in ``quickjs-ng`` in this process. Stateless and
    thread-safe: every :meth:`run` builds its own context, on the calling thread
    when its stack is big enough (see the module docstring)."""

    language = "javascript"

    def run(self, program: str, host: Host, limits: Limits) -> RuntimeOutcome:
        deadline = time.monotonic() + limits.timeout
        cancel = getattr(host, "cancel", None)
        needed = limits.stack_bytes + STACK_MARGIN
        size = _thread_stack_size()
        if size is not None and size >= needed:
            finish = _run(program, host, limits, deadline, cancel)
        else:
            finish = _run_on_own_thread(program, host, limits, deadline, cancel, needed)
        error = None if finish.error is None else RunError(*finish.error)
        return RuntimeOutcome(finish.logs, result=finish.result, error=error)

    def __repr__(self) -> str:
        return "QuickJSRuntime()"


def _run(program: str, host: Host, limits: Limits, deadline: float, cancel: Any) -> Finish:
    engine = Engine(program, host.names, limits, deadline)
    try:
        return drive(engine, host, limits, deadline, cancel)
    finally:
        engine.close()


class _Either:
    """Set when either event is."""

    __slots__ = ("a", "b")

    def __init__(self, a: Any, b: threading.Event) -> None:
        self.a = a
        self.b = b

    def is_set(self) -> bool:
        return self.b.is_set() or (self.a is not None and self.a.is_set())


def _run_on_own_thread(program: str, host: Host, limits: Limits, deadline: float, cancel: Any, needed: int) -> Finish:
    box: list[Any] = []
    stop = threading.Event()

    def target() -> None:
        try:
            box.append(_run(program, host, limits, deadline, _Either(cancel, stop)))
        except BaseException as exc:  # handed to the caller's thread
            box.append(exc)

    size = -(-needed // (64 * 1024)) * (64 * 1024)
    with _stack_size_lock:
        old = threading.stack_size(size)
        try:
            thread = threading.Thread(target=target, name=f"nous-sched-engine-{next(_numbers)}", daemon=True)
            thread.start()
        finally:
            threading.stack_size(old)
    try:
        thread.join()
    except BaseException:
        # KeyboardInterrupt: the engine thread stops at its next step.
        stop.set()
        raise
    outcome = box[0]
    if isinstance(outcome, BaseException):
        raise outcome
    assert isinstance(outcome, Finish)
    return outcome


def _thread_stack_size() -> Optional[int]:
    """The calling thread's stack size in bytes, or ``None`` when it cannot be read."""
    try:
        return _local.stack_size  # type: ignore[no-any-return]
    except AttributeError:
        pass
    try:
        size = _read_stack_size()
    except Exception:
        size = None
    _local.stack_size = size
    return size


def _read_stack_size() -> Optional[int]:
    if _PLATFORM.startswith("linux"):
        libc = ctypes.CDLL(None)
        libc.pthread_self.restype = ctypes.c_ulong
        attr = ctypes.create_string_buffer(256)  # pthread_attr_t: 56 bytes (glibc x86-64), 64 on AArch64
        if libc.pthread_getattr_np(ctypes.c_ulong(libc.pthread_self()), attr) != 0:
            return None
        try:
            addr = ctypes.c_void_p()
            size = ctypes.c_size_t()
            if libc.pthread_attr_getstack(attr, ctypes.byref(addr), ctypes.byref(size)) != 0:
                return None
            return size.value
        finally:
            libc.pthread_attr_destroy(attr)
    if _PLATFORM == "darwin":
        libc = ctypes.CDLL(None)
        libc.pthread_self.restype = ctypes.c_void_p
        libc.pthread_get_stacksize_np.restype = ctypes.c_size_t
        libc.pthread_get_stacksize_np.argtypes = [ctypes.c_void_p]
        return int(libc.pthread_get_stacksize_np(libc.pthread_self()))
    return None

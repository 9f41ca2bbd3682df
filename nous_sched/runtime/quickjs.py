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
* **The CPU budget** (``Limits.cpu_time``) is the CPU time of the thread
  that runs the engine, inside the engine's steps only, so nothing the host
  does between them, nor any wait, counts. Where the context layout is the
  verified one (as for cancel), a watcher thread, ``nous-sched-cpu-<n>``
  (or the cancel watcher, in a run given both), reads that thread's CPU
  clock when the budget could be spent and stops the engine as cancel
  does. Elsewhere the binding's slice of *process* CPU time carries the
  budget left, so a runaway loop is stopped early when other threads of
  the process burn CPU alongside it. Either way one long builtin call is
  not stopped, and nothing kills it here.
* **Cancellation** (``run_code(..., cancel=event)``) stops the program at
  once, inside a step too, where the binding's context layout is the one
  the worker runtime verifies (:func:`~nous_sched.runtime.worker.budget_offset`):
  a watcher thread, ``nous-sched-cancel-<n>``, present only in a run given
  ``cancel``, zeroes the running call's CPU budget when ``cancel`` is set, so
  the engine stops at its next interrupt check and keeps the step's logs,
  as a deadline does. Elsewhere, and for ``KeyboardInterrupt``, it takes
  effect between steps. (The CLI runs the program off the main thread, so a
  second Ctrl-C interrupts it at once whatever the program is doing.)
* **No CPU shares**: a :class:`~nous_sched.WorkerPool` bounds the programs
  computing at once (``cpu_shares``); this runtime does not: each run's
  JavaScript runs on the thread that called it (the binding lets go of the
  GIL meanwhile), so the caller's threads are its bound.
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

import contextvars
import ctypes
import functools
import itertools
import os
import sys
import threading
import time
from typing import Any, Optional

from ..result import RunError
from . import AnyCancel, Cancel, CodeRuntime, Host, Limits, RuntimeOutcome
from .engine import CANCELLED, Engine, Finish, drive, load_gc_threshold, prepare

__all__ = ["QuickJSRuntime", "STACK_MARGIN"]

#: Stack a thread needs beyond ``Limits.stack_bytes``: what the caller has
#: used already, and C code that overshoots the engine's check.
STACK_MARGIN = 1024 * 1024
_numbers = itertools.count(1)
_stack_size_lock = threading.Lock()  # threading.stack_size() is process-wide
_local = threading.local()
_PLATFORM: str = sys.platform


class QuickJSRuntime(CodeRuntime):
    """Runs JavaScript programs in ``quickjs-ng`` in this process. Stateless and
    thread-safe: every :meth:`run` gets its own context, in which no program ran
    before, and runs it on the calling thread when its stack is big enough (see
    the module docstring). Its start-up, a context with the prelude evaluated,
    is usually made by an earlier run while that run waited for a tool (at
    most ``SPARES`` wait; a forked child has none)."""

    language = "javascript"

    def run(self, program: str, host: Host, limits: Limits) -> RuntimeOutcome:
        deadline = time.monotonic() + limits.timeout
        cancel = host.cancel
        needed = limits.stack_bytes + STACK_MARGIN
        size = _thread_stack_size()
        if size is not None and size >= needed:
            finish = _run(program, host, limits, deadline, cancel)
        else:
            finish = _run_on_own_thread(program, host, limits, deadline, cancel, needed)
        error = None if finish.error is None else RunError(*finish.error)
        stopped = error is not None and error.kind in ("timeout", "cpu_time")
        if stopped and _is_set(cancel) and time.monotonic() < deadline:
            error = RunError("cancelled", CANCELLED)  # the watcher's stop, not the deadline's
        return RuntimeOutcome(finish.logs, result=finish.result, error=error)

    def __repr__(self) -> str:
        return "QuickJSRuntime()"


def _run(program: str, host: Host, limits: Limits, deadline: float, cancel: Optional[Cancel]) -> Finish:
    cpu_time = limits.cpu_time
    clock = _thread_clock() if cpu_time is not None else None
    watched = _budget() is not None and (cancel is not None or clock is not None)
    watch = _Watch(cancel, cpu_time if clock is not None else None) if watched else None
    load_gc_threshold()  # (once per process: see engine.GC_FIRST)
    prepared = _take_spare()
    engine = Engine(
        program,
        host.names,
        limits,
        deadline,
        prepared=prepared,
        before_salvage=watch.stop if watch else None,
        # This thread's CPU clock, which the watcher reads too; the binding's slice
        # (process CPU) carries the budget only where no watcher stops the engine.
        cpu_clock=clock or time.thread_time,
        cpu_slice=clock is None or watch is None,
    )
    # The next run's context is made while this one first waits for a tool, when no spare is left.
    engine.idle = _make_spare
    if watch is not None:
        watch.start(engine)
    try:
        return drive(engine, host, limits, deadline, cancel)
    finally:
        if watch is not None:
            watch.stop()
        engine.close()


#: At most this many contexts wait, prepared, for the process's next in-process runs.
SPARES = 4
#: A run makes a spare only once its first call has run this long (seconds).
SPARE_AFTER = 0.002
# Each a (context, bridge) pair from engine.prepare(), never run: list.pop and
# append are atomic, so each is taken by one run. (A context may be used on a
# thread other than its maker's: the run's thread sets its stack bound first.)
_spares: list[tuple[Any, Any]] = []


def _take_spare() -> Optional[tuple[Any, Any]]:
    """A context prepared ahead (the prelude evaluated, never run), or ``None``: the run makes its own."""
    try:
        return _spares.pop()
    except IndexError:
        return None


def _make_spare(head: Any, host: Host) -> None:
    """Prepare a context for a later run (the prelude is most of a run's start-up),
    unless :data:`SPARES` wait already. Called by a run's thread when it first waits
    for a tool (``head``), and only once that call has run :data:`SPARE_AFTER`: so it
    costs a run time its tools take anyway, after its calls were handed to their
    threads (which it would slow: the CPU it takes is theirs then)."""
    if len(_spares) < SPARES and head.wait(SPARE_AFTER) is None:
        try:
            _spares.append(prepare())
        except Exception:  # (no memory for it: the next run makes its own, and says so)
            pass


def _forget_spares() -> None:
    _spares.clear()


# A forked child starts with none of its parent's (each context is the process's own).
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_spares)


def _thread_clock() -> Optional[Any]:
    """The calling thread's CPU clock, as a function any thread may call, or
    ``None`` where there is no such clock."""
    try:
        clock_id = time.pthread_getcpuclockid(threading.get_ident())
        time.clock_gettime(clock_id)
    except (AttributeError, OSError):
        return None
    return functools.partial(time.clock_gettime, clock_id)


def _is_set(cancel: Optional[Cancel]) -> bool:
    return cancel is not None and bool(cancel.is_set())


_UNKNOWN = object()
_offset: Any = _UNKNOWN  # where a context keeps its running call's CPU budget (None: not known)
_offset_lock = threading.Lock()
#: How often the watcher looks at ``cancel``; also how often it zeroes the
#: budget again once set (the engine re-arms it before each step).
CANCEL_POLL = 0.02
#: The shortest wait between two looks at the engine thread's CPU time.
CPU_LOOK = 0.005


def _budget() -> Any:
    global _offset
    if _offset is _UNKNOWN:
        with _offset_lock:
            if _offset is _UNKNOWN:
                import _quickjs

                from .worker import budget_offset

                _offset = budget_offset(_quickjs)
    return _offset


class _Watch:
    """Stops a run's engine inside a step once ``cancel`` is set, or once the
    engine's thread has used the run's CPU budget ``cpu_time`` inside the
    engine's steps (see the module docstring). It looks at ``cancel`` every
    :data:`CANCEL_POLL`, and at the CPU time when the thread could have used
    what is left (at most a second a second), so a run computing little wakes it seldom.

    ``_lock`` guards ``_engine``: cleared by :meth:`stop` (before the engine's
    salvage, and when the run ends), so the budget is never zeroed during the
    salvage's drain or in a context that is being freed.
    """

    def __init__(self, cancel: Optional[Cancel], cpu_time: Optional[float]) -> None:
        self._cancel = cancel
        self._cpu_time = cpu_time
        self._lock = threading.Lock()
        self._engine: Any = None
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self, engine: Engine) -> None:
        self._engine = engine
        n = next(_numbers)
        name = f"nous-sched-cancel-{n}" if self._cancel is not None else f"nous-sched-cpu-{n}"
        self._thread = threading.Thread(target=self._watch, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._engine = None
        self._done.set()

    def _watch(self) -> None:
        import ctypes

        offset = _budget()
        cancel, cpu_time = self._cancel, self._cpu_time
        wait = CANCEL_POLL
        while not self._done.wait(wait):
            wait = CANCEL_POLL if cancel is not None else 3600.0
            stop = cancel is not None and cancel.is_set()
            if not stop and cpu_time is not None:
                engine = self._engine
                left = cpu_time - engine.cpu_spent() if engine is not None else cpu_time
                stop = left <= 0
                wait = min(wait, max(left, CPU_LOOK))
            if not stop:
                continue
            wait = min(wait, CANCEL_POLL)  # (zeroed again until the engine stops: each step re-arms it)
            with self._lock:
                ctx = getattr(self._engine, "ctx", None)
                if ctx is not None:
                    ctypes.c_int64.from_address(id(ctx) + offset).value = 0
                del ctx


def _run_on_own_thread(
    program: str, host: Host, limits: Limits, deadline: float, cancel: Optional[Cancel], needed: int
) -> Finish:
    box: list[Any] = []
    stop = threading.Event()
    # The host is called in the caller's contextvars, as on the caller's thread
    # (the scheduler hands each call a copy of its submitter's).
    ctx = contextvars.copy_context()

    def target() -> None:
        try:
            box.append(ctx.run(_run, program, host, limits, deadline, AnyCancel(cancel, stop)))
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

"""Tool threads: the warm, bounded set of threads that runs the tools of every
:class:`~nous_sched.Scheduler` given no executor.

One set per process (:func:`shared`), so a run starts no thread of its own:
a 50-wide fan-out finds its threads already waiting. What a caller may rely on:

* **Warm, on demand.** Tasks go on one FIFO queue that every thread takes
  from, so a thread that finishes a task takes the next one without
  sleeping; a new thread is started only when no thread is idle, while the
  set has fewer than its ``max_threads`` (the process-wide set:
  :data:`HARD_CAP`). So the set grows
  to the largest number of tasks that ran at once, across every scheduler in
  the process, and a run whose calls find it that large starts no thread.
  Each scheduler still enforces its own ``max_parallel`` (its lane never
  hands over more); this set only bounds the process.
* **Bounded.** At ``max_threads`` a task waits in the queue for the next
  thread to finish (in submission order), or until it is cancelled: a
  scheduler that stops cancels its calls that have not started
  (:meth:`Task.cancel`), and a call that waited past its run's deadline
  finds its scheduler stopped and does not start. A tool that never returns
  holds its thread for good (Python cannot kill a thread); the set grows past
  it for other runs, up to the bound, and only there do calls wait.
* **Idle threads retire.** A thread that waits ``idle_seconds``
  (:data:`IDLE_SECONDS`) for a task while another idle thread could take the
  next one exits. So a process that stops running tools ends up with no tool
  thread. (Waiting threads take tasks in turn, so under a steady trickle of
  calls a set grown by a burst shrinks only once the trickle leaves a thread
  a whole ``idle_seconds`` without a task; it never exceeds its bound.) :func:`retire_shared`
  retires them at once and says which are still busy (what a leak check
  counts: a thread still busy is a tool that has not returned).
* **Named** ``<prefix>-<k>`` (``nous-sched-tool-<k>`` for the shared set),
  daemon threads: interpreter exit does not wait for a tool that hangs.
* **No context leaks between tasks.** A task runs as ``fn(*args)``; the
  scheduler's task runs the call inside the submitting thread's copied
  ``contextvars.Context``, so what one call sets is gone for the next.
  (``threading.local`` values a tool leaves on its thread do persist, as on
  any pool.)
* **Fork.** A child process forked while threads run gets a fresh, empty
  shared set (``os.register_at_fork``): the parent's threads do not exist there.
* A task that raises is the task's affair (it reports its own end: see
  ``scheduler._run_reporting``); the thread goes on to the next one.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from typing import Any, Callable, Optional

__all__ = ["ToolThreads", "Task", "shared", "retire_shared", "HARD_CAP", "IDLE_SECONDS", "PREFIX"]

#: The shared set's bound on its threads, running or idle.
HARD_CAP = 256
#: How long a thread of the shared set waits idle before it exits.
IDLE_SECONDS = 30.0
#: The shared set's thread names: ``nous-sched-tool-<k>``.
PREFIX = "nous-sched-tool"


class Task:
    """One submitted task. Whichever comes first, a thread taking it or :meth:`cancel`, wins.

    The claim is ``list.pop`` on a one-element list: atomic, so exactly one
    side gets the task, without a lock.
    """

    __slots__ = ("_slot",)

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._slot = [(fn, args)]

    def cancel(self) -> bool:
        """True if the task had not started: it never will. False if it has."""
        try:
            self._slot.pop()
        except IndexError:
            return False
        return True


class ToolThreads:
    """At most ``max_threads`` threads running tasks, warm and idle-retiring (see the module docstring).

    ``idle_seconds`` is how long a thread waits for a task before it exits (0:
    at once, as soon as it finds nothing to do).
    """

    # One FIFO queue of tasks that every thread takes from: a thread that
    # finishes a task takes the next one queued without sleeping, whoever it
    # was queued for. (Handing each task to one chosen idle thread costs a
    # wake-up per call: measured, 2.6-3.1 voluntary context switches per call
    # of a 1,000-call fan-out against 0.7 this way.)
    #
    # _lock guards _idle, _count, _threads, _retire_before and _closed.
    # _idle is the number of threads waiting (or about to wait) on the queue
    # less the tasks queued for them: submit() takes one (that is a promise:
    # some waiting thread will take this task), or starts a thread while
    # under max_threads; at the bound it takes one anyway, and _idle goes
    # below zero: the next thread to finish owes that task. A thread retires
    # (idle too long, or retired by retire_idle) only while _idle > 0, or,
    # as it finishes a task, while _idle >= 0: never with a task owed.

    def __init__(self, max_threads: int = HARD_CAP, prefix: str = PREFIX, idle_seconds: float = IDLE_SECONDS) -> None:
        self._max = max_threads
        self._prefix = prefix
        self._idle_seconds = idle_seconds
        self._queue: queue.SimpleQueue[Optional[Task]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._count = 0  # threads alive or starting
        self._threads: set[threading.Thread] = set()
        self._serial = itertools.count()
        self._retire_before = -1  # threads with a serial below this retire once their task is done
        self._closed = False
        # Released each time a thread goes idle, when set (tests wait on it
        # for "every thread is idle" without polling).
        self._went_idle: Optional[threading.Semaphore] = None

    @property
    def max_threads(self) -> int:
        return self._max

    def counts(self) -> tuple[int, int]:
        """(threads alive or starting, of which idle). A snapshot: it may be stale at once."""
        with self._lock:
            return self._count, max(self._idle, 0)

    def threads(self) -> list[threading.Thread]:
        """The set's threads, alive or starting (a snapshot)."""
        with self._lock:
            return list(self._threads)

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Task:
        """Run ``fn(*args)`` on a thread of the set; returns at once.

        :raises RuntimeError: after :meth:`shutdown`, or when no thread could
            be started and none is running (the task is not queued then).
        """
        task = Task(fn, args)
        start = None
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot run a tool call after the tool threads were shut down")
            if self._idle > 0 or self._count >= self._max:
                self._idle -= 1  # a waiting thread takes it; at the bound, the next to finish
            else:
                serial = next(self._serial)
                start = threading.Thread(
                    target=self._work, args=(serial,), name=f"{self._prefix}-{serial}", daemon=True
                )
                self._count += 1
                self._threads.add(start)
        if start is not None:
            self._start(start)
        self._queue.put(task)
        return task

    def _start(self, thread: threading.Thread) -> None:
        """Start a new thread (counted already); if it cannot start, a running one owes its task."""
        try:
            thread.start()
        except BaseException as exc:
            if thread.ident is not None:
                raise  # it started (a KeyboardInterrupt landed as it did): it takes the task
            with self._lock:
                self._count -= 1
                self._threads.discard(thread)
                others = self._count > 0 and isinstance(exc, Exception)
                if others:
                    self._idle -= 1
            if not others:
                raise

    def retire_idle(self) -> list[threading.Thread]:
        """Retire every thread of the set now: the idle ones exit at once, the
        busy ones when their current task is done and no task waits. Threads
        started after this call are not affected. Returns the threads retired."""
        with self._lock:
            idle = max(self._idle, 0)
            self._idle -= idle
            self._retire_before = next(self._serial)
            retired = list(self._threads)
        for _ in range(idle):
            self._queue.put(None)  # each waiting thread that takes one exits
        return retired

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more tasks; each thread exits once the queue is empty (its current task done).

        ``cancel_futures`` drops the tasks still waiting; ``wait`` joins the
        threads. Never called on the shared set (:func:`shared`).
        """
        with self._lock:
            self._closed = True
        if cancel_futures:
            markers = 0
            while True:
                try:
                    task = self._queue.get_nowait()
                except queue.Empty:
                    break
                if task is None:
                    markers += 1
                    continue
                task.cancel()
                with self._lock:
                    self._idle += 1  # the promise it held is void
            for _ in range(markers):
                self._queue.put(None)
        threads = self.retire_idle()
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _work(self, serial: int) -> None:
        get = self._queue.get
        lock = self._lock
        idle_seconds = self._idle_seconds
        while True:
            try:
                task = get(True, idle_seconds)
            except queue.Empty:
                with lock:
                    if self._idle <= 0:
                        continue  # a task is queued for a waiting thread: this one may be it
                    self._idle -= 1
                    self._leave()
                return
            if task is None:  # retire_idle: its promise was taken back there
                with lock:
                    self._leave()
                return
            _run(task)
            del task
            with lock:
                if self._idle >= 0 and (serial < self._retire_before or self._closed):
                    self._leave()
                    return
                self._idle += 1
            if self._went_idle is not None:
                self._went_idle.release()

    def _leave(self) -> None:
        """This thread leaves the set (under _lock)."""
        self._count -= 1
        self._threads.discard(threading.current_thread())


def _run(task: Task) -> None:
    try:
        fn, args = task._slot.pop()
    except IndexError:
        return  # cancelled before it started
    try:
        fn(*args)
    except BaseException:  # the task has reported it; this thread goes on
        pass


_shared: Optional[ToolThreads] = None
_shared_lock = threading.Lock()


def shared() -> ToolThreads:
    """The process's shared tool threads (made on first use; a fresh set in a forked child)."""
    threads = _shared
    if threads is None:
        threads = _make_shared()
    return threads


def retire_shared(timeout: float = 10.0) -> list[threading.Thread]:
    """Retire the shared set's threads (:meth:`ToolThreads.retire_idle`) and
    wait up to ``timeout`` seconds for them to exit; returns those still
    alive, each busy in a tool that has not returned. For whoever counts
    threads (tests, leak checks): the next run starts its threads afresh."""
    deadline = time.monotonic() + timeout
    retired = shared().retire_idle()
    for thread in retired:
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
    return [t for t in retired if t.is_alive()]


def _make_shared() -> ToolThreads:
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ToolThreads()
        return _shared


def _after_fork_in_child() -> None:
    # The parent's threads do not exist here, and its lock may have been held
    # at the fork: start over. (A scheduler inherited from the parent has no
    # driver here either.)
    global _shared, _shared_lock
    _shared = None
    _shared_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

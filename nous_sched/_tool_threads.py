"""Tool threads: the warm, bounded set of threads that runs the tools of every
:class:`~nous_sched.Scheduler` given no executor.

One set per process (:func:`shared`), so a run starts no thread of its own:
a 50-wide fan-out finds its threads already waiting, and hands each call to
one directly. What a caller may rely on:

* **Warm, on demand.** A task goes to an idle thread when there is one; else
  a new thread is started for it, while the set has fewer than its
  ``max_threads`` (the process-wide set: :data:`HARD_CAP`). So the set grows
  to the largest number of tasks that ran at once, across every scheduler in
  the process, and a run whose calls find it that large starts no thread.
  Each scheduler still enforces its own ``max_parallel`` (its lane never
  hands over more); this set only bounds the process.
* **Bounded.** At ``max_threads`` a task waits in a FIFO backlog for the
  next thread to finish (in submission order), or until it is cancelled: a
  scheduler that stops cancels its calls that have not started
  (:meth:`Task.cancel`), and a call that waited past its run's deadline
  finds its scheduler stopped and does not start. A tool that never returns
  holds its thread for good (Python cannot kill a thread); the set grows past
  it for other runs, up to the bound, and only there do calls wait.
* **Idle threads retire.** The thread that finished last is the first handed
  the next task (a stack of idle threads: the warm ones stay busy), and a
  thread idle for ``idle_seconds`` (:data:`IDLE_SECONDS`) exits. So a process
  that stops running tools ends up with no tool thread. :func:`retire_shared`
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

import collections
import itertools
import os
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


class _Worker:
    """One thread's mailbox: ``task`` is written by whoever wakes it, before ``wake`` is released."""

    __slots__ = ("wake", "task", "retire", "thread")

    def __init__(self, task: Optional[Task]) -> None:
        self.wake = threading.Lock()
        self.wake.acquire()  # held while the thread waits for work; released once per hand-over
        self.task = task
        self.retire = False
        self.thread: Optional[threading.Thread] = None


class ToolThreads:
    """At most ``max_threads`` threads running tasks, warm and idle-retiring (see the module docstring).

    ``idle_seconds`` is how long a thread waits for a task before it exits (0:
    at once, as soon as it finds nothing to do).
    """

    # _lock guards _idle, _workers, _backlog, _closed and every _Worker's
    # task and retire. A worker is in _idle exactly while it waits with no task
    # promised; taking it out of _idle (under _lock) is the right to hand it
    # one, or to tell it to retire, by writing worker.task and releasing
    # worker.wake. _workers holds every thread started and not yet exited.

    def __init__(self, max_threads: int = HARD_CAP, prefix: str = PREFIX, idle_seconds: float = IDLE_SECONDS) -> None:
        self._max = max_threads
        self._prefix = prefix
        self._idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []  # a stack: the last to go idle is the first handed a task
        self._workers: set[_Worker] = set()
        self._backlog: collections.deque[Task] = collections.deque()
        self._names = itertools.count()
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
            return len(self._workers), len(self._idle)

    def threads(self) -> list[threading.Thread]:
        """The set's threads, alive or starting (a snapshot)."""
        with self._lock:
            return [w.thread for w in self._workers if w.thread is not None]

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Task:
        """Run ``fn(*args)`` on a thread of the set; returns at once.

        :raises RuntimeError: after :meth:`shutdown`, or when no thread could
            be started and none is running (the task is not queued then).
        """
        task = Task(fn, args)
        new = False
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot run a tool call after the tool threads were shut down")
            if self._idle:
                worker = self._idle.pop()
                worker.task = task
            elif len(self._workers) >= self._max:
                self._backlog.append(task)  # the next thread to finish takes it, in order
                return task
            else:
                # Counted in _workers before it starts, so the bound holds
                # while it starts, outside the lock.
                worker = _Worker(task)
                new = True
                self._workers.add(worker)
                worker.thread = threading.Thread(
                    target=self._work, args=(worker,), name=f"{self._prefix}-{next(self._names)}", daemon=True
                )
        if new:
            self._start(worker)
        else:
            worker.wake.release()  # out of _lock: the woken thread's first act is to take the task
        return task

    def _start(self, worker: _Worker) -> None:
        """Start a new worker's thread, its task in hand; if it cannot start, the task goes to another."""
        assert worker.thread is not None
        try:
            worker.thread.start()
        except BaseException as exc:
            if worker.thread.ident is not None:
                raise  # it started (a KeyboardInterrupt landed as it did): it runs the task
            with self._lock:
                self._workers.discard(worker)
                task, worker.task = worker.task, None
                others = bool(self._workers) and not self._closed and isinstance(exc, Exception)
                idle = self._idle.pop() if others and self._idle else None
                if idle is not None:
                    idle.task = task
                elif others and task is not None:
                    self._backlog.append(task)
            if idle is not None:
                idle.wake.release()
            elif not others:
                raise

    def retire_idle(self) -> list[threading.Thread]:
        """Retire every thread of the set now: the idle ones exit at once, the
        busy ones when their current task is done and no task waits. Threads
        started after this call are not affected. Returns the threads retired."""
        with self._lock:
            idle, self._idle = self._idle, []
            retired = [w.thread for w in self._workers if w.thread is not None]
            for worker in self._workers:
                worker.retire = True
            for worker in idle:
                worker.task = None
        for worker in idle:
            worker.wake.release()
        return retired

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more tasks; each thread exits once the backlog is empty (its current task done).

        ``cancel_futures`` drops the tasks still waiting; ``wait`` joins the
        threads. Never called on the shared set (:func:`shared`).
        """
        with self._lock:
            self._closed = True
            threads = [w.thread for w in self._workers if w.thread is not None]
            dropped = list(self._backlog) if cancel_futures else []
            if cancel_futures:
                self._backlog.clear()
        for task in dropped:
            task.cancel()
        self.retire_idle()
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _work(self, worker: _Worker) -> None:
        lock = self._lock
        backlog = self._backlog
        task = worker.task
        while True:
            if task is not None:
                _run(task)
                task = None
            with lock:
                if backlog:
                    task = backlog.popleft()
                    continue
                if worker.retire or self._closed:
                    self._workers.discard(worker)
                    return
                worker.task = None
                self._idle.append(worker)
            if self._went_idle is not None:
                self._went_idle.release()
            task = self._wait(worker)
            if task is None:
                return

    def _wait(self, worker: _Worker) -> Optional[Task]:
        """Wait idle for a task; None once this thread has left the set (retired, or idle too long)."""
        if not worker.wake.acquire(True, self._idle_seconds):
            with self._lock:
                if worker in self._idle:  # nobody promised it a task: it retires
                    self._idle.remove(worker)
                    self._workers.discard(worker)
                    return None
            worker.wake.acquire()  # handed a task (or told to retire) as the wait ran out: released just after
        task = worker.task
        if task is None:  # retire_idle
            with self._lock:
                self._workers.discard(worker)
        return task


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

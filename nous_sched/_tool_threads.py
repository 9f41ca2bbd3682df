"""The scheduler's own tool threads: the executor a :class:`~nous_sched.Scheduler` makes when it is given none.

A ``ThreadPoolExecutor`` made for one scheduler pays, per call, for what only a
caller's executor needs: a ``Future`` (a ``Condition`` over an ``RLock``) that
the driver never waits on, two shutdown locks, and an idle ``Semaphore``
written in Python, taken and given back around every task. The driver needs
less: run this task on a thread, start at most ``max_workers`` threads, take
back a task that has not started. A task reports its own end (it puts its
result on the driver's queue), so nothing here waits for one.

* Tasks start in submission order, on threads named ``<prefix>_<k>``, started
  on demand up to ``max_workers`` and kept until :meth:`ToolThreads.shutdown`.
* A task that raises is the task's affair: it has reported already (see
  ``scheduler._run_reporting``); the thread goes on to the next one.
* :meth:`Task.cancel` takes a task back if no thread has taken it yet.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Optional

__all__ = ["ToolThreads", "Task"]


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
    """At most ``max_workers`` threads running tasks in submission order (see the module docstring)."""

    # _lock guards _idle, _threads and _closed. _idle counts threads that
    # finished a task and have not been promised another: submit() takes one
    # (that thread will get this task), or starts a thread while under
    # max_workers. Past max_workers tasks wait in the queue, in order.

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        self._max = max_workers
        self._prefix = thread_name_prefix
        self._queue: queue.SimpleQueue[Optional[Task]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Task:
        """Queue ``fn(*args)``; returns at once.

        :raises RuntimeError: after :meth:`shutdown`.
        """
        task = Task(fn, args)
        start = None
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot run a tool call after the scheduler's tool threads were shut down")
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self._max:
                start = threading.Thread(target=self._work, name=f"{self._prefix}_{len(self._threads)}", daemon=True)
                self._threads.append(start)
        if start is not None:
            try:
                start.start()  # before the task is queued: a thread that cannot start runs nothing
            except BaseException:
                with self._lock:
                    self._threads.remove(start)
                raise
        self._queue.put(task)
        return task

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more tasks; each thread exits once the queue is empty (its current task done).

        ``cancel_futures`` drops the tasks still queued; ``wait`` joins the threads.
        """
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    task = self._queue.get_nowait()
                except queue.Empty:
                    break
                if task is not None:
                    task.cancel()
        for _ in threads:
            self._queue.put(None)
        if wait:
            for thread in threads:
                thread.join()

    def _work(self) -> None:
        get = self._queue.get
        lock = self._lock
        while True:
            task = get()
            if task is None:
                return
            try:
                fn, args = task._slot.pop()
            except IndexError:
                pass  # cancelled before it started
            else:
                try:
                    fn(*args)
                except BaseException:  # the task has reported it; this thread goes on
                    pass
                del fn, args
            del task
            with lock:
                self._idle += 1

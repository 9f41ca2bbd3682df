"""Tool threads: the warm, bounded set of threads that runs the tools of every
:class:`~nous_sched.Scheduler` given no executor.

One set per process (:func:`shared`), so a run starts no thread of its own:
a 50-wide fan-out finds its threads already waiting. What a caller may rely on:

* **Warm, on demand, the hottest first.** A task goes to the thread that
  went idle most recently (idle threads wait on a stack, each on its own
  lock), so calls made one after another keep reusing one thread while the
  others stay parked; a thread that finishes a task takes the next one
  waiting at the bound without sleeping. A new thread is started only when
  no thread is idle, while the set has fewer than its ``max_threads`` (the
  process-wide set: :data:`HARD_CAP`). So the set grows
  to the largest number of tasks that ran at once, across every scheduler in
  the process, and a run whose calls find it that large starts no thread.
  Each scheduler still enforces its own ``max_parallel`` (its lane never
  hands over more); this set only bounds the process.
* **Bounded.** At ``max_threads`` a task waits in a FIFO backlog for the next
  thread to finish (in submission order), or until it is cancelled: a
  scheduler that stops cancels its calls that have not started
  (:meth:`Task.cancel`), and a call that waited past its run's deadline
  finds its scheduler stopped and does not start. A tool that never returns
  holds its thread for good (Python cannot kill a thread); the set grows past
  it for other runs, up to the bound, and only there do calls wait.
* **Idle threads retire.** A thread that waits ``idle_seconds``
  (:data:`IDLE_SECONDS`) without a task exits. So a process that stops
  running tools ends up with no tool thread, and under a steady trickle of
  calls a set grown by a burst shrinks to the threads the trickle keeps
  busy: the threads below the top of the idle stack get no task and retire
  ``idle_seconds`` after they went idle. It never exceeds its bound.
  :func:`retire_shared`
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


class _Parked:
    """An idle thread's place on the idle stack: the lock it sleeps on and the task handed to it."""

    __slots__ = ("wake", "task", "serial")

    def __init__(self, serial: int) -> None:
        self.serial = serial  # its thread's
        self.wake = threading.Lock()
        self.wake.acquire()  # held while the thread has nothing: a hand-off releases it
        self.task: Optional[Task] = None  # set before each release; None then: retire


class ToolThreads:
    """At most ``max_threads`` threads running tasks, warm and idle-retiring (see the module docstring).

    ``idle_seconds`` is how long a thread waits for a task before it exits (0:
    at once, as soon as it finds nothing to do).
    """

    # An idle thread parks on its own lock, on a stack (_parked); submit()
    # hands a task to the top of it, the most recently idled thread, and
    # releases that one lock. Sequential calls so keep one hot thread (the
    # one that just finished the previous call, often not yet asleep: then
    # its acquire does not block at all), and the threads below stay parked
    # until they retire after idle_seconds. (A shared queue that every idle
    # thread waits on wakes the longest-waiting one instead: measured, 9.7-12.8
    # voluntary context switches per sequential call of the worker runtime
    # against 7.0-7.6 with one thread.) Only with no thread parked does a
    # task go on _backlog, while at max_threads; a thread that finishes a
    # task takes the backlog's head before it parks, without sleeping, so
    # the backlog runs in submission order. Invariant: _parked and _backlog
    # are never both non-empty.
    #
    # A burst does not make the submitting thread (the driver) wake every
    # thread itself: while one thread handed a task has not yet woken
    # (_waking), the next hand-off joins _to_wake, and each thread that
    # wakes with a task first releases the next one there (a chain, as a
    # shared queue's waiters wake each other). One hand-off at a time, the
    # case of sequential calls, is one release by the submitter. A thread
    # that finishes a task while hand-offs wait in _to_wake takes the first
    # one's task itself and puts that thread back on the stack, still asleep:
    # a burst that meets busy threads costs no wake-up for what they take
    # (as a shared queue's finishing threads take the next task first).
    #
    # _lock guards _parked, _backlog, _waking, _to_wake, _count, _threads,
    # _retire_before and _closed. A parked thread whose wait times out
    # leaves only if it is still on the stack; if a hand-off took it off
    # meanwhile, it waits again: the release is coming, or its task was
    # taken back and it is on the stack again.

    def __init__(self, max_threads: int = HARD_CAP, prefix: str = PREFIX, idle_seconds: float = IDLE_SECONDS) -> None:
        self._max = max_threads
        self._prefix = prefix
        self._idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._parked: list[_Parked] = []  # the idle stack: the top is the most recently idled
        self._backlog: collections.deque[Task] = collections.deque()
        self._waking = False  # a thread was handed a task and released, and has not yet woken
        self._to_wake: collections.deque[_Parked] = collections.deque()  # handed a task, not yet released
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
            return self._count, len(self._parked)

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
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot run a tool call after the tool threads were shut down")
            if self._parked:
                self._hand(task)
                return task
            if self._count >= self._max:
                self._backlog.append(task)  # the next thread to finish takes it
                return task
            serial = next(self._serial)
            start = threading.Thread(
                target=self._work, args=(serial, task), name=f"{self._prefix}-{serial}", daemon=True
            )
            self._count += 1
            self._threads.add(start)
        self._start(start, task)
        return task

    def _start(self, thread: threading.Thread, task: Task) -> None:
        """Start a new thread (counted already) for ``task``; if it cannot start, another thread takes the task."""
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
                    if self._parked:
                        self._hand(task)
                    else:
                        self._backlog.append(task)  # a running thread takes it when it finishes
            if not others:
                raise

    def _hand(self, task: Task) -> None:
        """Hand ``task`` to the top of the idle stack (under _lock; _parked not empty)."""
        parked = self._parked.pop()
        parked.task = task
        if self._waking:
            self._to_wake.append(parked)  # the thread woken last wakes it
        else:
            self._waking = True
            parked.wake.release()

    def _woke(self, parked: _Parked) -> Optional[Task]:
        """Once woken with a task: wake the next thread handed one meanwhile, if any."""
        task = parked.task
        if task is not None:  # None: retired, not part of the chain
            with self._lock:
                if self._to_wake:
                    self._to_wake.popleft().wake.release()
                else:
                    self._waking = False
        return task

    def retire_idle(self) -> list[threading.Thread]:
        """Retire every thread of the set now: the idle ones exit at once, the
        busy ones when their current task is done and no task waits. Threads
        started after this call are not affected. Returns the threads retired."""
        with self._lock:
            parked, self._parked = self._parked, []
            self._retire_before = next(self._serial)
            retired = list(self._threads)
        for one in parked:
            one.wake.release()  # with no task: it exits
        return retired

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more tasks; each thread exits once the backlog is empty (its current task done).

        ``cancel_futures`` drops the tasks still waiting; ``wait`` joins the
        threads. Never called on the shared set (:func:`shared`).
        """
        with self._lock:
            self._closed = True
            dropped = list(self._backlog) if cancel_futures else []
            if cancel_futures:
                self._backlog.clear()
        for task in dropped:
            task.cancel()
        threads = self.retire_idle()
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _work(self, serial: int, first: Task) -> None:
        parked = _Parked(serial)  # this thread's own place on the idle stack, reused each time it idles
        task: Optional[Task] = first
        while task is not None:
            _run(task)
            task = self._next(serial, parked)
        with self._lock:
            self._leave()

    def _next(self, serial: int, parked: _Parked) -> Optional[Task]:
        """The next task for this thread, once it finished one; None: it leaves."""
        with self._lock:
            if self._backlog:
                return self._backlog.popleft()  # without sleeping
            if self._to_wake:
                return self._steal()  # without sleeping, and one thread fewer to wake
            if serial < self._retire_before or self._closed:
                return None
            parked.task = None
            self._parked.append(parked)
        if self._went_idle is not None:
            self._went_idle.release()
        # Its wake lock is held here (by itself: acquired at creation or by
        # the last acquire below), so this blocks until a hand-off releases it.
        while not parked.wake.acquire(True, self._idle_seconds):
            with self._lock:
                if parked in self._parked:  # idle too long, and no task on its way
                    self._parked.remove(parked)
                    return None
            # Handed a task as it timed out: the release is coming (or the
            # task is taken back and it is on the stack again).
        return self._woke(parked)

    def _steal(self) -> Task:
        """Take the task of the next thread waiting to be woken, and put that
        thread back on the idle stack, still asleep (under _lock); or, if it
        was retired meanwhile (:meth:`retire_idle` did not see it idle), let
        it exit now rather than after ``idle_seconds``."""
        victim = self._to_wake.popleft()
        task = victim.task
        assert task is not None
        victim.task = None
        if victim.serial < self._retire_before or self._closed:
            victim.wake.release()  # with no task: it exits
        else:
            self._parked.append(victim)
            if self._went_idle is not None:
                self._went_idle.release()
        return task

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

"""Tool threads: the warm, bounded set of threads that runs the tools of every
:class:`~nous_sched.Scheduler` given no executor.

One set per process (:func:`shared`), so a run starts no thread of its own:
a 50-wide fan-out finds its threads already waiting. What a caller may rely on:

* **Every task runs once, or is cancelled.** A submitted task is, at every
  moment, either waiting in the set's one FIFO ``pending`` queue or owned by
  exactly one thread, which runs it (:meth:`Task.cancel` makes that run a
  no-op). While a task waits, some thread is on its way to it: one woken
  for it, or one busy that looks at the queue before it sleeps or exits.
* **Warm, on demand, the hottest first.** Idle threads wait on a stack, each
  on its own lock; a task wakes the thread that went idle most recently, so
  calls made one after another keep reusing one thread while the others
  stay parked. A thread that finishes a task takes the next one waiting
  without sleeping, and a burst wakes its threads in a chain (each woken
  thread wakes the next), not all from the submitting thread. A new thread
  is started only when the tasks waiting outnumber the threads idle or on
  their way, while the set has fewer than its ``max_threads`` (the
  process-wide set: :data:`HARD_CAP`). So the set grows
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
  it for other runs, up to the bound, and only there do calls wait. The
  bound counts the threads that still take tasks: a thread stops counting
  when it decides to exit (idle too long, or retired), a moment before it
  is gone.
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
* **A task's last word comes last.** A task may return a :class:`Then`: its
  thread calls it once it has parked on the idle stack (or taken its next
  task), just before it sleeps. The scheduler's task returns its report to
  the driver so: the driver it wakes does not wait for this thread's
  bookkeeping to let go of the GIL (a woken thread that finds the GIL held
  sleeps again, a context switch per call). What a Then raises is ignored.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import collections
import itertools
import threading
from typing import Any, Callable, Optional, Union

from ._per_process import PerProcess, join_all

__all__ = ["ToolThreads", "Task", "Then", "shared", "retire_shared", "HARD_CAP", "IDLE_SECONDS", "PREFIX"]

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


class _Slot:
    """A thread's place on the idle stack, reused each time it idles.

    ``wake`` is a lock its thread holds while it has work or sleeps; a signal
    releases it once, and the thread's next acquire takes that signal.
    ``retire`` (set before the signal) says the signal means "exit".
    ``idle`` is true while the slot is on the stack. Both flags are guarded by
    :attr:`ToolThreads._lock`; ``wake`` is released only under that lock.
    """

    __slots__ = ("wake", "retire", "idle")

    def __init__(self) -> None:
        self.wake = threading.Lock()
        self.wake.acquire()
        self.retire = False
        self.idle = False


_PARKED = "parked"  # _after's answer: the thread is on the idle stack now
_LEAVE = "leave"  # _after's answer: the thread has left the set (uncounted): it exits


class ToolThreads:
    """At most ``max_threads`` threads running tasks, warm and idle-retiring (see the module docstring).

    ``idle_seconds`` is how long a thread waits for a task before it exits (0:
    at once, as soon as it finds nothing to do).
    """

    # One lock, _lock, guards every field below but the constants, and each
    # slot's flags; a slot's wake lock is released only while _lock is held.
    #
    # Invariant 1 (no task lost or run twice): a task not yet taken is in
    # _pending exactly once; a thread takes a task by popleft under _lock,
    # and from then on that thread alone owns it and runs it.
    #
    # Invariant 2 (someone is coming): whenever _lock is free and _pending is
    # not empty, either _waking is true (a thread was signalled for a task and
    # has not yet come for one: it will), or _idle is empty and some member
    # thread is busy or starting (it looks at _pending under _lock before it
    # parks or exits, and takes a task if there is one). Each lock section
    # keeps it: submit signals the top of the stack, or starts a thread, or
    # (at the bound, nothing idle) relies on the busy members; a woken thread
    # that takes a task and sees more waiting signals the next one (the
    # chain); a thread parks or exits only with _pending empty.
    #
    # Signals: a slot leaves the stack either by its own timeout (no signal;
    # under _lock, so a signaller never sees it) or by a signal (task or
    # retire), which releases its wake lock once, under _lock. So a thread
    # whose wait timed out and that finds, under _lock, its slot off the
    # stack, knows the release has happened: its acquire cannot block, and no
    # stale signal is left for its next idle spell. A thread counts in
    # _count (the bound) from its start until the lock section in which it
    # decides to exit, so a task queued at the bound never waits for a
    # thread that is leaving.
    #
    # (Measured against one shared queue that every idle thread waits on,
    # which wakes the longest-waiting thread: a worker runtime's sequential
    # awaits take fewer context switches on one hot thread; see
    # benchmarks/README.rst. And against the submitter waking one idle thread
    # per waiting task at once instead of the chain: a 50-wide fan-out's
    # calls began within 0.96-0.98 ms either way (chain 0.94-0.95), the GIL
    # letting one woken thread at a time reach its tool, and its first call
    # began 0.2 ms later, the driver waking 50 threads before it could wait;
    # bench_fanout's "where it goes" rows.)

    def __init__(self, max_threads: int = HARD_CAP, prefix: str = PREFIX, idle_seconds: float = IDLE_SECONDS) -> None:
        self._max = max_threads
        self._prefix = prefix
        self._idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._pending: collections.deque[Task] = collections.deque()  # FIFO: tasks no thread has taken
        self._idle: list[_Slot] = []  # the idle stack: the top is the most recently idled
        self._waking = False  # a slot was signalled for a task and its thread has not yet come for one
        self._starting = 0  # threads started that have not yet looked at _pending
        self._count = 0  # member threads: started and not yet decided to exit (the bound counts these)
        self._threads: set[threading.Thread] = set()  # threads started and not yet exited (or exiting)
        self._serial = itertools.count()
        self._retire_before = -1  # threads with a serial below this retire once their task is done
        self._closed = False
        # Test hooks, called outside _lock when set: _went_idle is released
        # each time a thread goes idle (tests wait on it for "every thread is
        # idle" without polling); _on_leave is called by a thread that has
        # decided to exit, just before it does.
        self._went_idle: Optional[threading.Semaphore] = None
        self._on_leave: Optional[Callable[[], None]] = None

    @property
    def max_threads(self) -> int:
        return self._max

    def counts(self) -> tuple[int, int]:
        """(threads that take tasks, of which idle). A snapshot: it may be stale at once."""
        with self._lock:
            return self._count, len(self._idle)

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
            pending = self._pending
            pending.append(task)
            if self._idle and not self._waking:
                self._signal_top()
            elif len(pending) > self._waking + len(self._idle) + self._starting and self._count < self._max:
                serial = next(self._serial)
                start = threading.Thread(
                    target=self._work, args=(serial,), name=f"{self._prefix}-{serial}", daemon=True
                )
                self._count += 1
                self._starting += 1
                self._threads.add(start)
        if start is not None:
            self._start(start, task)
        return task

    def _signal_top(self) -> None:
        """Wake the top of the idle stack to come for a task (under _lock; _idle not empty, not _waking)."""
        slot = self._idle.pop()
        slot.idle = False
        self._waking = True
        slot.wake.release()

    def _start(self, thread: threading.Thread, task: Task) -> None:
        """Start a new thread (counted already) for the queue; if it cannot
        start, the others take ``task`` or, with none left, it is taken back."""
        try:
            thread.start()
        except BaseException as exc:
            if thread.ident is not None:
                raise  # it started (a KeyboardInterrupt landed as it did): it comes for the queue
            with self._lock:
                self._count -= 1
                self._starting -= 1
                self._threads.discard(thread)
                if self._count > 0 and isinstance(exc, Exception):
                    if self._idle and not self._waking:
                        self._signal_top()  # invariant 2: a member is busy, starting, woken, or this one
                    return
                # No thread to come for it: not queued. (A task an earlier
                # submit queued while this start was still counted, and
                # whose own thread failed too, waits in _pending for the
                # next thread the set manages to start: the one gap in
                # invariant 2, when the OS refuses every thread.)
                try:
                    self._pending.remove(task)
                except ValueError:
                    return  # a finishing thread took it already: it runs
            raise

    def retire_idle(self) -> list[threading.Thread]:
        """Retire every thread of the set now: the idle ones exit at once, the
        busy ones when their current task is done and no task waits. Threads
        started after this call are not affected. Returns the threads retired."""
        with self._lock:
            self._retire_before = next(self._serial)
            retired = list(self._threads)
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            for slot in idle:
                slot.idle = False
                slot.retire = True
                slot.wake.release()
        return retired

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more tasks; each thread exits once the queue is empty (its current task done).

        ``cancel_futures`` drops the tasks still waiting; ``wait`` joins the
        threads. Never called on the shared set (:func:`shared`).
        """
        with self._lock:
            self._closed = True
            dropped = list(self._pending) if cancel_futures else []
            if cancel_futures:
                self._pending.clear()
        for task in dropped:
            task.cancel()
        threads = self.retire_idle()
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _work(self, serial: int) -> None:
        slot = _Slot()  # this thread's own place on the idle stack
        lock = self._lock
        with lock:
            self._starting -= 1
            step = self._after(slot, serial)
        while True:
            if step is _PARKED:
                if self._went_idle is not None:
                    self._went_idle.release()
                step = self._wait(slot)
                continue
            if step is _LEAVE:
                break
            assert isinstance(step, Task)
            then = _run(step)
            del step
            with lock:
                step = self._after(slot, serial)
            if then is not None:
                # The task's last word (its report), said once this thread has parked or
                # taken its next task: whoever it wakes finds the GIL about to be free.
                _then(then)
        if self._on_leave is not None:
            self._on_leave()

    def _after(self, slot: _Slot, serial: int) -> Union[Task, str]:
        """What a thread with no task does next (under _lock): the queue's
        head, or exit (retired or shut down), or park on the idle stack."""
        if self._pending:
            return self._pending.popleft()  # without sleeping
        if serial < self._retire_before or self._closed:
            self._leave()
            return _LEAVE
        slot.idle = True
        self._idle.append(slot)
        return _PARKED  # invariant 2 holds: _pending is empty

    def _wait(self, slot: _Slot) -> Union[Task, str]:
        """Sleep on the idle stack until signalled, or ``idle_seconds``; then what to do."""
        if not slot.wake.acquire(True, self._idle_seconds):
            with self._lock:
                if slot.idle:  # no signal came, nor will while this holds _lock
                    slot.idle = False
                    self._idle.remove(slot)
                    if self._pending:
                        # A task waits for the thread being woken (invariant
                        # 2): this one is awake, so it takes it; the other,
                        # finding none, parks again.
                        return self._pending.popleft()
                    self._leave()
                    return _LEAVE
            # Signalled under _lock before this thread took it: released already.
            slot.wake.acquire()
        with self._lock:
            return self._woken(slot)

    def _woken(self, slot: _Slot) -> Union[Task, str]:
        """A signalled thread comes for its task (under _lock)."""
        if slot.retire:
            slot.retire = False
            self._threads.discard(threading.current_thread())  # uncounted by retire_idle already
            return _LEAVE
        self._waking = False
        pending = self._pending
        if not pending:
            # A thread that finished first took the task: idle again, unwoken.
            slot.idle = True
            self._idle.append(slot)
            return _PARKED
        task = pending.popleft()
        if pending and self._idle:
            self._signal_top()  # the chain: the next waiting task wakes the next thread
        return task

    def _leave(self) -> None:
        """This thread leaves the set (under _lock): it no longer counts, and exits."""
        self._count -= 1
        self._threads.discard(threading.current_thread())


def _run(task: Task) -> "Optional[Then]":
    """Run ``task``; what it returned, when that is a :class:`Then`, to be called next."""
    try:
        fn, args = task._slot.pop()  # noqa: SLF001
    except IndexError:
        return None  # cancelled before it started
    try:
        then = fn(*args)
    except BaseException:  # the task has reported it; this thread goes on
        return None
    return then if isinstance(then, Then) else None


def _then(then: "Then") -> None:
    try:
        then()
    except BaseException:  # the task's own, as above
        pass


class Then:
    """What a task may return: called by its thread once it has parked (or
    taken its next task), just before it sleeps, instead of at the task's end.
    A task that wakes another thread as its last act (a report) does it here,
    so the woken thread does not wait for this one's bookkeeping to let go of
    the GIL. Subclass it and define ``__call__``."""

    __slots__ = ()

    def __call__(self) -> None:
        raise NotImplementedError


# A child process forked while threads run gets a fresh, empty set.
_SHARED: PerProcess[ToolThreads] = PerProcess(ToolThreads)


def shared() -> ToolThreads:
    """The process's shared tool threads (made on first use; a fresh set in a forked child)."""
    return _SHARED.get()


def retire_shared(timeout: float = 10.0) -> list[threading.Thread]:
    """Retire the shared set's threads (:meth:`ToolThreads.retire_idle`) and
    wait up to ``timeout`` seconds for them to exit; returns those still
    alive, each busy in a tool that has not returned. For whoever counts
    threads (tests, leak checks): the next run starts its threads afresh."""
    return join_all(shared().retire_idle(), timeout)

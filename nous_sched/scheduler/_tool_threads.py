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

Every decision above (which thread takes which task, when a thread starts,
parks, wakes or leaves) is made by the pure hand-off core,
:mod:`nous_sched.scheduler._tool_handoff`, whose state machine test drives it through
every interleaving; this module is its shell: the lock, the threads, their
wake locks, and running the tasks.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Union

from ._per_process import PerProcess, join_all
from ._tool_handoff import LEAVE, PARKED, Handoff, Slot

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


class _Slot(Slot):
    """A thread's place in the set (:class:`~._tool_handoff.Slot`), with its
    wake lock: held by its thread while it has work or sleeps; a signal
    releases it once (always under :attr:`ToolThreads._lock`), and the
    thread's next acquire takes that signal."""

    __slots__ = ("wake",)

    def __init__(self, serial: int) -> None:
        super().__init__(serial)
        self.wake = threading.Lock()
        self.wake.acquire()

    def signal(self) -> None:
        self.wake.release()


class ToolThreads:
    """At most ``max_threads`` threads running tasks, warm and idle-retiring (see the module docstring).

    ``idle_seconds`` is how long a thread waits for a task before it exits (0:
    at once, as soon as it finds nothing to do).
    """

    # Every decision is the hand-off core's (_tool_handoff.Handoff: which
    # thread takes which task, when a thread starts, parks or leaves; its
    # invariants, per field, are written there and checked by a state machine
    # test). This shell holds one lock, _lock, around every call to the core
    # and every change to _threads; it starts the threads the core asks for,
    # sleeps each on its slot's wake lock, and runs the tasks.
    #
    # A slot's wake lock is released only under _lock (by the core's
    # signal), and a slot leaves the idle stack either by its own timeout
    # (no signal) or by a signal. So a thread whose wait timed out and that
    # finds, under _lock, its slot off the stack knows the release has
    # happened: its acquire cannot block, and no stale signal is left for its
    # next idle spell.
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
        self._prefix = prefix
        self._idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._core: Handoff[Task] = Handoff(max_threads)
        self._threads: set[threading.Thread] = set()  # threads started and not yet exited (or exiting)
        # Test hooks, called outside _lock when set: _went_idle is released
        # each time a thread goes idle (tests wait on it for "every thread is
        # idle" without polling); _on_leave is called by a thread that has
        # decided to exit, just before it does.
        self._went_idle: Optional[threading.Semaphore] = None
        self._on_leave: Optional[Callable[[], None]] = None

    @property
    def max_threads(self) -> int:
        return self._core.max_threads

    def counts(self) -> tuple[int, int]:
        """(threads that take tasks, of which idle). A snapshot: it may be stale at once."""
        with self._lock:
            return self._core.count, len(self._core.idle)

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
            serial = self._core.submit(task)
            if serial is None:
                return task
            thread = threading.Thread(target=self._work, args=(serial,), name=f"{self._prefix}-{serial}", daemon=True)
            self._threads.add(thread)
        self._start(thread, task)
        return task

    def _start(self, thread: threading.Thread, task: Task) -> None:
        """Start a new thread (counted already) for the queue; if it cannot
        start, the others take ``task`` or, with none left, it is taken back."""
        try:
            thread.start()
        except BaseException as exc:
            if thread.ident is not None:
                raise  # it started (a KeyboardInterrupt landed as it did): it comes for the queue
            with self._lock:
                self._threads.discard(thread)
                if not self._core.start_failed(task, isinstance(exc, Exception)):
                    return
            raise

    def retire_idle(self) -> list[threading.Thread]:
        """Retire every thread of the set now: the idle ones exit at once, the
        busy ones when their current task is done and no task waits. Threads
        started after this call are not affected. Returns the threads retired."""
        with self._lock:
            self._core.retire()
            return list(self._threads)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more tasks; each thread exits once the queue is empty (its current task done).

        ``cancel_futures`` drops the tasks still waiting; ``wait`` joins the
        threads. Never called on the shared set (:func:`shared`).
        """
        with self._lock:
            dropped = self._core.close(cancel_futures)
        for task in dropped:
            task.cancel()
        threads = self.retire_idle()
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _work(self, serial: int) -> None:
        slot = _Slot(serial)  # this thread's own place on the idle stack
        lock = self._lock
        core = self._core
        step = self._begin(slot)
        while True:
            if step is PARKED:
                if self._went_idle is not None:
                    self._went_idle.release()
                step = self._wait(slot)
                continue
            if step is LEAVE:
                break
            assert isinstance(step, Task)
            # Run here, not in a helper function: a frame fewer on every call's path.
            try:
                fn, args = step._slot.pop()  # noqa: SLF001
            except IndexError:  # cancelled before it started
                fn, args = _nothing, ()
            try:
                then = fn(*args)
            except BaseException:  # the task has reported it; this thread goes on
                then = None
            # Nothing of the task is held while this thread parks: its objects are its run's.
            del step, fn, args
            if not isinstance(then, Then):
                then = None
            # acquire/release, not `with`: 1k instructions fewer per use (3.11 looks up and
            # calls __enter__ and __exit__ the slow way). The acquire is the try's first call,
            # as `with` would have it: whatever is raised into this thread at that call's
            # check for signals lands inside the try, after the lock was taken. (Only this
            # set's own threads run here: no signal handler runs in them to break off the
            # acquire itself, as one can on the main thread, where a `with` is needed.)
            try:
                lock.acquire()
                step = core.after(slot)
                if step is LEAVE:
                    self._threads.discard(threading.current_thread())
            finally:
                lock.release()
            if then is not None:
                # The task's last word (its report), said once this thread has parked or
                # taken its next task: whoever it wakes finds the GIL about to be free.
                try:
                    then()
                except BaseException:  # the task's own, as its run's above
                    pass
        if self._on_leave is not None:
            self._on_leave()

    def _begin(self, slot: _Slot) -> "Union[Task, str]":
        """A new thread's first step."""
        with self._lock:
            step = self._core.begin(slot)
            if step is LEAVE:
                self._threads.discard(threading.current_thread())
            return step

    def _wait(self, slot: _Slot) -> "Union[Task, str]":
        """Sleep on the idle stack until signalled, or ``idle_seconds``; then what to do."""
        core = self._core
        if not slot.wake.acquire(True, self._idle_seconds):
            with self._lock:
                step = core.timed_out(slot)
                if step is LEAVE:
                    self._threads.discard(threading.current_thread())
            if step is not None:
                return step
            # Signalled under _lock before this thread took it: released already.
            slot.wake.acquire()
        lock = self._lock
        try:
            lock.acquire()  # (not `with`: see _work)
            step = core.woken(slot)
            if step is LEAVE:
                self._threads.discard(threading.current_thread())
            return step
        finally:
            lock.release()


def _nothing() -> None:
    """A cancelled task's stand-in."""


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

"""Driver threads: the warm set of threads that drive the process's
:class:`~nous_sched.Scheduler` objects, one scheduler per thread at a time.

Every scheduler needs one thread that owns its lane for the scheduler's whole
life (its *driver*). Starting a thread per run and joining it at the end cost
a run a thread's creation, its start-up hand-shake and its exit; so a
scheduler borrows a driver from this set and gives it back when it stops. What
a caller may rely on:

* **One scheduler per thread, one thread per scheduler.** :meth:`DriverThreads.drive`
  gives ``fn()`` a thread of the set that runs nothing else until ``fn``
  returns; a thread takes its next ``fn`` only after that. ``fn`` runs once
  the caller calls the ``wake`` it got back (a scheduler: with its first
  message), so a warm thread wakes once per scheduler. So a scheduler's
  driver is one thread for its whole life, and owns every decision of its lane.
* **Done means done.** ``done``, a lock the caller holds when it calls
  :meth:`~DriverThreads.drive`, is released by the thread once ``fn`` has
  returned (or raised), after the thread has dropped every reference it had
  to ``fn``: once a waiter has acquired ``done``, the thread never touches
  ``fn`` or what it reaches again. ``Scheduler.stop`` waits on it where it
  used to join its thread.
* **Warm, on demand, never waiting.** A thread that finished its ``fn``
  waits, idle, for the next; :meth:`~DriverThreads.drive` hands ``fn`` to the
  most recently idle thread if there is one, and otherwise starts one. The
  set is not bounded in total (every live scheduler has its own driver: a
  scheduler never waits for another to stop); it is bounded in what it keeps:
* **Bounded idle.** At most ``max_idle`` threads (:data:`MAX_IDLE`) wait
  idle; a thread that finishes while that many wait exits.
* **Idle threads retire.** A thread that waits ``idle_seconds``
  (:data:`IDLE_SECONDS`) with no ``fn`` to run exits; since the most recently
  idle thread is reused first, the surplus of a burst retires even under a
  steady trickle of schedulers, and a process that stops running code ends
  up with no driver thread. :func:`retire_shared` retires them at once and
  says which are still driving (what a leak check counts: a thread still
  driving is a scheduler that has not stopped, or a driver stuck in a tool's
  ``concurrency_safe`` predicate).
* **Named for what they do.** A thread is named ``name`` (the argument of
  :meth:`~DriverThreads.drive`: ``nous-sched-driver-<n>``, after the scheduler
  it drives) from the moment :meth:`~DriverThreads.drive` returns until ``fn``
  is over, and ``nous-sched-idle-driver-<k>`` while idle (:data:`IDLE_PREFIX`),
  so a stuck process still says which scheduler each thread drives. Daemon
  threads: interpreter exit does not wait for them.
* **An ``fn`` that raises** ends its thread as it would end a thread of its
  own: the thread leaves the set and dies with the exception, under the name
  it had, so :func:`threading.excepthook` reports it as before (``done`` is
  released first).
* **Fork.** A child process forked while threads run gets a fresh, empty
  shared set (``os.register_at_fork``); the parent's set is marked
  :attr:`~DriverThreads.forked_away` there: its threads do not exist in the
  child, and no ``done`` of theirs will ever be released.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Optional

from ._per_process import PerProcess, join_all

__all__ = ["DriverThreads", "shared", "retire_shared", "MAX_IDLE", "IDLE_SECONDS", "IDLE_PREFIX"]

#: How many idle threads the shared set keeps at most.
MAX_IDLE = 64
#: How long a thread of the shared set waits idle before it exits.
IDLE_SECONDS = 30.0
#: An idle thread's name: ``nous-sched-idle-driver-<k>``.
IDLE_PREFIX = "nous-sched-idle-driver"

_Job = tuple[Callable[[], Any], str, Any]  # (fn, the thread's name while it runs, the done lock)


class _Waiting:
    """An idle thread's place: it waits on ``lock`` (held while it waits) for ``job``."""

    __slots__ = ("thread", "lock", "job")

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread
        self.lock = threading.Lock()
        self.lock.acquire()
        self.job: Optional[_Job] = None  # set, then lock released, by whoever hands it a job (None: retire)


class DriverThreads:
    """Threads that each run one ``fn`` at a time, kept warm between them (see the module docstring)."""

    # Each idle thread waits on a lock of its own (its _Waiting); drive()
    # takes the most recently idle one off the stack, names it, gives it the
    # job and releases its lock, all under _lock. So the thread bears the
    # scheduler's name from the moment drive() returns, the warmest thread is
    # reused, and a thread at the bottom of the stack (idle longest) is the
    # one that times out. A thread is on the stack exactly while it waits for
    # a job nobody has handed it: whoever takes it off (drive, retire_idle,
    # or the thread itself as it times out) decides what it does next.
    #
    # _lock guards _waiting, _count, _threads and _retire_before.

    def __init__(
        self, max_idle: int = MAX_IDLE, idle_seconds: float = IDLE_SECONDS, idle_prefix: str = IDLE_PREFIX
    ) -> None:
        self._max_idle = max_idle
        self._idle_seconds = idle_seconds
        self._idle_prefix = idle_prefix
        self._lock = threading.Lock()
        self._waiting: list[_Waiting] = []  # idle threads, the most recently idle last
        self._count = 0  # threads alive or starting
        self._threads: set[threading.Thread] = set()
        self._serial = itertools.count()
        self._retire_before = -1  # threads with a serial below this exit once their fn is done
        #: True in a child process forked from the one that made this set: no thread of it runs here.
        self.forked_away = False
        # Released each time a thread goes idle, when set (tests wait on it
        # for "the driver is back in the set" without polling).
        self._went_idle: Optional[threading.Semaphore] = None

    def counts(self) -> tuple[int, int]:
        """(threads alive or starting, of which idle). A snapshot: it may be stale at once."""
        with self._lock:
            return self._count, len(self._waiting)

    def threads(self) -> list[threading.Thread]:
        """The set's threads, alive or starting (a snapshot)."""
        with self._lock:
            return list(self._threads)

    def drive(self, fn: Callable[[], Any], name: str, done: Any) -> Callable[[], None]:
        """Give ``fn()`` a thread of the set, named ``name`` from now until
        ``fn`` is over; returns at once, with ``wake``.

        ``fn`` runs once ``wake()`` has been called (call it exactly once, at
        the latest when ``fn`` has something to do: a warm thread sleeps until
        then, so a scheduler's driver wakes once, for its first message, not
        once more before it); a thread started for it may begin at once.
        ``done`` (a held ``threading.Lock``) is released once ``fn`` is over.

        :raises RuntimeError: no thread could be started and none is idle
            (``fn`` will not run). Any other exception (a ``KeyboardInterrupt``
            landing here) leaves ``fn`` either not run or running.
        """
        job = (fn, name, done)
        with self._lock:
            if self._waiting:
                waiting = self._waiting.pop()
                try:
                    waiting.job = job
                    waiting.thread.name = name
                except BaseException:  # the thread taken off the stack must not wait for a wake that never comes
                    waiting.lock.release()
                    raise
                return waiting.lock.release
            serial = next(self._serial)
            # The job goes in a list the thread empties: Thread keeps its args
            # until the thread ends, and they must not keep fn alive.
            start = threading.Thread(target=self._work, args=(serial, [job]), name=name, daemon=True)
            self._count += 1
            self._threads.add(start)
        try:
            start.start()
        except BaseException:
            if start.ident is None:  # it never ran: it takes nothing
                with self._lock:
                    self._count -= 1
                    self._threads.discard(start)
            raise  # else it started (a KeyboardInterrupt landed as it did): it runs the job
        return _started

    def retire_idle(self) -> list[threading.Thread]:
        """Retire every thread of the set now: the idle ones exit at once, the
        driving ones when their ``fn`` is done. Threads started after this
        call are not affected. Returns the threads retired."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
            self._retire_before = next(self._serial)
            retired = list(self._threads)
            for place in waiting:
                place.job = None
                place.lock.release()
        return retired

    def _work(self, serial: int, box: list[_Job]) -> None:
        me = threading.current_thread()
        place = _Waiting(me)
        idle_name = f"{self._idle_prefix}-{serial}"
        while True:
            # _run empties the box: no frame of this thread holds the job after it.
            if not self._run(box, place, idle_name, serial):
                return
            job = self._next(place)
            if job is None:
                return
            box.append(job)
            del job

    def _next(self, place: _Waiting) -> Optional[_Job]:
        """Wait, idle and on the stack, for the next job; None: this thread has left the set."""
        if not place.lock.acquire(True, self._idle_seconds):
            with self._lock:
                if place in self._waiting:  # idle too long, and nobody took it off the stack
                    self._waiting.remove(place)
                    self._leave(place.thread)
                    return None
            place.lock.acquire()  # taken off the stack just now: its job (or retirement) is coming
        job, place.job = place.job, None
        if job is None:  # retire_idle
            with self._lock:
                self._leave(place.thread)
        return job

    def _run(self, box: list[_Job], place: _Waiting, idle_name: str, serial: int) -> bool:
        """Run the job in ``box`` (taking it out); True if this thread then
        waits for the next (it is on the stack already)."""
        fn, name, done = box.pop()
        me = place.thread
        try:
            fn()
        except BaseException:
            with self._lock:
                self._leave(me)
            done.release()
            raise  # this thread dies of it, under the scheduler's name, as a thread of its own would
        del fn  # no reference to the scheduler survives the release below
        me.name = idle_name
        # On the stack before `done` is released: a scheduler made the moment
        # the last one stops finds this thread waiting for it.
        with self._lock:
            stay = len(self._waiting) < self._max_idle and serial >= self._retire_before
            if stay:
                self._waiting.append(place)
            else:
                self._leave(me)
        done.release()
        if stay and self._went_idle is not None:
            self._went_idle.release()
        return stay

    def _leave(self, me: threading.Thread) -> None:
        """This thread leaves the set (under _lock)."""
        self._count -= 1
        self._threads.discard(me)


def _started() -> None:
    """The ``wake`` of a job given to a thread started for it: it runs already."""


def _forsake(parents: DriverThreads) -> None:
    # In a forked child: the parent's threads do not exist here. A scheduler
    # inherited from the parent has no driver here; forked_away tells its
    # stop() not to wait for one.
    parents.forked_away = True


# A child process forked while threads run gets a fresh, empty set.
_SHARED: PerProcess[DriverThreads] = PerProcess(DriverThreads, _forsake)


def shared() -> DriverThreads:
    """The process's shared driver threads (made on first use; a fresh set in a forked child)."""
    return _SHARED.get()


def retire_shared(timeout: float = 10.0) -> list[threading.Thread]:
    """Retire the shared set's threads (:meth:`DriverThreads.retire_idle`)
    and wait up to ``timeout`` seconds for them to exit; returns those still
    alive, each driving a scheduler that has not stopped (or stuck in a
    predicate). For whoever counts threads (tests, leak checks): the next
    scheduler starts its driver afresh."""
    return join_all(shared().retire_idle(), timeout)

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
* **Parked between messages.** ``fn`` may return :data:`PARK` instead of
  ending: its thread then sleeps, still ``fn``'s and under its name, until
  :meth:`Driving.resume` (``fn`` is called again, on the same thread) or
  :meth:`DriverThreads.take_back` (``fn`` is over without running again:
  the caller did its last act). ``take_back`` puts the sleeping thread back
  idle without waking it, and releases ``done``: so a scheduler whose driver
  has nothing to do stops with no thread woken and none waited for. The
  caller calls exactly one of them per park, and ``take_back`` only while
  ``fn`` has returned :data:`PARK` or never ran (its first wake not called).
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
import time
from typing import Any, Callable, Optional

from ._per_process import PerProcess, join_all

__all__ = [
    "DriverThreads",
    "Driving",
    "PARK",
    "shared",
    "retire_shared",
    "MAX_IDLE",
    "IDLE_SECONDS",
    "IDLE_PREFIX",
]

#: How many idle threads the shared set keeps at most.
MAX_IDLE = 64
#: How long a thread of the shared set waits idle before it exits.
IDLE_SECONDS = 30.0
#: An idle thread's name: ``nous-sched-idle-driver-<k>``.
IDLE_PREFIX = "nous-sched-idle-driver"

_Job = tuple[Callable[[], Any], str, Any]  # (fn, the thread's name while it runs, the done lock)

#: What ``fn`` returns to sleep, still its thread's, until resumed or taken back (see the module docstring).
PARK: Any = object()
_RESUME: Any = object()  # a parked fn's place's job: call fn again


class _Waiting:
    """A thread's place: it waits on ``lock`` (held while it waits) for ``job``;
    ``box`` holds the job it runs (emptied as the job ends, or by ``take_back``)."""

    __slots__ = ("thread", "lock", "job", "box", "serial", "idle_name", "since")

    def __init__(self, thread: threading.Thread, serial: int, idle_name: str) -> None:
        self.thread = thread
        self.lock = threading.Lock()
        self.lock.acquire()
        # Set, then lock released, by whoever hands it a job (None: retire; _RESUME: a parked fn goes on).
        self.job: Optional[_Job] = None
        self.box: list[_Job] = []
        self.serial = serial
        self.idle_name = idle_name
        self.since = 0.0  # when it last went on the idle stack (time.monotonic)


class Driving:
    """What :meth:`DriverThreads.drive` returns: call it once to wake ``fn``;
    :meth:`resume` a parked ``fn``; :attr:`thread` is the thread that runs it;
    :attr:`warm`: it was idle, and runs ``fn`` only once woken (else it was
    started for ``fn``, and may run it already)."""

    __slots__ = ("thread", "warm", "place", "_first")

    def __init__(self, place: _Waiting, first: Callable[[], None]) -> None:
        self.thread = place.thread
        self.warm = first is not _started
        self.place = place  # (for DriverThreads.take_back)
        self._first = first

    def __call__(self) -> None:
        """The first wake (exactly once)."""
        self._first()

    def resume(self) -> None:
        """``fn`` returned :data:`PARK`: call it again, on its thread (once per park)."""
        place = self.place
        place.job = _RESUME
        place.lock.release()


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

    def drive(self, fn: Callable[[], Any], name: str, done: Any) -> Driving:
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
                    return Driving(waiting, waiting.lock.release)
                except BaseException:  # the thread taken off the stack must not wait for a wake that never comes
                    waiting.lock.release()
                    raise
            serial = next(self._serial)
            # The job goes in its place's box, which the thread empties (not in
            # Thread's args: Thread keeps them until the thread ends, and they
            # must not keep fn alive).
            args: list[_Waiting] = []  # (the place names its thread: it is put in once both exist)
            start = threading.Thread(target=self._work, args=args, name=name, daemon=True)
            place = _Waiting(start, serial, f"{self._idle_prefix}-{serial}")
            place.box.append(job)
            args.append(place)
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
        return Driving(place, _started)

    def take_back(self, driving: Driving) -> None:
        """``driving``'s ``fn`` is over without running again: it returned
        :data:`PARK` and was not resumed, or it never ran (its first wake was
        not called, on a thread that was idle). Its thread goes back idle as
        if ``fn`` had returned, without being woken (it exits, woken, when
        enough threads are idle), and ``done`` is released, from this thread."""
        place = driving.place
        with self._lock:
            job = place.box[0] if place.box else place.job
            assert job is not None and job is not _RESUME, "take_back of a driver that is not parked"
            done = job[2]
            del job
            place.box.clear()
            place.job = None  # (no reference to fn stays behind)
            place.thread.name = place.idle_name
            stay = len(self._waiting) < self._max_idle and place.serial >= self._retire_before
            if stay:
                place.since = time.monotonic()
                self._waiting.append(place)
            else:
                place.lock.release()  # it wakes to a job of None: it leaves the set
        done.release()
        if stay and self._went_idle is not None:
            self._went_idle.release()

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

    def _work(self, place: _Waiting) -> None:
        box = place.box
        while True:
            # _run empties the box: no frame of this thread holds the job after it.
            job = self._run(place)
            if job is _STAY:
                job = self._next(place)
            if job is None:
                return
            box.append(job)
            del job

    def _next(self, place: _Waiting) -> Any:
        """Wait for the next job (idle and on the stack), or, parked, for
        :data:`_RESUME` or a take-back; None: this thread has left the set."""
        timeout = self._idle_seconds
        while not place.lock.acquire(True, timeout):
            with self._lock:
                if place not in self._waiting:  # parked, or taken off the stack just now: its job is coming
                    timeout = self._idle_seconds
                    continue
                timeout = place.since + self._idle_seconds - time.monotonic()
                if timeout <= 0:  # idle too long, and nobody took it off the stack
                    self._waiting.remove(place)
                    self._leave(place.thread)
                    return None
        job, place.job = place.job, None
        if job is None:  # retire_idle, or taken back with enough threads idle
            with self._lock:
                self._leave(place.thread)
        return job

    def _run(self, place: _Waiting) -> Any:
        """Run the job in the place's box (taking it out); :data:`_STAY` if
        this thread then waits for the next (it is on the stack already), or
        what it got while parked when ``fn`` was taken back (the next job,
        or None: it has left the set)."""
        box = place.box
        me = place.thread
        while True:
            try:
                parked = box[0][0]() is PARK  # (no local holds fn while it sleeps parked)
            except BaseException:
                _, _, done = box.pop()
                with self._lock:
                    self._leave(me)
                done.release()
                raise  # this thread dies of it, under the scheduler's name, as a thread of its own would
            if not parked:
                break
            job = self._next(place)
            if job is not _RESUME:
                return job  # taken back: take_back emptied the box and released done
        _, _, done = box.pop()  # no reference to the scheduler survives the release below
        me.name = place.idle_name
        # On the stack before `done` is released: a scheduler made the moment
        # the last one stops finds this thread waiting for it.
        with self._lock:
            stay = len(self._waiting) < self._max_idle and place.serial >= self._retire_before
            if stay:
                place.since = time.monotonic()
                self._waiting.append(place)
            else:
                self._leave(me)
        done.release()
        if stay and self._went_idle is not None:
            self._went_idle.release()
        return _STAY if stay else None

    def _leave(self, me: threading.Thread) -> None:
        """This thread leaves the set (under _lock)."""
        self._count -= 1
        self._threads.discard(me)


_STAY: Any = object()  # _run: this thread waits, idle, for its next job


def _started() -> None:
    """The first wake of a job given to a thread started for it: it runs already."""


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

"""Interrupts held back across the few steps that must not be split (private).

A ``KeyboardInterrupt`` is raised on the main thread wherever Python next
checks for signals: between the call that made a pipe and the statement that
stores it, between a place granted and the variable that would give it
back. Nothing a ``finally`` can do helps there: the interrupt can land at the
finally's first step, before its clean-up began. So a run on the main thread
(:class:`guarded`) puts a handler of its own in front of the handler it
finds for each of :data:`DEFERRED_SIGNALS` that Python handles, for the
run's length, and the steps that must happen together run *deferred*: such
a signal arriving then is remembered and handled (by the handler found, so
its behaviour is kept) as the outermost deferred step ends. Everywhere else
it is handled at once, as before; blocking waits are never deferred, so
Ctrl-C still stops a run promptly.

**What is deferred.** Not only ``SIGINT``: a server or worker's ``SIGTERM``
handler commonly raises (``SystemExit`` in gunicorn's and Celery's workers,
uvicorn's), and so may ``SIGHUP``, ``SIGQUIT``, ``SIGALRM`` (a signal-based
timeout, as pytest-timeout's) and ``SIGUSR1``/``SIGUSR2``: any exception a
handler raises splits a step the same way. Each of these whose handler is a
Python callable when the run starts is held back; one whose disposition is
the default or ignore is not touched (no Python code runs for it, and a
default ``SIGTERM`` ends the process). Signals that arrive during one step
are handled in the order they came, each once. Not deferred, because no
handler sees them: an exception another thread raises into this one
(``PyThreadState_SetAsyncExc``, which some timeout libraries use) lands at
the next instruction check, deferred step or not; such a library can split
a step, and the pool's clean-ups then do what a ``finally`` can.

Entering a deferred step is ``LOCAL.depth += 1``, written inline: the
interpreter checks for signals at calls and backward jumps, never between
the attribute loads and the store of that statement, so a ``finally`` or
``except`` whose first statement it is cannot be cut before it. Leave with
:func:`leave` in a ``finally``. :func:`deferred` is the same as a ``with``
block, for steps that need not start at a clause's first instruction.

What a caller may rely on (tests/test_pool_interrupts.py):

* outside a guarded run, or on any other thread, nothing changes (a
  signal handler only ever runs on the main thread; the depth is per
  thread, so another thread's deferred step never holds back the main
  thread's interrupt);
* a deferred signal that arrives during a deferred step of a guarded run is
  handled once, by the handler the run found, as soon as the step ends;
* the run's own handlers are in place only while the run lasts: the handlers
  found are back when :class:`guarded` exits, and a signal that arrives as
  it exits is not lost;
* a :class:`Condition`'s wait returns or raises holding its lock, whatever
  signal lands in it.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]
import collections
import signal
import threading
from _thread import allocate_lock
from types import FrameType, TracebackType
from typing import Any, Callable, Optional

__all__ = ["LOCAL", "guarded", "deferred", "leave", "Condition", "DEFERRED_SIGNALS"]

#: The signals a guarded run holds back in its deferred steps, when Python handles them.
DEFERRED_SIGNALS: tuple[int, ...] = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGALRM", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)

_Handler = Callable[[int, Optional[FrameType]], Any]


class _Local(threading.local):
    #: Deferred steps this thread is in (class attribute: the default, read in C).
    depth = 0


LOCAL = _Local()


class _State:
    """The main thread's: the handlers found, and the signals held back (in the order they came)."""

    __slots__ = ("found", "pending", "nested")

    def __init__(self) -> None:
        self.found: dict[int, _Handler] = {}
        self.pending: list[int] = []
        self.nested = False  # a guarded run is in progress (the outermost owns the handlers)


_STATE = _State()


def _handler(signum: int, frame: Optional[FrameType]) -> None:
    if LOCAL.depth > 0:
        if signum not in _STATE.pending:
            _STATE.pending.append(signum)
        return
    _deliver(signum, frame, _STATE.found)


def _deliver(signum: int, frame: Optional[FrameType], found: dict[int, _Handler]) -> None:
    handler = found.get(signum)
    if handler is not None:
        handler(signum, frame)
    elif signum == signal.SIGINT:  # (the run that found it is over: Python's default)
        raise KeyboardInterrupt


def leave() -> None:
    """End a deferred step; signals it held back are handled now, once the
    outermost one has ended."""
    LOCAL.depth -= 1
    if LOCAL.depth == 0 and _STATE.pending and threading.current_thread() is threading.main_thread():
        _raise_pending(_STATE.found)


def _raise_pending(found: dict[int, _Handler]) -> None:
    """Handle the held-back signals in order; one whose handler raises leaves the rest
    pending, for the next step's end or the run's."""
    while _STATE.pending:
        _deliver(_STATE.pending.pop(0), None, found)


class deferred:
    """``with deferred():`` runs its block as one deferred step."""

    __slots__ = ()

    def __enter__(self) -> None:
        LOCAL.depth += 1

    def __exit__(
        self, kind: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        leave()


class guarded:
    """A run on the calling thread: while it lasts, deferred steps on the main
    thread hold :data:`DEFERRED_SIGNALS` back. Nested runs share the outermost's
    handlers; off the main thread, or for a signal Python does not handle
    (ignored, or the default action), it does nothing."""

    __slots__ = ("_mine",)

    def __init__(self) -> None:
        self._mine = False

    def __enter__(self) -> "guarded":
        if threading.current_thread() is not threading.main_thread() or _STATE.nested:
            return self
        left = False
        # (The C module's calls, not signal.py's: those convert each number and
        # handler to an enum member and back, most of a run's cost here.)
        for signum in DEFERRED_SIGNALS:
            found = _signal.getsignal(signum)
            if found is _handler:
                # Left in place by a run whose exit an interrupt cut short: this
                # run takes it over, and puts the one found back.
                left = left or signum in _STATE.found
                continue
            if not callable(found):  # ignored, or the default action: not ours to change
                continue
            _STATE.found[signum] = found  # (before ours goes in: a signal then finds it)
            # A signal pending now is handled here, by the handler found, before ours is set.
            _signal.signal(signum, _handler)
            self._mine = True
        if left:
            self._mine = True
        elif self._mine:
            _STATE.pending.clear()
        if self._mine:
            _STATE.nested = True
        return self

    def __exit__(
        self, kind: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        if not self._mine:
            return
        self._mine = False
        _STATE.nested = False
        found = dict(_STATE.found)
        LOCAL.depth += 1
        try:
            # signal.signal runs the handlers of signals pending before it
            # changes one: ours, which holds a signal arriving now back.
            for signum, handler in found.items():
                _signal.signal(signum, handler)
        finally:
            LOCAL.depth -= 1
        # (The handlers found stay known: a signal held back past this exit, by a step
        # still open around it, is handled by its own when that step ends.)
        if LOCAL.depth == 0:
            _raise_pending(found)


class Condition:
    """``threading.Condition``'s ``wait``, ``notify`` and ``notify_all`` over a
    lock the caller holds, safe against interrupts: the wait gives the lock up
    and takes it back as deferred steps, so it returns or raises holding the
    lock, and it blocks with the caller's own deferral (a caller that lets
    interrupts through its wait gets them while it blocks).

    ``threading.Condition`` is not: its wait takes a plain lock back in a
    Python function, and even an ``RLock`` back only inside a ``try`` that a
    signal can land just before, so a Ctrl-C there leaves the waiter without
    the lock and its ``with`` gives back a lock it does not hold.
    """

    __slots__ = ("_lock", "_waiters")

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self._waiters: collections.deque[Any] = collections.deque()  # (lock held) one locked lock per waiter

    def wait(self, timeout: Optional[float] = None) -> bool:
        """(Lock held.) Wait until notified or ``timeout`` seconds pass; whether notified."""
        LOCAL.depth += 1
        waiter = allocate_lock()
        waiter.acquire()
        self._waiters.append(waiter)
        self._lock.release()
        got = False
        try:
            leave()
            got = waiter.acquire(True, -1 if timeout is None else max(timeout, 0.0))
        finally:
            LOCAL.depth += 1
            try:
                self._lock.acquire()
                if not got:
                    try:
                        self._waiters.remove(waiter)
                    except ValueError:  # (notified as it stopped waiting)
                        pass
            finally:
                leave()
        return got

    def notify(self, n: int = 1) -> None:
        """(Lock held.) Wake up to ``n`` waiters, longest waiting first."""
        waiters = self._waiters
        while waiters and n > 0:
            waiters.popleft().release()
            n -= 1

    def notify_all(self) -> None:
        """(Lock held.) Wake every waiter."""
        self.notify(len(self._waiters))

"""Ctrl-C held back across the few steps that must not be split (private).

A ``KeyboardInterrupt`` is raised on the main thread wherever Python next
checks for signals: between the call that made a pipe and the statement that
stores it, between a place granted and the variable that would give it
back. Nothing a ``finally`` can do helps there: the interrupt can land at the
finally's first step, before its clean-up began. So a run on the main thread
(:class:`guarded`) puts a handler of its own in front of the ``SIGINT``
handler it finds, for the run's length, and the steps that must happen
together run *deferred*: a ``SIGINT`` arriving then is remembered and raised
(by the handler found, so its behaviour is kept) as the outermost deferred
step ends. Everywhere else it is raised at once, as before; blocking waits
are never deferred, so Ctrl-C still stops a run promptly.

Entering a deferred step is ``LOCAL.depth += 1``, written inline: the
interpreter checks for signals at calls and backward jumps, never between
the attribute loads and the store of that statement, so a ``finally`` or
``except`` whose first statement it is cannot be cut before it. Leave with
:func:`leave` in a ``finally``. :func:`deferred` is the same as a ``with``
block, for steps that need not start at a clause's first instruction.

What a caller may rely on (tests/test_pool_interrupts.py):

* outside a guarded run, or on any other thread, nothing changes (a
  ``SIGINT`` handler only ever runs on the main thread; the depth is per
  thread, so another thread's deferred step never holds back the main
  thread's interrupt);
* a ``SIGINT`` that arrives during a deferred step of a guarded run is
  raised once, by the handler the run found, as soon as the step ends;
* the run's own handler is in place only while the run lasts: the handler
  found is back when :class:`guarded` exits, and a ``SIGINT`` that arrives as
  it exits is not lost.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any, Callable, Optional

__all__ = ["LOCAL", "guarded", "deferred", "leave"]


class _Local(threading.local):
    #: Deferred steps this thread is in (class attribute: the default, read in C).
    depth = 0


LOCAL = _Local()


class _State:
    """The main thread's: the handler found, and the interrupt held back."""

    __slots__ = ("found", "pending", "nested")

    def __init__(self) -> None:
        self.found: Optional[Callable[[int, Optional[FrameType]], Any]] = None
        self.pending: Optional[int] = None
        self.nested = False  # a guarded run is in progress (the outermost owns the handler)


_STATE = _State()


def _handler(signum: int, frame: Optional[FrameType]) -> None:
    if LOCAL.depth > 0:
        _STATE.pending = signum
        return
    found = _STATE.found
    if found is None:  # (set as the run's handler went in: Python's default meanwhile)
        raise KeyboardInterrupt
    found(signum, frame)


def leave() -> None:
    """End a deferred step; an interrupt it held back is raised now, once the
    outermost one has ended."""
    LOCAL.depth -= 1
    if LOCAL.depth == 0 and _STATE.pending is not None and threading.current_thread() is threading.main_thread():
        _raise_pending()


def _raise_pending() -> None:
    signum, _STATE.pending = _STATE.pending, None
    found = _STATE.found
    if signum is None:
        return
    if found is None:  # (the run that found it is over)
        raise KeyboardInterrupt
    found(signum, None)


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
    thread hold ``SIGINT`` back. Nested runs share the outermost's handler;
    off the main thread, or when ``SIGINT`` is ignored or not handled by
    Python, it does nothing."""

    __slots__ = ("_mine",)

    def __init__(self) -> None:
        self._mine = False

    def __enter__(self) -> "guarded":
        if threading.current_thread() is not threading.main_thread():
            return self
        # (One system call, not two: signal.signal says what it replaced. A
        # SIGINT pending now is raised here, before ours is set.)
        found = signal.signal(signal.SIGINT, _handler)
        if found is _handler:
            if _STATE.found is not None and not _STATE.nested:
                # Left in place by a run whose exit an interrupt cut short:
                # this run takes it over, and puts the one found back.
                self._mine = True
                _STATE.nested = True
            return self
        if not callable(found):  # ignored, or the default action: not ours to change
            signal.signal(signal.SIGINT, found)
            return self
        _STATE.found = found
        _STATE.pending = None
        _STATE.nested = True
        self._mine = True
        return self

    def __exit__(
        self, kind: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        if not self._mine:
            return
        self._mine = False
        _STATE.nested = False
        found = _STATE.found
        LOCAL.depth += 1
        try:
            # signal.signal runs the handlers of signals pending before it
            # changes one: ours, which holds a SIGINT arriving now back.
            signal.signal(signal.SIGINT, found)
        finally:
            LOCAL.depth -= 1
        _STATE.found = None
        if _STATE.pending is not None and LOCAL.depth == 0 and found is not None:
            _STATE.pending = None
            found(signal.SIGINT, None)

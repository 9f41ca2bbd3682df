"""The in-process runtime's spare context: the next run's sandbox, prepared ahead.

A fresh context with the prelude evaluated (:func:`~.engine.prepare`) is most
of an in-process run's start-up (the binding cannot cache bytecode, so the
prelude is compiled each time). The worker runtime prepares it in the worker
before the run arrives; this does the same for :class:`~.quickjs.QuickJSRuntime`.
What a caller may rely on:

* **Fresh, used once.** A spare is a context no program has seen: made by
  :func:`~.engine.prepare`, held here, handed to exactly one run by
  :func:`take` (it is never handed out twice) and bound to that run by
  :class:`~.engine.Engine` (its limits, its names, its clock from the run's
  start), as an inline-prepared one is.
* **Never waited for.** :func:`take` returns the spare when one is ready and
  ``None`` otherwise (the run then prepares its own); either way it asks for
  the next one. At most one spare is held and at most one is being made.
* **Off the run's thread.** The next spare is made on one thread,
  ``nous-sched-prelude-<n>``, started on first use and woken by each
  :func:`take` (no thread is started in a run's path once it runs; the
  binding lets other threads run while it compiles). It exits after
  :data:`IDLE_SECONDS` without a request. Its CPU time is an inline
  prelude's: this moves the work off the run's path, it does not remove it.
* **Fork.** A child process starts with no spare and none being made.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from typing import Any, Optional

from .engine import prepare

__all__ = ["take", "ready", "discard", "IDLE_SECONDS"]

log = logging.getLogger("nous_sched")

#: How long the preparing thread waits for the next request before it exits.
IDLE_SECONDS = 1.0

_cond = threading.Condition()
# Guarded by _cond: the spare held, whether a run asked for the next one, and
# whether the preparing thread is running (or being started).
_spare: Optional[tuple[Any, Any]] = None
_wanted = False
_serving = False
_numbers = itertools.count(1)


def take() -> Optional[tuple[Any, Any]]:
    """The prepared ``(context, bridge)`` pair for one run, or ``None`` when
    none is ready; asks for the next one in both cases."""
    global _spare, _wanted, _serving
    with _cond:
        spare, _spare = _spare, None
        _wanted = True
        start = not _serving
        _serving = True
        if not start:
            _cond.notify()
    if start:
        try:
            threading.Thread(target=_serve, name=f"nous-sched-prelude-{next(_numbers)}", daemon=True).start()
        except BaseException as exc:
            # No thread (the process is out of them, or an interrupt landed in
            # start()): none is being made; the next take() asks again.
            with _cond:
                _serving = False
                if spare is not None and _spare is None and not isinstance(exc, Exception):
                    _spare, spare = spare, None  # the run is not starting: the spare stays unused
            if not isinstance(exc, Exception):
                raise
    return spare


def ready(timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for a spare to be held; whether one is."""
    with _cond:
        return _cond.wait_for(lambda: _spare is not None, timeout)


def discard() -> None:
    """Drop the spare held now, if any."""
    global _spare
    with _cond:
        _spare = None


def _serve() -> None:
    global _spare, _wanted, _serving
    while True:
        with _cond:
            while not _wanted:
                if not _cond.wait(IDLE_SECONDS) and not _wanted:
                    _serving = False
                    return
            _wanted = False
            if _spare is not None:
                continue  # still one held: nothing to make
        made: Optional[tuple[Any, Any]] = None
        try:
            made = prepare()
        except Exception:  # no memory for a context: the run that wants it prepares its own, and says why
            log.debug("nous_sched: could not prepare a spare context", exc_info=True)
        with _cond:
            if _spare is None:
                _spare, made = made, None
                _cond.notify_all()  # for a test waiting for it (ready())
        del made  # one made after a discard raced it: freed here, unused


def _after_fork_in_child() -> None:
    global _spare, _wanted, _serving, _cond
    _cond = threading.Condition()  # the parent's may have been held by a thread that does not exist here
    _spare = None
    _wanted = False
    _serving = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

"""Who reads a run's worker: the run's own thread, or the scheduler's driver
(the hand-off's decisions, with no pipes, threads or clocks).

A sequential ``await`` in a worker run used to wake five threads: the
worker's answer woke the run's thread, which handed the next call to the
driver, which handed it to a tool thread, whose report woke the driver,
which wrote the settle frame to the worker. While a run has *attached* its
reader, the driver reads the worker's answers itself and steps the simple
ones (an envelope that only starts tool calls), so the run's thread sleeps
through the whole stretch and a call wakes four threads. Everything else
goes back to the run's thread, which takes the usual path. The shell is
:class:`nous_sched.runtime._remote.Relay` (one lock around every call to
this core); ``tests/test_handoff_core.py`` drives it through every
interleaving of the two threads.

The operations, each naming the thread that makes it: the run's thread
:meth:`~HandoffCore.attach`\\ es, later takes the reader back
(:meth:`~HandoffCore.take_back`: its deadline, a cancel, an interrupt, a
wake of its own) and :meth:`~HandoffCore.collect`\\ s the hand-back; the
driver asks :meth:`~HandoffCore.readable` when the worker's pipe has data
and says :meth:`~HandoffCore.step_done` after the step it was allowed.

What the core guarantees, whatever the order of calls:

* **One reader at any time.** The run's thread reads the worker only in
  :data:`RUN_READS`; the driver only between a :meth:`readable` that
  answered True and its :meth:`step_done` (:data:`DRIVER_STEPPING`). The
  two never overlap, so each frame is read once, by one of them.
* **The run's thread never proceeds while the driver steps.** Its
  :meth:`take_back` during a step answers False and it waits: the step's
  end returns the reader (:data:`RETURNED`) and answers True (wake it).
  That wait is bounded by the step (the gate and the host's hooks), never
  by the worker.
* **The driver's hand-back wins.** A step that ends by handing the run back
  (it met something only the run's thread may do, or raised) returns with
  its own reason, even if the run's thread asked for the reader meanwhile:
  what the step left (an answer read, an exception) is never lost.
* **A driver that leaves returns the reader.** A scheduler that stops
  while a run is attached hands the reader back (:meth:`left`): the run's
  thread never waits for a driver that is gone.
* **Nothing after the return.** Once :data:`RETURNED`, :meth:`readable`
  answers False until the run's thread attaches again: the driver drops
  the worker's pipe at its next look and never reads it.

Not thread-safe, by design: the shell's lock is the core's.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["HandoffCore", "RUN_READS", "DRIVER_READS", "DRIVER_STEPPING", "RETURNED"]

#: The run's own thread reads its worker (no driver looks at the pipe).
RUN_READS = "run reads"
#: Attached: the driver reads the worker's next answer when its pipe has data.
DRIVER_READS = "driver reads"
#: The driver reads and steps one answer; the run's thread waits for the step's end.
DRIVER_STEPPING = "driver stepping"
#: The reader is the run's thread's again; it has not collected why yet.
RETURNED = "returned"


class HandoffCore:
    """A run's reader (see the module docstring)."""

    # What is always true of each field between calls:
    #
    # state: one of the four above. DRIVER_READS and DRIVER_STEPPING only
    #   between the run's attach and the return; DRIVER_STEPPING only between
    #   the driver's readable (True) and its step_done.
    # reason: why the reader was returned (the driver's, or the run's own
    #   take-back): set exactly while RETURNED, cleared by collect.
    # wanted: the run's thread asked for the reader while the driver stepped:
    #   its reason, until that step ends. None unless DRIVER_STEPPING.

    __slots__ = ("state", "reason", "wanted")

    def __init__(self) -> None:
        self.state = RUN_READS
        self.reason: Optional[str] = None
        self.wanted: Optional[str] = None

    # -- the run's thread -----------------------------------------------------------

    def attach(self) -> None:
        """The run's thread hands its reader to the driver (it reads nothing until it collects)."""
        if self.state is not RUN_READS:
            raise RuntimeError(f"attach while {self.state}: the run's thread does not hold its reader")
        self.state = DRIVER_READS

    def take_back(self, reason: str) -> bool:
        """The run's thread wants its reader (``reason``: its deadline, a
        cancel, an interrupt, a wake): True if it is returned now (collect
        it); False while the driver steps (wait: the step's end returns it)."""
        state = self.state
        if state is DRIVER_READS:
            self.state = RETURNED
            self.reason = reason
            return True
        if state is DRIVER_STEPPING:
            if self.wanted is None:
                self.wanted = reason
            return False
        return True  # returned already (or never attached)

    def collect(self) -> Optional[str]:
        """The run's thread holds its reader again: why it was returned
        (``None``: it was never attached). Only once :meth:`take_back` or a
        wake said it is returned."""
        if self.state is not RETURNED and self.state is not RUN_READS:
            raise RuntimeError(f"collect while {self.state}: the driver holds the reader")
        reason, self.reason = self.reason, None
        self.state = RUN_READS
        return reason

    # -- the driver -----------------------------------------------------------------

    def readable(self) -> bool:
        """The worker's pipe has data: True if the driver reads and steps it
        now (then :meth:`step_done`); False if the reader is not the
        driver's (drop the pipe)."""
        if self.state is DRIVER_READS:
            self.state = DRIVER_STEPPING
            return True
        return False

    def left(self) -> bool:
        """The driver stops reading without being told to (its scheduler
        stopped): True if the reader was the driver's (wake the run's
        thread); never during a step (the driver is in it)."""
        if self.state is DRIVER_READS:
            self.state = RETURNED
            self.reason = "driver left"
            return True
        return False

    def step_done(self, back: Optional[str]) -> bool:
        """The driver's step is over: ``back`` None goes on reading, else the
        run is handed back for that reason. True if the run's thread must be
        woken (its reader is returned)."""
        if self.state is not DRIVER_STEPPING:
            raise RuntimeError(f"step_done while {self.state}: no step was allowed")
        wanted, self.wanted = self.wanted, None
        if back is None and wanted is None:
            self.state = DRIVER_READS
            return False
        self.state = RETURNED
        self.reason = back if back is not None else wanted
        return True

"""The relay's decisions: who sends a run's settles, with no pipes, threads or clocks.

Two threads share a run's relay (the shell:
:class:`nous_sched.runtime._remote.Relay`, which holds one lock around every
call to this core): the run's own thread, the *driving thread*, which drives
the engine and waits for the worker's answers; and whichever thread
publishes the run's oldest outstanding call, the *kicking thread* (the
scheduler's driver as it commits it, or ``stop()`` releasing it). When the
driving thread has nothing committed to send, it arms the relay and waits;
the kicking thread then takes the committed prefix and writes its settle
frame itself, so the batch does not hop through the driving thread.
Every operation is a plain method call that says what the calling thread
must do, so a state machine test drives the core through every
interleaving of the two (``tests/test_relay_core.py``).

What the core guarantees, whatever the order of calls:

* **A kick acts only while the driving thread waits for it**: a batch is
  taken and its frame written only between :meth:`RelayCore.arm` and the
  driving thread's :meth:`~RelayCore.disarm`, :meth:`~RelayCore.taken` or
  :meth:`~RelayCore.release` (its deadline, its cancel, the worker's end of
  file, or the run's end), never after the run has moved on.
* **One batch per arming**: the first kick that finds calls committed takes
  them; later kicks do nothing until the driving thread arms again. Calls
  that commit behind that batch before the driving thread collects it may
  join it (:meth:`RelayCore.joined`): each join a frame of its own, written
  whole or not at all, so the worker settles them, in order, while the
  driving thread still waits; it then reads one answer per call of the
  whole batch.
* **Nothing taken is lost**: the driving thread's wait ends either with
  nothing taken (:meth:`~RelayCore.disarm` answers True: the calls stay
  committed, for the driving thread to send itself), or with exactly the
  batch the kick took (:meth:`~RelayCore.taken`), or with what the kick
  raised, which ends the run.
* **The driving thread is woken whenever it must act**: a kick that could
  not finish its send (a frame larger than the pipe holds, a payload the
  worker must not get, an error) sets :attr:`RelayCore.handoff` and answers
  True: the shell wakes the driving thread, which finishes the send with
  the run's deadline and kill.

Not thread-safe, by design: the shell's lock is the core's.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

__all__ = ["RelayCore", "ARMED", "SENT", "IDLE"]

#: The driving thread waits; the head's commit sends the next batch.
ARMED = "armed"
#: A kick took a batch (written, or handed off), or failed: the driving thread collects it.
SENT = "sent"
#: The driving thread's own: kicks do nothing.
IDLE = "idle"

#: The engine's taker: the committed prefix (``take(None)``), ``[]`` if none.
Take = Callable[[None], list[Any]]
#: Writes a batch's frame without blocking; whether the send is finished.
Write = Callable[[list[Any]], bool]


class RelayCore:
    """A run's relay state (see the module docstring)."""

    # What is always true of each field between calls:
    #
    # state: ARMED only while the driving thread waits with nothing taken
    #   (from arm to its disarm, taken or release; only it arms). SENT only
    #   while it waits and a kick has taken a batch or failed, not yet
    #   collected. IDLE otherwise: whenever the driving thread is not waiting
    #   for a kick (before it arms, once it has collected, after release).
    # batch: what the kick took, until the driving thread collects it
    #   (taken). Empty unless state is SENT; not empty when SENT without
    #   error.
    # error: what the kick raised (taking the batch, or writing it), until
    #   collected. None unless state is SENT and handoff is set.
    # handoff: the driving thread must finish the send (or raise error).
    #   Set only with SENT, by a kick that answered True (the shell wakes
    #   the driving thread); cleared by the driving thread once it has sent
    #   the rest (``_Remote.answers``) or collected the error.

    __slots__ = ("state", "batch", "error", "handoff")

    def __init__(self) -> None:
        self.state = IDLE
        self.batch: list[Any] = []
        self.error: Optional[BaseException] = None
        self.handoff = False

    # -- the driving thread ---------------------------------------------------------

    def arm(self) -> None:
        """The driving thread, with nothing committed to send, waits: the next
        kick sends the batch."""
        self.state = ARMED

    def disarm(self) -> bool:
        """The driving thread stops waiting (its deadline, a cancel, the
        worker's end of file): True if no kick took a batch (none will now);
        False if one did: collect it with :meth:`taken`."""
        if self.state is ARMED:
            self.state = IDLE
            return True
        return False

    def taken(self) -> tuple[list[Any], Optional[BaseException]]:
        """The driving thread collects what the kick took: ``(batch, error)``;
        ``error`` not None: the run raises it (nothing is left to send)."""
        batch, self.batch = self.batch, []
        error, self.error = self.error, None
        self.state = IDLE
        if error is not None:
            self.handoff = False
        return batch, error

    def release(self) -> None:
        """The driving thread no longer waits for a kick (its wait is over, or
        the run is): no kick acts until it arms again."""
        self.state = IDLE

    # -- the kicking thread ---------------------------------------------------------

    def kicked(self, take: Take, write: Write) -> bool:
        """The head has committed: while armed, take the batch and write it;
        whether the driving thread must be woken (:attr:`handoff`: it
        finishes the send, or raises what this raised). Never raises what
        ``take`` or ``write`` raise."""
        if self.state is not ARMED:
            return False
        try:
            batch = take(None)
            if not batch:
                return False  # nothing committed yet: the next commit kicks again
            self.batch = batch
            self.state = SENT
            if write(batch):
                return False  # the worker answers: that wakes the driving thread
            self.handoff = True
        except BaseException as exc:  # (a payload the encoder refuses, MemoryError): the run's to raise
            self.failed(exc)
        return True

    def joined(self, take: Take, write: Write, give_back: Callable[[list[Any]], None]) -> bool:
        """A call behind the batch sent has committed, and the driving thread
        has not collected the batch: take the committed prefix behind it and
        write it (``write`` answers whether the frame went whole; if it did
        not, nothing went, and ``give_back`` returns the calls to the taker,
        for the driving thread to send); written, the calls join the batch.
        Whether the driving thread must be woken (what this raised: it
        raises it). Acts only while :data:`SENT` with nothing to hand off."""
        if self.state is not SENT or self.handoff or self.error is not None:
            return False
        try:
            batch = take(None)
            if not batch:
                return False
            if not write(batch):
                give_back(batch)
                return False
            self.batch = self.batch + batch
        except BaseException as exc:  # (an encoder's refusal, MemoryError): the run's to raise
            self.failed(exc)
            return True
        return False

    def failed(self, exc: BaseException) -> None:
        """A kick raised ``exc`` (outside :meth:`kicked`'s own calls: an
        interrupt): the driving thread, if it still waits, raises it (wake it)."""
        if self.state is IDLE:
            return  # no one waits: the run has moved on
        self.error = exc
        self.handoff = True
        self.state = SENT

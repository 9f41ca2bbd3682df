"""The tool threads' hand-off: which thread takes which task, with no threads, locks or clocks.

:class:`Handoff` makes every decision of :class:`~nous_sched.scheduler._tool_threads.ToolThreads`
(the shell): which idle thread a task wakes (the most recently idled), when
a new thread is started, what a thread does when it has no task (take the
next one, park, or leave), what a wake-up or a timeout means, and what a
retire or a shutdown does. The shell holds one lock around every call to
it, starts the threads, sleeps each on its :class:`Slot`'s wake lock
(:meth:`Slot.signal` releases it) and runs the tasks. Every operation is a
plain method call that returns what the thread must do next, so a state
machine test drives the core through every interleaving of threads and
submitters (``tests/test_tool_handoff.py``).

What the core guarantees, whatever the order of calls:

* **Every task is taken once, or never.** A task submitted is in
  :attr:`Handoff.pending` until exactly one thread takes it (a step
  answer), or :meth:`Handoff.close` drops it, or :meth:`Handoff.start_failed`
  takes it back (the shell then raises to its submitter).
* **Someone is coming.** Between calls, while a task waits either a thread
  was signalled for it and has not yet come (:attr:`Handoff.waking`), or no
  thread is idle and some member thread is busy, starting or on its way,
  and asks for the queue's head before it parks or leaves. (The one
  exception: a thread start refused by the OS when it was the only member;
  the tasks queued behind the refused one wait for the next thread a submit
  manages to start.)
* **The hottest first**: a task wakes the top of the idle stack, the thread
  that went idle most recently; a burst wakes its threads in a chain (a
  woken thread that takes a task and sees more waiting signals the next).
* **Bounded**: never more than :attr:`Handoff.max_threads` members; a
  thread stops counting in the very call in which it is told to leave.
* **One signal per stay on the stack**: a slot is signalled only while on
  the idle stack, and leaves it as it is; so a wake lock is never released
  twice, and a thread whose wait timed out and finds (:meth:`Handoff.timed_out`)
  its slot off the stack knows its signal is there to take.

Not thread-safe, by design: the shell's lock is the core's.
"""

from __future__ import annotations

import collections
from typing import Generic, Optional, TypeVar, Union

__all__ = ["Handoff", "Slot", "PARKED", "LEAVE"]

T = TypeVar("T")

#: A step answer: the thread is on the idle stack now; it sleeps until signalled.
PARKED = "parked"
#: A step answer: the thread has left the set (it no longer counts): it exits.
LEAVE = "leave"


class Slot:
    """One thread's place in the set, reused each time it idles.

    * ``serial``: the thread's number (:meth:`Handoff.submit`'s answer);
      never changes.
    * ``idle``: true exactly while the slot is on :attr:`Handoff.idle`.
    * ``retire``: true from the signal that retires the thread until the
      thread comes for it (:meth:`Handoff.woken` then answers
      :data:`LEAVE`); a retired thread no longer counts.

    :meth:`signal` is the shell's: wake this slot's thread once. The core
    calls it only as it takes the slot off the idle stack.
    """

    __slots__ = ("serial", "idle", "retire")

    def __init__(self, serial: int) -> None:
        self.serial = serial
        self.idle = False
        self.retire = False

    def signal(self) -> None:
        raise NotImplementedError


#: What a thread does next: run this task, or :data:`PARKED`, or :data:`LEAVE`.
Step = Union[T, str]


class Handoff(Generic[T]):
    """The tool threads' decisions (see the module docstring). ``T`` is the
    shell's task: the core queues it and hands it back, never looks inside."""

    # What is always true of each field between calls:
    #
    # pending: the tasks submitted and not yet taken, dropped or taken back,
    #   each once, oldest first. Not empty only if `waking`, or `idle` is
    #   empty and `count` > 0 (someone is coming; see the module docstring
    #   for the one exception).
    # idle: the idle stack, the most recently idled on top. Exactly the
    #   slots with `idle` set; none of them has been signalled since it was
    #   pushed. Empty once `closed` and retired.
    # waking: a slot was signalled for a task and its thread has not yet
    #   come for one (woken). At most one such thread at a time: only the
    #   thread that comes signals the next (the chain).
    # starting: threads the shell was told to start that have not yet asked
    #   for their first task (begin) or failed to start (start_failed).
    # count: member threads: told to start and not yet told to leave, nor
    #   retired, nor failed to start. At most `max_threads`; at least
    #   len(idle) + starting + waking.
    # retire_before: threads with a serial below it leave when they find no
    #   task (retire); threads started later are not affected.
    # closed: set by close; from then on submit refuses, and a thread with
    #   no task leaves instead of parking.

    __slots__ = ("max_threads", "pending", "idle", "waking", "starting", "count", "retire_before", "closed", "_serial")

    def __init__(self, max_threads: int) -> None:
        self.max_threads = max_threads
        self.pending: collections.deque[T] = collections.deque()
        self.idle: list[Slot] = []
        self.waking = False
        self.starting = 0
        self.count = 0
        self.retire_before = -1
        self.closed = False
        self._serial = 0

    # -- a submitter ----------------------------------------------------------------

    def submit(self, task: T) -> Optional[int]:
        """Queue ``task``; the serial of a thread to start now (counted
        already; the shell names it by it), or None: a thread is signalled
        (the idle stack's top), or on its way, or busy, for it.

        :raises RuntimeError: after :meth:`close` (``task`` is not queued).
        """
        if self.closed:
            raise RuntimeError("cannot run a tool call after the tool threads were shut down")
        pending = self.pending
        pending.append(task)
        if self.idle and not self.waking:
            self._signal_top()
        elif len(pending) > self.waking + len(self.idle) + self.starting and self.count < self.max_threads:
            serial = self._serial
            self._serial = serial + 1
            self.count += 1
            self.starting += 1
            return serial
        return None

    def start_failed(self, task: T, exception: bool) -> bool:
        """The thread :meth:`submit` said to start for ``task`` could not start
        (``exception``: an :class:`Exception`; else a ``BaseException`` such as
        an interrupt); whether ``task`` is taken back (its submitter is told
        the start failed: raise). Not taken back while another member
        thread will come for it (it runs), nor once a thread has taken it."""
        self.count -= 1
        self.starting -= 1
        if self.count > 0 and exception:
            if self.idle and not self.waking:
                self._signal_top()  # someone is coming: a member busy, starting, woken, or this one
            return False
        try:
            self.pending.remove(task)
        except ValueError:
            return False  # a finishing thread took it already: it runs
        return True

    # -- a thread -------------------------------------------------------------------

    def begin(self, slot: Slot) -> "Step[T]":
        """A new thread, started, asks for its first step."""
        self.starting -= 1
        return self.after(slot)

    def after(self, slot: Slot) -> "Step[T]":
        """A thread with no task (its last one done): the queue's head, taken
        without sleeping; or :data:`LEAVE` (retired or closed); or
        :data:`PARKED` on the idle stack."""
        if self.pending:
            return self.pending.popleft()
        if slot.serial < self.retire_before or self.closed:
            self.count -= 1
            return LEAVE
        slot.idle = True
        self.idle.append(slot)
        return PARKED

    def timed_out(self, slot: Slot) -> "Optional[Step[T]]":
        """A parked thread's wait ended with no signal. None: a signal came
        since (the slot is off the stack; the thread takes it, which cannot
        block, and asks :meth:`woken`). Otherwise its step: a task that waits
        (for a thread being woken: this one is awake, so it takes it; the
        other, finding none, parks again), or :data:`LEAVE`."""
        if not slot.idle:
            return None
        slot.idle = False
        self.idle.remove(slot)
        if self.pending:
            return self.pending.popleft()
        self.count -= 1
        return LEAVE

    def woken(self, slot: Slot) -> "Step[T]":
        """A signalled thread comes: :data:`LEAVE` if it was retired; else the
        queue's head (signalling the next idle thread while more wait: the
        chain), or :data:`PARKED` again when a thread that finished first
        took the task."""
        if slot.retire:
            slot.retire = False
            return LEAVE  # uncounted by retire already
        self.waking = False
        pending = self.pending
        if not pending:
            slot.idle = True
            self.idle.append(slot)
            return PARKED
        task = pending.popleft()
        if pending and self.idle:
            self._signal_top()
        return task

    # -- the owner ------------------------------------------------------------------

    def retire(self) -> None:
        """Every member leaves: the idle ones now (signalled to), the busy
        ones once they find no task. Threads started later are not affected."""
        self.retire_before = self._serial
        self._serial += 1
        idle, self.idle = self.idle, []
        self.count -= len(idle)
        for slot in idle:
            slot.idle = False
            slot.retire = True
            slot.signal()

    def close(self, drop: bool) -> list[T]:
        """No more tasks (:meth:`submit` refuses); a thread with no task leaves.
        ``drop``: the tasks still waiting leave the queue, returned (the shell
        cancels them). Call :meth:`retire` next for the idle threads."""
        self.closed = True
        if not drop:
            return []
        dropped = list(self.pending)
        self.pending.clear()
        return dropped

    def _signal_top(self) -> None:
        """Wake the top of the idle stack for a task (``idle`` not empty, not ``waking``)."""
        slot = self.idle.pop()
        slot.idle = False
        self.waking = True
        slot.signal()

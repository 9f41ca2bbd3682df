"""When the host looks for a worker's answer busily, and when it sleeps.

A worker's step after a settle takes tens of microseconds. Sleeping for it
costs a wake-up when it answers, and on an idle machine (a virtual CPU
halted, to be woken by the hypervisor) that wake-up alone costs as much as
the step; every call pays it. So after a settle frame it sent itself, the
driving thread looks for the answer for up to :data:`SPIN` first (a frame
the scheduler's driver sent as it committed the call, ``_remote.Relay``,
wakes it with the answer: it was asleep already, so a look would only
spend a CPU the tools need), but only while fewer of its pool's programs
compute than there are CPUs (the CPU shares in use, this run's included:
a run waiting on a tool holds none) and the machine is otherwise idle (the load average says
so), so the worker has a CPU of its own meanwhile; on a busy machine no CPU
halts and wake-ups are cheap, and a spin would take the worker's CPU. Not
for :data:`SPIN_BACKOFF` steps after an answer that took longer, twice as
many after each further miss (a program computing between calls is not
waited for busily).

Pool-wide (what it judges, is there a CPU to spare, is the machine's) and
unguarded: a lost update only moves the next spin by a step.
"""

from __future__ import annotations

import os
import time

__all__ = ["SPIN", "SPIN_BACKOFF", "SPIN_BACKOFF_MAX", "CPUS", "WakePolicy"]

SPIN = 100e-6
SPIN_BACKOFF = 16
SPIN_BACKOFF_MAX = 4096
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class WakePolicy:
    """Seconds to spin before each answer; see the module docstring."""

    def __init__(self) -> None:
        self.cool = 0  # steps left to sleep at once
        self.backoff = SPIN_BACKOFF  # the next miss's count
        self._load_read = float("-inf")  # when _load_low was last read
        self._load_low = False

    def spin(self, running: int) -> float:
        """How long to look for the next answer, with ``running`` programs of the
        pool computing (its CPU shares in use)."""
        if self.cool:
            self.cool -= 1
            return 0.0
        if running >= CPUS or not self.idle_machine():
            return 0.0
        return SPIN

    def answered(self, missed: bool) -> None:
        """After a spin: whether the answer came only after it ran out."""
        if missed:
            self.cool = self.backoff
            self.backoff = min(2 * self.backoff, SPIN_BACKOFF_MAX)
        else:
            self.backoff = SPIN_BACKOFF

    def idle_machine(self) -> bool:
        """Whether the 1-minute load average leaves a CPU idle (re-read once a second)."""
        now = time.monotonic()
        if now >= self._load_read + 1.0:
            self._load_read = now
            try:
                self._load_low = os.getloadavg()[0] < CPUS - 0.25
            except (AttributeError, OSError):
                self._load_low = False
        return self._load_low

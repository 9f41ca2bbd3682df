"""The worker pool's decisions, with no processes, threads or clocks.

:class:`PoolCore` decides which worker a run gets, when a place is reserved
for a new process, when a worker is retired, and which spares to keep ready;
:class:`nous_sched.WorkerPool` (the shell) carries the decisions out under
its lock and starts, signals and kills the processes. Every operation is a
plain method call that returns what the shell must do, so a state machine
test drives the core through every interleaving (tests/test_pool_core.py).

What the core guarantees, whatever the order of calls:

* never more than ``size`` workers, places reserved for starting processes
  included, so never more than ``size`` programs running;
* a worker serves runs of one trust domain only: a run without a domain
  gets a worker that has never run anything and is retired after it; a
  run with a domain may get an idle worker that served only that domain;
* runs waiting for a place are served first come, first served;
* a spare is handed out only once it is ready (the shell calls
  :meth:`started` for a spare after the worker has said it is bounded and
  its context prepared); a run that finds no idle worker waits for a spare
  already on its way, when there is one for every run waiting, rather than
  start another process beside it;
* every reserved place is given back: by :meth:`started` (the process
  exists, or could not be made), :meth:`release`, :meth:`dead` or
  :meth:`close`;
* a place knows the run that holds it, from the grant until :meth:`release`:
  :meth:`drop` gives back everything a run holds, whatever step of its
  protocol it was cut at (an interrupt between a grant and the variable that
  would have kept it), and answers the same once it has;
* the number of spares kept ready follows demand, within bounds: it starts
  at ``spares``, grows by one (up to ``max_spares``) whenever a run without
  a domain finds no spare ready, and shrinks by one (down to ``spares``)
  whenever such a run takes a spare and leaves all but one of the others
  ready. Runs that follow each other keep more spares booting side by side
  (a spare's boot is mostly waiting on the CPU, so two booting at once are
  ready sooner than two one after the other);
* **a replacement waits for its run's start-up** (:meth:`hold`): a run
  handed a spare while another spare is still ready and nothing waits holds
  back that spare's replacement until the shell says its start-up is over
  (:meth:`calm`: the run waits for its tools, or it ended), so the boot
  does not compete with the run's first step on the CPU. A held
  replacement is never kept from a run that needs it: a run that asks and
  is not handed an idle worker at once, or :meth:`release_holds`, lets
  every hold go; a run holds at most one, and only while it holds its place;
* **places for waiting, shares for CPU**: a run holds a place (a worker
  process) from its grant to its release, waits on tools included, but a
  CPU *share* only while its worker computes a step (the shell takes one
  with :meth:`take_share` before each frame that starts work and gives it
  back with :meth:`give_share` when the step's answers are in). Never more
  than ``cpu_shares`` runs hold one; a run holds at most one; runs that
  wait for one are served first come, first served (a run that will not
  wait, the relay's kick, never goes ahead of a waiting one); :meth:`drop`
  gives a run's share back too, and a run that no longer waits leaves the
  queue (:meth:`leave_shares`). Once the pool is closed a share is granted
  at once and not counted: the run finds its worker killed;
* **a start-up is CPU too**: a place reserved for a run's own process
  (``SPAWN``) is only a reservation; the shell starts the process once the
  run holds a share (:meth:`take_share`, in the queue's order), and the run
  keeps it through the start-up into its first step. So a run that waits
  for a share (and may reach its deadline waiting) has cost no process
  start-up, and the start-ups of runs that wait do not spend the CPU of
  the runs computing. Spares go to the runs whose turn has come: a run
  that would wait for a share (every share taken, or runs queued for one)
  reserves a place rather than take a spare, while there is room, and once
  it holds its share it swaps the reservation for a spare ready then
  (:meth:`swap`). So spares keep booting while runs wait, each for a run
  about to compute, never taken by one that may time out waiting.
* **shares are time-sliced**: a step that has computed in its worker for a
  whole slice while runs wait for a share is *parked* (:meth:`park_due`:
  the shell stops its worker) and queued again behind them; its turn comes
  as any waiting run's (:meth:`resume_head`: the shell continues its
  worker). So a program that spins to its deadline holds a share a slice at
  a time, never the core for good: the runs behind it wait at most a slice
  per share in use, whatever the programs compute. A step's slice starts
  when the shell says it is in its worker (:meth:`slice_from`; a start-up
  is never parked); a parked run is never granted a share by
  :meth:`take_share` (its thread computes nothing meanwhile), only resumed
  in the queue's order, or taken out of the queue with its worker
  continued when its step ends (:meth:`give_share`) or it stops softly
  (:meth:`unpark`: a step stopping softly is never parked again).
"""

from __future__ import annotations

import collections
import itertools
import math
from typing import Any, Deque, Hashable, Optional

__all__ = ["PoolCore", "Slot", "Closed", "USE", "SPAWN", "WAIT", "FRESH"]

USE = "use"
SPAWN = "spawn"
WAIT = "wait"
#: A slot's ``domain`` before it has run anything.
FRESH: Any = None


class Closed(Exception):
    """The pool is closed."""


class Slot:
    """One worker place: ``starting`` (a process is being made), ``idle``,
    ``busy``, or ``retiring`` (killed, not yet gone)."""

    __slots__ = ("wid", "state", "domain", "runs", "cap", "for_run", "holder")

    def __init__(self, wid: int, for_run: Optional[Hashable]) -> None:
        self.wid = wid
        self.state = "starting"
        self.domain: Any = FRESH
        self.runs = 0
        self.cap: Optional[int] = None  # the memory cap its first run set
        self.for_run = for_run  # the run it is being started for, or None for a spare
        self.holder = for_run  # the run it is granted to (until released), or None

    def __repr__(self) -> str:
        return f"Slot({self.wid}, {self.state}, domain={self.domain!r}, runs={self.runs})"


class PoolCore:
    """See the module docstring. ``size``: most workers; ``spares``: fresh
    workers to keep ready (within ``size``); ``runs_per_worker``: most runs a
    worker serves within one trust domain; ``max_spares``: most spares kept
    ready while runs find none (default twice ``spares``, within ``size``);
    ``cpu_shares``: most runs whose worker computes at once (default ``size``:
    no bound beyond the places)."""

    def __init__(
        self,
        size: int,
        spares: int,
        runs_per_worker: int,
        max_spares: Optional[int] = None,
        cpu_shares: Optional[int] = None,
    ) -> None:
        self.size = size
        self.cpu_shares = size if cpu_shares is None else cpu_shares
        self.computing: set[Hashable] = set()  # the runs holding a share
        self.share_queue: Deque[Hashable] = collections.deque()  # runs waiting for one, first come first
        # Computing runs whose step is in their worker (a slice may end): run -> when its slice began.
        self.slices: dict[Hashable, float] = {}
        self.parked: set[Hashable] = set()  # runs whose worker is stopped, each in share_queue

        self.spares = min(spares, size)
        self.max_spares = min(size, max(self.spares, 2 * self.spares if max_spares is None else max_spares))
        self.target = self.spares  # spares to keep ready now: see the module docstring
        self.runs_per_worker = runs_per_worker
        self.slots: dict[int, Slot] = {}
        self.idle: list[int] = []  # longest idle first
        self.waiting: Deque[Hashable] = collections.deque()
        self.held: set[Hashable] = set()  # runs holding back their spare's replacement (see hold)
        self.closed = False
        self._ids = itertools.count(1)

    # -- a run asks for a worker ------------------------------------------------

    def queue_head(self) -> Optional[Hashable]:
        """The run first in the queue for a place (the only one :meth:`ask` may grant), or None."""
        return self.waiting[0] if self.waiting else None

    def ask(self, run: Hashable, domain: Any, need: int) -> tuple[str, Optional[int], Optional[int]]:
        """``(USE, wid, None)``: take idle worker ``wid``; ``(SPAWN, wid, retire)``:
        a place ``wid`` reserved for this run's own worker, started (after
        killing ``retire``, or None) once the run holds a CPU share;
        ``(WAIT, None, None)``: ask again when :meth:`changed` says so, which
        the shell looks at after every change, this call's own grant included
        (the head leaving the queue may let the next run go on).
        :class:`Closed` once the pool is closed."""
        if self.closed:
            self.leave(run)
            raise Closed
        if domain is FRESH and run not in self.waiting:
            self._follow_demand(self.spares_ready())
        if self.waiting and self.waiting[0] != run:
            if run not in self.waiting:
                self.waiting.append(run)
            return WAIT, None, None
        wid = self._pick(domain, need)
        if wid is not None and self.slots[wid].domain is FRESH and self._would_wait() and len(self.slots) < self.size:
            # The spare is for the run whose turn comes (see swap): this one,
            # which would wait for a share, reserves a place instead. (A run
            # that takes no idle worker now: every replacement is wanted.)
            self.held.clear()
            wid = self._new(run)
            self.leave(run)
            return SPAWN, wid, None
        if wid is not None:
            self._hand(run, wid)
            self.leave(run)
            return USE, wid, None
        self.held.clear()  # (no idle worker for this run: every replacement is wanted)
        if self._coming() >= max(len(self.waiting), 1):
            # Spares are on their way for every run waiting (one is started as
            # soon as one is taken), each ready sooner than a process started now.
            if run not in self.waiting:
                self.waiting.append(run)
            return WAIT, None, None
        retire = None
        if len(self.slots) >= self.size:
            retire = self._victim()
            if retire is None:
                if run not in self.waiting:
                    self.waiting.append(run)
                return WAIT, None, None
            self._remove(retire)
        wid = self._new(run)
        self.leave(run)
        return SPAWN, wid, retire

    def hold(self, run: Hashable, wid: int) -> bool:
        """``run`` was just handed worker ``wid`` (:meth:`ask`'s ``USE``):
        whether it now holds back that spare's replacement until :meth:`calm`.
        It does when ``wid`` is a spare (it never ran anything), another
        spare is still ready (a run that follows finds one) and no run waits
        for a place or a share (the replacement would be wanted at once)."""
        slot = self.slots.get(wid)
        if slot is None or slot.holder != run or slot.state != "busy" or slot.runs or slot.for_run is not None:
            return False
        if slot.domain is not FRESH:
            return False
        if self.closed or self.waiting or self.share_queue or not self.spares_ready():
            return False
        self.held.add(run)
        return True

    def calm(self, run: Hashable) -> bool:
        """``run``'s start-up is over (it waits for its tools, or it ended): the
        replacement it held back is wanted now (:meth:`want_spares`); whether
        it held one. Idempotent."""
        if run in self.held:
            self.held.discard(run)
            return True
        return False

    def release_holds(self) -> bool:
        """Every replacement held back is wanted now (someone waits for the
        spares); whether any was."""
        held = bool(self.held)
        self.held.clear()
        return held

    def _would_wait(self) -> bool:
        """Whether a run asking for a share now would wait for one."""
        return len(self.computing) >= self.cpu_shares or bool(self.share_queue)

    def swap(self, run: Hashable, wid: int) -> Optional[int]:
        """``run`` holds its share and the place ``wid`` reserved for its own
        process (not started yet): if a spare is ready, the run takes it
        instead and the reservation is given back. The spare's id, or
        ``None`` (the shell starts the run's own process)."""
        slot = self.slots.get(wid)
        if self.closed or slot is None or slot.state != "starting" or slot.holder != run:
            return None
        spare = self._pick(FRESH, 0)  # (for FRESH: an idle spare, never another domain's worker)
        if spare is None:
            return None
        self._remove(wid)
        self._hand(run, spare)
        return spare

    def _hand(self, run: Hashable, wid: int) -> None:
        """Idle worker ``wid`` is ``run``'s now."""
        slot = self.slots[wid]
        slot.holder = run
        self.idle.remove(wid)
        slot.state = "busy"

    def _follow_demand(self, ready: int) -> None:
        """A run without a domain arrives and finds ``ready`` spares ready."""
        if ready == 0:
            self.target = min(self.target + 1, self.max_spares)
        elif ready >= self.target and self.target > self.spares:
            self.target -= 1  # (it takes one and leaves all but one ready)

    def _pick(self, domain: Any, need: int) -> Optional[int]:
        """The idle worker for a run of ``domain``: one that served only that
        domain and whose memory cap holds ``need``, else a fresh one."""
        fresh = None
        for wid in self.idle:
            slot = self.slots[wid]
            if slot.domain is FRESH:
                fresh = wid if fresh is None else fresh
            elif domain is not FRESH and slot.domain == domain and (slot.cap is None or slot.cap >= need):
                return wid
        return fresh

    def _coming(self) -> int:
        """Spares being started. (Asked for the first waiting run, or with none
        waiting: the waiting runs are served in order.)"""
        return sum(1 for s in self.slots.values() if s.state == "starting" and s.for_run is None)

    def _victim(self) -> Optional[int]:
        """An idle worker no waiting run can use (one of another domain, or
        whose cap is too low): the one idle longest."""
        for wid in self.idle:
            if self.slots[wid].domain is not FRESH:
                return wid
        return None

    def leave(self, run: Hashable) -> None:
        """``run`` no longer waits (it got a worker, timed out or was cancelled)."""
        try:
            self.waiting.remove(run)
        except ValueError:
            pass

    # -- processes ----------------------------------------------------------------

    def want_spares(self) -> list[int]:
        """Places to reserve now for fresh spares (the shell starts them and
        calls :meth:`started` for each). None while runs wait: they take
        the places themselves, first come, first served."""
        return [self._new(None) for _ in range(self.spares_wanted())]

    def spares_wanted(self) -> int:
        """How many places :meth:`want_spares` would reserve now; it reserves none."""
        if self.closed or self.waiting:
            return 0
        # (A spare being started counts; one retiring, killed after its run, does
        # not; a replacement held back by a run in its start-up counts.)
        ready = len(self.held) + sum(
            1
            for s in self.slots.values()
            if s.for_run is None and s.state in ("starting", "idle") and s.domain is FRESH
        )
        return max(0, min(self.target - ready, self.size - len(self.slots)))

    def started(self, wid: int, ok: bool) -> bool:
        """The process for ``wid`` exists (``ok``) or could not be made; whether
        the shell must kill it (the pool closed or the place is gone meanwhile).
        For a spare, "exists" means ready: it has said hello (bounded, its
        context prepared), so a run that takes it waits for nothing."""
        slot = self.slots.get(wid)
        if slot is None or slot.state != "starting":
            return ok
        if not ok:
            self._remove(wid)
            return False
        if slot.for_run is None:
            slot.state = "idle"
            self.idle.append(wid)
        else:
            slot.state = "busy"
        return False

    def set_cap(self, wid: int, cap: int) -> None:
        slot = self.slots.get(wid)
        if slot is not None:
            slot.cap = cap

    def release(self, wid: int, domain: Any, reusable: bool) -> bool:
        """Run over on ``wid`` (of trust ``domain``); true if the shell keeps
        the process (idle, for that domain only), false if it must kill it:
        the place stays taken (``retiring``) until :meth:`dead` says the
        process is gone, so a replacement never runs beside it."""
        slot = self.slots.get(wid)
        if slot is None or slot.state != "busy":
            return False
        self.held.discard(slot.holder)  # (its start-up is over)
        slot.holder = None
        slot.runs += 1
        keep = reusable and domain is not FRESH and not self.closed and slot.runs < self.runs_per_worker
        keep = keep and slot.domain in (FRESH, domain)
        if not keep:
            slot.state = "retiring"
            return False
        slot.domain = domain
        slot.state = "idle"
        self.idle.append(wid)
        return True

    def drop(self, run: Hashable) -> list[int]:
        """``run`` is over however far it got: it no longer waits, a place
        being started for it is given back, and a worker it holds is to be
        killed (``retiring``, until :meth:`dead`). The workers the shell must
        kill (a place being started is gone already; the shell kills its
        process if it has one) and then report :meth:`dead`."""
        self.leave(run)
        self.give_share(run)
        self.leave_shares(run)
        self.held.discard(run)
        kill = []
        for wid, slot in list(self.slots.items()):
            if slot.holder != run:
                continue
            slot.holder = None
            kill.append(wid)
            if slot.state == "starting":
                self._remove(wid)  # (the shell, if still making it, finds the place gone and kills it)
            else:
                slot.state = "retiring"
        return kill

    def holds(self, run: Hashable) -> bool:
        """Whether ``run`` holds a place (granted, not yet released)."""
        return any(s.holder == run for s in self.slots.values())

    def dead(self, wid: int) -> None:
        """Worker ``wid`` is gone (found dead, or killed by the shell)."""
        slot = self.slots.get(wid)
        if slot is not None and slot.holder is not None:
            self.held.discard(slot.holder)
        self._remove(wid)

    def close(self) -> list[int]:
        """Refuse everything from now on; every worker the shell must kill."""
        self.closed = True
        self.waiting.clear()
        self.held.clear()
        self.computing.clear()
        self.share_queue.clear()
        self.slices.clear()
        self.parked.clear()
        wids = list(self.slots)
        self.slots.clear()
        self.idle.clear()
        return wids

    # -- CPU shares -------------------------------------------------------------------

    def take_share(self, run: Hashable, wait: bool) -> bool:
        """Whether ``run`` now holds a CPU share (true at once if it holds one
        already, or the pool is closed). A run granted one leaves the queue;
        one refused joins it if ``wait`` (its thread then waits and asks
        again when :meth:`share_head` names it), else it stays out of it (the
        relay's kick, which never waits: the driving thread asks instead). A
        share is granted only to the head of the queue, or with none waiting;
        never to a parked run (:meth:`resume_head` gives it its share)."""
        if run in self.computing or self.closed:
            return True
        if run in self.parked:
            return False
        queue = self.share_queue
        if len(self.computing) < self.cpu_shares and (not queue or queue[0] == run):
            if queue and queue[0] == run:
                queue.popleft()
            self.computing.add(run)
            return True
        if wait and run not in queue:
            queue.append(run)
        return False

    def give_share(self, run: Hashable) -> bool:
        """``run``'s step is over (its answers are in, or it stopped): its share,
        if it holds one, is free, and it leaves the queue if it was parked.
        Whether it was parked (the shell continues its worker). Idempotent."""
        self.computing.discard(run)
        self.slices.pop(run, None)
        return self.unpark(run)

    def leave_shares(self, run: Hashable) -> None:
        """``run`` no longer waits for a share (its deadline, a cancel, an interrupt)."""
        try:
            self.share_queue.remove(run)
        except ValueError:
            pass

    def share_head(self) -> Optional[Hashable]:
        """The waiting run that a share is free for now (worth waking, or
        resuming if parked: :meth:`resume_head`), or ``None``.
        When ``None``, every waiting run's :meth:`take_share` answers false."""
        if self.share_queue and len(self.computing) < self.cpu_shares:
            return self.share_queue[0]
        return None

    # -- slices of a share --------------------------------------------------------

    def slice_from(self, run: Hashable, now: float) -> None:
        """``run``'s step computes in its worker from ``now`` (the shell can
        stop it): once it has for a slice while runs wait, :meth:`park_due`
        parks it. Nothing if it holds no share (the pool is closed)."""
        if run in self.computing and not self.closed:
            self.slices[run] = now

    def park_due(self, now: float, slice_: float) -> tuple[Optional[Hashable], float]:
        """``(run, 0)``: park ``run`` now (the shell stops its worker; its share
        is free, and it is queued behind the runs waiting): the step whose
        slice began first, once it has computed ``slice_`` seconds while a
        run waits for a share and none is free. Else ``(None, when)``: when
        to look again (``inf``: only after a change)."""
        if not self.share_queue or self.closed or len(self.computing) < self.cpu_shares:
            return None, math.inf
        if not self.slices:
            return None, math.inf
        run = min(self.slices, key=self.slices.__getitem__)
        due = self.slices[run] + slice_
        if due > now:
            return None, due
        del self.slices[run]
        self.computing.discard(run)
        self.parked.add(run)
        self.share_queue.append(run)
        return run, 0.0

    def resume_head(self, now: float) -> Optional[Hashable]:
        """The parked run at the head of the queue, granted a share now (the
        shell continues its worker; its new slice starts ``now``), if a share
        is free for it; else ``None`` (the head, if any, is a waiting thread's)."""
        head = self.share_head()
        if head is None or head not in self.parked:
            return None
        self.share_queue.popleft()
        self.parked.discard(head)
        self.computing.add(head)
        self.slices[head] = now
        return head

    def unpark(self, run: Hashable) -> bool:
        """``run``'s worker is to go on outside the slices (it stops softly: its
        deadline or a cancel): it leaves the queue if parked, and this step
        is never parked again (its stop, its last logs, must not be cut in
        the middle). Whether it was parked (the shell continues its worker)."""
        self.slices.pop(run, None)
        if run not in self.parked:
            return False
        self.parked.discard(run)
        self.leave_shares(run)
        return True

    def _new(self, run: Optional[Hashable]) -> int:
        wid = next(self._ids)
        self.slots[wid] = Slot(wid, run)
        return wid

    def _remove(self, wid: int) -> None:
        if self.slots.pop(wid, None) is not None and wid in self.idle:
            self.idle.remove(wid)

    # -- what the shell and the tests read ----------------------------------------------

    def place_of(self, run: Hashable) -> Optional[int]:
        """The worker ``run`` holds and computes in (``busy``), or ``None``."""
        for wid, slot in self.slots.items():
            if slot.holder == run and slot.state == "busy":
                return wid
        return None

    def spares_ready(self) -> int:
        """Idle workers that have never run anything (each one ready: see :meth:`started`)."""
        return sum(1 for wid in self.idle if self.slots[wid].domain is FRESH)

    def busy(self) -> int:
        return sum(1 for s in self.slots.values() if s.state == "busy")

    def changed(self) -> bool:
        """Whether a waiting run may now get somewhere (worth waking the first).
        When false, the first waiting run's :meth:`ask` answers ``WAIT``."""
        return bool(self.waiting) and (bool(self.idle) or len(self.slots) < self.size)

"""The lane: the pure ordering state machine inside every :class:`~nous_sched.Scheduler`.

No threads, no clocks, no executor: the lane only decides. Its owner (the
scheduler's driver thread) tells it what happened and asks it what to do next:

* :meth:`Lane.accept` a call, classified ``"parallel"`` or ``"exclusive"``; it
  gets the next sequence number (0, 1, 2, ...).
* :meth:`Lane.finished` once a started call's tool has returned.
* :meth:`Lane.step` for the next action, until it returns ``None``: either
  ``(START, item)`` (run this call now) or ``(COMMIT, item)`` (deliver this
  call's outcome now); or :meth:`Lane.steps` for all of them at once.
* :meth:`Lane.abandon` when the run is over: what to release, and what had
  finished and is still owed its real outcome.

The guarantees, each a property of this class (``tests/test_lane.py`` checks
them all with a stateful test):

* **Commits are in submission order**: ``COMMIT`` actions come for seq 0, 1,
  2, ... with no gaps, whatever order calls finish in.
* **Starts are first in, first out**: only the head of the queue is ever
  considered, so a blocked head blocks everything behind it.
* **At most ``max_parallel`` calls run at once.** A call that finished but
  waits for its predecessors to commit is no longer running.
* **An exclusive call runs alone**: it starts only when every earlier call has
  committed and nothing runs, and it holds the barrier through its own commit,
  so nothing starts or commits between its start and its commit.
* **Eager**: after :meth:`step` returns ``None`` nothing is startable or
  committable; the queue's head waits only for a reason above.
* **Abandon accounts for everything**: every accepted call is committed once,
  either by a ``COMMIT`` action or in :meth:`abandon`'s ``settled``, or is
  returned in its ``queued`` or ``running``; after it the lane accepts nothing
  and does nothing.

Not thread-safe, by design: one thread owns a lane.
"""

from __future__ import annotations

import collections
from typing import Any, Generic, Optional, TypeVar

import attrs

from ..result.records import LaneState
from ..tooling import EXCLUSIVE, Mode

__all__ = ["Lane", "Abandoned", "START", "COMMIT", "LaneClosed"]

T = TypeVar("T")

START = "start"
COMMIT = "commit"


class LaneClosed(RuntimeError):
    """The lane was abandoned: it accepts nothing more. A bug in its owner, never a caller's error."""


@attrs.frozen
class Abandoned(Generic[T]):
    """What :meth:`Lane.abandon` hands back, each in seq order.

    ``queued`` never started; ``running`` started and had not finished;
    ``settled`` had finished and not yet committed: they are committed now,
    in this order, with their real outcomes.
    """

    queued: tuple[T, ...]
    running: tuple[T, ...]
    settled: tuple[T, ...]


#: What an idle lane's :meth:`Lane.abandon` hands back (immutable, so shared).
_NOTHING_LEFT: Abandoned[Any] = Abandoned((), (), ())


class Lane(Generic[T]):
    """The ordering state machine for one run (see the module docstring).

    ``T`` is the owner's record of one call; the lane stores it and hands it
    back in actions, and never looks inside it.
    """

    __slots__ = ("max_parallel", "_pending", "_inflight", "_settled", "_cursor", "_exclusive", "_next_seq", "_closed")

    def __init__(self, max_parallel: int) -> None:
        self.max_parallel = max_parallel
        self._pending: collections.deque[tuple[int, Mode, T]] = collections.deque()
        self._inflight: dict[int, T] = {}
        self._settled: dict[int, T] = {}
        self._cursor = 0  # the next seq to commit
        self._exclusive: Optional[int] = None  # seq of the exclusive call holding the barrier
        self._next_seq = 0
        self._closed = False

    def accept(self, item: T, mode: Mode) -> int:
        """Queue ``item``, classified ``mode``; return its seq.

        :raises LaneClosed: after :meth:`abandon`.
        """
        if self._closed:
            raise LaneClosed("the lane was abandoned; it accepts no more calls")
        seq = self._next_seq
        self._next_seq = seq + 1
        self._pending.append((seq, mode, item))
        return seq

    def finished(self, seq: int) -> Optional[T]:
        """The call ``seq``, started by a ``START`` action, has finished running; its item.

        Ignored after :meth:`abandon` (a tool may return after its run is
        over): ``None`` then.

        :raises KeyError: ``seq`` is not running.
        """
        if self._closed:
            return None
        item = self._settled[seq] = self._inflight.pop(seq)
        return item

    def step(self) -> Optional[tuple[str, T]]:
        """The next action to perform, or ``None`` when nothing can happen until a call finishes.

        A commit comes before a start: finishing the head of the line may be
        what lets the next call start.
        """
        cursor = self._cursor
        settled = self._settled
        if cursor in settled:
            self._cursor = cursor + 1
            if self._exclusive == cursor:
                self._exclusive = None
            return COMMIT, settled.pop(cursor)
        pending = self._pending
        if not pending or self._exclusive is not None:
            return None
        seq, mode, item = pending[0]
        inflight = self._inflight
        if mode == EXCLUSIVE:
            # With commits first, nothing running already means cursor == seq;
            # both are checked because together they are the rule.
            if inflight or cursor != seq:
                return None
            self._exclusive = seq
        elif len(inflight) >= self.max_parallel:
            return None
        pending.popleft()
        inflight[seq] = item
        return START, item

    def steps(self) -> list[tuple[str, T]]:
        """Every action :meth:`step` gives now, in its order, until it would
        return ``None`` (the same actions and the same lane after: one call
        for a whole pass, where a pass of a thousand calls asked a thousand times)."""
        actions: list[tuple[str, T]] = []
        settled = self._settled
        pending = self._pending
        inflight = self._inflight
        cursor = self._cursor
        exclusive = self._exclusive
        limit = self.max_parallel
        while True:
            if cursor in settled:  # a commit before a start, as in step
                if exclusive == cursor:
                    exclusive = None
                actions.append((COMMIT, settled.pop(cursor)))
                cursor += 1
                continue
            if not pending or exclusive is not None:
                break
            seq, mode, item = pending[0]
            if mode == EXCLUSIVE:
                if inflight or cursor != seq:
                    break
                exclusive = seq
            elif len(inflight) >= limit:
                break
            pending.popleft()
            inflight[seq] = item
            actions.append((START, item))
        self._cursor = cursor
        self._exclusive = exclusive
        return actions

    def abandon(self) -> Abandoned[T]:
        """End the lane: hand back every call not yet committed (see :class:`Abandoned`).

        Idempotent: a second call returns nothing.
        """
        if self.idle():  # (a run's usual end, every call committed: nothing to sort or copy)
            self._exclusive = None
            self._closed = True
            return _NOTHING_LEFT
        queued = tuple(item for _, _, item in self._pending)
        running = tuple(self._inflight[seq] for seq in sorted(self._inflight))
        settled = tuple(self._settled[seq] for seq in sorted(self._settled))
        if self._settled:
            self._cursor = max(self._settled) + 1
        self._pending.clear()
        self._inflight.clear()
        self._settled.clear()
        self._exclusive = None
        self._closed = True
        return Abandoned(queued, running, settled)

    def idle(self) -> bool:
        """No call is queued, running, or finished and not yet committed."""
        return not (self._pending or self._inflight or self._settled)

    def state(self) -> LaneState:
        """A consistent view of the lane, as seqs."""
        return LaneState(
            pending=tuple(seq for seq, _, _ in self._pending),
            inflight=tuple(sorted(self._inflight)),
            settled=tuple(sorted(self._settled)),
            cursor=self._cursor,
            exclusive=self._exclusive,
            submitted=self._next_seq,
            stopped=self._closed,
        )

    def __repr__(self) -> str:
        return f"<Lane {self.state()}>"

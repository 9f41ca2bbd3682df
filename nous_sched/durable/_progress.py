"""A resume's progress, written to the approval store as it goes, and what a later resume makes of it.

While a resume runs, each call it starts is written to the store *before* its
tool runs (``started``: seq, tool, arguments, and the clock values read so
far), and each outcome when the program gets it (``committed``: the ledger
entry). A resume that takes over a dead claim (:mod:`nous_sched.durable._claimer`)
replays what committed, runs what never started, and refuses to start while a
started call was never committed, unless a person settled it: ``ran`` (the
program gets an error saying its result was lost) or ``not-ran`` (it runs).

The record (JSON, sealed by the store): ``{"tracked": true, "decisions":
{seq: {approved, reason[, grant]}}, "clock": [...], "started": {seq: [tool, args
text]}, "committed": {seq: [tool, args text, ok, value]}, "settled": {seq:
"ran" | "not-ran"}, "lease": epoch, "state": [...]}`` (``lease``: the
wall-clock time until which the resume holds its claim, renewed by
:class:`Renewal`, so that a resume on another host may take over a claim
whose lease ran out: :func:`nous_sched.durable._claimer.lease_alive`; ``state``: the answer of each of the
program's state operations so far, written after each, so a resume that
takes over replays them instead of doing them again). ``tracked: false`` is a resume that continued a parked
run in memory: its calls were not written, so it cannot be taken over.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping, Optional

__all__ = ["Progress", "Renewal", "initial", "unsettled", "recovered", "LOST_RESULT", "DEFAULT_LEASE"]

#: Seconds a resume holds its claim without renewing it, by default (the stores' ``lease``).
DEFAULT_LEASE = 30.0

#: The error a call settled as ``ran`` gives the program.
LOST_RESULT = (
    "call #{seq} to {tool} ran, but its result was lost when the resuming process died (settled by a person); "
    "it was not run again"
)


def initial(decisions: Mapping[int, Any], lease: Optional[float] = None) -> dict[str, Any]:
    """The progress a claim writes: tracked, with the decisions the resume runs with
    (and, given ``lease`` seconds, the claim's lease from now)."""
    shown = {str(seq): d.as_dict() for seq, d in decisions.items()}
    state = {"tracked": True, "decisions": shown, "clock": [], "started": {}, "committed": {}, "settled": {}}
    if lease is not None:
        state["lease"] = time.time() + lease
    return state


def unsettled(progress: Mapping[str, Any]) -> list[tuple[int, list[Any]]]:
    """The started calls no outcome and no person settled: ``[(seq, [tool, args text])]``."""
    settled = progress.get("settled") or {}
    return sorted((int(s), list(call)) for s, call in (progress.get("started") or {}).items() if s not in settled)


def recovered(progress: Mapping[str, Any]) -> tuple[dict[int, list[Any]], dict[int, Any]]:
    """What a taking-over resume replays: its ledger entries by seq (the
    committed calls, and the calls settled ``ran`` as failures), and the
    decisions the crashed resume ran with (seq -> {approved, reason})."""
    ledger = {int(s): list(entry) for s, entry in (progress.get("committed") or {}).items()}
    for s, verdict in (progress.get("settled") or {}).items():
        call = (progress.get("started") or {}).get(s)
        if verdict == "ran" and call is not None and int(s) not in ledger:
            tool = str(call[0])
            error = {"tool": tool, "message": LOST_RESULT.format(seq=s, tool=tool)}
            ledger[int(s)] = [tool, str(call[1]), False, error]
    decisions = {int(s): d for s, d in (progress.get("decisions") or {}).items()}
    return ledger, decisions


class Progress:
    """One resume's progress, written through ``write`` (the store's
    :meth:`~nous_sched.approval_store.ApprovalStore.write_progress`, bound to
    the token and claimer): each write is the whole record; False once the
    claim is no longer this resume's (then nothing more may start)."""

    def __init__(self, state: dict[str, Any], write: Callable[[dict[str, Any]], bool]) -> None:
        self.state = state
        self._write = write
        self._lock = threading.Lock()

    def started(self, seq: int, tool: str, text: str, clock: list[Any]) -> bool:
        """Before call ``seq``'s tool runs: whether it may."""
        with self._lock:
            self.state["clock"] = list(clock)
            self.state["started"][str(seq)] = [tool, text]
            self.state["settled"].pop(str(seq), None)  # it starts again: its old fate no longer counts
            return self._write(self.state)

    def committed(self, seq: int, entry: list[Any]) -> bool:
        """Call ``seq``'s outcome, as the program got it (its ledger entry)."""
        with self._lock:
            self.state["committed"][str(seq)] = entry
            self.state["started"].pop(str(seq), None)
            return self._write(self.state)

    def stated(self, entries: list[Any], clock: list[Any]) -> bool:
        """After a state operation: every state operation's answer so far (the
        durable run's record of them, ``durable/_replay.py``), and the clock values read."""
        with self._lock:
            self.state["clock"] = list(clock)
            self.state["state"] = [list(e) for e in entries]
            return self._write(self.state)

    def renew(self, lease: float) -> bool:
        """The claim's lease, ``lease`` seconds from now (wall clock: another host reads it)."""
        with self._lock:
            self.state["lease"] = time.time() + lease
            return self._write(self.state)

    def track(self, on: bool) -> bool:
        """Off: the resume continues in memory (a parked run), so it cannot be taken over; on: it replays."""
        with self._lock:
            self.state["tracked"] = on
            return self._write(self.state)


class Renewal:
    """A thread (``nous-sched-claim-lease``) that renews a resume's lease every
    ``lease / 3`` seconds until :meth:`stop`, or until a renewal finds the claim
    no longer this resume's. A renewal the store fails (down, slow) is tried
    again at the next turn: the lease then runs out only if the store stays out
    of reach for two more turns, and a resume whose claim was taken over in
    the meantime starts nothing more (every start is a conditional write)."""

    def __init__(self, progress: Progress, lease: float) -> None:
        self._progress = progress
        self._lease = lease
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nous-sched-claim-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self._lease / 3):
            try:
                if not self._progress.renew(self._lease):
                    return  # taken over: nothing more to hold
            except Exception:  # the store failed: the next turn tries again
                continue

    def stop(self) -> None:
        """No more renewals (the resume ended); waits for one in progress."""
        self._done.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

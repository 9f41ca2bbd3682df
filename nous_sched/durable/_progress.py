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
"ran" | "not-ran"}, "state": [...]}`` (``state``: the answer of each of the
program's state operations so far, written after each, so a resume that
takes over replays them instead of doing them again). ``tracked: false`` is a resume that continued a parked
run in memory: its calls were not written, so it cannot be taken over.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping

__all__ = ["Progress", "initial", "unsettled", "recovered", "LOST_RESULT"]

#: The error a call settled as ``ran`` gives the program.
LOST_RESULT = (
    "call #{seq} to {tool} ran, but its result was lost when the resuming process died (settled by a person); "
    "it was not run again"
)


def initial(decisions: Mapping[int, Any]) -> dict[str, Any]:
    """The progress a claim writes: tracked, with the decisions the resume runs with."""
    shown = {str(seq): d.as_dict() for seq, d in decisions.items()}
    return {"tracked": True, "decisions": shown, "clock": [], "started": {}, "committed": {}, "settled": {}}


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

    def track(self, on: bool) -> bool:
        """Off: the resume continues in memory (a parked run), so it cannot be taken over; on: it replays."""
        with self._lock:
            self.state["tracked"] = on
            return self._write(self.state)

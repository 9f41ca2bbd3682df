"""Export a run's sub-call timeline as a Chrome trace (Perfetto, ``chrome://tracing``).

:func:`chrome_trace` turns a :class:`~nous_sched.RunResult` into the JSON
object form of the `Trace Event Format`_; :func:`write_chrome_trace` writes it
to a file that https://ui.perfetto.dev or ``chrome://tracing`` opens as is.

What the trace holds (``pid`` is always 1; ``ts`` and ``dur`` are
microseconds since the run's scheduler started, the clock of
:class:`~nous_sched.CallRecord`):

* Metadata (``"ph": "M"``) events naming the process (``name``) and every
  lane; they carry ``"ts": 0`` so every event has the same five keys.
* Lane ``tid`` 0, ``"run"``: one complete (``"ph": "X"``) event for the whole
  run, from 0 to the later of the run's ``elapsed`` and the last recorded
  instant. Its ``args`` say ``ok``, the error ``kind`` (if any), and how many
  calls and log lines the run had.
* Lanes ``tid`` 1, 2, ...: for every call in the trail, in ``seq`` order, an
  ``"X"`` event named after the tool for its execution (``started`` →
  ``finished``, ``cat`` ``"call"``) and, when it committed, an ``"X"`` event
  ``"<tool> (wait for commit)"`` for the time it finished but waited for its
  predecessors (``finished`` → ``committed``, ``cat`` ``"commit-wait"``; its
  ``dur`` may be 0). Both carry ``args`` ``seq``, ``tool``, ``mode`` and
  ``ok``.

Guarantees:

* Every ``"X"`` event has ``dur >= 0``.
* A call's two events sit on one lane, back to back, and the lane is chosen
  greedily (the lowest-numbered lane free when the call starts), so events on
  one lane never overlap: concurrent calls land on distinct lanes, and an
  exclusive call, which starts only once everything before it has committed,
  always lands on lane 1. A lane is held until its call commits, so a run
  may use more lanes than ``max_parallel``.
* Commit instants (the end of each ``"commit-wait"`` event) are
  non-decreasing in ``seq`` order, because the scheduler commits in
  submission order.
* A call abandoned when the run stopped (``finished`` is ``None``) gets one
  ``"call"`` event running to the end of the run, with ``"abandoned": true``
  in its ``args`` and no wait event.
* Timestamps are rounded to nanoseconds (3 decimals of a microsecond), and
  each ``dur`` is the difference of rounded endpoints, so comparisons hold to
  within a nanosecond.

.. _Trace Event Format:
   https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

from ._text import machine_json
from .result import RunResult

__all__ = ["chrome_trace", "write_chrome_trace", "assign_lanes"]

_PID = 1
_RUN_TID = 0


def _us(seconds: float) -> float:
    """Seconds to microseconds, rounded to nanoseconds (monotonic, so order is kept)."""
    return round(seconds * 1_000_000.0, 3)


def _end(record: Any, span: float) -> float:
    """When a call stopped holding its lane, in seconds."""
    for value in (record.committed, record.finished):
        if value is not None:
            return float(value)
    return span


def _span(result: RunResult) -> float:
    """The run's extent in seconds: its elapsed time or its last recorded instant, whichever is later."""
    latest = max(
        (v for r in result.trail for v in (r.started, r.finished, r.committed) if v is not None),
        default=0.0,
    )
    return max(float(result.elapsed or 0.0), latest)


def assign_lanes(trail: Any, span: Optional[float] = None) -> list[int]:
    """Greedy lane (1-based) per record of ``trail``, in the order given.

    Each call holds its lane from ``started`` to ``committed`` (or
    ``finished``, or ``span`` when abandoned); it takes the lowest lane whose
    previous holder released it at or before the call started.
    """
    records = list(trail)
    if span is None:
        span = max((_end(r, 0.0) for r in records), default=0.0)
    free_at: list[float] = []  # free_at[i]: when lane i + 1 was released
    out = [0] * len(records)
    for index in sorted(range(len(records)), key=lambda i: (records[i].started, records[i].seq)):
        r = records[index]
        start, end = r.started, max(_end(r, span), r.started)
        for i, released in enumerate(free_at):
            if released <= start:
                free_at[i] = end
                out[index] = i + 1
                break
        else:
            free_at.append(end)
            out[index] = len(free_at)
    return out


def chrome_trace(result: RunResult, *, name: str = "run_code") -> dict[str, Any]:
    """The run's trail as a Chrome trace-event JSON object (see the module docstring).

    The value is plain JSON (dicts, lists, str, numbers, bools): pass it to
    :func:`json.dumps` as is.
    """
    trail = sorted(result.trail, key=lambda r: r.seq)
    span = _span(result)
    lanes = assign_lanes(trail, span)
    lane_count = max(lanes, default=0)

    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": _PID, "tid": _RUN_TID, "args": {"name": name}},
        {"name": "thread_name", "ph": "M", "ts": 0, "pid": _PID, "tid": _RUN_TID, "args": {"name": "run"}},
    ]
    for lane in range(1, lane_count + 1):
        events.append(
            {"name": "thread_name", "ph": "M", "ts": 0, "pid": _PID, "tid": lane, "args": {"name": f"lane {lane}"}}
        )
        events.append(
            {"name": "thread_sort_index", "ph": "M", "ts": 0, "pid": _PID, "tid": lane, "args": {"sort_index": lane}}
        )

    run_args: dict[str, Any] = {
        "ok": result.error is None,
        "calls": len(trail),
        "logs": len(result.logs),
    }
    if result.error is not None:
        run_args["error"] = result.error.kind
    events.append(
        {
            "name": name,
            "cat": "run",
            "ph": "X",
            "ts": 0.0,
            "dur": _us(span),
            "pid": _PID,
            "tid": _RUN_TID,
            "args": run_args,
        }
    )

    for record, lane in zip(trail, lanes, strict=True):
        args = {"seq": record.seq, "tool": record.tool, "mode": record.mode, "ok": record.ok}
        start = _us(record.started)
        if record.finished is None:
            finish = max(_us(span), start)
            events.append(_complete(record.tool, "call", start, finish, lane, {**args, "abandoned": True}))
            continue
        finish = max(_us(record.finished), start)
        events.append(_complete(record.tool, "call", start, finish, lane, args))
        if record.committed is not None:
            commit = max(_us(record.committed), finish)
            events.append(_complete(f"{record.tool} (wait for commit)", "commit-wait", finish, commit, lane, args))

    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "nous_sched", "name": name},
    }


def _complete(name: str, cat: str, start: float, end: float, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    # dur from the rounded endpoints, so ts + dur lands on the next event's ts.
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": start,
        "dur": round(end - start, 3),
        "pid": _PID,
        "tid": tid,
        "args": dict(args),
    }


def write_chrome_trace(result: RunResult, path: Union[str, "os.PathLike[str]"], *, name: str = "run_code") -> str:
    """Write :func:`chrome_trace` of ``result`` to ``path`` as UTF-8 JSON (strict JSON: a lone
    surrogate in a name as U+FFFD, :mod:`nous_sched._text`); return the path.

    :raises OSError: the file cannot be written.
    """
    data = chrome_trace(result, name=name)
    path = os.fspath(path)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(machine_json(data, indent=1) + "\n")
    return path

r"""What the command prints: the result, the logs and the trail as a timeline, or one JSON document.

Everything a program wrote reaches an operator's terminal, so human output
shows it inert: control characters (ESC and so CSI and OSC sequences, CR,
BEL, DEL, the C1 range), Unicode line separators, every Unicode format
character (category Cf: bidi controls, U+061C, zero-width characters, the tag
block U+E0000-U+E007F) and lone surrogates are written as escapes (``\x1b``,
``\r``, ``\u202e``, ``\U000e0041``, ``\ud800``); only newline and tab stay, and every line a program wrote is
indented, so it cannot pass for a line of ours. ``--json`` and ``--events`` output is strict JSON whose strings escape the same
characters as JSON escapes, with each lone surrogate replaced by U+FFFD (the
library's rule for JSON it writes, :func:`nous_sched._text.machine_json`).
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional, Sequence, TextIO

import attrs

from .._text import inert as _inert
from .._text import json_inert, machine_json
from ..result import RunResult

__all__ = ["format_trail", "human", "result_json", "inert", "json_text", "shown_json", "BAR_WIDTH", "NULL_HINT"]

#: Printed under a ``null`` result: the usual cause is a program with no ``return``.
NULL_HINT = (
    "(the program returned nothing: an empty program, or one that ends without `return <value>`, "
    "returns null; `return` what the model should see)"
)


def inert(text: str) -> str:
    """``text`` with every character that could act on a terminal written as an escape (module docstring)."""
    return _inert(text)


def json_text(value: Any, **options: Any) -> str:
    """``value`` as strict JSON (``json.dumps`` ``options``) whose strings escape what :func:`inert`
    escapes, lone surrogates as U+FFFD (module docstring)."""
    return machine_json(value, **options)


def shown_json(value: Any, **options: Any) -> str:
    """``value`` as JSON for a person (human output): what :func:`inert` escapes written as
    JSON escapes, a lone surrogate too (``\\ud800``, shown, not replaced)."""
    return json_inert(json.dumps(value, ensure_ascii=False, default=repr, **options))


BAR_WIDTH = 40


def _ms(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def format_trail(trail: Sequence[Any], *, width: int = BAR_WIDTH, span: Optional[float] = None) -> list[str]:
    """The trail as a text timeline: a header, one row per call in ``seq`` order, a legend.

    Each row shows seq, tool, mode, start/finish/commit in ms since the
    scheduler started, ok or error, and a bar of ``width`` columns scaled to
    ``span`` (default: the last instant in the trail): ``-`` while the call
    waited for an executor thread to take it up (``began``), ``~`` while it
    waited for a place in its tool's throttles (``throttled``), ``#`` while it
    ran, ``.`` while it waited for earlier calls to commit, ``?`` for a call
    abandoned when the run stopped. Above the header, one line per tool
    whose calls ran exclusive says why (:attr:`~nous_sched.CallRecord.reason`),
    e.g. ``why exclusive: fs__move_file: untrusted server (seq 2, 5)``.
    """
    records = sorted(trail, key=lambda r: r.seq)
    if not records:
        return ["(no tool calls)"]
    latest = max(v for r in records for v in (r.started, r.finished, r.committed) if v is not None)
    span = max(latest, span or 0.0) or 1e-9
    tool_w = max(4, *(len(r.tool) for r in records))
    tool_w = min(tool_w, 24)

    # Column i covers [i, i + 1) * span / width; a call fills every column its interval overlaps.
    def first(t: float) -> int:
        return min(width - 1, max(0, int(math.floor(t / span * width))))

    def last(t: float) -> int:
        return min(width - 1, max(0, int(math.ceil(t / span * width)) - 1))

    header = f"{'seq':>4}  {'tool':<{tool_w}}  {'mode':<9}  {'start':>8}  {'finish':>8}  {'commit':>8}  {'':<5}  timeline (ms)"
    lines = [*_why_exclusive(records), header]
    for r in records:
        bar = [" "] * width
        s = first(r.started)
        began = getattr(r, "began", None)
        if began is not None and first(began) > s:  # waited for a thread of the executor
            for i in range(s, first(began)):
                bar[i] = "-"
            s = first(began)
        s = _throttle_wait(bar, r, s, first)
        if r.finished is None:
            for i in range(s, width):
                bar[i] = "?"
        else:
            f = max(last(r.finished), s)
            for i in range(s, f + 1):
                bar[i] = "#"
            if r.committed is not None:
                for i in range(f + 1, last(r.committed) + 1):
                    bar[i] = "."
        status = "ok" if r.ok else ("error" if r.ok is False else "-")
        tool = r.tool if len(r.tool) <= tool_w else r.tool[: tool_w - 1] + "…"
        lines.append(
            f"{r.seq:>4}  {tool:<{tool_w}}  {r.mode:<9}  {_ms(r.started):>8}  {_ms(r.finished):>8}  "
            f"{_ms(r.committed):>8}  {status:<5}  |{''.join(bar)}|"
        )
    lines.append(f"{'':>4}  {'':<{tool_w}}  {'':<9}  {'':>8}  {'':>8}  {'':>8}  {'':<5}  0{_ms(span).rjust(width + 1)}")
    lines.append(
        "# running   . finished, waiting for earlier calls to commit   ? abandoned at stop   - waiting for a thread"
    )
    lines.extend(_throttle_legend(records))
    return lines


def _why_exclusive(records: Sequence[Any]) -> list[str]:
    """One line per (tool, reason) of the exclusive calls: which calls, and why they ran alone."""
    seqs: dict[tuple[str, str], list[str]] = {}
    for r in records:
        reason = getattr(r, "reason", "")
        if r.mode == "exclusive" and reason:
            seqs.setdefault((r.tool, reason), []).append(str(r.seq))
    return [f"why exclusive: {tool}: {reason} (seq {', '.join(s)})" for (tool, reason), s in seqs.items()]


def _throttle_legend(records: Sequence[Any]) -> list[str]:
    """The legend's line for ``~``, only when a call's tool named a throttle."""
    if any(getattr(r, "throttled", None) is not None for r in records):
        return ["~ waiting for a throttle's place"]
    return []


def _throttle_wait(bar: list[str], r: Any, s: int, first: Any) -> int:
    """Draw ``~`` over the part of the wait before ``began`` spent waiting for a throttle
    (``r.throttled`` seconds, ending when the tool began, or when the call ended without beginning);
    return the column the rest of the bar starts from."""
    throttled = getattr(r, "throttled", None)
    end = r.began if getattr(r, "began", None) is not None else r.finished
    if throttled is None or end is None or throttled <= 0:
        return s
    for i in range(max(0, first(end - throttled)), first(end)):
        bar[i] = "~"
    return max(s, first(end)) if r.began is None else s


def _peak_parallel(trail: Sequence[Any]) -> int:
    points = []
    for r in trail:
        end = r.finished if r.finished is not None else math.inf
        points.append((r.started, 1))
        points.append((end, -1))
    peak = current = 0
    for _, delta in sorted(points, key=lambda p: (p[0], p[1])):
        current += delta
        peak = max(peak, current)
    return peak


def human(result: RunResult, out: TextIO) -> None:
    if result.error is None:
        out.write("result:\n")
        out.write(_indent(shown_json(result.result, indent=2)) + "\n")
        if result.result is None:
            out.write(_indent(NULL_HINT) + "\n")
    else:
        out.write(f"error ({result.error.kind}):\n")
        out.write(_indent(inert(result.error.message)) + "\n")
    out.write(f"\nlogs ({len(result.logs)}):\n")
    for line in result.logs:
        out.write(_indent(inert(line)) + "\n")
    if result.refused:
        out.write(f"\nrefused by the gate ({len(result.refused)}):\n")
        for refusal in result.refused:
            out.write(_indent(inert(f"{refusal.tool}: {refusal.message}")) + "\n")
    trail = result.trail
    failed = sum(1 for r in trail if r.ok is False)
    summary = f"\ntrail ({len(trail)} calls"
    if trail:
        summary += f", peak {_peak_parallel(trail)} running at once"
    if failed:
        summary += f", {failed} failed"
    summary += f"; run took {result.elapsed * 1000:.1f} ms):\n"
    out.write(summary)
    # The axis spans the whole run: after a timeout, abandoned calls run to its end.
    for line in format_trail(trail, span=result.elapsed):
        out.write("  " + inert(line) + "\n")


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.split("\n"))


def result_json(result: RunResult) -> dict[str, Any]:
    """The ``--json`` document: ``result`` or ``error``, then ``logs``, ``trail``, ``events``, ``refused``,
    and ``state`` (the program's state operations, ``--state``) when it made any."""
    doc: dict[str, Any] = {}
    if result.error is None:
        doc["result"] = result.result
    else:
        doc["error"] = result.error.as_dict()
    doc["logs"] = list(result.logs)
    doc["trail"] = [attrs.asdict(r) for r in result.trail]
    # Each record with its type: tool_call, approval and tool_outcome share the list.
    doc["events"] = [{"type": e.type, **e.as_event().data} for e in result.events]
    doc["refused"] = [dict(r.as_event().data) for r in result.refused]  # the audit's fields, as `events`
    state = [dict(e.data) for e in result.audit if e.type == "state"]
    if state:
        doc["state"] = state
    return doc

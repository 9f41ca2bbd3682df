"""Shared helpers for the hand-run benchmarks (not part of the package or of CI).

Every benchmark script measures nous_sched and its baseline in the same process,
interleaving the two across repetitions so background load hits both alike,
and reports rows::

    name | nous_sched median (min-max) | baseline median (min-max) | ratio | target | status

``ratio`` is always nous_sched's median over the baseline's median. ``status``
is PASS or MISS for a row with a target, INFO for a row that only reports.

Each script accepts ``--quick`` (a fast smoke run: smaller N, fewer
repetitions; its figures are not the ones to quote), ``--reps N`` and
``--json`` (print the rows as one JSON line prefixed ``@@ROWS@@``, for
``run_all.py``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

MARK = "@@ROWS@@"


# -- numbers -----------------------------------------------------------------


@dataclass
class Stats:
    """Median, min and max of a list of samples, in the row's unit."""

    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> "Stats":
        samples = list(samples)
        return cls(statistics.median(samples), min(samples), max(samples), len(samples))

    @classmethod
    def fixed(cls, value: float) -> "Stats":
        """A computed value (an ideal, a budget): no spread."""
        return cls(value, value, value, 0)

    def scaled(self, k: float) -> "Stats":
        return Stats(self.median * k, self.lo * k, self.hi * k, self.n)


def percentile(samples: Sequence[float], p: float) -> float:
    """Nearest-rank percentile, ``p`` in [0, 100]."""
    data = sorted(samples)
    if not data:
        return float("nan")
    k = max(0, min(len(data) - 1, int(round(p / 100.0 * len(data) + 0.5)) - 1))
    return data[k]


def timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of one ``fn()`` call (perf_counter)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleave(reps: int, *fns: Callable[[], float]) -> list[list[float]]:
    """Run each ``fn`` once per repetition, alternating their order, collect samples.

    Each ``fn`` returns one sample. Alternating A,B / B,A spreads background
    noise over both sides instead of biasing whichever runs second.
    """
    out: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    for rep in range(reps):
        seq = order if rep % 2 == 0 else order[::-1]
        for i in seq:
            gc.collect()
            out[i].append(fns[i]())
    return out


# -- rows and tables ---------------------------------------------------------


@dataclass
class Row:
    name: str
    ours: Optional[Stats]
    base: Optional[Stats] = None
    unit: str = "ms"
    target: str = "report"
    status: str = "INFO"  # PASS / MISS / INFO / UNAVAILABLE
    ratio: Optional[float] = None
    note: str = ""
    base_name: str = ""

    def __post_init__(self) -> None:
        if self.ratio is None and self.ours is not None and self.base is not None and self.base.median:
            self.ratio = self.ours.median / self.base.median


def check(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _num(v: float) -> str:
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def fmt_ratio(ratio: Optional[float]) -> str:
    """Three decimals below 10, so a ratio just past a target (1.105 > 1.10) shows it."""
    if ratio is None:
        return "-"
    return f"{ratio:.3f}" if ratio < 10 else f"{ratio:.1f}"


def fmt_stats(s: Optional[Stats], unit: str) -> str:
    if s is None:
        return "-"
    if s.n == 0:
        return f"{_num(s.median)} {unit} (fixed)"
    return f"{_num(s.median)} {unit} ({_num(s.lo)}-{_num(s.hi)})"


def format_table(title: str, rows: Sequence[Row]) -> str:
    head = ("benchmark", "nous_sched median (min-max)", "baseline median (min-max)", "ratio", "target", "status")
    body = []
    for r in rows:
        base = fmt_stats(r.base, r.unit)
        if r.base_name and r.base is not None:
            base = f"{r.base_name}: {base}"
        body.append(
            (
                r.name,
                fmt_stats(r.ours, r.unit) if r.ours is not None else (r.note or "-"),
                base,
                fmt_ratio(r.ratio),
                r.target,
                r.status,
            )
        )
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    line = lambda cells: " | ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [f"== {title}", line(head), "-+-".join("-" * w for w in widths)]
    out.extend(line(b) for b in body)
    notes = [f"  * {r.name.strip()}: {r.note}" for r in rows if r.note and r.ours is not None]
    out.extend(notes)
    return "\n".join(out)


# -- command line --------------------------------------------------------------


@dataclass
class Options:
    quick: bool
    reps: int
    json: bool
    extra: dict = field(default_factory=dict)


def options(description: str, default_reps: int, quick_reps: int = 3) -> Options:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="fast smoke run: smaller N, fewer repetitions")
    p.add_argument(
        "--reps", type=int, default=None, help=f"repetitions (default {default_reps}, {quick_reps} with --quick)"
    )
    p.add_argument("--json", action="store_true", help=f"also print the rows as one JSON line prefixed {MARK}")
    a = p.parse_args()
    reps = a.reps if a.reps is not None else (quick_reps if a.quick else default_reps)
    return Options(a.quick, max(1, reps), a.json)


def emit(title: str, rows: Sequence[Row], opts: Options) -> None:
    print(format_table(title, rows), flush=True)
    if opts.json:
        print(MARK + json.dumps({"title": title, "rows": [asdict(r) for r in rows]}), flush=True)


def rows_from_json(payload: dict) -> tuple[str, list[Row]]:
    rows = []
    for d in payload["rows"]:
        ours = Stats(**d.pop("ours")) if d.get("ours") else None
        base = Stats(**d.pop("base")) if d.get("base") else None
        d.pop("ours", None)
        d.pop("base", None)
        rows.append(Row(ours=ours, base=base, **d))
    return payload["title"], rows


def machine_line() -> str:
    try:
        load = "load %.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        load = "load ?"
    return f"python {sys.version.split()[0]}, {os.cpu_count()} cores, {load}"

"""Shared helpers for the hand-run benchmarks (not part of the package or of CI).

Every row compares nous_sched with a baseline measured in the same process.
:func:`interleave` runs them back to back in every repetition, alternating
which goes first, and before each repetition it probes the raw thread hand-off
(``executor.submit(f).result()`` on an idle ``ThreadPoolExecutor``): that
figure says which *hand-off regime* the row ran in, because this machine's
thread wake-ups take either about 10 us (a busy machine: the other vCPU is
awake) or about 80-95 us (a quiet one: it has to be woken), and every ratio
involving threads moves with it. A row reads::

    benchmark | nous_sched median (min-max) | baseline median (min-max) | ratio median (min-max) | target | status | hand-off

``ratio`` is the median of the per-repetition ratios (each one nous_sched over
the baseline it ran beside), so a regime that changes between repetitions
moves both sides of a ratio, not one. ``status``: PASS or MISS against the
row's target, INFO for a row that only reports, SKIP when a peer cannot run,
ERROR when the benchmark itself broke (the script then exits 1).

The runtimes a row can run on come from :func:`available_runtimes`: every public
``*Runtime`` class that :mod:`nous_sched` exports (the in-process
``QuickJSRuntime``, and the worker-process runtime once it exists), so a new
runtime is benchmarked as soon as it is exported.
"""

from __future__ import annotations

import argparse
import atexit
import concurrent.futures
import ctypes
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence, Union

MARK = "@@ROWS@@"

# -- numbers -------------------------------------------------------------------


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
        if not samples:
            raise ValueError("no samples")
        return cls(statistics.median(samples), min(samples), max(samples), len(samples))

    @classmethod
    def fixed(cls, value: float) -> "Stats":
        """A computed value (an ideal, a budget): no spread."""
        return cls(value, value, value, 0)


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


def median_of(fn: Callable[[], Any], k: int) -> float:
    """The median wall time of ``k`` calls of ``fn``: one sample for a short operation."""
    return statistics.median(timed(fn) for _ in range(k))


def per_rep(fn: Callable[..., float], *series: Sequence[float]) -> list[float]:
    """``fn`` applied to each repetition's samples: derived samples, still paired."""
    return [fn(*xs) for xs in zip(*series)]


# -- the hand-off regime -----------------------------------------------------------

FAST_BELOW_US = 35.0
SLOW_ABOVE_US = 50.0
STARVED_ABOVE_US = 150.0
PROBE_CALLS = 200

_probe_pool: Optional[concurrent.futures.ThreadPoolExecutor] = None


def _nothing() -> None:
    return None


def handoff_us(calls: int = PROBE_CALLS) -> float:
    """Microseconds per raw ``executor.submit(f).result()`` round trip, right now."""
    global _probe_pool
    if _probe_pool is None:
        _probe_pool = concurrent.futures.ThreadPoolExecutor(10, thread_name_prefix="bench-probe")
        _probe_pool.submit(_nothing).result()
    submit = _probe_pool.submit
    t0 = time.perf_counter()
    for _ in range(calls):
        submit(_nothing).result()
    return (time.perf_counter() - t0) / calls * 1e6


def regime_of(us: float) -> str:
    """fast (~10 us: the other vCPU is awake), slow (~80-95 us: it must be woken),
    starved (more: every CPU is busy and the woken thread waits its turn), or between."""
    if us < FAST_BELOW_US:
        return "fast"
    if us <= SLOW_ABOVE_US:
        return "between"
    if us <= STARVED_ABOVE_US:
        return "slow"
    return "starved"


def fmt_regime(probe: Optional[Stats]) -> str:
    """The regime of a row's probes: one label, or "mixed" with the range when they differ."""
    if probe is None:
        return "-"
    lo, hi = regime_of(probe.lo), regime_of(probe.hi)
    if lo == hi:
        return f"{lo} {_num(probe.median)} us"
    return f"mixed {_num(probe.lo)}-{_num(probe.hi)} us"


# -- interleaved measurement -----------------------------------------------------


@dataclass
class Samples:
    """What :func:`interleave` measured: one list of samples per function, the
    probes, and for each sample the cores it kept busy (CPU seconds of this
    process and its child processes over the sample's wall seconds) and the
    load average when it ran."""

    runs: list[list[float]]
    probes: list[float]
    first: list[int]  # which function ran first, per repetition
    cores: list[list[float]] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)

    def cpu(self, i: int, values: Sequence[float]) -> Optional[Stats]:
        """CPU per call beside the row's wall figures ``values`` (function
        ``i``'s samples, in the row's unit): each one times the cores its
        sample kept busy, so the host's threads and its workers alike."""
        if i >= len(self.cores) or len(self.cores[i]) != len(values):
            return None
        return Stats.of([v * k for v, k in zip(values, self.cores[i])])

    @property
    def load(self) -> Optional[Stats]:
        return Stats.of(self.loads) if self.loads else None

    def __iter__(self) -> Iterator[list[float]]:
        return iter(self.runs)

    def __getitem__(self, i: int) -> list[float]:
        return self.runs[i]

    @property
    def regime(self) -> Stats:
        return Stats.of(self.probes)


def interleave(reps: int, *fns: Callable[[], float]) -> Samples:
    """Run each ``fn`` once per repetition, back to back, and collect one sample from each.

    The order alternates (forward, reversed) and rotates, so over the
    repetitions every function runs in every position and background load
    lands on all of them alike. Before every repetition, and after the last,
    the raw hand-off is probed (:func:`handoff_us`): the row's regime. Each
    sample's CPU (this process and every descendant, :func:`tree_cpu`) and
    the one-minute load average are recorded beside it (:meth:`Samples.cpu`).
    """
    runs: list[list[float]] = [[] for _ in fns]
    cores: list[list[float]] = [[] for _ in fns]
    loads: list[float] = []
    probes: list[float] = []
    first: list[int] = []
    me = os.getpid()
    k = len(fns)
    for rep in range(reps):
        order = list(range(k))
        shift = (rep // 2) % k
        order = order[shift:] + order[:shift]
        if rep % 2:
            order.reverse()
        first.append(order[0])
        probes.append(handoff_us())
        loads.append(load1())
        for i in order:
            gc.collect()
            c0, w0 = tree_cpu(me), time.perf_counter()
            runs[i].append(fns[i]())
            w1, c1 = time.perf_counter(), tree_cpu(me)
            cores[i].append((c1 - c0) / (w1 - w0) if w1 > w0 else 0.0)
    probes.append(handoff_us())
    return Samples(runs, probes, first, cores, loads)


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

#: This process's own CPU-accounting cgroup, once :func:`own_cgroup` joined
#: one: (its directory, its usage file, seconds per unit of that file).
_CGROUP: list[tuple[str, str, float]] = []
_CGROUP_PREFIX = "nous-sched-bench-"
#: Where a cgroup of its own is tried, in order: cgroup v2 (``cpu.stat``'s
#: ``usage_usec``), at its usual mount and at a hybrid one; v1's cpuacct (ns).
_CGROUP_PLACES = (
    ("/sys/fs/cgroup", "cpu.stat", 1e-6),
    ("/sys/fs/cgroup/unified", "cpu.stat", 1e-6),
    ("/sys/fs/cgroup/cpuacct", "cpuacct.usage", 1e-9),
)


def own_cgroup() -> Optional[str]:
    """Put this process, and every process it starts from now on, in a
    CPU-accounting cgroup of its own, where the machine lets it (root, a
    writable cgroup v2 or v1 cpuacct hierarchy); the cgroup's directory, or
    None. Then :func:`tree_cpu` of this process reads the cgroup's usage (to
    the micro- or nanosecond, the workers that have died included) instead of
    /proc's clock ticks: a one-shot worker's 16 ms of CPU per run is less
    than two ticks. Called by :func:`options`, before a benchmark starts any
    process (one started before stays outside). Cgroups left by benchmarks
    that are gone are removed first; this one is left as the process exits."""
    if _CGROUP:
        return _CGROUP[0][0]
    for root, usage, unit in _CGROUP_PLACES:
        if not os.path.exists(os.path.join(root, usage)) and not os.path.exists(os.path.join(root, "cgroup.procs")):
            continue
        for stale in os.listdir(root) if os.access(root, os.W_OK) else ():
            if stale.startswith(_CGROUP_PREFIX):
                try:
                    os.rmdir(os.path.join(root, stale))
                except OSError:
                    pass  # (still in use)
        mine = os.path.join(root, f"{_CGROUP_PREFIX}{os.getpid()}")
        try:
            os.mkdir(mine)
            with open(os.path.join(mine, "cgroup.procs"), "w") as fh:
                fh.write(str(os.getpid()))
            with open("/proc/self/cgroup") as fh:
                if os.path.basename(mine) not in fh.read():
                    raise OSError("not moved")
            _cgroup_read(os.path.join(mine, usage), unit)
        except (OSError, ValueError):
            try:
                os.rmdir(mine)
            except OSError:
                pass
            continue
        _CGROUP.append((mine, os.path.join(mine, usage), unit))
        atexit.register(_leave_cgroup, root, mine)
        return mine
    return None


def _cgroup_read(path: str, unit: float) -> float:
    with open(path) as fh:
        text = fh.read()
    if path.endswith("cpu.stat"):
        text = next(line.split()[1] for line in text.splitlines() if line.startswith("usage_usec "))
    return int(text) * unit


def _leave_cgroup(root: str, mine: str) -> None:
    try:
        with open(os.path.join(root, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
        os.rmdir(mine)  # (fails while a child is still in it: the next benchmark removes it)
    except OSError:
        pass


def cpu_clock() -> str:
    """What :func:`tree_cpu` of this process reads: a cgroup's usage, or /proc's clock ticks."""
    if _CGROUP:
        return f"cgroup usage ({_CGROUP[0][1]})"
    return f"/proc clock ticks (1/{_TICK} s) for child processes"


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and its descendants, with what each has
    reaped: the host's threads, a fork server, its workers, and the workers
    it has reaped. Not the kernel's own threads (freeing a worker's
    namespaces). For this process, in a cgroup of its own (:func:`own_cgroup`):
    the cgroup's usage. Else this process's own share from ``getrusage`` (to
    the microsecond); its descendants' from /proc (in clock ticks)."""
    if root == os.getpid() and _CGROUP:
        return _cgroup_read(_CGROUP[0][1], _CGROUP[0][2])
    total, todo = 0.0, []
    if root == os.getpid():
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            r = resource.getrusage(who)
            total += r.ru_utime + r.ru_stime
        todo = _children(root)
    else:
        todo = [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / _TICK
        except (OSError, ValueError, IndexError):
            continue
        todo += _children(pid)
    return total


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", "rb") as fh:
                found += [int(k) for k in fh.read().split()]
    except (OSError, ValueError):
        pass
    return found


def load1() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


@dataclass
class Usage:
    """Process CPU seconds and voluntary context switches (every thread) of each sample."""

    cpu: list[float]
    switches: list[float]


def with_usage(fn: Callable[[], float], usage: Usage) -> Callable[[], float]:
    """``fn``, also recording into ``usage`` what each call cost the process (``getrusage``).

    A voluntary context switch is a thread blocking: each thread hand-off
    costs one or more, so per call they count the hops a design makes.
    """

    def sample() -> float:
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        value = fn()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        usage.cpu.append((r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime))
        usage.switches.append(float(r1.ru_nvcsw - r0.ru_nvcsw))
        return value

    return sample


def ratios(ours: Sequence[float], base: Sequence[float]) -> Stats:
    """The per-repetition ratios ours/base (each pair measured back to back)."""
    return Stats.of([o / b for o, b in zip(ours, base)])


# -- targets -------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A target a row is checked against: its ``ratio`` median, or its own median value."""

    text: str
    limit: float
    on: str = "ratio"  # "ratio" (its median), "ratio_max" (every paired ratio) or "value"
    strict: bool = False  # below rather than at most

    def holds(self, row: "Row") -> Optional[bool]:
        value = row.ratio.median if self.on == "ratio" and row.ratio else None
        if self.on == "ratio_max" and row.ratio:
            value = row.ratio.hi
        if self.on == "value" and row.ours is not None:
            value = row.ours.median
        if value is None:
            return None
        return value < self.limit if self.strict else value <= self.limit


def ratio_at_most(limit: float, what: str = "") -> Target:
    return Target(f"ratio <= {float(limit)!r}" + (f" {what}" if what else ""), limit)


def value_at_most(limit: float, unit: str) -> Target:
    return Target(f"<= {float(limit)!r} {unit}", limit, on="value")


def value_below(limit: float, unit: str) -> Target:
    return Target(f"< {float(limit)!r} {unit}", limit, on="value", strict=True)


def ratio_below(limit: float, what: str = "") -> Target:
    return Target(f"ratio < {float(limit)!r}" + (f" {what}" if what else ""), limit, strict=True)


def every_ratio_below(limit: float, what: str = "") -> Target:
    """Every paired ratio below ``limit``, the whole (min-max) range, not only the median.

    The margin is outside the run's noise in the sense of a sign test: if the
    two sides were equal, each paired ratio would fall either side of 1 with
    even odds, so all ``n`` of them below it has probability ``2**-n`` (1 in
    128 at 7 repetitions; 1 in 4 at ``--quick``'s 2, which is why a smoke run
    is not for quoting).
    """
    return Target(f"every ratio < {float(limit)!r}" + (f" {what}" if what else ""), limit, on="ratio_max", strict=True)


# -- rows and tables -----------------------------------------------------------


@dataclass
class Row:
    """One line of a table. With a :class:`Target`, ``status`` is computed (PASS/MISS)."""

    name: str
    ours: Optional[Stats]
    base: Optional[Stats] = None
    unit: str = "ms"
    base_name: str = ""
    target: Union[Target, str] = "report"
    status: str = "INFO"  # PASS / MISS / INFO / SKIP / ERROR
    ratio: Optional[Stats] = None
    regime: Optional[Stats] = None
    note: str = ""
    #: CPU per call (this process and its child processes) beside ``ours`` and ``base``, in ``unit``.
    cpu: Optional[Stats] = None
    base_cpu: Optional[Stats] = None
    #: The one-minute load average while the row's samples ran.
    load: Optional[Stats] = None

    def __post_init__(self) -> None:
        if self.ratio is None and self.ours is not None and self.base is not None and self.base.median:
            self.ratio = Stats.fixed(self.ours.median / self.base.median)
        if isinstance(self.target, Target):
            verdict = self.target.holds(self)
            if verdict is not None:
                self.status = "PASS" if verdict else "MISS"
            self.target = self.target.text


def ours_vs(
    name: str,
    ours: Sequence[float],
    base: Sequence[float],
    samples: Samples,
    *,
    scale: float = 1.0,
    unit: str,
    base_name: str,
    target: Union[Target, str] = "report",
    note: str = "",
) -> Row:
    """The usual row: paired samples times ``scale`` (seconds to the row's unit), and their regime."""
    o = [x * scale for x in ours]
    b = [x * scale for x in base]
    cpu = base_cpu = None
    for i, run in enumerate(samples.runs if is_time(unit) else ()):  # (which of the samples' functions these are)
        if run is ours:
            cpu = samples.cpu(i, o)
        if run is base:
            base_cpu = samples.cpu(i, b)
    return Row(
        name,
        Stats.of(o),
        Stats.of(b),
        unit=unit,
        base_name=base_name,
        target=target,
        ratio=ratios(o, b),
        regime=samples.regime,
        note=note,
        cpu=cpu,
        base_cpu=base_cpu,
        load=samples.load,
    )


def skip_row(name: str, reason: str) -> Row:
    return Row(name, None, target="report", status="SKIP", note=f"skipped: {reason}")


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


def fmt_ratio(r: Optional[Stats]) -> str:
    """Three decimals below 10, so a ratio just past a target (2.004 > 2.0) shows it."""
    if r is None:
        return "-"

    def one(x: float) -> str:
        return f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"

    if r.n <= 1:
        return one(r.median)
    return f"{one(r.median)} ({one(r.lo)}-{one(r.hi)})"


def fmt_stats(s: Optional[Stats], unit: str) -> str:
    if s is None:
        return "-"
    if s.n == 0:
        return f"{_num(s.median)} {unit} (fixed)"
    if s.n == 1:
        return f"{_num(s.median)} {unit}"
    return f"{_num(s.median)} {unit} ({_num(s.lo)}-{_num(s.hi)})"


HEAD = (
    "benchmark",
    "nous_sched median (min-max)",
    "baseline median (min-max)",
    "ratio (min-max)",
    "target",
    "status",
    "hand-off",
    "CPU per call: ours / baseline",
    "load",
)


def is_time(unit: str) -> bool:
    """Whether a row's unit is a time (per call or not), so CPU per call can stand beside it."""
    head = unit.split("/")[0].split()  # "/call" (a count per call) has no head
    return bool(head) and head[0] in ("s", "ms", "us", "ns") and "CPU" not in unit


def fmt_cpu(r: "Row") -> str:
    """The row's CPU per call, medians, ours / baseline (``-`` where not measured)."""
    if r.cpu is None and r.base_cpu is None:
        return "-"
    ours = _num(r.cpu.median) if r.cpu is not None else "-"
    base = _num(r.base_cpu.median) if r.base_cpu is not None else "-"
    return f"{ours} / {base} {r.unit}" if r.base is not None or r.base_cpu is not None else f"{ours} {r.unit}"


def fmt_load(s: Optional[Stats]) -> str:
    if s is None:
        return "-"
    return f"{s.median:.1f}" if s.n <= 1 or s.lo == s.hi else f"{s.median:.1f} ({s.lo:.1f}-{s.hi:.1f})"


def format_table(title: str, rows: Sequence[Row]) -> str:
    body = []
    for r in rows:
        base = fmt_stats(r.base, r.unit)
        if r.base_name:
            base = f"{r.base_name}: {base}" if r.base is not None else r.base_name
        body.append(
            (
                r.name,
                fmt_stats(r.ours, r.unit) if r.ours is not None else (r.note or "-"),
                base,
                fmt_ratio(r.ratio),
                str(r.target),
                r.status,
                fmt_regime(r.regime),
                fmt_cpu(r),
                fmt_load(r.load),
            )
        )
    widths = [max([len(h)] + [len(b[i]) for b in body]) for i, h in enumerate(HEAD)]

    def line(cells: Sequence[str]) -> str:
        return " | ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    out = [f"== {title}", line(HEAD), "-+-".join("-" * w for w in widths)]
    out.extend(line(b) for b in body)
    seen: set[str] = set()
    for r in rows:
        if r.note and r.ours is not None and r.note not in seen:
            seen.add(r.note)
            out.append(f"  * {r.name.strip()}: {r.note}")
    return "\n".join(out)


# -- command line and running ------------------------------------------------------


@dataclass
class Options:
    quick: bool
    reps: int
    json: bool
    runtimes: Optional[list[str]] = None
    hot: bool = False
    args: Any = None


def options(
    description: str,
    default_reps: int,
    quick_reps: int = 3,
    add_arguments: Optional[Callable[[argparse.ArgumentParser], None]] = None,
) -> Options:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="smoke run: smaller N, fewer repetitions (< 1 min in all)")
    p.add_argument(
        "--reps", type=int, default=None, help=f"repetitions (default {default_reps}, {quick_reps} with --quick)"
    )
    p.add_argument("--json", action="store_true", help=f"also print the rows as one JSON line prefixed {MARK}")
    p.add_argument(
        "--runtime",
        default="",
        help="comma-separated runtimes for run_code rows (default: every one available, see runtimes())",
    )
    p.add_argument(
        "--hot",
        action="store_true",
        help="keep every core busy with nice-19 spinners, so thread hand-offs run in the fast regime",
    )
    if add_arguments:
        add_arguments(p)
    a = p.parse_args()
    reps = a.reps if a.reps is not None else (quick_reps if a.quick else default_reps)
    chosen = [w.strip() for w in a.runtime.split(",") if w.strip()] or None
    opts = Options(a.quick, max(2, reps), a.json, chosen, a.hot, a)
    own_cgroup()  # (before any process starts: CPU read to the microsecond where the machine allows)
    if a.hot:
        start_spinners()
    return opts


def run(title: str, sections: Sequence[tuple[str, Callable[[], list[Row]]]], opts: Options) -> int:
    """Run each section, print one table, return the exit status (1 if a section broke).

    A section that raises becomes an ERROR row (traceback on stderr) and the
    others still run: one benchmark broken by an internal move does not hide
    the rest, and it cannot pass silently.
    """
    rows: list[Row] = []
    broken = False
    for name, section in sections:
        try:
            got = section()
            now = Stats.fixed(load1())
            for r in got:  # every measured row says the load it ran under
                if r.load is None and r.ours is not None:
                    r.load = now
            rows.extend(got)
        except Exception as exc:  # noqa: BLE001 - reported as a row and in the exit status
            broken = True
            print(f"--- section {name!r} broke:", file=sys.stderr)
            traceback.print_exc()
            rows.append(Row(name, None, status="ERROR", note=f"broke: {type(exc).__name__}: {exc}"[:300]))
    print(format_table(title, rows), flush=True)
    print(f"(CPU read from: {cpu_clock()})", flush=True)
    if opts.json:
        print(MARK + json.dumps({"title": title, "rows": [asdict(r) for r in rows]}), flush=True)
    return 1 if broken else 0


def rows_from_json(payload: dict[str, Any]) -> tuple[str, list[Row]]:
    rows = []
    for d in payload["rows"]:
        for key in ("ours", "base", "ratio", "regime", "cpu", "base_cpu", "load"):
            if d.get(key):
                d[key] = Stats(**d[key])
        rows.append(Row(**d))
    return payload["title"], rows


def machine_line() -> str:
    try:
        load = "load %.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        load = "load ?"
    hot = f", hot ({len(_spinners)} nice-19 spinners)" if _spinners else ""
    return f"python {sys.version.split()[0]}, {os.cpu_count()} cores, {load}{hot}"


# -- the fast regime on demand -----------------------------------------------------

_spinners: list[subprocess.Popen[bytes]] = []


def start_spinners() -> None:
    """One nice-19 busy loop per core: no vCPU idles, so wake-ups take the fast path.

    They yield to any runnable thread of normal priority (their CFS weight is
    1.5% of ours), so they cost a benchmark little CPU, but they keep a
    hand-off from waiting for an idle vCPU to wake.
    """
    if _spinners:
        return
    for _ in range(os.cpu_count() or 1):
        _spinners.append(
            subprocess.Popen(
                [sys.executable, "-c", "while True: pass"],
                preexec_fn=lambda: os.nice(19),  # noqa: PLW1509 - POSIX only, like the benchmarks
            )
        )
    atexit.register(stop_spinners)
    time.sleep(0.2)


def stop_spinners() -> None:
    while _spinners:
        p = _spinners.pop()
        p.kill()
        p.wait()


def spinner_pids() -> set[int]:
    return {p.pid for p in _spinners}


# -- runtimes ------------------------------------------------------------------------

# Names for the runtimes' row labels; a runtime not listed is labelled by its
# class name without "Runtime" (ProcessRuntime -> "process").
LABELS = {"QuickJSRuntime": "in-process", "WorkerPool": "worker"}


@dataclass
class RuntimeChoice:
    """One runtime a run_code row runs on: ``runtime`` is passed as ``run_code(runtime=...)``."""

    name: str
    runtime: Any


_made: dict[str, Any] = {}


def _public_runtime_classes() -> dict[str, type]:
    import nous_sched

    found: dict[str, type] = {}
    for attr in getattr(nous_sched, "__all__", ()):
        obj = getattr(nous_sched, attr, None)
        if (
            isinstance(obj, type)
            and (attr.endswith("Runtime") or attr in LABELS)
            and attr != "CodeRuntime"
            and callable(getattr(obj, "run", None))
        ):
            found[attr] = obj
    if "QuickJSRuntime" not in found:
        # Not exported (yet): the in-process runtime's own module.
        from nous_sched.runtime.quickjs import QuickJSRuntime

        found["QuickJSRuntime"] = QuickJSRuntime
    return found


def _label(cls_name: str) -> str:
    return LABELS.get(cls_name) or cls_name[: -len("Runtime")].lower() or cls_name


def available_runtimes() -> list[str]:
    names = [_label(n) for n in _public_runtime_classes()]
    return sorted(names, key=lambda n: (n != "in-process", n))


def runtime_names(opts: Options) -> list[str]:
    """The runtimes the run_code rows run on: ``--runtime``, or every available one."""
    names = opts.runtimes or available_runtimes()
    unknown = [n for n in names if n not in available_runtimes()]
    if unknown:
        raise SystemExit(f"unknown runtime(s) {unknown}; available: {', '.join(available_runtimes())}")
    return names


def make_runtime(name: str) -> RuntimeChoice:
    """The runtime called ``name``, made once per process (no arguments) and closed at exit.

    Made once, so a runtime with a pool of workers is measured warm; closed
    with its ``close()`` or ``shutdown()``, if it has one.
    """
    if name not in _made:
        classes = {_label(n): cls for n, cls in _public_runtime_classes().items()}
        rt = _made[name] = classes[name]()
        closer = getattr(rt, "close", None) or getattr(rt, "shutdown", None)
        if callable(closer):
            atexit.register(closer)
    return RuntimeChoice(name, _made[name])


def per_runtime(
    opts: Options, name: str, section: Callable[[RuntimeChoice], list[Row]]
) -> list[tuple[str, Callable[[], list[Row]]]]:
    """One section per runtime, named ``"<name> [<runtime>]"``.

    The runtime is made inside its section, so one that cannot start is an
    ERROR row and the other runtimes' rows still run.
    """

    def bind(rt: str) -> Callable[[], list[Row]]:
        return lambda: section(make_runtime(rt))

    return [(f"{name} [{rt}]", bind(rt)) for rt in runtime_names(opts)]


# -- memory and threads ------------------------------------------------------------


def rss_mib(pid: Union[int, str] = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def pss_mib(pid: Union[int, str]) -> float:
    """Proportional set size from smaps_rollup: walks the page tables, so it is exact."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def child_pids() -> set[int]:
    """Direct children of this process (workers of a process runtime), spinners excluded."""
    pids: set[int] = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids.update(int(p) for p in f.read().split())
    except OSError:
        pass
    return pids - spinner_pids()


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def trim_heap() -> None:
    """Give freed heap back to the OS, so an RSS delta counts what a phase allocates."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass

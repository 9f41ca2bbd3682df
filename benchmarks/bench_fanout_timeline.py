"""One 50-wide fan-out's timeline, phase by phase, from the ``run_code`` call to its return.

``await Promise.all`` of 50 calls of a tool that sleeps 5 ms, ``max_parallel``
50, after three warm-up runs. Each timed run stamps (``time.perf_counter``,
milliseconds after the ``run_code`` call) the end of each phase of the run,
by wrapping the functions that end them (for this probe only):

* ``options``: ``RunOptions`` made (``_run.options.build``);
* ``prepared``: the program and tool set checked (``_run.runner.prepare``);
* ``begun``: a worker taken and the program sent (``WorkerPool.begin``; the
  in-process runtime begins nothing);
* ``scheduler``: the run's scheduler, gate and host bindings (``_build``);
* ``context``: a fresh QuickJS context with the prelude (in-process only;
  a worker made it while idle);
* ``first envelope``: the program ran to its first wait and its envelope was
  read (the engine's ``start``);
* ``calls admitted``: the 50 calls passed the gate and reached the driver's
  queue as one message (the batch's end);
* ``first began`` / ``last began``: the tools' own first line (in the tool);
* ``first ended`` / ``last ended``: the tools' last line;
* how late each tool's last line ran past its 5 ms sleep (the timer's own
  slack, some 0.08-0.1 ms here, and the wait for the GIL as the tools end
  together): the median, and the head's (call 0, the first to begin, whose
  commit sends the first settle frame);
* ``last committed``: the driver committed the 50th call (the trail);
* ``settled``: the last settle step returned (``settle_many``, or the relay's
  answers), with how many steps carried the 50 settles;
* ``drive returned``, ``wound down`` (scheduler stopped, worker given back),
  ``result made`` (the RunResult), ``returned``.

Beside the stamps, load-independent counts of where the host's CPU went in
each run (each thread's ``/proc`` schedstat and context switches, read
before and after the run): the tool threads' CPU and their context switches
per call (a call's least is two: it sleeps in its tool, then parks), and of
those the preemptions (involuntary: the thread was still runnable, most
often just after it woke a thread, or handed the GIL to one, on its own
CPU), the scheduler's driver's CPU and switches; the run's own thread's CPU (its own clock,
``time.thread_time``, read just around ``run_code``: the ``/proc`` reading
itself costs the thread that makes it some 1.7 ms with 60 threads, which a
reading by ``/proc`` would count as the run's) and its context switches; and whether a settle frame
was still in flight when the last call committed (the rest of the batch then
waits for its answer: ``relay.answers`` before the next ``settle_many``).

Run by hand::

    python benchmarks/bench_fanout_timeline.py worker|in-process [--runs 8]

It prints each run's stamps, then the median of each phase's length and of each count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from typing import Any, Callable

import nous_sched._run.entry as entry
import nous_sched._run.runner as runner
import nous_sched.runtime._remote as remote
import nous_sched.runtime.engine as engine
import nous_sched.runtime.quickjs as quickjs
import nous_sched.scheduler._calls as calls
import nous_sched.scheduler._shell as scheduler_shell
from nous_sched import QuickJSRuntime, Tool, WorkerPool, run_code

WIDE = 50
SLEEP = 0.005
PROGRAM = (
    f"const parts = await Promise.all(Array.from({{ length: {WIDE} }}, (_, i) => tools.sleepy({{ i }})));\n"
    "return parts.reduce((a, b) => a + b, 0);"
)
PHASES = (
    "options",
    "prepared",
    "begun",
    "scheduler",
    "context",
    "first envelope",
    "calls admitted",
    "first began",
    "last began",
    "first ended",
    "last ended",
    "last committed",
    "settled",
    "drive returned",
    "wound down",
    "result made",
    "returned",
)
COUNTS = (
    "tool threads us",
    "tool switches/call",
    "tool preempted/call",
    "driver us",
    "driver switches",
    "run's thread us",
    "run's thread switches",
    "tools late us (median)",
    "head late us",
)
stamps: dict[str, float] = {}
began: list[float] = []
ended: list[float] = []
late: dict[int, float] = {}  # each call's i: how long past its sleep its tool's last line ran (us)
steps: list[int] = []
scheduler_t0: list[float] = []
relayed: list[float] = []  # when each relayed frame's answers began to be read
sent: list[float] = []  # when each settle_many of the run's own thread began (worker)


#: Native thread ids: the tool threads that ran a call, the driver (its passes).
tool_tids: set[int] = set()
driver_tids: set[int] = set()


def sleepy(args: dict[str, Any]) -> Any:
    tool_tids.add(threading.get_native_id())
    t0 = time.perf_counter()
    began.append(t0)
    time.sleep(SLEEP)
    t1 = time.perf_counter()
    ended.append(t1)
    late[args["i"]] = (t1 - t0 - SLEEP) * 1e6
    return args["i"]


TOOL = Tool("sleepy", sleepy, concurrency_safe=lambda args: True)


def stamp_after(owner: Any, name: str, phase: str, first_only: bool = False) -> None:
    """Wrap ``owner.name`` so its return stamps ``phase`` (the last return, or the first)."""
    fn = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        if not (first_only and phase in stamps):
            stamps[phase] = time.perf_counter()
        return out

    setattr(owner, name, wrapped)


def counting(owner: Any, name: str, size: Callable[..., int]) -> None:
    """Count the settle steps: each call of ``owner.name`` is one step of ``size(args)`` settles."""
    fn = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        steps.append(size(*args))
        stamps["settled"] = time.perf_counter()
        return out

    setattr(owner, name, wrapped)


def per_thread_split() -> dict[int, tuple[int, int, int]]:
    """Each thread of this process: (CPU ns, voluntary, involuntary context switches), from /proc."""
    out: dict[int, tuple[int, int, int]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as fh:
                cpu = int(fh.read().split()[0])
            with open(f"/proc/self/task/{tid}/status", encoding="ascii") as fh:
                status = fh.read()
        except OSError:  # (a thread gone meanwhile)
            continue
        counts = {}
        for line in status.splitlines():
            if line.endswith(tuple("0123456789")) and "ctxt_switches" in line:
                key, value = line.split()
                counts[key] = int(value)
        out[int(tid)] = (cpu, counts.get("voluntary_ctxt_switches:", 0), counts.get("nonvoluntary_ctxt_switches:", 0))
    return out


def per_thread() -> dict[int, tuple[int, int]]:
    """Each thread of this process: (CPU ns, context switches), from /proc."""
    return {tid: (cpu, voluntary + involuntary) for tid, (cpu, voluntary, involuntary) in per_thread_split().items()}


def by_role(before: dict[int, tuple[int, int, int]], after: dict[int, tuple[int, int, int]]) -> dict[str, float]:
    """The run's host CPU (us) by role, the tool threads' switches per call
    (all, and those that were preemptions: involuntary, the thread still
    runnable, most often by a thread it had just woken on its own CPU), and
    the driver's switches.

    Not the run's own thread: this reading costs the thread that makes it
    about as much CPU as the run itself (two files of ``/proc`` per thread,
    some 60 threads), and the part of it after its own line counts as the
    run's (see :func:`one`, which reads that thread's own clock)."""
    cpu = {"tool threads us": 0.0, "driver us": 0.0}
    switches = preempted = driver = 0
    for tid, (ns, vol, invol) in after.items():
        was_ns, was_vol, was_invol = before.get(tid, (0, 0, 0))
        if tid in tool_tids:
            cpu["tool threads us"] += (ns - was_ns) / 1e3
            switches += vol - was_vol + invol - was_invol
            preempted += invol - was_invol
        elif tid in driver_tids:
            cpu["driver us"] += (ns - was_ns) / 1e3
            driver += vol - was_vol + invol - was_invol
    cpu["tool switches/call"] = switches / WIDE
    cpu["tool preempted/call"] = preempted / WIDE
    cpu["driver switches"] = float(driver)
    return cpu


def own_switches() -> int:
    """This thread's context switches so far (voluntary and not)."""
    with open("/proc/thread-self/status", encoding="ascii") as fh:
        return sum(int(line.split()[1]) for line in fh if "ctxt_switches" in line)


def instrument(pool: Any) -> None:
    stamp_after(entry, "build", "options")
    stamp_after(entry, "prepare", "prepared")
    if pool is not None:
        stamp_after(type(pool), "begin", "begun")
    build = runner._build

    def built(*args: Any, **kwargs: Any) -> Any:
        out = build(*args, **kwargs)
        scheduler_t0.append(out[0]._t0)  # its trail's clock
        stamps["scheduler"] = time.perf_counter()
        return out

    runner._build = built
    stamp_after(engine, "prepare", "context")
    stamp_after(engine.Engine, "start", "first envelope")
    stamp_after(remote.Remote, "start", "first envelope")
    stamp_after(calls.Batch, "__exit__", "calls admitted")
    counting(engine.Engine, "settle_many", lambda self, batch: len(batch))
    counting(engine.Engine, "settle", lambda self, *a: 1)
    counting(remote.Relay, "answers", lambda self, batch: len(batch))
    counting(remote.Remote, "settle_many", lambda self, batch: len(batch))
    drive_pass = scheduler_shell.Scheduler._drive

    def a_pass(self: Any) -> None:
        driver_tids.add(threading.get_native_id())
        drive_pass(self)

    scheduler_shell.Scheduler._drive = a_pass  # type: ignore[method-assign]
    answers = remote.Relay.answers

    def read(self: Any, batch: Any) -> Any:
        relayed.append(time.perf_counter())  # (the answers to a frame the committing thread sent)
        return answers(self, batch)

    remote.Relay.answers = read  # type: ignore[method-assign]
    settle_many = remote.Remote.settle_many

    def send(self: Any, batch: Any) -> Any:
        sent.append(time.perf_counter())
        return settle_many(self, batch)

    remote.Remote.settle_many = send  # type: ignore[method-assign]
    stamp_after(quickjs, "drive", "drive returned")
    stamp_after(remote, "drive", "drive returned")
    stamp_after(runner, "_wind_down", "wound down")
    stamp_after(runner, "_result", "result made")


def one(runtime: Any) -> dict[str, float]:
    stamps.clear()
    began.clear()
    ended.clear()
    late.clear()
    steps.clear()
    scheduler_t0.clear()
    relayed.clear()
    sent.clear()
    before = per_thread_split()
    switched = own_switches()
    cpu0 = time.thread_time_ns()
    t0 = time.perf_counter()
    r = run_code(PROGRAM, [TOOL], runtime=runtime, max_parallel=WIDE, timeout=60, description="fan-out")
    stamps["returned"] = time.perf_counter()
    cpu1 = time.thread_time_ns()
    switched = own_switches() - switched
    counts = by_role(before, per_thread_split())
    counts["run's thread us"] = (cpu1 - cpu0) / 1e3
    counts["run's thread switches"] = float(switched)
    assert r.ok, r.error
    stamps["first began"], stamps["last began"] = min(began), max(began)
    stamps["first ended"], stamps["last ended"] = min(ended), max(ended)
    stamps["last committed"] = scheduler_t0[0] + max(c.committed for c in r.trail)
    out = {k: (v - t0) * 1e3 for k, v in stamps.items()}
    # A frame sent before the last commit and read after it, then another step: the rest waited for it.
    last = stamps["last committed"]
    out["in flight at the last commit"] = float(any(at > last and any(m > at for m in sent) for at in relayed))
    out["sends after the last commit"] = float(sum(m > last for m in sent))
    out.update(counts)
    out["tools late us (median)"] = statistics.median(late.values())
    out["head late us"] = late[0]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runtime", choices=["worker", "in-process"])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument(
        "--domain", action="store_true", help="worker: reuse one worker (pool.domain) instead of one-shot"
    )
    parser.add_argument("--gap", type=float, default=0.0, help="seconds to sleep between runs")
    args = parser.parse_args()
    pool = WorkerPool() if args.runtime == "worker" else None
    runtime: Any = pool if pool is not None else QuickJSRuntime()
    if pool is not None and args.domain:
        runtime = pool.domain("fan-out")
    instrument(pool)
    runs: list[dict[str, float]] = []
    try:
        for _ in range(3):
            one(runtime)
        for _ in range(args.runs):
            time.sleep(args.gap)
            t = one(runtime)
            t["steps"] = len(steps)
            runs.append(t)
            print(
                " ".join(f"{k}={t[k]:.2f}" for k in PHASES if k in t)
                + f" | {len(steps)} settle steps {sorted(steps, reverse=True)[:6]}"
            )
    finally:
        if pool is not None:
            pool.close()
    print(f"# {args.runtime}: median over {len(runs)} runs (ms after the run_code call; phase length)")
    prev = 0.0
    for k in PHASES:
        if k not in runs[0]:
            continue
        at = statistics.median(t[k] for t in runs)
        print(f"  {k:16} {at:7.2f}   +{at - prev:5.2f}")
        prev = at
    print(f"  settle steps     {statistics.median(t['steps'] for t in runs):g}")
    for k in COUNTS:
        print(f"  {k:28} {statistics.median(t[k] for t in runs):8.1f}")
    sends = statistics.mean(t["sends after the last commit"] for t in runs)
    print(f"  settle frames the run's thread sent after the last commit: {sends:.2f} per run (each a round trip)")
    share = statistics.mean(t["in flight at the last commit"] for t in runs)
    print(f"  a frame in flight at the last commit, then another step: {share:.0%} of runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A one-call run's timeline, phase by phase, from the ``run_code`` call to its return,
with the counts that do not move with the machine's load.

``run_code("return await tools.noop({});", [noop])`` on a one-shot
``WorkerPool`` with its spares ready (the start-up row of
``bench_startup.py``), after warm-up runs. Each timed run stamps
(``time.perf_counter``, milliseconds after the ``run_code`` call) the end of
each phase, by wrapping the functions that end them (for this probe only):

* ``options``, ``prepared``: ``RunOptions`` made, the program and tools checked;
* ``acquired``: a worker taken (``WorkerPool._acquire``); ``sent``: its run
  frame sent (``Remote.send_run``); ``begun``: ``WorkerPool.begin`` returned;
* ``scheduler``: the run's scheduler made (``Scheduler.__init__``);
  ``built``: its gate and context too (``runner._build``);
* ``first envelope``: the program ran to its first wait (``Remote.start``);
* ``call submitted``: the call reached the driver (``submit_snapshot``);
* ``tool ran``: the tool's own line; ``settled``: the answer stepped;
* ``drive returned``; ``released``: the worker given back
  (``WorkerPool._release``, its start too: ``release began``);
* ``stop began`` / ``stopped``: ``Scheduler.stop``, and between them the
  driver's last act (``driver woke``, ``driver wound down``: ``Scheduler._wind_down``); ``wound down``;
* ``result made`` (the RunResult), ``returned``.

Beside the medians, per run (means over the timed runs): the host's CPU
(``getrusage(RUSAGE_SELF)``), the run's own thread's CPU, the host's context
switches (voluntary + involuntary, every thread), and with ``--syscalls``
the host's system calls, counted by ``perf stat -e raw_syscalls:sys_enter``
attached to this process for the timed runs only. Counts and CPU move far
less with the load than the phases' wall times.

Run by hand::

    python benchmarks/bench_startup_timeline.py [--runs 200] [--empty] [--syscalls] [--cpu]

``--cpu`` stamps the run's thread's own CPU time (``time.thread_time``)
instead of the wall clock: each phase's CPU on the run's path, with the
stamps made on other threads left out.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import nous_sched._run.entry as entry
import nous_sched._run.runner as runner
import nous_sched.runtime._remote as remote
from nous_sched import Scheduler, Tool, WorkerPool, run_code
from nous_sched.runtime.pool import WorkerPool as _Pool

ONE_CALL = "return await tools.noop({});"
PHASES = (
    "options",
    "prepared",
    "acquired",
    "sent",
    "begun",
    "scheduler",
    "built",
    "first envelope",
    "call submitted",
    "tool ran",
    "settled",
    "drive returned",
    "release began",
    "released",
    "stop began",
    "driver woke",
    "driver wound down",
    "stopped",
    "wound down",
    "result made",
    "returned",
)
stamps: dict[str, float] = {}
clock = time.perf_counter  # --cpu: time.thread_time (the run's thread's CPU; stamps of other threads dropped)
MAIN = threading.main_thread()


def noop(args: dict[str, Any]) -> Any:
    if clock is time.perf_counter:
        stamps["tool ran"] = clock()
    return 1


TOOL = Tool("noop", noop, concurrency_safe=lambda args: True)


def around(owner: Any, name: str, after: str, before: str = "") -> None:
    """Wrap ``owner.name``: its return stamps ``after`` (the first return per run), its call ``before``."""
    fn = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        mine = clock is time.perf_counter or threading.current_thread() is MAIN
        if before and before not in stamps and mine:
            stamps[before] = clock()
        out = fn(*args, **kwargs)
        if after not in stamps and mine:
            stamps[after] = clock()
        return out

    setattr(owner, name, wrapped)


def instrument() -> None:
    around(entry, "build", "options")
    around(entry, "prepare", "prepared")
    around(_Pool, "_acquire", "acquired")
    around(remote.Remote, "send_run", "sent")
    around(_Pool, "begin", "begun")
    around(Scheduler, "__init__", "scheduler")
    around(runner, "_build", "built")
    around(remote.Remote, "start", "first envelope")
    around(Scheduler, "submit_snapshot", "call submitted")
    around(remote.Relay, "answers", "settled")
    around(remote.Remote, "answers", "settled")
    around(remote, "drive", "drive returned")
    around(_Pool, "_release", "released", "release began")
    around(Scheduler, "stop", "stopped", "stop began")
    around(Scheduler, "_wind_down", "driver wound down", "driver woke")
    around(runner, "_wind_down", "wound down")
    around(runner, "_result", "result made")


def _kind(name: str) -> str:
    if name == "MainThread":
        return "run"
    for kind in ("driver", "tool", "spares"):
        if kind in name:
            return kind
    return "other"


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of this process's threads, summed by what they are."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kind = _kind(names.get(int(tid), "?"))
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def one(runtime: Any, program: str) -> dict[str, float]:
    stamps.clear()
    t0 = clock()
    r = run_code(program, [TOOL], runtime=runtime, description="start-up")
    stamps["returned"] = clock()
    assert r.ok, r.error
    return {k: (v - t0) * 1e3 for k, v in stamps.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--empty", action="store_true", help="run_code('') instead of one call")
    parser.add_argument("--syscalls", action="store_true", help="count the host's system calls with perf stat")
    parser.add_argument("--quiet", action="store_true", help="no line per run")
    parser.add_argument("--cpu", action="store_true", help="stamp the run's thread's CPU time, not the wall clock")
    args = parser.parse_args()
    global clock
    if args.cpu:
        clock = time.thread_time
    program = "" if args.empty else ONE_CALL
    pool = WorkerPool()
    instrument()
    runs: list[dict[str, float]] = []
    perf = None
    try:
        for _ in range(30):
            one(pool, program)
        pool.wait_for_spares(5.0)
        time.sleep(0.2)
        if args.syscalls:
            perf = subprocess.Popen(
                ["perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter", "-p", str(os.getpid())],
                stderr=subprocess.PIPE,
                text=True,
            )
            time.sleep(0.5)  # perf attached
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        by0 = thread_cpu()
        th0 = time.thread_time()
        for _ in range(args.runs):
            t = one(pool, program)
            runs.append(t)
            if not args.quiet:
                print(" ".join(f"{k}={t[k]:.3f}" for k in PHASES if k in t))
        th1 = time.thread_time()
        by1 = thread_cpu()
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        syscalls = None
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            _, err = perf.communicate()
            for line in err.splitlines():
                parts = line.split(",")
                if len(parts) > 2 and "raw_syscalls:sys_enter" in parts[2]:
                    syscalls = float(parts[0])
    finally:
        pool.close()
    n = len(runs)
    kind = "an empty run" if args.empty else "a one-call run"
    what = "the run's thread's CPU, ms" if args.cpu else "ms"
    print(f"# {kind} [worker], median over {n} runs ({what} after the run_code call; phase length)")
    prev = 0.0
    for k in PHASES:
        if any(k not in t for t in runs):
            continue
        at = statistics.median(t[k] for t in runs)
        print(f"  {k:16} {at:7.3f}   +{at - prev:6.3f}")
        prev = at
    host = (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) / n * 1e6
    switches = (ru1.ru_nvcsw + ru1.ru_nivcsw - ru0.ru_nvcsw - ru0.ru_nivcsw) / n
    print(
        f"  per run: host CPU {host:.0f} us, the run's thread {(th1 - th0) / n * 1e6:.0f} us, "
        f"host context switches {switches:.2f} (voluntary {(ru1.ru_nvcsw - ru0.ru_nvcsw) / n:.2f})"
    )
    kinds = sorted(set(by0) | set(by1))
    print(
        "  per run, host CPU by thread: "
        + ", ".join(f"{k} {(by1.get(k, 0.0) - by0.get(k, 0.0)) / n * 1e6:.0f} us" for k in kinds)
    )
    if perf is not None:
        print(
            f"  per run: host system calls {syscalls / n if syscalls is not None else float('nan'):.1f} "
            "(perf stat, the timed runs and the probe's own stamps)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

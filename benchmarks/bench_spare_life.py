"""A one-shot worker's whole life, fork to reap: its CPU and page faults.

A probe you run by hand, beside ``bench_startup_steps.py`` (issue 44's
start-up row, whose steps are a part of a worker's boot) and
``bench_first_step.py`` (whose figures it repeats). One
``WorkerPool(spares=1)``, its fork server never retired (the pool's
``server_children`` set to 0, so one server forks every worker measured),
runs ``--runs`` runs of ``--program`` one at a time, and reads from
``/proc`` (the kernel's counters, load-independent but for cache effects):

* each spare's CPU (every thread's ``schedstat``) and minor faults when it
  is ready (the boot, the write-ahead included), and from the run frame to
  the program's first tool call (the first step; the tool reads them);
* the fork server's ``cminflt``, ``cutime`` and ``cstime`` (what ``wait4``
  gave it for the workers it reaped): per worker, the minor faults of its
  whole life (fork, boot, run, exit) exactly, and its CPU to the clock
  tick's 10 ms over the runs (0.05 ms per worker over 200);
* the fork server's own CPU and minor faults per worker (its fork, its
  answer, its reaping).

A child's copied pages depend on what its parent wrote last (its heap's
free lists, above all), so only the fork server's own loop, driven by a
pool, gives a worker's true count: a look-alike process that forks
workers itself measured 50-70 faults per worker that the pool's do not
have. Compare two copies of the code by running it with ``PYTHONPATH``
at each, alternating::

    python benchmarks/bench_spare_life.py [--runs 200] [--program one-call|fanout]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# The programs and the /proc readers are bench_first_step's: the two probes must count alike.
from bench_first_step import PROGRAMS, cpu_us, moved

from nous_sched import Tool, WorkerPool, run_code


def stat(pid: int) -> list[int]:
    """``/proc/<pid>/stat``'s fields after the command's name."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        return [int(x) if x.lstrip("-").isdigit() else 0 for x in fh.read().rsplit(")", 1)[1].split()]


def server_counts(pid: int) -> tuple[int, float, int, float]:
    """The fork server's (reaped children's minor faults, their CPU in us,
    its own minor faults, its own CPU in us)."""
    f = stat(pid)
    tick = 1e6 / os.sysconf("SC_CLK_TCK")
    return f[8], (f[13] + f[14]) * tick, f[7], cpu_us(pid)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--program", choices=sorted(PROGRAMS), default="one-call")
    args = parser.parse_args()
    boot: list[float] = []
    boot_faults: list[int] = []
    step: list[float] = []
    step_faults: list[int] = []
    pool = WorkerPool(size=4, spares=1)
    pool._server_children = 0  # noqa: SLF001 - one server forks every worker measured
    with pool:
        # (The fork server's first child is forked before it has learned anything.)
        assert run_code("return 1", runtime=pool, description="warm-up").ok
        assert pool.wait_for_spares(30.0)
        server = pool._server  # noqa: SLF001
        assert server is not None
        time.sleep(2.5)  # (the warm-up's worker reaped: the server looks every 0.5 s, 4 times)
        before = server_counts(server.proc.pid)
        for _ in range(args.runs):
            assert pool.wait_for_spares(30.0)
            time.sleep(0.01)
            ready = {}
            for w in list(pool._workers.values()):  # noqa: SLF001
                try:
                    ready[w.proc.pid] = (cpu_us(w.proc.pid), stat(w.proc.pid)[7])
                except OSError:  # (the last run's worker, gone meanwhile)
                    pass
            seen: list[tuple[float, int, int]] = []

            def probe(_: object, seen: list[tuple[float, int, int]] = seen) -> int:
                if not seen:  # (the run's worker: the one that has faulted since; an idle spare does not)
                    pid = max(ready, key=lambda pid: moved(pid, ready[pid][1]))
                    seen.append((cpu_us(pid), stat(pid)[7], pid))
                return 1

            r = run_code(PROGRAMS[args.program], [Tool("probe", probe)], runtime=pool, description="probe")
            assert r.ok, r.error
            at, was = ready[seen[0][2]]
            boot.append(at)
            boot_faults.append(was)
            step.append(seen[0][0] - at)
            step_faults.append(seen[0][1] - was)
        time.sleep(2.5)  # (every measured worker reaped, but the spare left)
        after = server_counts(server.proc.pid)
        assert pool._server is server  # noqa: SLF001 - (not replaced meanwhile)
    n = args.runs
    print(f"# {os.environ.get('PYTHONPATH', '.')}: {n} runs of {args.program!r}, load {os.getloadavg()[0]:.1f}")
    print(f"  spare at ready, CPU (us)                  {statistics.median(boot):8.0f}")
    print(f"  spare at ready, page faults               {statistics.median(boot_faults):8.0f}")
    print(f"  first step, CPU (us)                      {statistics.median(step):8.0f}")
    print(f"  first step, page faults                   {statistics.median(step_faults):8.0f}")
    print(f"  whole life per worker, page faults        {(after[0] - before[0]) / n:8.1f}")
    print(f"  whole life per worker, CPU (us, ticks)    {(after[1] - before[1]) / n:8.0f}")
    print(f"  fork server per worker, page faults       {(after[2] - before[2]) / n:8.1f}")
    print(f"  fork server per worker, CPU (us)          {(after[3] - before[3]) / n:8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A fresh worker's first step: its page faults and CPU, and its spare's boot CPU.

A probe you run by hand, for the start-up and worker fan-out rows (issue
44). A spare shares its fork server's pages until it writes one, and maps
the server's code again page by page; a run's first step in it used to take
about 130 page faults. The fork server now learns which pages those are
once (``worker._rehearse``) and each spare faults them in while it boots
(``worker._write_ahead``). For each of ``--runs`` runs of ``--program``, one
at a time in one ``WorkerPool(spares=1)``, this reads from ``/proc`` (the
kernel's counters, load-independent):

* the spare's CPU and minor page faults when it is ready (every thread's
  ``schedstat``; the faults count every page it wrote ahead too): the boot;
* its minor page faults and CPU from the run frame to the program's first
  tool call (the tool reads them): the first step;

and prints the medians. With ``--life`` the pool's fork server is never
retired (``server_children`` 0: one server forks every worker measured),
and the probe also reads that server's ``cminflt``, ``cutime`` and
``cstime`` (what ``wait4`` gave it for the workers it reaped) before and
after the runs: per worker, the minor faults of its whole life (fork, boot,
run, exit) exactly and its CPU to the clock tick (10 ms over the runs:
0.05 ms per worker over 200), and the server's own CPU and faults per
worker (its fork, its answer, its reaping). A child's copied pages depend on
what its parent wrote last (its heap's free lists, above all), so only the
fork server's own loop, driven by a pool, gives a worker's true count: a
look-alike process that forks workers itself measured 50-70 faults per
worker that the pool's do not have.

Compare two copies of the code by running it with ``PYTHONPATH`` at each,
in both orders::

    python benchmarks/bench_first_step.py [--runs 40] [--program one-call|fanout] [--life]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from nous_sched import Tool, WorkerPool, run_code

PROGRAMS = {
    "one-call": "return await tools.probe({});",
    "fanout": "const parts = await Promise.all(Array.from({ length: 50 }, (_, i) => tools.probe({ i })));\n"
    "return parts.length;",
}


def cpu_us(pid: int) -> float:
    """Every thread's CPU time so far (``schedstat``, nanoseconds), in microseconds."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as fh:
            total += int(fh.read().split()[0])
    return total / 1e3


def stat(pid: int) -> list[int]:
    """``/proc/<pid>/stat``'s fields after the command's name."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        return [int(x) if x.lstrip("-").isdigit() else 0 for x in fh.read().rsplit(")", 1)[1].split()]


def faults(pid: int) -> int:
    """The minor faults of ``pid`` so far."""
    return stat(pid)[7]


def server_counts(pid: int) -> tuple[int, float, int, float]:
    """The fork server's (reaped children's minor faults, their CPU in us,
    its own minor faults, its own CPU in us)."""
    f = stat(pid)
    tick = 1e6 / os.sysconf("SC_CLK_TCK")
    return f[8], (f[13] + f[14]) * tick, f[7], cpu_us(pid)


def moved(pid: int, was: int) -> int:
    try:
        return faults(pid) - was
    except OSError:
        return -1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--program", choices=sorted(PROGRAMS), default="one-call")
    parser.add_argument(
        "--life", action="store_true", help="also each worker's whole life, from its fork server's counters"
    )
    args = parser.parse_args()
    boot: list[float] = []
    boot_faults: list[int] = []
    step: list[float] = []
    faulted: list[int] = []
    pool = WorkerPool(size=4, spares=1)
    if args.life:
        pool._server_children = 0  # noqa: SLF001 - one server forks every worker measured
    with pool:
        # (The fork server's first child is forked before it has learned anything.)
        assert run_code("return 1", runtime=pool, description="warm-up").ok
        if args.life:
            assert pool.wait_for_spares(30.0)
            server = pool._server  # noqa: SLF001
            assert server is not None
            time.sleep(2.5)  # (the warm-up's worker reaped: the server looks every 0.5 s, 4 times)
            before = server_counts(server.proc.pid)
        for _ in range(args.runs):
            assert pool.wait_for_spares(30.0)
            time.sleep(0.02)
            # (Up to two spares may be ready: read both; the run takes one.)
            ready = {}
            for w in list(pool._workers.values()):  # noqa: SLF001
                try:
                    ready[w.proc.pid] = (cpu_us(w.proc.pid), faults(w.proc.pid))
                except OSError:  # (the last run's worker, gone meanwhile)
                    pass
            seen: list[tuple[float, int, int]] = []

            def probe(_: object, seen: list[tuple[float, int, int]] = seen) -> int:
                if not seen:  # (the run's worker: the one that has faulted since; an idle spare does not)
                    pid = max(ready, key=lambda pid: moved(pid, ready[pid][1]))
                    seen.append((cpu_us(pid), faults(pid), pid))
                return 1

            r = run_code(PROGRAMS[args.program], [Tool("probe", probe)], runtime=pool, description="probe")
            assert r.ok, r.error
            at, was = ready[seen[0][2]]
            boot.append(at)
            boot_faults.append(was)
            step.append(seen[0][0] - at)
            faulted.append(seen[0][1] - was)
        if args.life:
            time.sleep(2.5)  # (every measured worker reaped, but the spare left)
            after = server_counts(server.proc.pid)
            assert pool._server is server  # noqa: SLF001 - (not replaced meanwhile)
    print(f"# {os.environ.get('PYTHONPATH', '.')}: {args.runs} runs of {args.program!r}, load {os.getloadavg()[0]:.1f}")
    print(f"  spare's boot, CPU (us)                {statistics.median(boot):8.0f}")
    print(f"  spare's boot, page faults             {statistics.median(boot_faults):8.0f}")
    print(f"  first step, CPU (us)                  {statistics.median(step):8.0f}")
    print(f"  first step, page faults               {statistics.median(faulted):8.0f}")
    print(f"  boot + first step, CPU (us)           {statistics.median(boot) + statistics.median(step):8.0f}")
    if args.life:
        n = args.runs
        print(f"  whole life per worker, page faults    {(after[0] - before[0]) / n:8.1f}")
        print(f"  whole life per worker, CPU (us, ticks){(after[1] - before[1]) / n:8.0f}")
        print(f"  fork server per worker, page faults   {(after[2] - before[2]) / n:8.1f}")
        print(f"  fork server per worker, CPU (us)      {(after[3] - before[3]) / n:8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

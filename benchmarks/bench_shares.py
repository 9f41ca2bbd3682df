"""Places for waiting, shares for CPU (issue 43, item 7): two copies of the
library side by side in one run, the same experiments on each copy's default
pool, CPU beside wall.

Run by hand::

    python benchmarks/bench_shares.py                            # this checkout against /work/main
    python benchmarks/bench_shares.py --base /path/to/copy --ours /path/to/copy --runs 64 --rounds 1

Each experiment runs in a fresh interpreter (one per copy, ``PYTHONPATH`` set
to it), in both orders (base, ours, then ours, base), ``--rounds`` times:

* ``io``: ``--runs`` runs at once with a 5 s deadline, each waiting 1 s on a
  tool (no CPU): how many finish, and why the others did not;
* ``cpu``: ``--runs`` runs at once with a 5 s deadline, each computing about
  0.3 s of CPU in the engine (a loop calibrated once, in the parent, on the
  in-process runtime): how many finish. ``--ours-cpu-shares 8`` gives ours
  as many programs computing at once as the base's 8 places: the cost of
  the shares' bookkeeping alone, apart from how many compute at once.

For each: the wall time, and the CPU time of the whole child (the host and,
once the pool is closed and its fork server reaped, every worker:
``RUSAGE_SELF`` plus ``RUSAGE_CHILDREN``), per run finished too. Where the
CPU goes: ``workers`` counts the worker processes seen during the burst
(``WorkerPool.pids`` sampled every 2 ms: the spares ready at the start, the
ones booted during it and each run's own start-up), ``never_computed`` the
runs that timed out waiting for a CPU share (before the mend each had
started a worker first), ``killed_mid_step`` those stopped running
JavaScript at their deadline. ``--solo`` adds, per copy and for ``cpu`` rows, two children that
run the same program one run at a time (0 runs, then ``--solo`` runs): the
CPU of one run alone, start-up included (``solo_cpu_per_run_s``); then
``share_free_while_waited`` (copies with ``WorkerPool.shares``): of the
samples taken while runs waited for a share, the fraction in which a share
was free (handed back, its next holder not yet woken): the shares' idle
wall. ``workers_for_nothing`` is the workers seen less the spares still ready at
the end, the runs finished and the runs stopped mid-step: processes started
(for a run, or as a spare a run took) for runs that never computed. And
``wasted_s`` is the burst's CPU less the 0-run child's and less one solo
run's CPU per finished run: the CPU spent on runs that did not finish (and
on start-ups or spares beyond theirs). The load
average is printed before and after: on a shared machine the wall times
move with it; the finished counts and CPU per finished run move less.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import subprocess
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
OURS = os.path.dirname(HERE)
DEADLINE = 5.0


def _child(kind: str, runs: int, loop: int) -> dict[str, Any]:
    from nous_sched import Tool, WorkerPool, run_code

    shares = int(os.environ.get("BENCH_CPU_SHARES", "0"))
    pool = WorkerPool(cpu_shares=shares) if shares else WorkerPool()
    shape = {"size": pool.size, "cpu_shares": getattr(pool, "cpu_shares", None)}
    if kind == "io":
        program, tools = "return await tools.wait({})", [Tool("wait", lambda a: time.sleep(1.0))]
    else:
        program, tools = f"let s = 0; for (let i = 0; i < {loop}; i++) s += i; return 1", []
    results: list[Any] = []
    lock = threading.Lock()

    def one() -> None:
        r = run_code(program, tools, runtime=pool, timeout=DEADLINE, description="bench")
        with lock:
            results.append(r)

    pool.wait_for_spares(30.0)
    seen: set[int] = set()
    sampling = threading.Event()
    looks = [0, 0]  # samples taken while runs waited for a share; those with a share free meanwhile
    shares = getattr(pool, "shares", None)  # (copies before shares2 have no such method)

    def sample() -> None:
        while not sampling.wait(0.002):
            seen.update(pool.pids())
            if shares is not None:
                computing, waiting = shares()
                if waiting:
                    looks[0] += 1
                    looks[1] += computing < pool.cpu_shares

    sampler = threading.Thread(target=sample)
    sampler.start()
    t0 = time.monotonic()
    if os.environ.get("BENCH_SOLO"):
        for _ in range(runs):
            one()
    else:
        threads = [threading.Thread(target=one) for _ in range(runs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    wall = time.monotonic() - t0
    sampling.set()
    sampler.join()
    left = len(pool.pids())  # (the spares still ready: every run's worker is gone)
    pool.close()
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    why = collections.Counter(r.error.message[:70] for r in results if r.error is not None)
    done = sum(r.error is None for r in results)
    return {
        **shape,
        "finished": done,
        "of": runs,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "host_cpu_s": round(me.ru_utime + me.ru_stime, 2),
        "cpu_per_finished_s": round(cpu / done, 3) if done else None,
        "workers": len(seen),
        "share_free_while_waited": round(looks[1] / looks[0], 3) if looks[0] else None,
        "never_computed": sum(n for m, n in why.items() if "CPU share" in m or "free worker" in m),
        "killed_mid_step": sum(n for m, n in why.items() if "running JavaScript" in m),
        "workers_for_nothing": len(seen) - left - done - sum(n for m, n in why.items() if "running JavaScript" in m),
        "errors": dict(why),
    }


def _calibrate() -> int:
    sys.path.insert(0, OURS)
    from nous_sched import QuickJSRuntime, run_code

    n = 1_000_000
    t0 = time.process_time()
    run_code(f"let s = 0; for (let i = 0; i < {n}; i++) s += i; return s", runtime=QuickJSRuntime(), description="c")
    return int(n * 0.3 / max(time.process_time() - t0, 1e-3))


def _run(copy: str, kind: str, runs: int, loop: int, shares: int = 0, solo: bool = False) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": copy, "BENCH_CPU_SHARES": str(shares), "BENCH_SOLO": "1" if solo else ""}
    proc = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--runs", str(runs), "--loop", str(loop)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd="/",
    )
    if proc.returncode != 0:
        return {"failed": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="/work/main", help="the copy to compare against (default /work/main)")
    parser.add_argument("--ours", default=OURS, help="this checkout (default)")
    parser.add_argument("--runs", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--loop", type=int, default=0, help="the cpu case's loop count (default: calibrated)")
    parser.add_argument("--only", choices=["io", "cpu"], default=None)
    parser.add_argument(
        "--ours-cpu-shares", type=int, default=0, help="ours with this many CPU shares (default: its default)"
    )
    parser.add_argument(
        "--solo",
        type=int,
        default=0,
        help="also run this many runs one at a time, per copy: CPU per run alone, wasted_s",
    )
    parser.add_argument("--child", choices=["io", "cpu"], default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.stdout.write(json.dumps(_child(args.child, args.runs, args.loop)) + "\n")
        return
    loop = args.loop or _calibrate()
    print(f"load before: {os.getloadavg()}  cpus: {os.cpu_count()}  cpu loop: {loop} (about 0.3 s)")
    for kind in [args.only] if args.only else ["io", "cpu"]:
        for _ in range(args.rounds):
            for order in (("base", "ours"), ("ours", "base")):
                for name in order:
                    shares = args.ours_cpu_shares if name == "ours" else 0
                    copy = args.base if name == "base" else args.ours
                    row = _run(copy, kind, args.runs, loop, shares)
                    if args.solo and kind == "cpu" and "cpu_s" in row:
                        zero = _run(copy, kind, 0, loop, shares, solo=True)
                        alone = _run(copy, kind, args.solo, loop, shares, solo=True)
                        per = (alone["cpu_s"] - zero["cpu_s"]) / args.solo
                        row["solo_cpu_per_run_s"] = round(per, 3)
                        row["wasted_s"] = round(row["cpu_s"] - zero["cpu_s"] - row["finished"] * per, 2)
                    print(f"{kind:3} {name:4} load={os.getloadavg()[0]:.2f} {json.dumps(row)}", flush=True)
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()

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
``RUSAGE_SELF`` plus ``RUSAGE_CHILDREN``), per run finished too. The load
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
    t0 = time.monotonic()
    threads = [threading.Thread(target=one) for _ in range(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    wall = time.monotonic() - t0
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
        "cpu_per_finished_s": round(cpu / done, 3) if done else None,
        "errors": dict(why),
    }


def _calibrate() -> int:
    sys.path.insert(0, OURS)
    from nous_sched import QuickJSRuntime, run_code

    n = 1_000_000
    t0 = time.process_time()
    run_code(f"let s = 0; for (let i = 0; i < {n}; i++) s += i; return s", runtime=QuickJSRuntime(), description="c")
    return int(n * 0.3 / max(time.process_time() - t0, 1e-3))


def _run(copy: str, kind: str, runs: int, loop: int, shares: int = 0) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": copy, "BENCH_CPU_SHARES": str(shares)}
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
                    row = _run(args.base if name == "base" else args.ours, kind, args.runs, loop, shares)
                    print(f"{kind:3} {name:4} load={os.getloadavg()[0]:.2f} {json.dumps(row)}", flush=True)
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()

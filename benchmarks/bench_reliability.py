"""Reliability under faults: issue 43's items 1-9, measured from outside, each beside the issue's figure.

Not a ratio table: each experiment counts what callers got. Run by hand::

    python benchmarks/bench_reliability.py                  # all nine items and the two rows after them, short
    python benchmarks/bench_reliability.py 1 forkserver --interrupts 3000 --seconds 60   # some, longer
    PYTHONPATH=/other/copy python benchmarks/bench_reliability.py   # another copy, for before/after

Each item prints ``issue:`` (the figure issue 43 reported on main before the
fixes) and ``ours:`` (this copy, now), then the experiment's full counts.
Subcommands go by the item's name or number (``7`` is ``io`` and ``cpu``).
The defaults are short (a few minutes in all on a loaded 2-core machine);
``--interrupts``, ``--seconds``, ``--cycles`` and ``--runs`` lengthen them.
Items 3-5 and 9 and the two last rows reuse the scripts that measure them
in depth (``bench_redis_faults.py``, ``bench_resume_crash.py``,
``bench_serve_mcp_load.py``, ``bench_sse_slow_readers.py``), run for this
copy only.

1. ``interrupts``: a Ctrl-C (``SIGINT`` to the main thread) at a random
   moment of each of N short fan-out runs (tests/_interrupt_fuzz.py), then:
   places left busy, zombies, processes the pool does not know, descriptors
   against the baseline, and whether the next run works. ``--signal SIGTERM``
   sends that signal instead, its handler raising ``SystemExit`` (gunicorn's
   and Celery's workers).
2. ``forkserver``: 8 threads running short programs while the pool's fork
   server is killed every 2 s: runs exact, runs with an error (data), runs
   that raised.
3. ``dead-redis``: a throttle whose Redis is unreachable, 4 calls, 5 s
   deadline: log records and lines, whether the run's error names Redis.
4. ``silent-redis``: places back after the server goes silent (SIGSTOP); a
   holder whose connections go silent (over the limit?); two limits under
   one name (over the limit?).
5. ``resume-crash``: a resume killed (``SIGKILL``) at a random moment, then
   recovered as a person would: tokens stranded after the kill and after
   recovery, calls run twice or never (SQLite and Redis).
6. ``serve-mcp``: 16 SDK clients at once on ``serve-mcp --http``, a tenth of
   the calls hostile: honest calls refused; and whether a resumed run's
   result reaches the client that started it.
7. ``io`` / ``cpu``: 64 runs at once on the default pool with a 5 s
   deadline, each waiting 1 s on a tool (no CPU), then each spinning 0.3 s
   of CPU: how many finish, and the wall time.
8. ``kills``: 8 threads of load while a random worker is killed (``SIGKILL``)
   every 50 ms: runs that raised, runs lost (abort); spares ready 5 s after,
   against a control run without kills.
9. ``slow-readers``: 5 stalled SSE viewers and one honest one per run: the
   delay from a run's end to the honest viewer's ``end`` event.

And two rows for what landed after the issue was filed (no issue figure):
``redis-restart`` (the throttle's Redis killed and started again while its
places are held: calls running at once against the limit) and ``takeover``
(a resume killed on host-a, recovered on host-b, which judges host-a's
claim by its lease alone).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TESTS = os.path.join(ROOT, "tests")
sys.path[:0] = [HERE, TESTS]  # the other scripts, and the test servers they use

PROGRAM = "const r = await Promise.all([1, 2, 3].map(i => tools.echo({i}))); return r.length"


def interrupts(args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, os.path.join(TESTS, "_interrupt_fuzz.py"), str(args.interrupts), "7", args.signal],
        capture_output=True,
        text=True,
        timeout=3600,
        env=env,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["fds_leaked"] = out["fds"] - out["base_fds"]
    out["processes_unknown"] = out["processes"] - out["workers"]
    out["signal"] = args.signal
    return out


def _load(pool: Any, seconds: float, threads: int, fault: Callable[[], None], every: float) -> dict[str, Any]:
    from nous_sched import Tool, run_code

    tools = [Tool("echo", lambda a: a["i"])]
    counts: collections.Counter[str] = collections.Counter()
    raised: collections.Counter[str] = collections.Counter()
    errors: collections.Counter[str] = collections.Counter()
    stop = threading.Event()
    lock = threading.Lock()

    def one() -> None:
        while not stop.is_set():
            try:
                r = run_code(PROGRAM, tools, runtime=pool, timeout=10, description="load")
            except Exception as exc:
                with lock:
                    raised[f"{type(exc).__name__}: {str(exc)[:200]}"] += 1
                continue
            with lock:
                if r.result == 3:
                    counts["exact"] += 1
                else:
                    counts["error"] += 1
                    errors[f"{r.error.kind}: {r.error.message[:200]}" if r.error else "wrong"] += 1

    ts = [threading.Thread(target=one) for _ in range(threads)]
    for t in ts:
        t.start()
    end = time.monotonic() + seconds
    faults = 0
    while time.monotonic() < end:
        time.sleep(every)
        try:
            fault()
            faults += 1
        except (ProcessLookupError, AttributeError, IndexError):
            pass
    stop.set()
    for t in ts:
        t.join(60)
    return {
        "faults": faults,
        "runs": sum(counts.values()) + sum(raised.values()),
        **counts,
        "raised": sum(raised.values()),
        "raised_as": dict(raised),
        "errors_as": dict(errors),
    }


def forkserver(args: argparse.Namespace) -> dict[str, Any]:
    from nous_sched import WorkerPool

    pool = WorkerPool()

    def kill() -> None:
        os.kill(pool._server.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]

    try:
        return _load(pool, args.seconds, 8, kill, 2.0)
    finally:
        pool.close()


def kills(args: argparse.Namespace) -> dict[str, Any]:
    from nous_sched import WorkerPool

    out = {}
    for label, faulty in (("control", False), ("kills", True)):
        pool = WorkerPool()
        rng = random.Random(8)

        def kill(pool: Any = pool, faulty: bool = faulty) -> None:
            if faulty:
                os.kill(rng.choice(pool.pids()), signal.SIGKILL)

        try:
            row = _load(pool, args.seconds, 8, kill, 0.05)
            time.sleep(5.0)
            with pool._lock:
                row["spares_ready_after"] = pool._core.spares_ready()
            out[label] = row
        finally:
            pool.close()
    return out


def _many(program: str, tools: list[Any]) -> dict[str, Any]:
    from nous_sched import run_code

    results: list[Any] = []
    lock = threading.Lock()

    def one() -> None:
        r = run_code(program, tools, timeout=5, description="many")
        with lock:
            results.append(r)

    t0 = time.monotonic()
    ts = [threading.Thread(target=one) for _ in range(64)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    wall = time.monotonic() - t0
    why = collections.Counter(r.error.message[:80] for r in results if r.error is not None)
    return {"finished": sum(r.error is None for r in results), "of": 64, "wall_s": round(wall, 2), "errors": dict(why)}


def io(args: argparse.Namespace) -> dict[str, Any]:
    from nous_sched import Tool

    return _many("return await tools.wait({})", [Tool("wait", lambda a: time.sleep(1.0))])


def cpu(args: argparse.Namespace) -> dict[str, Any]:
    # (0.3 s of CPU in the engine: a loop calibrated once, on the caller's thread.)
    from nous_sched import QuickJSRuntime, run_code

    n = args.loop
    if not n:
        n = 1_000_000
        t0 = time.process_time()
        run_code(
            f"let s = 0; for (let i = 0; i < {n}; i++) s += i; return s", runtime=QuickJSRuntime(), description="c"
        )
        n = int(n * 0.3 / max(time.process_time() - t0, 1e-3))
    return {"loop": n, **_many(f"let s = 0; for (let i = 0; i < {n}; i++) s += i; return 1", [])}


def dead_redis(args: argparse.Namespace) -> dict[str, Any]:
    import bench_redis_faults

    found: dict[str, Any] = bench_redis_faults._run(ROOT, "dead")
    return found


def silent_redis(args: argparse.Namespace) -> dict[str, Any]:
    import bench_redis_faults

    return {name: bench_redis_faults._run(ROOT, name) for name in ("silent", "stalled", "mismatch")}


def redis_restart(args: argparse.Namespace) -> dict[str, Any]:
    import bench_redis_faults

    found: dict[str, Any] = bench_redis_faults._run(ROOT, "restart")
    return found


def _resume_rows(row: Callable[..., dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    from redis_server import redis_server

    with redis_server() as url:
        return {store: row(ROOT, spec, args.cycles, 43) for store, spec in (("sqlite", "approvals.db"), ("redis", url))}


def resume_crash(args: argparse.Namespace) -> dict[str, Any]:
    import bench_resume_crash

    return _resume_rows(bench_resume_crash._row, args)


def takeover(args: argparse.Namespace) -> dict[str, Any]:
    import bench_resume_crash

    return _resume_rows(bench_resume_crash.takeover_row, args)


def serve_mcp(args: argparse.Namespace) -> dict[str, Any]:
    import bench_serve_mcp_load

    return {"load": bench_serve_mcp_load.load(args.seconds), "delivery": bench_serve_mcp_load.delivery()}


def slow_readers(args: argparse.Namespace) -> dict[str, Any]:
    import bench_sse_slow_readers

    return bench_sse_slow_readers.measure(runs=args.runs, stalled=5)


# -- each item's figure in the issue, and ours in the same terms ------------------------------------


def _sum(rows: dict[str, Any], key: str) -> int:
    return sum(int(r.get(key, 0)) for r in rows.values())


def _ours_interrupts(o: dict[str, Any]) -> str:
    if "error" in o:
        return "the fuzz failed"
    return (
        f"{o['busy_places']} places busy, {len(o['zombies'])} zombies, fds {o['base_fds']} -> {o['fds']}, "
        f"driver threads {len(o['base_threads'])} -> {len(o['threads'])}, next run "
        f"{'works' if o['next_run_works'] else 'FAILS'} ({o['interrupts']} {o['signal']}s, {o['in_a_run']} in a run)"
    )


def _ours_load(o: dict[str, Any]) -> str:
    return f"{o['raised']} of {o['runs']} runs raised, {o.get('error', 0)} errors (data), {o['faults']} kills"


def _ours_dead(o: dict[str, Any]) -> str:
    return (
        f"{o.get('log_records')} log records ({o.get('log_lines')} lines) in {o.get('wall_s')} s; "
        f"names Redis: {o.get('names_redis')}"
    )


def _ours_silent(o: dict[str, Any]) -> str:
    s, st, m = o["silent"], o["stalled"], o["mismatch"]
    return (
        f"places back {s.get('places_back_after_s')} s after the run's calls returned (run ended after "
        f"{s.get('run_ended_after_s')} s); stalled renewal: {st.get('peak_running')} ran against a limit of 1; "
        f"limits 2 and 40 under one name: {m.get('peak_running')} ran against 2"
    )


def _ours_resume(o: dict[str, Any]) -> str:
    cycles = _sum(o, "cycles")
    return (
        f"{cycles} cycles (SQLite + Redis): {_sum(o, 'stranded')} claimed after the kill "
        f"({_sum(o, 'never_started')} never started), {_sum(o, 'still_stranded')} still stranded after recovery, "
        f"{_sum(o, 'settled')} settled by a person, {_sum(o, 'violations')} run twice, {_sum(o, 'never_ran')} never ran"
    )


def _ours_mcp(o: dict[str, Any]) -> str:
    load, d = o["load"], o["delivery"]
    honest = sum(v for k, v in load.items() if k.startswith("honest_") and isinstance(v, int))
    others = {
        k: v for k, v in load.items() if k.startswith("honest_") and k not in ("honest_answered", "honest_failed_as")
    }
    return (
        f"{load.get('honest_refused_for_the_cap', 0)} of {honest} honest calls refused for the cap "
        f"({load.get('honest_answered', 0)} answered; otherwise {others or 'none'}) in {load['seconds']:g} s; "
        f"resumed result delivered: {d.get('delivered')} (the approved call ran {d.get('approved_call_ran')}x)"
    )


def _ours_many(o: dict[str, Any]) -> str:
    return f"{o['finished']}/64 in {o['wall_s']} s" + (f" (loop {o['loop']})" if "loop" in o else "")


def _ours_kills(o: dict[str, Any]) -> str:
    k, c = o["kills"], o["control"]
    return (
        f"{k['raised']} of {k['runs']} raised, {k.get('error', 0)} lost as data; spares 5 s after: "
        f"{k['spares_ready_after']} (control {c['spares_ready_after']})"
    )


def _ours_sse(o: dict[str, Any]) -> str:
    return "; ".join(f"{name}: p99 {row['p99_ms']} ms (max {row['max_ms']})" for name, row in o.items())


def _ours_restart(o: dict[str, Any]) -> str:
    return (
        f"{o.get('peak_running')} ran at once against {o.get('limit')}; {o.get('got_in_while_held')} got in while "
        f"the holders held; {o.get('calls_ran')} of {o.get('of')} calls ran"
    )


class Item:
    def __init__(
        self,
        number: str,
        run: Callable[[argparse.Namespace], dict[str, Any]],
        issue: str,
        ours: Callable[[dict[str, Any]], str],
    ) -> None:
        self.number, self.run, self.issue, self.ours = number, run, issue, ours


EXPERIMENTS: dict[str, Item] = {
    "interrupts": Item(
        "1",
        interrupts,
        "8 places busy, 21 zombies, fds 6 -> 79, one driver thread leaked, next run times out (3,000 Ctrl-Cs)",
        _ours_interrupts,
    ),
    "forkserver": Item(
        "2",
        forkserver,
        "2 of 10,102 runs raised RunCodeError (fork server killed every 15 s, 8 threads)",
        _ours_load,
    ),
    "dead-redis": Item(
        "3",
        dead_redis,
        "100 tracebacks (2,750 lines) in a 5 s run; the run's error blames JavaScript, never names Redis",
        _ours_dead,
    ),
    "silent-redis": Item(
        "4",
        silent_redis,
        "places back 3.1 s after the run ends (never, with redis<8); 4 ran against a limit of 2 (stalled "
        "renewal); limits 2 and 40 under one name: 10 ran against 2",
        _ours_silent,
    ),
    "resume-crash": Item(
        "5",
        resume_crash,
        "200 cycles: 78 claimed forever (37 never started), none recoverable; 0 run twice",
        _ours_resume,
    ),
    "serve-mcp": Item(
        "6",
        serve_mcp,
        "12,107 of 13,824 honest calls refused (2 minutes, 16 clients); a resumed result never reaches its client",
        _ours_mcp,
    ),
    "io": Item("7", io, "32/64 in all four rounds (24 never got a worker)", _ours_many),
    "cpu": Item("7", cpu, "no worse than before the shares (40/64 on a quiet machine, see CLOSING)", _ours_many),
    "kills": Item(
        "8",
        kills,
        "6 of the runs lost to kill -9 raised RunCodeError; 0 spares afterwards (control: 4)",
        _ours_kills,
    ),
    "slow-readers": Item(
        "9",
        slow_readers,
        "other viewers saw a run's end up to 21 s late (p99; a run took 1.4 s), 5 slow or stalled SSE clients",
        _ours_sse,
    ),
    "redis-restart": Item(
        "-",
        redis_restart,
        "(not in the issue) before the restart guard (9aaeaa9~1): 4 ran at once against 2, 2 got in while held",
        _ours_restart,
    ),
    "takeover": Item(
        "-",
        takeover,
        "(not in the issue) before leases a claim on another host was never taken over",
        _ours_resume,
    ),
}


def _chosen(only: list[str]) -> list[str]:
    if not only:
        return list(EXPERIMENTS)
    names: list[str] = []
    for word in only:
        found = [n for n, item in EXPERIMENTS.items() if word in (n, item.number)]
        if not found:
            raise SystemExit(f"bench_reliability.py: no item {word!r} (items: 1-9 or {', '.join(EXPERIMENTS)})")
        names += [n for n in found if n not in names]
    return names


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("only", nargs="*", help="items by name or number (default: all)")
    parser.add_argument("--interrupts", type=int, default=200, help="item 1's Ctrl-Cs (the issue: 3,000)")
    parser.add_argument(
        "--signal", default="SIGINT", help="the interrupts' signal (SIGTERM: its handler raises SystemExit)"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="items 2, 6 and 8's load (the issue: 120 for 6)")
    parser.add_argument(
        "--cycles", type=int, default=4, help="item 5's and takeover's cycles per store (the issue: 200)"
    )
    parser.add_argument("--runs", type=int, default=3, help="item 9's runs per way of serving (20 in depth)")
    parser.add_argument("--loop", type=int, default=0, help="the cpu runs' loop count (default: 0.3 s, calibrated)")
    args = parser.parse_args()
    for name in _chosen(args.only):
        item = EXPERIMENTS[name]
        t0 = time.monotonic()
        found = item.run(args)
        try:
            ours = item.ours(found)
        except (KeyError, TypeError) as exc:  # an experiment that broke: its counts say why
            ours = f"(no summary: {type(exc).__name__} {exc})"
        print(f"{item.number} {name} ({time.monotonic() - t0:.0f} s)", flush=True)
        print(f"    issue: {item.issue}", flush=True)
        print(f"    ours:  {ours}", flush=True)
        print(f"    counts: {json.dumps(found, sort_keys=True, default=str)}", flush=True)


if __name__ == "__main__":
    main()

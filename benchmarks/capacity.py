"""The capacity model's inputs, measured on this machine (docs/deployment.rst, "Scaling out").

What one run costs the parts a fleet shares, each counted, not timed, where
it can be (a loaded machine moves wall time, not counts nor CPU time):

* **CPU per run and per call, on each runtime** (the default ``WorkerPool``,
  a worker process per run; ``QuickJSRuntime``, in this process). Each
  configuration runs in a child interpreter of its own; its CPU time is the
  whole process tree's (``os.wait4``: the host, the fork server and every
  worker, user + system), minus a child that imports and warms the same
  things and runs nothing. Per run: a program of one call; per call: the
  extra CPU of a program of 20 calls over one of 0, over 20.
* **Redis operations per throttled call** (``Throttle(max_running=...,
  redis_url=...)``): ``INFO commandstats`` before and after, their
  difference over the calls; and the Redis server's own CPU per call
  (``/proc/<pid>/stat``).
* **Postgres statements per suspension and per resume**
  (``PostgresApprovalStore``): ``pg_stat_statements`` reset before and read
  after each phase, and the Postgres server's CPU (postmaster and backends,
  ``os.wait4`` once it stops) per suspension + resume.
* **Broker round trips per Celery run**: measured by the ``celery`` work
  (``/work/notes/celery-numbers.md`` when this was written), not here.

Wall time is printed beside CPU, with the machine's load average before and
after each phase: a high load lengthens wall time and leaves CPU time and
counts as they are.

    python benchmarks/capacity.py [--runs 200] [--out benchmarks/results/capacity-<commit>.json]

Needs ``redis-server`` and the Postgres server programs (``.ci/system-deps``)
and the ``redis`` and ``postgres`` extras.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "tests", "durable"))

CALLS = 20  # calls in the program that measures CPU per call


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# -- CPU per run and per call: a child interpreter per configuration -----------------------------------


def _child(runtime: str, runs: int, calls: int) -> None:
    """In the child: warm up (imports, the pool's spares), then ``runs`` runs of ``calls`` calls each."""
    import nous_sched
    from nous_sched import QuickJSRuntime, Tool, run_code

    tool = Tool("noop", lambda args: args, concurrency_safe=lambda args: True)
    made = QuickJSRuntime() if runtime == "in-process" else None
    program = f"let n = 0; for (let i = 0; i < {calls}; i++) {{ await tools.noop({{i}}); n++; }} return n"
    for _ in range(3):  # warm: the same in every child, measured or baseline
        assert run_code(program, [tool], runtime=made, description="warm").ok
    started = time.perf_counter()
    for _ in range(runs):
        result = run_code(program, [tool], runtime=made, description="capacity")
        assert result.ok, result.error
    wall = time.perf_counter() - started
    if made is None:
        nous_sched.runtime.pool.default_pool().close()  # its workers exit and are reaped, their CPU counted
    sys.stdout.write(json.dumps({"wall": wall}) + "\n")


def _tree_cpu(argv: list[str]) -> tuple[float, float]:
    """(CPU seconds of the child's whole process tree, its own reported wall seconds)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, __file__, *argv], stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    return usage.ru_utime + usage.ru_stime, json.loads(out.decode().strip().splitlines()[-1])["wall"]


def cpu_per_run(runtime: str, runs: int) -> dict[str, Any]:
    load = _load()
    base, _ = _tree_cpu(["--child", runtime, "0", "1"])
    one, wall_one = _tree_cpu(["--child", runtime, str(runs), "1"])
    zero, _ = _tree_cpu(["--child", runtime, str(runs), "0"])
    many, wall_many = _tree_cpu(["--child", runtime, str(runs), str(CALLS)])
    return {
        "runtime": runtime,
        "runs": runs,
        "cpu_ms_per_run": round((one - base) / runs * 1000, 3),
        "wall_ms_per_run": round(wall_one / runs * 1000, 3),
        "cpu_us_per_call": round((many - zero) / (runs * CALLS) * 1e6, 1),
        "wall_us_per_call": round((wall_many - wall_one) / (runs * (CALLS - 1)) * 1e6, 1),
        "load_before": load,
        "load_after": _load(),
    }


# -- Redis operations per throttled call --------------------------------------------------------------


def _commandstats(client: Any) -> dict[str, int]:
    return {name: int(v["calls"]) for name, v in client.info("commandstats").items()}


def _ops(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """Commands run between two :func:`_commandstats`, by name, less the measurement's own ``INFO``
    (the first one's: a command is counted once it has run). The throttle's scripts' own commands,
    ``INFO server`` among them, count: Redis counts each ``redis.call`` of a script as a command."""
    ops = {name[len("cmdstat_") :]: after[name] - before.get(name, 0) for name in after}
    ops["info"] = ops.get("info", 0) - 1
    return {name: n for name, n in ops.items() if n}


def _proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_per_call(runs: int) -> dict[str, Any]:
    import redis
    from redis_server import redis_process

    from nous_sched import QuickJSRuntime, Throttle, Tool, run_code

    load = _load()
    with redis_process() as server:
        assert server.proc is not None
        client = redis.Redis.from_url(server.url)
        throttle = Throttle("capacity", max_running=4, redis_url=server.url)
        tool = Tool("noop", lambda args: args, concurrency_safe=lambda args: True, throttles=(throttle,))
        runtime = QuickJSRuntime()
        program = f"for (let i = 0; i < {CALLS}; i++) await tools.noop({{i}}); return 1"
        assert run_code(program, [tool], runtime=runtime, description="warm").ok
        before, cpu_before = _commandstats(client), _proc_cpu(server.proc.pid)
        started = time.perf_counter()
        for _ in range(runs):
            assert run_code(program, [tool], runtime=runtime, description="capacity").ok
        wall = time.perf_counter() - started
        after, cpu_after = _commandstats(client), _proc_cpu(server.proc.pid)
        calls = runs * CALLS
        ops = _ops(after, before)
        parallel = _redis_parallel(server.url, runs)
    return {
        "calls": calls,
        "ops_per_call": round(sum(ops.values()) / calls, 3),
        "by_command_per_call": {k: round(v / calls, 3) for k, v in sorted(ops.items())},
        "redis_cpu_us_per_call": round((cpu_after - cpu_before) / calls * 1e6, 1),
        "wall_us_per_call": round(wall / calls * 1e6, 1),
        "parallel": parallel,
        "load_before": load,
        "load_after": _load(),
    }


def _redis_parallel(url: str, runs: int) -> dict[str, Any]:
    """The same with 8 calls at once under max_running=4 (calls wait for places): ops per call then."""
    import redis

    from nous_sched import QuickJSRuntime, Throttle, Tool, run_code

    client = redis.Redis.from_url(url)
    throttle = Throttle("capacity-parallel", max_running=4, redis_url=url)
    tool = Tool("slow", lambda args: time.sleep(0.002), concurrency_safe=lambda args: True, throttles=(throttle,))
    runtime = QuickJSRuntime()
    program = "await Promise.all([0,1,2,3,4,5,6,7].map(i => tools.slow({i}))); return 1"
    before = _commandstats(client)
    n = max(10, runs // 4)
    for _ in range(n):
        assert run_code(program, [tool], runtime=runtime, description="capacity", max_parallel=8).ok
    after = _commandstats(client)
    ops = sum(_ops(after, before).values())
    return {"calls": n * 8, "ops_per_call": round(ops / (n * 8), 3), "max_running": 4, "at_once": 8}


# -- Postgres statements per suspension and per resume -----------------------------------------------


def _statements(admin: Any) -> dict[str, int]:
    rows = admin.execute(
        "SELECT query, calls FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = "
        "current_database()) AND query NOT ILIKE '%pg_stat_statements%'"
    ).fetchall()
    return {query: int(calls) for query, calls in rows}


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {q: after[q] - before.get(q, 0) for q in after if after[q] != before.get(q, 0)}


def postgres_per_suspension(runs: int) -> dict[str, Any]:
    import durable_tools
    import psycopg
    from postgres_server import postgres_process

    from nous_sched import PostgresApprovalStore, QuickJSRuntime, resume, run_code

    os.environ.setdefault("NOUS_DURABLE_COUNT", os.path.join("/tmp", f"capacity-{os.getpid()}.jsonl"))
    load = _load()
    runtime = QuickJSRuntime()
    program = "const a = await tools.read({i: 1}); const p = await tools.pay({amount: 3}); return [a, p]"
    with postgres_process(("shared_preload_libraries=pg_stat_statements",)) as server:
        dsn = server.new_database()
        admin = psycopg.connect(dsn, autocommit=True)
        admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        store = PostgresApprovalStore(dsn)
        token = run_code(program, durable_tools.TOOLS, approval_store=store, runtime=runtime, description="w")
        assert token.suspended is not None
        resume(token.suspended.token, {1: True}, durable_tools.TOOLS, approval_store=store, runtime=runtime)
        before = _statements(admin)
        started = time.perf_counter()
        tokens = []
        for _ in range(runs):
            result = run_code(program, durable_tools.TOOLS, approval_store=store, runtime=runtime, description="c")
            assert result.suspended is not None, result.error
            tokens.append(result.suspended.token)
        suspend_wall = time.perf_counter() - started
        middle = _statements(admin)
        started = time.perf_counter()
        for token_text in tokens:
            done = resume(token_text, {1: True}, durable_tools.TOOLS, approval_store=store, runtime=runtime)
            assert done.ok, done.error
        resume_wall = time.perf_counter() - started
        after = _statements(admin)
        store.close()
        admin.close()
        proc = server.proc
        assert proc is not None
        server.signal(signal.SIGINT)  # fast shutdown; wait4 reads the postmaster's and its backends' CPU
        _, _, usage = os.wait4(proc.pid, 0)
        proc.returncode = 0
    suspended, resumed = _delta(middle, before), _delta(after, middle)
    return {
        "suspensions": runs,
        "statements_per_suspension": round(sum(suspended.values()) / runs, 2),
        "statements_per_resume": round(sum(resumed.values()) / runs, 2),
        "suspension_statements": {q[:90]: round(n / runs, 2) for q, n in sorted(suspended.items())},
        "resume_statements": {q[:90]: round(n / runs, 2) for q, n in sorted(resumed.items())},
        "postgres_cpu_ms_whole_session": round((usage.ru_utime + usage.ru_stime) * 1000, 1),
        "wall_ms_per_suspension": round(suspend_wall / runs * 1000, 2),
        "wall_ms_per_resume": round(resume_wall / runs * 1000, 2),
        "load_before": load,
        "load_after": _load(),
    }


def postgres_cpu_per_pair(runs: int) -> dict[str, Any]:
    """Postgres's CPU per suspension + resume: a session of ``runs`` pairs over one of none."""
    empty = postgres_per_suspension_cpu(0)
    full = postgres_per_suspension_cpu(runs)
    return {"postgres_cpu_ms_per_suspension_and_resume": round((full - empty) / runs * 1000, 3)}


def postgres_per_suspension_cpu(runs: int) -> float:
    if runs == 0:
        found = postgres_per_suspension(1)  # one pair: the fixed costs (start, the schema, the extension)
        return float(found["postgres_cpu_ms_whole_session"]) / 1000
    return float(postgres_per_suspension(runs + 1)["postgres_cpu_ms_whole_session"]) / 1000


# -- the report ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--out", default="")
    parser.add_argument("--child", nargs=3, metavar=("RUNTIME", "RUNS", "CALLS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    report: dict[str, Any] = {
        "commit": commit.stdout.strip(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
            "load_at_start": _load(),
        },
        "runs": args.runs,
    }
    report["cpu"] = [cpu_per_run(runtime, args.runs) for runtime in ("worker", "in-process")]
    print(json.dumps(report["cpu"], indent=1), flush=True)
    report["redis"] = redis_per_call(args.runs)
    print(json.dumps(report["redis"], indent=1), flush=True)
    report["postgres"] = postgres_per_suspension(args.runs)
    report["postgres"].update(postgres_cpu_per_pair(args.runs))
    print(json.dumps(report["postgres"], indent=1), flush=True)
    report["machine"]["load_at_end"] = _load()
    report["self_cpu_s"] = round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 2)
    out = args.out or os.path.join(ROOT, "benchmarks", "results", f"capacity-{report['commit']}.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    print("written:", os.path.relpath(out, ROOT))


if __name__ == "__main__":
    main()

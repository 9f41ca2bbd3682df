"""Issue 44: the Flask example under gunicorn, 32 clients: one-shot workers vs warm workers reused per user, side by side.

Two real gunicorn servers of ``examples/flask_app.py`` on loopback, each on a
port of its own, one per arm:

* ``one-shot``: ``create_app()`` as shipped, every run on a fresh worker
  process of the gunicorn worker's default pool (discarded after it);
* ``reuse``: ``create_app(runtime=default_pool().domain)``, each run on a warm
  worker of its user's trust domain (the ``X-User`` header), reused for that
  user only.

Both servers start first and are warmed (unmeasured); then the arms are
driven one at a time for ``--seconds`` each, in the order A B B A (one-shot,
reuse, reuse, one-shot), so drift in the machine's load falls on both arms
alike. Each phase: ``--clients`` threads, each with its own ``httpx.Client``
(one keep-alive connection), posting programs back to back until the phase's
time is up; the phase ends when the last request in flight has returned (so
its CPU covers exactly the requests it counts).

The programs, a fixed cycle of 20 per client (each client starts at its own
place in it, so both arms see the same mix): 18 honest ones, alternating *a
few tool calls* (``whoami``, ``add``, ``city``, ``note``, awaited one after
another) and *a fan-out* (``Promise.all`` over 8 calls), each answer checked;
and 2 hostile ones (10%), taking turns among *spin* (``while (true) {}`` to
the run's deadline), *memory* (8 MiB arrays until the engine's memory limit) and
*log* (a log line of 10 kB in an endless loop: past the log limit the
lines are dropped, so it runs to the deadline).

Printed per phase and per arm (the two phases of an arm summed): honest
requests/s, p50 and p99 latency of honest requests, honest errors (anything
but a 200 with the expected result: must be 0), hostile requests by
``error.kind``, CPU per request and the machine's load; then the ratios
one-shot / reuse (each pair of phases, and the arms' totals).

**CPU per request** is the CPU time (user + system) of the gunicorn
master's process tree over the phase, divided by the requests the phase
answered (honest and hostile): read from ``/proc/<pid>/stat`` of the master,
its gunicorn workers, their fork servers and program workers (each with the
CPU of the children it has reaped), as ``benchmarks/_common.tree_cpu``.
What it misses: the kernel's own threads (tearing down a program worker's
namespaces and address space runs partly in kworkers), the CPU of a process
that ended *and* whose parent has not reaped it yet at the phase's end, and
the clients (this process: printed apart, as ``client CPU``). A worker still
alive that ran runs in both arms cannot happen: each arm has its own server.
The machine's load is the 1-minute load average at the phase's start and
end and the busy cores over the phase from ``/proc/stat`` (everything on
the machine: the server, the clients and everyone else's work), beside our
own (server + clients); the rest (``others``) is everyone else's work plus
what our tree misses (the kernel's share of ending workers), an upper bound
on what others ran beside us. The CPU per
request is dominated by the hostile programs that compute to their deadline
(a spin or log program can use up to ``--run-timeout`` seconds of CPU): it
compares the arms, it is not the cost of an honest request.

**gunicorn config**: ``gthread`` workers, 2 processes (one per core, so the
host's Python is not held to one core by one GIL) x 16 threads (2 x 16 = 32
= one thread per client: no client queues in gunicorn, waiting is the
pool's job); ``--keep-alive 30`` so each client's connection lasts the
phase; ``--timeout 60``, far above the run's deadline (``--run-timeout``,
default 2 s; the example's default of 10 s would have a spinning program
hold its place for 10 s), so a hostile program comes back as a ``timeout``
result and no gunicorn worker is killed. Each gunicorn worker process has
its own default pool (made on its first run, after gunicorn forked it).

Needs gunicorn (``pip install -e '.[bench]'``, or ``pip install gunicorn``),
Flask (the ``web`` extra) and httpx::

    PYTHONPATH=$PWD python benchmarks/bench_flask_load.py --seconds 10
    PYTHONPATH=$PWD python benchmarks/bench_flask_load.py --seconds 300   # the issue's 5 minutes per arm

Keep development runs short on a shared machine: the whole run takes about
4 x ``--seconds`` plus the start-up and warm-up (about 15 s), and loads every core.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Iterator, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ARMS = ("one-shot", "reuse")

FEW_CALLS = """
const me = await tools.whoami({});
const sum = await tools.add({a: %(n)d, b: 1});
const city = await tools.city({name: "Lima"});
const note = await tools.note({text: "request %(n)d"});
return {user: me.user, sum, country: city.country, noted: note > 0};
"""
FAN_OUT = """
const names = ["paris", "lagos", "lima", "osaka"];
const all = await Promise.all([
  ...names.map((name) => tools.city({name})),
  tools.add({a: %(n)d, b: 1}), tools.add({a: 2, b: 2}), tools.whoami({}), tools.whoami({}),
]);
return {user: all[6].user, sum: all[4], countries: all.slice(0, 4).map((c) => c.country).join(",")};
"""
HOSTILE = {
    "spin": "while (true) {}",
    "memory": "const keep = []; for (let i = 0; ; i++) keep.push(new Array(1 << 20).fill(i));",
    "log": "const line = 'y'.repeat(10000); for (let i = 0; ; i++) console.log(i + line);",
}
HOSTILE_TURNS = ("spin", "memory", "log")
CYCLE = 20  # requests per cycle: 18 honest, 2 hostile (at places 9 and 19)


def program(client: int, k: int, user: str) -> tuple[str, dict[str, Any], Any]:
    """The ``k``-th request of ``client``: (what it is, the JSON body, the expected result or None)."""
    place = (client * 7 + k) % CYCLE
    n = client * 100_000 + k
    if place in (9, 19):
        name = HOSTILE_TURNS[(client + k // 10) % len(HOSTILE_TURNS)]
        return "hostile", {"code": HOSTILE[name], "description": f"hostile: {name}", "max_parallel": 4}, name
    if place % 2 == 0:
        body = {"code": FEW_CALLS % {"n": n}, "description": "a few tool calls, one after another"}
        return "honest", body, {"user": user, "sum": n + 1, "country": "Peru", "noted": True}
    body = {"code": FAN_OUT % {"n": n}, "description": "eight tool calls at once"}
    return "honest", body, {"user": user, "sum": n + 1, "countries": "France,Nigeria,Peru,Japan"}


# -- the server side (imported by gunicorn in each of its worker processes) -----------


def serve(arm: str, run_timeout: float) -> Any:
    """The WSGI app of ``arm``; gunicorn calls it as ``bench_flask_load:serve('reuse', 2.0)``."""
    import flask_app  # examples/ is on gunicorn's --pythonpath

    from nous_sched.runtime.pool import default_pool

    if arm == "one-shot":
        return flask_app.create_app(timeout=run_timeout)
    if arm == "reuse":
        return flask_app.create_app(timeout=run_timeout, runtime=default_pool().domain)
    raise ValueError(f"unknown arm {arm!r}")


# -- the measuring side ---------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def gunicorn(arm: str, args: argparse.Namespace, log: Any) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A gunicorn master serving ``arm`` on a free loopback port; yields (base URL, its process)."""
    port = _free_port()
    argv = [
        sys.executable,
        "-m",
        "gunicorn",
        "--worker-class",
        "gthread",
        "--workers",
        str(args.workers),
        "--threads",
        str(args.threads),
        "--keep-alive",
        "30",
        "--timeout",
        "60",
        "--graceful-timeout",
        "10",
        "--bind",
        f"127.0.0.1:{port}",
        "--pythonpath",
        f"{HERE},{os.path.join(ROOT, 'examples')}",
        f"bench_flask_load:serve({arm!r}, {args.run_timeout!r})",
    ]
    process = subprocess.Popen(argv, stdout=log, stderr=log, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        yield base, process
    finally:
        process.terminate()  # gunicorn's graceful stop: workers finish, their pools close at exit
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_ready(base: str, process: subprocess.Popen[bytes], httpx: Any, within: float = 60.0) -> None:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if process.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {process.returncode} before it served (see its log)")
        try:
            httpx.get(base + "/", timeout=2.0)  # 404 is fine: it answers
            return
        except httpx.TransportError:
            time.sleep(0.2)
    raise RuntimeError(f"gunicorn at {base} did not answer within {within} s")


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.honest: list[float] = []  # latencies (s) of honest requests answered as expected
        self.honest_errors: list[str] = []
        self.hostile: collections.Counter[str] = collections.Counter()  # "<program> -> <error.kind>"


def drive(base: str, args: argparse.Namespace, seconds: float, httpx: Any, start_k: int) -> tuple[Tally, float]:
    """``args.clients`` threads posting for ``seconds``; returns the tally and the phase's wall time."""
    tally = Tally()
    stop_at = time.monotonic() + seconds
    barrier = threading.Barrier(args.clients + 1)

    def client(i: int) -> None:
        user = f"user-{i % args.users:02d}"
        with httpx.Client(base_url=base, headers={"X-User": user}, timeout=60.0) as http:
            barrier.wait()
            k = start_k
            while time.monotonic() < stop_at:
                what, body, expected = program(i, k, user)
                k += 1
                t0 = time.perf_counter()
                try:
                    answer = http.post("/run", json=body)
                    status, payload = answer.status_code, answer.json()
                except Exception as exc:  # noqa: BLE001 - every failure is a row, not a crash
                    status, payload = -1, {"error": {"kind": f"client: {type(exc).__name__}", "message": str(exc)}}
                latency = time.perf_counter() - t0
                with tally.lock:
                    if what == "honest":
                        if status == 200 and "error" not in payload and payload.get("result") == expected:
                            tally.honest.append(latency)
                        else:
                            tally.honest_errors.append(f"{status} {str(payload)[:300]}")
                    else:
                        err = payload.get("error") if isinstance(payload, dict) else None
                        kind = err.get("kind") if isinstance(err, dict) else ("ok" if status == 200 else None)
                        tally.hostile[f"{expected} -> {kind if kind else f'HTTP {status}'}"] += 1

    threads = [
        threading.Thread(target=client, args=(i,), name=f"bench-flask-client-{i}", daemon=True)
        for i in range(args.clients)
    ]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    return tally, time.monotonic() - t0


def _machine_busy() -> tuple[float, float]:
    """(busy jiffies, all jiffies) of the whole machine, from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return float(sum(fields) - idle), float(sum(fields))


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def percentile(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


class Phase:
    def __init__(
        self, arm: str, tally: Tally, wall: float, cpu: float, client_cpu: float, load: tuple[float, float], busy: float
    ) -> None:
        self.arm, self.tally, self.wall, self.cpu, self.client_cpu = arm, tally, wall, cpu, client_cpu
        self.load, self.busy = load, busy

    @property
    def requests(self) -> int:
        return len(self.tally.honest) + len(self.tally.honest_errors) + sum(self.tally.hostile.values())

    def rate(self) -> float:
        return len(self.tally.honest) / self.wall


def measure(arm: str, base: str, master: int, args: argparse.Namespace, httpx: Any, tree_cpu: Any, k: int) -> Phase:
    load0 = os.getloadavg()[0]
    busy0, all0 = _machine_busy()
    cpu0, me0 = tree_cpu(master), _self_cpu()
    tally, wall = drive(base, args, args.seconds, httpx, k)
    cpu1, me1 = tree_cpu(master), _self_cpu()
    busy1, all1 = _machine_busy()
    ncpu = os.cpu_count() or 1
    busy_cores = (busy1 - busy0) / (all1 - all0) * ncpu if all1 > all0 else float("nan")
    return Phase(arm, tally, wall, cpu1 - cpu0, me1 - me0, (load0, os.getloadavg()[0]), busy_cores)


def report_phase(label: str, phases: list[Phase]) -> str:
    honest = [x for p in phases for x in p.tally.honest]
    errors = [e for p in phases for e in p.tally.honest_errors]
    hostile: collections.Counter[str] = collections.Counter()
    for p in phases:
        hostile.update(p.tally.hostile)
    wall = sum(p.wall for p in phases)
    requests = sum(p.requests for p in phases)
    cpu = sum(p.cpu for p in phases)
    client = sum(p.client_cpu for p in phases)
    ours = (cpu + client) / wall
    loads = [x for p in phases for x in p.load]
    busy = sum(p.busy * p.wall for p in phases) / wall
    lines = [
        f"{label}: {len(honest) / wall:.1f} honest req/s ({len(honest)} in {wall:.1f} s); "
        f"p50 {percentile(honest, 50) * 1000:.0f} ms, p99 {percentile(honest, 99) * 1000:.0f} ms; "
        f"honest errors {len(errors)}",
        f"    CPU per request {cpu / requests * 1000:.2f} ms (server tree {cpu:.2f} s over {requests} requests, "
        f"hostile included; per honest request {cpu / max(1, len(honest)) * 1000:.2f} ms); client CPU {client:.2f} s",
        f"    load {min(loads):.2f}-{max(loads):.2f}; machine busy {busy:.2f} cores, ours {ours:.2f} "
        f"(server + clients), others ~{max(0.0, busy - ours):.2f}",
        "    hostile: " + (", ".join(f"{k} {v}" for k, v in sorted(hostile.items())) or "none"),
    ]
    lines += [f"    HONEST ERROR: {e}" for e in errors[:5]]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="per phase; four phases (A B B A)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--users", type=int, default=8, help="distinct X-User values (client i is user i %% users)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=16, help="gthread threads per gunicorn worker")
    parser.add_argument("--run-timeout", type=float, default=2.0, help="each run's deadline (create_app timeout=)")
    parser.add_argument("--warm", type=float, default=3.0, help="unmeasured seconds of load on each server first")
    parser.add_argument(
        "--pause", type=float, default=0.0, help="idle seconds before each phase (spares the machine's other users)"
    )
    args = parser.parse_args(argv)

    missing = [m for m in ("gunicorn", "flask", "httpx") if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"bench_flask_load needs {', '.join(missing)}: pip install -e '.[bench,web]' "
            "(gunicorn is in the bench extra; or pip install gunicorn flask httpx)",
            file=sys.stderr,
        )
        return 2
    import httpx

    sys.path.insert(0, HERE)
    from _common import tree_cpu

    print("Issue 44: the Flask example under gunicorn, one-shot workers vs warm workers reused per user")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    print(
        f"commit {commit or '?'}, python {sys.version.split()[0]}, {os.cpu_count()} cores, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; gunicorn gthread {args.workers} workers x "
        f"{args.threads} threads; {args.clients} clients ({args.users} users), keep-alive; run timeout "
        f"{args.run_timeout} s; {args.seconds:.0f} s per phase ({args.pause:.0f} s idle before each), order A B B A (A = one-shot, B = reuse); "
        "10% hostile (spin, memory, log in turn)"
    )
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "bench_flask_load.log"), "ab"))
        servers = {arm: stack.enter_context(gunicorn(arm, args, log)) for arm in ARMS}
        for base, process in servers.values():
            wait_ready(base, process, httpx)
        for arm in ARMS:  # warm both: gunicorn workers import the app, pools start their fork servers
            tally, _ = drive(servers[arm][0], args, args.warm, httpx, 0)
            if tally.honest_errors:
                print(f"warm-up {arm}: {len(tally.honest_errors)} honest errors, e.g. {tally.honest_errors[0]}")
        phases: list[Phase] = []
        for i, arm in enumerate(("one-shot", "reuse", "reuse", "one-shot")):
            base, process = servers[arm]
            time.sleep(args.pause)
            phase = measure(arm, base, process.pid, args, httpx, tree_cpu, 1000 + i * 100_000)
            phases.append(phase)
            print(report_phase(f"phase {i + 1} {arm:8}", [phase]), flush=True)
    print()
    by_arm = {arm: [p for p in phases if p.arm == arm] for arm in ARMS}
    for arm in ARMS:
        print(report_phase(f"{arm:8} (both phases)", by_arm[arm]))
    print()

    def total(arm: str) -> tuple[float, float, float, float]:
        ps = by_arm[arm]
        honest = [x for p in ps for x in p.tally.honest]
        wall = sum(p.wall for p in ps)
        return (
            len(honest) / wall,
            percentile(honest, 50),
            percentile(honest, 99),
            sum(p.cpu for p in ps) / sum(p.requests for p in ps),
        )

    one, re_ = total("one-shot"), total("reuse")
    pairs = [phases[0].rate() / phases[1].rate(), phases[3].rate() / phases[2].rate()]
    print(
        f"ratio one-shot / reuse: honest req/s {one[0] / re_[0]:.2f}x (pairs A1/B1 {pairs[0]:.2f}x, "
        f"A2/B2 {pairs[1]:.2f}x; goal >= 0.85x); p50 {one[1] / re_[1]:.2f}x; p99 {one[2] / re_[2]:.2f}x; "
        f"CPU per request {one[3] / re_[3]:.2f}x"
    )
    errors = sum(len(p.tally.honest_errors) for p in phases)
    print(f"honest errors: {errors} (must be 0)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

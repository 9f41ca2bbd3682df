"""Runs through Celery against direct ``run_code`` on one machine: the broker's cost per run (issue 42).

A real ``redis-server`` (broker and result backend) and one ``celery worker``
(``-P solo --concurrency 1``, the tests' app: ``tests/celery_app.py``) are
started here. Each repetition runs ``N`` runs of the same program (one tool
call) back to back each way, in alternating order (direct first, then
Celery first): ``run_code(...)`` in this process, and
``tasks.run.delay(...).get()`` through the broker to the worker. Rows, each
the median over the repetitions (min-max):

* **runs per second**, one caller, one run at a time, and the wall time per run;
* **CPU per run**: every process involved (this one and its worker pool;
  for Celery also the celery worker and its pool, and redis-server), from
  ``/proc`` (user + system, children reaped included);
* **Redis commands per run** (``INFO commandstats``), by command, for a plain
  ``delay().get()``, and for ``tasks.start()`` with its events read by a
  watcher (``events()``);
* **broker round trips per run**: the same two, with the caller and a fresh
  worker talking to Redis through a counting proxy: each read of a client's
  bytes is one request batch (a command, or a pipeline sent at once), a round
  trip; the reply batches include pub/sub messages Redis pushes.

    python benchmarks/bench_celery.py [--runs N] [--reps K]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import socket
import statistics
import sys
import threading
import time
from typing import Any, Callable

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import celery_fleet  # noqa: E402
import redis  # noqa: E402
from redis_server import redis_process  # noqa: E402

PROGRAM = 'const a = await tools.echo({v: 1}); console.log("got " + a.v); return a.v;'
TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and every process below it, their reaped children included."""
    total = 0
    for p in {pid} | celery_fleet.descendants(pid):
        try:
            with open(f"/proc/{p}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / TICK


class CountingProxy:
    """A TCP proxy to Redis counting what crosses it: each read from a client is one request batch
    (a command, or a pipeline sent at once), and each read from Redis one reply batch (or pushed
    pub/sub messages). Round trips per run = request batches per run."""

    def __init__(self, port: int) -> None:
        self.target = ("127.0.0.1", port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        self.requests = 0
        self.replies = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="bench-proxy").start()

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, request: bool) -> None:
        try:
            while data := src.recv(1 << 20):
                with self.lock:
                    if request:
                        self.requests += 1
                    else:
                        self.replies += 1
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.requests, self.replies


def round_trips(port: int, folder: pathlib.Path, runs: int) -> dict[str, tuple[float, float]]:
    """Request and reply batches per run through a counting proxy, for a worker and a caller that use it."""
    from celery import Celery

    from nous_sched.integrations import celery as nous_celery

    proxy = CountingProxy(port)
    app = Celery("bench_count", broker=proxy.url, backend=proxy.url)
    tasks = nous_celery.register(app, tools="celery_tools")
    out = {}
    with celery_fleet.fleet(proxy.url, folder) as fleet:
        fleet.start("count", "solo")
        fleet.wait_ready(app, ["count"])

        def plain() -> None:
            tasks.run.delay(code=PROGRAM, description="bench").get(timeout=60)

        def watched() -> None:
            remote = tasks.start(PROGRAM, description="bench")
            list(remote.events())
            remote.result(timeout=60)

        for name, fn in (("delay().get()", plain), ("start() + events()", watched)):
            for _ in range(5):
                fn()
            time.sleep(1.5)  # the cancel watches of the warm-up runs end
            r0, p0 = proxy.counts()
            for _ in range(runs):
                fn()
            time.sleep(1.5)
            r1, p1 = proxy.counts()
            out[name] = ((r1 - r0) / runs, (p1 - p0) / runs)
    return out


def commands(client: Any) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


SPLIT: dict[str, list[list[float]]] = {}


def block(fn: Callable[[], Any], runs: int, pids: list[int], name: str = "") -> tuple[float, float]:
    """(wall seconds, CPU seconds) for ``runs`` calls of ``fn``; each pid's CPU share kept in ``SPLIT[name]``."""
    cpu0 = [tree_cpu(p) for p in pids]
    t0 = time.perf_counter()
    for _ in range(runs):
        fn()
    wall = time.perf_counter() - t0
    each = [tree_cpu(p) - c for p, c in zip(pids, cpu0)]
    SPLIT.setdefault(name, []).append([c / runs for c in each])
    return wall, sum(each)


def fmt(samples: list[float], scale: float = 1.0, unit: str = "") -> str:
    xs = [s * scale for s in samples]
    return f"{statistics.median(xs):.2f}{unit} ({min(xs):.2f}-{max(xs):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--reps", type=int, default=4)
    args = parser.parse_args()
    folder = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-celery-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    with redis_process() as server:
        os.environ["NOUS_SCHED_CELERY_REDIS"] = server.url
        import celery_app
        import celery_tools

        from nous_sched import run_code

        client = redis.Redis.from_url(server.url)
        with celery_fleet.fleet(server.url, folder) as fleet:
            worker = fleet.start("bench", "solo")
            fleet.wait_ready(celery_app.app, ["bench"])
            tasks = celery_app.tasks

            def direct() -> None:
                assert run_code(PROGRAM, celery_tools.TOOLS, description="bench").result == 1

            def through_celery() -> None:
                doc = tasks.run.delay(code=PROGRAM, description="bench").get(timeout=60)
                assert doc["answer"]["result"] == 1

            def watched() -> None:
                remote = tasks.start(PROGRAM, description="bench")
                assert list(remote.events())[-1].kind == "end"
                assert remote.result(timeout=60)["answer"]["result"] == 1

            for fn in (direct, through_celery, watched):  # warm: pools, connections, imports
                for _ in range(5):
                    fn()
            here = [os.getpid()]
            fleet_pids = [os.getpid(), worker.proc.pid, server.proc.pid]
            rows: dict[str, list[tuple[float, float]]] = {"direct": [], "celery": []}
            for rep in range(args.reps):
                order = [("direct", direct, here), ("celery", through_celery, fleet_pids)]
                for name, fn, pids in order if rep % 2 == 0 else reversed(order):
                    rows[name].append(block(fn, args.runs, pids, name))
            counted = {}
            for name, fn in (("delay().get()", through_celery), ("start() + events()", watched)):
                before = commands(client)
                for _ in range(args.runs):
                    fn()
                after = commands(client)
                counted[name] = {
                    k: (after[k] - before.get(k, 0)) / args.runs for k in after if after[k] != before.get(k, 0)
                }

        # (after the timed fleet stopped: the counting worker must be the only one on the queue)
        trips = round_trips(server.port, folder, args.runs)

    print(f"# bench_celery: {args.runs} runs x {args.reps} reps each way, one caller, solo worker")
    print("| path | runs/s | wall per run | CPU per run (all processes) |")
    print("|---|---|---|---|")
    for name, samples in rows.items():
        walls = [w / args.runs for w, _ in samples]
        cpus = [c / args.runs for _, c in samples]
        rate = [1 / w for w in walls]
        print(f"| {name} | {fmt(rate)} | {fmt(walls, 1000, ' ms')} | {fmt(cpus, 1000, ' ms')} |")
    d = [w / args.runs for w, _ in rows["direct"]]
    cel = [w / args.runs for w, _ in rows["celery"]]
    dc = [c / args.runs for _, c in rows["direct"]]
    cc = [c / args.runs for _, c in rows["celery"]]
    print(
        f"\nbroker's cost per run: wall +{fmt([b - a for a, b in zip(d, cel)], 1000, ' ms')}, "
        f"CPU +{fmt([b - a for a, b in zip(dc, cc)], 1000, ' ms')}"
    )
    split = list(zip(*SPLIT["celery"]))
    parts = ", ".join(
        f"{who} {fmt(list(xs), 1000, ' ms')}" for who, xs in zip(("caller", "celery worker", "redis-server"), split)
    )
    print(f"\nCPU per Celery run, by process (each with its children): {parts}")
    for name, per in counted.items():
        total = sum(per.values())
        shown = ", ".join(f"{k} {v:.2f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))
        print(f"\nRedis commands per run, {name}: {total:.1f} ({shown})")
    for name, (requests, replies) in trips.items():
        print(f"\nbroker round trips per run, {name}: {requests:.1f} request batches ({replies:.1f} reply batches)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

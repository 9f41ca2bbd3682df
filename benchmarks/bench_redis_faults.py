"""Redis faults under a throttle (issue 43, items 3 and 4), before and after, in one run.

Each scenario runs in a fresh process against the library of a git revision
(``--before``, default ``main``, unpacked with ``git archive``) and against
this checkout, both orders, with a real ``redis-server`` started here:

* ``dead``: ``Throttle(max_running=2, redis_url=<nothing listens>)``, four
  parallel calls, a 5 s deadline: the run's wall time, the lines logged (with
  tracebacks), and whether the run's message names Redis.
* ``silent``: two calls hold places, the server is stopped (SIGSTOP, sockets
  open), the calls return: seconds from their return until the places are
  back here (``running == waiting == 0``) and until the run ends, with the
  server continued after at most 6 s.
* ``stalled``: a holder (lease 2 s) reaches Redis through a proxy whose open
  connections then go silent (new ones work); another holder, direct, asks
  for the same ``max_running=1`` place for 6 s: 2 means it got in while the
  first still held it (over the limit).
* ``mismatch``: one process-like Throttle holds ``max_running=2`` twice over;
  another names the same throttle with ``max_running=40`` and fans out 10
  calls: the most calls running at once in all (the fleet's limit is 2).
* ``restart``: ``max_running=2`` (lease 3 s): two calls hold the places
  (one Throttle object), another Throttle of the same name (another
  process, in effect) is refused once, the server is killed and started
  again (no persistence: it forgets both leases), and the other side then
  asks for six places; the holders return 8 s later (past the grace):
  calls that got in while the holders still held (over the limit), the most
  running at once, calls run of 8.

    python benchmarks/bench_redis_faults.py [--before REV]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ("dead", "silent", "stalled", "mismatch", "restart")


class _Proxy:
    """Forwards to ``port``; :meth:`stall` makes the connections open now silent for good."""

    def __init__(self, port: int) -> None:
        self.target = ("127.0.0.1", port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        self.open: list[socket.socket] = []
        self.stalled: set[socket.socket] = set()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="bench-proxy").start()

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            server = socket.create_connection(self.target)
            with self.lock:
                self.open.append(client)
            threading.Thread(target=self._pump, args=(client, server, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, watched: Any) -> None:
        try:
            while data := src.recv(65536):
                with self.lock:
                    if watched in self.stalled:
                        continue
                dst.sendall(data)
        except OSError:
            pass

    def stall(self) -> None:
        with self.lock:
            self.stalled.update(self.open)


def _fanout(throttle: Any, n: int, timeout: float, go: Any = None, state: Any = None) -> Any:
    from nous_sched import QuickJSRuntime, Tool, run_code

    state = {"now": 0, "peak": 0, "begun": 0} if state is None else state
    lock = threading.Lock()

    def q(args: Any) -> Any:
        with lock:
            state["now"] += 1
            state["begun"] += 1
            state["peak"] = max(state["peak"], state["now"])
        try:
            if go is not None:
                go.wait(60)
            return args["i"]
        finally:
            with lock:
                state["now"] -= 1

    tool = Tool("q", q, throttles=(throttle,), concurrency_safe=lambda a: True)
    code = f"return await Promise.all([...Array({n}).keys()].map(i => tools.q({{i}})))"
    return run_code(code, [tool], runtime=QuickJSRuntime(), timeout=timeout, description="bench"), state


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records = 0
        self.lines = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.records += 1
        self.lines += len(self.format(record).splitlines())


def dead(url: str) -> dict[str, Any]:
    from nous_sched import Throttle

    count = _Count()
    logging.getLogger("nous_sched").addHandler(count)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    throttle = Throttle("search-api", max_running=2, redis_url=f"redis://127.0.0.1:{port}/0")
    t0 = time.monotonic()
    result, _ = _fanout(throttle, 4, timeout=5.0)
    message = result.error.message if result.error else ""
    return {
        "wall_s": round(time.monotonic() - t0, 2),
        "log_records": count.records,
        "log_lines": count.lines,
        "names_redis": "Redis at" in message,
        "message": message[:160],
    }


def silent(url: str, server: Any) -> dict[str, Any]:
    from nous_sched import Throttle

    throttle = Throttle("silent", max_running=2, redis_url=url)
    go = threading.Event()
    state = {"now": 0, "peak": 0, "begun": 0}
    done: list[float] = []
    runner = threading.Thread(target=lambda: (_fanout(throttle, 2, 30.0, go, state), done.append(time.monotonic())))
    runner.start()
    while state["begun"] < 2:
        time.sleep(0.005)
    server.send_signal(signal.SIGSTOP)
    returned = time.monotonic()
    go.set()
    back = None
    while time.monotonic() - returned < 6:
        if back is None and (throttle.running, throttle.waiting) == (0, 0):
            back = time.monotonic() - returned
        if back is not None and done:
            break
        time.sleep(0.005)
    server.send_signal(signal.SIGCONT)
    runner.join(60)
    return {
        "run_ended_after_s": round(done[0] - returned, 2) if done else None,
        "places_back_after_s": round(back, 2) if back is not None else "not within 6 s (until SIGCONT)",
    }


def stalled(url: str, server: Any) -> dict[str, Any]:
    from nous_sched import Throttle

    proxy = _Proxy(int(url.rsplit(":", 1)[1].split("/")[0]))
    holder = Throttle("stalled", max_running=1, redis_url=proxy.url, lease=2.0)
    other = Throttle("stalled", max_running=1, redis_url=url, lease=2.0)
    running = 0
    with holder.hold(timeout=30):
        running += 1
        proxy.stall()
        try:
            with other.hold(timeout=6.0):
                running += 1
                peak = running
        except TimeoutError:
            peak = running
    return {"limit": 1, "peak_running": peak}


def mismatch(url: str, server: Any) -> dict[str, Any]:
    from nous_sched import Throttle

    fleet = Throttle("shared", max_running=2, redis_url=url)
    mine = Throttle("shared", max_running=40, redis_url=url)
    holds = [fleet.hold(timeout=30), fleet.hold(timeout=30)]
    for h in holds:
        h.__enter__()
    go = threading.Event()
    threading.Timer(0.5, go.set).start()  # the calls last: they overlap
    try:
        result, state = _fanout(mine, 10, 5.0, go)
    finally:
        for h in holds:
            h.__exit__(None, None, None)
    message = result.error.message if result.error else ""
    return {"limit": 2, "peak_running": 2 + state["peak"], "message": message[:160]}


def restart(url: str, server: Any, hold: float = 8.0) -> dict[str, Any]:
    from nous_sched import Throttle

    # Two Throttle objects under one name stand for two processes (each counts its own places here).
    holder = Throttle("restart", max_running=2, redis_url=url, lease=3.0)
    other = Throttle("restart", max_running=2, redis_url=url, lease=3.0)
    go = threading.Event()
    held = {"now": 0, "peak": 0, "begun": 0}
    waited = {"now": 0, "peak": 0, "begun": 0}
    out: list[Any] = []
    holders = threading.Thread(target=lambda: out.append(_fanout(holder, 2, 120.0, go, held)))
    holders.start()
    while held["begun"] < 2:
        time.sleep(0.005)
    try:
        with other.hold(timeout=0.3):  # full: and the other side has seen this server
            pass
    except TimeoutError:
        pass
    server.kill()
    server.start()  # no persistence: it forgot both leases
    waiters = threading.Thread(target=lambda: out.append(_fanout(other, 6, hold + 60.0, go, waited)))
    waiters.start()
    time.sleep(hold)  # past the restart's grace (one lease): the holders' places are registered again, or not
    got_in = waited["begun"]  # the holders still hold: each of these ran over the limit
    go.set()
    holders.join(120)
    waiters.join(120)
    messages = [r.error.message[:160] for r, _ in out if r.error]
    return {
        "limit": 2,
        "peak_running": 2 + got_in,
        "got_in_while_held": got_in,
        "calls_ran": held["begun"] + waited["begun"],
        "of": 8,
        "errors": messages,
    }


def _scenario(name: str) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from redis_server import redis_process

    if name == "dead":
        out = dead("")
    else:
        with redis_process() as server:
            assert server.proc is not None
            if name == "restart":
                out = restart(server.url, server)
            else:
                out = {"silent": silent, "stalled": stalled, "mismatch": mismatch}[name](server.url, server.proc)
    print(json.dumps(out))
    sys.stdout.flush()
    os._exit(0)  # a run stuck on a silent server in the old code must not hold the benchmark


def _tree(rev: str, folder: str) -> str:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "nous_sched"], check=True, capture_output=True)
    path = Path(folder) / "before.tar"
    path.write_bytes(archive.stdout)
    with tarfile.open(path) as tar:
        tar.extractall(folder, filter="data")
    return folder


def _run(tree: str, name: str) -> Any:
    env = dict(os.environ, PYTHONPATH=tree + os.pathsep + str(ROOT / "tests"))
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--scenario", name], env=env, capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        return {"error": "did not finish in 120 s"}
    lines = done.stdout.strip().splitlines()
    out = json.loads(lines[-1]) if lines else {"error": done.stderr[-300:]}
    out["process_s"] = round(time.monotonic() - t0, 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="main", help="the git revision to compare with (default: main)")
    parser.add_argument("--scenario", choices=SCENARIOS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scenario:
        _scenario(args.scenario)
        return
    with tempfile.TemporaryDirectory(prefix="bench-redis-faults-") as folder:
        trees = {"before": _tree(args.before, folder), "after": str(ROOT)}
        for name in SCENARIOS:
            for order in (("before", "after"), ("after", "before")):
                for which in order:
                    print(json.dumps({"scenario": name, "tree": which, **_run(trees[which], name)}), flush=True)


if __name__ == "__main__":
    main()

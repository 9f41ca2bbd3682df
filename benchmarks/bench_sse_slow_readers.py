"""Issue 43, item 9: live views under stalled readers.

examples/flask_events.py on a real threaded WSGI server (werkzeug's
``make_server(threaded=True)``) on 127.0.0.1. For each of ``--runs`` runs
(a program that logs ``--lines`` lines of ~200 chars around four slow tool
calls), ``--stalled`` raw sockets open the run's SSE stream with a small
receive buffer and never read, ``--slow`` read 64 bytes every 50 ms, and one
honest viewer reads as fast as it can. Reported: the delay between the run's
end (``Run.done()`` seen by a watcher thread in this process) and the honest
viewer reading the ``end`` event, p50/p99/max, and this process's CPU per run.

Three ways of serving the stream, measured in the same process, rotating
which goes first run by run: ``per-event`` (before issue 43: one write, one
wake-up of the viewer's thread, per event) and ``batched`` (the example's
``_sse`` now: one write per batch of ready events, ``Run.event_batches``),
both on the threaded WSGI server (a thread per viewer); and ``async``:
examples/asgi_events.py on uvicorn (``nous_sched.asgi.sse_app``: a coroutine
per viewer, no thread, ``Run.aevent_batches``), the same program and readers.
Run by hand: ``PYTHONPATH=. python benchmarks/bench_sse_slow_readers.py``.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import pathlib
import resource
import socket
import statistics
import threading
import time
from typing import Any

import uvicorn
from werkzeug.serving import WSGIRequestHandler, make_server

WSGIRequestHandler.log_request = lambda *a, **k: None  # type: ignore[method-assign]  # no access log

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "flask_events.py"
ASGI_EXAMPLE = EXAMPLE.with_name("asgi_events.py")
PROGRAM = """const pad = "x".repeat(180);
for (let i = 0; i < {lines}; i++) console.log(`line ${{i}} ${{pad}}`);
const found = await Promise.all(["Paris", "Lagos", "Lima", "Osaka"].map(city => tools.population({{city}})));
for (let i = 0; i < {lines}; i++) console.log(`after ${{i}} ${{pad}}`);
return found.length;"""


def _load(path: pathlib.Path = EXAMPLE) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem + "_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _start(port: int, lines: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"code": PROGRAM.format(lines=lines), "description": "bench"})
    conn.request("POST", "/runs", body, {"Content-Type": "application/json"})
    run_id = json.loads(conn.getresponse().read())["id"]
    conn.close()
    return str(run_id)


def _open(port: int, run_id: str, rcvbuf: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET /runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return sock


def _honest(port: int, run_id: str, seen: dict[str, float]) -> None:
    sock = _open(port, run_id)
    tail = b""
    while True:
        data = sock.recv(65536)
        if not data:
            break
        window, tail = tail + data, (tail + data)[-32:]
        if b'"kind": "end"' in window:
            seen["end"] = time.monotonic()
            break
    sock.close()


def _slow(sock: socket.socket, stop: threading.Event) -> None:
    while not stop.wait(0.05):
        try:
            if not sock.recv(64):
                return
        except OSError:
            return


def one_run(find: Any, port: int, args: argparse.Namespace) -> float:
    run_id = _start(port, args.lines)
    run = find(run_id)
    stalled = [_open(port, run_id, rcvbuf=4096) for _ in range(args.stalled)]
    stop = threading.Event()
    slow = [_open(port, run_id, rcvbuf=4096) for _ in range(args.slow)]
    readers = [threading.Thread(target=_slow, args=(s, stop), daemon=True) for s in slow]
    for r in readers:
        r.start()
    seen: dict[str, float] = {}
    honest = threading.Thread(target=_honest, args=(port, run_id, seen), daemon=True)
    honest.start()
    ended: dict[str, float] = {}

    def watch() -> None:
        run.result(timeout=120)
        ended["at"] = time.monotonic()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    honest.join(120)
    watcher.join(120)
    stop.set()
    for s in stalled + slow:
        s.close()
    if "end" not in seen:
        return float("inf")
    return max(0.0, seen["end"] - ended["at"])


def _per_event(run: Any) -> Any:
    """The example's stream before issue 43: one write per event."""
    for event in run.events():
        yield f"data: {event.to_json()}\n\n"


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def measure(runs: int = 20, stalled: int = 5, slow: int = 0, lines: int = 2000) -> dict[str, Any]:
    """The end delay for the honest viewer (p50, p99, max, in ms) and CPU per run (ms), per way of serving."""
    args = argparse.Namespace(runs=runs, stalled=stalled, slow=slow, lines=lines)
    module = _load()
    app = module.create_app()
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    asgi_app = _load(ASGI_EXAMPLE).create_app()
    uv = uvicorn.Server(uvicorn.Config(asgi_app, host="127.0.0.1", port=0, log_level="warning"))
    threading.Thread(target=uv.run, daemon=True).start()
    while not uv.started:
        time.sleep(0.01)
    uv_port = uv.servers[0].sockets[0].getsockname()[1]
    flask_find = lambda run_id: app.config["NOUS_SCHED_RUNS"][run_id]["run"]  # noqa: E731
    ways = {
        "per-event": (_per_event, server.server_port, flask_find),
        "batched": (module._sse, server.server_port, flask_find),
        "async": (None, uv_port, asgi_app.state.runs.__getitem__),
    }
    delays: dict[str, list[float]] = {name: [] for name in ways}
    cpu: dict[str, float] = {name: 0.0 for name in ways}
    names = list(ways)
    try:
        for i in range(args.runs):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                sse, port, find = ways[name]
                if sse is not None:
                    module._sse = sse  # the route looks it up per request
                c0 = time.process_time()
                delays[name].append(one_run(find, port, args))
                cpu[name] += time.process_time() - c0
    finally:
        server.shutdown()
        uv.should_exit = True

    def ms(seconds: float) -> Any:
        return round(seconds * 1000) if seconds != float("inf") else "never"  # (the honest viewer saw no end)

    return {
        name: {
            "p50_ms": ms(statistics.median(values)),
            "p99_ms": ms(_p99(values)),
            "max_ms": ms(max(values)),
            "cpu_per_run_ms": round(cpu[name] / args.runs * 1000),
        }
        for name, values in delays.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--stalled", type=int, default=5)
    parser.add_argument("--slow", type=int, default=0)
    parser.add_argument("--lines", type=int, default=2000)
    args = parser.parse_args()
    found = measure(args.runs, args.stalled, args.slow, args.lines)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"stalled={args.stalled} slow={args.slow} lines={args.lines} runs={args.runs} each; peak RSS {peak:.0f} MiB")
    for name, row in found.items():
        print(
            f"  {name:9}: end delay for the honest viewer p50 {row['p50_ms']} ms, "
            f"p99 {row['p99_ms']} ms, max {row['max_ms']} ms; CPU per run {row['cpu_per_run_ms']} ms"
        )


if __name__ == "__main__":
    main()

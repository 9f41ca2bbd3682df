"""Live views never wait on each other (issue 43, item 9): examples/flask_events.py on
a real threaded WSGI server (werkzeug) on 127.0.0.1, five viewers whose sockets
stop reading (a small receive buffer, never read) and one honest viewer.

The run blocks on an event only the test sets after every viewer is connected,
so the stalled viewers are stalled while the run emits; the honest viewer must
see ``end`` promptly (a generous bound, far above what a loaded machine needs),
before any stalled viewer has read anything; once they read, each stalled
viewer's stream shows a ``gap`` (it skipped to the newest events) and ends, and
holds far fewer events than the run emitted.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import socket
import threading
import time

import pytest

pytest.importorskip("flask")
from werkzeug.serving import make_server  # noqa: E402

from nous_sched import Limits, Tool  # noqa: E402

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "flask_events.py"
CALLS = 3000
KEYS = 24  # each argument is a row of its own in a `call` event: about 5 KB an event, 15 MB a run
STALLED = 5
PROMPT = 15.0  # seconds from the run's end to the honest viewer's `end`: a few times what a loaded machine needs
PAD = "p" * 150
# Far more than the kernel's socket buffers (4 MiB at most here) hold, so a stalled viewer stalls for certain.
PROGRAM = f"""await tools.gate({{}});
const args = (i, j) => Object.fromEntries(Array.from({{length: {KEYS}}}, (_, k) => ["k" + k, `${{i}}.${{j}}.${{k}} {PAD}`]));
for (let i = 0; i < {CALLS // 50}; i++) {{
  await Promise.all(Array.from({{length: 50}}, (_, j) => tools.echo(args(i, j))));
}}
return "done";"""


def _load():
    spec = importlib.util.spec_from_file_location("nous_sched_flask_events_stalled", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _open(port, run_id, rcvbuf=0):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(120)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET /runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return sock


def _read_events(sock, seen_end=None):
    """Every SSE event on ``sock`` until ``end`` (the body is chunked; events are whole lines)."""
    data = b""
    events = []
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        while b"\n" in data:
            line, data = data.split(b"\n", 1)
            if line.startswith(b"data: "):
                event = json.loads(line[6:])
                events.append(event)
                if event["kind"] == "end":
                    if seen_end is not None:
                        seen_end["at"] = time.monotonic()
                    return events
    return events


def test_stalled_viewers_delay_only_themselves_behind_a_threaded_server():
    module = _load()
    gate = threading.Event()
    tools = [
        Tool("gate", lambda args: gate.wait(60), description="Wait for the test.", parameters={"type": "object"}),
        Tool(
            "echo",
            lambda args: args,
            description="Echo.",
            parameters={"type": "object"},
            concurrency_safe=lambda args: True,
        ),
    ]
    app = module.create_app(tools, limits=Limits(max_calls=CALLS + 10, max_total_args_bytes=100_000_000, timeout=300))
    server = make_server("127.0.0.1", 0, app, threaded=True)
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    serving.start()
    stalled = []
    try:
        client = app.test_client()
        run_id = client.post("/runs", json={"code": PROGRAM, "description": "many events"}).get_json()["id"]
        run = app.config["NOUS_SCHED_RUNS"][run_id]["run"]
        stalled = [_open(server.server_port, run_id, rcvbuf=4096) for _ in range(STALLED)]
        seen_end = {}
        honest_events = []
        honest_sock = _open(server.server_port, run_id)
        honest = threading.Thread(
            target=lambda: honest_events.extend(_read_events(honest_sock, seen_end)), name="test-honest", daemon=True
        )
        honest.start()
        gate.set()
        result = run.result(timeout=240)
        ended = time.monotonic()
        assert result.ok, result.error
        honest.join(240)
        assert "at" in seen_end, "the honest viewer never saw `end`"
        assert seen_end["at"] - ended < PROMPT
        # Every event, in order, no gap: the honest viewer kept up.
        kinds = [e["kind"] for e in honest_events]
        assert "gap" not in kinds and kinds[-1] == "end"
        assert kinds.count("commit") == CALLS + 1
        emitted = len(honest_events)

        # The stalled viewers read only now: each skipped (a gap), then got to the end.
        for sock in stalled:
            events = _read_events(sock)
            kinds = [e["kind"] for e in events]
            assert kinds[-1] == "end"
            gaps = [e["data"]["missed"] for e in events if e["kind"] == "gap"]
            assert gaps and sum(gaps) + len(events) - len(gaps) == emitted
            # What waited for it after it stalled: the newest SSE_BUFFER events, never the whole run.
            after = kinds[len(kinds) - 1 - kinds[::-1].index("gap") + 1 :]
            assert len(after) <= module.SSE_BUFFER
    finally:
        for sock in stalled:
            sock.close()
        server.shutdown()
        serving.join(10)

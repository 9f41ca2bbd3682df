"""Live views from an asyncio server (issue 43, item 9): ``Run.aevents`` /
``aevent_batches``, ``live.asse``, ``agui.asse`` and ``nous_sched.asgi.sse_app``,
served by a real uvicorn on 127.0.0.1 to real HTTP clients (httpx, raw sockets),
mounted in Starlette (the example), alone, and as a Django ASGI view's response.

The stalled-viewer test is test_sse_stalled.py's, on the async path: five
viewers whose sockets stop reading (a small receive buffer, never read) and
one honest viewer. The run blocks on an event only the test sets once every
viewer has its first event, so the stalled viewers are stalled while the run
emits. Asserted by order, not by time: the honest viewer reads every event and
``end`` while the stalled ones have read nothing more; the server started no
thread for any of the six; once the stalled viewers read, each shows a ``gap``
and ``end``, holding at most ``SSE_BUFFER`` events after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Iterator

import httpx
import pytest
import uvicorn

from nous_sched import ConfigError, Limits, Tool, agui, live, start_run
from nous_sched.asgi import sse_app

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "asgi_events.py"
WAIT = 120
CALLS = 3000
KEYS = 24  # each argument is a row of its own in a `call` event: about 5 KB an event, 15 MB a run
STALLED = 5
PAD = "p" * 150
# Far more than the kernel's socket buffers (4 MiB at most here) hold, so a stalled viewer stalls for certain.
PROGRAM = f"""await tools.gate({{}});
const args = (i, j) => Object.fromEntries(Array.from({{length: {KEYS}}}, (_, k) => ["k" + k, `${{i}}.${{j}}.${{k}} {PAD}`]));
for (let i = 0; i < {CALLS // 50}; i++) {{
  await Promise.all(Array.from({{length: 50}}, (_, j) => tools.echo(args(i, j))));
}}
return "done";"""


def _load() -> Any:
    spec = importlib.util.spec_from_file_location("nous_sched_asgi_events_test", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def serving(app: Any) -> Iterator[int]:
    """``app`` on a real uvicorn, on a free port of 127.0.0.1, in a thread; yields the port."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)


def _tools(gate: threading.Event) -> list[Tool]:
    return [
        Tool("gate", lambda args: gate.wait(60), description="Wait for the test.", parameters={"type": "object"}),
        Tool(
            "echo",
            lambda args: args,
            description="Echo.",
            parameters={"type": "object"},
            concurrency_safe=lambda args: True,
        ),
    ]


def _open(port: int, path: str, rcvbuf: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(WAIT)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return sock


class Reader:
    """An SSE reader on a raw socket: ``first()`` reads until the first event, ``rest()`` to ``end``."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.data, self.events = sock, b"", []

    def _until(self, done: Any) -> list[dict[str, Any]]:
        while not done():
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            self.data += chunk
            while b"\n" in self.data:
                line, self.data = self.data.split(b"\n", 1)
                if line.startswith(b"data: "):
                    self.events.append(json.loads(line[6:]))
        return self.events

    def first(self) -> list[dict[str, Any]]:
        return self._until(lambda: bool(self.events))

    def rest(self) -> list[dict[str, Any]]:
        return self._until(lambda: bool(self.events) and self.events[-1]["kind"] == "end")


def _threads() -> set[str]:
    """The threads that are not the library's (a run's, its tools'): the test's and the server's."""
    return {t.name for t in threading.enumerate() if not t.name.startswith("nous-sched-")}


def test_stalled_viewers_delay_only_themselves_behind_an_async_server() -> None:
    module = _load()
    gate = threading.Event()
    app = module.create_app(
        _tools(gate), limits=Limits(max_calls=CALLS + 10, max_total_args_bytes=100_000_000, timeout=300)
    )
    stalled: list[Reader] = []
    with serving(app) as port:
        base = f"http://127.0.0.1:{port}"
        run_id = httpx.post(base + "/runs", json={"code": PROGRAM, "description": "many events"}).json()["id"]
        run = app.state.runs[run_id]
        before = _threads()  # before any viewer: a server with a thread per viewer would add six
        try:
            stalled = [Reader(_open(port, f"/runs/{run_id}/events", rcvbuf=4096)) for _ in range(STALLED)]
            for reader in stalled:  # each is being served: it has the gate's `call`
                assert reader.first()[0]["kind"] == "call"
            honest = Reader(_open(port, f"/runs/{run_id}/events"))
            assert honest.first()[0]["kind"] == "call"
            gate.set()
            honest_events = honest.rest()  # while the stalled viewers read nothing
            during = _threads()
            assert run.result(timeout=WAIT).ok
            # Every event, in order, no gap: the honest viewer kept up, and saw `end`.
            kinds = [e["kind"] for e in honest_events]
            assert "gap" not in kinds and kinds[-1] == "end"
            assert kinds.count("commit") == CALLS + 1
            assert not during - before, "a viewer took a thread"
            emitted = len(honest_events)
            # The stalled viewers read only now: each skipped (a gap), then got to the end.
            for reader in stalled:
                events = reader.rest()
                kinds = [e["kind"] for e in events]
                assert kinds[-1] == "end"
                gaps = [e["data"]["missed"] for e in events if e["kind"] == "gap"]
                assert gaps and sum(gaps) + len(events) - len(gaps) == emitted
                after = kinds[len(kinds) - 1 - kinds[::-1].index("gap") + 1 :]
                assert len(after) <= live.SSE_BUFFER
        finally:
            gate.set()
            for reader in stalled:
                reader.sock.close()


def test_the_example_serves_events_and_agui_to_http_clients() -> None:
    module = _load()
    app = module.create_app()
    program = 'console.log("looking up"); return await tools.population({city: "Lima"})'
    with serving(app) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=WAIT) as client:
        assert client.post("/runs", json={"nope": 1}).status_code == 400
        run_id = client.post("/runs", json={"code": program, "description": "Lima"}).json()["id"]
        with client.stream("GET", f"/runs/{run_id}/events") as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
        assert [e["kind"] for e in events] == ["log", "call", "commit", "end"]
        assert events[-1]["data"]["answer"]["result"] == {"city": "lima", "population": 10_092_000}
        with client.stream("GET", f"/runs/{run_id}/agui") as response:
            types = [json.loads(line[6:])["type"] for line in response.iter_lines() if line.startswith("data: ")]
        assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
        assert "TOOL_CALL_RESULT" in types
        assert client.get("/runs/unknown/events").status_code == 404
        assert client.get(f"/runs/{run_id}/other").status_code == 404
        assert client.delete(f"/runs/{run_id}/events").status_code == 405


def test_sse_app_alone_a_function_of_ids_no_agui_unless_asked() -> None:
    run = start_run("return 1", description="one")
    assert run.result(timeout=WAIT).ok
    with serving(sse_app(lambda rid: run if rid == "r" else None)) as port:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=WAIT) as client:
            text = client.get("/r/events").text
            assert text == "".join(live.sse(run))  # the same text as the sync stream
            assert json.loads(text.splitlines()[-2][6:])["kind"] == "end"
            assert client.head("/r/events").status_code == 200
            assert client.get("/r/agui").status_code == 404
            assert client.get("/x/events").status_code == 404


def test_a_viewer_that_disconnects_stops_and_the_others_go_on() -> None:
    gate = threading.Event()
    run = start_run("await tools.gate({}); return await tools.echo({a: 1})", _tools(gate), description="gated")
    finished = threading.Event()
    inner = sse_app({"r": run})

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await inner(scope, receive, send)
        if scope["type"] == "http":
            finished.set()  # the viewer's stream has stopped

    try:
        with serving(app) as port:
            gone = Reader(_open(port, "/r/events"))
            assert gone.first()[0]["kind"] == "call"
            gone.sock.close()
            # Its stream stops though the run, held by the gate, has nothing new to send it.
            assert finished.wait(WAIT) and not run.done()
            stays = Reader(_open(port, "/r/events"))
            assert stays.first()[0]["kind"] == "call"
            gate.set()
            assert [e["kind"] for e in stays.rest()] == ["call", "commit", "call", "commit", "end"]
            stays.sock.close()
    finally:
        gate.set()
    assert run.result(timeout=WAIT).ok


def test_aevents_never_block_the_loop_and_match_events() -> None:
    gate = threading.Event()
    run = start_run("await tools.gate({}); return 7", _tools(gate), description="gated")

    async def main() -> list[Any]:
        seen: list[Any] = []
        first = asyncio.Event()

        async def watch() -> None:
            async for event in run.aevents():
                seen.append(event)
                first.set()

        watcher = asyncio.ensure_future(watch())
        await first.wait()
        # The watcher now waits for the run's next event; this coroutine still runs (the loop is
        # free), and it is the one that lets the run go on: a blocked loop would never get here.
        for _ in range(3):
            await asyncio.sleep(0)
        gate.set()
        await watcher
        return seen

    seen = asyncio.run(main())
    assert run.result(timeout=WAIT).result == 7
    assert [e.kind for e in seen] == [e.kind for e in run.events()] == ["call", "commit", "end"]
    assert seen == list(run.events())  # the same events, in the same order


def test_a_cancelled_async_viewer_stops_waiting() -> None:
    gate = threading.Event()
    run = start_run("await tools.gate({}); return 7", _tools(gate), description="gated")

    async def main() -> None:
        batches = run.aevent_batches()
        first = await batches.__anext__()
        assert [e.kind for e in first] == ["call"]
        waiting = asyncio.ensure_future(batches.__anext__())
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(main())  # its loop closed: the run's next event wakes nobody, and fails nothing
    gate.set()
    assert run.result(timeout=WAIT).result == 7


def test_a_slow_async_consumer_gets_a_gap() -> None:
    run = start_run("for (let i = 0; i < 50; i++) console.log(`line ${i}`); return 1", description="logs")
    assert run.result(timeout=WAIT).ok

    async def main() -> list[list[Any]]:
        return [batch async for batch in run.aevent_batches(buffer=5)]

    (batch,) = asyncio.run(main())
    assert batch[0].kind == "gap" and batch[0].data == {"missed": 46}
    assert [e.kind for e in batch[1:]] == ["log"] * 4 + ["end"]

    async def text() -> str:
        return "".join([t async for t in live.asse(run, buffer=5)])

    def parsed(text: str) -> list[dict[str, Any]]:  # a gap's `at` is when its consumer read
        events = [json.loads(line[6:]) for line in text.splitlines() if line]
        return [{**e, "at": None} if e["kind"] == "gap" else e for e in events]

    assert parsed(asyncio.run(text())) == parsed("".join(live.sse(run, buffer=5)))

    async def ag() -> list[str]:
        texts = [text async for text in agui.asse(run, buffer=5)]
        return [json.loads(line[6:])["type"] for text in texts for line in text.splitlines() if line]

    types = asyncio.run(ag())
    assert types[:3] == ["RUN_STARTED", "CUSTOM", "CUSTOM"] and types[-1] == "RUN_FINISHED"


@pytest.mark.parametrize(
    "make",
    [
        lambda run: run.aevents(buffer=0),
        lambda run: run.aevent_batches(buffer=True),
        lambda run: live.asse(run, buffer=-1),
        lambda run: live.sse(run, buffer="9").__next__(),
        lambda run: agui.asse(run, buffer=0),
        lambda run: sse_app({}, buffer=0),
        lambda run: sse_app(5),  # neither a mapping nor a function
    ],
)
def test_bad_options_are_config_errors_when_called(make: Any) -> None:
    run = start_run("return 1", description="one")
    with pytest.raises(ConfigError, match="buffer|runs"):
        make(run)
    run.result(timeout=WAIT)


def test_each_event_is_encoded_once_for_every_viewer() -> None:
    run = start_run('console.log("a"); console.log("b"); return 1', description="two lines")
    assert run.result(timeout=WAIT).ok
    first, second = list(run.events()), list(run.events())
    assert [e.to_json() for e in first] == [json.dumps(e.as_dict()) for e in first]
    # The same text object for both viewers: made once, by whichever asked first.
    assert all(a.to_json() is b.to_json() for a, b in zip(first, second))


DJANGO_ASGI = """
from django.conf import settings

settings.configure(DEBUG=False, ROOT_URLCONF=__name__, ALLOWED_HOSTS=["127.0.0.1"], SECRET_KEY="test-only")

from django.core.asgi import get_asgi_application  # noqa: E402
from django.http import StreamingHttpResponse  # noqa: E402
from django.urls import path  # noqa: E402

from nous_sched import agui, live, start_run  # noqa: E402

PROGRAM = 'console.log("from django"); return 5'


def events(request):
    run = start_run(PROGRAM, description="django")
    return StreamingHttpResponse(live.asse(run), content_type=live.MEDIA_TYPE)


def agui_events(request):
    run = start_run(PROGRAM, description="django")
    return StreamingHttpResponse(agui.asse(run), content_type=agui.MEDIA_TYPE)


urlpatterns = [path("events", events), path("agui", agui_events)]
app = get_asgi_application()
"""


def test_a_django_asgi_view_streams_asse(tmp_path: pathlib.Path) -> None:
    """What docs/live.rst says of Django under ASGI: StreamingHttpResponse takes live.asse / agui.asse."""
    (tmp_path / "django_sse.py").write_text(DJANGO_ASGI, encoding="utf-8")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    root = str(pathlib.Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    argv = [sys.executable, "-m", "uvicorn", "--app-dir", str(tmp_path), "--port", str(port), "django_sse:app"]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + WAIT
        while True:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            assert time.monotonic() < deadline, "the Django app did not listen"
            time.sleep(0.1)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=WAIT) as client:
            with client.stream("GET", "/events") as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith(live.MEDIA_TYPE)
                events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
            with client.stream("GET", "/agui") as response:
                types = [json.loads(line[6:])["type"] for line in response.iter_lines() if line.startswith("data: ")]
        assert [e["kind"] for e in events] == ["log", "end"]
        assert events[-1]["data"]["answer"] == {"logs": ["from django"], "result": 5}
        assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
        if process.stderr:
            process.stderr.close()

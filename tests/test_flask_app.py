"""examples/flask_app.py on a real HTTP server (werkzeug, 127.0.0.1, an ephemeral port).

Concurrent requests with different ``X-User`` headers each see their own user
inside a tool running on the app's one shared pool, and the runs leave no
scheduler thread behind.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import pathlib
import threading
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("flask")
from drivers import IDLE  # noqa: E402
from werkzeug.serving import make_server  # noqa: E402 (flask brings werkzeug)

from nous_sched import ConfigError, WorkerPool  # noqa: E402

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "flask_app.py"
REQUESTS = 24
POOL_PREFIX = "flask-test-tools"


def _load_example():
    spec = importlib.util.spec_from_file_location("nous_sched_flask_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


flask_app = _load_example()


def _sched_threads():
    # An idle driver is back in the shared driver threads, warm for the next
    # run (tests/drivers.py): not a thread a run left behind.
    return {t for t in threading.enumerate() if t.name.startswith("nous-sched") and not t.name.startswith(IDLE)}


@pytest.fixture
def serve():
    """``serve(**create_app_options) -> (base_url, pool)``: the app on 127.0.0.1 with its own shared pool.

    Every server and pool is shut down at the end of the test.
    """
    running = []

    def start(**options):
        pool = concurrent.futures.ThreadPoolExecutor(16, thread_name_prefix=POOL_PREFIX)
        app = flask_app.create_app(pool, **options)
        httpd = make_server("127.0.0.1", 0, app, threaded=True)
        serving = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="test-flask-server", daemon=True
        )
        serving.start()
        running.append((httpd, serving, pool))
        return f"http://127.0.0.1:{httpd.server_port}", pool

    yield start
    for httpd, serving, pool in running:
        httpd.shutdown()
        httpd.server_close()
        serving.join(10)
        pool.shutdown(wait=True)


@pytest.fixture
def server(serve):
    return serve(max_parallel=4, timeout=10.0)


def _post(base, body, user=None, raw=None, timeout=15.0):
    data = raw if raw is not None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if user is not None:
        headers["X-User"] = user
    req = urllib.request.Request(base + "/run", data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


PROGRAM = """
const n = %d;
const [me, sum, city, again] = await Promise.all([
  tools.whoami({}),
  tools.add({a: n, b: 1}),
  tools.city({name: "Lima"}),
  tools.whoami({}),
]);
const count = await tools.note({text: `request ${n}`});
console.log(`${me.user} ran request ${n}`);
return {user: me.user, again: again.user, sum, country: city.country, call: me.call, count};
"""


def test_concurrent_requests_each_see_their_own_user(server):
    base, pool = server
    before = _sched_threads()
    users = [f"user-{i:02d}" for i in range(REQUESTS)]

    def one(i):
        body = {"code": PROGRAM % i, "description": f"request {i} checks who it runs for"}
        return _post(base, body, user=users[i])

    started = time.monotonic()
    barrier = threading.Barrier(REQUESTS, timeout=10)

    def fire(i):
        barrier.wait()  # release every request at once
        return one(i)

    with concurrent.futures.ThreadPoolExecutor(REQUESTS, thread_name_prefix="test-http-client") as clients:
        answers = list(clients.map(fire, range(REQUESTS)))
    elapsed = time.monotonic() - started

    counts = []
    for i, (status, body) in enumerate(answers):
        assert status == 200, body
        assert "error" not in body, body
        result = body["result"]
        assert result["user"] == users[i] and result["again"] == users[i], (i, result)
        assert result["sum"] == i + 1
        assert result["country"] == "Peru"
        assert result["call"].startswith("http-") and result["call"].endswith(":code:0")
        assert body["logs"] == [f"{users[i]} ran request {i}"]
        counts.append(result["count"])
    # The exclusive note tool ran once per request; the shared counter saw all of them.
    assert sorted(counts)[-1] >= REQUESTS
    assert len(set(counts)) == REQUESTS
    assert elapsed < 15, elapsed

    # Every run stopped its scheduler: no thread still drives one, and no private tool pool is left.
    deadline = time.monotonic() + 5
    while _sched_threads() - before and time.monotonic() < deadline:
        time.sleep(0.02)
    left = _sched_threads() - before
    assert not left, sorted(t.name for t in left)
    assert not any(t.name.startswith("nous-sched") for t in pool._threads)  # the shared pool is named apart


def test_tools_run_on_the_shared_pool(server):
    base, pool = server
    probe = "return await tools.whoami({});"
    status, body = _post(base, {"code": probe, "description": "who"}, user="ada")
    assert status == 200 and body["result"]["user"] == "ada"
    # The tool ran on a thread of the shared pool, not the request's: the user crossed by context.
    assert pool._threads and all(t.name.startswith(POOL_PREFIX) for t in pool._threads)
    status, body = _post(base, {"code": probe, "description": "who"})
    assert status == 200 and body["result"]["user"] == "anonymous"


def test_a_failed_program_is_data_with_status_200(server):
    base, _ = server
    status, body = _post(base, {"code": "throw new Error('nope')", "description": "fails"})
    assert status == 200
    assert body["logs"] == [] and body["error"]["kind"] == "exception"
    assert body["error"]["message"].startswith("Error: nope")

    status, body = _post(
        base,
        {
            "code": "try { await tools.city({name: 'Atlantis'}); } catch (e) { return e.message; }",
            "description": "a tool error is caught",
        },
    )
    assert status == 200 and body["result"].startswith("unknown city 'Atlantis'")


def test_a_runaway_program_times_out_as_data(serve):
    base, _ = serve(timeout=0.5)
    status, body = _post(base, {"code": "while (true) {}", "description": "loops", "max_parallel": 1})
    assert status == 200 and body["error"]["kind"] == "timeout"


@pytest.mark.parametrize(
    "body, raw, says",
    [
        (None, b"not json", "JSON object"),
        (None, b"[1, 2]", "JSON object"),
        ({"description": "no code"}, None, "`code`"),
        ({"code": "   ", "description": "blank code"}, None, "`code`"),
        ({"code": "return 1"}, None, "`description`"),
        ({"code": "return 1", "description": "  "}, None, "`description`"),
        ({"code": "return 1", "description": "d", "max_parallel": 0}, None, "`max_parallel`"),
        ({"code": "return 1", "description": "d", "max_parallel": 99}, None, "`max_parallel`"),
        ({"code": "return 1", "description": "d", "max_parallel": True}, None, "`max_parallel`"),
        (None, b'{"code": "' + b"x" * (300 * 1024) + b'", "description": "d"}', "larger than"),
    ],
    ids=[
        "not-json",
        "not-an-object",
        "no-code",
        "blank-code",
        "no-description",
        "blank-description",
        "max-parallel-0",
        "max-parallel-over-ceiling",
        "max-parallel-bool",
        "body-too-large",
    ],
)
def test_bad_input_is_400_with_a_clear_message(server, body, raw, says):
    base, _ = server
    status, answer = _post(base, body, raw=raw)
    assert status == 400
    assert says in answer["error"], answer


def test_the_app_makes_its_own_pool_when_given_none():
    app = flask_app.create_app()
    state = app.extensions["nous_sched"]
    try:
        assert state["owns_executor"] is True
        client = app.test_client()
        answer = client.post(
            "/run",
            json={"code": "return await tools.add({a: 2, b: 3})", "description": "adds"},
            headers={"X-User": "bo"},
        )
        assert answer.status_code == 200 and answer.get_json() == {"logs": [], "result": 5}
        assert any(t.name.startswith("flask-run-tools") for t in state["executor"]._threads)
    finally:
        state["executor"].shutdown(wait=True)


def test_runtime_per_user_reuses_that_users_warm_worker_and_no_other(serve):
    # A pool of the test's own with no spares: its live workers are exactly the warm ones runs left.
    workers = WorkerPool(size=4, spares=0)
    chosen = []

    def per_user(user):
        chosen.append(user)
        return workers.domain(user)

    try:
        base, _ = serve(runtime=per_user)
        probe = {"code": "return (await tools.whoami({})).user", "description": "who"}
        assert _post(base, probe, user="ada") == (200, {"logs": [], "result": "ada"})
        ada = workers.pids()
        assert len(ada) == 1, ada  # ada's run was kept warm in the app's pool (not a one-shot worker elsewhere)
        assert _post(base, probe, user="ada") == (200, {"logs": [], "result": "ada"})
        assert workers.pids() == ada  # her second request ran on the same worker process
        assert _post(base, probe, user="bob") == (200, {"logs": [], "result": "bob"})
        both = workers.pids()
        assert len(both) == 2 and set(ada) < set(both)  # bob got a worker of his own, not ada's
        assert _post(base, probe, user="ada") == (200, {"logs": [], "result": "ada"})
        assert _post(base, probe) == (200, {"logs": [], "result": "anonymous"})
        assert len(workers.pids()) == 3 and set(both) < set(workers.pids())
        assert chosen == ["ada", "ada", "bob", "ada", "anonymous"]  # asked once per request, with its X-User
    finally:
        workers.close()


def test_one_runtime_serves_every_request(serve):
    workers = WorkerPool(size=2, spares=0)
    try:
        base, _ = serve(runtime=workers.domain("everyone"))
        probe = {"code": "return await tools.add({a: 1, b: 2})", "description": "adds"}
        assert _post(base, probe, user="ada") == (200, {"logs": [], "result": 3})
        first = workers.pids()
        assert len(first) == 1
        assert _post(base, probe, user="bob") == (200, {"logs": [], "result": 3})
        assert workers.pids() == first
    finally:
        workers.close()


@pytest.mark.parametrize("bad", ["pool", 3])
def test_a_runtime_that_is_neither_a_runtime_nor_callable_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="`runtime`"):
        flask_app.create_app(runtime=bad)

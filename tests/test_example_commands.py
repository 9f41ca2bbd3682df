"""Every example starts with the command its own docstring (or header comment) gives, typed
as a user types it in a shell from the repository root: a script's output is checked; a
server is started on a loopback port, answers a request, and is stopped.

The only change to a documented command is the port: Flask's ``flask run`` takes it from
``FLASK_RUN_PORT`` (the command stays as written); a Django command's ``127.0.0.1:8000``
becomes a free port. ``PYTHONPATH`` names this checkout, as ``pip install -e .`` would.
"""

from __future__ import annotations

import ast
import contextlib
import html
import http.cookiejar
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
WAIT = 90
RUN_IT = re.compile(r"[Rr]un it from\s+the\s+repository\s+root[^:]*::\n\n {4}(?P<command>[^\n]+)")
RUN_IT_JS = re.compile(r"^// Run it from the repository root with: (?P<command>.+)$", re.M)


def documented(name: str) -> str:
    """The run command in the example's own docstring (a .py) or header comment (a .js)."""
    path = EXAMPLES / name
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".js":
        found = RUN_IT_JS.search(text)
    else:
        found = RUN_IT.search(ast.get_docstring(ast.parse(text)) or "")
    assert found, f"{name} says how to run it"
    return found.group("command").strip()


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)


def shell(command: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=_env(**env), capture_output=True, text=True, timeout=WAIT, check=False
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def server(command: str, port: int, **env: str):
    """The command running in its own process group until the block ends; yields its base URL once it listens."""
    log = open(os.devnull, "w")  # noqa: SIM115  (closed below)
    process = subprocess.Popen(
        ["bash", "-c", command], cwd=ROOT, env=_env(**env), stdout=log, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + WAIT
        while True:
            if process.poll() is not None:
                raise AssertionError(f"{command!r} exited with {process.returncode}: {process.stderr.read()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            assert time.monotonic() < deadline, f"{command!r} did not listen on {port}"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)  # the shell and the server it started
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
        process.stderr.close()
        log.close()


def on_port(command: str, port: int) -> str:
    """A Django command with its documented ``127.0.0.1:8000`` moved to ``port``."""
    assert command.count("127.0.0.1:8000") == 1, command
    return command.replace("127.0.0.1:8000", f"127.0.0.1:{port}")


def request(url: str, body: object = None, *, opener=None, headers=None, method=None):
    """(status, decoded JSON or text) of one request; an HTTP error status is an answer too."""
    data = None if body is None else json.dumps(body).encode()
    heads = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data, heads, method=method or ("POST" if data is not None else "GET"))
    try:
        with (opener or urllib.request.build_opener()).open(req, timeout=WAIT) as response:
            status, raw, kind = response.status, response.read(), response.headers.get_content_type()
    except urllib.error.HTTPError as error:
        status, raw, kind = error.code, error.read(), error.headers.get_content_type()
    text = raw.decode("utf-8")
    return status, json.loads(text) if kind == "application/json" else text


# -- scripts ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("agent_loop.py", "audit log: 1 direct call(s) and 12 sub-calls as tool_call events"),
        ("anthropic_agent_loop.py", "audit log: 1 direct call(s) and 12 sub-calls"),
        ("mcp_fanout.py", '"order_id": "PO-1001"'),
        ("tools.py", '"largest": "Shanghai"'),
        ("fanout.js", '"total_population": 151216015'),
        ("notes.js", "saved note 1: spring trip"),
        ("errors.js", "skipping Atlantis: lookup_city failed"),
    ],
)
def test_a_script_runs_with_its_documented_command(name, says):
    command = documented(name)
    done = shell(command)
    assert done.returncode == 0, (command, done.stderr)
    assert says in done.stdout + done.stderr, (command, done.stdout, done.stderr)


def test_the_main_job_is_what_tools_py_and_fanout_js_say():
    assert (
        documented("tools.py")
        == documented("fanout.js")
        == ("nous-sched run examples/fanout.js --tools examples/tools.py")
    )


def test_the_mcp_server_answers_on_stdio_with_its_documented_command():
    command = documented("mcp_server.py")
    assert command == "python examples/mcp_server.py"
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=ROOT,
        env=_env(),
        input=json.dumps(hello) + "\n",
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    (answer,) = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert answer["id"] == 1 and answer["result"]["serverInfo"]["name"], (answer, done.stderr)


# -- Flask -----------------------------------------------------------------------------------------


def test_flask_app_serves_with_its_documented_command():
    command = documented("flask_app.py")
    assert command == "flask --app examples/flask_app.py run"
    port = free_port()
    with server(command, port, FLASK_RUN_PORT=str(port)) as base:
        status, body = request(
            base + "/run",
            {"code": "return await tools.whoami({})", "description": "who am I"},
            headers={"X-User": "ada"},
        )
    assert status == 200 and body["result"]["user"] == "ada", body


def test_flask_events_serves_with_its_documented_command():
    command = documented("flask_events.py")
    assert command == "flask --app examples/flask_events.py run"
    port = free_port()
    with server(command, port, FLASK_RUN_PORT=str(port)) as base:
        status, form = request(base + "/")
        assert status == 200 and '<button id="run">Run</button>' in form
        status, started = request(base + "/runs", {"code": "console.log('hi'); return 42", "description": "d"})
        assert status == 200, started
        status, page = request(f"{base}/runs/{started['id']}")
        assert status == 200 and "data-run=" in page
        status, stream = request(f"{base}/runs/{started['id']}/events")
    events = [json.loads(line[len("data: ") :]) for line in stream.splitlines() if line.startswith("data: ")]
    assert [e["kind"] for e in events] == ["log", "end"] and events[-1]["data"]["answer"] == {
        "logs": ["hi"],
        "result": 42,
    }, events


def test_asgi_events_serves_with_its_documented_command():
    # uvicorn takes the port from UVICORN_PORT (its options' environment prefix): the command stays as written.
    command = documented("asgi_events.py")
    assert command == "uvicorn --app-dir examples asgi_events:app"
    port = free_port()
    with server(command, port, UVICORN_PORT=str(port)) as base:
        status, started = request(base + "/runs", {"code": "console.log('hi'); return 42", "description": "d"})
        assert status == 200, started
        status, stream = request(f"{base}/runs/{started['id']}/events")
        assert status == 200
        status, agui = request(f"{base}/runs/{started['id']}/agui")
    events = [json.loads(line[len("data: ") :]) for line in stream.splitlines() if line.startswith("data: ")]
    assert [e["kind"] for e in events] == ["log", "end"] and events[-1]["data"]["answer"] == {
        "logs": ["hi"],
        "result": 42,
    }, events
    types = [json.loads(line[len("data: ") :])["type"] for line in agui.splitlines() if line.startswith("data: ")]
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED", types


# -- Django ----------------------------------------------------------------------------------------

PROGRAM = """
const order = await tools.lookup_order({id: "A-1"});
const refund = await tools.refund({id: order.id, amount: order.total / 2});
console.log("refunded", refund.refunded);
return refund;
"""


def test_django_approvals_through_its_documented_runserver(tmp_path):
    """202 from the server, the approval from another process, 200 on resume, then 409."""
    command = documented("django_approvals/app.py")
    assert "DJANGO_SETTINGS_MODULE=app python -m django runserver --noreload" in command
    store = str(tmp_path / "approvals.db")
    ledger = tmp_path / "refunds.jsonl"
    port = free_port()
    assert "NOUS_APPROVAL_STORE=/tmp/approvals.db " in command
    command = on_port(command, port).replace("/tmp/approvals.db", store)  # this test's own store
    with server(command, port, NOUS_REFUND_LEDGER=str(ledger)) as base:
        status, first = request(base + "/runs", {"code": PROGRAM, "description": "refund half"})
        assert status == 202, first
        (pending,) = first["suspended"]["pending"]
        token = first["suspended"]["token"]
        assert pending["tool"] == "refund" and not ledger.exists()

        approve = documented("django_approvals/approve.py")
        assert approve == (
            "NOUS_APPROVAL_STORE=/tmp/approvals.db python examples/django_approvals/approve.py TOKEN SEQ"
        )
        filled = approve.replace("TOKEN", token).replace("SEQ", str(pending["seq"]))
        done = shell(filled.replace("/tmp/approvals.db", store))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"status": 200, "body": {"decided": pending["seq"], "approved": True}}

        status, third = request(f"{base}/runs/{token}/resume", {})
        assert (status, third) == (200, {"logs": ["refunded 20"], "result": {"refunded": 20, "order": "A-1"}})
        assert ledger.read_text().splitlines() == ['{"id": "A-1", "amount": 20}']
        status, again = request(f"{base}/runs/{token}/resume", {})
        assert status == 409 and "already used" in again["error"]


def _csrf_opener(base: str):
    """An opener with a cookie jar, and the CSRF token Django gave it in a cookie."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    return opener, jar


def test_django_live_serves_with_its_documented_runserver():
    command = documented("django_live.py")
    assert "DJANGO_SETTINGS_MODULE=django_live python -m django runserver --noreload" in command
    port = free_port()
    token = "t" * 32
    with server(on_port(command, port), port) as base:
        csrf = {"Cookie": f"csrftoken={token}", "X-CSRF-Token": token}
        status, refused = request(base + "/runs", {"code": "return 1"})
        assert status == 403, refused  # Django's CSRF check is on
        status, started = request(base + "/runs", {"code": "return 1", "description": "one"}, headers=csrf)
        assert status == 200, started
        status, page = request(f"{base}/runs/{started['id']}", headers=csrf)
        assert status == 200 and "data-run=" in page
        status, stream = request(f"{base}/runs/{started['id']}/events")
    assert '"kind": "end"' in stream or '"kind":"end"' in stream, stream


# -- the Django guide's project (docs/django.rst includes its files) -------------------------------

PROJECT = EXAMPLES / "django_project"


def test_the_guides_project_runs_with_its_documented_commands(tmp_path):
    command = documented("django_project/manage.py")
    assert command.startswith("cd examples/django_project && python manage.py migrate && ")
    port = free_port()
    with server(on_port(command, port), port, MYSITE_DB=str(tmp_path / "db.sqlite3")) as base:
        opener, jar = _csrf_opener(base)
        status, form = request(base + "/", opener=opener)
        assert status == 200 and '<button id="run">Run</button>' in form
        (cookie,) = [c.value for c in jar if c.name == "csrftoken"]
        (header,) = re.findall(r'"X-CSRF-Token": "([^"]+)"', form)
        csrf = {"X-CSRF-Token": header}

        status, refused = request(base + "/run", {"code": "return 1", "description": "no token"}, opener=opener)
        assert status == 403, refused
        program = "return [await tools.whoami({}), await tools.count_users({})]"
        status, ran = request(base + "/run", {"code": program, "description": "who"}, opener=opener, headers=csrf)
        assert (status, ran) == (200, {"logs": [], "result": [{"user_id": None}, 0]})
        assert cookie and header != cookie  # the header carries the masked form of the cookie's secret

        write = "return await tools.write({text: 'hi'})"
        status, started = request(base + "/runs", {"code": write, "description": "a note"}, opener=opener, headers=csrf)
        assert status == 200, started
        run = f"{base}/runs/{started['id']}"
        status, page = request(run, opener=opener)
        assert status == 200 and 'data-run="{&quot;id&quot;' in page
        data = json.loads(html.unescape(re.search(r'data-run="([^"]*)"', page).group(1)))
        call_id = _asked(run + "/events")
        status, refused = request(run + "/decisions", {"call_id": call_id, "approved": True}, opener=opener)
        assert status == 403, refused  # the page's token is needed
        headers = {"X-CSRF-Token": data["csrf"]}
        status, answered = request(
            run + "/decisions", {"call_id": call_id, "approved": True}, opener=opener, headers=headers
        )
        assert (status, answered) == (200, {"answered": call_id})
        status, stream = request(run + "/events")
    end = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith("data: ")][-1]
    assert end["kind"] == "end" and end["data"]["answer"]["result"] == {"wrote": "hi"}, end


def _asked(events_url: str) -> str:
    """The call id of the first approval asked in the run's event stream (read as it arrives)."""
    with urllib.request.urlopen(events_url, timeout=WAIT) as response:
        for raw in response:
            line = raw.decode("utf-8").strip()
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event["kind"] == "approval" and event["data"]["state"] == "asked":
                    return str(event["data"]["call_id"])
    raise AssertionError("no approval was asked")


def test_the_guides_project_page_is_the_flask_examples_page():
    source = (EXAMPLES / "flask_events.py").read_text(encoding="utf-8")
    (page,) = [
        ast.literal_eval(node.value)
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "PAGE"
    ]
    template = (PROJECT / "myapp" / "templates" / "myapp" / "run.html").read_text(encoding="utf-8")
    assert template == page.replace('data-run="__RUN__"', 'data-run="{{ data }}"')


def test_the_guide_includes_the_projects_files_and_shows_no_code_of_its_own(tmp_path):
    guide = (ROOT / "docs" / "django.rst").read_text(encoding="utf-8")
    included = set(re.findall(r"^\.\. literalinclude:: (\S+)$", guide, re.M))
    for name in ("myapp/views.py", "myapp/tools.py", "myapp/live.py", "myapp/urls.py", "mysite/settings.py"):
        assert f"../examples/django_project/{name}" in included, name
    assert "../examples/django_approvals/app.py" in included
    assert ".. code-block:: python" not in guide  # every line of Python in it is a file the tests run
    # The guide on its own, built by Sphinx with warnings as errors: every include resolves.
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.rst").write_text(guide, encoding="utf-8")
    (tmp_path / "examples").symlink_to(EXAMPLES)
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-q", "-C", "-D", "master_doc=index", "-b", "text"]
        + [str(tmp_path / "docs"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "out" / "index.txt").read_text(encoding="utf-8")
    for shown in (
        "def django_dispatch(tool, args, run_ctx):",
        'path("runs", live.start)',
        'CSRF_HEADER_NAME = "HTTP_X_CSRF_TOKEN"',
    ):
        assert shown in text, shown

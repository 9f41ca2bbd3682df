"""examples/flask_events.py in a real headless Chromium (the distribution's
``chromium`` and ``chromedriver``, driven by selenium), the app on a real HTTP
server on 127.0.0.1.

The page is checked *while the run is still going*: the tool blocks on an
event that only the test sets, after it has seen the page show the call
running and the first log line.
"""

from __future__ import annotations

import html
import importlib.util
import json
import os
import pathlib
import shutil
import threading
import urllib.request

import pytest

pytest.importorskip("flask")
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402
from werkzeug.serving import make_server  # noqa: E402

from nous_sched import PermissionPolicy, SqliteApprovalStore, Tool  # noqa: E402

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "flask_events.py"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WAIT = 60

pytestmark = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)), reason="needs chromium and chromedriver"
)


def _load_example():
    spec = importlib.util.spec_from_file_location("nous_sched_flask_events_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


flask_events = _load_example()


@pytest.fixture
def serve():
    """``serve(**create_app_options) -> base_url``: the app on 127.0.0.1, shut down at the end."""
    running = []

    def start(**options):
        app = flask_events.create_app(**options)
        start.apps.append(app)  # the last app made: its runs are app.config["NOUS_SCHED_RUNS"]
        httpd = make_server("127.0.0.1", 0, app, threaded=True)
        thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="test-flask-events", daemon=True
        )
        thread.start()
        running.append((httpd, thread))
        return f"http://127.0.0.1:{httpd.server_port}"

    start.apps = []
    yield start
    for httpd, thread in running:
        httpd.shutdown()
        thread.join(10)


@pytest.fixture
def browser(tmp_path):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=WAIT) as response:
        return json.loads(response.read())


def _text(driver, element_id):
    return driver.find_element(By.ID, element_id).text


def _part(driver, row_id, cls):
    return driver.find_element(By.ID, row_id).find_element(By.CLASS_NAME, cls).text


CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _lookup(args):
    if args["city"] == "Atlantis":
        raise LookupError("no city named <b id=injected>Atlantis</b>")
    return {"city": args["city"], "population": len(args["city"])}


LOOKUP = Tool(name="population", function=_lookup, description="p", parameters=CITY, concurrency_safe=lambda a: True)


def test_the_page_shows_calls_and_logs_while_the_run_is_still_going(serve, browser, make_event):
    release = make_event()
    started = make_event()

    def slow(args):
        started.set()
        assert release.wait(WAIT)
        return {"n": args["n"]}

    def quick(args):
        return {"n": args["n"]}

    tools = [
        Tool(name="quick", function=quick, description="q"),
        Tool(name="slow", function=slow, description="s"),
    ]
    base = serve(tools=tools)
    code = (
        'console.log("starting"); const a = await tools.quick({n: 1});'
        'console.log("quick done"); const b = await tools.slow({n: 2});'
        'console.log("slow done"); return [a, b]'
    )
    run_id = _post(base + "/runs", {"code": code, "description": "a quick call then a slow one"})["id"]
    browser.get(f"{base}/runs/{run_id}")
    wait = WebDriverWait(browser, WAIT)

    # While the slow call is blocked: the page shows it running, the quick one committed, the first logs.
    wait.until(lambda d: "running" in _part(d, "call-1", "head"))
    assert started.is_set() and not release.is_set()
    assert _part(browser, "call-0", "head") == "#0 quick: ok"
    assert _part(browser, "call-0", "outcome").startswith("ok in ")
    assert ' ms: {"n":1}' in _part(browser, "call-0", "outcome")  # then how long it waited, if it did
    assert _part(browser, "call-1", "head") == "#1 slow: running"
    assert _part(browser, "call-1", "args") == "n = 2 (1 chars)"
    assert _part(browser, "call-1", "how") == "exclusive (no concurrency_safe predicate)"
    assert browser.find_element(By.ID, "call-1").get_attribute("class") == "call running"
    wait.until(lambda d: "quick done" in _text(d, "logs"))
    assert _text(browser, "logs").splitlines() == ["starting", "quick done"]
    assert _text(browser, "status") == "running"

    release.set()
    wait.until(lambda d: _text(d, "status") == "done")
    assert _part(browser, "call-1", "head") == "#1 slow: ok"
    assert _text(browser, "logs").splitlines() == ["starting", "quick done", "slow done"]
    assert json.loads(_text(browser, "result")) == [{"n": 1}, {"n": 2}]


def test_the_page_shows_the_description_arguments_durations_errors_refusals_and_value(serve, browser):
    base = serve(tools=[LOOKUP])
    code = (
        "const r = await Promise.allSettled(['Paris', 'Atlantis'].map(city => tools.population({city})));"
        "try { await tools.population({}); } catch (e) {}"
        "try { await tools.nowhere({}); } catch (e) {}"
        "return {settled: r.map(x => x.status), long: 'x'.repeat(1000)}"
    )
    description = "looks up <i>two</i> cities & one that is not"
    run_id = _post(base + "/runs", {"code": code, "description": description})["id"]
    browser.get(f"{base}/runs/{run_id}")
    WebDriverWait(browser, WAIT).until(lambda d: _text(d, "status") == "done")
    assert browser.title == description and _text(browser, "title") == description
    assert _part(browser, "call-0", "args") == 'city = "Paris" (7 chars)'
    assert _part(browser, "call-1", "args") == 'city = "Atlantis" (10 chars)'
    assert _part(browser, "call-0", "how") == "parallel"
    paris = _part(browser, "call-0", "outcome")
    assert paris.startswith("ok in ") and ' ms: {"city":"Paris","population":5}' in paris
    atlantis = _part(browser, "call-1", "outcome")
    assert atlantis.startswith("error (tool_error) after ") and "no city named <b id=injected>Atlantis</b>" in atlantis
    assert browser.find_element(By.ID, "call-1").get_attribute("class") == "call error"
    refused = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#refused li")]
    assert len(refused) == 2
    assert refused[0].startswith("population: refused (schema): ") and "city" in refused[0]
    assert refused[1].startswith('nowhere: refused (unknown): unknown tool "nowhere"')
    returned = json.loads(_text(browser, "result"))
    assert returned == {"settled": ["fulfilled", "rejected"], "long": "x" * 1000}
    assert browser.find_elements(By.ID, "injected") == [] and browser.find_elements(By.TAG_NAME, "i") == []


def _approval_app(serve, **options):
    policy = PermissionPolicy(require_approval={"population"})
    return serve(tools=[LOOKUP], policy=policy, **options)


APPROVAL_PROGRAM = (
    'try { const r = await tools.population({city: "Lima"}); return {ok: r.population}; }'
    " catch (e) { return {denied: e.message}; }"
)


def test_a_person_clicks_approve_and_the_run_finishes(serve, browser):
    base = _approval_app(serve)
    run_id = _post(base + "/runs", {"code": APPROVAL_PROGRAM, "description": "one call that needs approval"})["id"]
    browser.get(f"{base}/runs/{run_id}")
    wait = WebDriverWait(browser, WAIT)
    wait.until(lambda d: d.find_elements(By.ID, "approve-0"))
    assert _part(browser, "call-0", "head") == "#0 population: waiting for approval"
    question = _part(browser, "call-0", "question")
    assert 'A program wants to call the tool "population".' in question and '"city": "Lima"' in question
    assert _text(browser, "status") == "running"
    browser.find_element(By.ID, "approve-0").click()
    wait.until(lambda d: _text(d, "status") == "done")
    assert json.loads(_text(browser, "result")) == {"ok": 4}
    assert _part(browser, "call-0", "approval") == "approved"
    assert _part(browser, "call-0", "head") == "#0 population: ok"


def test_a_person_clicks_deny_and_the_program_sees_the_denial(serve, browser):
    base = _approval_app(serve)
    run_id = _post(base + "/runs", {"code": APPROVAL_PROGRAM, "description": "one call that needs approval"})["id"]
    browser.get(f"{base}/runs/{run_id}")
    wait = WebDriverWait(browser, WAIT)
    wait.until(lambda d: d.find_elements(By.ID, "deny-0"))
    browser.find_element(By.ID, "deny-0").click()
    wait.until(lambda d: _text(d, "status") == "done")
    assert json.loads(_text(browser, "result")) == {"denied": 'tool "population" was rejected by the approval handler'}
    outcome = _part(browser, "call-0", "outcome")
    assert outcome.startswith("error (denied)") and "rejected by the approval handler" in outcome


def test_a_durable_run_suspends_and_the_page_approval_resumes_it(serve, browser, tmp_path):
    store = SqliteApprovalStore(str(tmp_path / "approvals.db"))
    base = _approval_app(serve, approval_store=store)
    run_id = _post(base + "/runs", {"code": APPROVAL_PROGRAM, "description": "a durable approval"})["id"]
    browser.get(f"{base}/runs/{run_id}")
    wait = WebDriverWait(browser, WAIT)
    wait.until(lambda d: _text(d, "status") == "waiting for approval")
    assert '"city": "Lima"' in _part(browser, "pending-0", "question")
    browser.find_element(By.ID, "approve-0").click()
    wait.until(lambda d: d.current_url.split("/")[-1] != run_id and _text(d, "status") == "done")
    assert json.loads(_text(browser, "result")) == {"ok": 4}
    assert _text(browser, "title") == "a durable approval"
    app_runs = serve.apps[-1].config["NOUS_SCHED_RUNS"]
    resumed = app_runs[browser.current_url.split("/")[-1]]["run"].result(timeout=WAIT)
    decisions = [dict(e.data) for e in resumed.audit if e.type == "approval"]
    assert decisions == [{"seq": 0, "tool": "population", "approved": True, "reason": "approved on the page"}]


def _post_raw(url, body, headers):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=WAIT) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _sse_events(chunks):
    """The events of an SSE body's chunks, as they come: each chunk holds whole ``data:`` messages."""
    for chunk in chunks:
        for block in chunk.decode().split("\n\n"):
            if block:
                assert block.startswith("data: ") and "\n" not in block
                yield json.loads(block[len("data: ") :])


def test_a_decision_without_the_pages_csrf_token_is_refused_and_the_audit_has_the_real_one(make_event):
    policy = PermissionPolicy(require_approval={"population"})
    app = flask_events.create_app(tools=[LOOKUP], policy=policy)
    client = app.test_client()
    run_id = client.post("/runs", json={"code": APPROVAL_PROGRAM, "description": "d"}).get_json()["id"]
    page = client.get(f"/runs/{run_id}").get_data(as_text=True)
    data = json.loads(html.unescape(page.split('data-run="', 1)[1].split('"', 1)[0]))
    assert data["id"] == run_id and data["description"] == "d"
    events = client.get(f"/runs/{run_id}/events", buffered=False).response
    asked = None
    for event in _sse_events(events):  # a chunk is a batch of events (one write per batch)
        if event["kind"] == "approval" and event["data"]["state"] == "asked":
            asked = event["data"]
            break
    body = {"seq": 0, "call_id": asked["call_id"], "approved": True}
    assert client.post(f"/runs/{run_id}/decisions", json=body).status_code == 403
    forged = client.post(f"/runs/{run_id}/decisions", json=body, headers={"X-CSRF-Token": "guess"})
    assert forged.status_code == 403
    other = dict(body, call_id="run_code-other:code:0")
    assert (
        client.post(f"/runs/{run_id}/decisions", json=other, headers={"X-CSRF-Token": data["csrf"]}).status_code == 409
    )
    ok = client.post(f"/runs/{run_id}/decisions", json=body, headers={"X-CSRF-Token": data["csrf"]})
    assert ok.status_code == 200
    kinds = [event["kind"] for event in _sse_events(events)]
    assert kinds[-1] == "end"
    result = app.config["NOUS_SCHED_RUNS"][run_id]["run"].result(timeout=WAIT)
    assert result.result == {"ok": 4}
    approvals = [e for e in result.events if e.type == "approval"]
    assert [(e.seq, e.approved) for e in approvals] == [(0, True)]


def test_the_page_writes_model_text_as_text_never_html(serve, browser):
    base = serve(tools=[])
    code = 'console.log("<b id=injected>x</b>"); console.log("lone \\ud800 surrogate"); return "<i>v</i>"'
    run_id = _post(base + "/runs", {"code": code, "description": "<b id=title-injected>d</b> \udc00"})["id"]
    browser.get(f"{base}/runs/{run_id}")
    WebDriverWait(browser, WAIT).until(lambda d: _text(d, "status") == "done")
    assert _text(browser, "logs").splitlines()[0] == "<b id=injected>x</b>"
    # U+FFFD, as every JSON the library writes has it (nous_sched/_text.py), and the stream went on
    assert _text(browser, "logs").splitlines()[1] == "lone \ufffd surrogate"
    assert json.loads(_text(browser, "result")) == "<i>v</i>"
    assert _text(browser, "title").startswith("<b id=title-injected>d</b>")
    assert browser.find_elements(By.ID, "injected") == [] and browser.find_elements(By.ID, "title-injected") == []


def test_the_form_starts_a_run_and_opens_its_page(serve, browser):
    base = serve(tools=[Tool(name="population", function=lambda a: {"city": a["city"], "population": 1})])
    browser.get(base + "/")
    browser.find_element(By.ID, "run").click()
    WebDriverWait(browser, WAIT).until(lambda d: _text(d, "status") == "done")
    assert [_part(browser, f"call-{i}", "head") for i in range(4)] == [f"#{i} population: ok" for i in range(4)]
    assert "looking up 4 cities" in _text(browser, "logs")
    assert _text(browser, "title") == "looks up the population of four cities"


def test_event_stream_is_server_sent_events_ending_with_end(serve):
    base = serve(tools=[])
    run_id = _post(base + "/runs", {"code": 'console.log("hi"); return 2', "description": "d"})["id"]
    with urllib.request.urlopen(f"{base}/runs/{run_id}/events", timeout=WAIT) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        body = response.read().decode()
    messages = [json.loads(block[len("data: ") :]) for block in body.strip().split("\n\n")]
    assert [m["kind"] for m in messages] == ["log", "end"]
    assert messages[-1]["data"]["answer"] == {"logs": ["hi"], "result": 2}
    with urllib.request.urlopen(f"{base}/runs/{run_id}/agui", timeout=WAIT) as response:
        agui = [json.loads(b[len("data: ") :]) for b in response.read().decode().strip().split("\n\n")]
    assert agui[0]["type"] == "RUN_STARTED" and agui[-1]["type"] == "RUN_FINISHED"
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{base}/runs/nope/events", timeout=WAIT)
    assert missing.value.code == 404

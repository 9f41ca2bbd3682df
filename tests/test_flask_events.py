"""examples/flask_events.py in a real headless Chromium (the distribution's
``chromium`` and ``chromedriver``, driven by selenium), the app on a real HTTP
server on 127.0.0.1.

The page is checked *while the run is still going*: the tool blocks on an
event that only the test sets, after it has seen the page show the call
running and the first log line.
"""

from __future__ import annotations

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

from nous_sched import Tool  # noqa: E402

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
        httpd = make_server("127.0.0.1", 0, flask_events.create_app(**options), threaded=True)
        thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="test-flask-events", daemon=True
        )
        thread.start()
        running.append((httpd, thread))
        return f"http://127.0.0.1:{httpd.server_port}"

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
    wait.until(lambda d: "running" in _text(d, "call-1"))
    assert started.is_set() and not release.is_set()
    assert _text(browser, "call-0") == "#0 quick: ok (7 chars)"
    assert _text(browser, "call-1") == "#1 slow: running"
    assert browser.find_element(By.ID, "call-1").get_attribute("class") == "running"
    wait.until(lambda d: "quick done" in _text(d, "logs"))
    assert _text(browser, "logs").splitlines() == ["starting", "quick done"]
    assert _text(browser, "status") == "running"

    release.set()
    wait.until(lambda d: _text(d, "status") == "done")
    assert _text(browser, "call-1") == "#1 slow: ok (7 chars)"
    assert _text(browser, "logs").splitlines() == ["starting", "quick done", "slow done"]


def test_the_page_writes_model_text_as_text_never_html(serve, browser):
    base = serve(tools=[])
    run_id = _post(base + "/runs", {"code": 'console.log("<b id=injected>x</b>"); return 1', "description": "d"})["id"]
    browser.get(f"{base}/runs/{run_id}")
    WebDriverWait(browser, WAIT).until(lambda d: _text(d, "status") == "done")
    assert _text(browser, "logs") == "<b id=injected>x</b>"
    assert browser.find_elements(By.ID, "injected") == []


def test_the_form_starts_a_run_and_opens_its_page(serve, browser):
    base = serve(tools=[Tool(name="population", function=lambda a: {"city": a["city"], "population": 1})])
    browser.get(base + "/")
    browser.find_element(By.ID, "run").click()
    WebDriverWait(browser, WAIT).until(lambda d: _text(d, "status") == "done")
    assert [f"#{i} population: ok" in _text(browser, f"call-{i}") for i in range(4)] == [True] * 4
    assert "looking up 4 cities" in _text(browser, "logs")


def test_event_stream_is_server_sent_events_ending_with_end(serve):
    base = serve(tools=[])
    run_id = _post(base + "/runs", {"code": 'console.log("hi"); return 2', "description": "d"})["id"]
    with urllib.request.urlopen(f"{base}/runs/{run_id}/events", timeout=WAIT) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        body = response.read().decode()
    messages = [json.loads(block[len("data: ") :]) for block in body.strip().split("\n\n")]
    assert [m["kind"] for m in messages] == ["log", "end"]
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{base}/runs/nope/events", timeout=WAIT)
    assert missing.value.code == 404

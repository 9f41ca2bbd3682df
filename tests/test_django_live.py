"""examples/django_live.py, the live page served by Django (docs/django.rst's views): a real
threaded WSGI server in its own process, real headless Chromium, Django's own CSRF middleware."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

pytest.importorskip("django")
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WAIT = 60
SERVER = """
import sys
from werkzeug.serving import make_server
import django_live
from django.core.wsgi import get_wsgi_application
server = make_server("127.0.0.1", 0, get_wsgi_application(), threaded=True)
print(server.server_port, flush=True)
server.serve_forever(poll_interval=0.05)
"""
PROGRAM = 'try { return await tools.write({text: "hi <b>there</b>"}); } catch (e) { return {denied: e.message}; }'

pytestmark = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)), reason="needs chromium and chromedriver"
)


@pytest.fixture(scope="module")
def base():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "examples"), str(ROOT)]))
    process = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT / "examples"
    )
    try:
        port = process.stdout.readline().strip()
        assert port.isdigit(), port
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(30)
        process.stdout.close()


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


def _start(base, description):
    """POST /runs as a page of the site would: Django's CSRF cookie and the same token in the header."""
    body = json.dumps({"code": PROGRAM, "description": description}).encode()
    token = "a" * 32
    headers = {"Content-Type": "application/json", "Cookie": f"csrftoken={token}", "X-CSRF-Token": token}
    request = urllib.request.Request(base + "/runs", body, headers)
    with urllib.request.urlopen(request, timeout=WAIT) as response:
        return json.loads(response.read())["id"]


def _text(driver, element_id):
    return driver.find_element(By.ID, element_id).text


def _waiting(browser, base, run_id):
    browser.get(f"{base}/runs/{run_id}")
    wait = WebDriverWait(browser, WAIT)
    wait.until(lambda d: d.find_elements(By.ID, "approve-0"))
    return wait


def test_a_person_approves_on_the_django_page_and_the_run_finishes(base, browser):
    run_id = _start(base, "writes a <i>note</i>")
    wait = _waiting(browser, base, run_id)
    assert browser.title == "writes a <i>note</i>" and browser.find_elements(By.TAG_NAME, "i") == []
    assert browser.find_element(By.ID, "call-0").find_element(By.CLASS_NAME, "args").text == (
        'text = "hi <b>there</b>" (17 chars)'
    )
    browser.find_element(By.ID, "approve-0").click()
    wait.until(lambda d: _text(d, "status") == "done")
    assert json.loads(_text(browser, "result")) == {"wrote": "hi <b>there</b>"}


def test_a_person_denies_on_the_django_page_and_the_program_sees_it(base, browser):
    run_id = _start(base, "writes a note")
    wait = _waiting(browser, base, run_id)
    browser.find_element(By.ID, "deny-0").click()
    wait.until(lambda d: _text(d, "status") == "done")
    assert json.loads(_text(browser, "result")) == {"denied": 'tool "write" was rejected by the approval handler'}


def test_a_decision_without_djangos_csrf_token_is_refused(base, browser):
    run_id = _start(base, "writes a note")
    wait = _waiting(browser, base, run_id)
    call_id = browser.execute_script("return JSON.parse(document.body.dataset.run).id")
    assert call_id == run_id
    forged = urllib.request.Request(
        f"{base}/runs/{run_id}/decisions",
        json.dumps({"seq": 0, "call_id": "any", "approved": True}).encode(),
        {"Content-Type": "application/json", "X-CSRF-Token": "forged"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(forged, timeout=WAIT)
    assert refused.value.code == 403
    unasked = urllib.request.Request(base + "/runs", json.dumps({"code": "return 1"}).encode(), {})
    with pytest.raises(urllib.error.HTTPError) as no_token:
        urllib.request.urlopen(unasked, timeout=WAIT)
    assert no_token.value.code == 403
    assert _text(browser, "status") == "running"  # the call still waits: the page answers it
    browser.find_element(By.ID, "approve-0").click()
    wait.until(lambda d: _text(d, "status") == "done")


def test_a_person_grants_the_next_calls_on_the_django_page(base, browser):
    # Grants (issue 41): the page's "Approve N" answers with a Grant of N calls in all.
    run_id = _start(base, "writes a note")
    wait = _waiting(browser, base, run_id)
    count = browser.find_element(By.ID, "grant-calls-0")
    count.clear()
    count.send_keys("3")
    browser.find_element(By.ID, "approve-many-0").click()
    wait.until(lambda d: _text(d, "status") == "done")
    assert json.loads(_text(browser, "result")) == {"wrote": "hi <b>there</b>"}
    assert browser.find_element(By.ID, "call-0").find_element(By.CLASS_NAME, "approval").text == "approved (grant g0)"

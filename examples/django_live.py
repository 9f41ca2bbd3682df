"""The live page of ``examples/flask_events.py`` served by Django (``docs/django.rst``'s views, runnable).

``POST /runs`` starts a run, ``GET /runs/<id>`` is the page (the Flask
example's ``PAGE``, its data escaped into one attribute), ``/runs/<id>/events``
its events as Server-Sent Events, ``/runs/<id>/agui`` the same in AG-UI, and
``POST /runs/<id>/decisions`` answers a call waiting for approval through an
:class:`nous_sched.ApprovalDesk`, under Django's own CSRF protection
(``CsrfViewMiddleware``: the page sends the token it was given in
``X-CSRF-Token``). Needs Django (the ``web`` extra). Run it from the
repository root with::

    cd examples && DJANGO_SETTINGS_MODULE=django_live python -m django runserver --noreload 127.0.0.1:8000

then POST a program to ``/runs`` with Django's CSRF cookie and the same token
in ``X-CSRF-Token`` (as a page of your site would) and open
``http://127.0.0.1:8000/runs/<id>``; ``examples/django_project`` is these
views in a whole project, with a form at ``/``. This one file is the app and
its settings: Django reads the upper-case names below as the settings module;
imported any other way (a test, a WSGI server of your own), it configures
Django with them itself.
"""

from __future__ import annotations

import ast
import html
import json
import os
import pathlib
import secrets
import threading
from typing import Any

import django
from django.conf import settings
from django.http import Http404, HttpResponse, JsonResponse, StreamingHttpResponse
from django.middleware.csrf import get_token
from django.urls import path
from django.views.decorators.http import require_GET, require_POST

from nous_sched import ApprovalDesk, PermissionPolicy, Run, Tool, agui, start_run
from nous_sched.gate.grants import requested

DEBUG = False
SECRET_KEY = "example-only"
ROOT_URLCONF = __name__
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]", "testserver"]
MIDDLEWARE = ["django.middleware.csrf.CsrfViewMiddleware"]
CSRF_HEADER_NAME = "HTTP_X_CSRF_TOKEN"  # the header the page sends its token in
INSTALLED_APPS: list[str] = []
DATABASES: dict[str, dict[str, str]] = {}

# Loaded as the settings module, Django reads the names above itself; otherwise
# (imported by a test or a WSGI server of your own) they configure it here.
if os.environ.get("DJANGO_SETTINGS_MODULE") != __name__ and not settings.configured:
    settings.configure(**{name: value for name, value in globals().items() if name.isupper()})
    django.setup()


def _flask_page() -> str:
    """The Flask example's PAGE, read from its source (without importing Flask)."""
    source = pathlib.Path(__file__).with_name("flask_events.py").read_text(encoding="utf-8")
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PAGE" for t in node.targets):
            return str(ast.literal_eval(node.value))
    raise LookupError("examples/flask_events.py has no PAGE")


#: The page: the Flask example's, shared (in an app of your own, a template).
PAGE = _flask_page()


def _write(args: dict[str, Any]) -> dict[str, Any]:
    return {"wrote": args["text"]}


TOOLS = [Tool("write", _write, description="Write a note.", parameters={"type": "object"})]
POLICY = PermissionPolicy(require_approval={"write"})
RUNS: dict[str, Run] = {}  # run id -> Run; keep only recent ones in a real deployment
RUNS_LOCK = threading.Lock()
DESK = ApprovalDesk()  # answers every run's approvals, told apart by call id


def _run(run_id: str) -> Run:
    with RUNS_LOCK:
        run = RUNS.get(run_id)
    if run is None:
        raise Http404("no such run")
    return run


@require_POST
def start(request: Any) -> JsonResponse:
    try:
        body = json.loads(request.body)
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("code"), str):
        return JsonResponse({"error": 'expected {"code": ..., "description": ...}'}, status=400)
    description = body.get("description") or "a program run from the browser"
    run = start_run(body["code"], TOOLS, description=str(description), policy=POLICY, approval_handler=DESK)
    run_id = secrets.token_urlsafe(8)
    with RUNS_LOCK:
        RUNS[run_id] = run
    return JsonResponse({"id": run_id})


@require_GET
def page(request: Any, run_id: str) -> HttpResponse:
    run = _run(run_id)
    # The page's data, all ASCII JSON, escaped into one attribute; its
    # JavaScript writes every string with textContent.
    data = {"id": run_id, "description": run.description, "csrf": get_token(request)}
    attribute = html.escape(json.dumps(data, ensure_ascii=True), quote=True)
    return HttpResponse(PAGE.replace("__RUN__", attribute), headers={"X-Frame-Options": "DENY"})


@require_GET
def events(request: Any, run_id: str) -> StreamingHttpResponse:
    run = _run(run_id)
    # One write per batch of ready events (a watcher's thread wakes once per batch), each watcher
    # at most 1,000 events behind (then a `gap`): a watcher that stops reading blocks only itself.
    stream = (
        "".join(f"data: {json.dumps(event.as_dict(), ensure_ascii=True)}\n\n" for event in batch)
        for batch in run.event_batches(buffer=1000)
    )
    response = StreamingHttpResponse(stream, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
    return response


@require_GET
def agui_events(request: Any, run_id: str) -> StreamingHttpResponse:
    """The same run in the AG-UI protocol, for agent front ends (the agui extra)."""
    return StreamingHttpResponse(agui.sse(_run(run_id)), content_type=agui.MEDIA_TYPE)


@require_POST  # under CsrfViewMiddleware: refused with 403 without the page's token
def decide(request: Any, run_id: str) -> JsonResponse:
    run = _run(run_id)
    try:
        body = json.loads(request.body)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return JsonResponse({"error": "expected a JSON object"}, status=400)
    call_id = str(body.get("call_id", ""))
    waiting = DESK.pending().get(call_id)
    answer: Any = body.get("approved") is True
    if answer and waiting is not None and body.get("grant") is not None:  # the page's Approve N / matching
        answer = requested(body["grant"], waiting.arguments, by="the page")
        if isinstance(answer, str):
            return JsonResponse({"error": answer}, status=400)
    if not call_id.startswith(run.call_id + ":code:") or not DESK.answer(call_id, answer):
        return JsonResponse({"error": "no such call waits for approval"}, status=409)
    return JsonResponse({"answered": call_id})


urlpatterns = [
    path("runs", start),
    path("runs/<str:run_id>", page),
    path("runs/<str:run_id>/events", events),
    path("runs/<str:run_id>/agui", agui_events),
    path("runs/<str:run_id>/decisions", decide),
]

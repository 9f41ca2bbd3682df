"""A Django app whose runs wait for a human's approval, across requests and processes.

Three requests, each of which any server process of the fleet may serve:

1. ``POST /runs`` with ``{"code", "description"}`` runs the program. When it
   reaches a call that needs approval (``refund``), the run suspends: the
   answer is **202** with the pending calls and the token.
2. ``POST /approvals/<token>/<seq>`` with ``{"approved": true, "reason": ...}``
   records an operator's decision in the approval store.
3. ``POST /runs/<token>/resume`` resumes the run by replay with the recorded
   decisions: **200** with the result (or 202 again, if it reached another
   gated call).

The approval store is a SQLite file (``NOUS_APPROVAL_STORE``), or a Redis URL
for servers on several machines. Needs Django (the ``web`` extra). Run it from
the repository root with::

    cd examples/django_approvals && NOUS_APPROVAL_STORE=/tmp/approvals.db DJANGO_SETTINGS_MODULE=app python -m django runserver --noreload 127.0.0.1:8000

and approve a waiting call from another process with ``approve.py`` (its
docstring says how).

This one file is the app and its settings: Django reads the upper-case names
below as the settings module (``DJANGO_SETTINGS_MODULE=app``); imported any
other way (a test, ``approve.py``), it configures Django with them itself.
"""

import json
import os

import django
from django.conf import settings
from django.http import JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

import nous_sched
from nous_sched import TokenError, Tool

DEBUG = False
SECRET_KEY = "example-only"
ROOT_URLCONF = __name__
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]", "testserver"]
MIDDLEWARE: list[str] = []
INSTALLED_APPS: list[str] = []
DATABASES: dict[str, dict[str, str]] = {}

# Loaded as the settings module, Django reads the names above itself; otherwise
# (imported by a test or approve.py) they configure it here.
if os.environ.get("DJANGO_SETTINGS_MODULE") != __name__ and not settings.configured:
    settings.configure(**{name: value for name, value in globals().items() if name.isupper()})
    django.setup()

ORDERS = {"A-1": {"id": "A-1", "total": 40, "customer": "ada"}}


def _lookup(args):
    return ORDERS.get(args["id"]) or {"missing": args["id"]}


def _refund(args):
    # A side effect an operator must approve; here, a line in a ledger file.
    with open(os.environ.get("NOUS_REFUND_LEDGER", os.devnull), "a", encoding="utf-8") as ledger:
        ledger.write(json.dumps(args) + "\n")
    return {"refunded": args["amount"], "order": args["id"]}


TOOLS = [
    Tool("lookup_order", _lookup, description="Look up an order by id.", parameters={"type": "object"}),
    Tool(
        "refund",
        _refund,
        description="Refund part of an order.",
        parameters={"type": "object"},
        requires_approval=True,
    ),
]


def store():
    where = os.environ.get("NOUS_APPROVAL_STORE", "approvals.db")
    if where.startswith("redis://"):
        return nous_sched.RedisApprovalStore(where)
    return nous_sched.SqliteApprovalStore(where)


def _answer(result):
    # 202: the run is waiting for approval; 200 otherwise (a failed program is data too).
    return JsonResponse(result.to_dict(), status=202 if result.suspended is not None else 200)


def _body(request):
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        body = None
    return body if isinstance(body, dict) else None


@csrf_exempt
@require_POST
def start(request):
    body = _body(request)
    if body is None or not isinstance(body.get("code"), str) or not isinstance(body.get("description"), str):
        return JsonResponse({"error": 'send {"code": ..., "description": ...}'}, status=400)
    result = nous_sched.run_code(body["code"], TOOLS, description=body["description"], approval_store=store())
    return _answer(result)


@csrf_exempt
@require_POST
def decide(request, token, seq):
    body = _body(request) or {}
    try:
        store().decide(token, seq, body.get("approved") is True, str(body.get("reason", "")))
    except (TokenError, nous_sched.ConfigError) as exc:
        return JsonResponse({"error": str(exc)}, status=409)
    return JsonResponse({"decided": seq, "approved": body.get("approved") is True})


@csrf_exempt
@require_POST
def resume(request, token):
    try:
        result = nous_sched.resume(token, {}, TOOLS, approval_store=store())
    except (TokenError, nous_sched.ConfigError) as exc:
        return JsonResponse({"error": str(exc)}, status=409)
    return _answer(result)


urlpatterns = [
    path("runs", start),
    path("approvals/<str:token>/<int:seq>", decide),
    path("runs/<str:token>/resume", resume),
]

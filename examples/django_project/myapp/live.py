# myapp/live.py
import json
import secrets
import threading

from django.http import Http404, JsonResponse, StreamingHttpResponse
from django.middleware.csrf import get_token
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from nous_sched import ApprovalDesk, agui, start_run
from nous_sched.gate.grants import requested

from .tools import POLICY, TOOLS, django_dispatch
from .views import MAX_PARALLEL, RUN_TIMEOUT, TOOL_POOL, _bad

EXAMPLE_PROGRAM = """const cities = ["Paris", "Lagos", "Lima", "Osaka"];
const found = await Promise.all(cities.map(city => tools.population({city})));
for (const f of found) console.log(`${f.city}: ${f.population}`);
const note = await tools.write({text: `${found.length} cities looked up`});
return {found, note};"""

RUNS = {}  # run id -> Run; keep only recent ones in a real deployment
RUNS_LOCK = threading.Lock()
DESK = ApprovalDesk()  # answers every run's approvals, told apart by call id


def _run(run_id):
    with RUNS_LOCK:
        run = RUNS.get(run_id)
    if run is None:
        raise Http404("no such run")
    return run


@require_GET
def form(request):
    # The template puts Django's CSRF token in the header of its POST (settings.CSRF_HEADER_NAME).
    return render(request, "myapp/form.html", {"program": EXAMPLE_PROGRAM})


@require_POST  # under CsrfViewMiddleware: the form sends the token it was given
def start(request):
    try:
        body = json.loads(request.body)
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("code"), str):
        return _bad('the body must be a JSON object: {"code": ..., "description": ...}')
    run = start_run(
        body["code"],
        TOOLS,
        description=body.get("description") or "a program run from the browser",
        executor=TOOL_POOL,
        max_parallel=MAX_PARALLEL,
        timeout=RUN_TIMEOUT,
        dispatch=django_dispatch,
        deps={"user_id": request.user.pk},
        policy=POLICY,
        approval_handler=DESK,
    )
    run_id = secrets.token_urlsafe(8)
    with RUNS_LOCK:
        RUNS[run_id] = run
    return JsonResponse({"id": run_id})


@require_GET
def page(request, run_id):
    run = _run(run_id)
    # The page's data, all ASCII JSON, in one attribute (the template escapes it);
    # the page's JavaScript writes every string with textContent.
    data = {"id": run_id, "description": run.description, "csrf": get_token(request)}
    return render(request, "myapp/run.html", {"data": json.dumps(data, ensure_ascii=True)})


@require_GET
def events(request, run_id):
    run = _run(run_id)
    # One write per batch of ready events; a viewer more than 1,000 events behind gets a `gap`.
    stream = ("".join(f"data: {event.to_json()}\n\n" for event in batch) for batch in run.event_batches(buffer=1000))
    response = StreamingHttpResponse(stream, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
    return response


@require_GET
def agui_events(request, run_id):
    """The same run in the AG-UI protocol, for agent front ends (the agui extra)."""
    return StreamingHttpResponse(agui.sse(_run(run_id)), content_type=agui.MEDIA_TYPE)


@require_POST  # under CsrfViewMiddleware: the page sends the token it was given
def decide(request, run_id):
    run = _run(run_id)
    try:
        body = json.loads(request.body)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return _bad('the body must be a JSON object: {"call_id": ..., "approved": ...}')
    call_id = str(body.get("call_id", ""))
    waiting = DESK.pending().get(call_id)
    if waiting is None or not call_id.startswith(run.call_id + ":code:"):
        return JsonResponse({"error": "no such call waits for approval"}, status=409)
    answer = body.get("approved") is True
    if answer and body.get("grant") is not None:  # the page's Approve N / Approve matching
        answer = requested(body["grant"], waiting.arguments, by="the page")
        if isinstance(answer, str):
            return _bad(answer)
    if not DESK.answer(call_id, answer):
        return JsonResponse({"error": "no such call waits for approval"}, status=409)
    return JsonResponse({"answered": call_id})

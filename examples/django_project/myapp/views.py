# myapp/views.py
import concurrent.futures
import json
import secrets

from django.http import JsonResponse
from django.views.decorators.http import require_POST

from nous_sched import run_code

from .tools import TOOLS, django_dispatch

# One pool per worker process, shared by every request that process serves.
# Its threads start on first use, so creating it at import time is safe
# with a pre-forking server (gunicorn --preload, uWSGI without lazy-apps).
TOOL_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="run-code-tools")

RUN_TIMEOUT = 20.0  # seconds; keep it below the server's worker timeout
MAX_PARALLEL = 4  # how many calls of one run may execute at once


def _bad(message):
    return JsonResponse({"error": message}, status=400)


@require_POST
def run(request):
    try:
        body = json.loads(request.body)
    except ValueError:  # includes JSONDecodeError and UnicodeDecodeError
        body = None
    if not isinstance(body, dict):
        return _bad('the body must be a JSON object: {"code": ..., "description": ...}')
    code, description = body.get("code"), body.get("description")
    if not isinstance(code, str) or not code.strip():
        return _bad("`code` must be a non-empty string")
    if not isinstance(description, str) or not description.strip():
        return _bad("`description` must be a non-empty string")

    result = run_code(
        code,
        TOOLS,
        description=description,
        executor=TOOL_POOL,
        max_parallel=MAX_PARALLEL,
        timeout=RUN_TIMEOUT,
        dispatch=django_dispatch,
        deps={"user_id": request.user.pk},  # None for an anonymous user
        call_id="django-" + secrets.token_urlsafe(6),
    )
    # 200 even when the program failed: {"logs", "error": {"kind", "message"}} is data.
    return JsonResponse(result.to_dict())

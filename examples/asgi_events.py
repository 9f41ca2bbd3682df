"""Watch runs live from an asyncio server: a viewer holds no thread.

A Starlette app (FastAPI's is the same, with ``app.mount``):

* ``POST /runs`` with ``{"code", "description"}`` starts a run
  (:func:`nous_sched.start_run`) and answers ``{"id": "<run id>"}`` at once;
* ``GET /runs/<id>/events`` streams its events (``text/event-stream``, one
  ``data: <RunEvent as JSON>`` message each, ``end`` last, then the stream
  closes), and ``GET /runs/<id>/agui`` the same run in the AG-UI protocol:
  both served by :func:`nous_sched.asgi.sse_app`, mounted at ``/runs``.

Needs Starlette and uvicorn (``pip install starlette uvicorn``; ``nous_sched.asgi``
itself needs neither) and the ``agui`` extra. Run it from the repository root with::

    uvicorn --app-dir examples asgi_events:app

then ``curl -s -XPOST localhost:8000/runs -d '{"code": "...", "description": "..."}'``
and ``curl -N localhost:8000/runs/<id>/events``.

Serving SSE in production. Every viewer is a coroutine on the server's one
event loop, not a thread: waiting for the run's next event it awaits a
future that event sets, and a viewer that stops reading waits in the
server's flow control while the run and every other viewer go on; at most
:data:`nous_sched.live.SSE_BUFFER` events later it skips to the newest and
is told by a ``gap`` event; one that disconnects stops at once. So the number
of watchers is bounded by memory (one batch in flight each) and file
descriptors, not by threads: one uvicorn worker (``uvicorn --workers 1``;
the runs live in its memory) serves them all. The run itself still has its
thread (``nous-sched-run-<n>``) and its tools theirs, as everywhere.

In a route of your own, ``StreamingResponse(live.asse(run),
media_type=live.MEDIA_TYPE)`` (Starlette, FastAPI) or Django's
``StreamingHttpResponse(live.asse(run), content_type=live.MEDIA_TYPE)`` under
ASGI streams the same text the same way (``agui.asse`` for AG-UI).
"""

from __future__ import annotations

import collections
import secrets
import threading
import time
from typing import Any, Iterable, Optional

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from nous_sched import Run, Tool, start_run
from nous_sched.asgi import sse_app

__all__ = ["create_app", "TOOLS", "app"]

MAX_RUNS = 100

_CITIES = {"paris": 2_102_650, "lagos": 15_388_000, "lima": 10_092_000, "osaka": 2_752_412}


def _population(args: dict) -> dict:
    time.sleep(0.3)  # a slow lookup, so there is something to watch
    name = str(args.get("city", "")).lower()
    return {"city": name, "population": _CITIES.get(name)}


#: The example's tools: one slow lookup, safe to run in parallel.
TOOLS = [
    Tool(
        name="population",
        function=_population,
        description="The population of a city.",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        concurrency_safe=lambda args: True,
    )
]


def create_app(tools: Optional[Iterable[Tool]] = None, **run_options: Any) -> Starlette:
    """The app, running programs with ``tools`` (:data:`TOOLS` by default) and
    ``run_options`` (any :func:`nous_sched.run_code` option) for every run.
    ``app.state.runs`` maps each run id to its :class:`~nous_sched.Run`."""
    chosen = list(TOOLS if tools is None else tools)
    runs: collections.OrderedDict[str, Run] = collections.OrderedDict()
    lock = threading.Lock()

    async def start(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("code"), str):
            return JSONResponse({"error": 'expected {"code": "...", "description": "..."}'}, status_code=400)
        description = str(body.get("description") or "a program run over HTTP")
        # start_run checks the options on this thread, then returns at once: the run has its own.
        run = start_run(body["code"], chosen, description=description, **run_options)
        run_id = secrets.token_urlsafe(8)
        with lock:
            runs[run_id] = run
            while len(runs) > MAX_RUNS:
                runs.popitem(last=False)
        return JSONResponse({"id": run_id})

    app = Starlette(routes=[Route("/runs", start, methods=["POST"]), Mount("/runs", app=sse_app(runs, agui=True))])
    app.state.runs = runs
    return app


app = create_app()

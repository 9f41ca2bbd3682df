"""Watch a run live in the browser: a run's events as Server-Sent Events, and a small page that shows them.

Routes:

* ``POST /runs`` with ``{"code", "description"}`` starts a run
  (:func:`nous_sched.start_run`) and answers ``{"id": "<run id>"}`` at once.
* ``GET /runs/<id>/events`` streams the run's events (``text/event-stream``,
  one ``data: <RunEvent as JSON>`` message each, ``end`` last, then the
  stream closes). Any number of viewers may watch one run; each gets every
  event from the first, and a viewer that falls behind never slows the run.
* ``GET /runs/<id>`` is the page: each call appears as it starts
  (``running``), turns ``ok``/``error`` when it commits, the log lines appear
  as the program writes them, and the run's status is shown at the end.
* ``GET /`` a form that starts a run and opens its page.

The page writes everything with ``textContent``: logs and tool names are
model-written, never HTML.

Run it::

    flask --app examples/flask_events.py run
    # open http://127.0.0.1:5000/ and press Run
"""

from __future__ import annotations

import collections
import secrets
import threading
import time
from typing import Any, Iterable, Optional

from flask import Flask, Response, abort, jsonify, request, stream_with_context

from nous_sched import Run, Tool, start_run

__all__ = ["create_app", "TOOLS", "PAGE"]

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

EXAMPLE_PROGRAM = """const cities = ["Paris", "Lagos", "Lima", "Osaka"];
console.log(`looking up ${cities.length} cities`);
const found = await Promise.all(cities.map(city => tools.population({city})));
for (const f of found) console.log(`${f.city}: ${f.population}`);
return found;"""

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>nous_sched run</title>
<style>
 body { font: 14px system-ui, sans-serif; margin: 2em; }
 li.running { color: #a60; } li.ok { color: #080; } li.error { color: #b00; }
 pre { background: #f4f4f4; padding: .5em; min-height: 2em; }
</style></head>
<body>
<h1>Run <span id="run-id"></span></h1>
<p>Status: <b id="status">connecting</b></p>
<h2>Calls</h2><ol id="calls"></ol>
<h2>Logs</h2><pre id="logs"></pre>
<script>
const runId = document.body.dataset.run || location.pathname.split("/").pop();
document.getElementById("run-id").textContent = runId;
const status = document.getElementById("status");
const calls = document.getElementById("calls");
const logs = document.getElementById("logs");
function callItem(seq) {
  let li = document.getElementById("call-" + seq);
  if (!li) { li = document.createElement("li"); li.id = "call-" + seq; calls.appendChild(li); }
  return li;
}
const source = new EventSource("/runs/" + encodeURIComponent(runId) + "/events");
source.onopen = () => { status.textContent = "running"; };
source.onmessage = (message) => {
  const e = JSON.parse(message.data);
  if (e.kind === "call") {
    const li = callItem(e.seq);
    li.className = "running";
    li.textContent = "#" + e.seq + " " + e.data.tool + ": running";
  } else if (e.kind === "commit") {
    const li = callItem(e.seq);
    li.className = e.data.ok ? "ok" : "error";
    li.textContent = "#" + e.seq + " " + e.data.tool + ": " + (e.data.ok ? "ok" : "error") + " (" + e.data.chars + " chars)";
  } else if (e.kind === "log") {
    logs.textContent += e.data.line + "\\n";
  } else if (e.kind === "approval") {
    callItem(e.seq).textContent += " [approval " + e.data.state + "]";
  } else if (e.kind === "gap") {
    logs.textContent += "[missed " + e.data.missed + " events]\\n";
  } else if (e.kind === "end") {
    status.textContent = e.data.ok ? "done" : "failed: " + e.data.error.kind;
    source.close();  // or EventSource would reconnect and replay the run
  }
};
</script>
</body></html>
"""

FORM = """<!doctype html>
<html><head><meta charset="utf-8"><title>nous_sched</title></head><body>
<h1>Run a program</h1>
<textarea id="code" rows="12" cols="80"></textarea><br>
<input id="description" size="60" value="looks up the population of four cities">
<button id="run">Run</button>
<script>
document.getElementById("code").value = __PROGRAM__;
document.getElementById("run").onclick = async () => {
  const response = await fetch("/runs", {method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({code: document.getElementById("code").value,
                          description: document.getElementById("description").value})});
  const answer = await response.json();
  if (answer.id) location.href = "/runs/" + answer.id; else alert(answer.error);
};
</script></body></html>
"""


def _sse(run: Run) -> Iterable[str]:
    for event in run.events():
        yield f"data: {event.to_json()}\n\n"


def create_app(tools: Optional[Iterable[Tool]] = None, **run_options: Any) -> Flask:
    """The app, running programs with ``tools`` (:data:`TOOLS` by default) and
    ``run_options`` (any :func:`nous_sched.run_code` option) for every run."""
    app = Flask(__name__)
    chosen = list(TOOLS if tools is None else tools)
    runs: collections.OrderedDict[str, Run] = collections.OrderedDict()
    lock = threading.Lock()

    @app.get("/")
    def form() -> str:
        import json

        return FORM.replace("__PROGRAM__", json.dumps(EXAMPLE_PROGRAM).replace("</", "<\\/"))

    @app.post("/runs")
    def start() -> Any:
        body = request.get_json(silent=True)
        if not isinstance(body, dict) or not isinstance(body.get("code"), str):
            return jsonify({"error": 'expected {"code": "...", "description": "..."}'}), 400
        description = body.get("description") or "a program run from the browser"
        run = start_run(body["code"], chosen, description=str(description), **run_options)
        run_id = secrets.token_urlsafe(8)
        with lock:
            runs[run_id] = run
            while len(runs) > MAX_RUNS:
                runs.popitem(last=False)
        return jsonify({"id": run_id})

    def find(run_id: str) -> Run:
        with lock:
            run = runs.get(run_id)
        if run is None:
            abort(404)
        return run

    @app.get("/runs/<run_id>")
    def page(run_id: str) -> str:
        find(run_id)
        return PAGE

    @app.get("/runs/<run_id>/events")
    def events(run_id: str) -> Response:
        run = find(run_id)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return Response(stream_with_context(_sse(run)), mimetype="text/event-stream", headers=headers)

    return app


app = create_app()

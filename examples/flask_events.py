"""Watch a run live in the browser, and answer its approvals there.

Routes:

* ``POST /runs`` with ``{"code", "description"}`` starts a run
  (:func:`nous_sched.start_run`) and answers ``{"id": "<run id>"}`` at once.
* ``GET /runs/<id>`` is the page. Its title is the run's description. Each
  call appears as it starts, with its arguments (each value clipped on its
  own, its size stated: the approval question's renderer), whether it ran in
  parallel or exclusive and why, the throttles it may wait for; it shows
  ``waiting for approval`` with **Approve** / **Deny** buttons while a person
  must decide, then its outcome: the duration and the value, or the error's
  kind and the message the program saw, and how long it waited for a thread
  or its throttles. Calls the gate refused are listed with the reason. The
  log lines appear as the program writes them; the value the run returned
  (what the model reads) at the end.
* ``GET /runs/<id>/events`` streams the run's events (``text/event-stream``,
  one ``data: <RunEvent as JSON>`` message each, ``end`` last, then the
  stream closes). Any number of viewers may watch one run; each gets every
  event from the first, and a viewer that falls behind never slows the run.
* ``GET /runs/<id>/agui`` the same run in the AG-UI protocol
  (:func:`nous_sched.agui.sse`), for agent front ends that speak it.
* ``POST /runs/<id>/decisions`` with ``{"call_id", "seq", "approved"}``
  (and, to approve later calls to the same tool in the run too, ``"grant"``:
  ``{"calls": N}``, ``{"match": [KEY, ...]}`` (the calls whose ``KEY``
  arguments equal this call's) or ``{"all": true}``, a
  :class:`nous_sched.Grant`; the page's **Approve N** and **Approve
  matching** buttons; a grant the call cannot take is refused with 400)
  answers a pending approval: the live approval handler's
  (:class:`nous_sched.ApprovalDesk`), or, for an app made with an
  ``approval_store``, the suspended run's, which is resumed
  (:func:`nous_sched.resume_run`) once every pending call is decided; the
  answer then names the resumed run (``{"next": "<run id>"}``). The request
  must carry the page's CSRF token in an ``X-CSRF-Token`` header (a page of
  another site cannot read it) and a JSON body; anything else is refused
  with 403. The decision is in the run's audit (its ``approval`` event).
* ``GET /`` a form that starts a run and opens its page.

The page writes every string with ``textContent``: arguments, values, logs,
errors and the description are the program's or the model's text, never HTML.
The page's own data (run id, description, CSRF token) is JSON, all ASCII,
HTML-escaped into one attribute.

Needs Flask (the ``web`` extra). Run it from the repository root with::

    flask --app examples/flask_events.py run

then open http://127.0.0.1:5000/ and press Run.

Serving the stream in production. Each viewer of ``/runs/<id>/events`` is
one response the server writes for the run's whole life, on one thread of a
threaded WSGI server. The stream is written one batch of ready events at a
time (``Run.event_batches``: one write and one wake-up of the viewer's thread
per batch, not per event), and a viewer more than :data:`SSE_BUFFER` events
behind skips to the newest and is told so by a ``gap`` event: a viewer that
reads slowly or not at all blocks only its own thread, in its own socket
write, holding at most one batch; the run and the other viewers go on
(``tests/test_sse_stalled.py``: five stalled viewers and one honest one).
What it does hold is that thread, until the run ends and it has read the end,
or its connection dies. So budget threads per watcher: the most viewers you
expect at once plus your other requests (for example
``gunicorn -k gthread --threads 64 --workers 1 "flask_events:app"``; one
process, since the runs live in its memory), and put a proxy that drops idle
clients in front. A server that serves a request per thread from a small
fixed pool (waitress's 4 by default) is the wrong choice for SSE: a few
watchers use it up. An asyncio server holds no thread per viewer at all:
``examples/asgi_events.py`` (``nous_sched.asgi.sse_app``).
"""

from __future__ import annotations

import collections
import hmac
import html
import json
import secrets
import threading
import time
from typing import Any, Iterable, Optional

from flask import Flask, Response, abort, jsonify, request, stream_with_context

from nous_sched import ApprovalDecision, ApprovalDesk, Grant, Run, Tool, live, resume_run, start_run
from nous_sched.gate.grants import requested

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
 body { font: 14px system-ui, sans-serif; margin: 2em; max-width: 60em; }
 .call { border-left: 4px solid #aaa; padding: .3em .8em; margin: .6em 0; }
 .call.running { border-color: #a60; } .call.ok { border-color: #080; } .call.error { border-color: #b00; }
 .call.waiting { border-color: #06c; background: #eef5ff; }
 .args { margin: .2em 0 .2em 1em; font-family: monospace; white-space: pre-wrap; }
 .how, .outcome { color: #444; } .error .outcome { color: #b00; }
 pre { background: #f4f4f4; padding: .5em; min-height: 1.5em; white-space: pre-wrap; }
 button { margin-right: .5em; }
</style></head>
<body data-run="__RUN__">
<h1 id="title"></h1>
<p>Run <code id="run-id"></code> &middot; status: <b id="status">connecting</b></p>
<h2>Calls</h2><div id="calls"></div>
<h2>Refused calls</h2><ul id="refused"></ul>
<div id="pending"></div>
<h2>Logs</h2><pre id="logs"></pre>
<h2>Returned</h2><pre id="result"></pre>
<script>
// Every string goes to the page through put(): as text, never markup; a lone
// surrogate (the page data may hold one; the stream has U+FFFD in its place) as its escape.
const LONE = /[\\ud800-\\udbff](?![\\udc00-\\udfff])|(?<![\\ud800-\\udbff])[\\udc00-\\udfff]/g;
function shown(text) { return String(text).replace(LONE, c => "\\\\u" + c.charCodeAt(0).toString(16)); }
function put(node, text) { node.textContent = shown(text); }
const run = JSON.parse(document.body.dataset.run);
document.title = shown(run.description);
put(document.getElementById("title"), run.description);
put(document.getElementById("run-id"), run.id);
const status = document.getElementById("status");
const logs = document.getElementById("logs");
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) put(e, text);
  return e;
}
function ms(seconds) { return (seconds * 1000).toFixed(0) + " ms"; }
function part(row, cls) { return row.querySelector("." + cls); }
function callRow(seq) {
  let row = document.getElementById("call-" + seq);
  if (!row) {
    row = el("div", "call running"); row.id = "call-" + seq;
    for (const cls of ["head", "args", "how", "approval", "outcome"]) row.appendChild(el("div", cls));
    document.getElementById("calls").appendChild(row);
  }
  return row;
}
function args(rows) {
  if (!rows.length) return "no arguments";
  return rows.map(r => r.key + " = " + r.value + (r.clipped ? "" : " (" + r.chars + " chars)")).join("\\n");
}
async function decide(body, buttons) {
  for (const b of buttons) b.disabled = true;
  const response = await fetch("/runs/" + encodeURIComponent(run.id) + "/decisions", {
    method: "POST", credentials: "same-origin",
    headers: {"Content-Type": "application/json", "X-CSRF-Token": run.csrf},
    body: JSON.stringify(body)});
  const answer = await response.json();
  if (answer.next) location.href = "/runs/" + encodeURIComponent(answer.next);
}
function ask(box, seq, callId, question) {
  box.replaceChildren(el("pre", "question", question));
  const yes = el("button", "approve", "Approve"), no = el("button", "deny", "Deny");
  const count = el("input", "grant-calls"), many = el("button", "approve-many", "Approve N");
  const keys = el("input", "grant-keys"), matching = el("button", "approve-matching", "Approve matching");
  count.type = "number"; count.min = "1"; count.value = "10"; keys.placeholder = "KEY[,KEY]";
  yes.id = "approve-" + seq; no.id = "deny-" + seq; many.id = "approve-many-" + seq;
  count.id = "grant-calls-" + seq; keys.id = "grant-keys-" + seq; matching.id = "approve-matching-" + seq;
  const all = [yes, no, many, matching];
  const approve = grant => decide({seq: seq, call_id: callId, approved: true, grant: grant}, all);
  yes.onclick = () => decide({seq: seq, call_id: callId, approved: true}, all);
  no.onclick = () => decide({seq: seq, call_id: callId, approved: false}, all);
  many.onclick = () => approve({calls: Number(count.value)});
  matching.onclick = () => approve({match: keys.value.split(",").map(k => k.trim()).filter(k => k)});
  box.append(yes, no, count, many, keys, matching);
}
const handlers = {
  call(e) {
    const row = callRow(e.seq), d = e.data;
    put(part(row, "head"), "#" + e.seq + " " + d.tool + ": running");
    put(part(row, "args"), args(d.arguments));
    let how = d.mode === "parallel" ? "parallel" : "exclusive (" + d.why + ")";
    if (d.throttles.length) how += "; may wait for throttles " + d.throttles.join(", ");
    if (d.approval) how += "; needs approval";
    put(part(row, "how"), how);
  },
  approval(e) {
    const row = callRow(e.seq), d = e.data, box = part(row, "approval");
    if (d.state === "asked") {
      row.className = "call waiting";
      put(part(row, "head"), "#" + e.seq + " " + d.tool + ": waiting for approval");
      ask(box, e.seq, d.call_id, d.question);
    } else {
      row.className = "call running";
      const state = d.state + (d.grant ? " (grant " + d.grant + ")" : "");
      put(part(row, "head"), "#" + e.seq + " " + d.tool + ": " + state + ", running");
      box.replaceChildren(el("span", "decision", state));
    }
  },
  commit(e) {
    const row = callRow(e.seq), d = e.data;
    row.className = "call " + (d.ok ? "ok" : "error");
    put(part(row, "head"), "#" + e.seq + " " + d.tool + ": " + (d.ok ? "ok" : "error"));
    let text = d.ok ? "ok in " + ms(d.duration) + ": " + d.value.text
                    : "error (" + d.error.kind + ")" + (d.duration === null ? "" : " after " + ms(d.duration)) + ": " + d.error.message;
    const waits = [];
    if (d.waited !== null && d.waited >= 0.01) waits.push("waited " + ms(d.waited) + " to start");
    if (d.throttled) waits.push(ms(d.throttled) + " of it for throttles");
    if (waits.length) text += " (" + waits.join(", ") + ")";
    put(part(row, "outcome"), text);
  },
  refused(e) {
    const d = e.data;
    document.getElementById("refused").appendChild(el("li", "refusal", d.tool + ": refused (" + d.reason + "): " + d.message));
  },
  log(e) { put(logs, logs.textContent + e.data.line + "\\n"); },
  gap(e) { put(logs, logs.textContent + "[missed " + e.data.missed + " events]\\n"); },
  suspended(e) {
    const box = document.getElementById("pending");
    box.replaceChildren(el("h2", "", "Waiting for approval"));
    for (const p of e.data.pending) {
      const item = el("div", "call waiting"); item.id = "pending-" + p.seq;
      box.appendChild(item);
      ask(item, p.seq, "", p.question);
    }
  },
  end(e) {
    const d = e.data, answer = d.answer || {};
    if (answer.suspended) put(status, "waiting for approval");
    else put(status, d.ok ? "done" : "failed: " + d.error.kind);
    const result = document.getElementById("result");
    if ("result" in answer) put(result, JSON.stringify(answer.result, null, 2));
    else if (answer.error) put(result, answer.error.kind + ": " + answer.error.message);
    source.close();  // or EventSource would reconnect and replay the run
  },
};
const source = new EventSource("/runs/" + encodeURIComponent(run.id) + "/events");
source.onopen = () => { if (status.textContent === "connecting") put(status, "running"); };
source.onmessage = (message) => {
  const e = JSON.parse(message.data);
  const handle = handlers[e.kind];
  if (handle) handle(e);
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


#: Events one viewer may fall behind before it skips to the newest (a ``gap`` event says how many).
SSE_BUFFER = 1000


def _sse(run: Run) -> Iterable[str]:
    # One write per batch of ready events (nous_sched.live.sse): a viewer's thread wakes once per
    # batch, not per event, so watchers cost each other little; one that stops reading blocks only
    # its own thread. Strict JSON: U+FFFD for a lone surrogate, null for NaN.
    return live.sse(run, buffer=SSE_BUFFER)


def _page_data(run_id: str, entry: dict[str, Any]) -> str:
    """The page's data attribute: JSON, all ASCII (a lone surrogate is an escape), HTML-escaped."""
    data = {"id": run_id, "description": entry["run"].description, "csrf": entry["csrf"]}
    return html.escape(json.dumps(data, ensure_ascii=True), quote=True)


def create_app(tools: Optional[Iterable[Tool]] = None, *, approval_store: Any = None, **run_options: Any) -> Flask:
    """The app, running programs with ``tools`` (:data:`TOOLS` by default) and
    ``run_options`` (any :func:`nous_sched.run_code` option) for every run.

    Approvals (the tools ``run_options``' policy or the tools themselves
    require it for) are answered on the page: by a live
    :class:`~nous_sched.ApprovalDesk` unless ``run_options`` names an
    ``approval_handler``; with an ``approval_store``, the run suspends and the
    page's decisions resume it.
    """
    app = Flask(__name__)
    chosen = list(TOOLS if tools is None else tools)
    runs: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
    lock = threading.Lock()
    app.config["NOUS_SCHED_RUNS"] = runs  # run id -> {"run", "csrf", ...}: the runs the app keeps
    desk: Optional[ApprovalDesk] = None
    if approval_store is None and run_options.get("approval_handler") is None:
        desk = ApprovalDesk()
        run_options = dict(run_options, approval_handler=desk)

    def keep(run: Run) -> str:
        run_id = secrets.token_urlsafe(8)
        with lock:
            runs[run_id] = {"run": run, "csrf": secrets.token_urlsafe(24), "decisions": {}}
            while len(runs) > MAX_RUNS:
                runs.popitem(last=False)
        return run_id

    @app.get("/")
    def form() -> str:
        return FORM.replace("__PROGRAM__", json.dumps(EXAMPLE_PROGRAM).replace("</", "<\\/"))

    @app.post("/runs")
    def start() -> Any:
        body = request.get_json(silent=True)
        if not isinstance(body, dict) or not isinstance(body.get("code"), str):
            return jsonify({"error": 'expected {"code": "...", "description": "..."}'}), 400
        description = body.get("description") or "a program run from the browser"
        options = dict(run_options)
        if approval_store is not None:
            options["approval_store"] = approval_store
        run = start_run(body["code"], chosen, description=str(description), **options)
        return jsonify({"id": keep(run)})

    def find(run_id: str) -> dict[str, Any]:
        with lock:
            entry = runs.get(run_id)
        if entry is None:
            abort(404)
        return entry

    @app.get("/runs/<run_id>")
    def page(run_id: str) -> Response:
        entry = find(run_id)
        response = Response(PAGE.replace("__RUN__", _page_data(run_id, entry)), mimetype="text/html")
        response.headers["X-Frame-Options"] = "DENY"  # no clicking Approve through another site's frame
        return response

    @app.get("/runs/<run_id>/events")
    def events(run_id: str) -> Response:
        run = find(run_id)["run"]
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return Response(stream_with_context(_sse(run)), mimetype="text/event-stream", headers=headers)

    @app.get("/runs/<run_id>/agui")
    def agui_events(run_id: str) -> Response:
        from nous_sched import agui  # the agui extra

        run = find(run_id)["run"]
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return Response(stream_with_context(agui.sse(run)), mimetype=agui.MEDIA_TYPE, headers=headers)

    @app.post("/runs/<run_id>/decisions")
    def decide(run_id: str) -> Any:
        entry = find(run_id)
        token = request.headers.get("X-CSRF-Token", "")
        body = request.get_json(silent=True)
        if not hmac.compare_digest(token.encode(), entry["csrf"].encode()) or not isinstance(body, dict):
            return jsonify({"error": "a decision needs the page's CSRF token and a JSON body"}), 403
        approved = body.get("approved") is True
        run: Run = entry["run"]
        if approval_store is None:
            call_id = str(body.get("call_id", ""))
            waiting = desk.pending().get(call_id) if desk is not None else None
            if waiting is None or not call_id.startswith(run.call_id + ":code:"):
                return jsonify({"error": "no such call waits for approval"}), 409
            grant = _grant(body, waiting.arguments) if approved else None
            if isinstance(grant, str):
                return jsonify({"error": grant}), 400
            if desk is None or not desk.answer(call_id, grant or approved):
                return jsonify({"error": "no such call waits for approval"}), 409
            return jsonify({"answered": call_id, "approved": approved, "grant": grant is not None})
        return _durable(entry, body, approved)

    def _durable(entry: dict[str, Any], body: dict[str, Any], approved: bool) -> Any:
        run: Run = entry["run"]
        seq = body.get("seq")
        suspension = run.result(timeout=0).suspended if run.done() else None
        asked = {p.seq: p for p in suspension.pending} if suspension is not None else {}
        if suspension is None or seq not in asked:
            return jsonify({"error": "no such call waits for approval"}), 409
        grant = _grant(body, asked[seq].arguments) if approved else None
        if isinstance(grant, str):
            return jsonify({"error": grant}), 400
        with lock:
            decisions = entry["decisions"]
            reason = "approved on the page" if approved else "denied on the page"
            decisions[seq] = ApprovalDecision(approved, reason, grant)
            # A pending call needs no decision of its own when one grants calls to its tool.
            granted = {asked[s].tool for s, d in decisions.items() if d.grant is not None}
            left = [p for p in suspension.pending if p.seq not in decisions and p.tool not in granted]
            if left or entry.get("next"):
                ready = entry.get("next") if entry.get("next") != "starting" else None  # another request resumes it
                return jsonify({"waiting": len(left), "next": ready})
            entry["next"] = "starting"
        options = {k: v for k, v in run_options.items() if k != "approval_handler"}
        resumed = resume_run(
            suspension.token,
            dict(decisions),
            chosen,
            approval_store=approval_store,
            description=run.description,
            **options,
        )
        entry["next"] = keep(resumed)
        return jsonify({"next": entry["next"]})

    return app


def _grant(body: dict[str, Any], arguments: Any) -> Optional[Grant] | str:
    """The grant a decision's body asks for (None: none), or why it cannot be had."""
    return None if body.get("grant") is None else requested(body["grant"], arguments, by="the page")


app = create_app()

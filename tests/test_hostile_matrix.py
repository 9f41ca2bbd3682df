"""The hostile-value matrix (issue 34): every class of hostile value, through every entry point, out of every output path.

Three tables make the matrix; a new entry point or output path is one row
here, added the day it is written (ARCHITECTURE.rst, "Hostile input"):

* :data:`VALUES`, the classes of hostile value: lone surrogates, NUL,
  C0/C1 controls, bidi overrides, tag characters, U+061C, astral characters,
  huge strings, deep nesting, non-finite numbers, and invalid UTF-8 where
  bytes can enter (a program file, a tools module, ``call_tool``'s bytes);
* :data:`ENTRY_POINTS`, the doors a program comes in by, each a function that
  runs a program and returns what came out of each output path it writes;
* :data:`OUTPUT_PATHS`, every place a value leaves the library, each with the
  check its kind of output gets (:data:`TERMINAL`, what a person reads;
  :data:`JSON`, JSON text the library writes; :data:`WIRE`, values another
  library encodes; :data:`VALUE`, a Python value handed back).

Every cell (an entry point and a value) asserts: a result or a clear error,
and the one the value must give; nothing crashed (no exception out of the
entry point, the server still answering); every output escaped: what a person
reads and JSON the library writes hold no raw control, format, separator or
surrogate code point (judged by :mod:`unicodedata`, not by the library's own
list), and JSON and wire output decode strictly (``orjson``, which refuses
even an escaped lone surrogate); and the host and other runs unharmed: an
honest program through the same entry point, on the same server or store,
right after, gets its answer.

The costs are kept moderate: one ``serve-mcp`` subprocess per transport, and
one client connection to it, serve every value; the CLI runs in this process
with a strict UTF-8 standard output (the one that crashed on a lone surrogate).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import html
import importlib.util
import io
import json
import logging
import os
import pathlib
import re
import signal
import subprocess
import sys
import unicodedata
from typing import Any, Callable, Optional

import anyio
import anyio.from_thread
import attrs
import hostile_tools
import httpx
import orjson
import pytest
from mcp import Client, StdioServerParameters

from nous_sched import (
    ERROR_KINDS,
    Grant,
    QuickJSRuntime,
    agui,
    arun_code,
    call_tool,
    resume,
    run_code,
    run_code_tool,
    start_run,
)
from nous_sched.approval_store import SqliteApprovalStore
from nous_sched.cli import main
from nous_sched.durable.postgres_store import PostgresApprovalStore
from nous_sched.integrations import to_langchain

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "durable"))
import suspended_budget  # noqa: E402  (tests/durable: the suspended-answer cases and their check)

TOOLS_FILE = str(pathlib.Path(hostile_tools.__file__).resolve())
TOOLS = hostile_tools.TOOLS
WAIT = 60

# -- the values ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Hostile:
    """One class of hostile value: ``expr``, a JavaScript expression for it in a
    program (with raw characters where the class is about the program's own
    text), ``text``, the same class as a Python string (the run's description),
    and what it must give: ``"ok"`` (a result) or an error of one of ``kinds``.
    ``raw`` holds the bytes of a program with invalid UTF-8, for the entry
    points that take bytes; it has no ``expr``."""

    name: str
    expr: str
    text: str
    expect: str = "ok"
    kinds: tuple[str, ...] = ()
    raw: Optional[bytes] = None


_SURROGATE = re.compile("[\ud800-\udfff]")
TAGS = "".join(chr(0xE0041 + i) for i in range(27))

#: The head of a blob's bytes (hence of its handle's preview): a lone surrogate, NUL, ESC, bidi, a tag, U+061C.
BLOB_HEAD = "\ud800\x00\x1b[2J\u202e\U000e0041\u061c"
BLOB_EXPR = '"\\ud800\\x00\\x1b[2J\\u202e" + String.fromCodePoint(0xE0041) + "\\u061c" + "x".repeat(300000)'

VALUES = [
    # issue 34, item 1: one string killed serve-mcp, --events and the SSE stream.
    Hostile("lone_surrogate", '"half \\ud800 and \\udc00 half"', "half \ud800 and \udc00 half"),
    # issue 34, item 1: a raw NUL inside a string literal of valid JavaScript killed the worker.
    Hostile("nul_in_a_string_literal", '"a\x00b"', "a\x00b"),
    Hostile(
        "c0_c1_controls", '"\\x1b[2J\\x07\\r\\x00\\x85\\x9b]52;c;eA==\\x07"', "\x1b[2J\x07\r\x00\x85\x9b]52;c;eA==\x07"
    ),
    Hostile("bidi_overrides", '"invoice\\u202efdp.exe\\u2066x\\u2069"', "invoice\u202efdp.exe\u2066x\u2069"),
    # issue 34, item 2: 27 tag characters and a right-to-left override reached the terminal through --events.
    Hostile(
        "tag_characters_and_rlo",
        'String.fromCodePoint(...Array.from({length: 27}, (_, i) => 0xE0041 + i)) + "\\u202e"',
        TAGS + "\u202e",
    ),
    Hostile("arabic_letter_mark_u061c", '"a\\u061cb"', "a\u061cb"),
    Hostile("astral_characters", '"\\u{1F600}\\u{1D11E}\\u{10FFFD}"', "\U0001f600\U0001d11e\U0010fffd"),
    Hostile("huge_string", '"x".repeat(200000)', "x" * 200_000),
    Hostile("deep_nesting", 'JSON.parse("[".repeat(150) + "]".repeat(150))', "[" * 150),
    Hostile(
        "too_deep",
        'JSON.parse("[".repeat(300) + "]".repeat(300))',
        "[" * 300,
        expect="error",
        kinds=("exception",),
    ),
    Hostile("non_finite_numbers", "[NaN, Infinity, -Infinity, -0]", "NaN Infinity"),
    Hostile(
        "invalid_utf8",
        "",
        "",
        expect="error",
        kinds=("refused", "usage"),
        raw=b'return "bad \xff\xfe bytes";\n',
    ),
    # issue 40 (blobs): a result over Limits.blob_bytes (256 KiB) stays on the host; the echo's
    # answer holds a handle whose preview starts with these, on every output path.
    Hostile(
        "blob_of_hostile_values",
        BLOB_EXPR,
        BLOB_HEAD + "x" * 1000,
    ),
]
VALUES_BY_NAME = {value.name: value for value in VALUES}

PROGRAM = """const v = {expr};
console.log(typeof v === "string" ? v : JSON.stringify(v));
const back = await tools.echo({{v}});
let gated = null;
try {{ gated = await tools.gated({{v}}); }} catch (e) {{ gated = String(e.message); }}
return {{v, back, gated}};
"""
HONEST = 'const r = "honest " + (await tools.echo({v: 1})).v;\nconsole.log(r);\nreturn r;\n'


def program_of(value: Hostile) -> str:
    return PROGRAM.format(expr=value.expr)


# -- the output paths and their checks ------------------------------------------------------------

_ACTS = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def raw_hostile(text: str) -> list[str]:
    """The code points in ``text`` that would act on a terminal: controls (but
    newline and tab), format characters, separators, lone surrogates."""
    return sorted({c for c in text if c not in "\n\t" and unicodedata.category(c) in _ACTS})


def _text(out: Any) -> str:
    if isinstance(out, bytes):
        return out.decode("utf-8")  # strict
    assert isinstance(out, str), type(out)
    out.encode("utf-8")  # strict: no lone surrogate
    return out


def check_terminal(out: Any) -> None:
    text = _text(out)
    assert not raw_hostile(text), raw_hostile(text)[:5]


def check_json(out: Any) -> None:
    text = _text(out)
    orjson.loads(text)
    check_terminal(text)


def check_json_lines(out: Any) -> None:
    for line in _text(out).splitlines():
        if line.strip():
            check_json(line)


def check_sse(out: Any) -> None:
    text = _text(out)
    check_terminal(text)
    events = [orjson.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]
    assert events and events[-1]["kind"] == "end", text[-300:]


def check_agui_sse(out: Any) -> None:
    text = _text(out)
    check_terminal(text)
    events = [orjson.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]
    assert events and events[-1]["type"] in ("RUN_FINISHED", "RUN_ERROR"), text[-300:]


def check_wire(out: Any) -> None:
    orjson.loads(_text(out))


def check_wire_value(out: Any) -> None:
    orjson.dumps(out, option=orjson.OPT_NON_STR_KEYS)  # refuses a lone surrogate in any string


def check_value(out: Any) -> None:
    assert out is not None


TERMINAL, JSON, JSON_LINES, SSE, AGUI_SSE, WIRE, WIRE_VALUE, VALUE = (
    check_terminal,
    check_json,
    check_json_lines,
    check_sse,
    check_agui_sse,
    check_wire,
    check_wire_value,
    check_value,
)

#: Every place a value leaves the library, and the check its kind of output gets.
OUTPUT_PATHS: dict[str, Callable[[Any], None]] = {
    "run_result": VALUE,  # a RunResult (or the adapters' text) handed back in-process
    "logging": TERMINAL,  # records of the nous_sched logger, as a handler writes them
    "approval_question": TERMINAL,  # ApprovalRequest.question(): the one renderer
    "run_events_json": JSON_LINES,  # RunEvent.to_json of start_run's events
    "sse_stream": SSE,  # examples/flask_events.py's text/event-stream
    "agui_sse": AGUI_SSE,  # nous_sched.agui.sse: a run's events as AG-UI server-sent events
    "call_tool_text": WIRE,  # call_tool's (and the framework adapters') JSON text for a model
    "otel_attributes": WIRE_VALUE,  # span names and attributes, for an exporter
    "mcp_result_text": WIRE,  # serve-mcp's result, text content, as a client received it (or a refusal's body)
    "mcp_structured": WIRE_VALUE,  # serve-mcp's result, structured content
    "mcp_log_notifications": WIRE_VALUE,  # serve-mcp's notifications/message
    "audit_log_file": JSON_LINES,  # serve-mcp --audit-log
    "cli_human": TERMINAL,
    "cli_json": JSON,
    "cli_events": JSON_LINES,
    "cli_stderr": TERMINAL,
    "chrome_trace_file": JSON,  # run --trace FILE
    "approvals_list": TERMINAL,
    "approvals_list_json": JSON,
    "grant_reasons": TERMINAL,  # the approval records' reasons of a grant and the calls it covered
    "celery_result": WIRE_VALUE,  # nous_sched.integrations.celery: a task's result document, as the caller got it
    "celery_events": JSON_LINES,  # the run's events in its Redis stream, as the worker wrote them
    # issue 40, state: the SDK text's list of the state's keys, for the model (``run_code_tool(state=)``)
    "state_sdk_text": TERMINAL,
    "review_question": TERMINAL,  # a reviewed program's own question (ReviewDecision.ask()): ApprovalRequest.question()
    # issue 43, item 9: nous_sched.asgi.sse_app (live.asse, agui.asse) on uvicorn, as an HTTP client read it
    "asgi_sse_stream": SSE,
    "asgi_agui_sse": AGUI_SSE,
    # examples/django_project's live page on a real threaded WSGI server in its own process: its streams as
    # an HTTP client read them, and what the server process wrote to its stderr (its request log, and the
    # nous_sched logger's records through Python's last-resort handler, as a deployment without logging set up)
    "django_sse_stream": SSE,
    "django_agui_sse": AGUI_SSE,
    "django_server_log": TERMINAL,
}


# -- the entry points -------------------------------------------------------------------------------


@dataclasses.dataclass
class Seen:
    """What one run through an entry point gave: ``ok`` or ``error_kind`` (a kind
    of ``ERROR_KINDS``, or ``refused``/``usage`` for a clear refusal before
    anything ran), ``answer`` (text where the program's result or logs show),
    and each output path's output."""

    ok: bool
    error_kind: Optional[str]
    answer: str
    outputs: dict[str, Any]


def _of_result(result: Any, outputs: dict[str, Any]) -> Seen:
    kind = None if result.error is None else result.error.kind
    return Seen(result.error is None, kind, repr(result.result) + repr(result.logs), {"run_result": result, **outputs})


def _asking() -> tuple[list[str], Callable[[Any], bool]]:
    questions: list[str] = []

    def approve(request: Any) -> bool:
        questions.append(request.question())
        return True

    return questions, approve


def enter_run_code(program: str, description: str, env: Any, runtime: Any = None) -> Seen:
    questions, approve = _asking()
    options = {} if runtime is None else {"runtime": runtime}
    result = run_code(program, TOOLS, description=description, approval_handler=approve, timeout=WAIT, **options)
    return _of_result(result, {"approval_question": "\n".join(questions)})


def enter_run_code_in_process(program: str, description: str, env: Any) -> Seen:
    return enter_run_code(program, description, env, runtime=QuickJSRuntime())


def enter_start_run(program: str, description: str, env: Any) -> Seen:
    questions, approve = _asking()
    run = start_run(program, TOOLS, description=description, approval_handler=approve, timeout=WAIT)
    lines = [event.to_json() for event in run.events()]
    result = run.result(timeout=WAIT)
    return _of_result(result, {"approval_question": "\n".join(questions), "run_events_json": "\n".join(lines)})


def enter_agui_sse(program: str, description: str, env: Any) -> Seen:
    questions, approve = _asking()
    run = start_run(program, TOOLS, description=description, approval_handler=approve, timeout=WAIT)
    stream = "".join(agui.sse(run))
    result = run.result(timeout=WAIT)
    return _of_result(result, {"approval_question": "\n".join(questions), "agui_sse": stream})


def enter_arun_code(program: str, description: str, env: Any) -> Seen:
    questions, approve = _asking()
    result = asyncio.run(arun_code(program, TOOLS, description=description, approval_handler=approve, timeout=WAIT))
    return _of_result(result, {"approval_question": "\n".join(questions)})


def _of_answer(text: str) -> Seen:
    doc = orjson.loads(text)
    error = doc.get("error")
    kind = None if error is None else (error["kind"] if isinstance(error, dict) else "refused")
    return Seen(error is None, kind, text, {"call_tool_text": text, "run_result": text})


def enter_call_tool(program: Any, description: str, env: Any) -> Seen:
    arguments = program if isinstance(program, bytes) else {"code": program, "description": description}
    return _of_answer(call_tool(run_code_tool(TOOLS, timeout=WAIT), arguments))


def enter_langchain(program: Any, description: str, env: Any) -> Seen:
    tool = to_langchain(run_code_tool(TOOLS, timeout=WAIT))
    return _of_answer(tool.invoke({"code": program, "description": description}))


def enter_traced_run_code(program: str, description: str, env: Any) -> Seen:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from nous_sched.otel import traced_run_code

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        result = traced_run_code(
            program, TOOLS, tracer=provider.get_tracer("matrix"), description=description, timeout=WAIT
        )
    finally:
        provider.shutdown()
    spans = [
        {"name": s.name, "attributes": dict(s.attributes or {}), "events": [e.name for e in s.events]}
        for s in exporter.get_finished_spans()
    ]
    return _of_result(result, {"otel_attributes": spans})


def enter_start_run_grant(program: str, description: str, env: Any) -> Seen:
    # Grants: the question with what is coming (the program's own text here), an answer that
    # grants the calls matching the hostile value, and a second call the grant covers.
    questions: list[str] = []

    def grant(request: Any) -> Any:
        questions.append(attrs.evolve(request, coming=description).question())
        return Grant(matching={"v": request.arguments["v"]}, by=description) if "v" in request.arguments else True

    again = "const again = await tools.gated({v}).catch((e) => String(e.message));\nreturn {v, back, gated, again};"
    program = program.replace("return {v, back, gated};", again)
    run = start_run(program, TOOLS, description=description, approval_handler=grant, timeout=WAIT)
    lines = [event.to_json() for event in run.events()]
    result = run.result(timeout=WAIT)
    reasons = "\n".join(e.reason for e in result.events if e.type == "approval")
    outputs = {"approval_question": "\n".join(questions), "run_events_json": "\n".join(lines), "grant_reasons": reasons}
    return _of_result(result, outputs)


def enter_durable_resume(program: str, description: str, env: Any) -> Seen:
    # issue 34, item 7 (edge-durable): "a suspended run escapes the output budget" joins here, as a
    # value whose suspension carries huge arguments under a small output_budget.
    store_path = str(env.tmp_path / "approvals.db")
    store = SqliteApprovalStore(store_path)
    result = run_code(program, TOOLS, approval_store=store, description=description, timeout=WAIT)
    outputs: dict[str, Any] = {"approval_question": "", "approvals_list": "", "approvals_list_json": "[]"}
    if result.suspended is not None:
        pending = result.suspended.pending
        outputs["approval_question"] = "\n".join(request.question() for request in pending)
        outputs["approvals_list"] = env.cli("approvals", "list", "--store", store_path)[1]
        outputs["approvals_list_json"] = env.cli("approvals", "list", "--store", store_path, "--json")[1]
        decisions = {request.seq: True for request in pending}
        result = resume(result.suspended.token, decisions, TOOLS, approval_store=store, timeout=WAIT)
    return _of_result(result, outputs)


def enter_durable_resume_postgres(program: str, description: str, env: Any) -> Seen:
    # issue 42: the durable door with a Postgres store (a real server, tests/postgres_server.py). Postgres
    # text cannot hold NUL: every sealed record must still come back byte for byte, as the run sent it.
    dsn = env.postgres_dsn()
    store = PostgresApprovalStore(dsn)
    result = run_code(program, TOOLS, approval_store=store, description=description, timeout=WAIT)
    outputs: dict[str, Any] = {"approval_question": "", "approvals_list": "", "approvals_list_json": "[]"}
    if result.suspended is not None:
        pending = result.suspended.pending
        loaded = store.load(result.suspended.token)
        assert loaded["description"] == description
        assert [(p["seq"], p["tool"], p["arguments"]) for p in loaded["pending"]] == [
            (r.seq, r.tool, dict(r.arguments)) for r in pending
        ]
        outputs["approval_question"] = "\n".join(request.question() for request in pending)
        outputs["approvals_list"] = env.cli("approvals", "list", "--store", dsn)[1]
        outputs["approvals_list_json"] = env.cli("approvals", "list", "--store", dsn, "--json")[1]
        decisions = {request.seq: True for request in pending}
        result = resume(result.suspended.token, decisions, TOOLS, approval_store=store, timeout=WAIT)
    return _of_result(result, outputs)


def enter_flask_sse(program: str, description: str, env: Any) -> Seen:
    # As a person would: the page's CSRF token, the stream read as it comes, each
    # approval the stream asks answered with the page's Approve.
    client = env.flask.test_client()
    started = client.post("/runs", json={"code": program, "description": description})
    assert started.status_code == 200, started.data[:300]
    run_id = started.get_json()["id"]
    page = client.get(f"/runs/{run_id}").get_data(as_text=True)
    csrf = json.loads(html.unescape(page.split('data-run="', 1)[1].split('"', 1)[0]))["csrf"]
    chunks: list[bytes] = []
    for chunk in client.get(f"/runs/{run_id}/events", buffered=False).response:
        chunks.append(chunk)  # (a batch of events: one "data: ..." line each)
        for line in chunk.decode("utf-8").splitlines():
            if not line.startswith("data: "):
                continue
            event = orjson.loads(line[len("data: ") :])
            if event["kind"] == "approval" and event["data"]["state"] == "asked":
                body = {"seq": event["seq"], "call_id": event["data"]["call_id"], "approved": True}
                answered = client.post(f"/runs/{run_id}/decisions", json=body, headers={"X-CSRF-Token": csrf})
                assert answered.status_code == 200, answered.data[:300]
    body = b"".join(chunks)
    events = [orjson.loads(line[6:]) for line in body.decode("utf-8").splitlines() if line.startswith("data: ")]
    end = events[-1]["data"]
    kind = None if end["ok"] else end["error"]["kind"]
    return Seen(end["ok"], kind, body.decode("utf-8"), {"sse_stream": body})


def enter_asgi_sse(program: str, description: str, env: Any) -> Seen:
    # The async path (issue 43, item 9): examples/asgi_events.py on a real uvicorn, read by httpx;
    # its runs' approvals are answered yes by the app's handler.
    with httpx.Client(base_url=env.asgi_url, timeout=WAIT) as client:
        asked = json.dumps({"code": program, "description": description})  # ASCII: a lone surrogate as its escape
        started = client.post("/runs", content=asked, headers={"Content-Type": "application/json"})
        assert started.status_code == 200, started.text[:300]
        run_id = started.json()["id"]
        with client.stream("GET", f"/runs/{run_id}/events") as response:
            assert response.status_code == 200
            body = response.read()
        with client.stream("GET", f"/runs/{run_id}/agui") as response:
            assert response.status_code == 200
            agui_body = response.read()
    text = body.decode("utf-8")  # strict: the stream is UTF-8 throughout
    events = [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    end = events[-1]["data"]
    kind = None if end["ok"] else end["error"]["kind"]
    return Seen(end["ok"], kind, text, {"asgi_sse_stream": body, "asgi_agui_sse": agui_body})


def enter_django_sse(program: str, description: str, env: Any) -> Seen:
    # examples/django_project's live page as a person uses it: Django's CSRF cookie and the same token in
    # X-CSRF-Token to start the run (as the project's form does), the page's own token to answer each
    # approval the stream asks (CsrfViewMiddleware checks both), the stream read as it comes.
    django = env.django
    token = "a" * 32
    log_from = django.log_size()
    with httpx.Client(base_url=django.url, timeout=WAIT, cookies={"csrftoken": token}) as client:
        asked = json.dumps({"code": program, "description": description})  # ASCII: a lone surrogate as its escape
        headers = {"Content-Type": "application/json", "X-CSRF-Token": token}
        started = client.post("/runs", content=asked, headers=headers)
        assert started.status_code == 200, started.text[:300]
        run_id = started.json()["id"]
        page = client.get(f"/runs/{run_id}").text
        csrf = json.loads(html.unescape(page.split('data-run="', 1)[1].split('"', 1)[0]))["csrf"]
        chunks: list[bytes] = []
        with client.stream("GET", f"/runs/{run_id}/events") as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                chunks.append(line.encode("utf-8") + b"\n")
                if not line.startswith("data: "):
                    continue
                event = orjson.loads(line[len("data: ") :])
                if event["kind"] == "approval" and event["data"]["state"] == "asked":
                    body = {"seq": event["seq"], "call_id": event["data"]["call_id"], "approved": True}
                    answered = client.post(f"/runs/{run_id}/decisions", json=body, headers={"X-CSRF-Token": csrf})
                    assert answered.status_code == 200, answered.text[:300]
        with client.stream("GET", f"/runs/{run_id}/agui") as response:
            assert response.status_code == 200
            agui_body = response.read()
    body = b"".join(chunks)
    text = body.decode("utf-8")  # strict: the stream is UTF-8 throughout
    events = [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    end = events[-1]["data"]
    kind = None if end["ok"] else end["error"]["kind"]
    assert django.alive(), "the Django server died"
    outputs = {"django_sse_stream": body, "django_agui_sse": agui_body, "django_server_log": django.log(log_from)}
    return Seen(end["ok"], kind, text, outputs)


def _asking_review() -> tuple[list[str], list[str], Callable[[Any], bool], Callable[[Any], Any]]:
    """A reviewer that asks, and a handler answering yes that keeps the program's question apart."""
    from nous_sched import ReviewDecision

    questions, reviews = [], []

    def approve(request: Any) -> bool:
        (reviews if request.code is not None else questions).append(request.question())
        return True

    return questions, reviews, approve, lambda request: ReviewDecision.ask()


def _with_literal_call(program: str) -> str:
    """``program`` with its hostile value also written as a call's literal argument,
    so the program's summary (its question, its review record) holds it decoded."""
    first, _, rest = program.partition("\n")
    if not (first.startswith("const v = ") and first.endswith(";")):
        return program
    return f"{first}\nawait tools.echo({{review: {first[len('const v = ') : -1]}}});\n{rest}"


def enter_run_code_reviewed(program: str, description: str, env: Any) -> Seen:
    questions, reviews, approve, review = _asking_review()
    program = _with_literal_call(program)
    result = run_code(program, TOOLS, description=description, approval_handler=approve, review=review, timeout=WAIT)
    assert [e.type for e in result.audit] == ["review"]
    outputs = {"approval_question": "\n".join(questions), "review_question": "\n".join(reviews)}
    return _of_result(result, outputs)


def enter_start_run_reviewed(program: str, description: str, env: Any) -> Seen:
    questions, reviews, approve, review = _asking_review()
    program = _with_literal_call(program)
    run = start_run(program, TOOLS, description=description, approval_handler=approve, review=review, timeout=WAIT)
    lines = [event.to_json() for event in run.events()]
    result = run.result(timeout=WAIT)
    assert orjson.loads(lines[0])["kind"] == "review"
    outputs = {"approval_question": "\n".join(questions), "review_question": "\n".join(reviews)}
    return _of_result(result, {**outputs, "run_events_json": "\n".join(lines)})


def _mcp_entry(transport: str) -> Callable[..., Seen]:
    def enter(program: Any, description: str, env: Any) -> Seen:
        if isinstance(program, bytes) and transport == "stdio":  # stdio's door for bytes: the tools module
            return env.serve_mcp_bytes(program)
        server = env.mcp(transport)
        if isinstance(program, bytes):  # HTTP's: a request body that is not UTF-8
            return server.post_raw(program)
        # The SDK's client cannot even send a lone surrogate; the program carries them as escapes.
        return server.call(program, _SURROGATE.sub("\ufffd", description))

    return enter


def _cli_entry(*mode: str) -> Callable[..., Seen]:
    def enter(program: Any, description: str, env: Any) -> Seen:
        path = env.tmp_path / "program.js"
        path.write_bytes(program if isinstance(program, bytes) else program.encode("utf-8"))
        trace = env.tmp_path / "trace.json"
        extra = ("--trace", str(trace)) if not mode else ()
        status, out, err = env.cli("run", str(path), "--tools", TOOLS_FILE, *mode, *extra)
        if status == 2:
            assert err.strip() and not out, "a usage error says why, and prints nothing else"
            return Seen(False, "usage", err, {"cli_stderr": err})
        outputs = {"cli_stderr": err, _CLI_PATH[mode]: out}
        if not mode:
            outputs["chrome_trace_file"] = trace.read_bytes()
        last = out.splitlines()[-1] if out.strip() else ""
        if "--json" in mode:
            doc = orjson.loads(out if "--events" not in mode else last)
            kind = None if "error" not in doc else doc["error"]["kind"]
        elif "--events" in mode:
            end = orjson.loads(last)
            assert end["kind"] == "end", last
            kind = None if end["data"]["ok"] else end["data"]["error"]["kind"]
        else:
            kind = None if status == 0 else out.split("error (", 1)[1].split(")", 1)[0]
        assert status == (0 if kind is None else 1), (status, err[-500:])
        return Seen(kind is None, kind, out, outputs)

    return enter


_CLI_PATH = {
    (): "cli_human",
    ("--json",): "cli_json",
    ("--events",): "cli_events",
    ("--events", "--json"): "cli_events",
}


def enter_celery(program: Any, description: str, env: Any) -> Seen:
    # A real celery worker (solo) on a real Redis, its tool set hostile_tools by import path; the
    # run sent with tasks.start, its stream read raw from Redis and through events().
    from nous_sched import ConfigError

    tasks = env.celery()
    if isinstance(program, bytes):
        with pytest.raises(ConfigError, match="code") as refused:
            tasks.run.delay(code=program, description=description)
        return Seen(False, "refused", str(refused.value), {})
    remote = tasks.start(program, description=description, timeout=WAIT)
    doc = remote.result(timeout=WAIT + 30)
    events = list(remote.events())
    assert events and events[-1].kind == "end", [e.kind for e in events][-3:]
    raw = tasks.redis().xrange(tasks.events_key(remote.task_id))
    lines = "\n".join(fields[b"e"].decode("utf-8") for _, fields in raw)
    kind = None if doc["error"] is None else doc["error"]["kind"]
    answer = orjson.dumps(doc["answer"]).decode("utf-8")
    return Seen(doc["status"] == "ok", kind, answer, {"celery_result": doc, "celery_events": lines})


#: The state entry's end of PROGRAM: the value stored, read back, and used as a key (issue 40).
STATE_TAIL = """let stored = null, listed = null;
try { await state.set("v", v); stored = await state.get("v"); } catch (e) { stored = String(e.message); }
const k = typeof v === "string" ? v : String(JSON.stringify(v)).slice(0, 300);
try { await state.set(k, 1); listed = await state.keys(); } catch (e) { listed = String(e.message); }
return {v, back, gated, stored, listed};
"""


def enter_state(program: str, description: str, env: Any) -> Seen:
    """A program that stores the value in its state (SQLite), as a value and as a key:
    the result, the live events, the audit log's state lines, the SDK text listing the
    keys, and the command's --json with --state on the same store."""
    from nous_sched import SessionLog, SqliteStateStore, State
    from nous_sched.mcp.serve import AuditLog

    if program != HONEST:
        program = program.replace("return {v, back, gated};\n", STATE_TAIL)
        assert "state.set" in program, "the state entry runs the value through the state"
    store_path = str(env.tmp_path / "state.db")
    state = State("hostile", SqliteStateStore(store_path))
    questions, approve = _asking()
    log = SessionLog()
    run = start_run(
        program, TOOLS, description=description, approval_handler=approve, timeout=WAIT, state=state, session_log=log
    )
    lines = [event.to_json() for event in run.events()]
    result = run.result(timeout=WAIT)
    audit = io.StringIO()
    written = AuditLog(audit)
    for event in log.events:
        if event.type == "state":
            written.write("state", run="r", **event.data)
    path = env.tmp_path / "state.js"
    path.write_text(program, encoding="utf-8", errors="surrogatepass")
    status, out, err = env.cli(
        "run", str(path), "--tools", TOOLS_FILE, "--json", "--state", "hostile", "--state-store", store_path
    )
    assert status in (0, 1), err[-500:]
    outputs = {
        "approval_question": "\n".join(questions),
        "run_events_json": "\n".join(lines),
        "audit_log_file": audit.getvalue(),
        "state_sdk_text": run_code_tool(TOOLS, state=state).description,
        "cli_json": out,
        "cli_stderr": err,
    }
    return _of_result(result, outputs)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One door: ``enter(program, description, env) -> Seen``; ``paths``, the output
    paths it writes; ``takes_bytes``, whether bytes can come in by it (a program
    file, a tools module, ``call_tool``'s arguments)."""

    name: str
    enter: Callable[..., Seen]
    paths: tuple[str, ...]
    takes_bytes: bool = False


ENTRY_POINTS = [
    Entry("run_code", enter_run_code, ("run_result", "approval_question", "logging")),
    Entry("run_code_in_process", enter_run_code_in_process, ("run_result", "approval_question", "logging")),
    Entry("start_run", enter_start_run, ("run_result", "approval_question", "run_events_json", "logging")),
    Entry("agui_sse", enter_agui_sse, ("run_result", "approval_question", "agui_sse", "logging")),
    Entry("arun_code", enter_arun_code, ("run_result", "approval_question", "logging")),
    Entry("call_tool", enter_call_tool, ("run_result", "call_tool_text", "logging"), takes_bytes=True),
    Entry("langchain_adapter", enter_langchain, ("run_result", "call_tool_text", "logging")),
    Entry("traced_run_code", enter_traced_run_code, ("run_result", "otel_attributes", "logging")),
    Entry(
        "durable_resume",
        enter_durable_resume,
        ("run_result", "approval_question", "approvals_list", "approvals_list_json", "logging"),
    ),
    Entry("flask_sse", enter_flask_sse, ("sse_stream", "logging")),
    Entry(
        "start_run_grant",
        enter_start_run_grant,
        ("run_result", "approval_question", "run_events_json", "grant_reasons", "logging"),
    ),
    Entry(
        "serve_mcp_stdio",
        _mcp_entry("stdio"),
        ("mcp_result_text", "mcp_structured", "mcp_log_notifications", "audit_log_file", "cli_stderr", "logging"),
        takes_bytes=True,
    ),
    Entry(
        "serve_mcp_http",
        _mcp_entry("http"),
        ("mcp_result_text", "mcp_structured", "mcp_log_notifications", "audit_log_file", "logging"),
        takes_bytes=True,
    ),
    Entry("cli_human", _cli_entry(), ("cli_human", "cli_stderr", "chrome_trace_file", "logging"), takes_bytes=True),
    Entry("cli_json", _cli_entry("--json"), ("cli_json", "cli_stderr", "logging"), takes_bytes=True),
    Entry("cli_events", _cli_entry("--events"), ("cli_events", "cli_stderr", "logging"), takes_bytes=True),
    Entry(
        "cli_events_json", _cli_entry("--events", "--json"), ("cli_events", "cli_stderr", "logging"), takes_bytes=True
    ),
    Entry("celery", enter_celery, ("celery_result", "celery_events", "logging"), takes_bytes=True),
    Entry(
        "durable_resume_postgres",
        enter_durable_resume_postgres,
        ("run_result", "approval_question", "approvals_list", "approvals_list_json", "logging"),
    ),
    Entry(
        "state",
        enter_state,
        (
            "run_result",
            "approval_question",
            "run_events_json",
            "audit_log_file",
            "state_sdk_text",
            "cli_json",
            "cli_stderr",
            "logging",
        ),
    ),
    Entry(
        "run_code_reviewed", enter_run_code_reviewed, ("run_result", "approval_question", "review_question", "logging")
    ),
    Entry(
        "start_run_reviewed",
        enter_start_run_reviewed,
        ("run_result", "approval_question", "review_question", "run_events_json", "logging"),
    ),
    Entry("asgi_sse", enter_asgi_sse, ("asgi_sse_stream", "asgi_agui_sse", "logging")),
    Entry("django_sse", enter_django_sse, ("django_sse_stream", "django_agui_sse", "django_server_log", "logging")),
]
ENTRIES_BY_NAME = {entry.name: entry for entry in ENTRY_POINTS}

#: The cells that reproduce issue 34's "What broke", by item.
ISSUE_34 = {
    "1: one string kills a server": [
        ("serve_mcp_stdio", "lone_surrogate"),
        ("serve_mcp_http", "lone_surrogate"),
        ("cli_events", "lone_surrogate"),
        ("flask_sse", "lone_surrogate"),
        ("run_code", "nul_in_a_string_literal"),
        ("run_code_in_process", "nul_in_a_string_literal"),
        ("call_tool", "nul_in_a_string_literal"),
    ],
    "2: terminal injection through --events": [
        ("cli_events", "tag_characters_and_rlo"),
        ("cli_events_json", "tag_characters_and_rlo"),
        ("cli_events", "bidi_overrides"),
    ],
    # A suspended run's answer: each door that can suspend, with each of the durable cases
    # (tests/durable/suspended_budget.py), under a 2,000-byte budget (SUSPENDED_CELLS, below).
    "7: a suspended run escapes the output budget": [
        ("run_code", "four-huge-arguments"),
        ("run_code", "300-log-lines"),
        ("run_code_in_process", "hostile-text"),
    ],
}

CELLS = [
    (entry.name, value.name)
    for entry in ENTRY_POINTS
    for value in VALUES
    if value.raw is None or entry.takes_bytes  # invalid UTF-8 only where bytes can enter
]


# -- the shared parts: servers, the CLI, the Flask app -------------------------------------------------


class _Server:
    """One serve-mcp subprocess and one client connection to it, for every value."""

    def __init__(self, portal: Any, client: Any, audit: pathlib.Path, logs: list[Any], alive: Callable[[], bool]):
        self.portal, self.client, self.audit, self.logs, self.alive = portal, client, audit, logs, alive
        self.url = ""

    def post_raw(self, program: bytes) -> Seen:
        """A tools/call whose body holds ``program``'s bytes as they are, on a session of its own."""
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
        with httpx.Client(timeout=WAIT) as http:
            opened = http.post(
                self.url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}, headers=headers
            )
            assert opened.status_code == 200, opened.text[:300]
            headers["mcp-session-id"] = opened.headers["mcp-session-id"]
            headers["mcp-protocol-version"] = "2025-06-18"
            code = program.replace(b"\\", b"\\\\").replace(b'"', b'\\"').replace(b"\n", b"\\n")
            body = b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_code","arguments":'
            body += b'{"code":"' + code + b'","description":"raw bytes"}}}'
            answer = http.post(self.url, content=body, headers=headers)
        assert self.alive(), "serve-mcp died"
        assert answer.status_code == 400, answer.text[:300]
        return Seen(False, "refused", answer.text, {"mcp_result_text": answer.content})

    def call(self, program: str, description: str) -> Seen:
        self.logs.clear()
        before = self.audit.stat().st_size if self.audit.exists() else 0

        async def go() -> Any:
            with anyio.fail_after(WAIT + 30):
                return await self.client.call_tool("run_code", {"code": program, "description": description})

        result = self.portal.call(go)
        assert self.alive(), "serve-mcp died"
        with open(self.audit, "rb") as fh:
            fh.seek(before)
            audit = fh.read()
        structured = result.structured_content
        text = result.content[0].text
        if structured is None:  # refused before it ran: an error result with a message
            assert result.is_error and text
            return Seen(
                False, "refused", text, {"mcp_result_text": orjson.dumps(text).decode(), "audit_log_file": audit}
            )
        error = structured.get("error")
        outputs = {
            "mcp_result_text": text,
            "mcp_structured": structured,
            "mcp_log_notifications": list(self.logs),
            "audit_log_file": audit,
        }
        return Seen(error is None, None if error is None else error["kind"], text, outputs)


class Env:
    """What the entry points share: the case's directory, the CLI, the servers, the Flask app."""

    def __init__(self, tmp_path: pathlib.Path, shared: "_Shared", monkeypatch: Any) -> None:
        self.tmp_path = tmp_path
        self._shared = shared
        self._monkeypatch = monkeypatch

    def cli(self, *argv: str) -> tuple[int, str, str]:
        """``nous-sched ARGV`` in this process, with strict UTF-8 standard streams: (status, out, err)."""
        out_bytes, err_bytes = io.BytesIO(), io.BytesIO()
        out = io.TextIOWrapper(out_bytes, encoding="utf-8", errors="strict", write_through=True)
        err = io.TextIOWrapper(err_bytes, encoding="utf-8", errors="strict", write_through=True)
        with self._monkeypatch.context() as patch:
            patch.setattr(sys, "stdout", out)
            patch.setattr(sys, "stderr", err)
            status = main(list(argv))
        return status, out_bytes.getvalue().decode("utf-8"), err_bytes.getvalue().decode("utf-8")

    def mcp(self, transport: str) -> _Server:
        return self._shared.server(transport)

    def celery(self) -> Any:
        return self._shared.celery()

    def postgres_dsn(self) -> str:
        """A fresh database on the module's Postgres server (started the first time a cell needs it)."""
        return self._shared.postgres().new_database()

    @property
    def flask(self) -> Any:
        return self._shared.flask_app()

    @property
    def asgi_url(self) -> str:
        return self._shared.asgi_url()

    @property
    def django(self) -> "_DjangoServer":
        return self._shared.django()

    def serve_mcp_bytes(self, raw: bytes) -> Seen:
        module = self.tmp_path / "bad_tools.py"
        module.write_bytes(b'from nous_sched import Tool\nTOOLS = []\nX = """' + raw + b'"""\n')
        done = subprocess.run(
            [sys.executable, "-m", "nous_sched", "serve-mcp", "--tools", str(module)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=WAIT,
            cwd=ROOT,
        )
        err = done.stderr.decode("utf-8")
        assert done.returncode == 2 and "Traceback" not in err and "bad_tools.py" in err, err[-500:]
        return Seen(False, "usage", err, {"cli_stderr": err})


#: examples/django_project served as in production (its own settings and WSGI application, werkzeug's threaded
#: server), with the matrix's tools beside the project's own. Django's settings are process-wide, and other
#: test modules configure Django otherwise (tests/test_django_live.py), so the project runs in a process of its own.
DJANGO_SERVER = """
import os
os.environ["DJANGO_SETTINGS_MODULE"] = "mysite.settings"
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
import hostile_tools
from myapp import live, tools
live.TOOLS = [*tools.TOOLS, *hostile_tools.TOOLS]  # the views read the module's TOOLS per run
from werkzeug.serving import make_server
from mysite.wsgi import application
server = make_server("127.0.0.1", 0, application, threaded=True)
print(server.server_port, flush=True)
server.serve_forever(poll_interval=0.05)
"""


class _DjangoServer:
    """The Django project's server process: its URL, whether it lives, and what it wrote to stderr."""

    def __init__(self, process: subprocess.Popen[bytes], url: str) -> None:
        import threading

        self.process, self.url = process, url
        self._err = bytearray()
        self._lock = threading.Lock()
        threading.Thread(target=self._drain, name="test-django-stderr", daemon=True).start()

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._lock:
                self._err += line

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_size(self) -> int:
        with self._lock:
            return len(self._err)

    def log(self, since: int) -> str:
        """What the server wrote to stderr since ``since`` (its byte count then), decoded strictly."""
        with self._lock:
            return bytes(self._err[since:]).decode("utf-8")

    @classmethod
    @contextlib.contextmanager
    def started(cls, tmp: pathlib.Path) -> Any:
        project = ROOT / "examples" / "django_project"
        path = os.pathsep.join([str(project), str(pathlib.Path(__file__).resolve().parent), str(ROOT)])
        env = dict(os.environ, PYTHONPATH=path, MYSITE_DB=str(tmp / "django.sqlite3"))
        env.pop("DJANGO_SETTINGS_MODULE", None)
        process = subprocess.Popen(
            [sys.executable, "-c", DJANGO_SERVER],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=project,
        )
        try:
            assert process.stdout is not None
            port = process.stdout.readline().decode().strip()
            assert port.isdigit(), (port, process.stderr.read().decode()[-2000:] if process.stderr else "")
            yield cls(process, f"http://127.0.0.1:{port}")
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class _Shared:
    """The module's servers and Flask app, started the first time a cell needs them."""

    def __init__(self, tmp: pathlib.Path) -> None:
        self._tmp = tmp
        self._servers: dict[str, _Server] = {}
        self._stack = contextlib.ExitStack()
        self._flask: Any = None
        self._celery: Any = None
        self._postgres: Any = None
        self._asgi: Optional[str] = None
        self._django: Optional[_DjangoServer] = None

    def close(self) -> None:
        self._stack.close()

    def celery(self) -> Any:
        """The Celery tasks of a fleet of one solo worker running hostile_tools, started on first use."""
        if self._celery is None:
            import celery_fleet
            from celery import Celery
            from redis_server import redis_process

            from nous_sched.integrations import celery as nous_celery

            url = self._stack.enter_context(redis_process()).url
            fleet = self._stack.enter_context(celery_fleet.fleet(url, self._tmp, tools="hostile_tools"))
            fleet.start("matrix", "solo")
            app = Celery("hostile_matrix", broker=url, backend=url)
            fleet.wait_ready(app, ["matrix"])
            self._celery = nous_celery.register(app, tools="hostile_tools")
        return self._celery

    def flask_app(self) -> Any:
        if self._flask is None:
            spec = importlib.util.spec_from_file_location("hostile_flask_events", ROOT / "examples" / "flask_events.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            self._flask = module.create_app(tools=TOOLS, timeout=WAIT)
        return self._flask

    def asgi_url(self) -> str:
        """examples/asgi_events.py on a real uvicorn in a thread, started on first use: its base URL."""
        if self._asgi is None:
            import threading
            import time

            import uvicorn

            spec = importlib.util.spec_from_file_location("hostile_asgi_events", ROOT / "examples" / "asgi_events.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            app = module.create_app(tools=TOOLS, timeout=WAIT, approval_handler=lambda request: True)
            config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", timeout_graceful_shutdown=5)
            server = uvicorn.Server(config)
            thread = threading.Thread(target=server.run, name="test-hostile-uvicorn", daemon=True)
            thread.start()
            deadline = time.monotonic() + WAIT
            while not server.started:
                assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
                time.sleep(0.01)

            def stop() -> None:
                server.should_exit = True
                thread.join(30)

            self._stack.callback(stop)
            self._asgi = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        return self._asgi

    def django(self) -> "_DjangoServer":
        """examples/django_project on a threaded WSGI server in a process of its own, started on first use."""
        if self._django is None:
            self._django = self._stack.enter_context(_DjangoServer.started(self._tmp))
        return self._django

    def postgres(self) -> Any:
        if self._postgres is None:
            from postgres_server import postgres_process

            self._postgres = self._stack.enter_context(postgres_process())
        return self._postgres

    def server(self, transport: str) -> _Server:
        if transport not in self._servers:
            self._servers[transport] = self._start(transport)
        return self._servers[transport]

    def _start(self, transport: str) -> _Server:
        audit = self._tmp / f"audit-{transport}.jsonl"
        argv = ["-m", "nous_sched", "serve-mcp", "--tools", TOOLS_FILE, "--audit-log", str(audit)]
        alive: Callable[[], bool]
        if transport == "stdio":
            target: Any = StdioServerParameters(command=sys.executable, args=argv, cwd=str(ROOT))
            alive = lambda: True  # noqa: E731  (the SDK owns the process: the next call answering says it lives)
        else:
            process = subprocess.Popen(
                [sys.executable, *argv, "--http", "127.0.0.1:0"], stderr=subprocess.PIPE, text=True, cwd=ROOT
            )
            self._stack.callback(_stop, process)
            line = process.stderr.readline()
            assert " at http://127.0.0.1:" in line, line
            target = line.split(" at ", 1)[1].split(";", 1)[0]
            alive = lambda: process.poll() is None  # noqa: E731
        portal = self._stack.enter_context(anyio.from_thread.start_blocking_portal())
        logs: list[Any] = []

        async def on_log(params: Any) -> None:
            logs.append(params.data)

        client = self._stack.enter_context(
            portal.wrap_async_context_manager(Client(target, mode="legacy", logging_callback=on_log))
        )
        server = _Server(portal, client, audit, logs, alive)
        server.url = target if isinstance(target, str) else ""
        return server


def _stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(30)
    finally:
        process.kill()
        process.stderr.close()


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    shared = _Shared(tmp_path_factory.mktemp("hostile"))
    yield shared
    shared.close()


@pytest.fixture
def library_log():
    """What the nous_sched logger's records look like through an ordinary handler, at INFO."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("nous_sched")
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield stream
    logger.removeHandler(handler)
    logger.setLevel(old)


# -- the matrix ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("entry_name, value_name", CELLS, ids=[f"{e}-{v}" for e, v in CELLS])
def test_hostile_value(entry_name, value_name, shared, tmp_path, monkeypatch, library_log):
    entry, value = ENTRIES_BY_NAME[entry_name], VALUES_BY_NAME[value_name]
    env = Env(tmp_path, shared, monkeypatch)
    program = value.raw if value.raw is not None else program_of(value)
    seen = entry.enter(program, "describe: " + value.text, env)
    seen.outputs["logging"] = library_log.getvalue()

    # A result or a clear error, the one the value must give.
    if value.expect == "ok":
        assert seen.ok, (seen.error_kind, seen.answer[:500])
    else:
        assert not seen.ok and seen.error_kind in value.kinds, (seen.error_kind, seen.answer[:500])
    assert seen.ok or seen.error_kind in (*ERROR_KINDS, "refused", "usage")

    # Every output path it writes, escaped or strict by its kind.
    assert set(seen.outputs) <= set(entry.paths), set(seen.outputs) - set(entry.paths)
    for path, output in seen.outputs.items():
        try:
            OUTPUT_PATHS[path](output)
        except Exception as exc:
            raise AssertionError(f"output path {path}: {exc!r}") from exc

    # The host and other runs unharmed: an honest run through the same door, right after.
    honest = entry.enter(HONEST, "an honest run", env)
    assert honest.ok and "honest 1" in honest.answer, (honest.error_kind, honest.answer[:500])


def test_every_output_path_is_written_by_an_entry_point_and_every_value_is_a_row():
    written = {path for entry in ENTRY_POINTS for path in entry.paths}
    assert written == set(OUTPUT_PATHS)
    assert {value for _, value in CELLS} == set(VALUES_BY_NAME)
    assert {entry for entry, _ in CELLS} == set(ENTRIES_BY_NAME)


def test_the_cells_of_issue_34_are_in_the_matrix():
    cells = set(CELLS) | set(SUSPENDED_CELLS)
    for item, wanted in ISSUE_34.items():
        assert wanted and set(wanted) <= cells, item


# -- a suspension within the budget (issue 34, item 7) ------------------------------------------------

#: The doors a run can suspend by, each with its runtime option, and the durable cases
#: (huge arguments, a flood of logs, hostile text, many pending calls) as rows.
SUSPENDING_DOORS = {"run_code": {}, "run_code_in_process": {"runtime": QuickJSRuntime()}}
SUSPENDED_CELLS = [(door, case) for door in SUSPENDING_DOORS for case in suspended_budget.CASES]


@pytest.mark.parametrize("door, case", SUSPENDED_CELLS, ids=[f"{d}-{c}" for d, c in SUSPENDED_CELLS])
def test_a_suspended_answer_fits_the_budget_and_carries_its_token(door, case, tmp_path):
    store = SqliteApprovalStore(str(tmp_path / "approvals.db"))
    result = suspended_budget.suspend_case(case, store, 2000, timeout=WAIT, **SUSPENDING_DOORS[door])
    suspended_budget.check_suspended_answer(result, 2000, pending=suspended_budget.CASES[case][1])
    # The host unharmed: the same door answers an honest program right after.
    assert run_code(HONEST, TOOLS, description="honest", timeout=WAIT, **SUSPENDING_DOORS[door]).ok


def test_the_terminal_check_can_fail():
    # The checks the matrix relies on catch what they are for.
    for raw in ("\ud800", "\x00", "\x1b", "\x9b", "\u202e", "\U000e0041", "\u061c", "\u2028"):
        with pytest.raises((AssertionError, UnicodeEncodeError)):
            check_terminal("a" + raw)
    with pytest.raises(orjson.JSONDecodeError):
        check_wire('"\\ud800"')  # strict: even an escaped lone surrogate is refused
    with pytest.raises(TypeError):
        check_wire_value({"k": "\ud800"})
    check_terminal("tab\tnewline\n\U0001f600 é \ufffd")


def test_serve_mcp_lists_a_tool_whose_own_description_holds_a_lone_surrogate():
    # The tools module's strings leave through serve-mcp too: its tools/list is what the SDK writes.
    from nous_sched import Tool
    from nous_sched.mcp import CodeModeServer

    tool = Tool("echo", lambda args: args, description="echoes \ud800 back\u202e")
    server = CodeModeServer([tool], timeout=WAIT, runtime=QuickJSRuntime())

    async def go() -> tuple[Any, Any]:
        with anyio.fail_after(WAIT):
            async with Client(server.server, mode="legacy") as client:
                listed = await client.list_tools()
                result = await client.call_tool("run_code", {"code": HONEST, "description": "honest"})
                return listed, result

    listed, result = anyio.run(go)
    description = listed.tools[0].description
    assert "echoes \ufffd back\u202e" in description and "\ud800" not in description
    assert result.structured_content == {"logs": ["honest 1"], "result": "honest 1"}


# -- issue 40: a bound value (Tool.bound, run_code's bind) is a hostile value's way in too ---------


def _bound_value(value: Hostile) -> Any:
    if value.raw is not None:
        return value.raw  # bytes: a host value need not be JSON
    if value.name == "non_finite_numbers":
        return [float("nan"), float("inf"), float("-inf"), -0.0, value.text]
    if value.name in ("deep_nesting", "too_deep"):
        deep: Any = value.text
        for _ in range(len(value.text)):
            deep = [deep]
        return deep
    return value.text


@pytest.mark.parametrize("value", VALUES, ids=[v.name for v in VALUES])
def test_a_hostile_bound_value_reaches_the_tool_and_is_shown_nowhere(value: Hostile, caplog: Any) -> None:
    from nous_sched import Bind, Tool
    from nous_sched.tooling import MIN_REDACTED_CHARS

    caplog.set_level(logging.DEBUG, logger="nous_sched")
    hostile = _bound_value(value)
    got: list[Any] = []

    def take(args: dict[str, Any]) -> Any:
        got.append((args["fixed"], args["per_run"]))
        raise ValueError(f"echo {args['fixed']!r} {args['per_run']!r}")  # an error echoing both: redacted

    schema = {"type": "object", "properties": {"q": {"type": "string"}, "fixed": {}, "per_run": {}}}
    tool = Tool("take", take, parameters=schema, bound={"fixed": hostile, "per_run": Bind("v")}, requires_approval=True)
    questions: list[str] = []
    run = start_run(
        'try { await tools.take({q: "x"}); } catch (e) { console.log(e.message); }\nreturn "done";',
        [tool],
        description="bound",
        bind={"v": hostile},
        approval_handler=lambda request: questions.append(request.question()) or True,
        timeout=WAIT,
        runtime=QuickJSRuntime(),
    )
    events = [json.dumps(e.data, ensure_ascii=False, default=repr) for e in run.events()]
    result = run.result(WAIT)
    assert result.result == "done", result.error
    assert len(got) == 1 and got[0][0] is hostile and got[0][1] is hostile  # the very object, both ways
    shown = [
        repr(result),
        json.dumps(result.for_model(), ensure_ascii=False),
        json.dumps([e.as_event().data for e in result.events], ensure_ascii=False, default=repr),
        events,
        questions,
        repr(tool),
        caplog.text,
    ]
    # A bound string shorter than MIN_REDACTED_CHARS is not looked for in error messages (documented).
    needles = [value.text] if len(value.text) >= MIN_REDACTED_CHARS else []
    needles += [repr(hostile)[:200]] if needles or value.raw is not None else []
    for text in map(str, shown):
        for needle in needles:
            assert needle not in text, (value.name, needle[:40])
    assert "[bound]" in questions[0]


# -- a review's deny reason holding a hostile value --------------------------------------------------


@pytest.mark.parametrize("value_name", [v.name for v in VALUES if v.raw is None])
def test_a_review_deny_reason_holding_a_hostile_value_is_escaped_on_every_path(value_name, library_log):
    from nous_sched import ReviewDecision

    value = VALUES_BY_NAME[value_name]
    program = _with_literal_call(program_of(value))

    def deny(request: Any) -> Any:
        said = "; ".join(request.summary.describe())
        return ReviewDecision.deny(f"{value.text} | {said} | {request.description}")

    run = start_run(program, TOOLS, description="describe: " + value.text, review=deny, timeout=WAIT)
    lines = "\n".join(event.to_json() for event in run.events())
    result = run.result(timeout=WAIT)
    assert result.error.kind == "review_denied" and result.events == ()
    check_json_lines(lines)
    text = call_tool(run_code_tool(TOOLS, timeout=WAIT, review=deny), {"code": program, "description": value.text})
    assert orjson.loads(text)["error"]["kind"] == "review_denied"
    check_wire(text)
    check_terminal(library_log.getvalue())
    # The host and other runs unharmed: an honest run right after.
    assert run_code(HONEST, TOOLS, description="an honest run", timeout=WAIT).ok


def test_the_blob_row_is_a_handle_whose_preview_holds_the_hostile_head():
    # What the blob_of_hostile_values cells send through every output path: a handle, not the bytes.
    result = run_code(program_of(VALUES_BY_NAME["blob_of_hostile_values"]), TOOLS, description="blob row")
    assert result.error is None, result.error
    handle = result.result["back"]["v"]
    assert set(handle) == {"$blob", "kind", "size", "length", "preview"} and handle["kind"] == "text"
    assert handle["preview"].startswith(BLOB_HEAD) and len(handle["preview"]) == 81

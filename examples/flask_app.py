"""A Flask front end for nous_sched: ``POST /run`` runs a model-written program.

Request body (JSON)::

    {"code": "<JavaScript>", "description": "<one sentence>", "max_parallel": 4}

``max_parallel`` is optional (1 .. ``NOUS_MAX_PARALLEL``). The answer is
:meth:`nous_sched.RunResult.to_dict` as JSON with status 200, also when the
program failed (a failure is data: ``{"logs", "error": {"kind", "message"}}``);
input that is not such an object gets 400 with ``{"error": "<what is wrong>"}``.

Every run gets its own :class:`~nous_sched.Scheduler` (``max_parallel`` caps
how many of *its* calls run at once) but all runs share one
``ThreadPoolExecutor`` for their tools, so the process holds a bounded number
of tool threads however many requests arrive.

The ``X-User`` header is put in a ``contextvars.ContextVar`` before the view
runs; the ``whoami`` tool reads it back on a pool thread, because nous_sched
runs every tool in a copy of the submitting (request) thread's context.

Needs Flask (the ``web`` extra). Run it from the repository root with::

    flask --app examples/flask_app.py run
    curl -s localhost:5000/run -H 'X-User: ada' -H 'Content-Type: application/json' \\
         -d '{"code": "return await tools.whoami({})", "description": "who am I"}'
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import secrets
import threading
from typing import Any, Callable, Optional, Union

from flask import Flask, g, jsonify, request

from nous_sched import CodeRuntime, ConfigError, RunCodeError, Tool, ToolError, current_call, run_code

__all__ = ["create_app", "request_user", "TOOLS"]

#: The user of the request being served; set from ``X-User`` for each request.
request_user: contextvars.ContextVar[str] = contextvars.ContextVar("request_user", default="anonymous")

MAX_BODY = 256 * 1024


# --- example tools ------------------------------------------------------------------


def _whoami(args: dict) -> dict:
    info = current_call.get()
    return {"user": request_user.get(), "call": info.id if info else None}


def _add(args: dict) -> Any:
    a, b = args.get("a"), args.get("b")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b)):
        raise ToolError("add needs two numbers, `a` and `b`", "add")
    return a + b


_CITIES = {
    "paris": {"country": "France", "population": 2_102_650},
    "lagos": {"country": "Nigeria", "population": 15_388_000},
    "lima": {"country": "Peru", "population": 10_092_000},
    "osaka": {"country": "Japan", "population": 2_752_412},
}


def _city(args: dict) -> dict:
    name = args.get("name")
    if not isinstance(name, str) or name.lower() not in _CITIES:
        raise ToolError(f"unknown city {name!r}; try one of {sorted(_CITIES)}", "city")
    return {"name": name.lower(), **_CITIES[name.lower()]}


_notes_lock = threading.Lock()
_notes: list = []  # the last 100 notes
_notes_made = 0


def _note(args: dict) -> int:
    """A tool with a side effect: exclusive (no concurrency_safe), so one run's notes never interleave.

    Returns the note's number (1, 2, ...), counted across all requests.
    """
    global _notes_made
    text = args.get("text")
    if not isinstance(text, str):
        raise ToolError("note needs a string `text`", "note")
    with _notes_lock:
        _notes_made += 1
        _notes.append({"n": _notes_made, "user": request_user.get(), "text": text[:200]})
        del _notes[:-100]
        return _notes_made


def _read_only(args: dict) -> bool:
    return True


TOOLS = [
    Tool(
        "whoami",
        _whoami,
        description="The user this request runs for.",
        parameters={"type": "object", "properties": {}},
        concurrency_safe=_read_only,
    ),
    Tool(
        "add",
        _add,
        description="a + b.",
        parameters={
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
        concurrency_safe=_read_only,
    ),
    Tool(
        "city",
        _city,
        description="Facts about a city.",
        parameters={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
        concurrency_safe=_read_only,
    ),
    Tool(
        "note",
        _note,
        description="Append a note; returns its number.",
        parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        category="write",
    ),
]


# --- the app ------------------------------------------------------------------------


def _bad(message: str):
    return jsonify({"error": message}), 400


def _runtime_chooser(
    runtime: Union[CodeRuntime, Callable[[str], CodeRuntime], None],
) -> Optional[Callable[[str], CodeRuntime]]:
    if runtime is None:
        return None
    if isinstance(runtime, CodeRuntime):
        fixed = runtime
        return lambda _user: fixed
    return runtime


def create_app(
    executor: Optional[concurrent.futures.Executor] = None,
    *,
    max_parallel: int = 4,
    timeout: float = 10.0,
    pool_size: int = 16,
    runtime: Union[CodeRuntime, Callable[[str], CodeRuntime], None] = None,
) -> Flask:
    """The Flask app.

    :param executor: where every run's tools execute, shared by all requests.
        Yours is used as is and never shut down here. Without one the app
        makes a ``ThreadPoolExecutor`` of ``pool_size`` threads named
        ``flask-run-tools-*``, kept in ``app.extensions["nous_sched"]["executor"]``
        (shut it down when the app goes away, if it ever does before the process).
    :param max_parallel: the default and the ceiling of a run's ``max_parallel``.
    :param timeout: each run's wall-clock deadline, in seconds. Keep it below your
        server's request timeout so a runaway program comes back as a
        ``"timeout"`` result instead of a killed worker.
    :param runtime: what runs each program. ``None`` (the default): ``run_code``'s
        default, a fresh worker process of the process's pool per run (one-shot).
        A :class:`~nous_sched.CodeRuntime`: every run uses it. A callable
        ``user -> CodeRuntime``: called for each request with its ``X-User``
        (``"anonymous"`` without one), e.g. ``lambda user: pool.domain(user)`` so
        that each user's runs reuse that user's warm workers and no worker ever
        serves two users (:meth:`~nous_sched.WorkerPool.domain`). Anything else
        is a :class:`~nous_sched.ConfigError` naming ``runtime``.
    """
    if runtime is not None and not isinstance(runtime, CodeRuntime) and not callable(runtime):
        raise ConfigError(
            f"create_app: `runtime` must be a CodeRuntime, a callable user -> CodeRuntime or None, not {runtime!r}"
        )
    runtime_for = _runtime_chooser(runtime)
    app = Flask(__name__)
    app.config.update(MAX_CONTENT_LENGTH=MAX_BODY, NOUS_MAX_PARALLEL=max_parallel, NOUS_RUN_TIMEOUT=timeout)
    owned = executor is None
    if executor is None:
        executor = concurrent.futures.ThreadPoolExecutor(pool_size, thread_name_prefix="flask-run-tools")
    app.extensions["nous_sched"] = {"executor": executor, "owns_executor": owned, "tools": TOOLS}

    @app.before_request
    def _bind_user() -> None:
        g.nous_user_token = request_user.set(request.headers.get("X-User") or "anonymous")

    @app.teardown_request
    def _unbind_user(_exc: Optional[BaseException]) -> None:
        token = g.pop("nous_user_token", None)
        if token is not None:
            try:
                request_user.reset(token)
            except ValueError:  # a server that tears down in another context: nothing of ours to undo
                pass

    @app.post("/run")
    def run():
        body = request.get_json(silent=True, force=True)
        if not isinstance(body, dict):
            return _bad('the body must be a JSON object: {"code": "<program>", "description": "<one sentence>"}')
        code = body.get("code")
        description = body.get("description")
        if not isinstance(code, str) or not code.strip():
            return _bad("`code` must be a non-empty string: the JavaScript program to run")
        if not isinstance(description, str) or not description.strip():
            return _bad("`description` must be a non-empty string: one sentence saying what the program does")
        ceiling = app.config["NOUS_MAX_PARALLEL"]
        parallel = body.get("max_parallel", ceiling)
        if type(parallel) is not int or not 1 <= parallel <= ceiling:
            return _bad(f"`max_parallel` must be an integer from 1 to {ceiling}")
        options: dict[str, Any] = {}
        if runtime_for is not None:
            options["runtime"] = runtime_for(request_user.get())
        try:
            result = run_code(
                code,
                TOOLS,
                **options,
                description=description,
                executor=executor,
                max_parallel=parallel,
                timeout=app.config["NOUS_RUN_TIMEOUT"],
                call_id="http-" + secrets.token_urlsafe(6),
            )
        except RunCodeError as exc:  # nothing ran: a server problem (no runtime), not the caller's
            app.logger.error("run_code could not run: %s", exc)
            return jsonify({"error": str(exc)}), 500
        return jsonify(result.to_dict()), 200

    @app.errorhandler(413)
    def _too_large(_exc):
        return _bad(f"the body is larger than {MAX_BODY} bytes")

    return app


if __name__ == "__main__":  # pragma: no cover - manual use
    create_app().run(host="127.0.0.1", port=5000, threaded=True)

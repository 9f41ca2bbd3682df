"""Serve Code Mode over MCP: one ``run_code`` tool whose programs call a set of tools.

:class:`CodeModeServer` is an MCP server (the SDK's low-level ``Server``) with
exactly one tool, ``run_code``. Its description carries the SDK of the tools
the policy grants; its arguments are ``code`` and ``description``; its result
is ``{"logs", "result"}`` or ``{"logs", "error": {kind, message}}`` as
structured content (and as JSON text), with ``isError`` set when the program
failed. ``nous-sched serve-mcp`` runs one over stdio or Streamable HTTP.

Every sub-call passes the same gate as in :func:`~nous_sched.run_code`: the
policy filters the tools, and a call that needs approval asks, per call,
with its real arguments:

* a tool the operator pre-approved (``approve``) is approved at once;
* otherwise, when the MCP client declared the elicitation capability, the
  user is asked through it: a form with an ``approve`` checkbox and its
  ``scope``: ``once`` (this call), ``next`` (this call and the next calls
  to the tool, ``calls`` in all) or ``matching`` (the calls to the tool
  whose ``keys`` arguments, comma-separated, equal this call's): a
  :class:`~nous_sched.Grant`, for this run only; a scope the form cannot
  make a grant of refuses the call. On a
  2026-07-28 connection the question rides an ``InputRequiredResult`` (the
  run waits, paused, for the client's retry); on an older one it is an
  ``elicitation/create`` request in the middle of the call. Questions
  already waiting when one goes out go out with it;
* otherwise, with an ``approval_store`` among the run options, the run
  suspends (:mod:`nous_sched.durable`): the result's structured content is
  ``{"logs", "suspended": {token, expires_at, pending, claim}}``, for an
  operator's ``nous-sched approvals list|approve|deny --store ...``; the
  client then polls the second tool, ``run_result`` (listed only with an
  approval store), with ``{token, claim}``: the suspension again while a call
  is undecided, then the resumed run's result (serve-mcp resumes it on that
  poll), to that client only (:mod:`.deliver`);
* otherwise the call is refused (default deny: a server has no human at hand).

An unanswered question is refused when the run's deadline passes (a second
later, so the run reports its own ``timeout``).

Cancellation: when the client cancels a ``run_code`` call
(``notifications/cancelled``), the run is cancelled as by
:func:`~nous_sched.run_code`'s ``cancel``: the program stops at once, its open
questions are refused, and the audit's ``run_end`` says ``cancelled``.

Audit: with ``audit_log``, every run, approval decision and sub-call is
written to that file as one JSON object per line, each call *before* the tool
runs (``run_start``, ``tool_call``, ``tool_refused``, ``approval``,
``tool_outcome``, ``run_end``; all carry ``ts`` and ``run``). The
``tool_call``, ``tool_refused``, ``approval`` and ``tool_outcome`` lines carry
the fields of the audit records :func:`~nous_sched.run_code` returns in
``RunResult.events`` and the ``SessionLog`` (:mod:`nous_sched.events`: one
schema): ``approval`` has ``seq``, ``tool``, ``approved`` and ``reason`` (plus
``call``, ``arguments``, ``decision`` and ``by``: who answered);
``tool_outcome`` has ``seq``, ``tool``, ``ok``, ``error`` (``null`` or
``{kind, message}``) and ``bytes`` (plus ``call``). A call the gate refuses (a
denied tool, arguments that fail the schema, a call past the budget) is in
the file too. (The outcome line was ``tool_result`` before: see the CHANGELOG.)

Live: a run's console lines go to the client as ``notifications/message``
while it runs (levels from ``console.log``/``warn``/``error``; lines below
the session's ``logging/setLevel`` are not sent; bounded as the run's logs
are, which the result still carries), and, when the call carries a progress
token, each committed call is a ``notifications/progress`` in commit order,
as is each wait for an approval. Every notification is sent before the
result. See :mod:`.live_forward` (built on the run's live event stream,
:mod:`nous_sched.live`). Over HTTP, POST SSE streams start with a priming
event with an id and a ``retry`` field (SEP-1699, :mod:`.event_store`).

Fair sharing (:mod:`.shares`): one client may have at most
``max_runs_per_session`` runs going at once (default: half the worker pool's
real size, at least 1); a ``run_code`` call past that is refused at once, as
data, so one client waiting on approvals it never answers cannot hold every
worker. A client is its authenticated principal where bearer tokens are
configured, else its connection; never a header it chooses freely.

Over HTTP (:mod:`.access`): every loopback binding checks ``Host`` and
``Origin`` (DNS-rebinding protection); any other binding needs bearer-token
authorization (``token_verifier``), or the server refuses to start.

Strings: any string a program writes is data. What the SDK writes for the
server (results, log and progress notifications, questions) has each lone
surrogate replaced by U+FFFD, and audit lines are strict JSON with control
and format characters escaped (:mod:`nous_sched._text`, the rules every
output path follows): no value can stop a writer, so no value can take the
connection down with it.

Threads: each run gets its own thread, ``nous-sched-mcp-run-<n>``, and its
own scheduler, as :func:`~nous_sched.run_code` makes.
"""

from __future__ import annotations

import contextvars
import hashlib
import itertools
import json
import logging
import secrets
import threading
import time
import weakref
from functools import partial
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import anyio
import anyio.to_thread
import attrs
from mcp.server import Server as LowLevelServer
from mcp.server.auth.provider import TokenVerifier
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    EmptyResult,
    InputRequiredResult,
    ListToolsResult,
    PaginatedRequestParams,
    SetLevelRequestParams,
    TextContent,
    ToolAnnotations,
)
from mcp_types import Tool as MCPTool
from mcp_types.version import is_version_at_least

from .. import sdk
from .._run.options import GIVEN_NOT, NotGiven, RunOptions, build
from .._run.runner import check_binds, live_stream
from .._text import machine_json, machine_text, machine_value
from .._validators import NAMES, OPTIONAL_CALLABLE, POSITIVE_INT, TOOLS, instance_of, names, optional, require
from ..agent import _run_code_tool as agent
from ..durable import resume
from ..durable.approval_store import TokenError
from ..errors import ConfigError, RunCodeError, ToolError
from ..events import Event, SessionLog
from ..gate.approval_seam import ApprovalStoreSeam
from ..gate.dispatch import ApprovalRequest, current_call, direct_dispatch
from ..gate.grants import MAX_CALLS, Grant, grant_id
from ..gate.policy import PermissionPolicy, partition
from ..limits import Limits
from ..live import EventStream
from ..result.budget import DEFAULT_OUTPUT_BUDGET
from ..state import State, StateStoreSeam
from ..tooling import Tool
from .access import auth_settings, transport_security
from .client import DEADLINE_GRACE
from .deliver import NOT_YOURS, Deliveries, Delivery
from .event_store import PrimingEventStore
from .live_forward import Forwarder, SessionLevels
from .shares import STDIO_CLIENT, Shares, client_keys, default_cap, pool_size

__all__ = ["CodeModeServer", "AuditLog", "OUTPUT_SCHEMA"]

log = logging.getLogger("nous_sched")

_MODERN = "2026-07-28"  # the first revision that carries elicitation in InputRequiredResult
#: The SSE ``retry`` (milliseconds) serve-mcp suggests to Streamable HTTP clients.
RETRY_MS = 1000
_KEEP_FINISHED = 120.0  # seconds a finished run waits for a retry that collects it
#: Seconds :meth:`CodeModeServer.close` waits, in all, for the runs it cancels to write their ``run_end``.
CLOSE_TIMEOUT = 10.0

#: The JSON Schema of ``run_code``'s structured result.
OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "logs": {"type": "array", "items": {"type": "string"}},
        "result": {},
        "error": {
            "type": "object",
            "properties": {"kind": {"type": "string"}, "message": {"type": "string"}},
            "required": ["kind", "message"],
        },
        # A run that suspended for approval (serve-mcp with --approval-store; nous_sched.durable).
        "suspended": {
            "type": "object",
            "properties": {
                "token": {"type": "string"},
                "expires_at": {"type": "number"},
                "pending": {"type": "array"},
                "claim": {"type": "string"},  # the secret run_result asks for (.deliver)
            },
            "required": ["token", "expires_at", "pending"],
        },
        # run_result, while a pending call is undecided: their seqs.
        "waiting": {"type": "array", "items": {"type": "integer"}},
    },
    "required": ["logs"],
}

#: The elicitation form's ``scope`` choices: this call, the next ``calls``, the calls matching ``keys``.
GRANT_SCOPES = ("once", "next", "matching")


_APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {
            "type": "boolean",
            "title": "Approve this call",
            "description": "Let the program make this one tool call with these arguments.",
            "default": False,
        },
        # Grants (nous_sched.gate.grants): what else the approval covers, in this run only.
        "scope": {
            "type": "string",
            "title": "Approve",
            "description": "once: this call only; next: this call and the next calls to this tool, "
            "`calls` in all; matching: the calls to this tool whose `keys` arguments equal this call's",
            "enum": list(GRANT_SCOPES),
            "default": "once",
        },
        "calls": {
            "type": "integer",
            "title": "Calls in all (with next)",
            "minimum": 1,
            "maximum": MAX_CALLS,
        },
        "keys": {
            "type": "string",
            "title": "Argument names, comma-separated (with matching)",
        },
    },
    "required": ["approve"],
}

#: The second tool, listed with an approval store: a suspended run's result, polled (:mod:`.deliver`).
RUN_RESULT = "run_result"
_RUN_RESULT_TOOL = MCPTool(
    name=RUN_RESULT,
    title="Result of a suspended run",
    description=(
        "When run_code answered with `suspended` (a call waits for an operator's approval), call this with "
        "that suspension's `token` and `claim` to get the run's result. While a call is still undecided the "
        "answer is the suspension again with `waiting` (the undecided call numbers): call again later. Once "
        "every call is decided the run continues and the answer is what run_code would have returned."
    ),
    input_schema={
        "type": "object",
        "properties": {"token": {"type": "string"}, "claim": {"type": "string"}},
        "required": ["token", "claim"],
    },
    output_schema=OUTPUT_SCHEMA,
    annotations=ToolAnnotations(
        title="Result of a suspended run",
        read_only_hint=False,
        destructive_hint=True,
        idempotent_hint=False,
        open_world_hint=True,
    ),
)
_runs_started = itertools.count(1)
_OPTIONAL_POSITIVE_INT = optional(POSITIVE_INT)
_POLICY = optional(instance_of(PermissionPolicy, "a nous_sched.PermissionPolicy"))


def _audited_code(code: Any, options: RunOptions) -> dict[str, Any]:
    """The program as ``run_start`` records it: whole when ``run_code`` may run
    it, else only its size (it is refused before it runs, and an audit line the
    size of any program a client sends would let one client fill the disk)."""
    limits = options.limits or Limits()
    if isinstance(code, str) and len(code) > limits.max_code_bytes:
        return {"code": None, "code_chars": len(code)}
    return {"code": code}


class AuditLog:
    """Audit events as JSON lines; thread-safe, each line flushed as it is written.

    ``target`` is a path (appended to) or an open text file (left open).
    """

    def __init__(self, target: Union[str, Path, IO[str]]) -> None:
        self._lock = threading.Lock()  # guards the file: lines from many runs must not interleave
        if isinstance(target, (str, Path)):
            try:
                self._file: IO[str] = open(target, "a", encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"audit log {target}: cannot open it: {exc.strerror or exc}") from None
            self._owned = True
        else:
            self._file, self._owned = target, False

    def write(self, event: str, **fields: Any) -> None:
        # Strict JSON, readable UTF-8 and inert on a terminal (nous_sched._text):
        # raw, a lone surrogate could not be encoded at all.
        line = machine_json({"ts": round(time.time(), 6), "event": event, **fields}, default=str)
        with self._lock:
            try:
                self._file.write(line + "\n")
                self._file.flush()
            except (OSError, ValueError):
                log.error("cannot write the audit log; event lost: %s", line)

    def close(self) -> None:
        if self._owned:
            with self._lock:
                self._file.close()


class _Ask:
    """One approval question: asked on a tool thread, answered from the event loop."""

    __slots__ = ("key", "request", "deadline", "approved", "by", "answered")

    def __init__(self, key: str, request: ApprovalRequest, deadline: Optional[float]) -> None:
        self.key = key
        self.request = request
        self.deadline = deadline
        self.approved: Any = False  # True, False or a Grant
        self.by = "timeout"
        self.answered = threading.Event()

    def answer(self, approved: Any, by: str) -> None:
        if not self.answered.is_set():
            self.approved, self.by = approved, by
            self.answered.set()


class _Run:
    """One ``run_code`` call: the program runs on its own thread; questions and the result come out here.

    ``_cond`` guards ``_unsent``, ``_sent``, ``result``, ``finished_at`` and
    ``_abandoned``; the event-loop side reads them through :meth:`next`.
    ``cancel`` is the run's ``cancel`` event: set when the client cancels the
    call, it stops the program at once (a ``cancelled`` error, logs kept).
    """

    def __init__(self, run_id: str, description: str, can_ask: bool) -> None:
        self.id = run_id
        self.token = secrets.token_urlsafe(24)
        self.description = description
        self.can_ask = can_ask
        self.result: Optional[tuple[str, Any]] = None
        self.finished_at: Optional[float] = None
        self._cond = threading.Condition()
        self._unsent: list[_Ask] = []
        self._sent: dict[str, _Ask] = {}
        self._keys = itertools.count(1)
        self._abandoned: Optional[str] = None  # why nobody will answer any more
        self.cancel = threading.Event()
        self.client: tuple[Any, ...] = ()  # who started it (shares.client_keys), for its per-client cap
        self.live = EventStream()  # the run's live events (nous_sched.live), read by a Forwarder
        self.forwarded = (0, 0)  # (events, commits) a Forwarder already handled, for a retry's Forwarder

    def ask(self, request: ApprovalRequest, deadline: Optional[float]) -> _Ask:
        """Post a question and wait for its answer, at most until ``deadline`` (tool thread)."""
        with self._cond:
            ask = _Ask(f"approve-{next(self._keys)}", request, deadline)
            if self._abandoned is not None:
                ask.answer(False, self._abandoned)
                return ask
            self._unsent.append(ask)
            self._cond.notify_all()
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        ask.answered.wait(remaining)
        with self._cond:
            if ask in self._unsent:
                self._unsent.remove(ask)
            self._sent.pop(ask.key, None)
        ask.answer(False, "timeout")  # a no-op when the answer came in time
        return ask

    def next(self) -> tuple[str, Any]:
        """Block until the run is over (``("done", result)``) or has questions (``("ask", [asks])``)."""
        with self._cond:
            while True:
                if self.result is not None:
                    return ("done", self.result)
                if self._unsent:
                    asks, self._unsent = self._unsent, []
                    self._sent.update((a.key, a) for a in asks)
                    return ("ask", asks)
                self._cond.wait()

    def answer(self, key: str, approved: bool, by: str) -> None:
        with self._cond:
            ask = self._sent.pop(key, None)
        if ask is not None:
            ask.answer(approved, by)

    def respond(self, key: str, response: Any, by: str) -> None:
        """The client's elicitation ``response`` to question ``key``: True, False or a Grant (:func:`_accepted`)."""
        with self._cond:
            ask = self._sent.pop(key, None)
        if ask is not None:
            ask.answer(_accepted(response, ask.request.arguments), by)

    def abandon(self, why: str) -> None:
        """Nobody will answer any more (``why``: "run over", "cancelled", "server closed"):
        refuse every open question and every later one."""
        with self._cond:
            self._abandoned = why
            open_asks, self._unsent = [*self._unsent, *self._sent.values()], []
            self._sent.clear()
        for ask in open_asks:
            ask.answer(False, why)

    def finish(self, result: tuple[str, Any]) -> None:
        with self._cond:
            self.result = result
            self.finished_at = time.monotonic()
            self._cond.notify_all()

    def wait_finished(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`finish` (its ``run_end`` is written before); whether it came."""
        with self._cond:
            return self._cond.wait_for(lambda: self.result is not None, timeout)


#: The run options the server sets per run: none may be given to it.
#: The scope of the one client a stdio process serves (``state_store``): the same in every such process.
STDIO_SCOPE = "mcp-stdio"
_STATE_STORE = optional(instance_of(StateStoreSeam, "a state store (SqliteStateStore, RedisStateStore...)"))
_PER_RUN = ("approval_handler", "dispatch", "call_id", "session_log", "description", "cancel")


def _refuse_per_run(options: RunOptions) -> None:
    set_in = {
        "approval_handler": options.approval_handler is not None,
        "dispatch": options.dispatch is not direct_dispatch,
        "call_id": options.call_id is not None,
        "session_log": options.session_log is not None,
        "description": options.description is not None,
        "cancel": options.cancel is not None,
    }
    for option in _PER_RUN:
        if set_in[option]:
            raise ConfigError(f"CodeModeServer: `{option}` is set per run by the server; it cannot be given")


class CodeModeServer:
    """An MCP server with one ``run_code`` tool over ``tools``; see the module docstring.

    :param tools: the tools programs may call (``conn.tools()`` of upstream MCP
        servers, a module's ``TOOLS``, or both).
    :param policy: which tools are granted and which need approval.
    :param approve: names of tools whose calls are approved without asking.
    :param audit_log: a path or an open text file for the JSON-lines audit; ``None`` for none.
    :param max_runs_per_session: most runs one client (its authenticated
        principal, else its connection: :mod:`.shares`) may have going at
        once; a ``run_code`` call past it is refused at once with an error
        result saying so, and nothing runs. ``None``: half the runtime's
        worker pool, at least 1 (:func:`.shares.default_cap`), so one client
        waiting on approvals it never answers leaves the other half to others.
    :param run_options: passed to every :func:`~nous_sched.run_code` (``timeout``,
        ``max_parallel``, ``runtime``, ``limits``, ``executor``...), except
        ``budget`` and ``ranking``, which shape the description as in
        :func:`~nous_sched.run_code_tool` (rendered once, not per run).
    :param options: every run's options as one :class:`~nous_sched.RunOptions`
        instead of keywords (its fields as they are: its ``output_budget``
        default is ``None``, no limit); an option given both ways, or one the
        server sets per run set in it, is a :class:`~nous_sched.ConfigError`
        naming it.
    :param state_store: a state store (:class:`~nous_sched.StateStoreSeam`):
        each client's runs get their own scope of it (``run_code``'s
        ``state``): a client is its authenticated principal (its bearer
        token's name: every connection of that principal shares the scope),
        else its MCP session (a handshake-era connection: a scope of its own
        while it lasts); over stdio, the one client, scope ``mcp-stdio`` (the
        same in every such process: a store of its own per server keeps it
        apart, and across restarts). A stateless HTTP request from no
        principal is no session: its run has no state (``state.*`` says so). ``None``: no state, unless
        ``options``/``state`` give every run one scope.

    :param bind_for: each run's ``bind`` (the values of the tools'
        :class:`~nous_sched.Bind` references), per request:
        ``bind_for(principal)`` gets the client's authenticated principal
        (``(client_id, issuer, subject)`` of its bearer token) or ``None``
        (no token), and returns a mapping laid over the options' own
        ``bind``. One that raises, or returns anything but a mapping of
        names, refuses that ``run_code`` call (an error result naming
        ``bind_for``, never the values); nothing runs.

    :attr:`server` is the SDK server: run it with :meth:`run_stdio` or
    :meth:`run_http`, mount :meth:`http_app` in an ASGI app, or connect an SDK
    ``Client`` to it in-process.
    """

    def __init__(
        self,
        tools: Iterable[Tool],
        *,
        policy: Optional[PermissionPolicy] = GIVEN_NOT,
        approve: Iterable[str] = (),
        audit_log: Union[None, str, Path, IO[str], AuditLog] = None,
        name: str = "nous-sched",
        max_runs_per_session: Optional[int] = None,
        options: Optional[RunOptions] = None,
        state_store: Optional[StateStoreSeam] = None,
        bind_for: Optional[Callable[[Optional[tuple[Optional[str], ...]]], Any]] = None,
        **run_options: Any,
    ) -> None:
        require("CodeModeServer", "tools", tools, TOOLS)
        require("CodeModeServer", "state_store", state_store, _STATE_STORE)
        require("CodeModeServer", "bind_for", bind_for, OPTIONAL_CALLABLE)
        self._state_store = state_store
        # Each connection's scope, as long as the connection lives.
        self._session_scopes: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._bind_for = bind_for
        # A tuple: every run finds its tool set's derived values by this very object (gate/toolset.py).
        self._tools = tuple(tools)
        own = {} if isinstance(policy, NotGiven) else {"policy": policy}
        if own:
            require("CodeModeServer", "policy", policy, _POLICY)
        approved = names(approve)
        require("CodeModeServer", "approve", approved, NAMES)
        self._approve: frozenset[str] = approved
        for option in _PER_RUN:
            if option in run_options:
                raise ConfigError(f"CodeModeServer: `{option}` is set per run by the server; it cannot be given")
        # Every run's options but the ones set per run; `budget` and `ranking` shape the description only.
        shaping = {k: value for k, value in run_options.items() if k in ("budget", "ranking")}
        given = {k: value for k, value in run_options.items() if k not in shaping}
        if options is None:
            given = {"output_budget": DEFAULT_OUTPUT_BUDGET, "policy": None, **given, **own}
        else:
            given = {**given, **own, "options": options}
            _refuse_per_run(options)
        self._options = build("CodeModeServer", given)
        self._policy = self._options.policy
        if bind_for is None:  # every run's bind is known now: a missing one is the operator's, at start
            check_binds(self._tools, self._options.bind, "CodeModeServer")
        # Built once: checks the tools and the runtime now, and renders the SDK the client reads.
        self._template = agent.run_code_tool(self._tools, options=self._options, **shaping)
        if state_store is not None:  # the SDK text says each client has a state of its own
            granted, _ = partition(self._tools, self._policy, "CodeModeServer")
            budget, ranking = shaping.get("budget", sdk.DEFAULT_BUDGET), shaping.get("ranking")
            described = agent.description_of(granted.values(), budget, ranking, "one per client: its own scope")
            self._template = attrs.evolve(self._template, description=described)
        if audit_log is None or isinstance(audit_log, AuditLog):
            self._audit = audit_log
        else:
            self._audit = AuditLog(audit_log)
        require("CodeModeServer", "max_runs_per_session", max_runs_per_session, _OPTIONAL_POSITIVE_INT)
        self.max_runs_per_session: int = max_runs_per_session or default_cap(pool_size(self._options.runtime))
        self._runs: dict[str, _Run] = {}
        self._shares = Shares(self.max_runs_per_session)  # runs going per client
        self._runs_lock = threading.Lock()  # guards _runs: handlers on the loop, sweeps, runs
        self._levels = SessionLevels()  # each session's logging/setLevel (live_forward)
        self._deliveries = Deliveries()  # suspensions handed out, for run_result (.deliver)
        self.server: LowLevelServer = LowLevelServer(
            name,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_set_logging_level=self._set_level,
        )
        self.server.middleware.append(RequestStateBoundary(RequestStateSecurity.ephemeral(), default_audience=name))

    # -- serving ---------------------------------------------------------------

    def run_stdio(self) -> None:
        """Serve over this process's stdin/stdout until the client disconnects."""
        from mcp.server.stdio import stdio_server

        async def serve() -> None:
            async with stdio_server() as (read, write):
                await self.server.run(read, write, self.server.create_initialization_options())

        anyio.run(serve)

    def http_app(
        self, *, host: str = "127.0.0.1", path: str = "/mcp", token_verifier: Optional[TokenVerifier] = None
    ) -> Any:
        """The Starlette app serving Streamable HTTP at ``path``, to be served on ``host``.

        ``host`` decides the checks (:mod:`.access`): on any loopback address,
        ``Host`` and ``Origin`` are checked (421 and 403, nothing runs); any
        other address needs ``token_verifier``. ``token_verifier`` (an MCP SDK
        ``TokenVerifier``, such as :class:`~.access.BearerTokens`): every
        request must carry a bearer token it accepts (401 otherwise), and the
        token's principal is the client for its fair share.

        POST SSE streams start with a priming event with an id and carry a
        ``retry`` field of :data:`RETRY_MS` (SEP-1699); nothing is replayed to a
        client that reconnects (:class:`~.event_store.PrimingEventStore` says why).

        :raises ConfigError: ``host`` is not a loopback address and no ``token_verifier`` is given.
        """
        security = transport_security(host, authorized=token_verifier is not None)
        # An event store makes the SDK start each POST SSE stream with a priming
        # event that has an id, and send a `retry` field (SEP-1699).
        return self.server.streamable_http_app(
            streamable_http_path=path,
            host=host,
            event_store=PrimingEventStore(),
            retry_interval=RETRY_MS,
            transport_security=security,
            auth=None if token_verifier is None else auth_settings(),
            token_verifier=token_verifier,
        )

    def run_http(
        self,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        path: str = "/mcp",
        ready: Optional[Callable[[str], Any]] = None,
        token_verifier: Optional[TokenVerifier] = None,
    ) -> None:
        """Serve Streamable HTTP until interrupted; ``port=0`` picks a free port.

        ``ready(url)`` is called once the socket listens, with the URL clients use.
        ``host`` and ``token_verifier`` as for :meth:`http_app`.

        :raises ConfigError: the address cannot be listened on, or is not a
            loopback address and no ``token_verifier`` is given.
        """
        import socket

        import uvicorn

        app = self.http_app(host=host, path=path, token_verifier=token_verifier)  # its checks before the socket
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        sock.listen(128)
        bound = sock.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        server = _signalled_server(config)

        async def serve() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(server.serve, [sock])
                while not server.started:
                    await anyio.sleep(0.01)
                if ready is not None:
                    ready(f"http://{shown}:{bound}{path}")

        try:
            anyio.run(serve)
            if server.signalled:
                # uvicorn raises the signal again once it has shut down, and
                # asyncio's runner turns a SIGINT into a cancel of the main
                # task; when that task was already ending, the runner returns
                # normally and the interrupt is lost (exit 0, not 130).
                raise KeyboardInterrupt
        finally:
            sock.close()

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """End every run still going (its open approval questions refused, its
        program cancelled), wait up to ``timeout`` seconds in all for each to
        write its ``run_end``, then close the audit log. A run that has not
        ended by then is logged, and its ``run_end`` is lost."""
        with self._runs_lock:
            runs = list(self._runs.values())
        for run in runs:
            run.abandon("server closed")
            run.cancel.set()
        deadline = time.monotonic() + timeout
        for run in runs:
            if not run.wait_finished(max(0.0, deadline - time.monotonic())):
                log.warning("serve-mcp closed its audit log before run %s ended; its run_end is lost", run.id)
        if self._audit is not None:
            self._audit.close()

    # -- the MCP handlers ---------------------------------------------------------

    async def _list_tools(self, ctx: Any, params: Optional[PaginatedRequestParams]) -> ListToolsResult:
        tool = self._template
        return ListToolsResult(
            tools=[
                MCPTool(
                    name=tool.name,
                    title="Run code",
                    description=machine_text(tool.description),
                    input_schema=dict(tool.parameters or {}),
                    output_schema=OUTPUT_SCHEMA,
                    annotations=ToolAnnotations(
                        title="Run code",
                        read_only_hint=False,
                        destructive_hint=True,
                        idempotent_hint=False,
                        open_world_hint=True,
                    ),
                )
            ]
            + ([_RUN_RESULT_TOOL] if self._options.approval_store is not None else [])
        )

    async def _call_tool(self, ctx: Any, params: CallToolRequestParams) -> Union[CallToolResult, InputRequiredResult]:
        store = self._options.approval_store
        if params.name == RUN_RESULT and store is not None:
            return await self._run_result(ctx, dict(params.arguments or {}), store)
        if params.name != self._template.name:
            return _error_result(f"unknown tool {params.name!r}; this server has one tool, {self._template.name!r}")
        self._sweep()
        if params.request_state is not None:
            with self._runs_lock:
                run = self._runs.get(params.request_state)
            if run is None:
                return _error_result("this run_code call is over or unknown; call run_code again")
            for key, response in (params.input_responses or {}).items():
                run.respond(key, response, "client")
        else:
            client = client_keys(ctx)
            refusal = self._admit(client)
            if refusal is not None:
                return _error_result(refusal)
            run = self._start(dict(params.arguments or {}), _client_can_elicit(ctx), client)
        return await self._deliver(ctx, run)

    async def _deliver(self, ctx: Any, run: _Run) -> Union[CallToolResult, InputRequiredResult]:
        """Follow ``run`` for this request: its live events, its questions, then its result."""
        forwarder = self._forwarder(ctx, run)
        try:
            async with anyio.create_task_group() as live:
                forwarder.start(live)
                result = await self._follow(ctx, run)
                if isinstance(result, CallToolResult):
                    await forwarder.drain()  # every notification goes before the result
                live.cancel_scope.cancel()  # an InputRequiredResult: the retry's Forwarder goes on
        finally:
            run.forwarded = forwarder.position
        return result

    async def _run_result(
        self, ctx: Any, arguments: dict[str, Any], store: ApprovalStoreSeam
    ) -> Union[CallToolResult, InputRequiredResult]:
        """``run_result``: the suspended run's result for the client that started it (:mod:`.deliver`)."""
        self._sweep()
        client = client_keys(ctx)
        delivery = self._deliveries.owned(arguments.get("token"), arguments.get("claim"), client)
        if delivery is None:
            return _error_result(NOT_YOURS)
        if delivery.resumed is None:
            waiting = await anyio.to_thread.run_sync(self._undecided, delivery, store)
            if isinstance(waiting, str):
                return _error_result(waiting)
            if waiting:
                value = {"logs": [], "suspended": delivery.suspended, "waiting": waiting}
                return _final_result(("ran", value))
            refusal = self._admit(client)
            if refusal is not None:
                return _error_result(refusal)
            started = self._deliveries.resume_once(delivery, lambda: self._start_resume(delivery, client))
            if started.client is not client:  # another poll started it first: not ours to count
                self._shares.release(client)
        result = await self._deliver(ctx, delivery.resumed)
        if isinstance(result, CallToolResult):
            self._deliveries.read(delivery)
        return result

    def _undecided(self, delivery: Delivery, store: ApprovalStoreSeam) -> Union[str, list[int]]:
        """The pending seqs no one decided yet in ``store``, or why the token cannot be resumed here."""
        try:
            record = store.load(delivery.token)
        except TokenError as exc:
            return f"this run cannot be resumed here: {exc} (was it resumed with `nous-sched resume`?)"
        decided = {str(seq) for seq in record.get("decisions", {})}
        return [int(p["seq"]) for p in record.get("pending", []) if str(p["seq"]) not in decided]

    def _start_resume(self, delivery: Delivery, client: tuple[Any, ...]) -> _Run:
        return self._start({"description": "a resumed run"}, False, client, resume_token=delivery.token)

    def _forwarder(self, ctx: Any, run: _Run) -> Forwarder:
        """The run's live events to this request's client (:mod:`.live_forward`)."""

        token = _progress_token(ctx)

        async def send_progress(progress: float, message: str) -> None:
            await ctx.session.send_progress_notification(
                token, progress, None, machine_text(message), related_request_id=ctx.request_id
            )

        async def send_log(level: str, text: str) -> None:
            await ctx.session.send_log_message(
                level, machine_text(text), logger="run_code", related_request_id=ctx.request_id
            )

        return Forwarder(
            run.live,
            progress=token is not None,
            level=self._levels.get(_session_of(ctx)),
            send_progress=send_progress,
            send_log=send_log,
            position=run.forwarded,
        )

    async def _set_level(self, ctx: Any, params: SetLevelRequestParams) -> EmptyResult:
        """``logging/setLevel``: the lowest level of the run logs this session is sent."""
        self._levels.set(_session_of(ctx), params.level)
        return EmptyResult()

    async def _follow(self, ctx: Any, run: _Run) -> Union[CallToolResult, InputRequiredResult]:
        """Wait for the run's result, asking the client its questions on the way."""
        modern = is_version_at_least(ctx.protocol_version, _MODERN)
        try:
            while True:
                kind, payload = await anyio.to_thread.run_sync(run.next, abandon_on_cancel=True)
                if kind == "done":
                    with self._runs_lock:
                        self._runs.pop(run.token, None)
                    return _final_result(payload)
                if modern:
                    return InputRequiredResult(
                        input_requests={ask.key: _elicit_request(run, ask) for ask in payload},
                        request_state=run.token,
                    )
                async with anyio.create_task_group() as tg:
                    for ask in payload:
                        tg.start_soon(self._ask_back, ctx, run, ask)
        except anyio.get_cancelled_exc_class():
            # The client cancelled the call: nobody is left to answer, or to read the result.
            run.abandon("cancelled")
            run.cancel.set()
            raise

    async def _ask_back(self, ctx: Any, run: _Run, ask: _Ask) -> None:
        """A handshake-era question: an ``elicitation/create`` request in the middle of the call."""
        try:
            with anyio.fail_after(_remaining(ask)):
                answer = await ctx.session.elicit_form(
                    _question(run, ask), _APPROVAL_SCHEMA, related_request_id=ctx.request_id
                )
        except Exception as exc:
            log.warning("run %s: asking the client to approve %r failed: %s", run.id, ask.request.tool, exc)
            run.answer(ask.key, False, "error")
            return
        run.respond(ask.key, answer, "client")

    # -- one run -----------------------------------------------------------------

    def _admit(self, client: tuple[Any, ...]) -> Optional[str]:
        """Count one more run for ``client`` (:func:`.shares.client_keys`), or say why it may not start (its cap)."""
        going = self._shares.admit(client)
        if going is None:
            return None
        return (
            f"this client already has {going} runs going, the most one client may have at once "
            f"(max_runs_per_session); wait for one to finish, or answer its approval questions"
        )

    def _state_of(self, client: tuple[Any, ...]) -> Optional[State]:
        """The client's own scope of the state store (see ``state_store``), or ``None`` for no session."""
        assert self._state_store is not None
        for key in client:
            if isinstance(key, tuple) and key[:1] == ("principal",):
                digest = hashlib.sha256(json.dumps([str(k) for k in key]).encode("utf-8", "replace")).hexdigest()
                return State("mcp-principal-" + digest[:32], self._state_store)
        for key in client:
            if key == STDIO_CLIENT:  # the one client a stdio process serves: one scope, across restarts
                return State(STDIO_SCOPE, self._state_store)
            if not isinstance(key, (tuple, str)):  # a handshake-era connection: its MCP session
                with self._runs_lock:
                    try:
                        scope = self._session_scopes.setdefault(key, "mcp-session-" + secrets.token_hex(16))
                    except TypeError:  # a connection that cannot be held weakly: no session to key a scope by
                        return None
                return State(scope, self._state_store)
        return None  # a stateless HTTP request from no principal: no session

    def _release(self, run: _Run) -> None:
        self._shares.release(run.client)

    def _start(
        self, arguments: dict[str, Any], can_ask: bool, client: tuple[Any, ...] = (), resume_token: Optional[str] = None
    ) -> _Run:
        n = next(_runs_started)
        run_id = f"mcp-run-{n}-{secrets.token_hex(3)}"
        what = arguments.get("description")
        run = _Run(run_id, what if isinstance(what, str) else "", can_ask)
        run.client = client
        with self._runs_lock:
            self._runs[run.token] = run
        # The request's context: its span (the MCP SDK's `tools/call run_code`, joined to the client's
        # trace) is then the parent of the run's spans.
        context = contextvars.copy_context()
        thread = threading.Thread(
            target=context.run,
            args=(self._execute, run, arguments, resume_token),
            name=f"nous-sched-mcp-run-{n}",
            daemon=True,
        )
        thread.start()
        return run

    def _execute(self, run: _Run, arguments: dict[str, Any], resume_token: Optional[str] = None) -> None:
        started = time.perf_counter()
        self._write(
            "run_start",
            run=run.id,
            description=run.description,
            **_audited_code(arguments.get("code"), self._options),
        )
        bind, unbound = self._bind_of(run)
        per_run = attrs.evolve(
            self._options,
            bind=bind,
            approval_handler=lambda request: self._approve_call(run, request),
            dispatch=lambda tool, args, run_ctx: self._dispatch(run, tool, args, run_ctx),
            session_log=_GateAudit(self, run),
            call_id=run.id,
            cancel=run.cancel,
        )
        if self._state_store is not None:
            per_run = attrs.evolve(per_run, state=self._state_of(run.client))
        if resume_token is None:
            function = agent.program_runner(self._tools, per_run)
        else:  # run_result: the suspended run, resumed by replay (.deliver)
            function = partial(_resumed, resume_token, self._tools, per_run)
        bound = live_stream.set(run.live)  # run_code's execute() emits into it
        try:
            if unbound is not None:
                raise unbound
            value = function(arguments)
            if isinstance(value, agent.WithContextUpdate):
                value = value.value
            if isinstance(value.get("suspended"), dict):  # only this client may read the resumed result
                value = dict(value, suspended=self._deliveries.register(value["suspended"], run.client))
            outcome: tuple[str, Any] = ("ran", value)
            error = value.get("error")
        except ConfigError as exc:  # nothing ran: no code, no description, a Bind its bind_for left out
            outcome, error = ("refused", str(exc)), {"kind": "refused", "message": str(exc)}
        except Exception as exc:  # never leave the client waiting
            log.exception("run %s failed inside nous_sched", run.id)
            outcome, error = ("refused", f"internal error: {exc}"), {"kind": "internal", "message": str(exc)}
        finally:
            live_stream.reset(bound)
            run.abandon("run over")  # the run ended (its deadline, say) while a question was open
            run.live.emit("end", None, {})  # the Forwarder's last event
        self._write(
            "run_end",
            run=run.id,
            ok=error is None,
            error=error,
            elapsed=round(time.perf_counter() - started, 6),
        )
        self._release(run)  # before the client hears the result, so its next run is admitted
        run.finish(outcome)

    def _approve_call(self, run: _Run, request: ApprovalRequest) -> Any:
        info = current_call.get()
        approved: Any
        if request.tool in self._approve:
            approved, by = True, "policy"
        elif not run.can_ask and self._options.approval_store is not None:
            return self._defer(run, request)
        elif not run.can_ask:
            approved, by = False, "default"
        else:
            deadline = getattr(getattr(info, "run_ctx", None), "deadline", None)
            ask = run.ask(request, None if deadline is None else deadline + DEADLINE_GRACE)
            approved, by = ask.approved, ask.by
        granting: dict[str, Any] = {}
        if isinstance(approved, Grant):
            granting = {"grant": grant_id(info.seq if info is not None else 0), "granted": approved.as_dict()}
        self._write(
            "approval",
            run=run.id,
            call=info.id if info is not None else None,
            seq=info.seq if info is not None else None,
            tool=request.tool,
            approved=bool(approved),
            reason=f"{'approved' if approved else 'denied'} by {by}",
            arguments=request.arguments,
            decision="approved" if approved else "denied",
            by=by,
            **granting,
        )
        if by == "default":
            raise ToolError(
                f"tool {json.dumps(request.tool)} needs approval, and this MCP client cannot be asked "
                "(it did not declare the elicitation capability); the call was refused"
            )
        return approved

    def _defer(self, run: _Run, request: ApprovalRequest) -> Any:
        """A client that cannot be asked, with an approval store: the run suspends, and
        its result's structured content is the suspension (``{"logs", "suspended"}``);
        an operator decides with ``nous-sched approvals approve|deny TOKEN SEQ --store``."""
        from ..durable import DEFER

        self._write("approval", run=run.id, seq=request.seq, tool=request.tool, decision="deferred", by="store")
        return DEFER

    def _bind_of(self, run: _Run) -> tuple[Optional[Mapping[str, Any]], Optional[RunCodeError]]:
        """The run's ``bind``: the options' own, with ``bind_for``'s answer for its client laid over it;
        or the refusal when ``bind_for`` fails (its message names neither a value nor the client)."""
        bind = self._options.bind
        if self._bind_for is None:
            return bind, None
        first = run.client[0] if run.client else None
        principal = tuple(first[1:]) if isinstance(first, tuple) and first[:1] == ("principal",) else None
        try:
            given = self._bind_for(principal)
        except Exception as exc:
            log.warning("bind_for raised %s for run %s; the run was refused", type(exc).__name__, run.id)
            return bind, RunCodeError(f"CodeModeServer: bind_for raised {type(exc).__name__}; nothing ran")
        if given is None:
            return bind, None
        if not (isinstance(given, Mapping) and all(isinstance(k, str) and k for k in given)):
            return bind, RunCodeError(
                f"CodeModeServer: bind_for must return None or a mapping of names (str) to values, "
                f"got a {type(given).__name__}; nothing ran"
            )
        return {**(bind or {}), **given}, None

    def _dispatch(self, run: _Run, tool: Any, args: dict[str, Any], run_ctx: Any) -> Any:
        # The call's tool_call and tool_outcome lines are the scheduler's audit records (_GateAudit).
        return direct_dispatch(tool, args, run_ctx)

    def _write(self, event: str, **fields: Any) -> None:
        if self._audit is not None:
            self._audit.write(event, **fields)

    def _sweep(self) -> None:
        """Forget finished runs whose client never came back for the result."""
        cutoff = time.monotonic() - _KEEP_FINISHED
        with self._runs_lock:
            stale = [t for t, r in self._runs.items() if r.finished_at is not None and r.finished_at < cutoff]
            for token in stale:
                del self._runs[token]


class _GateAudit(SessionLog):
    """A run's session log that also writes each of the gate's audit events to the audit log."""

    def __init__(self, server: CodeModeServer, run: _Run) -> None:
        super().__init__()
        self._server = server
        self._run = run

    def append(self, event: Event) -> None:
        super().append(event)
        write = AUDIT_LINES.get(event.type)
        if write is not None:
            write(self, event.data)

    def _tool_call(self, data: Mapping[str, Any]) -> None:
        self._server._write(  # noqa: SLF001
            "tool_call",
            run=self._run.id,
            tool=data["name"],
            arguments=data["arguments"],
            id=data["id"],
            seq=data["seq"],
            mode=data["mode"],
        )

    def _tool_refused(self, data: Mapping[str, Any]) -> None:
        self._server._write("tool_refused", run=self._run.id, tool=data["name"], message=data["message"])  # noqa: SLF001

    def _state(self, data: Mapping[str, Any]) -> None:
        self._server._write("state", run=self._run.id, **data)  # noqa: SLF001

    def _tool_outcome(self, data: Mapping[str, Any]) -> None:
        self._server._write("tool_outcome", run=self._run.id, call=f"{self._run.id}:code:{data['seq']}", **data)  # noqa: SLF001

    def _review(self, data: Mapping[str, Any]) -> None:
        self._server._write("review", run=self._run.id, **data)  # noqa: SLF001

    def _approval(self, data: Mapping[str, Any]) -> None:
        # Only a call a grant covered: every other decision is written by the handler, with who answered.
        if "grant" not in data or "granted" in data:
            return
        call = f"{self._run.id}:code:{data['seq']}"
        self._server._write("approval", run=self._run.id, call=call, decision="approved", by="grant", **data)  # noqa: SLF001


#: The audit log's projection of the audit types (:data:`nous_sched.events.AUDIT_TYPES`,
#: and a reviewed run's ``review``): each with what writes its line from the record's
#: session form. ``approval``'s writes only a call a grant covered (``by``: ``"grant"``):
#: the server's own handler writes every other decision, with who answered (_approve_call).
AUDIT_LINES: dict[str, Optional[Callable[[_GateAudit, Mapping[str, Any]], None]]] = {
    "tool_call": _GateAudit._tool_call,  # noqa: SLF001
    "tool_refused": _GateAudit._tool_refused,  # noqa: SLF001
    "approval": _GateAudit._approval,  # noqa: SLF001
    "tool_outcome": _GateAudit._tool_outcome,  # noqa: SLF001
    "state": _GateAudit._state,  # noqa: SLF001
    "review": _GateAudit._review,  # noqa: SLF001
}


def _resumed(token: str, tools: Sequence[Tool], options: RunOptions, arguments: Any) -> Any:
    """What ``run_code`` would answer for the resumed run (``arguments`` unused: the record has the code)."""
    store = options.approval_store
    assert store is not None  # (run_result, the one way here, is offered only with one)
    return resume(token, {}, tools, approval_store=store, options=options).for_model()


def _session_of(ctx: Any) -> Any:
    """A handshake-era request's connection, whose ``logging/setLevel`` lasts; ``None`` for a
    stateless request, which states its level in its own ``_meta``."""
    connection = getattr(ctx.session, "_connection", None)
    if connection is not None and not is_version_at_least(ctx.protocol_version, _MODERN):
        return connection
    return None


def _progress_token(ctx: Any) -> Any:
    """The request's ``_meta.progressToken``, or ``None``."""
    meta = getattr(ctx, "meta", None)
    if isinstance(meta, dict):
        return meta.get("progress_token", meta.get("progressToken"))
    return getattr(meta, "progress_token", None) or getattr(meta, "progressToken", None)


def _client_can_elicit(ctx: Any) -> bool:
    capabilities = getattr(ctx.session, "client_capabilities", None)
    elicitation = getattr(capabilities, "elicitation", None)
    if elicitation is None:
        return False
    # An empty elicitation capability predates the form/url split and means form.
    return elicitation.form is not None or elicitation.url is None


def _elicit_request(run: _Run, ask: _Ask) -> ElicitRequest:
    return ElicitRequest(params=ElicitRequestFormParams(message=_question(run, ask), requested_schema=_APPROVAL_SCHEMA))


def _question(run: _Run, ask: _Ask) -> str:
    """What the user reads: :func:`nous_sched.gate.approval_text.question` of the call, with the run's description."""
    request = ask.request
    if not request.description and run.description:
        request = attrs.evolve(request, description=run.description)
    return machine_text(request.question())


def _accepted(response: Any, arguments: Any = None) -> Any:
    """The client's answer: True (approve once), a :class:`~nous_sched.Grant` (``scope``
    next or matching), or False: declined, not approved, or a grant that cannot be
    made from the form (a bad count, a key the call does not have: fail safe)."""
    content = getattr(response, "content", None)
    if not (getattr(response, "action", None) == "accept" and isinstance(content, dict)):
        return False
    if content.get("approve") is not True:
        return False
    scope = content.get("scope", "once")
    if scope in (None, "once"):
        return True
    try:
        if scope == "next":  # a count is required: a missing one must not widen to every call
            calls = content.get("calls")
            return Grant(calls=calls, by="client") if calls is not None else False
        keys = content.get("keys")
        if scope != "matching" or not isinstance(keys, str) or not isinstance(arguments, dict):
            return False
        names = [k.strip() for k in keys.split(",") if k.strip()]
        if not names or any(k not in arguments for k in names):
            return False
        return Grant(matching={k: arguments[k] for k in names}, by="client")
    except ConfigError:
        return False


def _remaining(ask: _Ask) -> float:
    """How long a question may stay open: until its run's deadline (an hour outside any run)."""
    return 3600.0 if ask.deadline is None else max(0.0, ask.deadline - time.monotonic())


def _final_result(outcome: tuple[str, Any]) -> CallToolResult:
    kind, value = outcome
    if kind == "refused":
        return _error_result(value)
    value = machine_value(value)  # the SDK's encoder refuses a lone surrogate (nous_sched._text)
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(value, ensure_ascii=False))],
        structured_content=value,
        is_error="error" in value,
    )


def _error_result(message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=machine_text(message))], is_error=True)


def _signalled_server(config: Any) -> Any:
    """A uvicorn server (an optional import, so made here) that remembers
    whether a signal stopped it: ``.signalled``."""
    import uvicorn

    class SignalledServer(uvicorn.Server):
        signalled = False

        def handle_exit(self, sig: int, frame: Any) -> None:
            self.signalled = True
            super().handle_exit(sig, frame)

    return SignalledServer(config)

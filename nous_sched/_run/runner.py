"""Private: the machinery of one ``run_code`` run (prepare, then execute) and its host bindings.

:func:`nous_sched.run_code` (the entry, :mod:`nous_sched._run.entry`) and a
durable run (:mod:`nous_sched.durable`) both drive it with the run's
:class:`~nous_sched.RunOptions`, checked already: nothing here imports either.

One ``run_code`` call replaces a chain of tool calls: the program loops,
branches and fans out in one round trip, and only what it logs or returns goes
back to the model. Each run gets a fresh sandbox and a fresh
:class:`~nous_sched.Scheduler`, both torn down when it ends, whatever happens.

Results are data. :func:`run_code` returns a :class:`~nous_sched.RunResult`
for every program that started, including one that threw, looped forever,
ran out of memory or called a tool that hung. It raises
:class:`~nous_sched.RunCodeError` only when nothing ran: a missing program, a
missing or blank description (it is what the approval prompt and the audit
show; the CLI passes the program's file name), no runtime.

Every sub-call passes the gate (:mod:`nous_sched.gate`): tools the policy
denies are still declared in ``tools`` (so the program gets a clear refusal)
but their calls never reach the scheduler; they are audited as
``tool_refused`` events, as are unknown tools, arguments that cannot cross or
fail the tool's schema, and calls past the run's budget
(:class:`~nous_sched.Limits`). Approval is per sub-call, default deny: a tool
that needs approval asks ``approval_handler`` on every call with its real
name, its own copy of the arguments, the run's description and the call's
id, and is refused when there is no handler.
"""

from __future__ import annotations

import contextvars
import importlib.util
import logging
import secrets
import threading
import time
from functools import partial
from typing import Any, Callable, ContextManager, Iterable, Mapping, Optional, Sequence

import attrs

from .. import _tracing
from .._interrupts import LOCAL, deferred, guarded, leave
from .._text import one_line
from ..blobs import NO_BLOBS, READ_LABEL, READ_QUESTION, BlobStore, keep_in_scope, scope_lookup
from ..crossing import dumps, text_bytes
from ..errors import ConfigError, RunCodeError
from ..events import ReviewEvent, StateEvent
from ..gate import Admitted, Gate
from ..gate.dispatch import RunContext
from ..gate.toolset import ToolSet, tool_set
from ..outcome import TRUNCATION_MARK, Outcome
from ..result import RunError, RunResult
from ..result._explain import told as _explain
from ..result._hints import Seen, hints
from ..result.budget import MIN_OUTPUT_BUDGET, fit, fit_value, utf8_size
from ..result.budget import size as budget_size
from ..result.records import audit_later, trail_later
from ..result.usage import Usage, calls_later
from ..review._review import ReviewRequest, decide
from ..review._summary import ProgramSummary, summarize_parts
from ..runtime import Begun, Cancel, CodeRuntime, Host, Limits, PendingCall, RuntimeOutcome, Settled, _program
from ..runtime.syntax import explain as explain_syntax
from ..scheduler import Scheduler
from ..sdk.discovery import Discovery, unknown_tool_message
from ..state import StateAnswer, StateSession
from ..tooling import Tool, missing_binds
from .options import RunOptions, check_runtime

__all__ = [
    "prepare",
    "execute",
    "Prepared",
    "resolve_runtime",
    "runtime_of",
    "ambient_cancel",
    "live_stream",
    "check_binds",
    "reviewed",
    "review_denied",
]

log = logging.getLogger("nous_sched")

NO_CODE = "run_code requires a `code` parameter containing the program to run."
NO_DESCRIPTION = (
    "run_code requires a `description`: one sentence describing what the program does, "
    "for the approval prompt and the audit log (description=...)."
)
BLANK_DESCRIPTION = (
    "run_code requires a non-empty `description`: one sentence describing what the program does, "
    "for the approval prompt and the audit log."
)
#: Every run error's message is clipped to this many characters (plus a marker).
MAX_RUN_MESSAGE = 4000
_NO_RUNTIME = (
    "no code runtime is configured. Install quickjs-ng (`pip install quickjs-ng`) for the default "
    "runtime, or pass runtime=<an object implementing nous_sched.CodeRuntime>; or run this agent in "
    "mode 'native' and call tools directly."
)


#: The ``cancel`` event of every run started in this context without one of its
#: own: set by the asyncio door (:mod:`nous_sched.agent.aio`) around the call it runs
#: on a thread, so cancelling the awaiting task cancels the runs inside it.
ambient_cancel: contextvars.ContextVar[Optional[threading.Event]] = contextvars.ContextVar(
    "nous_sched.ambient_cancel", default=None
)


#: The event stream of the run :func:`~nous_sched.start_run` is serving on
#: this thread, for a run it reaches only through ``run_code`` (a durable run's
#: replays): :func:`execute` takes it and clears it, so a run nested inside a
#: tool never writes into its caller's stream.
live_stream: contextvars.ContextVar[Any] = contextvars.ContextVar("nous_sched.live_stream", default=None)


def _engine_installed() -> bool:
    """Whether quickjs-ng's ``_quickjs`` module can be imported: the default
    runtime's workers need it, and would only find out when the first starts."""
    try:
        spec = importlib.util.find_spec("_quickjs")
    except (ImportError, ValueError):
        return False
    return spec is not None


def resolve_runtime(runtime: Optional[CodeRuntime] = None) -> CodeRuntime:
    """``runtime`` itself, or the default runtime when ``None``: the process's
    :class:`~nous_sched.WorkerPool`, created on first use.

    :raises RunCodeError: no runtime is available, or ``runtime`` does not
        implement :class:`~nous_sched.CodeRuntime`.
    """
    check_runtime(runtime)
    return runtime_of(runtime)


def runtime_of(runtime: Optional[CodeRuntime]) -> CodeRuntime:
    """``runtime`` (checked already), or the default one when ``None``, as :func:`resolve_runtime`."""
    if runtime is not None:
        return runtime
    if not _engine_installed():
        raise RunCodeError(_NO_RUNTIME)
    try:
        from ..runtime.pool import default_pool
    except ImportError:
        raise RunCodeError(_NO_RUNTIME) from None
    return default_pool()


class Prepared:
    """A run whose options passed every check, ready for :func:`execute` (on any thread).

    ``cancel`` is the run's: its options' own, else the ambient one
    (:data:`ambient_cancel`); a door that adds a reason to stop wraps it
    (:class:`~nous_sched.runtime.AnyCancel`) before the run starts.
    """

    __slots__ = (
        "code",
        "rt",
        "limits",
        "tool_set",
        "granted",
        "denied",
        "names",
        "options",
        "cancel",
        "source",
        "program",
    )

    def __init__(
        self,
        code: str,
        rt: CodeRuntime,
        limits: Limits,
        derived: ToolSet,
        options: RunOptions,
    ) -> None:
        self.code = code
        self.rt = rt
        self.limits = limits
        #: What the run derives from its tools and policy, shared with every run of them (read-only).
        self.tool_set = derived
        self.granted: Mapping[str, Tool] = derived.granted
        self.denied: Mapping[str, Tool] = derived.denied
        self.names = derived.names
        self.options = options
        self.cancel: Optional[Cancel] = options.cancel if options.cancel is not None else ambient_cancel.get()
        #: The program as it runs (fences, TypeScript, a last expression: :mod:`._program`).
        self.source = _program.prepare(code)
        #: Its static summary once it was reviewed (:func:`reviewed`), else None.
        self.program: Optional[ProgramSummary] = None


def prepare(code: Any, tools: Iterable[Tool], options: RunOptions) -> Prepared:
    """Check a run's program against its ``options`` (made and checked already:
    :class:`~nous_sched.RunOptions`) on the calling thread; raise what
    :func:`~nous_sched.run_code` raises for it, before a worker is taken or a
    thread started."""
    if not isinstance(code, str):
        raise RunCodeError(NO_CODE)
    description = options.description
    if description is None or not description.strip():
        raise RunCodeError(BLANK_DESCRIPTION if isinstance(description, str) else NO_DESCRIPTION)
    rt = runtime_of(options.runtime)
    limits = options.run_limits
    _check_size(code, limits.max_code_bytes)
    executor = options.executor
    if executor is not None and _saturated_by_caller(executor):
        raise RunCodeError(_SATURATED)
    derived = tool_set(tools, options.policy, "run_code")
    _say_missing(derived.missing_binds(options.bind), "run_code")
    return Prepared(code, rt, limits, derived, options)


def check_binds(tools: Iterable[Tool], bind: Any, door: str) -> None:
    """A :class:`~nous_sched.ConfigError` naming the first :class:`~nous_sched.Bind` of ``tools`` that ``bind`` lacks."""
    _say_missing(missing_binds(tools, bind), door)


def _say_missing(missing: list[tuple[str, str, str]], door: str) -> None:
    if missing:
        tool, argument, name = missing[0]
        raise ConfigError(
            f"{door}: tool {tool!r} binds its argument {argument!r} to Bind({name!r}), "
            f"but the run's `bind` has no {name!r}; pass bind={{{name!r}: ...}}"
        )


def execute(p: Prepared, live: Any = None) -> RunResult:
    """Run a :func:`prepare`-d program to its end on this thread. ``live``, when
    given, is the run's event stream (:class:`nous_sched.live.EventStream`):
    it hears each call start and commit, each step's log lines and each approval."""
    if live is None:
        live = live_stream.get()
    review: Optional[ReviewEvent] = None
    if p.options.review is not None:
        review, denied = reviewed(p, live)
        if denied is not None:  # (a run span still tells a tracer the run was denied)
            tracing = _tracing.active()
            return denied if tracing is None else tracing.run(p.options, lambda traced: denied)
    tracing = _tracing.active()
    cleared = live_stream.set(None)
    try:
        with guarded():  # Ctrl-C never splits a step that takes or gives back a worker, a driver
            if tracing is not None:  # spans, as children of the caller's current span
                result: RunResult = tracing.run(p.options, lambda traced: _execute(p, live, traced))
            else:
                result = _execute(p, live, p.options)
    finally:
        live_stream.reset(cleared)
    if review is not None:
        result = attrs.evolve(result, audit=(review.as_event(), *result.audit))
    return result


def reviewed(p: Prepared, live: Any, defer: Any = None) -> tuple[ReviewEvent, Optional[RunResult]]:
    """Review ``p``'s program with its options' ``review`` before anything of
    the run starts (``nous_sched.review``): its record (written to the run's
    session log and told to its stream), and the run's result when denied
    (a ``review_denied`` error, nothing run), else ``None``. ``p.program`` is
    set to the program's summary. With ``defer`` (a durable run's ``DEFER``),
    an ``ask`` no handler answers leaves the record's verdict ``"ask"`` and the
    result ``None``: the caller suspends the run before it starts."""
    o = p.options
    assert o.review is not None
    gated = p.tool_set.require_approval
    summary = summarize_parts(p.code, p.granted, p.denied, gated)
    p.program = summary
    request = ReviewRequest(p.code, o.description or "", summary)
    verdict = decide(o.review, request, o.approval_handler, p.limits.timeout, p.cancel, defer)
    said = "ask" if verdict.deferred else "allow" if verdict.allowed else "deny"
    record = ReviewEvent(said, verdict.reason, verdict.asked, summary.as_dict())
    if o.session_log is not None:
        o.session_log.append(record.as_event())
    if live is not None:
        live.emit_record(record)
    if verdict.allowed or verdict.deferred:
        return record, None
    return record, review_denied(verdict.reason, record, p.names, o.output_budget)


def review_denied(reason: str, record: ReviewEvent, names: Sequence[str], budget: Optional[int]) -> RunResult:
    """The result of a run whose review denied it (``reason``): a ``review_denied``
    error, nothing run, its review ``record`` its audit."""
    message = _explain("review_denied", f"the program's review denied it: {reason}", names)
    error = RunError("review_denied", message)
    answer = {"logs": [], "error": error.as_dict()}
    size = text_bytes(answer)
    budgeted = _fitted(answer, budget, size, "")
    usage = Usage(calls=(), answer_bytes=size, model_bytes=size if budgeted is None else budget_size(budgeted))
    return RunResult(error=error, audit=(record.as_event(),), usage=usage, budgeted=budgeted)


def _execute(p: Prepared, live: Any, o: RunOptions) -> RunResult:
    """The run of ``p`` with options ``o`` (``p``'s, or the tracing's copy of them)."""
    cancel = p.cancel
    started = time.perf_counter()
    deadline = time.monotonic() + p.limits.timeout
    # A runtime that can (the WorkerPool) starts the program now, so its worker
    # compiles and runs it to its first tool call while the scheduler is built.
    source = p.source
    # (Interrupted before it is stored, a Begun gives its worker back as it is dropped.)
    begun = p.rt.begin(source.text, p.names, p.limits, cancel) if source.refused is None else None
    scheduler: Optional[Scheduler] = None
    try:
        try:
            with deferred():  # a scheduler made is a scheduler stopped below
                scheduler, gate, run_ctx = _build(p, o, deadline, live)
            host = _Host(scheduler, gate, run_ctx, cancel, p.names, live)
            if o.state is not None:
                host.state = StateSession(o.state, p.limits)
            if o.description:
                log.info("run_code %s: %s", one_line(str(scheduler.call_id)), one_line(o.description))
            outcome, source = _program.run(
                source,
                lambda text: begun.run(host) if begun is not None else p.rt.run(text, host, p.limits),
                lambda text: p.rt.run(text, host, _remaining(p.limits, deadline)),
                lambda: not host.ledger and not gate.refused and not scheduler.trail() and not host.state_events,
            )
            if not isinstance(outcome, RuntimeOutcome):
                raise RunCodeError(
                    f"code runtime {p.rt!r} returned {outcome!r} from run(); expected a nous_sched.RuntimeOutcome"
                )
        finally:
            LOCAL.depth += 1  # (first: an interrupt cannot land before the clean-up begins)
            try:
                _wind_down(begun, scheduler)
            finally:
                leave()
    except BaseException:
        # Only a Ctrl-C raised on the finally's first line, before its deferral,
        # skips the wind-down above (a trace function can raise one there); both
        # steps are idempotent, so after a full wind-down this costs nothing.
        _wind_down(begun, scheduler)
        raise
    # From the program's start, a little before the trail's origin (the scheduler's epoch).
    elapsed = time.perf_counter() - started
    return _result(outcome, scheduler, gate, host, elapsed, o.output_budget, source)


def _wind_down(begun: Optional[Begun], scheduler: Optional[Scheduler]) -> None:
    """Give back what a run holds: its begun program if it never ran, its scheduler. Idempotent."""
    if begun is not None:
        begun.abandon()  # only if something above failed before it ran: its worker goes
    # The driver winds down in microseconds unless a predicate is stuck;
    # then waiting longer would only delay this run's answer.
    if scheduler is not None:
        scheduler.stop(timeout=0.5)


def _coming(p: Prepared) -> Callable[[str], str]:
    """What an approval question says is coming for a tool (``RunContext.coming``):
    read from the program's summary, the review's when it was reviewed, else made
    on the first question (a run that asks nothing never parses its program)."""
    return _Coming(p)


class _Coming:
    """``RunContext.coming`` of one run. Pickled (a call run by a serializing
    executor, Dask), it is one that knows nothing: the run stays in its process."""

    __slots__ = ("_p", "_made")

    def __init__(self, p: Optional[Prepared]) -> None:
        self._p = p
        self._made: Optional[ProgramSummary] = None

    def __call__(self, tool: str) -> str:
        p = self._p
        if p is None:
            return ""
        if self._made is None:  # (two first questions at once may both parse: the same summary)
            gated = p.tool_set.require_approval
            self._made = p.program or summarize_parts(p.code, p.granted, p.denied, gated)
        return self._made.coming(tool)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Coming, (None,))


def _build(p: Prepared, o: RunOptions, deadline: float, live: Any) -> tuple[Scheduler, Gate, RunContext]:
    """The run's context, scheduler and gate."""
    blob_bytes = p.limits.blob_bytes
    run_ctx = RunContext(
        approval_handler=o.approval_handler,
        deps=o.deps,
        require_approval=p.tool_set.require_approval,
        deadline=deadline,
        description=o.description or "",
        live=live,
        bind=o.bind,
        program=p.program,
        coming=_coming(p),
        # A run of a state scope also finds the blobs its earlier runs stored there (state.set of a handle).
        blobs=None
        if blob_bytes is None
        else BlobStore(blob_bytes, parent=None if o.state is None else scope_lookup(o.state)),
    )
    call_id = o.call_id
    scheduler = Scheduler(
        dispatch=o.dispatch,
        session_log=o.session_log,
        max_parallel=o.max_parallel,
        call_id=call_id if call_id is not None else "run_code-" + secrets.token_urlsafe(6),
        executor=o.executor,
        timeout=p.limits.timeout,
        observer=o.observer,
    )
    if live is not None:
        scheduler.watch(on_start=partial(live.started, run_ctx.require_approval), on_outcome=live.committed)
    names = p.names
    gate = Gate(
        p.granted,
        p.denied,
        p.limits,
        deadline,
        scheduler.session_log().append,
        unknown=lambda name: unknown_tool_message(name, names),
    )
    gate.blobs = run_ctx.blobs
    if live is not None:
        gate.on_refused = live.refused
    return scheduler, gate, run_ctx


def _result(
    outcome: RuntimeOutcome,
    scheduler: Scheduler,
    gate: Gate,
    host: "_Host",
    elapsed: float,
    budget: Optional[int],
    source: _program.Source,
) -> RunResult:
    error = _told(outcome.error, source, host, scheduler)
    logs = tuple(outcome.logs)
    answer: dict[str, Any] = (
        {"logs": list(logs), "result": outcome.result}
        if error is None
        else {"logs": list(logs), "error": error.as_dict()}
    )
    hint = hints(host.main, host.seen, logs, error is not None)
    answer_bytes = text_bytes(answer)  # budget.size, counted faster: the answer obeys the snapshot rules
    hint_bytes = 0
    if hint:
        # The hint is bounded (_hints.MAX_HINT_CHARS); a budget keeps the hint's start (_fitted).
        answer["hint"] = hint
        hint_bytes = text_bytes(answer) - answer_bytes
        answer_bytes += hint_bytes
    budgeted = _fitted(answer, budget, answer_bytes, hint)
    usage = Usage(
        calls=calls_later(host.ledger),  # the records made when first read
        answer_bytes=answer_bytes,
        model_bytes=answer_bytes if budgeted is None else budget_size(budgeted),
        hint_bytes=hint_bytes,
        held_bytes=sum(b.size for b in host.run_ctx.blobs.blobs()) if host.run_ctx.blobs is not None else 0,
        read_chars=host.read_chars,
    )
    return RunResult(
        logs=logs,
        result=outcome.result,
        error=error,
        events=audit_later(scheduler.audit_entries()),  # each record made when first read
        refused=tuple(gate.refused),
        audit=tuple(event.as_event() for event in host.state_events),
        trail=trail_later(scheduler.trail_rows()),  # the records made when first read
        elapsed=elapsed,
        usage=usage,
        budgeted=budgeted,
        hint=hint,
    )


def _fitted(answer: dict[str, Any], budget: Optional[int], size: int, hint: str) -> Optional[dict[str, Any]]:
    """``answer`` (``size`` bytes) cut to ``budget`` (None when it fits or there
    is none). The hint keeps up to half of what the budget leaves above its
    minimum (cut at its end past that), the rest of the answer the remainder."""
    if budget is None or size <= budget:
        return None
    if not hint:
        return fit(answer, budget)
    rest = {k: v for k, v in answer.items() if k != "hint"}
    allowance = max((budget - MIN_OUTPUT_BUDGET) // 2 - len(', "hint": ""'), 1)
    if utf8_size(hint) > allowance:
        cut = fit_value(hint, allowance)  # its head, with how much was cut said
        hint = cut if isinstance(cut, str) else "…"
    room = budget - text_bytes({"hint": hint})
    return {**fit(rest, room), "hint": hint}


def _remaining(limits: Limits, deadline: float) -> Limits:
    """``limits`` with the time left before ``deadline`` (a program's second try runs in the first's time)."""
    return attrs.evolve(limits, timeout=max(deadline - time.monotonic(), 0.001))


def _told(
    error: Optional[RunError], source: _program.Source, host: "_Host", scheduler: Scheduler
) -> Optional[RunError]:
    """The run's error as the caller reads it: a syntax error said about the
    program's own text (:mod:`.runtime.syntax`), every position about the
    text the model wrote (:mod:`._program`), what to change added
    (:mod:`._explain`), the message clipped."""
    if error is None:
        return None
    code = source.original
    message = source.locate(error.message)
    if error.kind == "exception" and message.startswith("SyntaxError"):
        message = explain_syntax(message, code)
    gate = host.gate
    throttles = {n: list(getattr(tool, "throttles", ())) for n, tool in gate.granted.items()}
    trail = scheduler.trail() if error.kind == "timeout" else ()
    message = _explain(
        error.kind, message, host.names, trail, scheduler.audit_events(), throttles, host.run_ctx.require_approval
    )
    if message != error.message:
        error = RunError(error.kind, message)
    if len(error.message) > MAX_RUN_MESSAGE:
        error = RunError(error.kind, error.message[:MAX_RUN_MESSAGE] + TRUNCATION_MARK)
    return error


def _check_size(code: str, limit: int) -> None:
    # Characters first: a program with more characters than the limit has
    # bytes is over it, and is never encoded.
    if len(code) > limit:
        size = f"{len(code)} characters"
    else:
        n = len(code) if code.isascii() else len(code.encode("utf-8", "surrogatepass"))
        if n <= limit:
            return
        size = f"{n} bytes of UTF-8"
    raise RunCodeError(f"the program is {size}, over the limit of {limit} bytes (Limits.max_code_bytes); nothing ran")


_SATURATED = (
    "run_code was called from a tool running on the executor it was given, and every thread of that "
    "executor is busy (this one included): the program's tool calls would wait for a thread until the "
    "deadline. Give the nested run its own executor (or none: the shared tool threads), or a bigger one."
)


@attrs.frozen
class ThreadPoolView:
    """What :func:`thread_pool_view` reads of a ``ThreadPoolExecutor``."""

    threads: frozenset[threading.Thread]  # its threads (a new one may be running before it is added)
    prefix: str  # its threads' names are "<prefix>_<k>"
    max_workers: int
    idle: threading.Semaphore  # one token per idle thread


def thread_pool_view(executor: Any) -> Optional[ThreadPoolView]:
    """``executor``'s threads, as a ``concurrent.futures.ThreadPoolExecutor`` keeps
    them; ``None`` for any other executor, or when they are not where CPython
    keeps them (3.8 to 3.13: ``_threads``, ``_thread_name_prefix``,
    ``_max_workers``, ``_idle_semaphore``).

    The executor has no public way to say whether a thread of its own is
    idle, and a nested run on a saturated executor would wait for a thread
    until its deadline: so its private fields are read, here only (a test
    fails if CPython moves them; then this says ``None``, "cannot tell").
    """
    threads = getattr(executor, "_threads", None)
    prefix = getattr(executor, "_thread_name_prefix", None)
    max_workers = getattr(executor, "_max_workers", None)
    idle = getattr(executor, "_idle_semaphore", None)
    if not (
        isinstance(threads, (set, frozenset))
        and isinstance(prefix, str)
        and isinstance(max_workers, int)
        and isinstance(idle, threading.Semaphore)
    ):
        return None
    return ThreadPoolView(frozenset(threads), prefix, max_workers, idle)


def _saturated_by_caller(executor: Any) -> bool:
    """True when this thread is one of ``executor``'s own (a ``ThreadPoolExecutor``)
    and no other of its threads is idle or may still be started.

    Other executors cannot be asked; for them this is always False.
    """
    pool = thread_pool_view(executor)
    if pool is None:
        return False
    current = threading.current_thread()
    # A new thread may run its first task before the executor has added it to
    # _threads: its name, "<prefix>_<k>", says whose it is.
    if current not in pool.threads and not current.name.startswith(pool.prefix + "_"):
        return False
    if len(pool.threads | {current}) < pool.max_workers:
        return False  # the executor will start another thread
    if pool.idle.acquire(blocking=False):  # an idle thread: give its token back
        pool.idle.release()
        return False
    return True


# -- the host side of `tools` ---------------------------------------------


class _Host(Host):
    """What a runtime may ask of the outside world: start a call by name, through the run's gate.

    It keeps the run's ledger (``ledger``: ``(seq, tool, chars, ok)`` per
    answer the program received) and what the run learns of the shape of
    results (:meth:`Discovery.observe`), and hands each step's log lines to
    the run's event stream when it has one.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        gate: Gate,
        run_ctx: RunContext,
        cancel: Optional[Cancel] = None,
        names: Optional[Sequence[str]] = None,
        live: Any = None,
    ) -> None:
        self.scheduler = scheduler
        self.cancel = cancel
        self.gate = gate
        self.run_ctx = run_ctx
        self.names: Sequence[str] = tuple(sorted({*gate.granted, *gate.denied})) if names is None else names
        self.discovery = Discovery(gate.granted, self.names, gate.denied)
        self.ledger: list[tuple[Optional[int], str, int, bool]] = []
        #: The program's end as the sandbox reported it (:meth:`on_main`), and what the host saw of results.
        self.main: Any = None
        self.seen = Seen()
        self.live = live
        #: The characters the program read of its blobs (``blobs.read``).
        self.read_chars = 0
        #: The run's state (``run_code(state=...)``) as this run uses it, or ``None``; each operation's record.
        self.state: Optional[StateSession] = None
        self.state_events: list[StateEvent] = []

    @property
    def deadline(self) -> Optional[float]:
        """The run's deadline (``time.monotonic()``), the one its calls' waits give up at:
        the runtime hands the program no answer from then on (:func:`~.runtime.engine.drive`)."""
        return self.run_ctx.deadline

    def call(self, name: Any, args: Any) -> PendingCall:
        return self.submit(self.gate.admit(name, args), name)

    def call_json(self, name: Any, text: Any) -> PendingCall:
        admitted = self.gate.admit_json(name, text)
        if type(admitted) is Admitted:  # submit's own path, written out: every call of a program takes it
            tool = admitted.tool
            return self.scheduler.submit_snapshot(tool, tool.name, admitted.args, self.run_ctx, admitted.text)
        return self.submit(admitted, name)

    def submit(self, admitted: Any, name: Any) -> PendingCall:
        """Start a call the gate has answered (``admitted``: an :class:`Admitted`,
        or the refusal's :class:`Outcome`), ``name`` as the program wrote it."""
        if type(admitted) is not Admitted:
            return Settled(admitted, name if isinstance(name, str) else str(name))
        # The gate's arguments are a fresh snapshot no one else holds: not copied again.
        tool = admitted.tool
        return self.scheduler.submit_snapshot(tool, tool.name, admitted.args, self.run_ctx, admitted.text)

    def attach_reader(self, fd: int, readable: Callable[[], bool], gone: Callable[[], None]) -> bool:
        """The run's scheduler's driver reads the worker while the run waits (:meth:`Scheduler.attach_reader`)."""
        return self.scheduler.attach_reader(fd, readable, gone)

    def when_begun(self, then: Callable[[], None]) -> bool:
        """Told by the run's scheduler (:meth:`Scheduler.when_begun`)."""
        self.scheduler.when_begun(then)
        return True

    def on_logs(self, lines: list[str]) -> None:
        """The runtime's hook for each step's log lines: the run's event stream's, when it has one."""
        if self.live is not None:
            self.live.logs(lines)

    def on_settled(self, pending: Any, outcome: Outcome, payload: str) -> None:
        """The runtime's hook for each answer the program receives, ``payload`` its JSON text."""
        tool = pending.tool
        if tool is None:  # an sdk question: not a sub-call
            return
        if tool is READ_LABEL:  # a blob's slice (discover): not a sub-call either
            self.read_chars += len(payload)
            return
        seq = pending.seq  # a Ticket's or a Settled's: every pending call this host hands out has one
        self.ledger.append((seq, tool, len(payload), outcome.ok))
        if outcome.ok and type(pending) is not Settled:
            self.discovery.observe(tool, outcome.value)
            self.seen.observe(tool, seq, outcome.value)

    def on_main(self, state: Any) -> None:
        """The runtime's hook for the program's end as the sandbox reported it (:mod:`._hints`)."""
        self.main = state

    def batch(self) -> ContextManager[object]:
        """A runtime hands every call one step of a program started inside
        ``with host.batch():``, so they reach the scheduler as one message."""
        return self.scheduler.batch()

    def discover(self, question: Any) -> PendingCall:
        """Answer a question the program asked through ``sdk`` (see :mod:`.discovery`):
        its JSON text, which passes the gate's budget and JSON rules first."""
        parsed = self.gate.admit_question(question)
        if isinstance(parsed, Outcome):
            return Settled(parsed)
        if isinstance(parsed, list) and parsed and parsed[0] == READ_QUESTION:
            blobs = self.run_ctx.blobs
            if blobs is None:
                return Settled(Outcome.failure(READ_LABEL, NO_BLOBS), READ_LABEL)
            return Settled(blobs.read(parsed[1] if len(parsed) > 1 else None), READ_LABEL)
        if type(parsed) is list and len(parsed) == 2 and type(parsed[0]) is str and parsed[0].startswith(STATE_OP):
            return Settled(self.state_op(parsed[0][len(STATE_OP) :], parsed[1]))
        return Settled(self.discovery.answer(parsed))

    def state_op(self, op: str, args: Any) -> Outcome:
        """Do the program's ``state.<op>(...args)`` (``nous_sched.state``): its
        outcome for the program, recorded as a ``state`` event in the audit (the
        run's session log, ``RunResult.audit``) and the live stream, never the value."""
        if self.state is None:
            answer = StateAnswer(op, False, message=NO_STATE, error="no_state")
        else:
            answer = self._state_answer(op, args)
        event = StateEvent(answer.op, answer.key, answer.size, answer.version, answer.ok, answer.error)
        self.state_events.append(event)
        self.scheduler.session_log().append(event.as_event())
        if self.live is not None:
            self.live.emit_record(event)
        if answer.ok:
            blobs = self.run_ctx.blobs
            if op == "get" and blobs is not None and answer.size > blobs.limit:  # a big value stays here too
                value, text, _ = blobs.hold(answer.value, dumps(answer.value))
                return Outcome.crossed(value, text)
            return Outcome.success(answer.value)
        return Outcome.failure(STATE_OP + answer.op, answer.message)

    def _state_answer(self, op: str, args: Any) -> StateAnswer:
        """The state session's answer; a ``set`` of a value holding blob handles first keeps
        their blobs in the scope (``nous_sched.blobs.keep_in_scope``), or writes nothing."""
        assert self.state is not None
        blobs = self.run_ctx.blobs
        if op == "set" and blobs is not None and type(args) is list and len(args) > 1:
            problem = keep_in_scope(blobs, self.state.state, args[1], self.state.limits)
            if problem is not None:
                key = args[0] if isinstance(args[0], str) else None
                return StateAnswer(op, False, message=problem[1], key=key, error=problem[0])
        return self.state.answer(op, args)


#: The question a program's ``state.<op>(...)`` asks the host (``prelude.js``): ``["state.<op>", args]``.
STATE_OP = "state."
NO_STATE = (
    "this run has no state: the host passes one as run_code(..., state=nous_sched.State(scope)); "
    "nothing was read or written"
)

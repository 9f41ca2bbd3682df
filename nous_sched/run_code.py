"""``run_code``: run a model-written program whose every tool call goes through one scheduler.

One ``run_code`` call replaces a chain of tool calls: the program loops,
branches and fans out in one round trip, and only what it logs or returns goes
back to the model. Each run gets a fresh sandbox and a fresh
:class:`~nous_sched.Scheduler`, both torn down when it ends, whatever happens.

Results are data. :func:`run_code` returns a :class:`~nous_sched.RunResult`
for every program that started, including one that threw, looped forever,
ran out of memory or called a tool that hung. It raises
:class:`~nous_sched.RunCodeError` only when nothing ran: a missing program, a
blank description (``""`` or whitespace; ``None``, the default, is a caller
with no model in the loop), no runtime.

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

import concurrent.futures
import logging
import secrets
import threading
import time
from typing import Any, Callable, Iterable, Optional, Sequence, cast

from . import _validators as v
from ._validators import require
from .discovery import Discovery, unknown_tool_message
from .dispatch import ApprovalRequest, RunContext, direct_dispatch
from .errors import RunCodeError
from .events import SessionLog
from .gate import Admitted, Gate
from .outcome import TRUNCATION_MARK, Outcome
from .policy import PermissionPolicy, partition
from .records import CallRecord
from .result import RunError, RunResult
from .runtime import CodeRuntime, Limits, PendingCall, RuntimeOutcome
from .scheduler import Scheduler
from .tool import Tool

__all__ = ["run_code", "resolve_runtime"]

log = logging.getLogger("nous_sched")

_LIMITS = v.instance_of(Limits, "a nous_sched.Limits")
_OPTIONAL_POLICY = v.optional(v.instance_of(PermissionPolicy, "a nous_sched.PermissionPolicy"))
_OPTIONAL_EVENT = v.optional(v.Check("a threading.Event", lambda e: callable(getattr(e, "is_set", None))))

NO_CODE = "run_code requires a `code` parameter containing the program to run."
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


def resolve_runtime(runtime: Any = None) -> CodeRuntime:
    """``runtime`` itself, or the default runtime when ``None``: the process's
    :class:`~nous_sched.WorkerPool`, created on first use.

    :raises RunCodeError: no runtime is available, or ``runtime`` does not
        implement :class:`~nous_sched.CodeRuntime`.
    """
    if runtime is None:
        try:
            from .runtime.pool import default_pool
        except ImportError:
            raise RunCodeError(_NO_RUNTIME) from None
        return default_pool()
    if isinstance(runtime, type):
        raise RunCodeError(
            f"code runtime {runtime.__name__} is a class and does not implement nous_sched.CodeRuntime "
            f"as passed; pass an instance, e.g. runtime={runtime.__name__}()"
        )
    if not callable(getattr(runtime, "run", None)):
        raise RunCodeError(
            f"code runtime {runtime!r} does not implement nous_sched.CodeRuntime "
            "(it needs run(program, host, limits) -> RuntimeOutcome)"
        )
    return cast(CodeRuntime, runtime)


def run_code(
    code: Any,
    tools: Iterable[Tool] = (),
    *,
    description: Optional[str] = None,
    policy: Optional[PermissionPolicy] = None,
    approval_handler: Optional[Callable[[ApprovalRequest], Any]] = None,
    deps: Any = None,
    runtime: Optional[CodeRuntime] = None,
    timeout: float = 30.0,
    limits: Optional[Limits] = None,
    max_parallel: int = 10,
    executor: Optional[concurrent.futures.Executor] = None,
    call_id: Optional[str] = None,
    dispatch: Callable[[Any, dict[str, Any], Any], Any] = direct_dispatch,
    session_log: Optional[SessionLog] = None,
    observer: Optional[Callable[[CallRecord, str], Any]] = None,
    cancel: Optional[threading.Event] = None,
    approval_store: Any = None,
) -> RunResult:
    """Run ``code`` with ``tools`` bound as ``tools[name](args)`` and return what it produced.

    ``timeout`` is the run's wall-clock deadline (``limits`` overrides it and
    sets memory, stack and output limits). ``runtime`` runs the program: by
    default the process's :class:`~nous_sched.WorkerPool` (a worker process
    killed at the deadline); ``QuickJSRuntime()`` runs it in this process.

    ``cancel``: a :class:`threading.Event` that any thread may set to end the
    run early; it then returns a ``cancelled`` error with the logs so far. The
    worker runtime ends it within about 50 ms whatever the program is doing
    (its worker is killed); the in-process runtime at the next step.
    ``KeyboardInterrupt`` in the calling thread ends the run the same way, then
    propagates. ``max_parallel``, ``executor``,
    ``dispatch``, ``session_log`` and ``observer`` configure the run's
    :class:`~nous_sched.Scheduler`. ``call_id`` prefixes audit event ids
    (``"<call_id>:code:<n>"``; a random ``"run_code-…"`` by default).

    Safe to call from many threads at once: runs share nothing unless you
    pass them the same ``executor`` or ``session_log``.

    ``description`` is the sentence the model wrote saying what the program
    does: it is logged, and every :class:`~nous_sched.ApprovalRequest`
    carries it. A blank one is refused; ``None`` (the default) is for a
    caller with no model in the loop.

    ``approval_store`` (a :class:`~nous_sched.SqliteApprovalStore` or
    :class:`~nous_sched.RedisApprovalStore`) makes the run durable: a call
    that needs approval with no handler to answer (or one that returns
    :data:`~nous_sched.DEFER`) suspends the run (``RunResult.suspended``), and
    :func:`~nous_sched.resume` continues it later, anywhere
    (:mod:`nous_sched.durable`).

    :raises RunCodeError: nothing ran (``code`` not a string, a blank
        ``description``, no runtime, or a tool running on ``executor`` called
        this with that same ``executor`` while every one of its threads is
        busy: the run's calls could only wait for a thread until the deadline).
    :raises ConfigError: a bad option, named in the message.
    """
    if approval_store is not None:
        from .durable import run_durable

        options = dict(description=description, policy=policy, approval_handler=approval_handler, deps=deps)
        options.update(runtime=runtime, timeout=timeout, limits=limits, max_parallel=max_parallel, executor=executor)
        options.update(call_id=call_id, dispatch=dispatch, session_log=session_log, observer=observer, cancel=cancel)
        return run_durable(code, tools, approval_store, options)
    if not isinstance(code, str):
        raise RunCodeError(NO_CODE)
    if description is not None and (not isinstance(description, str) or not description.strip()):
        raise RunCodeError(BLANK_DESCRIPTION)
    rt = resolve_runtime(runtime)
    if limits is None:
        require("run_code", "timeout", timeout, v.SECONDS)
        limits = Limits(timeout=timeout)
    require("run_code", "limits", limits, _LIMITS)
    require("run_code", "policy", policy, _OPTIONAL_POLICY)
    require("run_code", "approval_handler", approval_handler, v.OPTIONAL_CALLABLE)
    require("run_code", "cancel", cancel, _OPTIONAL_EVENT)
    if executor is not None and _saturated_by_caller(executor):
        raise RunCodeError(_SATURATED)
    granted, denied = partition(tools, policy, "run_code")
    names = tuple(sorted({*granted, *denied}))
    started = time.perf_counter()
    deadline = time.monotonic() + limits.timeout
    # A runtime that can (the WorkerPool) starts the program now, so its worker
    # compiles and runs it to its first tool call while the scheduler is built.
    begin = getattr(rt, "begin", None)
    begun = begin(code, names, limits, cancel) if callable(begin) else None
    try:
        run_ctx = RunContext(
            approval_handler=approval_handler,
            deps=deps,
            require_approval=frozenset(
                n for n, t in granted.items() if policy is not None and policy.needs_approval(t)
            ),
            deadline=deadline,
            description=description or "",
        )
        scheduler = Scheduler(
            dispatch=dispatch,
            session_log=session_log,
            max_parallel=max_parallel,
            call_id=call_id if call_id is not None else "run_code-" + secrets.token_urlsafe(6),
            executor=executor,
            timeout=limits.timeout,
            observer=observer,
        )
        gate = Gate(
            granted,
            denied,
            limits,
            deadline,
            scheduler.session_log().append,
            unknown=lambda name: unknown_tool_message(name, names),
        )
    except BaseException:
        if begun is not None:
            begun.abandon()
        raise
    try:
        if description:
            log.info("run_code %s: %s", scheduler.call_id, description)
        host = _Host(scheduler, gate, run_ctx, cancel, names)
        outcome = begun.run(host) if begun is not None else rt.run(code, host, limits)
        if not isinstance(outcome, RuntimeOutcome):
            raise RunCodeError(
                f"code runtime {rt!r} returned {outcome!r} from run(); expected a nous_sched.RuntimeOutcome"
            )
    finally:
        if begun is not None:
            begun.abandon()  # only if something above failed before it ran: its worker goes
        # The driver winds down in microseconds unless a predicate is stuck;
        # then waiting longer would only delay this run's answer.
        scheduler.stop(timeout=0.5)
    # From the program's start, a little before the trail's origin (the scheduler's epoch).
    elapsed = time.perf_counter() - started
    error = outcome.error
    if error is not None and len(error.message) > MAX_RUN_MESSAGE:
        error = RunError(error.kind, error.message[:MAX_RUN_MESSAGE] + TRUNCATION_MARK)
    return RunResult(
        logs=tuple(outcome.logs),
        result=outcome.result,
        error=error,
        events=tuple(scheduler.logged_events()),
        refused=tuple(gate.refused),
        trail=tuple(scheduler.trail()),
        elapsed=elapsed,
    )


_SATURATED = (
    "run_code was called from a tool running on the executor it was given, and every thread of that "
    "executor is busy (this one included): the program's tool calls would wait for a thread until the "
    "deadline. Give the nested run its own executor (or none: a private pool), or a bigger one."
)


def _saturated_by_caller(executor: Any) -> bool:
    """True when this thread is one of ``executor``'s own (a ``ThreadPoolExecutor``)
    and no other of its threads is idle or may still be started.

    Other executors cannot be asked; for them this is always False.
    """
    threads = getattr(executor, "_threads", None)
    if not isinstance(threads, (set, frozenset)):
        return False
    current = threading.current_thread()
    # A new thread may run its first task before the executor has added it to
    # _threads: its name, "<prefix>_<k>", says whose it is.
    prefix = getattr(executor, "_thread_name_prefix", None)
    if current not in threads and not (isinstance(prefix, str) and current.name.startswith(prefix + "_")):
        return False
    if len(threads | {current}) < getattr(executor, "_max_workers", 0):
        return False  # the executor will start another thread
    idle = getattr(executor, "_idle_semaphore", None)
    if idle is None:
        return False
    if idle.acquire(blocking=False):  # an idle thread: give its token back
        idle.release()
        return False
    return True


# -- the host side of `tools` ---------------------------------------------


class _Settled:
    __slots__ = ("outcome",)

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome

    def wait(self, timeout: float) -> Outcome:
        return self.outcome


class _Host:
    """What a runtime may ask of the outside world: start a call by name, through the run's gate."""

    def __init__(
        self,
        scheduler: Scheduler,
        gate: Gate,
        run_ctx: RunContext,
        cancel: Optional[threading.Event] = None,
        names: Optional[Sequence[str]] = None,
    ) -> None:
        self.scheduler = scheduler
        self.cancel = cancel
        self.gate = gate
        self.run_ctx = run_ctx
        self.names: Sequence[str] = tuple(sorted({*gate.granted, *gate.denied})) if names is None else names
        self.discovery = Discovery(gate.granted, self.names, gate.denied)

    def call(self, name: Any, args: Any) -> PendingCall:
        return self._submit(self.gate.admit(name, args))

    def call_json(self, name: Any, text: Any) -> PendingCall:
        return self._submit(self.gate.admit_json(name, text))

    def _submit(self, admitted: Any) -> PendingCall:
        if type(admitted) is not Admitted:
            return _Settled(admitted)
        # The gate's arguments are a fresh snapshot no one else holds: not copied again.
        tool = admitted.tool
        return self.scheduler._submit_snapshot(tool, tool.name, admitted.args, self.run_ctx)

    def batch(self) -> Any:
        """A runtime hands every call one step of a program started inside
        ``with host.batch():``, so they reach the scheduler as one message."""
        return self.scheduler._batched()

    def discover(self, question: Any) -> PendingCall:
        """Answer a question the program asked through ``sdk`` (see :mod:`.discovery`):
        its JSON text, which passes the gate's budget and JSON rules first."""
        parsed = self.gate.admit_question(question)
        if isinstance(parsed, Outcome):
            return _Settled(parsed)
        return _Settled(self.discovery.answer(parsed))

"""``run_code``: run a model-written program whose every tool call goes through one lane.

One ``run_code`` call replaces a chain of tool calls: the program loops,
branches and fans out in one round trip, and only what it logs or returns goes
back to the model. Each run gets a fresh sandbox and a fresh
:class:`~nous_sched.Scheduler`, both torn down when it ends, whatever happens.

Results are data. :func:`run_code` returns a :class:`~nous_sched.RunResult`
for every program that started, including one that threw, looped forever,
ran out of memory or called a tool that hung. It raises
:class:`~nous_sched.RunCodeError` only when nothing ran: a missing program, a
blank description, no runtime.

Permissions: tools the policy denies are still declared in ``tools`` (so the
program gets a clear refusal) but their calls never reach the scheduler and
log no event. Approval is per sub-call, default deny: a tool that needs
approval asks ``approval_handler`` with its real name and arguments on every
call, and is refused when there is no handler.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Optional

import attrs

from . import sdk
from .dispatch import ApprovalRequest, RunContext, direct_dispatch
from .errors import ConfigError, RunCodeError
from .events import ContextUpdate, SessionLog
from .outcome import Outcome
from .policy import PermissionPolicy, denied_message
from .result import RunResult
from .runtime import CodeRuntime, Limits, RuntimeOutcome
from .scheduler import Scheduler, Ticket
from .tool import Tool

__all__ = [
    "run_code",
    "run_code_tool",
    "visible_tools",
    "resolve_runtime",
    "WithContextUpdate",
    "MODES",
    "RUN_CODE_NAME",
    "RUN_CODE_DESCRIPTION",
]

log = logging.getLogger("nous_sched")

RUN_CODE_NAME = "run_code"
MODES = ("native", "code", "both")
RUN_CODE_DESCRIPTION = (
    "Run a program that calls tools. Prefer this over a chain of individual tool calls when the work "
    "loops, branches, or fans out: the whole program runs in one round trip and only what it logs or "
    "returns comes back. Tools are called through the `tools` object declared below."
)
_NO_CODE = "run_code requires a `code` parameter containing the program to run."
_BLANK_DESCRIPTION = (
    "run_code requires a non-empty `description`: one sentence describing what the program does, "
    "for the approval prompt and the audit log."
)
_NO_DESCRIPTION = (
    "run_code requires a `description` parameter: one sentence describing what the program does, "
    "for the approval prompt and the audit log."
)
_NO_RUNTIME = (
    "no code runtime is configured. Install quickjs-ng (`pip install quickjs-ng`) for the default "
    "runtime, or pass runtime=<an object implementing nous_sched.CodeRuntime>; or run this agent in "
    "mode 'native' and call tools directly."
)


@attrs.frozen
class WithContextUpdate:
    """A tool result plus operations for the caller to apply to its session log.

    ``run_code``'s third return shape: the model reads ``value``; ``update``
    carries one ``log_event`` per sub-call for the caller's own log.
    """

    value: Any
    update: ContextUpdate


def resolve_runtime(runtime: Any = None) -> CodeRuntime:
    """``runtime`` itself, or the QuickJS runtime when ``None``.

    :raises RunCodeError: no runtime is available, or ``runtime`` does not
        implement :class:`~nous_sched.CodeRuntime`.
    """
    if runtime is None:
        try:
            from .runtime.quickjs import QuickJSRuntime
        except ImportError:
            raise RunCodeError(_NO_RUNTIME) from None
        return QuickJSRuntime()
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
    return runtime


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
    dispatch: Callable[[Any, dict, Any], Any] = direct_dispatch,
    context: Optional[SessionLog] = None,
    observer: Optional[Callable] = None,
) -> RunResult:
    """Run ``code`` with ``tools`` bound as ``tools[name](args)`` and return what it produced.

    ``timeout`` is the run's wall-clock deadline (``limits`` overrides it and
    sets memory, stack and output limits). ``max_parallel``, ``executor``,
    ``dispatch``, ``context`` and ``observer`` configure the run's
    :class:`~nous_sched.Scheduler`. ``call_id`` prefixes audit event ids
    (``"<call_id>:code:<n>"``; a random ``"run_code-…"`` by default).

    Safe to call from many threads at once: runs share nothing unless you
    pass them the same ``executor`` or ``context``.

    :raises RunCodeError: nothing ran (``code`` not a string, no runtime).
    :raises ConfigError: a bad option, named in the message.
    """
    if not isinstance(code, str):
        raise RunCodeError(_NO_CODE)
    rt = resolve_runtime(runtime)
    if limits is None:
        limits = Limits(timeout=timeout)
    elif not isinstance(limits, Limits):
        raise ConfigError(f"run_code: `limits` must be a nous_sched.Limits, got {type(limits).__name__}")
    if policy is not None and not isinstance(policy, PermissionPolicy):
        raise ConfigError(f"run_code: `policy` must be a nous_sched.PermissionPolicy, got {type(policy).__name__}")
    if approval_handler is not None and not callable(approval_handler):
        raise ConfigError(f"run_code: `approval_handler` must be callable, got {approval_handler!r}")
    granted, denied = _bindings(tools, policy)
    run_ctx = RunContext(
        approval_handler=approval_handler,
        deps=deps,
        require_approval=frozenset(n for n, t in granted.items() if policy is not None and policy.needs_approval(t)),
    )
    scheduler = Scheduler(
        dispatch=dispatch,
        context=context,
        max_parallel=max_parallel,
        call_id=call_id if call_id is not None else "run_code-" + secrets.token_urlsafe(6),
        executor=executor,
        timeout=limits.timeout,
        observer=observer,
    )
    try:
        if description:
            log.info("run_code %s: %s", scheduler.call_id, description)
        outcome = rt.run(code, _Host(scheduler, granted, denied, run_ctx), limits)
        if not isinstance(outcome, RuntimeOutcome):
            raise RunCodeError(
                f"code runtime {rt!r} returned {outcome!r} from run(); expected a nous_sched.RuntimeOutcome"
            )
    finally:
        # The driver winds down in microseconds unless a predicate is stuck;
        # then waiting longer would only delay this run's answer.
        scheduler.stop(timeout=0.5)
    elapsed = time.perf_counter() - scheduler.epoch  # the trail's origin too
    return RunResult(
        logs=tuple(outcome.logs),
        result=outcome.result,
        error=outcome.error,
        events=tuple(scheduler.logged_events()),
        trail=tuple(scheduler.trail()),
        elapsed=elapsed,
    )


def run_code_tool(
    tools: Iterable[Tool],
    *,
    policy: Optional[PermissionPolicy] = None,
    runtime: Optional[CodeRuntime] = None,
    **run_options: Any,
) -> Tool:
    """The ``run_code`` :class:`~nous_sched.Tool` for an agent loop.

    Its description is :data:`RUN_CODE_DESCRIPTION` plus the SDK of the tools
    the policy grants. Its parameters are ``code`` and ``description``, both
    required strings. Called with ``{"code", "description"}`` it returns
    ``{"logs", "result"}`` or ``{"logs", "error": {kind, message}}``, wrapped
    in :class:`WithContextUpdate` when sub-calls were made; it raises
    :class:`RunCodeError` when nothing ran. ``run_options`` go to
    :func:`run_code` on every call.
    """
    tools = list(tools)
    granted, _ = _bindings(tools, policy)
    rt = resolve_runtime(runtime)
    description = RUN_CODE_DESCRIPTION + "\n\n" + sdk.render(granted.values(), "typescript")

    def function(args: Any) -> Any:
        if not isinstance(args, Mapping):
            raise RunCodeError(_NO_CODE)
        code = args.get("code")
        if not isinstance(code, str):
            raise RunCodeError(_NO_CODE)
        what = args.get("description")
        if not isinstance(what, str):
            raise RunCodeError(_NO_DESCRIPTION)
        if not what.strip():
            raise RunCodeError(_BLANK_DESCRIPTION)
        result = run_code(code, tools, description=what, policy=policy, runtime=rt, **run_options)
        if not result.events:
            return result.to_dict()
        return WithContextUpdate(result.to_dict(), result.context_update())

    return Tool(
        name=RUN_CODE_NAME,
        function=function,
        description=description,
        parameters={
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "description": "The JavaScript program: the body of an async function; "
                    "`await` and `return` work at top level.",
                },
                "description": {
                    "type": "string",
                    "description": "One sentence saying what the program does, for approval and audit.",
                },
            },
            "required": ["code", "description"],
            "additionalProperties": False,
        },
        category="execute",
        requires_approval=False,
    )


def visible_tools(
    mode: str,
    tools: Iterable[Tool],
    *,
    policy: Optional[PermissionPolicy] = None,
    runtime: Optional[CodeRuntime] = None,
    **run_options: Any,
) -> list[Tool]:
    """The tools a model should be offered in ``mode``.

    ``"native"``: the granted tools. ``"code"``: only ``run_code``.
    ``"both"``: the granted tools plus ``run_code``, or just the granted tools
    when no runtime is available (so ``"code"`` is the only mode that can fail
    for want of one). ``run_code`` is added after the policy filter: a
    deny-all policy still leaves it reachable, and every call it makes is
    filtered again.
    """
    if mode not in MODES:
        raise ConfigError(f"invalid code mode {mode!r}; expected one of {', '.join(MODES)}")
    tools = list(tools)
    granted = list(_bindings(tools, policy)[0].values())
    if mode == "native":
        return granted
    if mode == "both":
        try:
            rt = resolve_runtime(runtime)
        except RunCodeError:
            return granted
        return granted + [run_code_tool(tools, policy=policy, runtime=rt, **run_options)]
    return [run_code_tool(tools, policy=policy, runtime=runtime, **run_options)]


# -- bindings: the host side of `tools` ------------------------------------


def _bindings(tools: Iterable[Any], policy: Optional[PermissionPolicy]) -> tuple[dict[str, Tool], dict[str, Tool]]:
    """Granted and denied tools by name; first occurrence of a name wins."""
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Iterable):
        raise ConfigError(f"`tools` must be an iterable of nous_sched.Tool, got {type(tools).__name__}")
    granted: dict[str, Tool] = {}
    denied: dict[str, Tool] = {}
    for tool in tools:
        if not isinstance(tool, Tool):
            raise ConfigError(f"`tools` must contain only nous_sched.Tool values, got {type(tool).__name__}")
        if tool.name in granted or tool.name in denied:
            continue
        if policy is None or policy.permits(tool):
            granted[tool.name] = tool
        else:
            denied[tool.name] = tool
    return granted, denied


class _Settled:
    __slots__ = ("outcome",)

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome

    def wait(self, timeout: float) -> Outcome:
        return self.outcome


class _Queued:
    __slots__ = ("ticket",)

    def __init__(self, ticket: Ticket) -> None:
        self.ticket = ticket

    def wait(self, timeout: float) -> Optional[Outcome]:
        try:
            return self.ticket._future.result(timeout)
        except concurrent.futures.TimeoutError:
            return None


class _Host:
    """What a runtime may ask of the outside world: start a call by name."""

    def __init__(self, scheduler: Scheduler, granted: dict, denied: dict, run_ctx: RunContext) -> None:
        self.scheduler = scheduler
        self.granted = granted
        self.denied = denied
        self.run_ctx = run_ctx
        self.names = tuple(sorted({*granted, *denied}))

    def call(self, name: Any, args: Any) -> Any:
        if not isinstance(name, str):
            return _Settled(Outcome.failure(str(name), "a tool name must be a string"))
        tool = self.granted.get(name)
        if tool is None:
            message = denied_message(name) if name in self.denied else f"unknown tool {json.dumps(name)}"
            return _Settled(Outcome.failure(name, message))
        if args is None:
            args = {}
        elif not isinstance(args, dict):
            shown = json.dumps(args, ensure_ascii=False)
            shown = shown if len(shown) <= 200 else shown[:200] + "…"
            return _Settled(Outcome.failure(name, f"arguments must be an object, got {shown}"))
        return _Queued(self.scheduler.submit(tool, args, self.run_ctx))

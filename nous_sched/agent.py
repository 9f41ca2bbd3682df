"""The agent-facing ``run_code`` tool, and which tools a model is offered.

:func:`run_code_tool` packages :func:`~nous_sched.run_code` as a
:class:`~nous_sched.Tool` an agent loop can offer a model; :func:`visible_tools`
chooses, per code mode, between the granted tools, ``run_code`` alone, or both.

Both check every option when they are called, not on the model's first call:
a misspelled or bad option is a :class:`~nous_sched.ConfigError` naming it,
raised where the agent is built.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Iterable, Optional

import attrs

from . import _validators as v
from . import sdk
from ._options import check_run_options
from ._validators import require
from .errors import RunCodeError
from .events import ContextUpdate
from .gate.policy import PermissionPolicy, partition
from .result.budget import DEFAULT_OUTPUT_BUDGET
from .run_code import NO_CODE, OUTPUT_BUDGET, resolve_runtime, run_code
from .runtime import CodeRuntime
from .tooling import Tool

__all__ = [
    "run_code_tool",
    "visible_tools",
    "WithContextUpdate",
    "MODES",
    "RUN_CODE_NAME",
    "RUN_CODE_DESCRIPTION",
]

RUN_CODE_NAME = "run_code"
# Set by the run_code tool itself, per call or from its own arguments.
_NOT_RUN_OPTIONS = frozenset({"code", "tools", "description", "policy", "runtime", "output_budget"})
_RUN_OPTIONS = sorted(
    name
    for name, parameter in inspect.signature(run_code).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name not in _NOT_RUN_OPTIONS
)
MODES = ("native", "code", "both")
_MODE = v.one_of(MODES)
RUN_CODE_DESCRIPTION = (
    "Run a program that calls tools. Prefer this over a chain of individual tool calls when the work "
    "loops, branches, or fans out: the whole program runs in one round trip and only what it logs or "
    "returns comes back. Tools are called through the `tools` object declared below."
)
_BLANK_DESCRIPTION = (
    "run_code requires a non-empty `description`: one sentence describing what the program does, "
    "for the approval prompt and the audit log."
)
_NO_DESCRIPTION = (
    "run_code requires a `description` parameter: one sentence describing what the program does, "
    "for the approval prompt and the audit log."
)


@attrs.frozen
class WithContextUpdate:
    """A tool result plus operations for the caller to apply to its session log.

    ``run_code``'s third return shape: the model reads ``value``; ``update``
    carries one ``log_event`` per sub-call for the caller's own log.
    """

    value: Any
    update: ContextUpdate


def _check_run_options(owner: str, run_options: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` for an option :func:`~nous_sched.run_code`
    does not take (naming the closest one it does) or a value it would refuse."""
    for name in run_options:
        if name not in _RUN_OPTIONS:
            v.unknown(owner, name, _RUN_OPTIONS, "run_code")
    check_run_options(owner, run_options)


def run_code_tool(
    tools: Iterable[Tool],
    *,
    policy: Optional[PermissionPolicy] = None,
    runtime: Optional[CodeRuntime] = None,
    budget: Optional[int] = sdk.DEFAULT_BUDGET,
    output_budget: Optional[int] = DEFAULT_OUTPUT_BUDGET,
    ranking: Optional[Sequence[str]] = None,
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

    ``budget`` (characters, default :data:`nous_sched.sdk.DEFAULT_BUDGET`,
    32,000; at least :data:`nous_sched.sdk.MIN_BUDGET`, 1,500; ``None`` for
    no limit): the whole description is never longer. A tool set whose SDK
    would not fit is described by the first of :data:`nous_sched.sdk.STEPS`
    that does (one line per tool, one line without argument names, counts by
    name prefix, or no listing at all), and the program reads a tool's
    declaration with ``sdk.describe(name)`` or finds tools with
    ``sdk.search(words)`` (:mod:`nous_sched.sdk.discovery`; ``sdk`` is there in
    every run). ``ranking`` (tool names, most relevant first): the last step
    names the first few of them the policy grants.

    ``output_budget`` (bytes of UTF-8, which bound the tokens a model pays
    for, default :data:`nous_sched.result.budget.DEFAULT_OUTPUT_BUDGET`, 20,000; at least 256;
    ``None`` for no limit): the answer the model reads (logs, result and
    error together, as JSON text) is at most that long, cut structurally and
    saying in place what it left out (:mod:`nous_sched.result.budget`).

    :raises ConfigError: a bad option, or one :func:`run_code` does not take,
        named in the message, here rather than on the model's first call.
    """
    require("run_code_tool", "budget", budget, sdk.BUDGET_RULE)
    require("run_code_tool", "ranking", ranking, sdk.RANKING_RULE)
    function, tools = program_runner("run_code_tool", tools, policy, runtime, output_budget, run_options)
    granted, _ = partition(tools, policy, "run_code_tool")
    description = _description(granted.values(), budget, ranking)

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


def program_runner(
    owner: str,
    tools: Iterable[Tool],
    policy: Optional[PermissionPolicy],
    runtime: Optional[CodeRuntime],
    output_budget: Optional[int],
    run_options: dict[str, Any],
) -> tuple[Callable[[Any], Any], list[Tool]]:
    """The ``run_code`` tool's function (its options checked, its runtime
    resolved), without the description: serve-mcp makes one per run, and
    rendering the SDK of thousands of tools each time would be wasted."""
    require(owner, "tools", tools, v.TOOLS)
    require(owner, "output_budget", output_budget, OUTPUT_BUDGET)
    _check_run_options(owner, run_options)
    tools = list(tools)
    rt = resolve_runtime(runtime)

    def function(args: Any) -> Any:
        if not isinstance(args, Mapping):
            raise RunCodeError(NO_CODE)
        code = args.get("code")
        if not isinstance(code, str):
            raise RunCodeError(NO_CODE)
        what = args.get("description")
        if not isinstance(what, str):
            raise RunCodeError(_NO_DESCRIPTION)
        if not what.strip():
            raise RunCodeError(_BLANK_DESCRIPTION)
        result = run_code(
            code, tools, description=what, policy=policy, runtime=rt, output_budget=output_budget, **run_options
        )
        if not result.events:
            return result.for_model()
        return WithContextUpdate(result.for_model(), result.context_update())

    return function, tools


def _description(granted: Iterable[Tool], budget: Optional[int], ranking: Optional[Sequence[str]]) -> str:
    # The budget is the whole description's: the SDK gets what run_code's own words leave.
    head = RUN_CODE_DESCRIPTION + "\n\n"
    room = None if budget is None else budget - len(head)
    return head + sdk.fitted(granted, "typescript", room, ranking or ())


def visible_tools(
    mode: str,
    tools: Iterable[Tool],
    *,
    policy: Optional[PermissionPolicy] = None,
    runtime: Optional[CodeRuntime] = None,
    budget: Optional[int] = sdk.DEFAULT_BUDGET,
    output_budget: Optional[int] = DEFAULT_OUTPUT_BUDGET,
    ranking: Optional[Sequence[str]] = None,
    **run_options: Any,
) -> list[Tool]:
    """The tools a model should be offered in ``mode``.

    ``"native"``: the granted tools. ``"code"``: only ``run_code``.
    ``"both"``: the granted tools plus ``run_code``, or just the granted tools
    when no runtime is available (so ``"code"`` is the only mode that can fail
    for want of one). ``run_code`` is added after the policy filter: a
    deny-all policy still leaves it reachable, and every call it makes is
    filtered again. ``budget``, ``output_budget``, ``ranking`` and ``run_options`` are
    :func:`run_code_tool`'s, checked in every mode.
    """
    require("visible_tools", "mode", mode, _MODE)
    require("visible_tools", "tools", tools, v.TOOLS)
    require("visible_tools", "budget", budget, sdk.BUDGET_RULE)
    require("visible_tools", "output_budget", output_budget, OUTPUT_BUDGET)
    require("visible_tools", "ranking", ranking, sdk.RANKING_RULE)
    _check_run_options("visible_tools", run_options)
    tools = list(tools)
    granted = list(partition(tools, policy, "visible_tools")[0].values())
    if mode == "native":
        return granted
    if mode == "both":
        try:
            rt = resolve_runtime(runtime)
        except RunCodeError:
            return granted
        code_tool = run_code_tool(
            tools, policy=policy, runtime=rt, budget=budget, output_budget=output_budget, ranking=ranking, **run_options
        )
        return granted + [code_tool]
    return [
        run_code_tool(
            tools,
            policy=policy,
            runtime=runtime,
            budget=budget,
            output_budget=output_budget,
            ranking=ranking,
            **run_options,
        )
    ]

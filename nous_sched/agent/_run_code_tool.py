"""The agent-facing ``run_code`` tool, and which tools a model is offered.

:func:`run_code_tool` packages :func:`~nous_sched.run_code` as a
:class:`~nous_sched.Tool` an agent loop can offer a model; :func:`visible_tools`
chooses, per code mode, between the granted tools, ``run_code`` alone, or both.

Both check every option when they are called, not on the model's first call:
a misspelled or bad option is a :class:`~nous_sched.ConfigError` naming it,
raised where the agent is built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Iterable, Optional, Union

import attrs

from .. import _validators as v
from .. import sdk
from .._run.entry import run as run_with
from .._run.options import FIELDS, GIVEN_NOT, NotGiven, RunOptions, build, given
from .._run.runner import NO_CODE, runtime_of
from .._validators import require
from ..errors import RunCodeError
from ..events import ContextUpdate
from ..gate.policy import PermissionPolicy
from ..gate.toolset import tool_set
from ..result.budget import DEFAULT_OUTPUT_BUDGET
from ..runtime import CodeRuntime
from ..state import State, sdk_notes
from ..tooling import Tool

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
_NOT_RUN_OPTIONS = frozenset({"description", "policy", "runtime", "output_budget"})
_RUN_OPTIONS = sorted(name for name in FIELDS if name not in _NOT_RUN_OPTIONS)
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


#: ``output_budget``'s default when ``options=`` is not given (shown in the signature).
_OUTPUT_BUDGET_NOT_GIVEN: Any = NotGiven(repr(DEFAULT_OUTPUT_BUDGET))
#: The tool's own option keywords' defaults when ``options=`` is not given.
_OWN_DEFAULTS: Mapping[str, Any] = {"policy": None, "runtime": None, "output_budget": DEFAULT_OUTPUT_BUDGET}


def _run_options(owner: str, own: Mapping[str, Any], run_options: Mapping[str, Any]) -> RunOptions:
    """The :class:`~nous_sched.RunOptions` of every run the tool starts, each
    checked now: the caller's ``options=`` as they are, or made from the
    keywords (``own``: the tool's own option keywords, a :class:`NotGiven`
    default when left alone, which takes the tool's default unless ``options=``
    is given). :class:`ConfigError` for an option :func:`~nous_sched.run_code`
    does not take here (naming the closest one it does), a value it would
    refuse, or an option given both in ``options=`` and as a keyword."""
    if run_options.get("options") is None:
        keywords = {
            **{name: value for name, value in run_options.items() if name != "options"},
            **_OWN_DEFAULTS,
            **given(own),
        }
    else:
        keywords = {**run_options, **given(own)}
    return build(owner, keywords, accepted=(*_RUN_OPTIONS, *_NOT_RUN_OPTIONS - {"description"}))


def run_code_tool(
    tools: Iterable[Tool],
    *,
    policy: Optional[PermissionPolicy] = GIVEN_NOT,
    runtime: Optional[CodeRuntime] = GIVEN_NOT,
    budget: Optional[int] = sdk.DEFAULT_BUDGET,
    output_budget: Optional[int] = _OUTPUT_BUDGET_NOT_GIVEN,
    ranking: Optional[Sequence[str]] = None,
    options: Optional[RunOptions] = None,
    **run_options: Any,
) -> Tool:
    """The ``run_code`` :class:`~nous_sched.Tool` for an agent loop.

    Its description is ``RUN_CODE_DESCRIPTION`` plus the SDK of the tools
    the policy grants. Its parameters are ``code`` and ``description``, both
    required strings. Called with ``{"code", "description"}`` it returns
    ``{"logs", "result"}`` or ``{"logs", "error": {kind, message}}``, wrapped
    in :class:`WithContextUpdate` when sub-calls were made; it raises
    :class:`RunCodeError` when nothing ran. ``run_options`` go to
    :func:`run_code` on every call; or give them all, ``policy``, ``runtime``
    and ``output_budget`` too, as one :class:`~nous_sched.RunOptions`
    (``options=``, its fields as they are: its ``output_budget`` default is
    ``None``, no limit), each run's ``description`` the model's.

    ``budget`` (characters, default ``nous_sched.sdk.DEFAULT_BUDGET``,
    32,000; at least ``nous_sched.sdk.MIN_BUDGET``, 1,500; ``None`` for
    no limit): the whole description is never longer. A tool set whose SDK
    would not fit is described by the first of ``nous_sched.sdk.STEPS``
    that does (one line per tool, one line without argument names, counts by
    name prefix, or no listing at all), and the program reads a tool's
    declaration with ``sdk.describe(name)`` or finds tools with
    ``sdk.search(words)`` (``nous_sched.sdk.discovery``; ``sdk`` is there in
    every run). ``ranking`` (tool names, most relevant first): the last step
    names the first few of them the policy grants.

    ``output_budget`` (bytes of UTF-8, which bound the tokens a model pays
    for, default ``nous_sched.result.budget.DEFAULT_OUTPUT_BUDGET``, 20,000; at least 256;
    ``None`` for no limit): the answer the model reads (logs, result and
    error together, as JSON text) is at most that long, cut structurally and
    saying in place what it left out (``nous_sched.result.budget``).

    :raises ConfigError: a bad option, one :func:`run_code` does not take, or
        one given both in ``options`` and as a keyword, named in the message,
        here rather than on the model's first call.
    """
    require("run_code_tool", "budget", budget, sdk.BUDGET_RULE)
    require("run_code_tool", "ranking", ranking, sdk.RANKING_RULE)
    require("run_code_tool", "tools", tools, v.TOOLS)
    own = {"policy": policy, "runtime": runtime, "output_budget": output_budget}
    made = _run_options("run_code_tool", own, {**run_options, "options": options})
    return _tool(tuple(tools), made, budget, ranking)


def _tool(
    tools: tuple[Tool, ...], options: RunOptions, budget: Optional[int], ranking: Optional[Sequence[str]]
) -> Tool:
    """The ``run_code`` tool over ``tools``, each of its runs with ``options`` (checked already).

    What it derives from ``tools`` (the partition by policy, the SDK text) is
    made once per tool set and kept (``nous_sched.gate.toolset``,
    ``nous_sched.sdk.fitted``): a second tool over the same tools costs
    almost nothing, and its runs (the same tuple each time) find theirs at once."""
    function = program_runner(tools, options)
    granted = tool_set(tools, options.policy, "run_code_tool").granted
    description = description_of(granted.values(), budget, ranking, options.state)

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


def program_runner(tools: Sequence[Tool], options: RunOptions) -> Callable[[Any], Any]:
    """The ``run_code`` tool's function, each run with ``options`` (made and
    checked by the caller) and the description the model gave, without the
    tool's description: serve-mcp makes one per run, and rendering the SDK of
    thousands of tools each time would be wasted.

    :raises RunCodeError: no runtime is available (``options.runtime`` is ``None``
        and the default one cannot start).
    """
    if options.runtime is None:  # resolved once: every run takes the same
        options = attrs.evolve(options, runtime=runtime_of(None))

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
        result = run_with(code, tools, attrs.evolve(options, description=what))
        if not result.events:
            return result.for_model()
        return WithContextUpdate(result.for_model(), result.context_update())

    return function


def description_of(
    granted: Iterable[Tool],
    budget: Optional[int],
    ranking: Optional[Sequence[str]],
    state: Union[State, str, None] = None,
) -> str:
    """The ``run_code`` tool's description: its words, the SDK of ``granted`` and the
    state's note (``state``: the run's :class:`~nous_sched.State`, or words saying
    whose scope each run gets, e.g. serve-mcp's "this client's"), within ``budget``."""
    # The budget is the whole description's: the SDK gets what run_code's own words leave,
    # less the state's note (the longest that leaves the SDK room for its last step).
    head = RUN_CODE_DESCRIPTION + "\n\n"
    room = None if budget is None else budget - len(head)
    tools = list(granted)
    for note in sdk_notes(state, room):
        try:
            text = sdk.fitted(tools, "typescript", None if room is None else room - len(note), ranking or ())
        except AssertionError:  # not even the SDK's last step fits beside this note: a shorter one
            continue
        return head + text + note
    raise AssertionError("the SDK's last step does not fit its budget")  # pragma: no cover: sdk's tests hold it


def visible_tools(
    mode: str,
    tools: Iterable[Tool],
    *,
    policy: Optional[PermissionPolicy] = GIVEN_NOT,
    runtime: Optional[CodeRuntime] = GIVEN_NOT,
    budget: Optional[int] = sdk.DEFAULT_BUDGET,
    output_budget: Optional[int] = _OUTPUT_BUDGET_NOT_GIVEN,
    ranking: Optional[Sequence[str]] = None,
    options: Optional[RunOptions] = None,
    **run_options: Any,
) -> list[Tool]:
    """The tools a model should be offered in ``mode``.

    ``"native"``: the granted tools. ``"code"``: only ``run_code``.
    ``"both"``: the granted tools plus ``run_code``, or just the granted tools
    when no runtime is available (so ``"code"`` is the only mode that can fail
    for want of one). ``run_code`` is added after the policy filter: a
    deny-all policy still leaves it reachable, and every call it makes is
    filtered again. ``budget``, ``output_budget``, ``ranking``, ``options`` and
    ``run_options`` are :func:`run_code_tool`'s, checked in every mode.

    A tool whose ``callers`` leave out ``"model"`` (``Tool(callers={"code"})``)
    is never among the granted tools offered directly; one that leaves out
    ``"code"`` is absent from ``run_code``'s SDK (and refused from a program).
    """
    require("visible_tools", "mode", mode, _MODE)
    require("visible_tools", "tools", tools, v.TOOLS)
    require("visible_tools", "budget", budget, sdk.BUDGET_RULE)
    require("visible_tools", "ranking", ranking, sdk.RANKING_RULE)
    # The runtime apart: "native" needs none, and "both" does without a bad or missing one
    # (given with options=, it goes in to be refused as given both ways).
    own: dict[str, Any] = {"policy": policy, "output_budget": output_budget}
    if options is not None:
        own["runtime"] = runtime
    made = _run_options("visible_tools", own, {**run_options, "options": options})
    tools = tuple(tools)
    # A tool only code may call (Tool.callers={"code"}) is never offered to the model directly.
    granted = [t for t in tool_set(tools, made.policy, "visible_tools").granted.values() if "model" in t.callers]
    if mode == "native":
        return granted
    try:
        code_tool = _tool(
            tools, made if isinstance(runtime, NotGiven) else attrs.evolve(made, runtime=runtime), budget, ranking
        )
    except RunCodeError:  # no runtime
        if mode == "code":
            raise
        return granted
    return [code_tool] if mode == "code" else granted + [code_tool]

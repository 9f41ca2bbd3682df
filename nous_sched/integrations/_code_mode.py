"""What the three Code Mode switches share: the options, the nested tools, the bridge back to the agent's run.

Each switch (pydantic-ai's ``CodeModeToolset``, LangChain's
``CodeModeMiddleware``, the Agents SDK's ``code_mode``) offers the model one
``run_code`` tool over the agent's own tools. A ``run_code`` call runs the
program with a :class:`Bridge` as the run's ``deps``: it holds the framework's
context of *this* call (pydantic-ai's ``RunContext``, LangChain's tool-call
request and handler, the Agents SDK's ``ToolContext``) and the event loop the
agent runs on, so that each nested call, on a tool thread, runs the real
framework tool with that context on that loop (:meth:`Bridge.run`).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .. import _validators as v
from ..agent import run_code_tool
from ..agent.aio import acall_tool
from ..errors import ConfigError, ToolError
from ..events import SessionLog
from ..gate.dispatch import RUN_OVER, ApprovalRequest, current_call
from ..gate.policy import PermissionPolicy
from ..tooling import CALLERS, Tool, always_safe

if TYPE_CHECKING:
    import asyncio

__all__ = ["Bridge", "CodeModeOptions", "asking", "bridge", "Overrides"]

#: Per tool name: ``True``/``False`` (or, for ``concurrency_safe``, a predicate on the arguments).
Overrides = Optional[Mapping[str, Any]]

_OVERRIDES = v.optional(
    v.Check(
        "a mapping of tool names to overrides", lambda m: isinstance(m, Mapping) and all(isinstance(k, str) for k in m)
    )
)
_OPTIONAL_SESSION_LOG = v.optional(v.instance_of(SessionLog, "a nous_sched.SessionLog"))
_OPTIONAL_POLICY = v.optional(v.instance_of(PermissionPolicy, "a nous_sched.PermissionPolicy"))
NOT_IN_A_RUN = "this tool is reached through run_code: call it from a Code Mode program"


class Bridge:
    """One ``run_code`` call's way back into the agent run (the run's ``deps``)."""

    __slots__ = ("context", "loop")

    def __init__(self, context: Any, loop: Optional[asyncio.AbstractEventLoop]) -> None:
        self.context = context  #: the framework's context of the run_code call
        self.loop = loop  #: the loop the agent runs on (None: a synchronous agent)

    def run(self, make: Callable[[], Awaitable[Any]]) -> Any:
        """On a tool thread: run ``make()`` on the agent's loop and return its value,
        giving up at the run's deadline (the coroutine is then cancelled)."""
        import asyncio  # here: a synchronous host never pays for asyncio's import or its teardown at exit

        assert self.loop is not None, "an async bridge"
        future = asyncio.run_coroutine_threadsafe(_awaited(make), self.loop)
        info = current_call.get()
        deadline = getattr(getattr(info, "run_ctx", None), "deadline", None)
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ToolError(RUN_OVER) from None
        except concurrent.futures.CancelledError:
            raise ToolError("the call was cancelled") from None


async def _awaited(make: Callable[[], Awaitable[Any]]) -> Any:
    return await make()


def bridge() -> Bridge:
    """The :class:`Bridge` of the run the current sub-call belongs to.

    :raises ToolError: not inside a Code Mode run.
    """
    info = current_call.get()
    deps = getattr(getattr(info, "run_ctx", None), "deps", None)
    if not isinstance(deps, Bridge):
        raise ToolError(NOT_IN_A_RUN)
    return deps


def _per_tool(adapter: str, option: str, value: Any) -> dict[str, Any]:
    """``callers=`` or ``bound=`` of a switch: tool names to the :class:`~nous_sched.Tool` field, each checked."""
    v.require(adapter, option, value, _OVERRIDES)
    checked: dict[str, Any] = {}
    for name, each in (value or {}).items():
        try:
            stand_in = Tool("stand-in", _unused, **{option: each})
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("Tool: `", f"{adapter}: `{option}[{name!r}]`: `", 1)) from None
        checked[name] = getattr(stand_in, option)
    return checked


def _unused(args: dict[str, Any]) -> None:
    return None


class CodeModeOptions:
    """A switch's options, checked where the agent is built (a :class:`ConfigError` names a bad one).

    Besides the run options, a switch takes two more per-tool mappings, by tool
    name: ``callers`` (:class:`~nous_sched.Tool`'s: a tool whose callers hold
    ``"model"`` is also offered to the model directly, beside ``run_code``; one
    without ``"code"`` is left out of the program's SDK and refused from it) and
    ``bound`` (the tool's bound arguments: hidden from the program, given to the
    framework's tool).
    """

    __slots__ = (
        "adapter",
        "approval_handler",
        "callers",
        "bound",
        "concurrency_safe",
        "requires_approval",
        "session_log",
        "tool_options",
    )

    def __init__(
        self,
        adapter: str,
        *,
        approval_handler: Optional[Callable[[ApprovalRequest], Any]],
        concurrency_safe: Overrides,
        requires_approval: Overrides,
        session_log: Optional[SessionLog],
        policy: Optional[PermissionPolicy],
        budget: Any,
        output_budget: Any,
        run_options: dict[str, Any],
    ) -> None:
        v.require(adapter, "approval_handler", approval_handler, v.OPTIONAL_CALLABLE)
        v.require(adapter, "concurrency_safe", concurrency_safe, _OVERRIDES)
        v.require(adapter, "requires_approval", requires_approval, _OVERRIDES)
        v.require(adapter, "session_log", session_log, _OPTIONAL_SESSION_LOG)
        v.require(adapter, "policy", policy, _OPTIONAL_POLICY)
        for name in ("deps", "approval_handler"):
            if name in run_options:
                raise ConfigError(f"{adapter}: {name} is not a run option here (deps are the agent run's context)")
        run_options = dict(run_options)
        self.callers: dict[str, frozenset[str]] = _per_tool(adapter, "callers", run_options.pop("callers", None))
        self.bound: dict[str, Any] = _per_tool(adapter, "bound", run_options.pop("bound", None))
        for name, value in (requires_approval or {}).items():
            if not isinstance(value, bool):
                v.fail(adapter, f"requires_approval[{name!r}]", value, "True or False")
        self.adapter = adapter
        self.approval_handler = approval_handler
        self.concurrency_safe = dict(concurrency_safe or {})
        self.requires_approval = dict(requires_approval or {})
        self.session_log = session_log
        self.tool_options = dict(run_options, policy=policy, budget=budget, output_budget=output_budget)
        try:  # every option checked now, not on the model's first call
            run_code_tool([], **self.tool_options)
        except ConfigError as exc:  # named as the caller wrote it
            raise ConfigError(str(exc).replace("run_code_tool", adapter, 1)) from None

    def tool(
        self,
        *,
        name: str,
        description: Any,
        parameters: Any,
        returns: Any,
        function: Callable[[dict[str, Any]], Any],
        safe: bool,
        gated: bool,
        category: str = "read",
    ) -> Tool:
        """A nested tool: the framework's flags (``safe``: may run beside others; ``gated``: asks),
        the caller's overrides over them."""
        override = self.concurrency_safe.get(name)
        if override is None:
            predicate = always_safe if safe else None
        elif override is True:
            predicate = always_safe
        elif override is False:
            predicate = None
        elif callable(override):
            predicate = override
        else:
            v.fail(self.adapter, f"concurrency_safe[{name!r}]", override, "a predicate, True or False")
        return Tool(
            name=name,
            function=function,
            description=description if isinstance(description, str) else "",
            parameters=parameters if isinstance(parameters, Mapping) else {"type": "object", "properties": {}},
            returns=returns or None,
            requires_approval=self.requires_approval.get(name, gated),
            category=category,
            concurrency_safe=predicate,
            callers=self.callers.get(name, CALLERS),
            bound=self.bound.get(name),
        )

    def offered_directly(self, name: str) -> bool:
        """Whether the model is offered tool ``name`` itself, beside ``run_code`` (``callers`` holds ``"model"``)."""
        return "model" in self.callers.get(name, ())

    def run_code_tool(self, tools: list[Tool], context: Any = None) -> Tool:
        """``run_code`` over ``tools`` (its description within the budget); with ``context``,
        the one to call: its nested calls reach the agent run through a :class:`Bridge`."""
        deps = None
        if context is not None:
            loop = _running_loop()
            deps = Bridge(context, loop)
        return run_code_tool(tools, approval_handler=self.approval_handler, deps=deps, **self.tool_options)

    async def arun(self, tools: list[Tool], context: Any, arguments: Any) -> str:
        """One ``run_code`` call, awaited: the JSON text the model reads (a mistake answered as ``{"error"}``)."""
        return await acall_tool(self.run_code_tool(tools, context), arguments, self.session_log)


def asking(name: str, description: Any) -> Tool:
    """A stand-in for tool ``name`` that needs approval, for :func:`~nous_sched.gate.dispatch.approve`
    to ask about a call whose tool decided only now that it must be asked."""
    return Tool(name, _never, description=description if isinstance(description, str) else "", requires_approval=True)


def _never(args: dict[str, Any]) -> Any:
    raise AssertionError("only asked about, never called")


def _running_loop() -> Optional[asyncio.AbstractEventLoop]:
    import asyncio

    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def schema_text(value: Any) -> Union[str, Any]:
    """A framework tool's text result as JSON when it is JSON, else the text."""
    if isinstance(value, str):
        import json

        try:
            return json.loads(value)
        except ValueError:
            return value
    return value

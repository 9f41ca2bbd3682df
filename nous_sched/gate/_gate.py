"""The gate: the one path every tool call takes to its tool.

A program's sub-calls (:func:`~nous_sched.run_code`), a model's direct call
(:func:`~nous_sched.call_tool`) and a served ``run_code``'s sub-calls
(``nous-sched serve-mcp``) all pass the same checks, in this order, and a
refusal at any of them is the same two strings (tool, message) whichever
entry point it came through:

1. **The run is not over.** Nothing starts after the run's deadline.
2. **The tool is granted.** An unknown name, or a tool the
   :class:`~nous_sched.PermissionPolicy` denies, is refused.
3. **The budget.** At most ``Limits.max_calls`` calls per run (refused
   calls count too, those refused because the run is over included, so a
   loop of bad calls ends as surely as a loop of good ones), a tool name of
   at most :data:`MAX_NAME_CHARS` characters (checked before the name is
   looked up), at most ``Limits.max_args_bytes`` UTF-8 bytes of arguments per
   call and ``Limits.max_total_args_bytes`` for the run.
4. **The arguments cross.** They are a JSON object that obeys the snapshot
   rules (:mod:`nous_sched.crossing`: no NaN or Infinity, no integer a
   double cannot hold, bounded depth).
5. **The arguments fit the tool's schema** (:mod:`nous_sched.gate.schema`),
   before anyone is asked to approve them. The schema is the one the caller
   sees, without the tool's bound arguments; a call that passes a bound
   argument itself is refused first. In a run, a blob handle anywhere in
   the arguments is then replaced by its value (``nous_sched.blobs``), so
   the schema checks the value the tool gets; a handle the run does not
   hold is refused; the audit keeps the arguments as the program wrote them. An admitted call's arguments hold each
   bound argument as ``"[bound]"`` (every record of the call shows that);
   the tool gets the value (:func:`~nous_sched.gate.dispatch.direct_dispatch`).

Between 2 and 3, **the caller**: a tool whose ``callers`` leave out this
gate's caller (``"code"`` for a program's sub-call, ``"model"`` for
:func:`~nous_sched.call_tool`) is refused, naming the rule.
6. **The audit.** A call that passed 1-5 is audited as a ``tool_call``
   event (:class:`~nous_sched.ToolCallEvent`) when it starts; a refused one
   as a ``tool_refused`` event (:class:`~nous_sched.ToolRefusedEvent`).
   Both go to the session log; once the call budget is spent only the first
   refusal past it is audited, so a runaway loop cannot grow the audit: the
   gate writes at most ``Limits.max_calls`` plus one events per run.
7. **Approval**, when the tool needs it (:func:`~nous_sched.gate.dispatch.approve`,
   on the thread that runs the call): the handler gets its own copy of the
   arguments, the run's description, the call's id and the tool's
   description; an approval that answers after the run is over starts
   nothing.

A :class:`Gate` is one run's (or one direct call's) state: its tools, its
limits and its budget. It is used from one thread at a time (the thread that
drives the run).
"""

from __future__ import annotations

import json
import time
from time import monotonic
from typing import Any, Callable, Mapping, Optional, Union

from ..blobs import BlobStore
from ..crossing import dumps, loads, snapshot
from ..errors import SnapshotError
from ..events import Event, ToolRefusedEvent
from ..limits import Limits
from ..outcome import Outcome, quote_name
from ..tooling import Tool, caller_parameters, marked, passed_bound
from .dispatch import RUN_OVER
from .policy import denied_message
from .schema import argument_error

__all__ = ["Gate", "Admitted", "callers_rule", "BUDGET_SPENT", "MAX_NAME_CHARS", "REFUSAL_REASONS"]

#: Why the gate refused a call, by check: the run was over (1), the name is not
#: a string or too long, the tool is unknown or the policy denies it (2), the
#: budget is spent (3), the arguments cannot cross (4), they fail the schema (5).
#: Then (issues 40, 41): the tool may not be called by this caller (``Tool.callers``),
#: the call passed a bound argument itself (``Tool.bound``).
REFUSAL_REASONS = ("run_over", "name", "unknown", "policy", "budget", "arguments", "schema", "callers", "bound")

BUDGET_SPENT = "the run has made its {n} tool calls, the most one run may make (Limits.max_calls)"
_TOTAL_SPENT = (
    "the run's tool calls have sent {n} bytes of arguments in all, the most one run may send "
    "(Limits.max_total_args_bytes)"
)
_MAX_NAME = 200
#: A tool name longer than this many characters is refused before it is looked
#: up: no declared tool may have one (MCP's own limit is 128), and the search
#: for close names would otherwise cost time and memory in proportion to it.
MAX_NAME_CHARS = 256
NAME_TOO_LONG = "a tool name may be at most {n} characters; this one is longer, so no tool has it"
_TOO_BIG = "arguments are {size} bytes of JSON, over the limit of {n} for one call (Limits.max_args_bytes)"


class Admitted:
    """A call the gate let through: the tool and its arguments (a fresh JSON-shaped dict).

    ``text`` is the JSON text ``args`` were parsed from (:meth:`Gate.admit_json`),
    or ``None``: immutable, it may stand as the audit's own copy of them
    (:func:`~nous_sched.events.frozen_later`).
    """

    __slots__ = ("tool", "args", "text")

    def __init__(self, tool: Tool, args: dict[str, Any], text: Optional[str] = None) -> None:
        self.tool = tool
        self.args = args
        self.text = text


class Gate:
    """Checks 1-6 of the module docstring for one run; check 7 runs where the call runs.

    :param granted: the tools calls may reach, by name.
    :param denied: tools the policy denies, by name (their calls are refused
        as denied, not as unknown).
    :param limits: the run's :class:`~nous_sched.Limits`.
    :param deadline: the ``time.monotonic()`` instant the run is over, or ``None``.
    :param audit: where refusals are written (``audit(event)``), e.g. a
        session log's ``append``; ``None`` keeps them only in :attr:`refused`.
    :param source: the ``source`` of every refusal record.
    :param unknown: the message for a call of a tool no one declared (by
        default ``unknown tool "name"``; a run names the closest tools).
    :param caller: who makes the calls, ``"code"`` (a program) or ``"model"``
        (a direct call): checked against each tool's ``callers``.
    """

    def __init__(
        self,
        granted: Mapping[str, Tool],
        denied: Mapping[str, Tool],
        limits: Limits,
        deadline: Optional[float] = None,
        audit: Optional[Callable[[Event], Any]] = None,
        source: str = "code_mode",
        unknown: Optional[Callable[[str], str]] = None,
        caller: str = "code",
    ) -> None:
        self.granted = granted
        self.denied = denied
        self.limits = limits
        self.deadline = deadline
        self._audit = audit
        self._source = source
        self._unknown = unknown
        self._caller = caller
        self.calls = 0
        self.args_bytes = 0
        #: Every refusal audited so far, in order.
        self.refused: list[ToolRefusedEvent] = []
        #: Told of each refusal as it is audited: ``on_refused(record, reason)``, its
        #: ``tool_refused`` record and ``reason``, one of :data:`REFUSAL_REASONS` (a run's event stream).
        self.on_refused: Optional[Callable[[ToolRefusedEvent, str], Any]] = None
        #: The run's :class:`~nous_sched.BlobStore`, when it has one: a handle in
        #: a call's arguments is replaced by its value before the schema is checked.
        self.blobs: Optional[BlobStore] = None
        # Per tool (by id): (the tool, whether it binds arguments, whether its schema is checked),
        # worked out at its first call. A Tool is frozen, so the answers cannot differ later.
        self._shapes: dict[int, tuple[Any, bool, bool]] = {}
        # Per tool (by id, as `_shapes`): (the tool, whether its schema is checked), for a Tool
        # whose name alone passes every check but the budget and the deadline: admit_json's path
        # for the common call. Only a tool `_shapes` holds is here: a Tool with no bound arguments
        # that this gate's caller may call (both frozen).
        self._plain: dict[int, tuple[Tool, bool]] = {}

    def admit_json(self, name: Any, text: Any) -> Union[Admitted, Outcome]:
        """Check a call whose arguments are JSON text (from a program): admitted, or a failed Outcome."""
        self.calls = calls = self.calls + 1
        # The common call, checked in this one frame (a Promise.all of a thousand
        # calls takes this path a thousand times): a name whose tool this gate
        # has admitted before, as a plain Tool with no bound arguments that this
        # caller may call (what the name alone decides: `_plain`), and text
        # within the limits. The checks are the same, in the same order; any
        # that does not pass goes on to `_checked_json`, which checks them one
        # by one and words the refusal (nothing is counted twice).
        if type(name) is str and type(text) is str and len(name) <= MAX_NAME_CHARS:
            tool = self.granted.get(name)
            plain = self._plain.get(id(tool))
            deadline = self.deadline
            limits = self.limits
            if plain is not None and (deadline is None or monotonic() < deadline) and calls <= limits.max_calls:
                size = len(text) if text.isascii() else _utf8_size(text)
                total = self.args_bytes + size
                if size <= limits.max_args_bytes and total <= limits.max_total_args_bytes:
                    self.args_bytes = total
                    try:
                        args = loads(text)
                    except SnapshotError as exc:
                        return self._unparsed(name, exc)
                    blobs = self.blobs
                    # (Text without a blob handle: the arguments as they are, the store's own answer.)
                    if (
                        type(args) is dict
                        and (deadline is None or monotonic() < deadline)
                        and (blobs is None or blobs.substitute(args, text) is args)
                        and not (plain[1] and argument_error(plain[0], args) is not None)
                    ):
                        return Admitted(plain[0], args, text)
                    return self._after_parse(name, args, text if type(args) is dict else None)
        return self._checked_json(name, text)

    def _checked_json(self, name: Any, text: Any) -> Union[Admitted, Outcome]:
        """:meth:`admit_json`'s checks one at a time, the call counted already."""
        refusal = self._before_arguments(name, counted=True)
        if refusal is not None:
            return refusal
        if not isinstance(text, str):
            return self._refuse(name, "arguments must be a JSON object", "arguments")
        size = _utf8_size(text)
        refusal = self._size(name, size)
        if refusal is not None:
            return refusal
        try:
            args = loads(text)
        except SnapshotError as exc:
            return self._unparsed(name, exc)
        # The text stands for the arguments only when they are the object it spells (not `null` made {}).
        return self._after_parse(name, args, text if type(args) is dict else None)

    def _unparsed(self, name: str, exc: SnapshotError) -> Outcome:
        why = str(exc)
        if why.startswith("not valid JSON"):  # only a direct call: a program's text is always JSON
            return self._refuse(name, f"the arguments are {why}; send one JSON object", "arguments")
        return self._refuse(name, f"arguments cannot cross: {why}", "arguments")

    def admit(self, name: Any, args: Any) -> Union[Admitted, Outcome]:
        """Check a call whose arguments are a Python value (``None`` means ``{}``): admitted, or a failed Outcome."""
        refusal = self._before_arguments(name)
        if refusal is not None:
            return refusal
        if args is None:
            args = {}
        if not isinstance(args, Mapping):
            return self._refuse(name, f"arguments must be an object, got {_shown(args)}", "arguments")
        try:
            copied = snapshot(args)
        except SnapshotError as exc:
            return self._refuse(name, f"arguments cannot cross: {exc}", "arguments")
        refusal = self._size(name, _utf8_size(json.dumps(copied, ensure_ascii=False, separators=(",", ":"))))
        if refusal is not None:
            return refusal
        return self._after_parse(name, copied)

    def admit_question(self, text: Any) -> Any:
        """A question about the tools (a program's ``sdk``), as JSON text: its
        parsed value, or a failed Outcome (tool ``"sdk"``). Questions count
        against the call budget and pass the same size and JSON rules; they
        reach no tool, so no policy or schema applies."""
        self.calls += 1
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return self._refuse("sdk", RUN_OVER, "run_over")
        if self.calls > self.limits.max_calls:
            return self._refuse("sdk", BUDGET_SPENT.format(n=self.limits.max_calls), "budget")
        if not isinstance(text, str):
            return self._refuse("sdk", "a question must be JSON text", "arguments")
        refusal = self._size("sdk", _utf8_size(text))
        if refusal is not None:
            return refusal
        try:
            return loads(text)
        except SnapshotError as exc:
            return self._refuse("sdk", f"the question cannot cross: {exc}", "arguments")

    def refuse(self, name: str, message: str, reason: str = "arguments") -> str:
        """Refuse a call that never got as far as the checks (audited like any refusal); the message."""
        outcome = self._refuse(name, message, reason)
        assert outcome.error is not None
        return outcome.error.message

    # -- the steps ---------------------------------------------------------------

    def _before_arguments(self, name: Any, counted: bool = False) -> Optional[Outcome]:
        # Counted first: a refusal of any kind (past the deadline too) spends
        # the budget, so no loop can grow the audit past max_calls + 1.
        if not counted:
            self.calls += 1
        if not isinstance(name, str):
            return self._refuse(str(name)[:_MAX_NAME], "a tool name must be a string", "name")
        if len(name) > MAX_NAME_CHARS:  # before any lookup or "did you mean" on it
            return self._refuse(name, NAME_TOO_LONG.format(n=MAX_NAME_CHARS), "name")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return self._refuse(name, RUN_OVER, "run_over")
        if self.calls > self.limits.max_calls:
            return self._refuse(name, BUDGET_SPENT.format(n=self.limits.max_calls), "budget")
        if name not in self.granted:
            if name in self.denied:
                return self._refuse(name, denied_message(name), "policy")
            return self._refuse(
                name, self._unknown(name) if self._unknown else f"unknown tool {quote_name(name)}", "unknown"
            )
        callers = getattr(self.granted[name], "callers", None)
        if callers is not None and self._caller not in callers:
            return self._refuse(name, callers_rule(name, callers, self._caller), "callers")
        return None

    def _size(self, name: str, size: int) -> Optional[Outcome]:
        limits = self.limits
        if size > limits.max_args_bytes:
            return self._refuse(name, _TOO_BIG.format(size=size, n=limits.max_args_bytes), "budget")
        if self.args_bytes + size > limits.max_total_args_bytes:
            return self._refuse(name, _TOTAL_SPENT.format(n=self.args_bytes), "budget")
        self.args_bytes += size
        return None

    def _after_parse(self, name: str, args: Any, text: Optional[str] = None) -> Union[Admitted, Outcome]:
        if args is None:  # `tools.x()`: no arguments
            args = {}
        elif not isinstance(args, dict):
            return self._refuse(name, f"arguments must be an object, got {_shown(args)}", "arguments")
        if self.deadline is not None and time.monotonic() >= self.deadline:  # the copy took the rest of the run
            return self._refuse(name, RUN_OVER, "run_over")
        tool = self.granted[name]
        shape = self._shapes.get(id(tool)) or self._shape(tool)
        bound = shape[1]
        if bound:
            sent = passed_bound(tool, args)
            if sent is not None:
                return self._refuse(name, sent, "bound")
        written = args
        if self.blobs is not None:  # handles become their values first: the schema is the value's
            put = self.blobs.substitute(args, text)
            if type(put) is str:
                return self._refuse(name, put, "arguments")
            args = put
        if shape[2]:
            problem = argument_error(tool, args)
            if problem is not None:
                return self._refuse(name, problem, "schema")
        # The audit's copy (the text) is the arguments as written: a handle, not the value it stands for.
        if bound:  # every record shows the marker; the text no longer spells these arguments
            return Admitted(tool, marked(tool, args), None if args is written else dumps(marked(tool, written)))
        if args is not written and text is None:
            text = dumps(written)
        return Admitted(tool, args, text)

    def _shape(self, tool: Any) -> tuple[Any, bool, bool]:
        """``(tool, binds arguments, schema checked)`` for ``_after_parse``; kept for a :class:`Tool`
        (frozen: the same answers at every call), asked again at each call of any other object.
        Kept by ``id``: the entry holds the tool, so its id is not reused while the entry lives."""
        bound = bool(getattr(tool, "bound", None))
        if type(tool) is not Tool:
            return tool, bound, True
        checked = bool(tool.validate_arguments) and caller_parameters(tool) is not None
        shape = self._shapes[id(tool)] = (tool, bound, checked)
        callers = tool.callers
        if not bound and (callers is None or self._caller in callers):
            self._plain[id(tool)] = (tool, checked)
        return shape

    def _refuse(self, name: str, message: str, reason: str) -> Outcome:
        if len(name) > _MAX_NAME:  # a name the program made up may be of any length
            name = name[:_MAX_NAME] + "…"
        outcome = Outcome.failure(name, message)
        # Past the call budget only the first refusal is written: the audit stays bounded.
        if self.calls <= self.limits.max_calls + 1:
            assert outcome.error is not None
            record = ToolRefusedEvent(outcome.error.tool, outcome.error.message, self._source)
            self.refused.append(record)
            if self._audit is not None:
                self._audit(record.as_event())
            if self.on_refused is not None:
                self.on_refused(record, reason)
        return outcome


def callers_rule(name: str, callers: Any, caller: str) -> str:
    """The refusal of a call by ``caller`` (``"code"`` or ``"model"``) of tool ``name``, whose ``callers`` leave it out."""
    if caller == "code":
        return (
            f"tool {quote_name(name)} may be called only by the model directly, not from code "
            '(Tool.callers={"model"}); ask for it outside the program'
        )
    return f'tool {quote_name(name)} may be called only from code (Tool.callers={{"code"}}), not directly by the model'


def _utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _shown(value: Any) -> str:
    try:
        shown = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        shown = type(value).__name__
    return shown if len(shown) <= 200 else shown[:200] + "…"

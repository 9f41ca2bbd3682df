"""The :class:`Tool` value and the rule that classifies one call of it.

A call is *parallel* only when its tool declares a ``concurrency_safe``
predicate and that predicate returns exactly ``True`` for the call's arguments.
Everything else - no predicate, a predicate that raises, one that returns a
truthy value that is not ``True`` - is *exclusive*. Guessing wrong the other way
interleaves side effects on someone else's data, so the rule fails safe.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Literal, Mapping, Optional

import attrs

from .. import _validators as v
from ..throttle import Throttle
from ._bound import bound_mapping, check_against, without

__all__ = [
    "Tool",
    "CALLERS",
    "Mode",
    "PARALLEL",
    "EXCLUSIVE",
    "THROTTLES",
    "as_throttles",
    "concurrency_mode",
    "exclusive_reason",
]

log = logging.getLogger("nous_sched")

Mode = Literal["parallel", "exclusive"]
PARALLEL: Mode = "parallel"
EXCLUSIVE: Mode = "exclusive"


THROTTLES = v.Check(
    "a tuple of nous_sched.Throttle",
    lambda x: isinstance(x, (tuple, list)) and all(isinstance(t, Throttle) for t in x),
)


#: Who may call a tool: the model directly, a program (``run_code``), or both (the default).
CALLERS: frozenset[str] = frozenset({"model", "code"})
_CALLERS = v.Check(
    "a non-empty set of 'model' and/or 'code', e.g. {'model'}, {'code'} or {'model', 'code'}",
    lambda x: isinstance(x, frozenset) and bool(x) and x <= CALLERS,
)


def as_callers(value: Any) -> Any:
    """``callers`` as a frozenset, or as given when it is not a collection of strings (the validator names it)."""
    if isinstance(value, (set, frozenset, list, tuple)) and all(isinstance(c, str) for c in value):
        return frozenset(value)
    return value


def _bound_repr(bound: Any) -> str:
    # Names only: a bound value is a secret as often as not, and reprs end up in logs.
    return "{" + ", ".join(f"{name!r}: <bound>" for name in bound) + "}"


def as_throttles(value: Any) -> Any:
    """``throttles`` as a tuple, or as given when it is not a sequence of throttles (the validator names it)."""
    return tuple(value) if THROTTLES.accepts(value) else value


@attrs.frozen
class Tool:
    """A tool a program may call.

    ``function(args)`` receives the call's arguments as a fresh JSON-shaped
    ``dict`` (its own copy: mutating it changes neither the audit record nor
    any other call) and returns a JSON-shaped value. To fail with a chosen
    message, raise :class:`~nous_sched.ToolError`.

    A tool is a value: frozen, and its ``parameters``, ``returns`` and
    ``bound`` are not to be changed in place once it is made (make another
    tool instead). What runs derive from a tool set (its SDK text, names,
    search index: ``nous_sched.gate.toolset``) is made once per set of tool
    objects and kept.

    ``concurrency_safe(args) -> bool`` opts a call into running beside others;
    see :func:`concurrency_mode`. ``parameters`` is the JSON Schema of the
    arguments object, rendered into the program's SDK; ``returns`` is the JSON
    Schema of what the tool returns, when it has one. ``requires_approval``
    makes every call of this tool ask the run's approval handler first.
    ``validate_arguments=False`` opts the tool out of checking each call's
    arguments against ``parameters`` (``nous_sched.gate.schema``), for a tool
    that checks them itself or whose schema is only a description.
    ``exclusive_reason`` is the few words the trail shows for a call of this
    tool that ran exclusive (the ``reason`` of its
    :class:`~nous_sched.CallRecord`), e.g. ``"destructive (MCP default)"``;
    empty, the trail says what :func:`concurrency_mode` saw.
    ``throttles`` are :class:`~nous_sched.Throttle` limits shared with every
    other run (and, with Redis, process) whose tools name them: each call
    waits for a place in all of them (``nous_sched.throttle``).

    ``bound`` maps argument names to values the host supplies: a value, or a
    :class:`~nous_sched.Bind` filled from the run's ``bind``
    (``run_code(..., bind=...)``). A bound argument is absent from the SDK, the
    schema a caller sees and checks against, and the call's records (the audit,
    the approval question, live events and spans show ``"[bound]"``); a call
    that passes one is refused; the tool gets it, as given, after approval
    (``nous_sched.tooling._bound``). Its ``repr`` shows the names only;
    ``concurrency_safe`` and the approval handler see the markers too.

    ``callers`` says who may call it: ``{"model"}`` (a direct tool call only:
    absent from the program's SDK, and a program's call is refused with a
    :class:`~nous_sched.ToolError` naming the rule), ``{"code"}`` (from a
    program only: absent from :func:`~nous_sched.visible_tools` and every list
    of tools offered to the model directly) or both, the default.

    :raises ConfigError: a field has the wrong type, naming it.
    """

    name: str = attrs.field(validator=v.NON_EMPTY_STR)
    function: Callable[[dict[str, Any]], Any] = attrs.field(validator=v.CALLABLE)
    description: str = attrs.field(default="", validator=v.STR)
    parameters: Optional[Mapping[str, Any]] = attrs.field(default=None, validator=v.SCHEMA)
    requires_approval: bool = attrs.field(default=False, validator=v.BOOL)
    category: str = attrs.field(default="read", validator=v.STR)
    concurrency_safe: Optional[Callable[[dict[str, Any]], Any]] = attrs.field(
        default=None, validator=v.OPTIONAL_CALLABLE
    )
    returns: Optional[Mapping[str, Any]] = attrs.field(default=None, validator=v.SCHEMA)
    validate_arguments: bool = attrs.field(default=True, validator=v.BOOL)
    exclusive_reason: str = attrs.field(default="", validator=v.STR)
    throttles: tuple[Throttle, ...] = attrs.field(default=(), converter=as_throttles, validator=THROTTLES)
    bound: Mapping[str, Any] = attrs.field(factory=dict, converter=bound_mapping, repr=_bound_repr)
    callers: frozenset[str] = attrs.field(default=CALLERS, converter=as_callers, validator=_CALLERS)
    #: ``parameters`` without the bound arguments: the schema every caller sees (``None`` when nothing is bound).
    caller_schema: Optional[Mapping[str, Any]] = attrs.field(init=False, repr=False, eq=False)

    @caller_schema.default
    def _caller_schema(self) -> Optional[Mapping[str, Any]]:
        if not self.bound or self.parameters is None:
            return None
        check_against(self.bound, self.parameters, self.name)
        return without(self.parameters, self.bound)


#: The trail's reason for an exclusive call of a tool with no ``concurrency_safe`` predicate.
NO_PREDICATE = "no concurrency_safe predicate"
#: The trail's reason for an exclusive call whose predicate did not answer exactly True.
PREDICATE_SAID_NO = "concurrency_safe did not answer True"


def exclusive_reason(tool: Any, mode: str) -> str:
    """Why a call of ``tool`` in ``mode`` ran exclusive (``""`` for a parallel call); never raises."""
    if mode != EXCLUSIVE:
        return ""
    said = getattr(tool, "exclusive_reason", "")
    if isinstance(said, str) and said:
        return said
    return NO_PREDICATE if getattr(tool, "concurrency_safe", None) is None else PREDICATE_SAID_NO


def concurrency_mode(tool: Tool, args: Any) -> Mode:
    """``"parallel"`` if ``tool.concurrency_safe(args) is True``, else ``"exclusive"``.

    Never raises. A predicate that raises (even ``SystemExit``), or returns anything but ``True``
    (``1``, ``"yes"``, a mock), logs a warning on the ``nous_sched`` logger and
    classifies the call exclusive. ``tool`` may be any object; one without a
    predicate is exclusive.
    """
    predicate = getattr(tool, "concurrency_safe", None)
    if predicate is None:
        return EXCLUSIVE
    name = getattr(tool, "name", "?")
    try:
        verdict = predicate(args)
    except BaseException:  # raise, exit, anything: fail safe, and keep the driver alive
        log.warning("concurrency_safe for tool %r failed; treating it as exclusive", name, exc_info=True)
        return EXCLUSIVE
    if verdict is True:
        return PARALLEL
    if verdict is not False:
        log.warning(
            "concurrency_safe for tool %r returned %s, not True or False; treating it as exclusive",
            name,
            type(verdict).__name__,
        )
    return EXCLUSIVE

"""Private: :class:`RunOptions`, every option of one ``run_code`` run in one checked value.

A door that starts runs (``run_code``, ``start_run``, ``run_code_tool``,
``visible_tools``, ``traced_run_code``, ``resume``, the CLI, serve-mcp) makes
one with :func:`build` from its keywords, or takes the caller's
(``options=RunOptions(...)``), and passes it down whole: the run's machinery
(:mod:`nous_sched._run.runner`) and a durable run (:mod:`nous_sched.durable`)
read its fields and check nothing again. Each field is checked once, as
the value is made; a bad one is the one :class:`~nous_sched.ConfigError`
shape of :mod:`nous_sched._validators`, naming the door the caller used
(``run_code: `timeout` must be ...``), or ``RunOptions`` when made directly.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import functools
from collections.abc import Collection, Mapping
from typing import Any, Callable, Optional

import attrs

from .. import _validators as v
from .._options import CANCEL, OPTIONAL_LIMITS, OPTIONAL_POLICY, OPTIONAL_SESSION_LOG
from ..errors import ConfigError, RunCodeError
from ..events import SessionLog
from ..gate.approval_seam import ApprovalStoreSeam
from ..gate.dispatch import ApprovalRequest, Dispatch, direct_dispatch
from ..gate.policy import PermissionPolicy
from ..limits import Limits
from ..result.budget import MIN_OUTPUT_BUDGET
from ..result.records import CallRecord
from ..runtime import Cancel, CodeRuntime
from ..state import State

__all__ = [
    "RunOptions",
    "build",
    "keywords",
    "check_runtime",
    "FIELDS",
    "OUTPUT_BUDGET",
    "NotGiven",
    "GIVEN_NOT",
    "given",
]

#: ``output_budget=``: ``None`` (no budget) or bytes of UTF-8, at least :data:`~nous_sched.result.budget.MIN_OUTPUT_BUDGET`.
OUTPUT_BUDGET = v.optional(v.int_at_least(MIN_OUTPUT_BUDGET, f"a number of bytes, at least {MIN_OUTPUT_BUDGET}"))
# (The stores sit in durable/, above this module: they are known here by the seam they implement.)
_STORE = v.optional(
    v.instance_of(
        ApprovalStoreSeam,
        "a nous_sched approval store (SqliteApprovalStore, RedisApprovalStore, PostgresApprovalStore)",
    )
)
_STATE = v.optional(v.instance_of(State, "a nous_sched.State (State(scope) or State(scope, store))"))

# The default is one: its signature is not read again for every run (most of the checks' time).
_DISPATCH = v.Check(v.DISPATCH.expected, lambda d: d is direct_dispatch or v.DISPATCH.accepts(d))


# (Made once per timeout and shared, a Limits being frozen: checking its every field is most of a
# run's checks. Typed: 4 and 4.0 each keep their own, as the limits' repr shows the timeout given.)
@functools.lru_cache(maxsize=64, typed=True)
def _default_limits(timeout: float) -> Limits:
    return Limits(timeout=timeout)


# The door whose caller gave the options being checked: every refusal names it.
_door: contextvars.ContextVar[str] = contextvars.ContextVar("nous_sched.run_options_door", default="RunOptions")


class _Named:
    """An attrs validator running ``check`` and naming the door being used (:func:`build`)."""

    __slots__ = ("check",)

    def __init__(self, check: v.Check) -> None:
        self.check = check

    def __call__(self, instance: Any, attribute: Any, value: Any) -> None:
        if not self.check.accepts(value):
            v.fail(_door.get(), attribute.name, value, self.check.expected)


def _field(default: Any, check: Optional[v.Check] = None) -> Any:
    return attrs.field(default=default, validator=None if check is None else _Named(check))


def check_runtime(runtime: Any) -> None:
    """Raise :class:`~nous_sched.RunCodeError` unless ``runtime`` is ``None``
    or implements :class:`~nous_sched.CodeRuntime` (an instance with its
    ``language``, ``run`` and ``begin``: subclass it for ``begin``'s default)."""
    if runtime is None:
        return
    if isinstance(runtime, type):
        raise RunCodeError(
            f"code runtime {runtime.__name__} is a class and does not implement nous_sched.CodeRuntime "
            f"as passed; pass an instance, e.g. runtime={runtime.__name__}()"
        )
    # (A subclass's instance is one: the class's own list first, where the
    # protocol's isinstance walks every member's name, most of a run's checks.)
    implements = CodeRuntime in type(runtime).__mro__ or isinstance(runtime, CodeRuntime)
    if not (implements and callable(runtime.run) and callable(runtime.begin)):
        raise RunCodeError(
            f"code runtime {runtime!r} does not implement nous_sched.CodeRuntime "
            "(it needs language, run(program, host, limits) -> RuntimeOutcome and begin(program, names, "
            "limits, cancel); subclass nous_sched.CodeRuntime for begin's default)"
        )


def _runtime(instance: Any, attribute: Any, value: Any) -> None:
    check_runtime(value)


def _timeout(instance: Any, attribute: Any, value: Any) -> None:
    # ``limits`` carries its own timeout and overrides this one, which is then not looked at.
    if instance.limits is None:
        _SECONDS(instance, attribute, value)


_SECONDS = _Named(v.SECONDS)


def _bind(instance: Any, attribute: Any, value: Any) -> None:
    # The message names the type only: a bind's values are secrets as often as not.
    if value is None or (isinstance(value, Mapping) and all(isinstance(k, str) and k for k in value)):
        return
    kind = type(value).__name__ if not isinstance(value, Mapping) else "mapping with a key that is not a non-empty str"
    raise ConfigError(
        f"{_door.get()}: `bind` must be None or a mapping of names (str) to values "
        f"(what each nous_sched.Bind of the tools' `bound` is filled from), got a {kind}"
    )


def _bind_repr(bind: Any) -> str:
    return "None" if bind is None else "{" + ", ".join(f"{name!r}: <bound>" for name in bind) + "}"


@attrs.frozen
class RunOptions:
    """Every option of a :func:`~nous_sched.run_code` run, checked once, as it is made.

    Its fields are ``run_code``'s keyword arguments, with the same defaults
    and the same meaning (see :func:`~nous_sched.run_code`):
    ``run_code(code, tools, options=RunOptions(timeout=5, max_parallel=4))``
    runs as ``run_code(code, tools, timeout=5, max_parallel=4)``. One value
    can start many runs, from many threads (``run_code``, ``start_run``,
    ``arun_code`` and ``resume`` take it as ``options=``); :meth:`evolve`
    (or :func:`attrs.evolve`) makes a changed copy, checked again.

    Frozen: a field cannot be set after it is made. Two ``RunOptions`` are
    equal when every field is (callables, events and stores by identity).
    ``timeout`` is checked only when ``limits`` is ``None`` (``limits``
    carries its own timeout and overrides it); ``description`` may be left
    out here (a door that runs a program requires it then).

    :raises ConfigError: a bad field, named in the message (a
        :class:`~nous_sched.RunCodeError` for a ``runtime`` that is not one).
    """

    description: Optional[str] = _field(None, v.OPTIONAL_STR)
    policy: Optional[PermissionPolicy] = _field(None, OPTIONAL_POLICY)
    approval_handler: Optional[Callable[[ApprovalRequest], Any]] = _field(None, v.OPTIONAL_CALLABLE)
    deps: Any = _field(None)
    runtime: Optional[CodeRuntime] = attrs.field(default=None, validator=_runtime)
    timeout: float = attrs.field(default=30.0, validator=_timeout)
    limits: Optional[Limits] = _field(None, OPTIONAL_LIMITS)
    max_parallel: int = _field(10, v.POSITIVE_INT)
    executor: Optional[concurrent.futures.Executor] = _field(None, v.EXECUTOR)
    call_id: Optional[str] = _field(None, v.OPTIONAL_STR)
    dispatch: Dispatch = _field(direct_dispatch, _DISPATCH)
    session_log: Optional[SessionLog] = _field(None, OPTIONAL_SESSION_LOG)
    observer: Optional[Callable[[CallRecord, str], Any]] = _field(None, v.OPTIONAL_CALLABLE)
    cancel: Optional[Cancel] = _field(None, CANCEL)
    output_budget: Optional[int] = _field(None, OUTPUT_BUDGET)
    approval_store: Optional[ApprovalStoreSeam] = _field(None, _STORE)
    state: Optional[State] = _field(None, _STATE)
    bind: Optional[Mapping[str, Any]] = attrs.field(default=None, validator=_bind, repr=_bind_repr)
    review: Optional[Callable[[Any], Any]] = _field(None, v.OPTIONAL_CALLABLE)

    @property
    def run_limits(self) -> Limits:
        """The run's limits: ``limits``, or the default limits with ``timeout``."""
        return self.limits if self.limits is not None else _default_limits(self.timeout)

    def evolve(self, **changes: Any) -> RunOptions:
        """A copy with ``changes`` set, each checked as :class:`RunOptions` checks it.

        :raises ConfigError: a bad value, or a name that is not a field.
        """
        for name in changes:
            if name not in FIELDS:
                v.unknown("RunOptions.evolve", name, FIELDS, "RunOptions")
        return attrs.evolve(self, **changes)


class NotGiven:
    """The default of a door's option keyword: the caller did not give it, so
    an option given also in ``options=`` is told apart from one left alone
    (even at its default value). ``shown`` is what a signature shows for it."""

    __slots__ = ("shown",)

    def __init__(self, shown: str = "<RunOptions default>") -> None:
        self.shown = shown

    def __repr__(self) -> str:
        return self.shown


#: The default of each of ``run_code``'s option keywords.
GIVEN_NOT: Any = NotGiven()


def given(keywords: Mapping[str, Any]) -> dict[str, Any]:
    """``keywords`` without those a caller did not give (a :class:`NotGiven` default)."""
    return {name: value for name, value in keywords.items() if not isinstance(value, NotGiven)}


#: The name of every field of :class:`RunOptions`, in order.
FIELDS: tuple[str, ...] = tuple(f.name for f in attrs.fields(RunOptions))
_OPTIONS = v.instance_of(RunOptions, "a nous_sched.RunOptions")


def keywords(door: str, given: dict[str, Any]) -> dict[str, Any]:
    """``given``, each a keyword ``run_code`` takes (``options`` among them): a
    door that forwards ``**options`` to it raises the ``TypeError`` it would."""
    for name in given:
        if name != "options" and name not in FIELDS:
            raise TypeError(f"{door}() got an unexpected keyword argument {name!r}")
    return given


def build(door: str, given: Mapping[str, Any], accepted: Collection[str] = FIELDS) -> RunOptions:
    """The :class:`RunOptions` a caller gave ``door``: ``given`` (its keywords,
    the ones it set: a door passes only those) made into one, or
    ``given["options"]`` as it is.

    :raises ConfigError: naming ``door``: a bad value, a name not in
        ``accepted`` (the closest one said), ``options`` that is not a
        :class:`RunOptions`, or an option given both in ``options`` and as
        a keyword.
    """
    named = dict(given)
    options = named.pop("options", None)
    for name in named:
        if name not in accepted:
            v.unknown(door, name, accepted, "run_code")
    if options is not None:
        v.require(door, "options", options, _OPTIONS)
        for name, value in named.items():
            v.fail(door, name, value, "given once: as a keyword or in `options`, not both")
        return options  # type: ignore[no-any-return]
    token = _door.set(door)
    try:
        return RunOptions(**named)
    finally:
        _door.reset(token)

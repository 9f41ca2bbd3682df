"""The event vocabulary, and the audit trail of sub-calls, kept out of model history.

:data:`VOCABULARY` names every kind of thing that happens to a call or a run
(``call``, ``outcome``, ``refused``, ``log``, ``approval``, ``suspended``,
``resumed``, ``end``, ``gap``, ``state``, ``review``) once, with its record type here and its name
in each projection: its audit type, its live kind (:mod:`nous_sched.live`),
its scheduler observer phase (:data:`PHASES`). The audit, the observer, the
live stream, OTel, AG-UI and serve-mcp's notifications are tables keyed by
those names (ARCHITECTURE.rst, "Events": where a new kind goes). A call's
tool is ``tool`` in every record.

A :class:`SessionLog` is an append-only list of :class:`Event`. Only the
*surface* types project to model messages (:meth:`SessionLog.messages`);
*bookkeeping* types, ``tool_call`` among them, are recorded for operators and
never reach the model. So a program that makes forty tool calls adds forty
audit records and nothing to what the model reads.

A caller that does not hand the scheduler a log of its own gets the events back
as :class:`ContextUpdate` ``log_event`` operations and applies them to the log
it does own.

Audit records are immutable once written: every :class:`Event`,
:class:`ToolCallEvent` and :class:`LogEvent` holds its JSON data in
:class:`FrozenDict` and :class:`FrozenList`, which compare equal to the
``dict`` and ``list`` they hold and refuse every change, so one reader cannot
alter what the next one reads. ``dict(data)`` or ``copy`` through JSON gives
a copy to edit.

A started call's arguments may be kept as the JSON text the gate parsed them
from (``frozen_later``): the text is immutable, so it is already a copy
no tool can reach, and its frozen form is built the first time anyone reads
``ToolCallEvent.arguments`` (or the ``data`` of its :class:`Event`), once,
whichever thread reads first. A reader cannot tell the difference: it gets a
:class:`FrozenDict` equal to what the tool got before it ran.
"""

from __future__ import annotations

import threading
import warnings
from collections import abc
from typing import Any, Callable, Iterable, Mapping, NoReturn, Optional

import attrs

from ._slots import LATER, MARK, READY, held, record
from .crossing import loads

__all__ = [
    "FrozenDict",
    "FrozenList",
    "freeze",
    "written_with_handles",
    "Event",
    "ToolCallEvent",
    "ToolRefusedEvent",
    "ApprovalEvent",
    "ToolOutcomeEvent",
    "LogLineEvent",
    "SuspendedEvent",
    "ResumedEvent",
    "StateEvent",
    "EndEvent",
    "GapEvent",
    "ReviewEvent",
    "RUN_RECORDS",
    "AUDIT_TYPES",
    "OUTCOME_ERROR_KINDS",
    "SessionLog",
    "LogEvent",
    "ContextUpdate",
    "SURFACE_TYPES",
    "Kind",
    "VOCABULARY",
    "PHASES",
    "LIVE_KINDS",
]

#: Event types that become model messages; every other type is bookkeeping.
SURFACE_TYPES = frozenset({"system_message", "user_message", "assistant_message", "tool_result"})
_ROLES = {
    "system_message": "system",
    "user_message": "user",
    "assistant_message": "assistant",
    "tool_result": "tool",
}


def _refuse(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError("audit records are immutable once written; edit a copy (dict(data), list(items))")


class FrozenDict(dict[str, Any]):
    """A ``dict`` that refuses every change after it is built (see the module docstring)."""

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if self:
            _refuse(self)  # on a built one, dict's __init__ would add to it
        dict.__init__(self, *args, **kwargs)

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (_frozen_dict, (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self


class FrozenList(list[Any]):
    """A ``list`` that refuses every change after it is built (see the module docstring)."""

    __slots__ = ()

    def __init__(self, items: Iterable[Any] = ()) -> None:
        if self:
            _refuse(self)  # on a built one, list's __init__ would replace its items
        list.__init__(self, items)

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (_frozen_list, (list(self),))

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenList:
        return self


# The builders freeze() uses: the C constructors directly, without a Python-level
# __init__, because freeze() runs once per call on the hot path.
def _frozen_dict(items: Any) -> FrozenDict:
    made: FrozenDict = dict.__new__(FrozenDict)
    dict.__init__(made, items)
    return made


def _frozen_list(items: Iterable[Any]) -> FrozenList:
    made: FrozenList = list.__new__(FrozenList)
    list.__init__(made, items)
    return made


_IMMUTABLE = frozenset({str, int, float, bool, type(None)})


def freeze(value: Any) -> Any:
    """``value`` with every dict (any mapping) and list (or tuple) replaced by a frozen copy, recursively.

    Already-frozen containers are returned as they are: everything inside one
    is frozen; so is a value still to be frozen (``frozen_later``).
    """
    kind = type(value)
    if kind in _IMMUTABLE or kind is FrozenDict or kind is FrozenList or kind is _Later:
        return value
    if kind is tuple and value and value[0] is _TEXT:  # frozen_later's: frozen when first read
        return value
    # Scalars inline, not one call each: this runs over every call's arguments.
    if kind is dict or isinstance(value, abc.Mapping):
        return _frozen_dict({key: item if type(item) in _IMMUTABLE else freeze(item) for key, item in value.items()})
    if kind is list or isinstance(value, (list, tuple)):
        return _frozen_list([item if type(item) in _IMMUTABLE else freeze(item) for item in value])
    return value


class _Later:
    """A value built on first read (by :func:`~nous_sched._slots.record`'s reader, once): ``make(arg)``."""

    __slots__ = ("make", "arg")

    def __init__(self, make: Callable[[Any], Any], arg: Any) -> None:
        self.make = make
        self.arg = arg

    def build(self) -> Any:
        return self.make(self.arg)


def _thaw(held: tuple[Any, str]) -> Any:
    return freeze(loads(held[1]))


def frozen_later(text: str) -> Any:
    """An audit copy of the JSON object ``text`` for :class:`ToolCallEvent`'s
    ``arguments``: read, it is ``freeze(crossing.loads(text))``, built on first
    read. ``text`` must be what the tool's own copy was parsed from, and parse
    under the snapshot rules (the gate has parsed it)."""
    # A tuple of a sentinel and a str, not an object: the garbage collector
    # stops tracking it at its first look, so the one a record keeps per call
    # does not count toward the collections of the whole process that the
    # records a run keeps bring on (benchmarks/README.rst, the GC paragraph).
    return (_TEXT, text)


_TEXT: Any = object()  # frozen_later's mark


def written_with_handles(event: "ToolCallEvent") -> bool:
    """Whether ``event``'s arguments, as the program wrote them, hold a blob handle
    (``"$blob"``, ``nous_sched.blobs``): then its ``arguments`` are not the value the tool
    got, which the handles stand for. Read from the text kept for the audit, never parsed."""
    form = held(event, "arguments")
    return type(form) is tuple and '"$blob"' in form[1]


# What freeze() returns as it is, by type alone: a record's __init__ skips the call for these.
_READY = (*_IMMUTABLE, FrozenDict, FrozenList, _Later)
_FROZEN = {READY: _READY}


def _deprecated_name(self: Any) -> str:
    warnings.warn(
        f"{type(self).__name__}.name is deprecated: read .tool (the one name of a call's tool in every record)",
        DeprecationWarning,
        stacklevel=2,
    )
    return str(self.tool)


@record
class Event:
    """One session event: a ``type`` and its JSON-shaped ``data``."""

    type: str
    data: Mapping[str, Any] = attrs.field(converter=freeze, metadata={READY: _READY, LATER: (_Later, _Later.build)})

    @property
    def surface(self) -> bool:
        return self.type in SURFACE_TYPES


@record
class ToolCallEvent:
    """The bookkeeping record of one *started* sub-call: one the gate admitted
    (``nous_sched.gate``) and the scheduler handed to its executor, written
    before the tool runs. Whether and when a tool thread actually took it up
    is the ``began`` of the call's :class:`~nous_sched.CallRecord`.

    ``id`` is ``"<call_id>:code:<seq>"`` (``"code:<seq>"`` without a call id);
    ``tool`` the tool's name (``name``, its older name, still reads it, with a
    ``DeprecationWarning``; the audit's JSON still writes it as ``"name"``);
    ``arguments`` is the logged snapshot, independent of what the tool got
    (held as the JSON text the gate parsed it from, ``frozen_later``, it is
    frozen the first time anyone reads it, once, whichever thread reads
    first: a reader cannot tell); ``mode`` is ``"parallel"`` or
    ``"exclusive"``; ``seq`` is the submission index, starting at 0.
    """

    id: str
    tool: str
    arguments: Any = attrs.field(converter=freeze, metadata={READY: _READY, LATER: (tuple, _thaw), MARK: _TEXT})
    mode: str
    seq: int
    source: str = "code_mode"

    type = "tool_call"
    name = property(_deprecated_name, doc="Deprecated: :attr:`tool`.")

    def as_event(self) -> Event:
        """This record as a session :class:`Event` (the audit projection); both are immutable,
        so they may share data. Arguments still held as text stay so: the event's ``data`` is
        built when first read."""
        if type(held(self, "arguments")) is tuple:  # held as text (frozen_later)
            return Event(self.type, _Later(_tool_call_data, self))  # type: ignore[arg-type]
        return Event(self.type, _tool_call_data(self))


def _tool_call_data(event: ToolCallEvent) -> FrozenDict:
    # Not attrs.asdict, nor a loop over the fields: this runs on the driver for every call.
    # Every field, in field order, by its audit name (tests/test_hot_path.py checks it).
    data = {
        "id": event.id,
        "name": event.tool,
        "arguments": event.arguments,
        "mode": event.mode,
        "seq": event.seq,
        "source": event.source,
    }
    return _frozen_dict(data)


@record
class ToolRefusedEvent:
    """The bookkeeping record of one call the gate refused before it started.

    ``tool`` is the tool the call named (any string the program wrote;
    ``name``, its older name, still reads it, with a ``DeprecationWarning``;
    the audit's JSON still writes it as ``"name"``), ``message`` what the
    caller was answered (the same two strings a started call fails with),
    ``source`` where the call came from (``"code_mode"``, ``"direct"``).
    """

    tool: str
    message: str
    source: str = "code_mode"

    type = "tool_refused"
    name = property(_deprecated_name, doc="Deprecated: :attr:`tool`.")

    def as_event(self) -> Event:
        return Event(self.type, {"name": self.tool, "message": self.message, "source": self.source})


@record
class ApprovalEvent:
    """The bookkeeping record of one approval decision, written as it is made
    (before the tool runs, or instead of it).

    ``seq`` is the call's submission index (its ``tool_call`` event's),
    ``tool`` the tool's name, ``approved`` the decision, ``reason`` why, in
    words: who decided (``"approved by the approval handler"``, ``"no approval
    handler is configured"``, ...). serve-mcp's audit log writes the same fields
    in its ``approval`` line; its ``by`` says which of its sources answered.

    ``grant`` is the id of the grant (:class:`nous_sched.Grant`) the decision
    made or spent (``""``: none): the granting call's record also has
    ``granted``, what the grant covers (``Grant.as_dict()``), and each call it
    covered has a record with the same ``grant``. Both keys are in the
    session form only when set.
    """

    seq: int
    tool: str
    approved: bool
    reason: str
    grant: str = ""
    granted: Any = attrs.field(default=None, converter=freeze, metadata=_FROZEN)

    type = "approval"

    def as_event(self) -> Event:
        data = {"seq": self.seq, "tool": self.tool, "approved": self.approved, "reason": self.reason}
        if self.grant:
            data["grant"] = self.grant
        if self.granted is not None:
            data["granted"] = self.granted
        return Event(self.type, data)


@record
class ToolOutcomeEvent:
    """The bookkeeping record of how one *started* call ended, written when it commits
    (or is abandoned at the run's end).

    ``ok`` is whether the tool returned a value; ``error`` is ``None`` or
    ``{"kind", "message"}``, the message being what the program read, the
    kind one of ``OUTCOME_ERROR_KINDS``; ``bytes`` is the size of the
    result's JSON text in UTF-8 (0 for a failure). ``blobs`` names the
    parts of the result the run kept on the host (``nous_sched.blobs``):
    ``(id, bytes)`` each, never their values; the session form has a
    ``"blobs"`` list of ``{"id", "bytes"}`` only when there is one. serve-mcp's
    audit log writes the same fields in its ``tool_outcome`` line.
    """

    seq: int
    tool: str
    ok: bool
    error: Any = attrs.field(default=None, converter=freeze, metadata=_FROZEN)
    bytes: int = 0
    blobs: tuple[tuple[str, int], ...] = ()

    type = "tool_outcome"

    def as_event(self) -> Event:
        data = {"seq": self.seq, "tool": self.tool, "ok": self.ok, "error": self.error, "bytes": self.bytes}
        if self.blobs:
            data["blobs"] = freeze([{"id": id, "bytes": size} for id, size in self.blobs])
        return Event(self.type, data)


#: ``ToolOutcomeEvent.error["kind"]`` values: the approval step refused the call
#: (``denied``), the run was over before it could start (``run_over``), the tool
#: raised or returned a failure (``tool_error``), or returned a value with no
#: JSON form (``invalid_result``), or was still running when its run ended
#: (``abandoned``), or its task died (``did_not_complete``).
OUTCOME_ERROR_KINDS = ("denied", "run_over", "tool_error", "invalid_result", "abandoned", "did_not_complete")


# -- the run's records --------------------------------------------------------------------
# Not on the per-call path (one per log line, step or run): plain frozen attrs.
# Each has ``kind``, its vocabulary name (its live kind too); the live stream's
# ``data`` is :func:`nous_sched.live.live_data` of it, the audit's (for the
# kinds the audit keeps) its ``as_event()``.


@attrs.frozen
class LogLineEvent:
    """A line the program wrote, as a step of the program ended (``line``: its text)."""

    line: str

    kind = "log"


@attrs.frozen
class SuspendedEvent:
    """A durable run suspended to wait for approvals: the ``token`` that resumes it
    (the audit keeps only its id, the part before the first ``.``), ``pending``
    (its :class:`~nous_sched.ApprovalRequest` values, each with its ``seq``) and
    ``expires_at`` (seconds since the epoch)."""

    token: str
    pending: tuple[Any, ...]
    expires_at: float

    kind = type = "suspended"

    def as_event(self) -> Event:
        """The audit's ``suspended`` event: ``token_id``, the ``pending`` seqs, ``expires_at``."""
        data = {"token_id": _token_id(self.token), "pending": [p.seq for p in self.pending]}
        return Event(self.type, {**data, "expires_at": self.expires_at})


@attrs.frozen
class ResumedEvent:
    """A durable run went on with decisions: ``token_id`` (its token's id),
    ``replayed`` (how many recorded calls it replays), ``took_over`` (whose
    resume it took over, in words; ``None`` for none) and ``parked`` (whether it
    went on in the process that held it, without replay)."""

    token_id: str
    replayed: int
    took_over: Optional[str] = None
    parked: bool = False

    kind = type = "resumed"

    def as_event(self) -> Event:
        """The audit's ``resumed`` event: ``token_id``, ``replayed``, and ``took_over``
        or ``parked`` when they say something."""
        data: dict[str, Any] = {"token_id": self.token_id, "replayed": self.replayed}
        if self.took_over is not None:
            data["took_over"] = self.took_over
        if self.parked:
            data["parked"] = True
        return Event(self.type, data)


@attrs.frozen
class EndEvent:
    """How a run ended, always its last event: ``ok``, ``error`` (``None`` or
    ``{"kind", "message", ...}``), ``logs`` (how many lines it kept), ``usage``
    (its ledger as a dict; ``None`` when the run raised) and ``answer`` (what the
    model reads)."""

    ok: bool
    error: Optional[Mapping[str, Any]]
    logs: int
    usage: Optional[Mapping[str, Any]]
    answer: Any

    kind = "end"


@attrs.frozen
class GapEvent:
    """A live consumer fell behind: ``missed`` events it will never see."""

    missed: int

    kind = "gap"


@attrs.frozen
class StateEvent:
    """One operation a program did on its state (``run_code(state=...)``):
    ``op`` (``get``, ``set``, ``delete``, ``keys``), ``key`` (``None`` for
    ``keys``), ``size`` (bytes of the value's JSON read or written; for
    ``keys``, of every value), ``version`` (the key's version after it, 0:
    absent), ``ok``, and ``error`` (``None``, or why it failed: ``conflict``,
    ``limit``, ``invalid``, ``store``, ``no_state``). Never the value."""

    op: str
    key: Optional[str]
    size: int
    version: int
    ok: bool = True
    error: Optional[str] = None

    kind = type = "state"

    def as_event(self) -> Event:
        """The audit's ``state`` event: ``op``, ``key``, ``size``, ``version``, ``ok``, and ``error`` when it failed."""
        data: dict[str, Any] = {"op": self.op, "key": self.key, "size": self.size, "version": self.version}
        data["ok"] = self.ok
        if self.error is not None:
            data["error"] = self.error
        return Event(self.type, data)


@attrs.frozen
class ReviewEvent:
    """A run's program was reviewed before it started (``run_code(review=...)``):
    ``verdict`` (``"allow"`` or ``"deny"``: an ``"ask"`` is recorded as the
    answer it got; ``"ask"`` itself when a durable run suspends to ask its
    approval store, then ``"allow"`` or ``"deny"`` on resume), ``reason`` (why, in words: the reviewer's, or which way it
    failed), ``asked`` (whether a person was asked through the approval
    handler) and ``summary``, the program's static summary as JSON
    (``ProgramSummary.as_dict()``: the strings in it are the program's own)."""

    verdict: str
    reason: str
    asked: bool
    summary: Mapping[str, Any] = attrs.field(converter=freeze)

    kind = type = "review"

    def as_event(self) -> Event:
        """The audit's ``review`` event: ``verdict``, ``reason``, ``asked``, ``summary``."""
        data = {"verdict": self.verdict, "reason": self.reason, "asked": self.asked, "summary": self.summary}
        return Event(self.type, data)


def _token_id(token: str) -> str:
    return token.split(".")[0]


#: The run's record types (every kind of the vocabulary with scope ``"run"``).
RUN_RECORDS = (LogLineEvent, SuspendedEvent, ResumedEvent, EndEvent, GapEvent, StateEvent, ReviewEvent)


# -- the vocabulary ---------------------------------------------------------------------


@attrs.frozen
class Kind:
    """One word of the event vocabulary: one thing that can happen to a call or a run,
    its record type, and its name in each projection (``None``: that projection does
    not carry it). See ARCHITECTURE.rst, "Events", for where a new one goes."""

    #: The vocabulary's own name for it.
    name: str
    #: ``"call"`` (it happens to one sub-call) or ``"run"``.
    scope: str
    #: Its record type in this module: what a projection is made from.
    record: type
    #: Its audit type (``Event.type``: the session log, ``RunResult.events`` or ``.audit``).
    audit: Optional[str]
    #: Its live kind (``RunEvent.kind``, :mod:`nous_sched.live`).
    live: Optional[str]
    #: Its scheduler observer phase (``observer(record: CallRecord, phase)``).
    phase: Optional[str]
    #: What happened, in one line.
    meaning: str


#: Every kind, each once. Each projection is a table keyed by one of its columns
#: (``tests/test_vocabulary.py`` checks that every projection names every kind its
#: column carries, and nothing else).
VOCABULARY = (
    Kind(
        "call",
        "call",
        ToolCallEvent,
        "tool_call",
        "call",
        "start",
        "a sub-call started (admitted, handed to its executor)",
    ),
    Kind(
        "outcome",
        "call",
        ToolOutcomeEvent,
        "tool_outcome",
        "commit",
        "commit",
        "a started call committed, in seq order, or was abandoned",
    ),
    Kind(
        "refused",
        "call",
        ToolRefusedEvent,
        "tool_refused",
        "refused",
        None,
        "the gate refused a call before it started",
    ),
    Kind("log", "run", LogLineEvent, None, "log", None, "the program wrote a line its logs keep"),
    Kind("approval", "call", ApprovalEvent, "approval", "approval", None, "an approval was asked, or decided"),
    Kind(
        "suspended",
        "run",
        SuspendedEvent,
        "suspended",
        "suspended",
        None,
        "a durable run waits for approvals",
    ),
    Kind("resumed", "run", ResumedEvent, "resumed", None, None, "a durable run went on with decisions"),
    Kind("end", "run", EndEvent, None, "end", None, "the run ended (always the last)"),
    Kind("gap", "run", GapEvent, None, "gap", None, "a live consumer fell behind and missed events"),
    Kind("state", "run", StateEvent, "state", "state", None, "the program read or wrote its state (never the value)"),
    Kind("review", "run", ReviewEvent, "review", "review", None, "the program was reviewed before it started"),
)

#: The bookkeeping types of the audit, shared by :class:`SessionLog`,
#: ``RunResult.events`` and serve-mcp's ``--audit-log`` lines: the call's kinds the audit keeps,
#: and ``state`` (a run's state operations, also written to the run's session log).
AUDIT_TYPES = ("tool_call", "tool_refused", "approval", "tool_outcome", "state")
#: The scheduler observer's phases, in the order a call goes through them.
PHASES = tuple(k.phase for k in VOCABULARY if k.phase is not None)
#: Live kinds, in :data:`VOCABULARY` order (``nous_sched.live.EVENT_KINDS``).
LIVE_KINDS = tuple(k.live for k in VOCABULARY if k.live is not None)
START, COMMIT = PHASES


class SessionLog:
    """An append-only, thread-safe session log.

    ``append`` may be called from any thread; readers get copies, in append
    order. The lock guards only the list: appends come from the scheduler's
    driver and from the caller's own thread at once.
    """

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self._lock = threading.Lock()
        self._events: list[Event] = list(events)

    def append(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)

    def log_event(self, type: str, data: Mapping[str, Any]) -> None:
        self.append(Event(type, data))

    @property
    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def messages(self) -> list[dict[str, Any]]:
        """The model-visible history: surface events only, as role/content dicts."""
        return [{"role": _ROLES[e.type], **e.data} for e in self.events if e.surface]

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)

    def __repr__(self) -> str:
        return f"<SessionLog events={len(self)}>"


@attrs.frozen
class LogEvent:
    """A context-update operation: append ``Event(type, data)`` to a session log."""

    type: str
    data: Mapping[str, Any] = attrs.field(converter=freeze)


@attrs.frozen
class ContextUpdate:
    """Operations a tool hands back for its caller to apply to its own log."""

    operations: tuple[LogEvent, ...] = ()

    @classmethod
    def log_events(cls, events: Iterable[Any]) -> "ContextUpdate":
        """One ``log_event`` per audit record (:class:`ToolCallEvent`, :class:`ApprovalEvent`,
        :class:`ToolOutcomeEvent`, :class:`ToolRefusedEvent`), in order."""
        return cls(tuple(LogEvent(e.type, e.as_event().data) for e in events))

    def apply_to(self, log: SessionLog) -> None:
        """Append every ``log_event`` operation to ``log``, in order."""
        for op in self.operations:
            log.log_event(op.type, op.data)

"""Session events: the audit trail of sub-calls, kept out of model history.

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
from (:func:`frozen_later`): the text is immutable, so it is already a copy
no tool can reach, and its frozen form is built the first time anyone reads
``ToolCallEvent.arguments`` (or the ``data`` of its :class:`Event`), once,
whichever thread reads first. A reader cannot tell the difference: it gets a
:class:`FrozenDict` equal to what the tool got before it ran.
"""

from __future__ import annotations

import threading
from collections import abc
from typing import Any, Callable, Iterable, Mapping, NoReturn, Optional

import attrs

from ._slots import maker
from .crossing import loads

__all__ = [
    "FrozenDict",
    "FrozenList",
    "freeze",
    "Event",
    "ToolCallEvent",
    "ToolRefusedEvent",
    "ApprovalEvent",
    "ToolOutcomeEvent",
    "AUDIT_TYPES",
    "OUTCOME_ERROR_KINDS",
    "SessionLog",
    "LogEvent",
    "ContextUpdate",
    "SURFACE_TYPES",
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
    is frozen; so is a value still to be frozen (:func:`frozen_later`).
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
    """A value built on first read, once: ``make(arg)``. Immutable to its readers."""

    __slots__ = ("_make", "_arg", "_value")

    def __init__(self, make: Callable[[Any], Any], arg: Any) -> None:
        self._make: Optional[Callable[[Any], Any]] = make
        self._arg = arg
        self._value: Any = _UNREAD

    def get(self) -> Any:
        value = self._value
        if value is _UNREAD:
            with _FIRST_READ:  # two first readers get one value
                value = self._value
                if value is _UNREAD:
                    assert self._make is not None
                    value = self._value = self._make(self._arg)
                    self._make = self._arg = None  # the text is not needed again
        return value


_UNREAD: Any = object()
_FIRST_READ = threading.RLock()  # reentrant: an event's data reads its arguments


def _thaw(text: str) -> Any:
    return freeze(loads(text))


def frozen_later(text: str) -> Any:
    """An audit copy of the JSON object ``text`` for :class:`ToolCallEvent`'s
    ``arguments``: read, it is ``freeze(snapshot.loads(text))``, built on first
    read. ``text`` must be what the tool's own copy was parsed from, and parse
    under the snapshot rules (the gate has parsed it)."""
    # A tuple of a sentinel and a str, not an object: the garbage collector
    # stops tracking it at its first look, so the one a record keeps per call
    # does not count toward the collections of the whole process that the
    # records a run keeps bring on (benchmarks/README.rst, the GC paragraph).
    return (_TEXT, text)


_TEXT: Any = object()  # frozen_later's mark


def _resolving(cls: type, name: str) -> None:
    """Make ``cls.<name>`` (an attrs slot) read a :class:`_Later` it holds as its value."""
    slot = cls.__dict__[name]  # the member descriptor attrs made for the field

    def read(self: Any) -> Any:
        value = slot.__get__(self, cls)
        return value.get() if type(value) is _Later else value

    # The setter is the slot's own: attrs' __init__ sets fields through it; a
    # frozen class's __setattr__ still refuses everyone else.
    setattr(cls, name, property(read, slot.__set__, doc=f"``{name}`` (frozen on first read when kept as text)."))


@attrs.frozen
class Event:
    """One session event: a ``type`` and its JSON-shaped ``data``."""

    type: str
    data: Mapping[str, Any] = attrs.field(converter=freeze)

    @property
    def surface(self) -> bool:
        return self.type in SURFACE_TYPES


_resolving(Event, "data")


@attrs.frozen
class ToolCallEvent:
    """The bookkeeping record of one *started* sub-call: one the gate admitted
    (:mod:`nous_sched.gate`) and the scheduler handed to its executor, written
    before the tool runs. Whether and when a tool thread actually took it up
    is the call's :attr:`CallRecord.began <nous_sched.CallRecord.began>`.

    ``id`` is ``"<call_id>:code:<seq>"`` (``"code:<seq>"`` without a call id);
    ``arguments`` is the logged snapshot, independent of what the tool got;
    ``mode`` is ``"parallel"`` or ``"exclusive"``; ``seq`` is the submission
    index, starting at 0.
    """

    id: str
    name: str
    arguments: Any = attrs.field(converter=freeze)
    mode: str
    seq: int
    source: str = "code_mode"

    type = "tool_call"

    def as_event(self) -> Event:
        """This record as a session :class:`Event`; both are immutable, so they may share data.
        Arguments still kept as text stay so: the event's ``data`` is built when first read."""
        if type(_ARGUMENTS(self)) is tuple:  # kept as text (frozen_later)
            return Event(self.type, _Later(_tool_call_data, self))
        return Event(self.type, _tool_call_data(self))


def _tool_call_data(event: ToolCallEvent) -> FrozenDict:
    # Not attrs.asdict, nor a loop over the fields: this runs on the driver for every call.
    # Every field, in field order (tests/test_hot_path.py checks it).
    data = {
        "id": event.id,
        "name": event.name,
        "arguments": event.arguments,
        "mode": event.mode,
        "seq": event.seq,
        "source": event.source,
    }
    return _frozen_dict(data)


_ARGUMENTS = ToolCallEvent.__dict__["arguments"].__get__  # the slot itself: the value as held
# Made before ``arguments`` becomes a property below: the maker sets the slot itself.
_make_call = maker(ToolCallEvent, "id", "name", "arguments", "mode", "seq", "source")
_SET_ARGUMENTS = ToolCallEvent.__dict__["arguments"].__set__


def _read_arguments(self: ToolCallEvent) -> Any:
    value = _ARGUMENTS(self)
    if type(value) is tuple:  # frozen_later's text: frozen now, once, in its place
        with _FIRST_READ:  # two first readers get one value
            value = _ARGUMENTS(self)
            if type(value) is tuple:
                value = _thaw(value[1])
                _SET_ARGUMENTS(self, value)
    return value


# The setter is the slot's own: attrs' __init__ sets fields through it; a
# frozen class's __setattr__ still refuses everyone else.
ToolCallEvent.arguments = property(
    _read_arguments, _SET_ARGUMENTS, doc="``arguments`` (frozen on first read when kept as text)."
)


def tool_call_event(id: str, name: str, arguments: Any, mode: str, seq: int) -> ToolCallEvent:
    """``ToolCallEvent(id, name, arguments, mode, seq)`` for ``arguments`` that
    are frozen already (:func:`freeze`, :func:`frozen_later`): the same record,
    its slots set directly, without attrs' ``__init__`` (at about half the
    cost: the scheduler's driver makes one per call)."""
    return _make_call(id, name, arguments, mode, seq, "code_mode")


@attrs.frozen
class ToolRefusedEvent:
    """The bookkeeping record of one call the gate refused before it started.

    ``name`` is the tool the call named (any string the program wrote),
    ``message`` what the caller was answered (the same two strings a started
    call fails with), ``source`` where the call came from (``"code_mode"``,
    ``"direct"``).
    """

    name: str
    message: str
    source: str = "code_mode"

    type = "tool_refused"

    def as_event(self) -> Event:
        return Event(self.type, {"name": self.name, "message": self.message, "source": self.source})


@attrs.frozen
class ApprovalEvent:
    """The bookkeeping record of one approval decision, written as it is made
    (before the tool runs, or instead of it).

    ``seq`` is the call's submission index (its ``tool_call`` event's),
    ``tool`` the tool's name, ``approved`` the decision, ``reason`` why, in
    words: who decided (``"approved by the approval handler"``, ``"no approval
    handler is configured"``, ...). serve-mcp's audit log writes the same fields
    in its ``approval`` line; its ``by`` says which of its sources answered.
    """

    seq: int
    tool: str
    approved: bool
    reason: str

    type = "approval"

    def as_event(self) -> Event:
        return Event(self.type, {"seq": self.seq, "tool": self.tool, "approved": self.approved, "reason": self.reason})


@attrs.frozen
class ToolOutcomeEvent:
    """The bookkeeping record of how one *started* call ended, written when it commits
    (or is abandoned at the run's end).

    ``ok`` is whether the tool returned a value; ``error`` is ``None`` or
    ``{"kind", "message"}``, the message being what the program read, the
    kind one of :data:`OUTCOME_ERROR_KINDS`; ``bytes`` is the size of the
    result's JSON text in UTF-8 (0 for a failure). serve-mcp's audit log
    writes the same fields in its ``tool_outcome`` line.
    """

    seq: int
    tool: str
    ok: bool
    error: Any = attrs.field(default=None, converter=freeze)
    bytes: int = 0

    type = "tool_outcome"

    def as_event(self) -> Event:
        data = {"seq": self.seq, "tool": self.tool, "ok": self.ok, "error": self.error, "bytes": self.bytes}
        return Event(self.type, data)


_make_outcome = maker(ToolOutcomeEvent, "seq", "tool", "ok", "error", "bytes")


def tool_outcome_event(seq: int, tool: str, ok: bool, error: Any, size: int) -> ToolOutcomeEvent:
    """``ToolOutcomeEvent(seq, tool, ok, error, size)``, the same record, its
    slots set directly, without attrs' ``__init__`` (``error`` is frozen here,
    as the field's converter would; the scheduler's driver makes one per call)."""
    return _make_outcome(seq, tool, ok, None if error is None else freeze(error), size)


#: ``ToolOutcomeEvent.error["kind"]`` values: the approval step refused the call
#: (``denied``), the run was over before it could start (``run_over``), the tool
#: raised or returned a failure (``tool_error``), or returned a value with no
#: JSON form (``invalid_result``), or was still running when its run ended
#: (``abandoned``), or its task died (``did_not_complete``).
OUTCOME_ERROR_KINDS = ("denied", "run_over", "tool_error", "invalid_result", "abandoned", "did_not_complete")

#: The bookkeeping types of the audit, shared by :class:`SessionLog`,
#: ``RunResult.events`` and serve-mcp's ``--audit-log`` lines.
AUDIT_TYPES = ("tool_call", "tool_refused", "approval", "tool_outcome")


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

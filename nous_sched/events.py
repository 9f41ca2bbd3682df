"""Session events: the audit trail of sub-calls, kept out of model history.

A :class:`SessionLog` is an append-only list of :class:`Event`. Only the
*surface* types project to model messages (:meth:`SessionLog.messages`);
*bookkeeping* types, ``tool_call`` among them, are recorded for operators and
never reach the model. So a program that makes forty tool calls adds forty
audit records and nothing to what the model reads.

A caller that does not hand the scheduler a log of its own gets the events back
as :class:`ContextUpdate` ``log_event`` operations and applies them to the log
it does own.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable, Mapping

import attrs

__all__ = [
    "Event",
    "ToolCallEvent",
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


@attrs.frozen
class Event:
    """One session event: a ``type`` and its JSON-shaped ``data``."""

    type: str
    data: Mapping[str, Any]

    @property
    def surface(self) -> bool:
        return self.type in SURFACE_TYPES


@attrs.frozen
class ToolCallEvent:
    """The bookkeeping record of one *started* sub-call.

    ``id`` is ``"<call_id>:code:<seq>"`` (``"code:<seq>"`` without a call id);
    ``arguments`` is the logged snapshot, independent of what the tool got;
    ``mode`` is ``"parallel"`` or ``"exclusive"``; ``seq`` is the submission
    index, starting at 0.
    """

    id: str
    name: str
    arguments: Any
    mode: str
    seq: int
    source: str = "code_mode"

    type = "tool_call"

    def as_event(self) -> Event:
        """This record as a session :class:`Event`; its data shares no container with it."""
        # Not attrs.asdict: this runs on the driver for every call, and the
        # fields are plain JSON, so a direct copy is the same and far cheaper.
        return Event(self.type, {name: _json_copy(getattr(self, name)) for name in _TOOL_CALL_FIELDS})


_TOOL_CALL_FIELDS = tuple(field.name for field in attrs.fields(ToolCallEvent))


def _json_copy(value: Any) -> Any:
    kind = type(value)
    if kind is dict:
        return {key: _json_copy(item) for key, item in value.items()}
    if kind is list:
        return [_json_copy(item) for item in value]
    return value


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
    data: Mapping[str, Any]


@attrs.frozen
class ContextUpdate:
    """Operations a tool hands back for its caller to apply to its own log."""

    operations: tuple[LogEvent, ...] = ()

    @classmethod
    def log_events(cls, events: Iterable[ToolCallEvent]) -> "ContextUpdate":
        return cls(tuple(LogEvent(e.type, e.as_event().data) for e in events))

    def apply_to(self, log: SessionLog) -> None:
        """Append every ``log_event`` operation to ``log``, in order."""
        for op in self.operations:
            log.log_event(op.type, op.data)

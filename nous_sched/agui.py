"""A run's live events in the AG-UI protocol, for agent front ends that speak it.

:func:`events` yields a :class:`~nous_sched.Run`'s events (:mod:`nous_sched.live`)
as ``ag_ui.core`` events while it goes; :func:`sse` the same as
server-sent-event text (``data: <JSON>\\n\\n`` each), for any web framework's
streaming response (``text/event-stream``); :func:`aevents` and :func:`asse` the
same as async iterators, for an asyncio server (a viewer holds no thread:
:meth:`~nous_sched.Run.aevent_batches`). Needs the ``agui`` extra
(``pip install -e '.[agui]'`` from a checkout: ``ag-ui-protocol``).

The mapping (one run is one AG-UI run; ``<id>`` is the run's ``call_id``):

============================  ===========================================================
live event                    AG-UI events
============================  ===========================================================
(before the first)            ``RUN_STARTED`` (``threadId``, ``runId``: the run's id unless
                              given), then ``CUSTOM`` ``nous_sched.run``
                              (``{description, call_id}``)
``call``                      ``TOOL_CALL_START`` (``toolCallId``: the call's audit id
                              ``<id>:code:<seq>``, ``toolCallName``: the tool),
                              ``TOOL_CALL_ARGS`` (a JSON object: each value as the program
                              gave it, or the clipped text when it was clipped),
                              ``TOOL_CALL_END``, then ``CUSTOM`` ``nous_sched.call``
``commit``                    ``TOOL_CALL_RESULT`` (``messageId`` ``<toolCallId>:result``,
                              ``content``: the value's JSON text as clipped, or
                              ``{"error": {kind, message}}``), then ``CUSTOM``
                              ``nous_sched.commit``
``refused``                   ``TOOL_CALL_START`` / ``END`` / ``RESULT`` of a call that never
                              ran (``toolCallId`` ``<id>:refused:<n>``, ``content``
                              ``{"error": {"kind": "refused", reason, message}}``), then
                              ``CUSTOM`` ``nous_sched.refused``
``log``                       a text message (``TEXT_MESSAGE_START`` / ``CONTENT`` / ``END``,
                              role ``assistant``, ``messageId`` ``<id>:log:<n>``; no
                              ``CONTENT`` for an empty line)
``approval``                  ``CUSTOM`` ``nous_sched.approval``: the call waits for a live
                              approval handler (``asked``, with its ``question``), then
                              ``approved`` or ``rejected``; the run goes on meanwhile;
                              ``covered``: a grant the run holds approved the call
``suspended``                 AG-UI's human-in-the-loop interrupt: each pending call as a
                              tool call (``START`` / ``ARGS`` / ``END``), then ``CUSTOM``
                              ``nous_sched.suspended``
``end``                       ``RUN_FINISHED`` with ``outcome`` ``success`` and ``result``
                              (what the model reads); after ``suspended``, ``outcome``
                              ``interrupt`` (one interrupt per pending call, ``reason``
                              ``approval_required``, ``id`` the resume token and seq);
                              a ``cancelled`` run ``outcome`` ``cancelled``; any other
                              error ``RUN_ERROR`` (``code``: its kind, ``message``)
``gap``                       ``CUSTOM`` ``nous_sched.gap``
============================  ===========================================================

Approvals: AG-UI has no channel from the consumer into a running run, so
its human-in-the-loop pattern ends the run with an interrupt and a new run
carries the answers. That is what a durable run does (it suspends; the
interrupt's ``message`` is the approval question, and
:func:`~nous_sched.resume_run` with the decisions is the next run). A live
approval handler is answered out of band (:class:`~nous_sched.ApprovalDesk`
behind a page's buttons, say) while the run goes on, so its asks and
decisions are ``CUSTOM`` events.

Every ``CUSTOM`` value is ``{"seq", **data}`` of the live event. A result
whose call's start a consumer missed (a ``gap``) gets its start first, so the
stream stays well formed. Every string is the program's text as data: a lone
surrogate is U+FFFD, as in every value the library hands to an encoder
(:mod:`nous_sched._text`), so it cannot stop the stream.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, AsyncIterator, Callable, Iterator, Optional

try:
    from ag_ui.core import (
        BaseEvent,
        CustomEvent,
        Interrupt,
        RunErrorEvent,
        RunFinishedCancelledOutcome,
        RunFinishedEvent,
        RunFinishedInterruptOutcome,
        RunFinishedSuccessOutcome,
        RunStartedEvent,
        TextMessageContentEvent,
        TextMessageEndEvent,
        TextMessageStartEvent,
        ToolCallArgsEvent,
        ToolCallEndEvent,
        ToolCallResultEvent,
        ToolCallStartEvent,
    )
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    from ._extras import install_command

    raise ImportError(
        f"nous_sched.agui needs the `agui` extra (ag-ui-protocol); install it with: {install_command('agui')}"
    ) from exc

from ._text import json_inert, machine_text
from .live import SSE_BUFFER, Run, RunEvent

__all__ = ["events", "sse", "aevents", "asse", "Translator", "MEDIA_TYPE"]

#: The media type of :func:`sse`'s text.
MEDIA_TYPE = "text/event-stream"


def clean(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (and keys) replaced by
    U+FFFD, the library's one rule for a value another library encodes
    (:func:`nous_sched._text.machine_text`)."""
    if isinstance(value, str):
        return machine_text(value)
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def _arguments_json(rows: list[dict[str, Any]]) -> str:
    """The call's arguments as one JSON object: a value as given unless it was clipped (then its text)."""
    shown: dict[str, Any] = {}
    for row in rows:
        text = row["value"]
        if row["clipped"]:
            shown[row["key"]] = text
            continue
        try:
            shown[row["key"]] = json.loads(text)
        except ValueError:  # an escape the renderer wrote (a control character) that JSON does not know
            shown[row["key"]] = text
    return json.dumps(clean(shown), ensure_ascii=False, separators=(",", ":"))


class Translator:
    """Turns one run's live events into AG-UI events; pure, one instance per consumer.

    ``feed(event)`` returns the AG-UI events for one :class:`~nous_sched.RunEvent`
    (the first call also returns ``RUN_STARTED``); after ``end`` it returns none.
    """

    def __init__(self, run_id: str, thread_id: str, *, description: str = "", started_at: float = 0.0) -> None:
        self.run_id = run_id
        self.thread_id = thread_id
        self.description = description
        self.started_at = started_at
        self._begun = False
        self._over = False
        self._ids: dict[int, str] = {}  # seq -> toolCallId, for the calls whose start was sent
        self._logs = itertools.count()
        self._refusals = itertools.count()
        self._suspension: Optional[dict[str, Any]] = None

    def feed(self, event: RunEvent) -> list[BaseEvent]:
        if self._over:
            return []
        out: list[BaseEvent] = []
        stamp = int((self.started_at + event.at) * 1000)
        if not self._begun:
            self._begun = True
            out.append(RunStartedEvent(thread_id=self.thread_id, run_id=self.run_id, timestamp=stamp))
            run = {"description": self.description, "call_id": self.run_id}
            out.append(CustomEvent(name="nous_sched.run", value=clean(run), timestamp=stamp))
        project = PROJECTION.get(event.kind)
        if project is not None:
            out.extend(project(self, event, stamp))
        if event.kind != "end":
            out.append(CustomEvent(name="nous_sched." + event.kind, value=clean({"seq": event.seq, **event.data})))
        return out

    def _call_id(self, seq: Optional[int]) -> str:
        return f"{self.run_id}:code:{seq}"

    def _start(self, tool_call_id: str, name: str, args: str, stamp: int) -> list[BaseEvent]:
        return [
            ToolCallStartEvent(tool_call_id=tool_call_id, tool_call_name=clean(name), timestamp=stamp),
            ToolCallArgsEvent(tool_call_id=tool_call_id, delta=args, timestamp=stamp),
            ToolCallEndEvent(tool_call_id=tool_call_id, timestamp=stamp),
        ]

    def _call(self, event: RunEvent, stamp: int) -> list[BaseEvent]:
        data = event.data
        tool_call_id = clean(str(data.get("call_id") or self._call_id(event.seq)))
        if event.seq is not None:
            self._ids[event.seq] = tool_call_id
        return self._start(tool_call_id, str(data.get("tool", "")), _arguments_json(data.get("arguments", [])), stamp)

    def _commit(self, event: RunEvent, stamp: int) -> list[BaseEvent]:
        data = event.data
        out: list[BaseEvent] = []
        seq = event.seq
        tool_call_id = self._ids.pop(seq, None) if seq is not None else None
        if tool_call_id is None:  # its start was missed (a gap): send one, so the result has a call
            tool_call_id = self._call_id(seq)
            out += self._start(tool_call_id, str(data.get("tool", "")), "{}", stamp)
        if data.get("ok"):
            value = data.get("value") or {}
            content = str(value.get("text", "null"))
        else:
            content = json.dumps({"error": data.get("error")}, ensure_ascii=False)
        result_id = tool_call_id + ":result"
        out.append(
            ToolCallResultEvent(
                message_id=result_id, tool_call_id=tool_call_id, content=clean(content), role="tool", timestamp=stamp
            )
        )
        return out

    def _refused(self, event: RunEvent, stamp: int) -> list[BaseEvent]:
        data = event.data
        tool_call_id = f"{self.run_id}:refused:{next(self._refusals)}"
        out = self._start(tool_call_id, str(data.get("tool", "")), "{}", stamp)
        error = {"kind": "refused", "reason": data.get("reason"), "message": data.get("message")}
        content = clean(json.dumps({"error": error}, ensure_ascii=False))
        out.append(
            ToolCallResultEvent(
                message_id=tool_call_id + ":result",
                tool_call_id=tool_call_id,
                content=content,
                role="tool",
                timestamp=stamp,
            )
        )
        return out

    def _log(self, event: RunEvent, stamp: int) -> list[BaseEvent]:
        message_id = f"{self.run_id}:log:{next(self._logs)}"
        line = clean(str(event.data.get("line", "")))
        out: list[BaseEvent] = [TextMessageStartEvent(message_id=message_id, role="assistant", timestamp=stamp)]
        if line:
            out.append(TextMessageContentEvent(message_id=message_id, delta=line, timestamp=stamp))
        out.append(TextMessageEndEvent(message_id=message_id, timestamp=stamp))
        return out

    def _suspended(self, event: RunEvent, stamp: int) -> list[BaseEvent]:
        self._suspension = dict(event.data)
        out: list[BaseEvent] = []
        for pending in event.data.get("pending", []) or []:
            seq = pending.get("seq")
            tool_call_id = self._call_id(seq)
            args = pending.get("arguments")
            text = json.dumps(clean(args if isinstance(args, dict) else {}), ensure_ascii=False)
            out += self._start(tool_call_id, str(pending.get("tool", "")), text, stamp)
        return out

    def _end(self, event: RunEvent, stamp: int) -> list[BaseEvent]:
        self._over = True
        data = event.data
        error = data.get("error") or {}
        common: dict[str, Any] = {"thread_id": self.thread_id, "run_id": self.run_id, "timestamp": stamp}
        if self._suspension is not None:
            token = str(self._suspension.get("token", ""))
            interrupts = [
                Interrupt(
                    id=f"{token}#{p.get('seq')}",
                    reason="approval_required",
                    tool_call_id=self._call_id(p.get("seq")),
                    message=clean(str(p.get("question") or f"the call of {p.get('tool')} waits for approval")),
                )
                for p in self._suspension.get("pending", []) or []
            ]
            return [RunFinishedEvent(outcome=RunFinishedInterruptOutcome(interrupts=interrupts), **common)]
        if data.get("ok"):
            answer = clean(data.get("answer"))
            return [RunFinishedEvent(outcome=RunFinishedSuccessOutcome(), result=answer, **common)]
        if error.get("kind") == "cancelled":
            return [RunFinishedEvent(outcome=RunFinishedCancelledOutcome(), **common)]
        message = clean(str(error.get("message") or "the run failed"))
        return [RunErrorEvent(message=message, code=clean(str(error.get("kind", "error"))), timestamp=stamp)]


#: The AG-UI projection of the live vocabulary (:data:`nous_sched.events.VOCABULARY`):
#: every live kind, with what makes its AG-UI events besides the ``CUSTOM`` one every
#: kind but ``end`` gets, or ``None`` for a kind that is only that ``CUSTOM`` event.
PROJECTION: dict[str, Optional[Callable[[Translator, RunEvent, int], list[BaseEvent]]]] = {
    "call": Translator._call,  # noqa: SLF001
    "commit": Translator._commit,  # noqa: SLF001
    "refused": Translator._refused,  # noqa: SLF001
    "log": Translator._log,  # noqa: SLF001
    "approval": None,
    "suspended": Translator._suspended,  # noqa: SLF001
    "end": Translator._end,  # noqa: SLF001
    "gap": None,
    "state": None,  # (its CUSTOM event carries it)
    "review": None,
}


def events(run: Run, *, run_id: Optional[str] = None, thread_id: Optional[str] = None) -> Iterator[BaseEvent]:
    """``run``'s events from its first, as ``ag_ui.core`` events, live, ending with
    ``RUN_FINISHED`` or ``RUN_ERROR`` (see the module docstring for the mapping).

    ``run_id`` and ``thread_id`` default to the run's ``call_id``. Each call is a
    new consumer of the run's stream (:meth:`~nous_sched.Run.events`).
    """
    translator = _translator(run, run_id, thread_id)
    for event in run.events():
        yield from translator.feed(event)


def _translator(run: Run, run_id: Optional[str], thread_id: Optional[str]) -> Translator:
    rid = run_id if run_id is not None else run.call_id
    return Translator(
        rid, thread_id if thread_id is not None else rid, description=run.description, started_at=run.started_at
    )


def encode(event: BaseEvent) -> str:
    """One AG-UI event as one server-sent event: ``data: <JSON>\\n\\n`` (camelCase, no nulls).
    Control and format characters are JSON escapes, as in every JSON text the
    library writes (``nous_sched._text.json_inert``): the same value, inert on a terminal."""
    return f"data: {json_inert(event.model_dump_json(by_alias=True, exclude_none=True))}\n\n"


def sse(run: Run, *, run_id: Optional[str] = None, thread_id: Optional[str] = None) -> Iterator[str]:
    """:func:`events` as server-sent-event text, one ``data:`` message per event (:data:`MEDIA_TYPE`).

    Each string is the messages of one batch of the run's ready events
    (:meth:`~nous_sched.Run.event_batches`): a server writes each in one write,
    so a watcher's thread wakes once per batch, not once per event.
    """
    translator = _translator(run, run_id, thread_id)
    for batch in run.event_batches():
        text = "".join(encode(out) for event in batch for out in translator.feed(event))
        if text:
            yield text


async def aevents(
    run: Run, *, run_id: Optional[str] = None, thread_id: Optional[str] = None
) -> AsyncIterator[BaseEvent]:
    """:func:`events` as an async iterator: waiting for the run's next event blocks
    neither the event loop nor a thread (:meth:`~nous_sched.Run.aevents`)."""
    translator = _translator(run, run_id, thread_id)
    async for event in run.aevents():
        for out in translator.feed(event):
            yield out


def asse(
    run: Run, *, run_id: Optional[str] = None, thread_id: Optional[str] = None, buffer: int = SSE_BUFFER
) -> AsyncIterator[str]:
    """:func:`sse` as an async iterator, for an asyncio server's streaming response:
    one string per batch of ready events (:meth:`~nous_sched.Run.aevent_batches`),
    a viewer at most ``buffer`` events behind (then ``CUSTOM`` ``nous_sched.gap``).
    A viewer waiting, or stalled in its socket write, holds no thread.

    :raises ConfigError: ``buffer`` is not a positive integer.
    """
    translator = _translator(run, run_id, thread_id)
    return _texts(translator, run.aevent_batches(buffer))


async def _texts(translator: Translator, batches: AsyncIterator[list[RunEvent]]) -> AsyncIterator[str]:
    async for batch in batches:
        text = "".join(encode(out) for event in batch for out in translator.feed(event))
        if text:
            yield text

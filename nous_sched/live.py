"""Live, ordered events of a run, for the people watching it.

:func:`start_run` starts a run and returns a :class:`Run` at once; the run
goes on in a thread of its own (``nous-sched-run-<n>``), in a copy of the
caller's ``contextvars``. ``run.events()`` yields :class:`RunEvent` values
while it goes, ``run.result()`` waits for its :class:`~nous_sched.RunResult`,
``run.cancel()`` ends it early. ``run_code(...)`` behaves as
``start_run(...).result()``, on the caller's thread and with no stream.

The events, each with ``kind``, ``seq`` (the sub-call's, the same number
as its audit records, its ``call_id`` and the trail's; ``None`` for events of
no started call), ``at`` (seconds since the run started) and ``data`` (a
JSON-shaped dict). Every string the program chose (arguments, values, error
messages, log lines) is its own text: a page writes it as text, never markup.

* ``"call"``: a sub-call started (``data``: ``tool``, ``call_id`` (its audit
  id), ``mode`` (``"parallel"`` or ``"exclusive"``) and ``why`` (why it ran
  exclusive, ``""`` when parallel), ``throttles`` (the names of the
  throttles it may wait for), ``approval`` (whether it waits for an approval
  before it runs), ``arguments``: one row per top-level key,
  :func:`nous_sched.gate.approval_text.arguments`, the renderer the approval
  question uses: ``key``, ``value`` (its JSON text, clipped on its own and
  inert), ``chars`` (the value's full size), ``clipped``);
* ``"commit"``: it committed, in ``seq`` order whatever order the calls
  finished in (``tool``, ``ok``, ``chars``: the size of the result the
  program receives, as the ledger counts it, :mod:`nous_sched.result.usage`;
  ``duration``: seconds from when a tool thread took it up to when it
  finished, ``None`` when it never ran; ``waited``: seconds it waited for a
  thread and its throttles before that, ``throttled``: of which for its
  throttles (``None`` when it names none); ``value``: the result as
  :func:`~nous_sched.gate.approval_text.clipped` shows it (``text``, ``chars``,
  ``clipped``), ``None`` for a failure; ``error``: ``None``, or ``kind`` (one
  of :data:`~nous_sched.events.OUTCOME_ERROR_KINDS`) and ``message``, what the
  program saw, clipped the same way; and ``blobs``, only when the run kept
  parts of the result on the host, ``[{"id", "bytes"}]``: the value holds
  their handles, ``nous_sched.blobs``);
* ``"refused"``: the gate refused a call before it started (``seq`` is
  ``None``: it has none; ``tool``, ``reason``, one of
  :data:`nous_sched.gate.REFUSAL_REASONS`, ``message``, what the program
  saw); bounded as the audit is (at most ``Limits.max_calls`` plus one);
* ``"log"``: a line the program wrote, as each step of the program ends
  (``line``), the lines the run's logs keep;
* ``"approval"``: an approval asked and decided (``tool``, ``call_id``,
  ``state``: ``"asked"`` (with ``question``, the text
  :meth:`~nous_sched.ApprovalRequest.question` gives), then ``"approved"`` or
  ``"rejected"``; an answer that made a grant (:class:`~nous_sched.Grant`)
  is ``"approved"`` with ``grant``, its id, and ``granted``, what it covers;
  a later call the grant covered, never asked, is one ``"covered"`` event
  with ``grant``);
* ``"suspended"``: a durable run suspended to wait for approvals, just
  before its ``end`` (``token``, the one that resumes it, ``expires_at``,
  ``pending``: ``seq``, ``tool``, ``arguments`` and ``question`` of each);
* ``"end"``, always last (``ok``, ``error``, ``logs``, ``usage``: the ledger,
  ``answer``: what the model reads, :meth:`~nous_sched.RunResult.for_model`,
  within the run's output budget);
* ``"state"``: the program read or wrote its state (``run_code(state=...)``,
  ``nous_sched.state``): ``op``, ``key``, ``size``, ``version``, ``ok`` and
  ``error`` (``None`` or why it failed), never the value;
* ``"gap"``, only for a consumer that fell behind: ``missed`` events it
  will never see;
* ``"review"``: the program was reviewed before it started
  (``run_code(review=...)``), always before any other event of its run:
  ``verdict`` (``"allow"`` or ``"deny"``), ``reason`` (made inert and
  clipped), ``asked`` (whether the approval handler was asked) and
  ``summary`` (:meth:`~nous_sched.ProgramSummary.as_dict`: the program's own
  strings, as JSON data).

Each event's ``data`` is a projection of the record the vocabulary
(:data:`nous_sched.events.VOCABULARY`) names for its kind: :func:`live_data`
of a run's record (``log``, ``suspended``, ``end``, ``gap``, ``state``),
:func:`call_data` and :func:`commit_data` of a call's audit records and its
:class:`~nous_sched.CallRecord`, :func:`refused_data` of the gate's ``tool_refused`` record.

Events are ordered once, as they are emitted (one lock), so every consumer
sees the same order. Any number of consumers may iterate, each from the
run's first event; each has its own bounded buffer (``events(buffer=N)``):
a consumer more than ``N`` events behind skips to the newest ``N`` and is told
so by a ``gap`` event with the count. Emitting never waits for a consumer,
so a slow consumer never slows the run. ``events()`` yields one event at a time;
``event_batches()`` yields the same events as lists, each everything ready
when the consumer woke, for a server that writes each list in one write (one
wake-up per batch, not per event: many watchers then cost each other little).
The stream holds the last
:data:`HISTORY` events (up to a quarter more between trims); a consumer
that starts later than that misses the oldest (a ``gap`` again).

From an asyncio server: ``aevents()`` and ``aevent_batches()`` are the same
streams as async iterators. A waiting consumer holds no thread and never
blocks the event loop: it waits on a future of its loop that the next event
wakes (once per batch). :func:`sse` and :func:`asse` give the stream as
server-sent-event text (``data: <RunEvent JSON>\\n\\n`` per event, one
string per batch, each viewer at most :data:`SSE_BUFFER` events behind), for
any framework's streaming response; :func:`nous_sched.asgi.sse_app` serves
runs' streams as an ASGI app.
"""

from __future__ import annotations

import contextvars
import itertools
import json
import secrets
import threading
import time
from functools import partial
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Collection, Iterable, Iterator, Optional

import attrs

from . import _validators as v
from ._run.entry import run as run_with
from ._run.options import RunOptions, build, keywords
from ._run.runner import execute, live_stream, prepare
from ._text import machine_json
from .durable import resume
from .events import (
    LIVE_KINDS,
    ApprovalEvent,
    EndEvent,
    GapEvent,
    LogLineEvent,
    ReviewEvent,
    StateEvent,
    SuspendedEvent,
    ToolCallEvent,
    ToolOutcomeEvent,
    ToolRefusedEvent,
    written_with_handles,
)
from .gate import approval_text
from .gate.dispatch import needs_approval
from .outcome import Outcome
from .result import RunResult
from .result.records import CallRecord
from .runtime import AnyCancel
from .tooling import Tool

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "start_run",
    "resume_run",
    "Run",
    "RunEvent",
    "EventStream",
    "EVENT_KINDS",
    "HISTORY",
    "DEFAULT_BUFFER",
    "SSE_BUFFER",
    "MEDIA_TYPE",
    "sse",
    "asse",
    "LIVE_DATA",
    "PROJECTION",
    "live_data",
    "call_data",
    "commit_data",
    "refused_data",
    "end_record",
]

#: Every ``RunEvent.kind``: the live projection of :data:`nous_sched.events.VOCABULARY`.
EVENT_KINDS = LIVE_KINDS
#: How many events a run's stream holds for consumers that start late.
HISTORY = 100_000
#: How many events one consumer may fall behind before it skips (a ``gap``).
DEFAULT_BUFFER = 10_000
#: How many events one viewer of :func:`sse` / :func:`asse` may fall behind before it skips
#: (a ``gap``): what one stalled viewer costs is at most this many events, plus what its socket holds.
SSE_BUFFER = 1_000
#: The media type of :func:`sse`'s and :func:`asse`'s text.
MEDIA_TYPE = "text/event-stream"
_BUFFER = v.int_at_least(1, "a positive number of events")
_numbers = itertools.count(1)


@attrs.frozen
class RunEvent:
    """One thing that happened in a run; see the module docstring for each ``kind``.

    Every consumer gets the same event object: read ``data``, do not change it.
    """

    kind: str
    seq: Optional[int]
    at: float
    data: dict[str, Any] = attrs.field(eq=False)
    # to_json's text, made by the first consumer that asks: every viewer of a run writes the
    # same events, so a server with many viewers encodes each event once, not once per viewer.
    _json: Optional[str] = attrs.field(default=None, init=False, eq=False, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """``{"kind", "seq", "at", "data"}``, JSON-ready."""
        return {"kind": self.kind, "seq": self.seq, "at": self.at, "data": self.data}

    def to_json(self) -> str:
        """One line of strict JSON (the CLI's ``--events`` format, an SSE message's
        data): lone surrogates as U+FFFD, control and format characters as JSON
        escapes, so it encodes as UTF-8 and is inert on a terminal. Made once per
        event (``data`` is not to be changed), whoever asks."""
        text = self._json
        if text is None:
            text = machine_json(self.as_dict(), default=str)
            object.__setattr__(self, "_json", text)  # a cache of a frozen value: a race makes the same text
        return text


class EventStream:
    """A run's events, in the order they were emitted, for any number of consumers.

    The run's side calls :meth:`emit` (and the hooks built on it) from any
    thread; it never blocks for long and never waits for a consumer.
    """

    def __init__(self, history: int = HISTORY) -> None:
        self._cond = threading.Condition(threading.Lock())
        # A list, not a deque: a consumer's next batch is a slice from its
        # cursor (a deque would walk from its start). Trimmed in chunks.
        self._events: list[RunEvent] = []
        self._history = history
        self._first = 0  # the index of _events[0] among every event emitted
        self._ended = False
        # The async consumers waiting for the next event: each its loop and a future of it,
        # woken (and dropped) by the next emit, so a waiting consumer costs no thread.
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._t0 = time.perf_counter()
        self.started_at = time.time()

    def emit(self, kind: str, seq: Optional[int], data: dict[str, Any]) -> None:
        """Append one event (ignored after ``end``). Never raises for a consumer."""
        with self._cond:
            if self._ended:
                return
            events = self._events
            events.append(RunEvent(kind, seq, time.perf_counter() - self._t0, data))
            if len(events) > self._history + self._history // 4:
                drop = len(events) - self._history
                del events[:drop]
                self._first += drop
            self._ended = kind == "end"
            self._cond.notify_all()
            waiters = self._waiters
            if waiters:
                self._waiters = []
        if waiters:
            _wake(waiters)

    # -- the run's hooks ----------------------------------------------------

    def started(self, gated: Collection[str], record: CallRecord, event: ToolCallEvent, args: Any, tool: Any) -> None:
        """The scheduler's start hook (``Scheduler.watch``), before the tool has its
        arguments: a ``call`` event, :func:`call_data` of the call's records (the
        arguments as the program wrote them: a blob handle, not its value)."""
        if written_with_handles(event):
            args = event.arguments
        self.emit("call", event.seq, call_data(event, record, args, tool, gated))

    def committed(self, record: CallRecord, event: ToolOutcomeEvent, outcome: Outcome) -> None:
        """The scheduler's outcome hook (``Scheduler.watch``) at each commit: a ``commit``
        event, :func:`commit_data` of the call's records."""
        self.emit("commit", event.seq, commit_data(event, record, outcome))

    def refused(self, event: ToolRefusedEvent, reason: str) -> None:
        """The gate's hook for each refusal it audits: a ``refused`` event, :func:`refused_data` of its record."""
        self.emit("refused", None, refused_data(event, reason))

    def logs(self, lines: Iterable[str]) -> None:
        """The runtime's hook for one step's log lines: a ``log`` event each."""
        for line in lines:
            self.emit_record(LogLineEvent(line))

    def end(self, result: Optional[RunResult], problem: Optional[BaseException] = None) -> None:
        """The last event: how the run ended, its logs and its ledger."""
        self.emit_record(end_record(result, problem))

    def emit_record(self, record: Any) -> None:
        """Append the live projection of one of the run's records
        (:data:`nous_sched.events.RUN_RECORDS` with a live kind): :func:`live_data`."""
        self.emit(record.kind, None, live_data(record))

    # -- consumers ------------------------------------------------------------

    def consume(self, buffer: int = DEFAULT_BUFFER) -> Iterator[RunEvent]:
        """Every event from the first, live, ending after ``end``; see the module docstring."""
        for batch in self.consume_batches(buffer):
            yield from batch

    def consume_batches(self, buffer: int = DEFAULT_BUFFER) -> Iterator[list[RunEvent]]:
        """:meth:`consume`'s events, as lists: each one every event emitted since the
        last (a ``gap`` first when some were skipped), never empty, at most ``buffer``
        events plus the ``gap``. A writer that sends each list in one write wakes once
        per list, not once per event, so a busy run costs each watcher far less."""
        v.require("events", "buffer", buffer, _BUFFER)
        cursor = 0
        while True:
            batch, cursor, missed, at, done = self._next(cursor, buffer)
            if missed:
                batch = [RunEvent(GapEvent.kind, None, at, live_data(GapEvent(missed))), *batch]
            if batch:
                yield batch
            if done:
                return

    async def aconsume_batches(self, buffer: int = DEFAULT_BUFFER) -> AsyncIterator[list[RunEvent]]:
        """:meth:`consume_batches` for a coroutine: the same lists, and while none is
        ready it awaits a future the next event sets, on its own loop: it never
        blocks the loop and holds no thread. A consumer that stops iterating (its
        task cancelled, the iterator closed) stops waiting at once."""
        import asyncio  # here: a synchronous host never pays for asyncio's import or its teardown at exit

        v.require("events", "buffer", buffer, _BUFFER)
        loop = asyncio.get_running_loop()
        cursor = 0
        while True:
            future: Optional[asyncio.Future[None]] = None
            with self._cond:
                if cursor == self._first + len(self._events) and not self._ended:
                    future = loop.create_future()
                    self._waiters.append((loop, future))
            if future is not None:
                try:
                    await future
                finally:
                    if not future.done():  # cancelled: no emit will drop it
                        self._forget(future)
                continue
            batch, cursor, missed, at, done = self._next(cursor, buffer)
            if missed:
                batch = [RunEvent(GapEvent.kind, None, at, live_data(GapEvent(missed))), *batch]
            if batch:
                yield batch
            if done:
                return

    def _forget(self, future: asyncio.Future[None]) -> None:
        with self._cond:
            self._waiters = [waiter for waiter in self._waiters if waiter[1] is not future]

    def _next(self, cursor: int, buffer: int) -> tuple[list[RunEvent], int, int, float, bool]:
        with self._cond:
            while cursor == self._first + len(self._events) and not self._ended:
                self._cond.wait()
            head = self._first + len(self._events)
            floor = max(self._first, head - buffer)
            missed = max(floor - cursor, 0)
            cursor = max(cursor, floor)
            batch = self._events[cursor - self._first :]
            at = time.perf_counter() - self._t0
            return batch, head, missed, at, self._ended


def _wake(waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]) -> None:
    # One call into each loop, whatever its number of waiters: a server's viewers share its loop,
    # and each call wakes it (a write to its self-pipe) from the run's thread.
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for loop, future in waiters:
        by_loop.setdefault(loop, []).append(future)
    for loop, futures in by_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve, futures)
        except RuntimeError:  # its loop has closed: nobody is waiting any more
            pass


def _resolve(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)


def call_data(
    event: ToolCallEvent, record: CallRecord, args: Any, tool: Any, gated: Collection[str] = ()
) -> dict[str, Any]:
    """The ``data`` of a ``call`` event: the live projection of a started call's
    ``tool_call`` record and :class:`CallRecord`, with what only the tool knows
    (its throttles, whether it needs approval under ``gated``) and its own
    ``args`` (the same value as ``event.arguments``, read without freezing a copy)."""
    throttles = getattr(tool, "throttles", ())
    return {
        "tool": event.tool,
        "call_id": event.id,
        "mode": event.mode,
        "why": record.reason,
        "throttles": [t.name for t in throttles] if throttles else [],
        "approval": needs_approval(tool, gated),
        "arguments": approval_text.arguments(args) if args else [],
    }


def commit_data(event: ToolOutcomeEvent, record: CallRecord, outcome: Outcome) -> dict[str, Any]:
    """The ``data`` of a ``commit`` event: the live projection of a committed call's
    ``tool_outcome`` record (its tool, ``ok``, error kind and message) and
    :class:`CallRecord` (its times), with the value the program got (``outcome``)."""
    began, finished = record.began, record.finished
    data: dict[str, Any] = {
        "tool": event.tool,
        "ok": event.ok,
        "chars": 0,
        "duration": None if began is None or finished is None else finished - began,
        "waited": None if began is None else began - record.started,
        "throttled": record.throttled,
        "value": None,
        "error": None,
    }
    if event.blobs:
        data["blobs"] = [{"id": id, "bytes": size} for id, size in event.blobs]
    if event.ok:
        value = outcome.value
        text = "null" if value is None else _compact(value)
        data["chars"] = len(text)
        # The program's text is ASCII JSON; a person reads the characters it escaped.
        data["value"] = approval_text.clipped(_readable(value) if "\\u" in text else text)
    else:
        data["chars"] = received_chars(outcome)
        error = event.error or {"kind": "tool_error", "message": ""}
        data["error"] = {"kind": error["kind"], "message": approval_text.clipped(error["message"])["text"]}
    return data


def refused_data(event: ToolRefusedEvent, reason: str) -> dict[str, Any]:
    """The ``data`` of a ``refused`` event: the live projection of the gate's
    ``tool_refused`` record, with why (``reason``, one of :data:`nous_sched.gate.REFUSAL_REASONS`)."""
    return {"tool": event.tool, "reason": reason, "message": approval_text.clipped(event.message)["text"]}


def end_record(result: Optional[RunResult], problem: Optional[BaseException] = None) -> EndEvent:
    """The run's :class:`~nous_sched.events.EndEvent`: from its result, or from what it raised."""
    if result is None:
        abort = {"kind": "abort", "message": repr(problem)}
        return EndEvent(False, abort, 0, None, {"error": abort})
    error = None if result.error is None else result.error.as_dict()
    return EndEvent(result.ok, error, len(result.logs), result.usage.as_dict(), result.for_model())


def _suspended_data(record: SuspendedEvent) -> dict[str, Any]:
    # The question each pending call asks: what a page shows the person deciding.
    pending = [
        {"seq": p.seq, "tool": p.tool, "arguments": p.arguments, "question": p.question()} for p in record.pending
    ]
    return {"token": record.token, "expires_at": record.expires_at, "pending": pending}


def _end_data(record: EndEvent) -> dict[str, Any]:
    return {
        "ok": record.ok,
        "error": record.error,
        "logs": record.logs,
        "usage": record.usage,
        "answer": record.answer,
    }


#: The live projection of the run's records: each record type with a live kind
#: (:data:`nous_sched.events.VOCABULARY`) to the ``data`` of its :class:`RunEvent`.
LIVE_DATA: dict[type, Callable[[Any], dict[str, Any]]] = {
    LogLineEvent: lambda record: {"line": record.line},
    SuspendedEvent: _suspended_data,
    EndEvent: _end_data,
    GapEvent: lambda record: {"missed": record.missed},
    StateEvent: lambda record: {
        "op": record.op,
        "key": record.key,
        "size": record.size,
        "version": record.version,
        "ok": record.ok,
        "error": record.error,
    },
    ReviewEvent: lambda record: {
        "verdict": record.verdict,
        "reason": approval_text.clipped(record.reason)["text"],
        "asked": record.asked,
        "summary": record.summary,
    },
}


#: Every record type with a live kind (:data:`nous_sched.events.VOCABULARY`) to the
#: function that makes its event's ``data`` from it; ``None``: its event is not made
#: from the record (``approval``: asked before there is a decision to record, by the
#: approval step, :func:`nous_sched.gate.dispatch.live_event`).
PROJECTION: dict[type, Optional[Callable[..., dict[str, Any]]]] = {
    ToolCallEvent: call_data,
    ToolOutcomeEvent: commit_data,
    ToolRefusedEvent: refused_data,
    ApprovalEvent: None,
    **LIVE_DATA,
}


def live_data(record: Any) -> dict[str, Any]:
    """The ``data`` of the live event a run's record is (see the module docstring, by kind)."""
    return LIVE_DATA[type(record)](record)


# Made once: json.dumps with separators builds a new encoder per call.
_compact = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


_readable = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False).encode


def received_chars(outcome: Outcome) -> int:
    """The size of ``outcome`` as the program receives it: its compact ASCII JSON
    text (what :func:`~nous_sched.runtime.engine.drive` hands the program)."""
    if outcome.ok:
        value = outcome.value
        return 4 if value is None else len(_compact(value))
    return len(_compact(outcome.error.as_dict() if outcome.error is not None else None))


class Run:
    """A run started by :func:`start_run`: watch it, wait for it, or cancel it."""

    def __init__(
        self, stream: EventStream, cancel_event: threading.Event, *, call_id: str = "", description: str = ""
    ) -> None:
        #: The run's id: its audit events' prefix (``"<call_id>:code:<seq>"``).
        self.call_id = call_id
        #: The run's description, the sentence the model wrote (the page's title).
        self.description = description
        #: When it started, in seconds since the epoch (``RunEvent.at`` counts from here).
        self.started_at = stream.started_at
        self._stream = stream
        self._cancel = cancel_event
        self._done = threading.Event()
        self._result: Optional[RunResult] = None
        self._problem: Optional[BaseException] = None
        self.thread: Optional[threading.Thread] = None

    def events(self, buffer: int = DEFAULT_BUFFER) -> Iterator[RunEvent]:
        """The run's events from its first, live, until ``end`` (see ``nous_sched.live``).

        Each call is a new consumer with its own ``buffer``.
        :raises ConfigError: ``buffer`` is not a positive integer.
        """
        v.require("events", "buffer", buffer, _BUFFER)
        return self._stream.consume(buffer)

    def event_batches(self, buffer: int = DEFAULT_BUFFER) -> Iterator[list[RunEvent]]:
        """:meth:`events`, as lists of the events ready at once (``EventStream.consume_batches``):
        what a server writing to a socket should iterate, one write per list.

        :raises ConfigError: ``buffer`` is not a positive integer.
        """
        v.require("events", "buffer", buffer, _BUFFER)
        return self._stream.consume_batches(buffer)

    def aevents(self, buffer: int = DEFAULT_BUFFER) -> AsyncIterator[RunEvent]:
        """:meth:`events` as an async iterator, for a coroutine: waiting for the next
        event blocks neither the event loop nor a thread (``EventStream.aconsume_batches``).

        :raises ConfigError: ``buffer`` is not a positive integer.
        """
        v.require("events", "buffer", buffer, _BUFFER)
        return _flatten(self._stream.aconsume_batches(buffer))

    def aevent_batches(self, buffer: int = DEFAULT_BUFFER) -> AsyncIterator[list[RunEvent]]:
        """:meth:`event_batches` as an async iterator (see :meth:`aevents`).

        :raises ConfigError: ``buffer`` is not a positive integer.
        """
        v.require("events", "buffer", buffer, _BUFFER)
        return self._stream.aconsume_batches(buffer)

    def result(self, timeout: Optional[float] = None) -> RunResult:
        """The run's :class:`~nous_sched.RunResult`, once it has ended.

        Raises whatever the run raised (what :func:`~nous_sched.run_code` would have).

        :raises TimeoutError: ``timeout`` seconds passed first.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"the run did not end within {timeout}s")
        if self._problem is not None:
            raise self._problem
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        """End the run early: it ends with a ``cancelled`` error (as ``run_code(cancel=...)``)."""
        self._cancel.set()

    def done(self) -> bool:
        """True once the run has ended (its ``end`` event sent)."""
        return self._done.is_set()

    def _serve(self, prepared: Any) -> None:
        try:
            self._result = execute(prepared, self._stream)
        except BaseException as exc:  # handed to result()
            self._problem = exc
        finally:
            self._stream.end(self._result, self._problem)
            self._done.set()

    def _serve_durable(self, call: Callable[[], RunResult]) -> None:
        """A run with an approval store: ``call()`` (``run_code``, or ``resume``) itself,
        this run's stream in :data:`~nous_sched._run.runner.live_stream`; a ``suspended``
        event before ``end`` when it suspends (its token and what waits: see
        :class:`~nous_sched.Suspension`)."""
        try:
            live_stream.set(self._stream)
            self._result = call()
            suspension = self._result.suspended
            if suspension is not None:
                record = SuspendedEvent(suspension.token, tuple(suspension.pending), suspension.expires_at)
                self._stream.emit_record(record)
        except BaseException as exc:  # handed to result()
            self._problem = exc
        finally:
            self._stream.end(self._result, self._problem)
            self._done.set()


async def _flatten(batches: AsyncIterator[list[RunEvent]]) -> AsyncIterator[RunEvent]:
    async for batch in batches:
        for event in batch:
            yield event


def message(event: RunEvent) -> str:
    """One event as one server-sent event: ``data: <RunEvent.to_json()>\\n\\n``."""
    return f"data: {event.to_json()}\n\n"


def sse(run: Run, *, buffer: int = SSE_BUFFER) -> Iterator[str]:
    """``run``'s events as server-sent-event text (:data:`MEDIA_TYPE`), one string per
    batch of ready events (:meth:`Run.event_batches`), ``end`` last: a server writes
    each string in one write. A viewer more than ``buffer`` events behind skips to
    the newest, told by a ``gap`` event.

    :raises ConfigError: ``buffer`` is not a positive integer.
    """
    for batch in run.event_batches(buffer):
        yield "".join(map(message, batch))


def asse(run: Run, *, buffer: int = SSE_BUFFER) -> AsyncIterator[str]:
    """:func:`sse` as an async iterator, for an asyncio server's streaming response
    (Starlette's and FastAPI's ``StreamingResponse``, Django's ``StreamingHttpResponse``
    under ASGI): a viewer waiting for events, or stalled in its socket write, holds no
    thread; it costs at most ``buffer`` events and one batch in its write.

    :raises ConfigError: ``buffer`` is not a positive integer.
    """
    return _texts(run.aevent_batches(buffer))


async def _texts(batches: AsyncIterator[list[RunEvent]]) -> AsyncIterator[str]:
    async for batch in batches:
        yield "".join(map(message, batch))


def _thread(run: Run, serve: Callable[[], Any]) -> Run:
    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(serve,), name=f"nous-sched-run-{next(_numbers)}", daemon=True)
    run.thread = thread
    thread.start()
    return run


def resume_run(
    token: str, decisions: Any, tools: Iterable[Tool] = (), *, approval_store: Any = None, **options: Any
) -> Run:
    """:func:`~nous_sched.resume` started now, watched as :func:`start_run`'s runs are:
    the resumed run's :class:`Run` at once (its ``result()`` is what ``resume`` returns,
    and raises what it raises). ``options`` are ``resume``'s, ``approval_store`` among them;
    the others are checked here (a :class:`~nous_sched.ConfigError` naming ``resume_run``)."""
    given = _named(build("resume_run", keywords("resume_run", options)))
    own = threading.Event()
    if given.cancel is None:
        given = attrs.evolve(given, cancel=own)
    run = Run(EventStream(), own, call_id=str(given.call_id), description=given.description or "a resumed run")
    resumed = partial(resume, token, decisions, list(tools), approval_store=approval_store, options=given)
    return _thread(run, partial(run._serve_durable, resumed))  # noqa: SLF001


def start_run(code: Any, tools: Iterable[Tool] = (), **options: Any) -> Run:
    """Start ``code`` with ``tools`` now and return its :class:`Run` at once.

    ``options`` are :func:`~nous_sched.run_code`'s (``options=`` a
    :class:`~nous_sched.RunOptions` among them), checked here, on the
    calling thread: what ``run_code`` would raise for them (``RunCodeError``,
    ``ConfigError``, an unknown keyword named as one) this raises. The
    run then goes on in a thread ``nous-sched-run-<n>`` with a copy of this
    thread's ``contextvars``; ``start_run(...).result()`` is what
    ``run_code(...)`` returns.
    """
    given = _named(build("run_code", keywords("start_run", options)))
    own = threading.Event()
    prepared = prepare(code, tools, given)  # every check, on this thread
    prepared.cancel = AnyCancel(prepared.cancel, own)
    run = Run(EventStream(), own, call_id=str(given.call_id), description=str(given.description))
    if given.approval_store is None:
        serve: Callable[[], Any] = partial(run._serve, prepared)  # noqa: SLF001
    else:  # a durable run goes through run_code (it may replay): the stream reaches it by context
        durable = attrs.evolve(given, cancel=prepared.cancel)
        serve = partial(run._serve_durable, partial(run_with, code, tools, durable))  # noqa: SLF001
    return _thread(run, serve)


def _named(options: RunOptions) -> RunOptions:
    """``options`` with a call id: named here, so the :class:`Run` knows its id (run_code's default form)."""
    if options.call_id is not None:
        return options
    return attrs.evolve(options, call_id="run_code-" + secrets.token_urlsafe(6))

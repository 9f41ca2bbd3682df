"""A served run, live: its commits as MCP progress, its console lines as MCP log messages.

:class:`Forwarder` reads one run's live event stream
(:class:`nous_sched.live.EventStream`, the same events
:func:`nous_sched.start_run` consumers see, in the same order) on a thread of
its own (``nous-sched-mcp-live-<n>``) and hands each event to the request's
event loop through ``loop.call_soon_threadsafe`` (which keeps their order);
a task on that loop sends the notifications. The run's threads never wait
for the client: emitting an event only appends it to the stream.

What a client may rely on:

* **progress** (only when the request carried ``_meta.progressToken``): one
  ``notifications/progress`` per committed call, in commit (``seq``) order,
  ``progress`` = calls committed so far, message ``"#<seq> <tool>(<arguments>)
  committed in <n> ms"`` (or ``"... failed after <n> ms (<error kind>):
  <message the program saw>"``); and one, message ``"#<seq> waiting for
  approval of <tool>(<arguments>)"``, each time the run waits for an
  approval. The arguments are the live ``call`` event's
  (:mod:`nous_sched.live`: each value clipped on its own, inert), the whole
  message at most :data:`MESSAGE_CHARS` characters;
* **refusals**: each call the gate refused, as a ``warning`` log message
  ``"refused <tool> (<reason>): <message>"`` (filtered by level like the lines);
* **log messages**: each line the program logs, as ``notifications/message``
  with ``logger`` ``"run_code"``, level ``info`` for ``console.log``/``info``/
  ``debug``, ``warning`` for ``console.warn``, ``error`` for
  ``console.error``; a line below the session's level (``logging/setLevel``,
  :class:`SessionLevels`) is not sent. The lines are those the run's logs
  keep, so they are bounded like the logs (``Limits.max_log_lines`` and
  ``max_log_bytes``): a line the logs drop is not sent either. The final
  result still carries every kept line in ``logs`` (and the note that says
  where they were truncated, which is not sent as a log message);
* on a 2026-07-28 connection whose run asks through ``InputRequiredResult``,
  each request of the call sends what happened since the last one's
  notifications: no line or commit twice, none lost;
* **before the result**: every notification is sent before the ``run_code``
  result: the handler awaits :meth:`Forwarder.drain` before it returns.
"""

from __future__ import annotations

import itertools
import logging
import threading
import warnings
import weakref
from typing import Any, Awaitable, Callable, Optional

import anyio
from mcp.shared.exceptions import MCPDeprecationWarning

from ..live import EventStream, RunEvent

__all__ = ["Forwarder", "SessionLevels", "LEVELS", "line_level", "MESSAGE_CHARS"]

#: The most characters of one progress message (the arguments are cut to fit).
MESSAGE_CHARS = 1000

# The logging capability is deprecated as of MCP 2026-07-28; serve-mcp still
# offers it to the handshake-era clients that use it (issue 25). Only the
# warnings serve.py's own calls raise are silenced, not the user's.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning, module=r"nous_sched\.mcp\.serve")

#: The MCP log levels (RFC 5424's severities), least severe first.
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
_RANK = {level: n for n, level in enumerate(LEVELS)}
_PREFIXES = (("[warn] ", "warning"), ("[error] ", "error"))  # the prelude's console.warn / console.error
_numbers = itertools.count(1)
log = logging.getLogger("nous_sched")


def line_level(line: str) -> tuple[str, str]:
    """A kept log line's MCP level and its text without the console prefix."""
    for prefix, level in _PREFIXES:
        if line.startswith(prefix):
            return level, line[len(prefix) :]
    return "info", line


class SessionLevels:
    """Each client session's ``logging/setLevel`` level (default ``debug``: send everything).

    Keyed weakly by the session's connection object, so a closed session's
    entry goes with it; a key that cannot be weakly referenced (a stateless
    request's) keeps the default: such a request states its level in its own
    ``_meta`` (the SDK filters it).
    """

    def __init__(self) -> None:
        self._levels: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()

    def set(self, session: Any, level: str) -> None:
        try:
            self._levels[session] = level
        except TypeError:
            pass

    def get(self, session: Any) -> str:
        try:
            return self._levels.get(session, "debug")
        except TypeError:
            return "debug"


class Forwarder:
    """Forwards one run's live events to one request's client; see the module docstring.

    ``send_progress(progress, message)`` and ``send_log(level, text)`` are
    coroutines on the request's loop; ``progress`` is false when the request
    carried no progress token, ``level`` is the lowest level sent.
    """

    def __init__(
        self,
        stream: EventStream,
        *,
        progress: bool,
        level: str,
        send_progress: Callable[[float, str], Awaitable[None]],
        send_log: Callable[[str, str], Awaitable[None]],
        position: tuple[int, int] = (0, 0),
    ) -> None:
        self._stream = stream
        self._progress = progress
        self._floor = _RANK.get(level, 0)
        self._send_progress = send_progress
        self._send_log = send_log
        # A retry's Forwarder (a 2026-07-28 run that asked through InputRequiredResult)
        # skips the events the earlier request's Forwarder handled: `position`.
        self._skip, self._committed = position
        self._handled = 0
        self._calls: dict[Any, str] = {}  # seq -> "tool(arguments)", from its call event to its commit
        self._send, self._receive = anyio.create_memory_object_stream[Optional[RunEvent]](float("inf"))
        self._done = anyio.Event()

    def start(self, tg: Any) -> None:
        """Start the loop-side task in ``tg`` and the reading thread (call on the loop)."""
        import asyncio

        loop = asyncio.get_running_loop()
        tg.start_soon(self._pump)
        thread = threading.Thread(
            target=self._read, args=(loop,), name=f"nous-sched-mcp-live-{next(_numbers)}", daemon=True
        )
        thread.start()

    def _read(self, loop: Any) -> None:
        """The reading thread: every event to the loop, in stream order, then ``None``."""
        try:
            for event in self._stream.consume():
                loop.call_soon_threadsafe(self._offer, event)
        except RuntimeError:  # the loop closed: nobody is left to tell
            return
        try:
            loop.call_soon_threadsafe(self._send.close)
        except RuntimeError:
            pass

    def _offer(self, event: RunEvent) -> None:
        try:
            self._send.send_nowait(event)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the request is over (cancelled, or an InputRequiredResult went out)

    @property
    def position(self) -> tuple[int, int]:
        """(events handled, calls committed): where a later Forwarder of the same run starts."""
        return self._handled, self._committed

    async def drain(self) -> None:
        """Wait until every notification of the run has been sent (its stream ended)."""
        await self._done.wait()

    async def _pump(self) -> None:
        try:
            async with self._receive:
                async for event in self._receive:
                    # Shielded: a cancel (an InputRequiredResult went out) lands between
                    # events, never between a send and its count, or the retry's
                    # Forwarder would send that event again.
                    with anyio.CancelScope(shield=True):
                        if event is not None and self._handled >= self._skip:
                            try:
                                await self._forward(event)
                            except Exception as exc:  # a notification lost must not cost the client its result
                                log.debug("a live notification could not be sent: %s", exc)
                        self._handled += 1
        finally:
            self._done.set()

    async def _forward(self, event: RunEvent) -> None:
        notify = PROJECTION[event.kind]
        if notify is not None:
            await notify(self, event, event.data)

    # -- the MCP projection: one method per live kind it carries (PROJECTION) -----------

    async def _call(self, event: RunEvent, data: dict[str, Any]) -> None:
        self._calls[event.seq] = _call_text(data)

    async def _commit(self, event: RunEvent, data: dict[str, Any]) -> None:
        self._committed += 1
        call = self._calls.pop(event.seq, None) or str(data.get("tool"))
        if self._progress:
            await self._send_progress(self._committed, _clip(f"#{event.seq} {call} {_commit_text(data)}"))

    async def _log(self, event: RunEvent, data: dict[str, Any]) -> None:
        level, text = line_level(str(data.get("line", "")))
        if _RANK[level] >= self._floor:
            await self._send_log(level, text)

    async def _refused(self, event: RunEvent, data: dict[str, Any]) -> None:
        if _RANK["warning"] >= self._floor:
            await self._send_log("warning", f"refused {data.get('tool')} ({data.get('reason')}): {data.get('message')}")

    async def _approval(self, event: RunEvent, data: dict[str, Any]) -> None:
        if self._progress and data.get("state") == "asked":
            call = self._calls.get(event.seq) or str(data.get("tool"))
            await self._send_progress(self._committed, _clip(f"#{event.seq} waiting for approval of {call}"))

    async def _suspended(self, event: RunEvent, data: dict[str, Any]) -> None:
        if self._progress:
            tool = ", ".join(str(p.get("tool")) for p in data.get("pending", []) or [])
            await self._send_progress(self._committed, f"waiting for approval of {tool}")


#: The MCP projection of the live vocabulary (:data:`nous_sched.events.VOCABULARY`):
#: every live kind, with what sends its notification, or ``None`` for a kind no
#: notification carries (the result carries the end; a gap has nothing to send).
PROJECTION: dict[str, Optional[Callable[[Forwarder, RunEvent, dict[str, Any]], Awaitable[None]]]] = {
    "call": Forwarder._call,  # noqa: SLF001
    "commit": Forwarder._commit,  # noqa: SLF001
    "refused": Forwarder._refused,  # noqa: SLF001
    "log": Forwarder._log,  # noqa: SLF001
    "approval": Forwarder._approval,  # noqa: SLF001
    "suspended": Forwarder._suspended,  # noqa: SLF001
    "end": None,
    "gap": None,
    "state": None,  # the audit keeps it; no notification says it
}


def _clip(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"


def _call_text(data: dict[str, Any]) -> str:
    """``tool(key: value, ...)`` from a live ``call`` event (values already clipped and inert)."""
    rows = data.get("arguments") or []
    shown = ", ".join(f"{row.get('key')}: {row.get('value')}" for row in rows)
    return f"{data.get('tool')}({_clip(shown)})"


def _commit_text(data: dict[str, Any]) -> str:
    duration = data.get("duration")
    took = "" if duration is None else f" {duration * 1000:.0f} ms"
    if data.get("ok", True):
        return f"committed in{took}" if took else "committed"
    error = data.get("error") or {}
    after = f" after{took}" if took else ""
    return f"failed{after} ({error.get('kind')}): {error.get('message')}"

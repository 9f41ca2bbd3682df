"""The asyncio door: :func:`arun_code` and :func:`acall_tool`, for callers on an event loop.

A thin layer over the synchronous core, which stays the public API's first
form: each call runs :func:`~nous_sched.run_code` or
:func:`~nous_sched.call_tool` on a thread of its own (``nous-sched-async-call-<n>``),
so the event loop is never blocked, and the thread sees the caller's
``contextvars``.

Cancelling the awaiting task cancels the run: it sets the run's ``cancel``
event (:func:`~nous_sched.run_code`'s, yours when you passed one), then waits
for the run to stop, at most :data:`CANCEL_WAIT` seconds, before the task
ends with ``CancelledError``. So when the ``await`` on a cancelled task
returns, the program is no longer running (the worker runtime stops it within
about 50 ms, the in-process one at its next step). Under :func:`acall_tool`,
every run the tool starts on that thread (a ``run_code_tool``'s) is cancelled
the same way, through :data:`~nous_sched._run.runner.ambient_cancel`.
"""

from __future__ import annotations

import contextvars
import itertools
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, TypeVar

import attrs

from .._run.entry import run as run_with
from .._run.options import build, keywords
from .._run.runner import ambient_cancel
from ..events import SessionLog
from ..result import RunResult
from ..runtime import AnyCancel
from ..tooling import Tool
from .adapters import call_tool

if TYPE_CHECKING:
    import asyncio

__all__ = ["arun_code", "acall_tool", "CANCEL_WAIT"]

#: At most how long (seconds) a cancelled task waits for its run to stop.
CANCEL_WAIT = 10.0

T = TypeVar("T")
_numbers = itertools.count(1)


async def arun_code(code: Any, tools: Iterable[Tool] = (), **options: Any) -> RunResult:
    """``await`` :func:`~nous_sched.run_code` (same arguments, same result) from an event loop.

    Cancelling the task sets ``cancel`` (a fresh event unless you passed
    one) and waits for the run to stop, then raises ``CancelledError``.

    :raises RunCodeError: nothing ran (as :func:`~nous_sched.run_code`).
    :raises ConfigError: a bad option, named in the message.
    """
    given = build("run_code", keywords("arun_code", options))
    # The caller's event (the task's cancellation sets it as it would set ours), else a fresh
    # one: beside a caller's cancel that is no Event (only is_set()), which nothing here sets.
    caller = given.cancel
    cancel = caller if isinstance(caller, threading.Event) else threading.Event()
    if cancel is not caller:
        given = attrs.evolve(given, cancel=AnyCancel(caller, cancel))
    tools = list(tools) if not isinstance(tools, (list, tuple)) else tools
    return await _on_thread(lambda: run_with(code, tools, given), cancel)


async def acall_tool(tool: Tool, arguments: Any, session_log: Optional[SessionLog] = None, **options: Any) -> str:
    """``await`` :func:`~nous_sched.call_tool` (same arguments, same JSON text) from an event loop.

    A model's mistake is answered, as :func:`~nous_sched.call_tool` answers it.
    Cancelling the task cancels every run the tool started on the call's
    thread (``run_code_tool``'s run) and waits for it to stop.
    """
    cancel = threading.Event()
    return await _on_thread(lambda: call_tool(tool, arguments, session_log, **options), cancel)


async def _on_thread(fn: Callable[[], T], cancel: threading.Event) -> T:
    import asyncio  # here: a synchronous host never pays for asyncio's import or its teardown at exit

    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()
    context.run(ambient_cancel.set, cancel)

    def settle(value: Any, error: Optional[BaseException]) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def target() -> None:
        try:
            value, error = context.run(fn), None
        except BaseException as exc:  # handed to the awaiting task
            value, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting

    thread = threading.Thread(target=target, name=f"nous-sched-async-call-{next(_numbers)}", daemon=True)
    thread.start()
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        cancel.set()
        await _stopped(future)
        raise


async def _stopped(future: asyncio.Future[Any]) -> None:
    """Wait, at most :data:`CANCEL_WAIT`, for a cancelled call's thread to finish."""
    import asyncio

    try:
        await asyncio.wait_for(asyncio.shield(future), CANCEL_WAIT)
    except BaseException:  # its own error, a timeout, or a second cancel: the task ends cancelled
        pass

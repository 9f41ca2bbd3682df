"""The code-runtime seam: what runs a program, and what it may ask of the host.

A :class:`CodeRuntime` runs one program on the calling thread and returns a
:class:`RuntimeOutcome`. All it can do to the outside world is through the
:class:`Host` it is handed: start a tool call by name with JSON arguments and
wait for that call's outcome. The host decides everything else (permissions,
approval, scheduling, audit).

Two runtimes ship, both stepping the same engine (:mod:`.engine`):
:class:`~nous_sched.runtime.pool.WorkerPool`, the default, runs each program in
a warm worker process that the host kills at the deadline;
:class:`~nous_sched.runtime.quickjs.QuickJSRuntime` runs it in this process.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence, runtime_checkable

import attrs

from ..limits import Limits
from ..outcome import Outcome
from ..result import RunError

__all__ = ["CodeRuntime", "Host", "PendingCall", "RuntimeOutcome", "Limits", "Cancel"]


class Cancel(Protocol):
    """The ``cancel=`` object of a run: set from any thread to end the run early.

    A :class:`threading.Event` is one; all the library asks of it is
    ``is_set()``, polled (it never waits on it, and never sets or clears it).
    """

    def is_set(self) -> bool: ...


class AnyCancel:
    """A :class:`Cancel` set when either of two is: ``first`` (``None`` for
    none) or ``second``. Each run that adds a reason of its own to stop (a
    handle's ``cancel()``, a durable run's gate, a second Ctrl-C) wraps the
    caller's ``cancel`` in one, and never sets the caller's."""

    __slots__ = ("first", "second")

    def __init__(self, first: Optional[Cancel], second: Cancel) -> None:
        self.first = first
        self.second = second

    def is_set(self) -> bool:
        return self.second.is_set() or (self.first is not None and self.first.is_set())


class PendingCall(Protocol):
    def wait(self, timeout: float) -> Optional[Outcome]:
        """The call's outcome, or ``None`` if ``timeout`` seconds pass first."""


class Host(Protocol):
    #: Every tool name the program may call, sorted; each appears as ``tools[name]``.
    names: Sequence[str]
    #: Set (from any thread) when the caller cancels the run, or ``None``. A
    #: runtime that honours it ends the run promptly with a ``cancelled`` error.
    cancel: Optional[Cancel]

    def call(self, name: str, args: Any) -> PendingCall:
        """Start one call with the program's (JSON-decoded) ``args``.

        Never raises: refusals come back as failed outcomes.

        Outcomes of calls started in order ``a, b`` become available in that
        order (the host commits in submission order).
        """

    def call_json(self, name: str, text: str) -> PendingCall:
        """:meth:`call` with the arguments as the program's JSON text, which the
        host parses under its own rules (:func:`nous_sched.crossing.loads`).

        Never raises: text that cannot cross fails that one call.
        """


@attrs.frozen
class RuntimeOutcome:
    """What a runtime reports: logs plus either a JSON ``result`` or an ``error``."""

    logs: tuple[str, ...]
    result: Any = None
    error: Optional[RunError] = None


@runtime_checkable
class CodeRuntime(Protocol):
    """Runs programs. Implementations must be safe to call from many threads at once."""

    language: str

    def run(self, program: str, host: Host, limits: Limits) -> RuntimeOutcome:
        """Run ``program`` to the end on the calling thread. Never raises for a
        program's own failure: that is a :class:`RuntimeOutcome` error."""

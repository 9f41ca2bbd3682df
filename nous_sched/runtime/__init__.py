"""The code-runtime seam: what runs a program, and what it may ask of the host.

A :class:`CodeRuntime` runs one program on the calling thread and returns a
:class:`RuntimeOutcome`. All it can do to the outside world is through the
``Host`` it is handed: start a tool call by name with JSON arguments and
wait for that call's outcome. The host decides everything else (permissions,
approval, scheduling, audit); a call it answers at once (a refusal, a replayed
answer, an ``sdk`` question's answer) it may return as a :class:`Settled`.

Two runtimes ship, both stepping the same engine (:mod:`.engine`):
:class:`~nous_sched.runtime.pool.WorkerPool`, the default, runs each program in
a warm worker process that the host kills at the deadline;
:class:`~nous_sched.runtime.quickjs.QuickJSRuntime` runs it in this process.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Callable, ContextManager, Optional, Protocol, Sequence, runtime_checkable

import attrs

from ..limits import Limits
from ..outcome import Outcome
from ..result import RunError

__all__ = ["AnyCancel", "Begun", "Cancel", "CodeRuntime", "Host", "Limits", "PendingCall", "RuntimeOutcome", "Settled"]


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
    """One call a runtime started through its ``Host``: its outcome, when it comes.

    Only :meth:`wait` is required. :meth:`done` and :meth:`on_done` have
    declared defaults (not done; cannot tell) that a pending call which knows
    more overrides by subclassing this class.
    """

    def wait(self, timeout: float) -> Optional[Outcome]:
        """The call's outcome, or ``None`` if ``timeout`` seconds pass first."""

    def done(self) -> bool:
        """True once :meth:`wait` would return at once. If it is, ``done()``
        and ``wait(0.0)`` may be called from any thread and do nothing else, so
        a runtime may settle this call's answer with the calls before it in one
        batch. The default, ``False``, makes the runtime wait for each call."""
        return False

    def on_done(self, then: Optional[Callable[[], None]]) -> bool:
        """Ask to be told when the call settles: ``then()`` is called once, by
        the thread that settles it, just after :meth:`done` turns true; it must
        neither block nor raise (the worker runtime sends the program's answer
        from there). ``None`` takes the request back. Returns whether this
        pending call can tell (the default: ``False``, and ``then`` is never
        called; the runtime waits on :meth:`wait` instead). A call that settled
        before the request is not told: check :meth:`done` after asking."""
        return False


class Host(Protocol):
    """What a runtime may ask of the outside world, handed to :meth:`CodeRuntime.run`.

    :meth:`call_json` is required; every other method has a declared default
    (a host that subclasses this class inherits them), so a runtime calls
    each capability directly, never probing for it.
    """

    #: Every tool name the program may call, sorted; each appears as ``tools[name]``.
    names: Sequence[str]
    #: Set (from any thread) when the caller cancels the run, or ``None``. A
    #: runtime that honours it ends the run promptly with a ``cancelled`` error.
    cancel: Optional[Cancel]

    @property
    def deadline(self) -> Optional[float]:
        """The run's own deadline, a :func:`time.monotonic` instant, or ``None``
        (the default): the one the host's calls' waits give up at. A runtime
        hands the program no answer taken at or after the earlier of it and
        its own deadline (``run_code``'s host has one: a runtime counts its
        deadline from its own start, a little later)."""
        return None

    def call_json(self, name: str, text: str) -> PendingCall:
        """Start one call with the arguments as the program's JSON text, which
        the host parses under its own rules (:func:`nous_sched.crossing.loads`).

        Never raises: refusals come back as failed outcomes, and text that
        cannot cross fails that one call.

        Outcomes of calls started in order ``a, b`` become available in that
        order (the host commits in submission order).
        """
        ...

    def call(self, name: str, args: Any) -> PendingCall:
        """:meth:`call_json` with the program's (JSON-decoded) ``args``. The
        default encodes them and calls :meth:`call_json`."""
        return self.call_json(name, json.dumps(args))

    def batch(self) -> ContextManager[object]:
        """``with host.batch():`` every call started inside reaches the host's
        scheduler as one message (a runtime starts one step's calls in one,
        e.g. a ``Promise.all`` of 1,000). The default does nothing."""
        return contextlib.nullcontext()

    def discover(self, question: str) -> PendingCall:
        """Answer a question the program asked through ``sdk`` (its JSON text):
        a pending call like a tool's, settled in the same order. The default
        answers every question with a failure: this host takes none."""
        return Settled(Outcome.failure("sdk", NO_QUESTIONS))

    def attach_reader(self, fd: int, readable: Callable[[], bool], gone: Callable[[], None]) -> bool:
        """Offer a run's worker pipe ``fd`` to the thread that commits the
        host's calls, to read while the run's own thread sleeps: True if
        that thread will call ``readable()`` whenever ``fd`` has data, until
        it answers False, or ``gone()`` once if it stops reading first (the
        worker runtime then steps the answers that only start tool calls
        there, ``nous_sched.runtime._handoffcore``; the host's hooks for those steps run
        on that thread, in the same order). The default: False, the run's
        own thread reads every answer."""
        return False

    def when_begun(self, then: Callable[[], None]) -> bool:
        """Ask to be told, once, when every call started so far has begun its
        tool (or will not): ``then()`` is called by the thread that brings that
        about, possibly at once by this one; it must neither block nor raise.
        Returns whether this host can tell (the default: ``False``, and
        ``then`` is never called). A runtime keeps its background work (the
        worker pool: a spare's replacement) off the run's start-up so."""
        return False

    def on_logs(self, lines: list[str]) -> None:
        """The log lines a step kept, as it ends, on the thread running the
        program, or the one reading for it (:meth:`attach_reader`) (budget
        markers included; not the notes added at the end). The default does
        nothing."""
        return None

    def on_settled(self, pending: PendingCall, outcome: Outcome, payload: str) -> None:
        """Each call's outcome and its JSON text ``payload``, in order, as the
        program receives it. The default does nothing."""
        return None

    def on_main(self, state: Any) -> None:
        """The program's end as the sandbox reported it (untrusted: for the
        run's hints), once. The default does nothing."""
        return None

    def clock(self, values: list[Any]) -> None:
        """A durable run's new clock values (``Date.now``, ``Math.random``), in
        order, so a replay can give the program the same. The default does nothing."""
        return None

    def sites(self, sites: list[str]) -> None:
        """A durable run's new call sites (where in the program each call was
        made), in order. The default does nothing."""
        return None


#: What the default :meth:`Host.discover` answers.
NO_QUESTIONS = "this host answers no questions about its tools"


class Settled(PendingCall):
    """A :class:`PendingCall` whose outcome is known at once: what a host may
    return for a call it answers without running anything (a refusal, a
    replayed answer, the answer to an ``sdk`` question).

    ``tool`` names the call's tool, or is ``None`` when it is no tool's (an
    ``sdk`` question); ``seq`` is always ``None``: it was never submitted to a
    scheduler. :meth:`done` is always true, so a runtime settles its answer
    with the calls before it in one batch.
    """

    __slots__ = ("outcome", "tool")
    seq: Optional[int] = None

    def __init__(self, outcome: Outcome, tool: Optional[str] = None) -> None:
        self.outcome = outcome
        self.tool = tool

    def done(self) -> bool:
        """Always true: the outcome is known."""
        return True

    def wait(self, timeout: float) -> Outcome:
        """The outcome, at once."""
        return self.outcome


@attrs.frozen
class RuntimeOutcome:
    """What a runtime reports: logs plus either a JSON ``result`` or an ``error``."""

    logs: tuple[str, ...]
    result: Any = None
    error: Optional[RunError] = None


@runtime_checkable
class CodeRuntime(Protocol):
    """Runs programs. Implementations must be safe to call from many threads at once.

    A new runtime's checklist is the contract suite, ``tests/runtime_contract.py``:
    run it against the runtime (``tests/test_runtime_contract.py`` runs it for
    both built-in ones) and it checks every promise of this seam (results,
    logs, errors as kinds, calls through the host in order, ``Promise.all``,
    cancel, deadline, memory limit, and each ``Host`` capability).
    """

    language: str

    def run(self, program: str, host: Host, limits: Limits) -> RuntimeOutcome:
        """Run ``program`` to the end on the calling thread. Never raises for a
        program's own failure: that is a :class:`RuntimeOutcome` error."""
        ...

    def begin(self, program: str, names: Sequence[str], limits: Limits, cancel: Optional[Cancel]) -> Optional[Begun]:
        """Start ``program`` before its host exists (``run_code`` builds the
        scheduler meanwhile): the returned ``Begun`` runs it to the end
        with the host, once. The default, ``None``, says this runtime cannot;
        ``run_code`` then calls :meth:`run`."""
        return None


class Begun(Protocol):
    """A program a :class:`CodeRuntime` started before its host existed."""

    def run(self, host: Host) -> RuntimeOutcome:
        """Run it to the end with ``host`` (:meth:`CodeRuntime.run`); once only."""
        ...

    def abandon(self) -> None:
        """It will not be run (something failed before): give back what it holds. Idempotent."""
        ...

"""The QuickJS runtime: runs one program in a fresh ``quickjs-ng`` context.

How a run proceeds, all on the calling thread (the binding aborts the process
if two threads touch one context at once, so exactly one ever does):

1. A fresh context gets the memory, stack and CPU-slice limits, then the
   prelude (``prelude.js``), whose value is the private ``bridge`` function.
2. The program becomes the body of an ``async function`` (so top-level
   ``await`` and ``return`` work) and is started.
3. Loop: run every pending JS job; drain the outbox (new tool calls and log
   lines) through ``bridge``; hand new calls to the :class:`Host`; if the
   program has settled, stop; otherwise block on the *oldest* outstanding call
   and settle exactly that one. One call per step, oldest first, is what makes
   the program observe a single deterministic order.

Nothing crosses the boundary but strings: the binding truncates ints to 32
bits and strings at NUL, so every value travels as JSON text. No Python
callable is ever exposed to JS (the binding refuses them while a time limit
is set, and a raising one corrupts the context).

Limits. The wall-clock deadline is exact while the host waits for tools and
between JS jobs. *Inside* one long JS step the only interrupt the binding has
is ``set_time_limit``, a slice of *process* CPU time, which the host re-arms
with the run's remaining time before each step. So a runaway loop is stopped
after that much CPU time: early if other threads of this process burn CPU
alongside it, late if other processes starve it of CPU (on a saturated core a
0.5 s deadline was seen to stretch to 2 s). A context whose limit tripped is
discarded, after one bounded attempt to collect the log lines it still held.
"""

from __future__ import annotations

import collections
import json
import re
import time
from importlib import resources
from typing import Any, Optional

import quickjs

from ..outcome import Outcome
from ..result import RunError
from . import Host, Limits, RuntimeOutcome

__all__ = ["QuickJSRuntime"]

_PRELUDE = resources.files(__package__).joinpath("prelude.js").read_text(encoding="utf-8")
_TRUNCATED = "[output truncated at {n} bytes]"
_PLACEHOLDER = re.compile("__NAMES__|__MAX_LOG_UNITS__|__MAX_OUTPUT_UNITS__|__MAX_ARGS_UNITS__")
# Made once: json.dumps(v, allow_nan=False) builds a new encoder on every call.
# Both are ASCII (ensure_ascii), as the bridge needs.
_encode_value = json.JSONEncoder(allow_nan=False).encode
_encode = json.JSONEncoder().encode


class QuickJSRuntime:
    """Runs JavaScript programs in ``quickjs-ng``. Stateless and thread-safe:
    every :meth:`run` builds its own context and runs on the calling thread."""

    language = "javascript"

    def run(self, program: str, host: Host, limits: Limits) -> RuntimeOutcome:
        return _Run(program, host, limits).execute()

    def __repr__(self) -> str:
        return "QuickJSRuntime()"


class _Killed(Exception):
    """The engine stopped the program; ``error`` says why."""

    def __init__(self, error: RunError) -> None:
        self.error = error


class _Run:
    def __init__(self, program: str, host: Host, limits: Limits) -> None:
        self.program = program
        self.host = host
        self.limits = limits
        self.deadline = time.monotonic() + limits.timeout
        self.logs = _LogBook(limits.max_log_bytes)
        self.ctx: Optional[quickjs.Context] = None
        self.bridge: Any = None

    # -- the run ----------------------------------------------------------

    def execute(self) -> RuntimeOutcome:
        try:
            return self._execute()
        except _Killed as killed:
            self._salvage_logs()
            return RuntimeOutcome(self.logs.lines(), error=killed.error)
        finally:
            # Drop the handles before the context: a context is freed only once
            # every Object referring into it is gone.
            self.bridge = None
            self.ctx = None

    def _execute(self) -> RuntimeOutcome:
        limits = self.limits
        ctx = self.ctx = quickjs.Context()
        ctx.set_memory_limit(limits.memory_bytes)
        ctx.set_max_stack_size(limits.stack_bytes)
        values = {
            "__NAMES__": json.dumps(list(self.host.names)),
            "__MAX_LOG_UNITS__": str(limits.max_log_bytes),
            "__MAX_OUTPUT_UNITS__": str(limits.max_output_bytes),
            "__MAX_ARGS_UNITS__": str(limits.max_args_bytes),
        }
        # One pass, so a tool *named* like a placeholder is not substituted again.
        prelude = _PLACEHOLDER.sub(lambda m: values[m.group(0)], _PRELUDE)
        self._arm()
        self.bridge = self._guard(ctx.eval, prelude)
        try:
            # No newline before the body, so the program's line numbers are its own.
            main = self._guard(ctx.eval, "(async function program() {" + self.program + "\n})")
        except _Syntax as exc:
            return RuntimeOutcome(self.logs.lines(), error=RunError("exception", exc.message))
        self._guard(self.bridge, "start", main)
        del main

        # A run ends when the program has settled *and* every call it started
        # has committed, so a call fired without `await` before `return` still
        # runs and is audited; its continuations may still log.
        outstanding: collections.OrderedDict[int, Any] = collections.OrderedDict()
        state = None
        armed = False  # after a settle, the limit it armed covers the pump that follows
        while True:
            self._pump(armed)
            envelope = self._drain()
            for call_id, name, args in envelope["calls"]:
                outstanding[call_id] = self.host.call(name, args)
            if state is None:
                state = envelope["main"]
            if not outstanding:
                if state is not None:
                    return self._finish(state)
                return RuntimeOutcome(
                    self.logs.lines(),
                    error=RunError(
                        "exception",
                        "the program is waiting for a promise that nothing will ever settle: "
                        "no tool call is outstanding and no work is queued",
                    ),
                )
            call_id, pending = outstanding.popitem(last=False)
            outcome = pending.wait(max(self.deadline - time.monotonic(), 0.0))
            if outcome is None:
                if state is not None:
                    self.logs.note(
                        f"[{len(outstanding) + 1} tool call(s) started without await were abandoned at the deadline]"
                    )
                    return self._finish(state)
                return RuntimeOutcome(self.logs.lines(), error=self._timeout_error("waiting for a tool call"))
            self._settle(call_id, outcome)
            armed = True

    def _finish(self, state: dict) -> RuntimeOutcome:
        logs = self.logs.lines()
        kind = state["state"]
        if kind == "fulfilled":
            value = state["value"]
            size = len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))
            if size > self.limits.max_output_bytes:
                return self._output_limit(logs, size)
            return RuntimeOutcome(logs, result=value)
        if kind == "rejected":
            error = _strip_bridge_frames(state["error"])
            if _is_stack_overflow(error):
                return RuntimeOutcome(logs, error=RunError("abort", _stack_message(self.limits)))
            if error.startswith("InternalError: out of memory"):
                return RuntimeOutcome(logs, error=self._memory_error())
            if error == "Uncaught null":
                # QuickJS throws a bare null when it cannot even allocate the
                # out-of-memory error, and by now the memory is freed: nothing
                # tells that apart from a literal `throw null`, so say both.
                return RuntimeOutcome(
                    logs,
                    error=self._memory_error(
                        " (or it threw a bare null, which QuickJS also raises when it runs out of memory)"
                    ),
                )
            return RuntimeOutcome(logs, error=RunError("exception", _clip(error)))
        if kind == "output_limit":
            return self._output_limit(logs, state["size"])
        return RuntimeOutcome(logs, error=RunError("invalid_output", state["error"]))

    def _output_limit(self, logs: tuple[str, ...], size: int) -> RuntimeOutcome:
        message = f"the program's result is {size} bytes of JSON, over the {self.limits.max_output_bytes}-byte limit"
        return RuntimeOutcome(logs, error=RunError("output_limit", message))

    # -- stepping the engine -------------------------------------------------

    def _arm(self) -> None:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise _Killed(self._timeout_error("running JavaScript"))
        self.ctx.set_time_limit(remaining)

    # _pump, _drain and _settle run once per tool call: each calls the engine
    # inside its own ``try`` (what ``_guard`` does, without the extra frame).

    def _pump(self, armed: bool = False) -> None:
        if not armed:
            self._arm()
        execute = self.ctx.execute_pending_job
        deadline = self.deadline
        monotonic = time.monotonic
        try:
            # A promise chain that never ends is many short jobs: check between them.
            while execute():
                if monotonic() > deadline:
                    raise _Killed(self._timeout_error("running JavaScript"))
        except quickjs.JSException as exc:
            self._stopped(execute, exc)

    def _drain(self) -> dict:
        try:
            text = self.bridge("drain")
        except quickjs.JSException as exc:
            self._stopped(self.bridge, exc)
        envelope = _checked(text)
        if envelope is None:
            # Only the prelude writes envelopes; a malformed one means the
            # program reached the bridge. Trust nothing more from this context.
            raise _Killed(RunError("abort", "the sandbox bridge was tampered with; the run was stopped"))
        if envelope["logs"] or envelope["dropped"]:
            self.logs.extend(envelope["logs"], envelope["dropped"])
        return envelope

    def _settle(self, call_id: int, outcome: Outcome) -> None:
        # ASCII JSON: escapes lone surrogates (the binding cannot pass them) and NUL.
        if outcome.ok:
            payload = _encode_value(outcome.value)
        else:
            payload = _encode(outcome.error.as_dict())
        self._arm()
        try:
            self.bridge("settle", call_id, outcome.ok, payload)
        except quickjs.JSException as exc:
            self._stopped(self.bridge, exc)

    def _guard(self, fn: Any, *args: Any) -> Any:
        """Call into the engine, turning an engine-level stop into :class:`_Killed`."""
        try:
            return fn(*args)
        except quickjs.JSException as exc:
            self._stopped(fn, exc)

    def _stopped(self, fn: Any, exc: Exception) -> None:
        """Raise what ``exc``, raised by calling ``fn`` in the engine, means for the run."""
        if isinstance(exc, quickjs.StackOverflow):
            raise _Killed(RunError("abort", _stack_message(self.limits))) from None
        text = str(exc)
        if "interrupted" in text:
            raise _Killed(self._timeout_error("running JavaScript")) from None
        if "out of memory" in text or text.strip() in ("", "null"):
            raise _Killed(self._memory_error()) from None
        if "stack overflow" in text or "Maximum call stack size exceeded" in text:
            raise _Killed(RunError("abort", _stack_message(self.limits))) from None
        if fn is not self.bridge and fn != self.ctx.execute_pending_job:
            raise _Syntax(_clip(text.strip())) from None
        raise _Killed(RunError("abort", "the engine stopped the program: " + _clip(text.strip()))) from None

    def _salvage_logs(self) -> None:
        # After an interrupt or OOM the context may still answer one drain: try,
        # with a little headroom, so a killed program keeps what it printed.
        if self.bridge is None:
            return
        try:
            self.ctx.set_memory_limit(self.limits.memory_bytes + 16 * 1024 * 1024)
            self.ctx.set_time_limit(0.5)
            self._drain()
        except Exception:  # _Killed included: the run's verdict is already made
            pass

    def _memory_error(self, detail: str = "") -> RunError:
        mib = self.limits.memory_bytes / (1024 * 1024)
        return RunError("abort", f"the program exceeded its {mib:g} MiB memory limit and was stopped{detail}")

    def _timeout_error(self, doing: str) -> RunError:
        return RunError(
            "timeout", f"the program exceeded its {self.limits.timeout:g}s deadline ({doing}) and was stopped"
        )


class _Syntax(Exception):
    def __init__(self, message: str) -> None:
        self.message = message


class _LogBook:
    """Log lines within a UTF-8 byte budget; past it, a truncation marker."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self.full = False
        self._lines: list[str] = []
        self._notes: list[str] = []
        self._dropped = 0

    def extend(self, lines: list[str], dropped: int) -> None:
        # `dropped` counts lines the sandbox refused once its own budget was spent.
        self._dropped = dropped
        for line in lines:
            if self.full:
                continue
            data = line.encode("utf-8", "surrogatepass")
            if self.used + len(data) > self.max_bytes:
                keep = data[: self.max_bytes - self.used].decode("utf-8", "ignore")
                if keep:
                    self._lines.append(keep)
                self._lines.append(_TRUNCATED.format(n=self.max_bytes))
                self.full = True
                continue
            self.used += len(data)
            self._lines.append(line)

    def note(self, line: str) -> None:
        """A line from the host itself: always kept, outside the budget."""
        self._notes.append(line)

    def lines(self) -> tuple[str, ...]:
        if self._notes:
            return (*self._lines_with_marker(), *self._notes)
        return self._lines_with_marker()

    def _lines_with_marker(self) -> tuple[str, ...]:
        if self._dropped and not self.full:
            return (*self._lines, _TRUNCATED.format(n=self.max_bytes))
        return tuple(self._lines)


def _checked(text: Any) -> Optional[dict]:
    """The drained envelope, or ``None`` unless it has exactly the prelude's shape."""
    try:
        envelope = json.loads(text)
        calls, logs, dropped, main = envelope["calls"], envelope["logs"], envelope["dropped"], envelope["main"]
    except (TypeError, ValueError, KeyError):
        return None
    if not (isinstance(calls, list) and isinstance(logs, list) and type(dropped) is int):
        return None
    # Plain loops: all(<generator>) costs a generator per call on the hot path.
    for c in calls:
        if not (isinstance(c, list) and len(c) == 3 and type(c[0]) is int and isinstance(c[1], str)):
            return None
    for line in logs:
        if not isinstance(line, str):
            return None
    if main is not None and not (isinstance(main, dict) and main.get("state") in _STATES):
        return None
    return envelope


_STATES = frozenset({"fulfilled", "rejected", "invalid", "output_limit"})


def _strip_bridge_frames(text: str) -> str:
    # The prelude's own frames (named __nous_*) are noise to the program's author.
    return "\n".join(line for line in text.split("\n") if "__nous_" not in line).rstrip("\n")


def _is_stack_overflow(text: str) -> bool:
    # The engine's own wording, at the start: a ToolError that merely mentions
    # "stack overflow" in its message is the program's exception, not an abort.
    return text.startswith(("RangeError: Maximum call stack size exceeded", "InternalError: stack overflow"))


def _stack_message(limits: Limits) -> str:
    return f"the program exceeded its {limits.stack_bytes // 1024} KiB stack limit (runaway recursion?) and was stopped"


def _clip(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else text[:limit] + "… (truncated)"

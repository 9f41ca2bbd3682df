"""OpenTelemetry spans for code-mode runs: one for the run, one for each sub-call.

Needs the ``otel`` extra (``pip install -e '.[otel]'``). Once the
application sets a tracer provider (``trace.set_tracer_provider(...)``, or
Logfire, Langfuse, Phoenix... doing it), every entry point makes these spans
with the global tracer, as children of the span current where it was called
(a framework's agent span): :func:`~nous_sched.run_code` and so
:func:`~nous_sched.start_run` (the span current where it started),
``run_code_tool`` and serve-mcp (under the MCP SDK's server span) make the
run span and its sub-call spans; :func:`~nous_sched.call_tool` and the
adapters out make one ``execute_tool <tool>`` span for the direct call
(``nous_sched.mode`` ``"exclusive"``, ``nous_sched.outcome``,
``nous_sched.approved``), unless the current span already is that call's
``execute_tool`` span (a framework's own). With no provider set, none of
this runs (:mod:`nous_sched._tracing`). For another tracer than the
global one::

    from nous_sched.otel import traced_run_code

    result = traced_run_code(code, tools, description="...", tracer=tracer)

What is recorded (attribute names are the ``ATTR_*`` constants below):

* ``nous_sched.run_code``, the run's span, current while the program runs.
  Attributes: ``nous_sched.call_id``; when the run ends, ``nous_sched.calls``
  (how many sub-calls started), ``nous_sched.logs`` (how many log lines) and
  ``nous_sched.ok``; for a failed program ``nous_sched.error.kind`` and
  ``error.type`` (one of :data:`~nous_sched.ERROR_KINDS`) with status ERROR;
  and the run's usage ledger (:class:`~nous_sched.Usage`, the numbers of
  ``result.usage``): ``nous_sched.usage.call_chars`` (the size of each
  result the program received, in the order it received them),
  ``nous_sched.usage.received_chars`` (their sum),
  ``nous_sched.usage.answer_bytes``, ``nous_sched.usage.model_bytes`` and
  ``nous_sched.usage.cut_bytes`` (what the output budget took off).
  The program's text, its description, arguments, results and error messages
  are *not* recorded: they are model-written or tool data.
* ``execute_tool <name>``, one per started sub-call (the OpenTelemetry GenAI
  semantic conventions for a tool execution), a child of the run span
  although the scheduler creates it on its driver thread (the run span's
  context is passed explicitly). It runs from the call's start to its commit,
  timed from the scheduler's own clock (:class:`~nous_sched.CallRecord`), with
  an event ``nous_sched.finished`` when the tool returned (a call may wait
  after that for its predecessors to commit). A call whose tool names
  throttles (:class:`~nous_sched.Throttle`) carries ``nous_sched.throttled``,
  the seconds it waited for their places, and an event
  ``nous_sched.throttle_granted`` when it had them and began. Attributes:
  ``gen_ai.operation.name`` (``"execute_tool"``), ``gen_ai.tool.name``,
  ``gen_ai.tool.call.id`` (the call's audit event id, ``"<call_id>:code:<seq>"``),
  ``gen_ai.tool.type`` (``"function"``), ``nous_sched.seq``,
  ``nous_sched.tool``, ``nous_sched.mode``, ``nous_sched.waited`` (seconds
  from its start until a tool thread took it up, throttles included),
  ``nous_sched.approved`` (for a call that asked: the answer) and ``nous_sched.outcome``:
  ``"ok"``, ``"error"`` (status ERROR) or ``"abandoned"`` (status ERROR; the
  run ended while the call was queued behind a commit or still running).
* Spans that a tool itself creates (an instrumented HTTP client, say) are
  children of its sub-call's span, because the tool runs with that span
  current. That holds on executors that run calls in process without
  serializing them (thread pools). On one that pickles its tasks (Dask, a
  process pool) the tool runs without it, and its own spans have no parent
  from here; the run and sub-call spans are recorded all the same.

:class:`SpanObserver` is the piece that does the sub-call spans; use it as a
:class:`~nous_sched.Scheduler` ``observer`` directly when you drive a
scheduler yourself.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any, Callable, Iterable, Optional

import attrs

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - tested by hiding the package
    from ._extras import install_command

    raise ImportError(
        f"nous_sched.otel needs OpenTelemetry, which is not installed; install it with: {install_command('otel')}"
    ) from exc

from . import _validators as v
from ._run.entry import run as run_with
from ._run.options import GIVEN_NOT, RunOptions, build, given
from ._text import machine_text
from ._validators import require
from .events import COMMIT, START
from .gate.dispatch import Dispatch, RunContext, approval_sink, current_call, direct_dispatch
from .result import RunResult
from .result.records import CallRecord
from .tooling import Tool

__all__ = [
    "traced_run_code",
    "SpanObserver",
    "RUN_SPAN",
    "TOOL_SPAN_PREFIX",
    "FINISHED_EVENT",
    "ATTR_CALL_ID",
    "ATTR_CALLS",
    "ATTR_LOGS",
    "ATTR_OK",
    "ATTR_ERROR_KIND",
    "ATTR_ERROR_TYPE",
    "ATTR_SEQ",
    "ATTR_TOOL",
    "ATTR_MODE",
    "ATTR_OUTCOME",
    "ATTR_USAGE_CALLS",
    "ATTR_USAGE_RECEIVED",
    "ATTR_USAGE_ANSWER",
    "ATTR_USAGE_MODEL",
    "ATTR_USAGE_CUT",
    "ATTR_THROTTLED",
    "THROTTLED_EVENT",
    "ATTR_GEN_AI_OPERATION",
    "ATTR_GEN_AI_TOOL_NAME",
    "ATTR_GEN_AI_TOOL_CALL_ID",
    "ATTR_GEN_AI_TOOL_TYPE",
    "ATTR_WAITED",
    "ATTR_APPROVED",
    "EXECUTE_TOOL",
]

log = logging.getLogger("nous_sched")

RUN_SPAN = "nous_sched.run_code"
#: The OpenTelemetry GenAI semantic conventions' name for a tool execution span: ``execute_tool {gen_ai.tool.name}``.
TOOL_SPAN_PREFIX = "execute_tool "
EXECUTE_TOOL = "execute_tool"
FINISHED_EVENT = "nous_sched.finished"

ATTR_CALL_ID = "nous_sched.call_id"
ATTR_CALLS = "nous_sched.calls"
ATTR_LOGS = "nous_sched.logs"
ATTR_OK = "nous_sched.ok"
ATTR_ERROR_KIND = "nous_sched.error.kind"
ATTR_ERROR_TYPE = "error.type"  # the semantic-conventions name, for backends that group on it
ATTR_SEQ = "nous_sched.seq"
ATTR_TOOL = "nous_sched.tool"
ATTR_MODE = "nous_sched.mode"
ATTR_OUTCOME = "nous_sched.outcome"
ATTR_USAGE_CALLS = "nous_sched.usage.call_chars"
ATTR_USAGE_RECEIVED = "nous_sched.usage.received_chars"
ATTR_USAGE_ANSWER = "nous_sched.usage.answer_bytes"
ATTR_USAGE_MODEL = "nous_sched.usage.model_bytes"
ATTR_USAGE_CUT = "nous_sched.usage.cut_bytes"
ATTR_THROTTLED = "nous_sched.throttled"
THROTTLED_EVENT = "nous_sched.throttle_granted"
ATTR_WAITED = "nous_sched.waited"
ATTR_APPROVED = "nous_sched.approved"
# The OpenTelemetry GenAI semantic conventions for a tool execution span.
ATTR_GEN_AI_OPERATION = "gen_ai.operation.name"
ATTR_GEN_AI_TOOL_NAME = "gen_ai.tool.name"
ATTR_GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
ATTR_GEN_AI_TOOL_TYPE = "gen_ai.tool.type"

_INSTRUMENTATION = "nous_sched"


_TRACER = v.optional(v.Check("an OpenTelemetry Tracer", lambda t: callable(getattr(t, "start_span", None))))
_CONTEXT = v.optional(v.instance_of(otel_context.Context, "an OpenTelemetry Context"))


def _tracer(tracer: Optional[trace.Tracer]) -> trace.Tracer:
    if tracer is not None:
        return tracer
    from ._version import __version__

    return trace.get_tracer(_INSTRUMENTATION, __version__)


class SpanObserver:
    """A scheduler ``observer`` that records every sub-call as a span.

    :param tracer: where spans go (the global tracer provider's ``nous_sched``
        tracer by default).
    :param context: the parent of every sub-call span, an OpenTelemetry
        ``Context``. Pass it: the observer runs on the scheduler's driver
        thread, whose current context is not the caller's. ``None`` makes
        each sub-call span a root.
    :param then: another ``observer(record, phase)`` to call after this one;
        its exceptions are the scheduler's to log, as usual.
    :param call_id: the run's ``call_id`` (the scheduler's), so that each
        span's ``gen_ai.tool.call.id`` is the call's audit event id,
        ``"<call_id>:code:<seq>"``.

    One instance per scheduler (spans are keyed by ``seq``). Call
    :meth:`close` when the run is over: it ends the spans of calls that never
    committed.
    """

    def __init__(
        self,
        tracer: Optional[trace.Tracer] = None,
        context: Optional[otel_context.Context] = None,
        then: Optional[Callable[[CallRecord, str], Any]] = None,
        call_id: Optional[str] = None,
    ) -> None:
        require("SpanObserver", "tracer", tracer, _TRACER)
        require("SpanObserver", "call_id", call_id, v.OPTIONAL_STR)
        require("SpanObserver", "context", context, _CONTEXT)
        require("SpanObserver", "then", then, v.OPTIONAL_CALLABLE)
        self._tracer = _tracer(tracer)
        self._context = context
        self._then = then
        self._prefix = "code:" if call_id is None else call_id + ":code:"
        self._lock = threading.Lock()
        self._open: dict[int, trace.Span] = {}
        self._origin: Optional[int] = None  # the scheduler's clock zero, in epoch nanoseconds
        self._closed = False
        self.started = 0  #: how many sub-call spans were started

    def __call__(self, record: CallRecord, phase: str) -> None:
        try:
            project = PROJECTION[phase]
            if project is not None:
                project(self, record)
        except Exception:  # telemetry must never cost the run anything
            log.warning("nous_sched.otel: could not record sub-call %s", record.seq, exc_info=True)
        if self._then is not None:
            self._then(record, phase)

    def span_for(self, seq: int) -> Optional[trace.Span]:
        """The open span of sub-call ``seq``, if it has one."""
        with self._lock:
            return self._open.get(seq)

    def wrap_dispatch(self, dispatch: Dispatch = direct_dispatch) -> Dispatch:
        """``dispatch`` running each call with its sub-call span current.

        Spans the tool creates are then children of its sub-call span. The
        span exists before the call reaches the executor (the scheduler
        notifies ``"start"`` first). An executor that pickles its tasks (Dask,
        a process pool) gets plain ``dispatch`` instead: spans cannot cross.
        """
        return _TracedDispatch(self, dispatch)

    def close(self, trail: Iterable[CallRecord] = ()) -> None:
        """End every span still open, with the final records in ``trail`` if given.

        Idempotent; a call reported after this is ignored.
        """
        final = {r.seq: r for r in trail}
        with self._lock:
            self._closed = True
            leftovers, self._open = sorted(self._open.items()), {}
        for seq, span in leftovers:
            try:
                self._end(span, final.get(seq), abandoned=True)
            except Exception:
                log.warning("nous_sched.otel: could not end the span of sub-call %s", seq, exc_info=True)

    # -- internals ------------------------------------------------------------

    def _ns(self, seconds: float) -> int:
        assert self._origin is not None, "anchored by the first start"
        return self._origin + int(seconds * 1e9)

    def _start(self, record: CallRecord) -> None:
        with self._lock:
            if self._closed:
                return
            if self._origin is None:
                # The record was stamped an instant ago on the scheduler's clock: anchor that clock to epoch time.
                self._origin = time.time_ns() - int(record.started * 1e9)
            tool = machine_text(record.tool)  # an exporter encodes attributes as UTF-8 (nous_sched._text)
            span = self._tracer.start_span(
                TOOL_SPAN_PREFIX + tool,
                context=self._context,
                kind=SpanKind.INTERNAL,
                attributes={
                    ATTR_GEN_AI_OPERATION: EXECUTE_TOOL,
                    ATTR_GEN_AI_TOOL_NAME: tool,
                    ATTR_GEN_AI_TOOL_CALL_ID: machine_text(self._prefix + str(record.seq)),
                    ATTR_GEN_AI_TOOL_TYPE: "function",
                    ATTR_SEQ: record.seq,
                    ATTR_TOOL: tool,
                    ATTR_MODE: record.mode,
                },
                start_time=self._ns(record.started),
            )
            self._open[record.seq] = span
            self.started += 1

    def _commit(self, record: CallRecord) -> None:
        with self._lock:
            span = self._open.pop(record.seq, None)
        if span is not None:
            self._end(span, record)

    def _end(self, span: trace.Span, record: Optional[CallRecord], abandoned: bool = False) -> None:
        finished = None if record is None else record.finished
        if record is not None and record.throttled is not None:
            self._throttled(span, record, record.throttled)
        if record is not None and record.began is not None:
            span.set_attribute(ATTR_WAITED, max(0.0, record.began - record.started))
        if finished is not None:
            span.add_event(FINISHED_EVENT, timestamp=self._ns(finished))
        if record is None or (abandoned and (record.committed is None or record.ok is None)):
            outcome = "abandoned"
        else:
            outcome = "ok" if record.ok else "error"
        span.set_attribute(ATTR_OUTCOME, outcome)
        if outcome == "error":
            span.set_status(Status(StatusCode.ERROR, "sub-call failed"))
        elif outcome == "abandoned":
            span.set_status(Status(StatusCode.ERROR, "sub-call abandoned: the run ended first"))
        end = None
        if record is not None:
            last = record.committed if record.committed is not None else record.finished
            if last is not None:
                end = self._ns(last)
        span.end(end_time=end if end is not None else time.time_ns())

    def _throttled(self, span: trace.Span, record: CallRecord, throttled: float) -> None:
        span.set_attribute(ATTR_THROTTLED, throttled)
        if record.began is not None:
            span.add_event(THROTTLED_EVENT, {ATTR_THROTTLED: throttled}, timestamp=self._ns(record.began))


#: The OTel projection of the observer's phases (:data:`nous_sched.events.PHASES`):
#: a call's span opens at its start and ends at its commit.
PROJECTION: dict[str, Optional[Callable[[SpanObserver, CallRecord], None]]] = {
    START: SpanObserver._start,  # noqa: SLF001
    COMMIT: SpanObserver._commit,  # noqa: SLF001
}


class _TracedDispatch:
    """See :meth:`SpanObserver.wrap_dispatch`."""

    __slots__ = ("observer", "dispatch")

    def __init__(self, observer: SpanObserver, dispatch: Dispatch) -> None:
        self.observer = observer
        self.dispatch = dispatch

    def __call__(self, tool: Tool, args: dict[str, Any], run_ctx: Optional[RunContext]) -> Any:
        info = current_call.get()
        span = None if info is None else self.observer.span_for(info.seq)
        if span is None:
            return self.dispatch(tool, args, run_ctx)
        token = otel_context.attach(trace.set_span_in_context(span))
        sink = approval_sink.set(_recording(span, approval_sink.get()))
        try:
            return self.dispatch(tool, args, run_ctx)
        finally:
            approval_sink.reset(sink)
            otel_context.detach(token)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_same, (self.dispatch,))  # pickled, it is the dispatch it wraps


def _same(value: Any) -> Any:
    return value


def _recording(span: trace.Span, then: Optional[Callable[..., None]]) -> Callable[..., None]:
    """An approval sink that puts the decision on ``span`` (``nous_sched.approved``), then tells ``then``."""

    def sink(approved: bool, reason: str, **grant: Any) -> None:
        span.set_attribute(ATTR_APPROVED, approved)
        if then is not None:
            then(approved, reason, **grant)

    return sink


def _record_usage(span: trace.Span, result: RunResult) -> None:
    usage = result.usage
    span.set_attribute(ATTR_USAGE_CALLS, [c.chars for c in usage.calls])
    span.set_attribute(ATTR_USAGE_RECEIVED, usage.received_chars)
    span.set_attribute(ATTR_USAGE_ANSWER, usage.answer_bytes)
    span.set_attribute(ATTR_USAGE_MODEL, usage.model_bytes)
    span.set_attribute(ATTR_USAGE_CUT, usage.cut_bytes)


def traced_run_code(
    code: Any,
    tools: Iterable[Tool] = (),
    *,
    tracer: Optional[trace.Tracer] = None,
    call_id: Optional[str] = GIVEN_NOT,
    observer: Optional[Callable[[CallRecord, str], Any]] = GIVEN_NOT,
    dispatch: Dispatch = GIVEN_NOT,
    tool_context: bool = True,
    options: Optional[RunOptions] = None,
    **run_options: Any,
) -> RunResult:
    """:func:`~nous_sched.run_code` inside a ``nous_sched.run_code`` span, sub-calls as child spans.

    Takes every :func:`~nous_sched.run_code` option, as keywords or as one
    :class:`~nous_sched.RunOptions` (``options=``; an option given both ways
    is a :class:`~nous_sched.ConfigError` naming it). ``tracer`` defaults to the
    global provider's; ``call_id`` to a fresh ``"run_code-…"`` (it is the
    span's ``nous_sched.call_id``). Your ``observer`` is called after the
    span bookkeeping, your ``dispatch`` inside it (``tool_context=False``
    leaves ``dispatch`` unwrapped: tools then run with the run span
    current, not their sub-call's). Returns and raises exactly what
    ``run_code`` does; an exception is recorded on the run span.

    With a tracer provider configured, plain :func:`~nous_sched.run_code`
    makes the same spans with the global tracer; this is for another tracer,
    or ``tool_context=False``.
    """
    own = given({"call_id": call_id, "observer": observer, "dispatch": dispatch})
    made = _traced_options(tracer, tool_context, {**run_options, **own, "options": options})
    go = lambda traced: run_with(code, tools, traced)  # noqa: E731
    return _traced_run(_tracer(tracer), made, go, tool_context=tool_context)


def _traced_run(
    tracer: trace.Tracer, options: RunOptions, go: Callable[[RunOptions], RunResult], tool_context: bool = True
) -> RunResult:
    """``go(traced)`` in a run span, ``traced`` the ``options`` with an observer,
    dispatch and call id set for its sub-call spans."""
    call_id = options.call_id
    if call_id is None:
        call_id = "run_code-" + secrets.token_urlsafe(6)
    with tracer.start_as_current_span(
        RUN_SPAN, kind=SpanKind.INTERNAL, attributes={ATTR_CALL_ID: machine_text(call_id)}
    ) as run_span:
        spans = SpanObserver(
            tracer, context=trace.set_span_in_context(run_span), then=options.observer, call_id=call_id
        )
        dispatch = spans.wrap_dispatch(options.dispatch) if tool_context else options.dispatch
        traced = attrs.evolve(options, call_id=call_id, observer=spans, dispatch=dispatch)
        result = None
        try:
            result = go(traced)
        finally:
            spans.close(result.trail if result is not None else ())
            run_span.set_attribute(ATTR_CALLS, spans.started)
        run_span.set_attribute(ATTR_LOGS, len(result.logs))
        run_span.set_attribute(ATTR_OK, result.ok)
        _record_usage(run_span, result)
        if result.error is not None:
            run_span.set_attribute(ATTR_ERROR_KIND, result.error.kind)
            run_span.set_attribute(ATTR_ERROR_TYPE, result.error.kind)
            run_span.set_status(Status(StatusCode.ERROR, f"program failed: {result.error.kind}"))
    return result


class _Auto:
    """The :class:`nous_sched._tracing.Tracing` the entry points use once a tracer provider is configured."""

    def run(self, options: RunOptions, go: Callable[[RunOptions], Any]) -> Any:
        if isinstance(options.observer, SpanObserver):  # traced_run_code's own run: spanned already
            return go(options)
        return _traced_run(_tracer(None), options, go)

    def call(self, tool: str, call_id: str, go: Callable[[], Any]) -> Any:
        if getattr(trace.get_current_span(), "name", None) == TOOL_SPAN_PREFIX + tool:
            return go()  # the framework made this call's tool span already (pydantic-ai's, say)
        attributes = {
            ATTR_GEN_AI_OPERATION: EXECUTE_TOOL,
            ATTR_GEN_AI_TOOL_NAME: tool,
            ATTR_GEN_AI_TOOL_CALL_ID: call_id,
            ATTR_GEN_AI_TOOL_TYPE: "function",
            ATTR_TOOL: tool,
            ATTR_MODE: "exclusive",
        }
        with _tracer(None).start_as_current_span(
            TOOL_SPAN_PREFIX + tool, kind=SpanKind.INTERNAL, attributes=attributes
        ) as span:
            sink = approval_sink.set(_recording(span, approval_sink.get()))
            try:
                value = go()
            finally:
                approval_sink.reset(sink)
            failed = getattr(value, "ok", True) is False  # an Outcome the tool returned as a failure
            span.set_attribute(ATTR_OUTCOME, "error" if failed else "ok")
            if failed:
                span.set_status(Status(StatusCode.ERROR, "call failed"))
            return value


#: What :func:`nous_sched._tracing.active` returns once this module is loaded and a provider is configured.
AUTO = _Auto()


def _traced_options(tracer: Any, tool_context: Any, run_options: dict[str, Any]) -> RunOptions:
    # Every option, before the run span starts: a bad one is no span and no run.
    require("traced_run_code", "tracer", tracer, _TRACER)
    require("traced_run_code", "tool_context", tool_context, v.BOOL)
    return build("traced_run_code", run_options)

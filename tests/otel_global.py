"""A global OpenTelemetry tracer provider for one test, with its spans in memory; the globals restored after.

nous_sched's spans follow the *global* provider (``nous_sched._tracing``), so a
test of them has to set it. OpenTelemetry lets that happen once per process;
each test puts the API's globals back as OpenTelemetry's own test utilities
(``opentelemetry.test.globals_test.reset_trace_globals``) do, so the tests
after it run with no provider, as before.
"""

from __future__ import annotations

from typing import Any, Iterator

from opentelemetry.sdk.trace import SpanProcessor


def _reset_trace_globals() -> None:
    from opentelemetry import trace
    from opentelemetry.util._once import Once

    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    trace._PROXY_TRACER_PROVIDER = trace.ProxyTracerProvider()


class _Router(SpanProcessor):
    """A span processor that hands each ended span to the exporter of the test running now, if any."""

    exporter: Any = None

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: Any) -> None:
        exporter = self.exporter
        if exporter is not None:
            exporter.export((span,))

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


_provider: Any = None
_router: Any = None


def global_spans() -> Iterator[Any]:
    """The in-memory exporter of the global SDK tracer provider, set until the generator ends
    (a test module's fixture: ``yield from global_spans()``).

    One provider for the whole process, set and unset again for each test:
    libraries keep the tracer they got from it (the MCP SDK takes one at
    import), so a fresh provider per test would lose their spans.
    """
    global _provider, _router
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    if _provider is None:
        _router = _Router()
        _provider = TracerProvider()
        _provider.add_span_processor(_router)
    exporter = InMemorySpanExporter()
    _reset_trace_globals()
    trace.set_tracer_provider(_provider)
    _router.exporter = exporter
    try:
        yield exporter
    finally:
        _router.exporter = None
        _reset_trace_globals()


def ancestors(span: Any, spans: Any) -> list[str]:
    """The names of ``span``'s ancestors among ``spans``, nearest first."""
    by_id = {s.context.span_id: s for s in spans}
    out = []
    parent = span.parent
    while parent is not None and parent.span_id in by_id:
        above = by_id[parent.span_id]
        out.append(above.name)
        parent = above.parent
    return out


def named(spans: Any, name: str) -> list[Any]:
    return [s for s in spans if s.name == name]

"""A global OpenTelemetry tracer provider for one test, with its spans in memory; the globals restored after.

nous_sched's spans follow the *global* provider (``nous_sched._tracing``), so a
test of them has to set it. OpenTelemetry lets that happen once per process;
the fixture puts the API's globals back as OpenTelemetry's own test utilities
(``opentelemetry.test.globals_test.reset_trace_globals``) do, so the tests
after it run with no provider, as before.
"""

from __future__ import annotations

from typing import Any, Iterator


def _reset_trace_globals() -> None:
    from opentelemetry import trace
    from opentelemetry.util._once import Once

    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    trace._PROXY_TRACER_PROVIDER = trace.ProxyTracerProvider()


def global_spans() -> Iterator[Any]:
    """The in-memory exporter of a global SDK tracer provider, set until the generator ends
    (a test module's fixture: ``yield from global_spans()``)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_trace_globals()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
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

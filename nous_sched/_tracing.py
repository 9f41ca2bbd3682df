"""The tracing seam: spans for every run and direct call, only when the application configured OpenTelemetry.

:func:`~nous_sched.run_code` (and so ``start_run``, ``run_code_tool``,
serve-mcp) and :func:`~nous_sched.call_tool` (and so the adapters out) ask
:func:`active` for a :class:`Tracing`; ``None`` means "make no spans". The
answer is ``None`` unless ``opentelemetry.trace`` was imported and a tracer
provider other than the API's default proxy or no-op one was set: an
application that never configured OpenTelemetry pays one dictionary look-up
per run or call.

The spans themselves are made by :mod:`nous_sched.otel`, which sits above
``run_code`` (its ``traced_run_code`` calls it), so it cannot be imported
from here: the package installs a loader (:func:`install`) that imports it
the first time a configured provider is seen.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional, Protocol

__all__ = ["Tracing", "active", "install"]


class Tracing(Protocol):
    """What :mod:`nous_sched.otel` provides to the entry points."""

    def run(self, options: dict[str, Any], go: Callable[[], Any]) -> Any:
        """Call ``go()`` (one run) inside a run span; may set ``options``' ``observer``,
        ``dispatch`` and ``call_id`` first (they are the run's own)."""

    def call(self, tool: str, call_id: str, go: Callable[[], Any]) -> Any:
        """Call ``go()`` (one direct call of ``tool``) inside a tool-execution span."""


_loader: Optional[Callable[[], Tracing]] = None


def install(loader: Callable[[], Tracing]) -> None:
    """Set what :func:`active` calls for the :class:`Tracing` once OpenTelemetry is configured."""
    global _loader
    _loader = loader


def active() -> Optional[Tracing]:
    """The :class:`Tracing` to use now, or ``None`` when no tracer provider is configured."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None or _loader is None:
        return None
    if isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    return _loader()

"""The tracing seam: spans for every run and direct call, only when the application configured OpenTelemetry.

:func:`~nous_sched.run_code` (and so ``start_run``, ``run_code_tool``,
serve-mcp) and :func:`~nous_sched.call_tool` (and so the adapters out) ask
:func:`active` for a :class:`Tracing`; ``None`` means "make no spans". The
answer is ``None`` unless ``opentelemetry.trace`` was imported and a tracer
provider other than the API's default proxy or no-op one was set (in code,
or named by ``OTEL_PYTHON_TRACER_PROVIDER`` when the process started): an
application that never configured OpenTelemetry pays a dictionary look-up
and an attribute read per run or call.

The spans themselves are made by :mod:`nous_sched.otel`, which sits above
``run_code`` (its ``traced_run_code`` calls it), so it cannot be imported
from here: the package installs a loader (:func:`install`) that imports it
the first time a configured provider is seen.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, Optional, Protocol

__all__ = ["Tracing", "active", "install"]


class Tracing(Protocol):
    """What :mod:`nous_sched.otel` provides to the entry points."""

    def run(self, options: Any, go: Callable[[Any], Any]) -> Any:
        """Call ``go(options)`` (one run) inside a run span, ``options`` (the run's
        :class:`~nous_sched.RunOptions`: the seam sits below them) with their
        ``observer``, ``dispatch`` and ``call_id`` changed first (they are the run's own)."""

    def call(self, tool: str, call_id: str, go: Callable[[], Any]) -> Any:
        """Call ``go()`` (one direct call of ``tool``) inside a tool-execution span."""


_loader: Optional[Callable[[], Tracing]] = None


def install(loader: Callable[[], Tracing]) -> None:
    """Set what :func:`active` calls for the :class:`Tracing` once OpenTelemetry is configured."""
    global _loader
    _loader = loader


_UNREAD = object()
_ENV_PROVIDER = "OTEL_PYTHON_TRACER_PROVIDER"


def active() -> Optional[Tracing]:
    """The :class:`Tracing` to use now, or ``None`` when no tracer provider is configured."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None or _loader is None:
        return None
    # The provider the application set, read where the API keeps it: get_tracer_provider()
    # looks the environment up on every call (about 1 us, most of a direct call's cost
    # when nothing is configured, which is the case wherever pydantic-ai, say, imported
    # the API). An API without that attribute, or a provider named by the environment
    # (loaded by its first get_tracer_provider()), takes the public way.
    provider = getattr(trace, "_TRACER_PROVIDER", _UNREAD)
    if provider is None:
        if not _provider_from_environment():
            return None
        provider = trace.get_tracer_provider()
    elif provider is _UNREAD:
        provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    return _loader()


@functools.lru_cache(maxsize=1)
def _provider_from_environment() -> bool:
    # Read once: OpenTelemetry configures from the environment at start-up.
    return _ENV_PROVIDER in os.environ

"""The code-runtime seam: what runs a program, and what it may ask of the host.

A :class:`CodeRuntime` runs one program on the calling thread and returns a
:class:`RuntimeOutcome`. All it can do to the outside world is through the
:class:`Host` it is handed: start a tool call by name with JSON arguments and
wait for that call's outcome. The host decides everything else (permissions,
approval, scheduling, audit).
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence, runtime_checkable

import attrs

from ..outcome import Outcome
from ..result import RunError

__all__ = ["CodeRuntime", "Host", "PendingCall", "RuntimeOutcome", "Limits"]


class PendingCall(Protocol):
    def wait(self, timeout: float) -> Optional[Outcome]:
        """The call's outcome, or ``None`` if ``timeout`` seconds pass first."""


class Host(Protocol):
    #: Every tool name the program may call, sorted; each appears as ``tools[name]``.
    names: Sequence[str]

    def call(self, name: str, args: Any) -> PendingCall:
        """Start one call with the program's (JSON-decoded) ``args``.

        Never raises: refusals come back as failed outcomes.

        Outcomes of calls started in order ``a, b`` become available in that
        order (the host commits in submission order).
        """


@attrs.frozen
class Limits:
    """Resource limits for one run; validated at the edge.

    ``max_args_bytes`` caps one tool call's arguments as JSON: a bigger call is
    refused inside the sandbox (the program gets a ``ToolError``), so the host
    never parses or snapshots it. Sizes are counted in UTF-16 units of the JSON
    text, which never exceeds its UTF-8 byte count.
    """

    timeout: float = 30.0
    memory_bytes: int = 256 * 1024 * 1024
    stack_bytes: int = 1024 * 1024
    max_log_bytes: int = 1_000_000
    max_output_bytes: int = 1_000_000
    max_args_bytes: int = 1_000_000

    def __attrs_post_init__(self) -> None:
        from ..errors import ConfigError

        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or not self.timeout > 0:
            raise ConfigError(f"`timeout` must be a positive number of seconds, got {self.timeout!r}")
        for name in ("memory_bytes", "stack_bytes", "max_log_bytes", "max_output_bytes", "max_args_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ConfigError(f"`{name}` must be a positive int, got {value!r}")
        if self.memory_bytes < 4 * 1024 * 1024:
            raise ConfigError(f"`memory_bytes` must be at least 4 MiB, got {self.memory_bytes}")
        # quickjs-ng crashes with a stack limit above the 8 MiB default thread stack.
        if not 64 * 1024 <= self.stack_bytes <= 4 * 1024 * 1024:
            raise ConfigError(f"`stack_bytes` must be between 64 KiB and 4 MiB, got {self.stack_bytes}")


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

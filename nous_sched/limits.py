"""Resource limits for one program run."""

from __future__ import annotations

import attrs

from .errors import ConfigError

__all__ = ["Limits"]


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

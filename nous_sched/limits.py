"""Resource limits for one program run."""

from __future__ import annotations

import attrs

from . import _validators as v

__all__ = ["Limits"]

_MIB = 1024 * 1024
_KIB = 1024


@attrs.frozen
class Limits:
    """Resource limits for one run; each field is validated when it is built.

    ``max_args_bytes`` caps one tool call's arguments as JSON: a bigger call is
    refused inside the sandbox (the program gets a ``ToolError``), so the host
    never parses or snapshots it. Sizes are counted in UTF-16 units of the JSON
    text, which never exceeds its UTF-8 byte count.

    :raises ConfigError: naming the field, the value and what it must be.
    """

    timeout: float = attrs.field(default=30.0, validator=v.SECONDS)
    memory_bytes: int = attrs.field(
        default=256 * _MIB, validator=v.int_at_least(4 * _MIB, f"an int of at least 4 MiB ({4 * _MIB})")
    )
    # quickjs-ng crashes with a stack limit above the 8 MiB default thread stack.
    stack_bytes: int = attrs.field(
        default=_MIB,
        validator=v.int_between(64 * _KIB, 4 * _MIB, f"an int from 64 KiB to 4 MiB ({64 * _KIB} to {4 * _MIB})"),
    )
    max_log_bytes: int = attrs.field(default=1_000_000, validator=v.POSITIVE_INT)
    max_output_bytes: int = attrs.field(default=1_000_000, validator=v.POSITIVE_INT)
    max_args_bytes: int = attrs.field(default=1_000_000, validator=v.POSITIVE_INT)

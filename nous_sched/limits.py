"""Resource limits for one program run."""

from __future__ import annotations

from typing import Optional

import attrs

from . import _validators as v

__all__ = ["Limits"]

_MIB = 1024 * 1024
_KIB = 1024


@attrs.frozen
class Limits:
    """Resource limits for one run; each field is validated when it is built.

    Every limit is enforced whatever the program does, by the host (so both
    runtimes enforce it the same way); the sandbox refuses early what it can.

    * ``timeout``: the run's wall-clock deadline, in seconds.
    * ``memory_bytes``, ``stack_bytes``: the engine's heap and stack.
    * ``max_log_bytes``, ``max_log_lines``: what the program may log. Each
      line costs its UTF-8 bytes plus one (an empty line is not free); past
      either limit the rest is dropped and one marker line says so.
    * ``max_output_bytes``: the UTF-8 bytes of the result's JSON.
    * ``max_args_bytes``: one call's arguments, in UTF-8 bytes of their JSON;
      a bigger call fails with a ``ToolError`` and never reaches the tool.
    * ``max_calls``: tool calls per run (refused calls count too); the calls
      past it fail with a ``ToolError``. The default is far above what a
      program that a model writes needs, and far below what a runaway loop
      would make.
    * ``max_total_args_bytes``: the UTF-8 bytes of every call's arguments in
      the run, together; the calls past it fail with a ``ToolError``. The
      sandbox also refuses, before it crosses, a call whose arguments would
      bring the characters of every call sent (refused ones too) past it;
      likewise every call after the first past ``max_calls``. So what a
      worker may send is bounded by the limits (see ``WorkerPool``).
    * ``max_code_bytes``: the program's own text, in UTF-8 bytes; a bigger
      program is refused (``RunCodeError``) before anything runs or is
      audited.
    * ``blob_bytes``: a tool result whose JSON text, as it would cross into
      the program, is over this many bytes stays on the host: the program
      gets a handle in place of its biggest parts (or of the whole), which it
      can pass to any tool, read in slices of at most this many characters,
      or return (``nous_sched.blobs``). ``None`` turns handles off: every
      result crosses whole. The default, 256 KiB, is far above an ordinary
      result and keeps a megabyte from ever crossing into the worker; at
      least 4 KiB (a handle itself takes a few hundred bytes).
    * ``state_value_bytes``, ``state_keys``, ``state_bytes``: a run's state
      (``run_code(state=State(scope))``): the bytes of one value's JSON, the
      keys a scope may hold, and the bytes of all its values' JSON together.
      A write past one fails with an error the program can catch; nothing is
      written.
    * ``cpu_time``: the CPU time the program's own JavaScript may use, in
      seconds, or ``None`` (the default): no budget but the deadline. Time
      spent waiting (for tools, approvals, throttles, a free worker) costs
      none of it; a program past it ends with a ``cpu_time`` error, the
      ``timeout`` deadline still holding alongside. The worker runtime
      counts its worker's CPU from the program's start and enforces it
      whatever runs there: the engine stops the program at the budget, the
      kernel's ``RLIMIT_CPU`` and the host kill the worker
      ``WorkerPool.kill_grace`` later. In-process it is the CPU time of
      the thread running the engine, inside its steps (see
      ``QuickJSRuntime``'s notes). A durable run's every part (the
      first and each resume) has the whole budget: a resume replays the
      program from its start.

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
    max_log_lines: int = attrs.field(default=10_000, validator=v.POSITIVE_INT)
    max_calls: int = attrs.field(default=1_000, validator=v.POSITIVE_INT)
    max_total_args_bytes: int = attrs.field(default=4_000_000, validator=v.POSITIVE_INT)
    max_code_bytes: int = attrs.field(default=_MIB, validator=v.POSITIVE_INT)
    blob_bytes: Optional[int] = attrs.field(
        default=256 * _KIB,
        validator=v.optional(v.int_at_least(4 * _KIB, f"an int of at least 4 KiB ({4 * _KIB})")),
    )
    state_value_bytes: int = attrs.field(default=1_000_000, validator=v.POSITIVE_INT)
    state_keys: int = attrs.field(default=1_000, validator=v.POSITIVE_INT)
    state_bytes: int = attrs.field(default=10_000_000, validator=v.POSITIVE_INT)
    cpu_time: Optional[float] = attrs.field(default=None, validator=v.optional(v.SECONDS))

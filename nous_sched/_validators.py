"""Option validation at the edge: every bad option is one :class:`ConfigError`.

The message always has the same shape, so a caller reads which option, what
they passed and what would work::

    Scheduler: `timeout` must be a positive, finite number of seconds, got inf

A :class:`Check` is attrs-shaped (``check(instance, attribute, value)``), so it
sits on an ``attrs.field`` as its validator and the owner is the class name;
:func:`require` runs one on a plain function's argument with the owner named
(``"run_code"``, ``"Scheduler.wait"``). ``check.expected`` is the phrase the
CLI reuses, so a flag and its option say the same thing.
"""

from __future__ import annotations

import concurrent.futures
import difflib
import inspect
import math
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

from .errors import ConfigError

__all__ = [
    "Check",
    "require",
    "fail",
    "unknown",
    "shown",
    "optional",
    "instance_of",
    "one_of",
    "int_at_least",
    "int_between",
    "names",
    "POSITIVE_INT",
    "SECONDS",
    "WAIT_SECONDS",
    "CALLABLE",
    "STR",
    "NON_EMPTY_STR",
    "BOOL",
    "MAPPING",
    "SCHEMA",
    "EXECUTOR",
    "optional_names",
    "OPTIONAL_CALLABLE",
    "OPTIONAL_STR",
    "NAMES",
    "OPTIONAL_NAMES",
    "TOOLS",
    "DISPATCH",
]

_SHOWN = 80  # a value longer than this in a message is cut: the message must stay readable


def shown(value: Any) -> str:
    """``value`` as a message shows it: its ``repr`` for plain data, its type for anything else."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, list, tuple, dict, set, frozenset)):
        text = repr(value)
        return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"
    return f"a {type(value).__name__}"


def fail(owner: str, option: str, value: Any, expected: str) -> NoReturn:
    """Raise the one :class:`ConfigError` shape for a bad option."""
    raise ConfigError(f"{owner}: `{option}` must be {expected}, got {shown(value)}")


def unknown(owner: str, option: str, accepted: Iterable[str], of: str) -> NoReturn:
    """Raise the :class:`ConfigError` for an option ``of`` does not take, naming the closest it does."""
    choices = sorted(accepted)
    close = difflib.get_close_matches(option, choices, n=1)
    hint = f"; did you mean `{close[0]}`?" if close else ""
    raise ConfigError(f"{owner}: `{option}` is not an option of {of}{hint} (the options: {', '.join(choices)})")


class Check:
    """A named test of one option: ``accepts(value)`` and the ``expected`` phrase."""

    __slots__ = ("accepts", "expected")

    def __init__(self, expected: str, accepts: Callable[[Any], bool]) -> None:
        self.expected = expected
        self.accepts = accepts

    def __call__(self, instance: Any, attribute: Any, value: Any) -> None:
        if not self.accepts(value):
            fail(type(instance).__name__, attribute.name, value, self.expected)

    def __repr__(self) -> str:
        return f"<Check {self.expected}>"


def require(owner: str, option: str, value: Any, check: Check) -> None:
    """Raise :class:`ConfigError` unless ``check`` accepts ``value``."""
    if not check.accepts(value):
        fail(owner, option, value, check.expected)


def optional(check: Check) -> Check:
    return Check(f"None or {check.expected}", lambda v: v is None or check.accepts(v))


def instance_of(kind: type | tuple[type, ...], expected: str) -> Check:
    return Check(expected, lambda v: isinstance(v, kind))


def one_of(choices: Iterable[str]) -> Check:
    allowed = tuple(choices)
    return Check("one of " + ", ".join(repr(c) for c in allowed), lambda v: isinstance(v, str) and v in allowed)


def _is_int(value: Any) -> bool:
    return type(value) is int  # bool is an int subclass, and True is not a count


def int_at_least(low: int, expected: str) -> Check:
    return Check(expected, lambda v: _is_int(v) and v >= low)


def int_between(low: int, high: int, expected: str) -> Check:
    return Check(expected, lambda v: _is_int(v) and low <= v <= high)


def is_seconds(value: Any, *, zero: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    # Bounded: a lock wait past TIMEOUT_MAX (292 years) raises OverflowError,
    # and every wait in the library is bounded on purpose, so inf is refused too.
    if not math.isfinite(value) or value > threading.TIMEOUT_MAX:
        return False
    return value >= 0 if zero else value > 0


def _dispatch_shape(value: Any) -> bool:
    if not callable(value):
        return False
    try:
        inspect.signature(value).bind(None, None, None)
    except TypeError:
        return False
    except ValueError:
        return True  # no introspectable signature (some builtins): trust the caller
    return True


def names(value: Any) -> Any:
    """Converter for tool-name sets: a str is one name, an iterable its names, ``None`` none.

    Returns a ``frozenset`` only for those; anything else is returned as it
    came (a generator as a tuple of what it held), for the :data:`NAMES`
    validator to refuse with the value in its message.
    """
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return frozenset([value])
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        return value
    items = tuple(value)
    if all(isinstance(item, str) for item in items):
        return frozenset(items)
    return items


_MAX = f"{threading.TIMEOUT_MAX:.3g}"

POSITIVE_INT = int_at_least(1, "a positive integer")
SECONDS = Check(f"a positive number of seconds, at most {_MAX}", lambda v: is_seconds(v, zero=False))
WAIT_SECONDS = Check(f"None or a number of seconds from 0 to {_MAX}", lambda v: v is None or is_seconds(v, zero=True))
CALLABLE = Check("callable", callable)
OPTIONAL_CALLABLE = optional(CALLABLE)
STR = instance_of(str, "a str")
OPTIONAL_STR = optional(STR)
NON_EMPTY_STR = Check("a non-empty string", lambda v: isinstance(v, str) and bool(v))
BOOL = instance_of(bool, "a bool")
MAPPING = instance_of(Mapping, "a mapping (a JSON object)")
SCHEMA = optional(instance_of(Mapping, "a JSON Schema mapping"))
EXECUTOR = optional(instance_of(concurrent.futures.Executor, "a concurrent.futures.Executor"))
NAMES = Check(
    "a tool name or an iterable of tool names (str)",
    lambda v: isinstance(v, frozenset) and all(isinstance(n, str) for n in v),
)
OPTIONAL_NAMES = optional(NAMES)
TOOLS = Check(
    "an iterable of nous_sched.Tool", lambda tools: isinstance(tools, Iterable) and not isinstance(tools, (str, bytes))
)
DISPATCH = Check("a callable accepting three positional arguments (tool, args, run_ctx)", _dispatch_shape)


def optional_names(value: Any) -> Any:
    """:func:`names`, except that ``None`` stays ``None`` (``allow=None``: every tool)."""
    return None if value is None else names(value)

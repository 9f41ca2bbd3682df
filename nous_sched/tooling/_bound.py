"""Bound arguments: values the host gives a tool that no caller sees or sends.

``Tool(bound={"api_key": key, "tenant": Bind("tenant")})`` binds each named
argument to a value, or to a :class:`Bind` reference filled per run from
``run_code(..., bind={"tenant": ...})``. A bound argument is taken out of the
schema every caller sees (:func:`caller_parameters`: the SDK, ``sdk.describe``
and ``sdk.search``, a model's direct tool list, the schema check of a call);
a call that names one itself is refused (:func:`passed_bound`). In every
record of the call (the audit, the approval question, live events, spans) it
stands as :data:`BOUND_MARKER`; the tool alone gets the value, put in by
:func:`with_bound` on the thread that runs it, after approval.

Values are the host's, never copied or checked against the crossing rules
(they never cross into the sandbox): the tool gets the very object bound.
A tool's error message that contains a bound string (or its JSON or
``repr`` spelling) has it replaced by the marker (:func:`redact`), so a
tool that echoes its arguments does not hand the secret to the program.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Iterator, Optional

import attrs

from ..errors import ConfigError
from ..events import FrozenDict

__all__ = [
    "Bind",
    "BOUND_MARKER",
    "MIN_REDACTED_CHARS",
    "bound_mapping",
    "caller_parameters",
    "passed_bound",
    "marked",
    "missing_binds",
    "with_bound",
    "redact",
    "secrets_of",
]

#: What a bound argument's value is in every record of a call: the audit, the
#: approval question, live events, spans, the CLI's output.
BOUND_MARKER = "[bound]"
#: A bound string shorter than this is not looked for in error messages (a
#: tenant ``"a"`` would blank every message); bind secrets longer than this.
MIN_REDACTED_CHARS = 3


@attrs.frozen
class Bind:
    """A bound argument's value taken from the run: ``Tool(bound={"tenant": Bind("tenant")})``
    gets ``bind["tenant"]`` of each run (``run_code(..., bind={"tenant": "acme"})``).

    A run whose tools hold a ``Bind`` its ``bind`` lacks is a
    :class:`~nous_sched.ConfigError` naming it, before the program starts.
    """

    name: str = attrs.field()

    @name.validator
    def _name(self, attribute: Any, value: Any) -> None:
        if not (isinstance(value, str) and value):
            raise ConfigError(f"Bind: `name` must be a non-empty string, got a {type(value).__name__}")


def bound_mapping(value: Any) -> Mapping[str, Any]:
    """``bound`` as a read-only mapping; a :class:`ConfigError` naming ``bound`` (never its values) when it is not one."""
    if value is None:
        return FrozenDict()
    if not isinstance(value, Mapping):
        raise ConfigError(f"Tool: `bound` must be a mapping of argument names to values, got a {type(value).__name__}")
    for key in value:
        if not (isinstance(key, str) and key):
            raise ConfigError(f"Tool: `bound` must name arguments by non-empty strings, got a {type(key).__name__} key")
    return FrozenDict(value)  # (read-only and picklable: a Tool crosses to a pickling executor)


def check_against(bound: Mapping[str, Any], parameters: Optional[Mapping[str, Any]], tool: str) -> None:
    """A :class:`ConfigError` naming ``bound`` for a bound name the tool's schema does not declare
    (when its schema lists ``properties``: a misspelt name would leave the real argument open to the program)."""
    if not bound or parameters is None:
        return
    properties = parameters.get("properties")
    if not isinstance(properties, Mapping):
        return
    unknown = sorted(name for name in bound if name not in properties)
    if unknown:
        raise ConfigError(
            f"Tool {tool!r}: `bound` names {unknown[0]!r}, which is not among its parameters "
            f"({', '.join(sorted(map(str, properties))) or 'none'})"
        )


def caller_parameters(tool: Any) -> Any:
    """The schema of the arguments a caller sends ``tool``: its ``parameters`` without the bound ones.

    Any object with ``parameters`` (and optionally ``bound``); the same object
    as ``parameters`` when nothing is bound. Never raises.
    """
    parameters = getattr(tool, "parameters", None)
    bound = getattr(tool, "bound", None)
    if not bound or not isinstance(parameters, Mapping):
        return parameters
    seen = getattr(tool, "caller_schema", None)
    if seen is not None:
        return seen
    return without(parameters, bound)


def without(parameters: Mapping[str, Any], bound: Mapping[str, Any]) -> Mapping[str, Any]:
    """``parameters`` with the names in ``bound`` out of its ``properties`` and ``required``."""
    schema = dict(parameters)
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        schema["properties"] = {k: v for k, v in properties.items() if k not in bound}
    required = schema.get("required")
    if isinstance(required, (list, tuple)):
        schema["required"] = [name for name in required if name not in bound]
    return schema


def passed_bound(tool: Any, args: Mapping[str, Any]) -> Optional[str]:
    """The refusal for a call that sends a bound argument itself, or ``None``."""
    bound = getattr(tool, "bound", None)
    if not bound:
        return None
    sent = sorted(name for name in args if name in bound)
    if not sent:
        return None
    names = ", ".join(repr(name) for name in sent)
    return (
        f"{names} {'is a bound argument' if len(sent) == 1 else 'are bound arguments'} of this tool: "
        "the host supplies it, so a call may not pass it; leave it out"
    )


def marked(tool: Any, args: dict[str, Any]) -> dict[str, Any]:
    """``args`` with each bound argument as :data:`BOUND_MARKER`: what every record of the call shows."""
    bound = getattr(tool, "bound", None)
    if not bound:
        return args
    return {**args, **dict.fromkeys(bound, BOUND_MARKER)}


def missing_binds(tools: Any, bind: Optional[Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """``(tool, argument, bind name)`` for each :class:`Bind` of ``tools`` that ``bind`` lacks."""
    have = bind if bind is not None else {}
    missing = []
    for tool in tools:
        for argument, value in (getattr(tool, "bound", None) or {}).items():
            if isinstance(value, Bind) and value.name not in have:
                missing.append((tool.name, argument, value.name))
    return missing


def values(tool: Any, bind: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """The bound arguments of ``tool`` with each :class:`Bind` filled from ``bind``.

    :raises ConfigError: a :class:`Bind` that ``bind`` lacks (a run checks this before it starts).
    """
    out: dict[str, Any] = {}
    for argument, value in tool.bound.items():
        if isinstance(value, Bind):
            if bind is None or value.name not in bind:
                raise ConfigError(
                    f"tool {tool.name!r}: bound argument {argument!r} is Bind({value.name!r}), "
                    f"which the run's `bind` does not hold"
                )
            value = bind[value.name]
        out[argument] = value
    return out


def with_bound(tool: Any, args: dict[str, Any], bind: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """``args`` (the call's, markers in place) with the bound values: what the tool itself gets."""
    if not getattr(tool, "bound", None):
        return args
    return {**args, **values(tool, bind)}


def _strings(value: Any, depth: int = 0) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, bytes):
        yield value.decode("utf-8", "replace")
    elif depth < 8 and isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item, depth + 1)
    elif depth < 8 and isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _strings(item, depth + 1)


def _whole(value: Any) -> Iterator[str]:
    """A bound value as an error message would spell it whole: its ``str`` and ``repr``, a bytes' contents."""
    if isinstance(value, str):
        return
    for spell in (str, repr):
        try:
            yield spell(value)
        except Exception:  # a value whose repr raises (or recurses too deep) is not said by one either
            pass
    if isinstance(value, bytes):
        yield repr(value)[2:-1]
        yield value.decode("latin-1")


def secrets_of(bound_values: Mapping[str, Any]) -> list[str]:
    """Every spelling of each bound value worth looking for, longest first: each string in it
    (as is, JSON-escaped, ``repr``'d) and the value whole (its ``str`` and ``repr``)."""
    found: set[str] = {
        text for value in bound_values.values() for text in _whole(value) if len(text) >= MIN_REDACTED_CHARS
    }
    for text in _strings(list(bound_values.values())):
        if len(text) < MIN_REDACTED_CHARS:
            continue
        found.add(text)
        for spelling in (
            json.dumps(text)[1:-1],
            json.dumps(text, ensure_ascii=False)[1:-1],
            repr(text)[1:-1],
            text.encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
        ):
            if len(spelling) >= MIN_REDACTED_CHARS:
                found.add(spelling)
    return sorted(found, key=len, reverse=True)


def redact(text: str, spellings: list[str]) -> str:
    """``text`` with every one of ``spellings`` (:func:`secrets_of`) replaced by :data:`BOUND_MARKER`."""
    for spelling in spellings:
        if spelling in text:
            text = text.replace(spelling, BOUND_MARKER)
    return text

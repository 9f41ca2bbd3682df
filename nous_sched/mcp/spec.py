"""What to connect to, and how far to trust it: :class:`ServerSpec` and :class:`ToolOverride`.

Plain frozen values, validated at the edge (a bad option is a
:class:`~nous_sched.ConfigError` naming it); nothing here imports the MCP SDK.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import attrs

from .._validators import BOOL, OPTIONAL_STR, Check, fail, optional, shown
from ..errors import ConfigError
from ..throttle import Throttle
from ..tooling import THROTTLES, Tool, as_throttles

__all__ = ["ServerSpec", "ToolOverride", "NAME_PATTERN"]

#: A server name: it prefixes tool names, so it keeps them valid for every provider.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_OVERRIDE_KEYS = ("parallel", "requires_approval", "read_only", "name", "bound", "callers")
_OPTIONAL_BOOL = optional(BOOL)


_TOOL_NAME = optional(
    Check("1-64 letters, digits, '_' or '-'", lambda v: isinstance(v, str) and bool(NAME_PATTERN.match(v)))
)


def _bound_or_none(value: Any) -> Optional[Mapping[str, Any]]:
    # Tool's own check (a ConfigError naming `bound`, never its values), on a stand-in tool.
    return None if value is None else _as_tool_would(bound=value).bound


def _callers_or_none(value: Any) -> Optional[frozenset[str]]:
    return None if value is None else _as_tool_would(callers=value).callers


def _as_tool_would(**field: Any) -> Tool:
    try:
        return Tool("override", _nothing, **field)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("Tool:", "ToolOverride:", 1)) from None


def _nothing(args: dict[str, Any]) -> None:
    return None


def _bound_repr(bound: Any) -> str:
    return "None" if bound is None else "{" + ", ".join(f"{name!r}: <bound>" for name in bound) + "}"


@attrs.frozen
class ToolOverride:
    """The caller's word on one tool, which beats anything the server says.

    ``parallel=True`` makes every call concurrency-safe, ``False`` exclusive;
    ``requires_approval`` forces approval on or off. ``read_only=True`` is the
    operator's word that the tool only reads: its calls run in parallel
    without approval, as a trusted server's ``readOnlyHint`` makes them
    (``read_only=False`` makes them exclusive). ``parallel`` and
    ``requires_approval``, when given, beat ``read_only``. ``None`` leaves the
    decision to the server's annotations (trusted servers) or the fail-safe
    default (untrusted ones: exclusive, approval needed). ``name`` renames the
    tool (the server's ``prefix``, if any, still goes before it): to resolve a
    clash between servers, or to give a program a better name; calls still
    reach the server's own tool.

    ``bound`` and ``callers`` are :class:`~nous_sched.Tool`'s: arguments the
    host supplies (a value, or a :class:`~nous_sched.Bind` filled from the
    run's ``bind``), hidden from every caller and sent to the server; and who
    may call the tool (``{"model"}``, ``{"code"}`` or both). ``None`` leaves
    nothing bound and both callers. The ``repr`` shows bound names only.
    """

    parallel: Optional[bool] = attrs.field(default=None, validator=_OPTIONAL_BOOL)
    requires_approval: Optional[bool] = attrs.field(default=None, validator=_OPTIONAL_BOOL)
    read_only: Optional[bool] = attrs.field(default=None, kw_only=True, validator=_OPTIONAL_BOOL)
    name: Optional[str] = attrs.field(default=None, kw_only=True, validator=_TOOL_NAME)
    bound: Optional[Mapping[str, Any]] = attrs.field(
        default=None, kw_only=True, converter=_bound_or_none, repr=_bound_repr
    )
    callers: Optional[frozenset[str]] = attrs.field(default=None, kw_only=True, converter=_callers_or_none)

    @classmethod
    def coerce(cls, value: Any, where: str) -> "ToolOverride":
        """``value`` itself, or a ``ToolOverride`` built from a mapping of its fields."""
        if isinstance(value, ToolOverride):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where} must be a ToolOverride or a mapping of its fields, got {shown(value)}")
        unknown = sorted(set(value) - set(_OVERRIDE_KEYS))
        if unknown:
            raise ConfigError(f"{where}: unknown key {unknown[0]!r}; expected {', '.join(_OVERRIDE_KEYS)}")
        try:
            return cls(**value)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None


def _is_target(value: Any) -> bool:
    if isinstance(value, str):
        return value.startswith(("http://", "https://"))
    if isinstance(value, (list, tuple)):
        return bool(value) and all(isinstance(part, str) and part for part in value)
    return value is not None and not isinstance(value, (bytes, Mapping))


def _is_string_map(value: Any) -> bool:
    return isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


_TARGET = Check(
    "an http:// or https:// URL, a command as a non-empty list of strings (e.g. ['python', 'server.py']), "
    "or an MCP SDK server object",
    _is_target,
)
_NAME = optional(
    Check("1-64 letters, digits, '_' or '-'", lambda v: isinstance(v, str) and bool(NAME_PATTERN.match(v)))
)
_STRING_MAP = optional(Check("a mapping of strings to strings", _is_string_map))


def _overrides(value: Any) -> Mapping[str, ToolOverride]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        fail("ServerSpec", "overrides", value, "a mapping of tool names to ToolOverride (or mappings of its fields)")
    return {str(k): ToolOverride.coerce(v, f"ServerSpec: overrides[{k!r}]") for k, v in value.items()}


def _command(value: Any) -> Any:
    # A tuple, so the frozen value stays hashable and nobody edits the command after the fact.
    return tuple(value) if isinstance(value, list) else value


@attrs.frozen
class ServerSpec:
    """One MCP server to connect to.

    ``target`` is what to connect to:

    * an ``http://`` or ``https://`` URL: Streamable HTTP (``headers`` are
      sent with every request: put credentials here, never in the URL);
    * a command, as a list of strings (``["python", "server.py"]``): started
      as a subprocess and spoken to over its stdin/stdout (``env`` is added to
      a minimal inherited environment, ``cwd`` is its working directory);
    * an MCP SDK server object (``MCPServer`` or a low-level ``Server``):
      connected in-process, for tests and embedding.

    ``name`` is the server's name in messages and in :attr:`Connection.servers`
    (by default the name the server reports). ``prefix``, when given, goes
    before each of its tools' names (``<prefix>__<tool>``) however many
    servers are connected, so a program's tool names do not change when a
    server is added; by default tools keep their own names, and two servers
    listing the same name is a :class:`ConfigError` at connect that names
    both fixes (``prefix=``, or ``ToolOverride(name=...)`` for one tool).

    ``trusted`` says whether the server's tool annotations may drive
    decisions. Untrusted (the default): every call is exclusive and needs
    approval (fail safe), unless an override says otherwise. Trusted:
    ``readOnlyHint`` makes calls concurrency-safe and ``destructiveHint``
    (true unless the tool is read-only or says otherwise, as MCP defaults
    it) makes them require approval.
    ``idempotentHint`` never makes a call parallel. ``overrides`` maps a
    tool's own (unprefixed) name to a :class:`ToolOverride` or a mapping of
    its fields; naming a tool the server does not list is an error.

    ``throttles`` (:class:`~nous_sched.Throttle`) apply to every tool of the
    server: each call waits for a place in all of them, shared with every
    other run that names them.
    """

    target: Any = attrs.field(validator=_TARGET, converter=_command)
    name: Optional[str] = attrs.field(default=None, kw_only=True, validator=_NAME)
    prefix: Optional[str] = attrs.field(default=None, kw_only=True, validator=_NAME)
    trusted: bool = attrs.field(default=False, kw_only=True, validator=BOOL)
    overrides: Mapping[str, ToolOverride] = attrs.field(factory=dict, kw_only=True, converter=_overrides)
    env: Optional[Mapping[str, str]] = attrs.field(default=None, kw_only=True, validator=_STRING_MAP)
    cwd: Optional[str] = attrs.field(default=None, kw_only=True, validator=OPTIONAL_STR)
    headers: Optional[Mapping[str, str]] = attrs.field(default=None, kw_only=True, validator=_STRING_MAP)
    throttles: tuple[Throttle, ...] = attrs.field(default=(), kw_only=True, converter=as_throttles, validator=THROTTLES)

    @property
    def transport(self) -> str:
        """``"http"``, ``"stdio"`` or ``"in-process"``."""
        if isinstance(self.target, str):
            return "http"
        if isinstance(self.target, Sequence):
            return "stdio"
        return "in-process"

    def describe(self) -> str:
        """The target as a person reads it (a URL without its query, a command line, a server object)."""
        if self.transport == "http":
            return str(self.target).split("?", 1)[0]
        if self.transport == "stdio":
            return " ".join(self.target)
        return f"in-process {type(self.target).__name__}"

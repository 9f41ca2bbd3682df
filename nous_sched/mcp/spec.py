"""What to connect to, and how far to trust it: :class:`ServerSpec` and :class:`ToolOverride`.

Plain frozen values, validated at the edge (a bad option is a
:class:`~nous_sched.ConfigError` naming it); nothing here imports the MCP SDK.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import attrs

from ..errors import ConfigError

__all__ = ["ServerSpec", "ToolOverride", "NAME_PATTERN"]

#: A server name: it prefixes tool names, so it keeps them valid for every provider.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_OVERRIDE_KEYS = ("parallel", "requires_approval")


def _optional_bool(inst: Any, attr: attrs.Attribute, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"ToolOverride: `{attr.name}` must be True, False or None, got {value!r}")


@attrs.frozen
class ToolOverride:
    """The caller's word on one tool, which beats anything the server says.

    ``parallel=True`` makes every call concurrency-safe, ``False`` exclusive;
    ``requires_approval`` forces approval on or off. ``None`` leaves the
    decision to the server's annotations (trusted servers) or the default
    (untrusted ones).
    """

    parallel: Optional[bool] = attrs.field(default=None, validator=_optional_bool)
    requires_approval: Optional[bool] = attrs.field(default=None, validator=_optional_bool)

    @classmethod
    def coerce(cls, value: Any, where: str) -> "ToolOverride":
        """``value`` itself, or a ``ToolOverride`` built from a mapping of its fields."""
        if isinstance(value, ToolOverride):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a ToolOverride or a mapping, got {type(value).__name__}")
        unknown = sorted(set(value) - set(_OVERRIDE_KEYS))
        if unknown:
            raise ConfigError(f"{where}: unknown key {unknown[0]!r}; expected {' or '.join(_OVERRIDE_KEYS)}")
        try:
            return cls(**value)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None


def _target(inst: Any, attr: attrs.Attribute, value: Any) -> None:
    if isinstance(value, str):
        if not value.startswith(("http://", "https://")):
            raise ConfigError(
                f"ServerSpec: a string `target` must be an http:// or https:// URL, got {value!r}; "
                "pass a command to start as a list of strings, e.g. ['python', 'server.py']"
            )
    elif isinstance(value, (list, tuple)):
        if not value or not all(isinstance(part, str) and part for part in value):
            raise ConfigError(f"ServerSpec: a command `target` must be a non-empty list of strings, got {value!r}")
    elif value is None or isinstance(value, (bytes, Mapping)):
        raise ConfigError(
            f"ServerSpec: `target` must be a URL, a command (list of strings) or an MCP SDK server object, "
            f"got {type(value).__name__}"
        )


def _name(inst: Any, attr: attrs.Attribute, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not NAME_PATTERN.match(value)):
        raise ConfigError(f"ServerSpec: `name` must be 1-64 letters, digits, '_' or '-', got {value!r}")


def _bool(inst: Any, attr: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"ServerSpec: `{attr.name}` must be True or False, got {value!r}")


def _optional_str(inst: Any, attr: attrs.Attribute, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"ServerSpec: `{attr.name}` must be a string or None, got {value!r}")


def _string_map(inst: Any, attr: attrs.Attribute, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigError(f"ServerSpec: `{attr.name}` must map strings to strings, got {value!r}")


def _overrides(value: Any) -> Mapping[str, ToolOverride]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"ServerSpec: `overrides` must map tool names to ToolOverride, got {type(value).__name__}")
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

    ``name`` prefixes the tool names when several servers are connected
    (``<name>__<tool>``); by default it is the name the server reports.

    ``trusted`` says whether the server's tool annotations may drive
    decisions. Untrusted (the default): every call is exclusive and approval
    follows the policy alone. Trusted: ``readOnlyHint`` makes calls
    concurrency-safe and ``destructiveHint`` (true unless the tool is
    read-only or says otherwise) makes them require approval.
    ``idempotentHint`` never makes a call parallel. ``overrides`` maps a
    tool's own (unprefixed) name to a :class:`ToolOverride` or a mapping of
    its fields; naming a tool the server does not list is an error.
    """

    target: Any = attrs.field(validator=_target, converter=_command)
    name: Optional[str] = attrs.field(default=None, kw_only=True, validator=_name)
    trusted: bool = attrs.field(default=False, kw_only=True, validator=_bool)
    overrides: Mapping[str, ToolOverride] = attrs.field(factory=dict, kw_only=True, converter=_overrides)
    env: Optional[Mapping[str, str]] = attrs.field(default=None, kw_only=True, validator=_string_map)
    cwd: Optional[str] = attrs.field(default=None, kw_only=True, validator=_optional_str)
    headers: Optional[Mapping[str, str]] = attrs.field(default=None, kw_only=True, validator=_string_map)

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
            return self.target.split("?", 1)[0]
        if self.transport == "stdio":
            return " ".join(self.target)
        return f"in-process {type(self.target).__name__}"

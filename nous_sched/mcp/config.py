"""Servers from a JSON file, in the ``mcpServers`` format MCP clients use.

.. code-block:: json

   {
     "mcpServers": {
       "files": {"command": "python", "args": ["files_server.py"], "env": {"ROOT": "/srv"},
                 "trusted": true, "overrides": {"delete": {"requires_approval": true}}},
       "search": {"url": "https://search.example/mcp", "headers": {"Authorization": "Bearer ..."}}
     }
   }

An entry has either ``command`` (with optional ``args``, ``env``, ``cwd``) or
``url`` (with optional ``headers``), plus nous_sched's own optional keys
``trusted``, ``overrides`` and ``prefix`` (see :class:`~nous_sched.mcp.ServerSpec`). The
key is the server's name. Any other key is an error, so a typo never silently
drops a setting such as ``trusted`` or an override.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

from ..errors import ConfigError
from ..gate.policy import PermissionPolicy
from .spec import ServerSpec

__all__ = ["load_config", "parse_config", "load_policy"]

_KEYS = {"command", "args", "env", "cwd", "url", "headers", "trusted", "overrides", "prefix"}


def load_config(path: Union[str, Path]) -> list[ServerSpec]:
    """The servers listed in the JSON file at ``path``, in file order.

    :raises ConfigError: the file cannot be read or parsed, or an entry is
        malformed; the message names the file and the entry.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"MCP config {path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"MCP config {path}: not UTF-8 text ({exc.reason})") from None
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"MCP config {path}: not JSON: {exc}") from None
    return parse_config(document, source=str(path))


def parse_config(document: Any, *, source: str = "MCP config") -> list[ServerSpec]:
    """The servers of an already-parsed config ``document`` (see the module docstring)."""
    servers = document.get("mcpServers") if isinstance(document, Mapping) else None
    if not isinstance(servers, Mapping):
        raise ConfigError(f'{source}: expected an object with an "mcpServers" object of servers')
    return [_entry(name, entry, f"{source}: mcpServers.{name}") for name, entry in servers.items()]


def _entry(name: str, entry: Any, where: str) -> ServerSpec:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: expected an object, got {type(entry).__name__}")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; expected some of {', '.join(sorted(_KEYS))}")
    if ("command" in entry) == ("url" in entry):
        raise ConfigError(f'{where}: give exactly one of "command" (a server to start) or "url" (a running server)')
    if "url" in entry:
        for key in ("args", "env", "cwd"):
            if key in entry:
                raise ConfigError(f'{where}: "{key}" goes with "command", not "url"')
        target: Any = entry["url"]
        if not isinstance(target, str):
            raise ConfigError(f'{where}: "url" must be a string')
    else:
        if "headers" in entry:
            raise ConfigError(f'{where}: "headers" goes with "url", not "command"')
        command, args = entry["command"], entry.get("args", [])
        if not isinstance(command, str) or not command:
            raise ConfigError(f'{where}: "command" must be a non-empty string')
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ConfigError(f'{where}: "args" must be a list of strings')
        target = [command, *args]
    try:
        return ServerSpec(
            target,
            name=name,
            trusted=entry.get("trusted", False),
            overrides=entry.get("overrides"),
            prefix=entry.get("prefix"),
            env=entry.get("env"),
            cwd=entry.get("cwd"),
            headers=entry.get("headers"),
        )
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


_POLICY_KEYS = ("allow", "deny", "require_approval", "approval_categories", "approve")


def load_policy(path: Union[str, Path]) -> tuple[PermissionPolicy, frozenset[str]]:
    """The policy in the JSON file at ``path``, and the tools it pre-approves.

    The file is an object with any of ``allow`` (``null`` or a list: only
    these tools are granted), ``deny``, ``require_approval``,
    ``approval_categories`` (lists of names, as :class:`~nous_sched.PermissionPolicy`
    takes them) and ``approve``: tools whose calls are approved without
    asking anyone. An unknown key is an error.
    """
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"policy {path}: cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"policy {path}: not JSON: {exc}") from None
    if not isinstance(document, Mapping):
        raise ConfigError(f"policy {path}: expected a JSON object with some of {', '.join(_POLICY_KEYS)}")
    unknown = sorted(set(document) - set(_POLICY_KEYS))
    if unknown:
        raise ConfigError(f"policy {path}: unknown key {unknown[0]!r}; expected some of {', '.join(_POLICY_KEYS)}")
    for key, value in document.items():
        if value is None and key == "allow":
            continue
        if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
            raise ConfigError(f"policy {path}: {key!r} must be a list of strings")
    fields = {k: v for k, v in document.items() if k != "approve"}
    return PermissionPolicy(**fields), frozenset(document.get("approve", ()))

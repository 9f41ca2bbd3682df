"""Code Mode over MCP: MCP servers' tools as :class:`~nous_sched.Tool` values, and ``run_code`` served over MCP.

Needs the MCP SDK: ``pip install -e '.[mcp]'``. Importing this package
does not import the SDK; the first use of a name below does, and says how to
install it when it is missing.

* :func:`connect` opens a :class:`Connection` to a set of servers (a URL, a
  command to start, or an SDK server object in-process, each described by a
  :class:`ServerSpec`); ``conn.tools()`` are ordinary tools for
  :func:`~nous_sched.run_code`.
* :func:`load_config` reads servers from a JSON file in the ``mcpServers``
  format MCP clients use.
* :class:`CodeModeServer` is an MCP server with one ``run_code`` tool over
  a set of tools; ``nous-sched serve-mcp`` runs one. :class:`BearerTokens`
  is a token verifier over fixed named tokens for its HTTP app.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .._extras import install_command

if TYPE_CHECKING:
    from .access import BearerTokens
    from .client import Connection, connect
    from .config import load_config
    from .serve import CodeModeServer
    from .spec import ServerSpec, ToolOverride

__all__ = [
    "connect",
    "Connection",
    "ServerSpec",
    "ToolOverride",
    "load_config",
    "CodeModeServer",
    "BearerTokens",
    "INSTALL_HINT",
]

#: What to run when the MCP SDK is missing.
INSTALL_HINT = f"nous_sched.mcp needs the MCP SDK; install it with: {install_command('mcp')}"

# name: (module, whether it needs the SDK). All lazy, so the CLI's parser pays nothing for MCP.
_LAZY = {
    "connect": (".client", True),
    "Connection": (".client", True),
    "CodeModeServer": (".serve", True),
    "BearerTokens": (".access", True),
    "ServerSpec": (".spec", False),
    "ToolOverride": (".spec", False),
    "load_config": (".config", False),
}


def require_sdk() -> None:
    """Import the MCP SDK, or raise ``ImportError`` saying how to install it."""
    try:
        importlib.import_module("mcp")
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from exc


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'nous_sched.mcp' has no attribute {name!r}")
    module, needs_sdk = _LAZY[name]
    if needs_sdk:
        require_sdk()
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value

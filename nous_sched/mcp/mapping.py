"""How an MCP tool becomes a :class:`~nous_sched.Tool`: its name, its flags, its result.

Pure functions over the SDK's values (read by attribute, so a test can hand in
any object of the same shape); no threads, no I/O.

Annotations fail safe. The SDK says hints from an untrusted server must not
drive decisions, so for an untrusted server every call is exclusive and
needs approval. For a trusted server, MCP's own defaults fill in what a tool
does not say (``readOnlyHint`` false, ``destructiveHint`` true):

* ``readOnlyHint: true`` makes every call concurrency-safe, needing no approval;
* otherwise ``destructiveHint`` (true when absent, as the spec defaults it)
  makes every call require approval; a tool that says ``false`` is additive
  and runs exclusive without approval;
* ``idempotentHint`` says a retry is harmless, not that two calls may
  overlap: it never makes a call parallel. ``openWorldHint`` changes nothing.

A :class:`~nous_sched.mcp.ToolOverride` beats all of these, for trusted and
untrusted servers alike. Every :class:`Flags` carries ``reason``, the words
the serve-mcp banner, the trail and the CLI timeline show for the decision.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

import attrs

from ..errors import ToolError
from .spec import ToolOverride

__all__ = [
    "Flags",
    "flags",
    "UNTRUSTED",
    "DESTRUCTIVE_DEFAULT",
    "result_value",
    "error_text",
    "tool_name",
    "stable_name",
    "server_name",
    "SEPARATOR",
]

#: Joins a server's prefix and its tool's name.
SEPARATOR = "__"
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]+")


#: Why an untrusted server's tool is exclusive and needs approval.
UNTRUSTED = "untrusted server"
#: Why a trusted server's tool that says nothing is exclusive and needs approval.
DESTRUCTIVE_DEFAULT = "destructive (MCP default)"


@attrs.frozen
class Flags:
    """What the lane and the approval gate make of one tool, and why (``reason``)."""

    parallel: bool
    requires_approval: bool
    category: str
    reason: str = ""


def flags(annotations: Any, *, trusted: bool, override: Optional[ToolOverride] = None) -> Flags:
    """The :class:`Flags` for a tool with ``annotations`` (an SDK ``ToolAnnotations`` or ``None``).

    ``category`` is ``"read"`` for a call that may run in parallel, else
    ``"write"``, so ``PermissionPolicy(approval_categories={"write"})`` gates
    everything that is not known to be read-only. ``reason`` says in a few
    words what decided (``"untrusted server"``, ``"destructive (MCP
    default)"``, ``"read-only (annotated)"``, and ``"...; overridden: ..."``
    when an override changed something).
    """
    parallel, approval, reason = _by_server(annotations, trusted)
    if override is not None:
        parallel, approval, reason = _overridden(override, parallel, approval, reason)
    return Flags(parallel=parallel, requires_approval=approval, category="read" if parallel else "write", reason=reason)


def _by_server(annotations: Any, trusted: bool) -> tuple[bool, bool, str]:
    """(parallel, requires approval, why) from the server's word, as far as it is trusted."""
    if not trusted:
        return False, True, UNTRUSTED
    if annotations is None:
        return False, True, DESTRUCTIVE_DEFAULT
    if getattr(annotations, "read_only_hint", None) is True:
        return True, False, "read-only (annotated)"
    destructive = getattr(annotations, "destructive_hint", None)
    if destructive is None:
        return False, True, DESTRUCTIVE_DEFAULT
    if destructive is not False:
        return False, True, "destructive (annotated)"
    return False, False, "not read-only, not destructive (annotated)"


def _overridden(override: ToolOverride, parallel: bool, approval: bool, reason: str) -> tuple[bool, bool, str]:
    said = []
    if override.read_only is not None:
        parallel, approval = override.read_only, approval and not override.read_only
        said.append(f"read_only={override.read_only}")
    if override.parallel is not None:
        parallel = override.parallel
        said.append(f"parallel={override.parallel}")
    if override.requires_approval is not None:
        approval = override.requires_approval
        said.append(f"requires_approval={override.requires_approval}")
    if said:
        reason = f"{reason}; overridden: {', '.join(said)}"
    return parallel, approval, reason


def result_value(result: Any) -> Any:
    """The JSON value a program receives for an SDK ``CallToolResult``.

    ``structured_content`` when the server sent it; otherwise each content
    block's value (a text block's text parsed as JSON where it parses, else
    the text; any other block as its JSON form), one block as itself, several
    as a list, none as ``None``.

    :raises ToolError: the result has ``is_error`` set; the message is the
        server's text.
    """
    if getattr(result, "is_error", False):
        raise ToolError(error_text(result))
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        return structured
    values = [_block_value(block) for block in getattr(result, "content", None) or ()]
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def error_text(result: Any) -> str:
    """The text blocks of an error result, joined by newlines (a fixed phrase when there are none)."""
    texts = [block.text for block in getattr(result, "content", None) or () if getattr(block, "type", None) == "text"]
    text = "\n".join(t for t in texts if t)
    return text or "the MCP tool reported an error without a message"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _block_value(block: Any) -> Any:
    if getattr(block, "type", None) == "text":
        text = block.text
        try:
            # NaN and the infinities are not JSON: such a text stays text.
            return json.loads(text, parse_constant=_no_constant)
        except ValueError:
            return text
    return block.model_dump(mode="json", by_alias=True, exclude_none=True)


def tool_name(server: str, tool: str, *, namespaced: bool) -> str:
    """``tool``, or ``<server>__<tool>`` when several servers share one tool set."""
    return f"{server}{SEPARATOR}{tool}" if namespaced else tool


def stable_name(prefix: Optional[str], tool: str, override: Optional[ToolOverride] = None) -> str:
    """The name a program calls an MCP tool by: the override's ``name`` or the
    tool's own, after ``<prefix>__`` when the server has a prefix. It does not
    depend on which other servers are connected."""
    name = override.name if override is not None and override.name else tool
    return f"{prefix}{SEPARATOR}{name}" if prefix else name


def server_name(reported: Any, fallback: str) -> str:
    """A usable server name from the one a server reports: runs of other characters become ``_``."""
    name = _NOT_NAME.sub("_", reported).strip("_")[:64] if isinstance(reported, str) else ""
    return name or fallback

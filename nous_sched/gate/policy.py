"""Which tools a program may call, and which calls need a human first.

The same policy that governs a model's direct tool calls governs the calls its
program makes: a denied tool is still *declared* to the program (so it gets a
clear refusal, not a ``TypeError``) but its calls never reach the scheduler;
an approval-gated tool asks the run's approval handler on every call, with
the real name and arguments.
"""

from __future__ import annotations

from typing import Iterable, Optional

import attrs

from .. import _validators as v
from .._validators import require
from ..outcome import quote_name
from ..tooling import Tool
from .dispatch import needs_approval

__all__ = ["PermissionPolicy", "approval_names", "denied_message", "partition"]


@attrs.frozen
class PermissionPolicy:
    """``allow`` (``None``: every tool) minus ``deny``; approval by name or category.

    ``require_approval`` names tools whose every call needs approval;
    ``approval_categories`` does the same by ``Tool.category`` (``"execute"``,
    say). A tool's own ``requires_approval=True`` always applies. Each field
    takes one name or an iterable of names and is stored as a ``frozenset``.

    :raises ConfigError: a field is neither a str nor an iterable of str.
    """

    allow: Optional[frozenset[str]] = attrs.field(default=None, converter=v.optional_names, validator=v.OPTIONAL_NAMES)
    deny: frozenset[str] = attrs.field(default=frozenset(), converter=v.names, validator=v.NAMES)
    require_approval: frozenset[str] = attrs.field(default=frozenset(), converter=v.names, validator=v.NAMES)
    approval_categories: frozenset[str] = attrs.field(default=frozenset(), converter=v.names, validator=v.NAMES)

    def permits(self, tool: Tool) -> bool:
        name = tool.name
        if name in self.deny:
            return False
        return self.allow is None or name in self.allow

    def needs_approval(self, tool: Tool) -> bool:
        """Whether every call of ``tool`` needs approval under this policy (the one rule,
        ``nous_sched.gate.dispatch.needs_approval``: the tool's own ``requires_approval`` counts)."""
        return needs_approval(tool, self.require_approval, self.approval_categories)


def approval_names(policy: Optional[PermissionPolicy], tools: Iterable[Tool]) -> frozenset[str]:
    """The names of ``tools`` whose calls ``policy`` makes need approval (none without
    one): a run's :attr:`~nous_sched.RunContext.require_approval`, made once at its door."""
    if policy is None:
        return frozenset()
    return frozenset(tool.name for tool in tools if policy.needs_approval(tool))


def denied_message(name: str) -> str:
    return f"tool {quote_name(name)} is denied by the permission policy"


def partition(
    tools: Iterable[Tool], policy: Optional[PermissionPolicy], owner: str
) -> tuple[dict[str, Tool], dict[str, Tool]]:
    """Granted and denied tools by name; first occurrence of a name wins.

    :raises ConfigError: ``tools`` is not an iterable of :class:`Tool` (the
        message is ``owner``'s).
    """
    require(owner, "tools", tools, v.TOOLS)
    granted: dict[str, Tool] = {}
    denied: dict[str, Tool] = {}
    for tool in tools:
        if not isinstance(tool, Tool):
            v.fail(owner, "tools", tool, "an iterable of nous_sched.Tool only")
        if tool.name in granted or tool.name in denied:
            continue
        if policy is None or policy.permits(tool):
            granted[tool.name] = tool
        else:
            denied[tool.name] = tool
    return granted, denied

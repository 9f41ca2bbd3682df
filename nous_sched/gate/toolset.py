"""What a run derives from its tool set, made once per tool set and shared by its runs.

A run's tools and its policy decide its granted and denied tools, their
sorted names, which of them need approval and which :class:`~nous_sched.Bind`
names the run's ``bind`` must hold. Made afresh, that is a few microseconds
per tool on every run, whatever the program calls; an agent starts its runs
with one tool set again and again, so :func:`tool_set` keeps the last
:data:`TOOL_SETS` of them.

Correct by construction: a :class:`~nous_sched.Tool` is frozen, so the
same tool objects (by identity, in the same order) under an equal policy
(a frozen value, compared by its fields) always derive the same values. The
key is exactly those: nothing mutable is looked at. A tool's
``parameters``, ``returns`` and ``bound`` mappings are its own values, not to be
changed in place once the tool is made (:class:`~nous_sched.Tool` says so).
What depends on the run itself (its ``bind`` values, its state, its
program) is never part of what is kept: :meth:`ToolSet.missing_binds` takes
the run's ``bind`` and looks only at the few ``Bind`` references kept.

Bounded: at most :data:`TOOL_SETS` sets and :data:`CACHED_TOOLS` tools in
all are kept (a larger set is derived afresh for every run, and kept by
none); each kept set holds its tools alive, as its granted dict must, so
weak references would save nothing. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from operator import is_
from typing import Any, Iterable, Optional

from .. import _validators as v
from ..tooling import Bind, Tool
from .policy import PermissionPolicy, approval_names, partition

__all__ = ["ToolSet", "tool_set", "TOOL_SETS", "CACHED_TOOLS", "cached_sets", "clear"]

#: How many tool sets (with their policies) :func:`tool_set` keeps.
TOOL_SETS = 16
#: How many tools the kept sets may hold in all; a set past it is never kept.
CACHED_TOOLS = 100_000

_lock = threading.Lock()  # guards _sets, _held, _by_tuple, _by_list and each kept set's ``alias``
# (ids of the tools in order, policy) -> the ToolSet, which holds those tools: no id in a live key is reused.
_sets: OrderedDict[tuple[tuple[int, ...], Optional[PermissionPolicy]], ToolSet] = OrderedDict()
_held = 0  # tools held by _sets' values
# (id of the tuple a kept set was made from, policy) -> that set (whose ``tools`` is that tuple, held).
_by_tuple: dict[tuple[int, Optional[PermissionPolicy]], ToolSet] = {}
# (id of the list a kept set was last asked for by, policy) -> that set: at most one per set (its
# ``alias``). The list is not held, so its id may be reused: an entry is only a guess, which the
# list's items, the set's tools by identity, confirm.
_by_list: dict[tuple[int, Optional[PermissionPolicy]], ToolSet] = {}


class ToolSet:
    """A tool set under one policy, and what every run of it derives. Read-only.

    ``granted`` and ``denied`` are :func:`~nous_sched.gate.policy.partition`'s
    (shared by every run of the set: never to be changed); ``names`` every
    name, sorted; ``require_approval`` the granted tools whose calls the policy
    makes need approval; ``binds`` ``(tool, argument, Bind name)`` of each
    :class:`~nous_sched.Bind` among the granted tools' ``bound``. (``alias``
    is :func:`tool_set`'s own, under its lock: not part of the set.)
    """

    __slots__ = ("tools", "policy", "granted", "denied", "names", "require_approval", "binds", "alias")

    def __init__(self, tools: tuple[Tool, ...], policy: Optional[PermissionPolicy], owner: str) -> None:
        self.tools = tools
        self.policy = policy
        self.granted, self.denied = partition(tools, policy, owner)
        self.names: tuple[str, ...] = tuple(sorted({*self.granted, *self.denied}))
        self.require_approval = approval_names(policy, self.granted.values())
        self.binds: tuple[tuple[str, str, str], ...] = tuple(
            (tool.name, argument, value.name)
            for tool in self.granted.values()
            for argument, value in tool.bound.items()
            if isinstance(value, Bind)
        )
        self.alias: Optional[tuple[int, Optional[PermissionPolicy]]] = None  # its key in _by_list, if any

    def missing_binds(self, bind: Optional[Mapping[str, Any]]) -> list[tuple[str, str, str]]:
        """``(tool, argument, Bind name)`` for each :class:`~nous_sched.Bind` of the granted tools
        that ``bind`` (the run's) lacks, in the granted tools' order: what
        :func:`~nous_sched.tooling.missing_binds` says of them."""
        have = bind if bind is not None else {}
        return [row for row in self.binds if row[2] not in have]


def tool_set(tools: Iterable[Tool], policy: Optional[PermissionPolicy], owner: str) -> ToolSet:
    """The :class:`ToolSet` of ``tools`` under ``policy``: the kept one when the
    same tool objects, in the same order, were seen under an equal policy.

    :raises ConfigError: ``tools`` is not an iterable of :class:`~nous_sched.Tool`
        (the message is ``owner``'s), as :func:`~nous_sched.gate.policy.partition`.
    """
    global _held
    v.require(owner, "tools", tools, v.TOOLS)
    if policy is not None and type(policy) is not PermissionPolicy:
        return ToolSet(tuple(tools), policy, owner)  # a subclass may decide by more than its fields: never kept
    same = _kept_as_given(tools, policy)
    if same is not None:
        return same
    seq = tools if type(tools) is tuple else tuple(tools)
    key = (tuple(map(id, seq)), policy)
    with _lock:
        hit = _sets.get(key)
        if hit is not None:
            _sets.move_to_end(key)
            if type(tools) is list:
                _alias(hit, (id(tools), policy))
            return hit
    made = ToolSet(seq, policy, owner)  # outside the lock: other runs need not wait (checks every item)
    if len(seq) > CACHED_TOOLS:
        return made
    with _lock:
        if key not in _sets:
            _sets[key] = made
            _by_tuple[(id(seq), policy)] = made
            if type(tools) is list:
                _alias(made, (id(tools), policy))
            _held += len(seq)
            while len(_sets) > TOOL_SETS or _held > CACHED_TOOLS:
                _, gone = _sets.popitem(last=False)
                _held -= len(gone.tools)
                alias = (id(gone.tools), gone.policy)
                if _by_tuple.get(alias) is gone:
                    del _by_tuple[alias]
                _alias(gone, None)
    return made


def _kept_as_given(tools: Iterable[Tool], policy: Optional[PermissionPolicy]) -> Optional[ToolSet]:
    """The kept set of ``tools`` found without a key of every tool's id: the one made
    from this very tuple, or the one this list last asked for while its items are still
    that set's tools (compared by identity, in C: the key makes and hashes an int per
    tool, and an agent passes the same list of thousands of tools to run after run)."""
    if type(tools) is tuple:
        with _lock:
            same = _by_tuple.get((id(tools), policy))
        return same if same is not None and same.tools is tools else None
    if type(tools) is list:
        with _lock:
            same = _by_list.get((id(tools), policy))
        if same is not None and len(same.tools) == len(tools) and all(map(is_, tools, same.tools)):
            return same
    return None


def _alias(kept: ToolSet, key: Optional[tuple[int, Optional[PermissionPolicy]]]) -> None:
    """(``_lock`` held.) ``key`` (a list's, or None) becomes ``kept``'s one entry in ``_by_list``."""
    old = kept.alias
    if old is not None and _by_list.get(old) is kept:
        del _by_list[old]
    kept.alias = key
    if key is not None:
        other = _by_list.get(key)
        if other is not None:
            other.alias = None
        _by_list[key] = kept


def cached_sets() -> tuple[int, int]:
    """How many tool sets are kept, and how many tools they hold (what the bounds bound)."""
    with _lock:
        return len(_sets), _held


def clear() -> None:
    """Forget every kept tool set (the next run of each derives it again)."""
    global _held
    with _lock:
        _sets.clear()
        _by_tuple.clear()
        _by_list.clear()
        _held = 0

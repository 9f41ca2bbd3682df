"""Tool names grouped by namespace or common prefix, for an SDK too large to list.

Pure logic. A name's group is its namespace (the text up to the first
``__``, ``::``, ``.``, ``/`` or ``:``, as MCP aggregators and API generators
write it: ``github__create_issue``), or else its first word (``create_issue``,
``createIssue``). A group of one tool is no group: those tools are counted
together as "other". Each group names the words its tools' names use most
after the prefix, weighted against the words every group uses (the verbs
``get``, ``list`` of an API), so ``github__*`` reads as issues, pulls, repos
rather than get, list, create.

The result depends only on the set of names, never on their order.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable

import attrs

__all__ = ["Group", "group_names"]

_SEPARATORS = ("__", "::", ".", "/", ":")
_FIRST_WORD = re.compile(r"[A-Za-z0-9]+?(?:[_-]|(?=[A-Z][a-z]))|[a-z0-9]+(?=[A-Z])")
#: A namespace longer than this is no namespace a reader can use.
MAX_PREFIX = 48
#: The longest word a group's summary shows.
_MAX_WORD = 24


@attrs.frozen
class Group:
    """``count`` tools whose names start with ``prefix``; ``words``, most telling first."""

    prefix: str
    count: int
    words: tuple[str, ...]


def group_names(names: Iterable[str], words_of: Callable[[str], list[str]]) -> tuple[list[Group], int]:
    """The groups of ``names`` (sorted by prefix) and how many names are in none.

    ``words_of`` splits a name's rest into words (the SDK's own splitter).
    """
    members: dict[str, list[str]] = {}
    alone = 0
    for name in sorted(set(names)):
        prefix = _prefix(name)
        if prefix is None:
            alone += 1
        else:
            members.setdefault(prefix, []).append(name)
    counts: dict[str, Counter[str]] = {}
    for prefix, group in list(members.items()):
        if len(group) < 2:
            alone += len(group)
            del members[prefix]
            continue
        counts[prefix] = Counter(
            word for name in group for word in dict.fromkeys(words_of(name[len(prefix) :])) if len(word) <= _MAX_WORD
        )
    spread = Counter(word for counter in counts.values() for word in counter)
    groups = [
        Group(prefix, len(group), _telling(counts[prefix], spread, len(members))) for prefix, group in members.items()
    ]
    return groups, alone


def _prefix(name: str) -> str | None:
    found = [(at, sep) for sep in _SEPARATORS if (at := name.find(sep)) > 0]
    if found:
        at, sep = min(found)
        prefix = name[: at + len(sep)]
    else:
        match = _FIRST_WORD.match(name)
        prefix = match.group(0) if match and match.end() < len(name) else ""
    return prefix if 0 < len(prefix) <= MAX_PREFIX else None


def _telling(counter: Counter[str], spread: Counter[str], groups: int) -> tuple[str, ...]:
    # tf-idf across groups: a word in every group (a verb) says nothing about
    # this one. With a single group every word is equally rare, so plain counts.
    def weight(word: str) -> float:
        return counter[word] * math.log(1.0 + groups / spread[word])

    return tuple(sorted(counter, key=lambda word: (-weight(word), word)))

"""What the host tells a program about its tools: the closest names to an
unknown one, and the answers to the program's ``sdk`` questions.

A model's most common mistake is a tool name it made up or re-cased
(``getWeather`` for ``get_weather``). The call still fails, but with a
:class:`~nous_sched.ToolError` whose message names the closest declared tools
and says how to list them, so the next program can be right.

The ``sdk`` global (:data:`nous_sched.sdk.DISCOVERY_GLOBAL`) is in every run,
whatever the size of the tool set: ``sdk.describe(name)`` resolves to the
tool's full declaration (the TypeScript the full SDK would show) and
``sdk.search(words, limit?)`` to ``[{name, summary, args}]`` of the best
matching tools (:class:`~nous_sched.sdk.ToolIndex`, ranked by BM25F). A
question is not a tool call: it passes no policy or approval and writes no
audit event, and it reveals nothing the run's own description would not (only
granted tools are described or found; a denied one is named as denied). The
index is built on the first question and kept for the next runs of the same
tools (:func:`shared_index`), so a run that asks none pays nothing.

For a tool that declares no output schema (``Tool.returns`` is ``None``),
``sdk.describe(name)`` adds the JSON shape (keys and types, in TypeScript
notation) of the results this run has already received from it
(:meth:`Discovery.observe`, from the first :data:`SHAPE_SAMPLES` results),
so the next program need not print a raw result to learn its keys.
"""

from __future__ import annotations

import difflib
import itertools
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from .. import _validators as v
from ..gate import MAX_NAME_CHARS, NAME_TOO_LONG, callers_rule
from ..gate.policy import denied_message
from ..outcome import Outcome, quote_name
from ._render import _LIMIT, _QUERY_SHAPE, DISCOVERY_GLOBAL, GLOBAL, ToolIndex, _fits_query, split_words

__all__ = ["closest_names", "unknown_tool_message", "Discovery", "Shape", "SHAPE_SAMPLES", "shared_index"]

#: How many close names an unknown-tool message suggests at most.
SUGGESTIONS = 3
_CUTOFF = 0.6
_WORDS = v.instance_of(str, 'a string of words, e.g. sdk.search("weather")')
_FEW_WORDS = v.Check(_QUERY_SHAPE, _fits_query)


def _key(name: str) -> str:
    # camelCase, snake_case, kebab-case and spaces all become one spelling.
    return "_".join(split_words(name)) or name.lower()


def closest_names(name: str, names: Sequence[str], n: int = SUGGESTIONS) -> list[str]:
    """Up to ``n`` of ``names`` closest to ``name``, best first; deterministic.

    A name that differs only in case or word style (``getWeather``,
    ``get-weather``, ``GET_WEATHER`` for ``get_weather``) comes first; then
    ``difflib``'s closest matches on that normalised spelling.
    """
    if not names or len(name) > MAX_NAME_CHARS:  # no declared name is that long; the search would cost its length
        return []
    target = _key(name)
    by_key: dict[str, list[str]] = {}
    for candidate in sorted(set(names)):
        by_key.setdefault(_key(candidate), []).append(candidate)
    chosen = list(by_key.get(target, ()))
    for key in difflib.get_close_matches(target, list(by_key), n=n, cutoff=_CUTOFF):
        for candidate in by_key[key]:
            if candidate not in chosen:
                chosen.append(candidate)
    return chosen[:n]


def unknown_tool_message(name: str, names: Sequence[str]) -> str:
    """The message of a call to a tool that ``names`` (the run's declared tools) does not hold."""
    text = f"unknown tool {quote_name(name)}"
    if not names:
        return text + f"; this run declares no tools (Object.keys({GLOBAL}) is empty)"
    close = closest_names(name, names)
    if close:
        quoted = [quote_name(c) for c in close]
        text += "; did you mean " + (", ".join(quoted[:-1]) + " or " if len(quoted) > 1 else "") + quoted[-1] + "?"
    else:
        text += "."
    count = len(set(names))
    return (
        text + f" Object.keys({GLOBAL}) lists the {count} declared tool{'s' if count != 1 else ''}; "
        f'{DISCOVERY_GLOBAL}.search("words") finds them by what they do.'
    )


#: How many results of one tool (and items of one array) a run reads for its shape.
SHAPE_SAMPLES = 8
#: How deep a shape goes, how many keys of an object it lists, and its longest text.
_SHAPE_DEPTH = 6
_SHAPE_KEYS = 40
_SHAPE_TEXT = 2000
_IDENTIFIER = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")
_SCALARS = ((type(None), "null"), (bool, "boolean"), (int, "number"), (float, "number"), (str, "string"))


class Shape:
    """The JSON shape of the values added to it: their types, an object's keys
    (optional when some objects lacked them), an array's items."""

    __slots__ = ("types", "keys", "items", "objects", "seen")

    def __init__(self) -> None:
        self.types: set[str] = set()
        self.keys: dict[str, Shape] = {}
        self.items: Optional[Shape] = None
        self.objects = 0
        self.seen = 0

    def add(self, value: Any, depth: int = 0) -> None:
        self.seen += 1
        for kind, name in _SCALARS:
            if isinstance(value, kind):
                self.types.add(name)
                return
        if isinstance(value, list):
            self.types.add("array")
            if depth < _SHAPE_DEPTH:
                for item in value[:SHAPE_SAMPLES]:
                    if self.items is None:
                        self.items = Shape()
                    self.items.add(item, depth + 1)
        elif isinstance(value, Mapping):
            self.types.add("object")
            self.objects += 1
            if depth < _SHAPE_DEPTH:
                for key, item in itertools.islice(value.items(), _SHAPE_KEYS):
                    self.keys.setdefault(str(key), Shape()).add(item, depth + 1)

    def typescript(self) -> str:
        """The shape as a TypeScript type."""
        parts = [self._one(kind) for kind in sorted(self.types)]
        return " | ".join(parts) if parts else "unknown"

    def _one(self, kind: str) -> str:
        if kind == "array":
            item = self.items.typescript() if self.items is not None else "unknown"
            return f"({item})[]" if " | " in item else f"{item}[]"
        if kind != "object":
            return kind
        if not self.keys:
            return "{}" if self.objects and self.seen else "object"
        fields = []
        for key, shape in self.keys.items():
            label = key if _IDENTIFIER.match(key) else quote_name(key)
            optional = "?" if shape.seen < self.objects else ""
            fields.append(f"{label}{optional}: {shape.typescript()}")
        return "{ " + "; ".join(fields) + " }"


#: How many tool sets' indexes are kept for the next run that asks.
INDEX_CACHE = 8
_cache_lock = threading.Lock()  # guards _cache
# key: the ids of a tool set's tools, in order -> (those tools, their index). The
# tools are held so that no id in a live key can be reused by another object.
_cache: OrderedDict[tuple[int, ...], tuple[tuple[Any, ...], ToolIndex]] = OrderedDict()


def shared_index(tools: Sequence[Any]) -> ToolIndex:
    """The :class:`~nous_sched.sdk.ToolIndex` of ``tools`` (TypeScript), shared by every run of the same tool objects.

    A search index over thousands of tools costs tens of milliseconds to
    build; an agent's runs reuse one tool set, so the last
    :data:`INDEX_CACHE` sets are kept. Tools are values (:class:`~nous_sched.Tool`
    is frozen), so an index never goes stale. Thread-safe.
    """
    key = tuple(map(id, tools))
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit[1]
    index = ToolIndex(tools, "typescript")  # outside the lock: other runs' questions need not wait
    with _cache_lock:
        _cache[key] = (tuple(tools), index)
        while len(_cache) > INDEX_CACHE:
            _cache.popitem(last=False)
    return index


class Discovery:
    """Answers one run's ``sdk`` questions; built per run, used by one thread.

    ``granted`` are the tools the program may call (described and searched);
    ``names`` every name in ``tools`` (denied ones too); ``denied`` the names
    the policy refuses.
    """

    def __init__(self, granted: Mapping[str, Any], names: Sequence[str], denied: Any = ()) -> None:
        self._granted = granted
        self._names = names
        # (A mapping or set is asked as it is: a run's denied tools are its tool set's, made once.)
        self._denied = denied if isinstance(denied, (Mapping, frozenset, set)) else frozenset(denied)
        self._index: Optional[ToolIndex] = None
        self._shapes: dict[str, Shape] = {}

    def observe(self, name: str, value: Any) -> None:
        """Note the shape of a result the program received from tool ``name``
        (only for a granted tool with no ``returns`` schema, and only its first
        :data:`SHAPE_SAMPLES` results)."""
        tool = self._granted.get(name)
        if tool is None or getattr(tool, "returns", None) is not None:
            return
        shape = self._shapes.get(name)
        if shape is None:
            shape = self._shapes[name] = Shape()
        if shape.seen < SHAPE_SAMPLES:
            shape.add(value)

    def observed(self, name: str) -> Optional[str]:
        """The shape of the results received from ``name`` so far, in TypeScript, or ``None``."""
        shape = self._shapes.get(name)
        if shape is None:
            return None
        text = shape.typescript()
        return text if len(text) <= _SHAPE_TEXT else text[:_SHAPE_TEXT] + "…"

    @property
    def index(self) -> ToolIndex:
        if self._index is None:
            self._index = shared_index(list(self._granted.values()))
        return self._index

    def answer(self, question: Any) -> Outcome:
        """The outcome of ``question``, the JSON ``[op, [arguments...]]`` the prelude sends. Never raises."""
        if not (isinstance(question, list) and len(question) == 2 and isinstance(question[1], list)):
            return Outcome.failure(DISCOVERY_GLOBAL, "malformed question")
        op, args = question
        if op == "describe":
            return self._describe(args)
        if op == "search":
            return self._search(args)
        return Outcome.failure(DISCOVERY_GLOBAL, f"no such question {quote_name(str(op))}")

    def _describe(self, args: list[Any]) -> Outcome:
        label = f"{DISCOVERY_GLOBAL}.describe"
        name = args[0] if args else None
        if not isinstance(name, str):
            return Outcome.failure(label, f'expects a tool\'s name (a string), e.g. {label}("search_docs")')
        if len(name) > MAX_NAME_CHARS:
            return Outcome.failure(label, NAME_TOO_LONG.format(n=MAX_NAME_CHARS))
        text = self.index.describe(name)
        if text is not None:
            return Outcome.success(text + self._observed_note(name))
        if name in self._denied:
            return Outcome.failure(name, denied_message(name))
        callers = getattr(self._granted.get(name), "callers", None)
        if callers is not None and "code" not in callers:  # left out of the SDK: say why, not "unknown"
            return Outcome.failure(name, callers_rule(name, callers, "code"))
        return Outcome.failure(name, unknown_tool_message(name, self._names))

    def _observed_note(self, name: str) -> str:
        shape = self.observed(name)
        if shape is None:
            return ""
        count = min(self._shapes[name].seen, SHAPE_SAMPLES)
        return (
            f"// No output schema is declared; the {count} result(s) this run received from it so far look like:\n"
            f"// {shape}\n"
        )

    def _search(self, args: list[Any]) -> Outcome:
        label = f"{DISCOVERY_GLOBAL}.search"
        words = args[0] if args else None
        limit = args[1] if len(args) > 1 else 10
        for option, value, check in (("words", words, _WORDS), ("words", words, _FEW_WORDS), ("limit", limit, _LIMIT)):
            if not check.accepts(value):
                return Outcome.failure(label, f"`{option}` must be {check.expected}, got {v.shown(value)}")
        return Outcome.success(self.index.search(words, limit))

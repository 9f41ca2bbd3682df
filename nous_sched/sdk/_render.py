"""Render the tool SDK: the declarations a program is written against.

The text goes into the ``run_code`` tool's description and is the program's
*only* description of the tools it may call, which drives every rule here.

Byte stability
    Tools are de-duplicated by name (the first occurrence wins), then sorted by
    name, and every property map is walked in a fixed order: the required
    properties first, then the optional ones, each group sorted by name (a
    reader sees what a call must give before what it may). The same tool *set*
    therefore renders to the same bytes whatever order it arrives in or how its
    dicts were built. The SDK sits in the prompt prefix of every request, so an
    unstable ordering would defeat the provider's prompt cache on every turn.

Total on schemas
    :func:`json_schema_to_type` and :func:`render` never raise on a schema. A
    node that cannot be expressed - a ``$ref`` that does not resolve inside its
    own document, an unknown ``type``, a malformed value, nesting deeper than a
    dozen levels - becomes the escape hatch (``unknown`` in TypeScript, ``Any``
    in Python). That costs the node its type and nothing else: a program cannot
    call any tool if the SDK does not parse.

References
    Local ``$ref`` pointers (``#/$defs/Address``, ``#/definitions/...``, any
    ``#/...`` pointer, and ``#`` itself) resolve within the schema that holds
    them: a tool's ``parameters`` and its ``returns`` are separate documents.
    In TypeScript a target referenced once is written inline; one referenced
    from several places, or from inside itself, becomes a named declaration
    (``type Address = {...};``) above ``tools``, so a recursive model has a
    finite, exact type. Declarations with the same name and the same shape are
    written once for the whole SDK; different shapes that share a name get
    ``_2``, ``_3``... Python stubs have no nested records, so there every
    reference is written inline and a cycle ends in ``Any``. Remote references
    are never fetched.

Return types
    A tool's ``returns`` (the JSON Schema of its result, e.g. an MCP
    ``outputSchema``) becomes ``Promise<T>``; without one, ``Promise<unknown>``.

Large tool sets
    With a ``budget`` (characters), the text is never longer: it is the first
    of :data:`STEPS` that fits, each tried only when the one before it does
    not, and it names its step in a line of its own (:func:`step_of`):
    ``full`` declares every tool; ``lines`` lists one tool per line (its
    name, the first sentence of its description, its argument names);
    ``names`` the same without argument names; ``groups`` names no tool but
    counts them by namespace or common prefix with the words those names use
    most (fewer words before the step is given up); ``search`` lists nothing:
    the count of tools and, if the caller ranks them, a handful of the most
    relevant names. Every step below ``full`` tells the program how to ask
    for a tool's full declaration or search the tools by words, through the
    :data:`DISCOVERY_GLOBAL` object (``sdk.describe(name)``,
    ``sdk.search(words)``), which lives outside ``tools`` so it can never
    collide with a tool's name. :class:`ToolIndex` answers those two
    questions. The README's table gives the sizes ``run_code_tool``'s
    default budget (:data:`DEFAULT_BUDGET`) leads to for 10 to 2,500 tools.

Addressing
    ``tools`` is indexed by each tool's exact name (``tools["my-tool"](args)``),
    so names are never mangled. They are emitted as JSON string literals, which
    are valid string literals in both target languages.

Languages
    ``"typescript"``/``"ts"``/``"javascript"``/``"js"`` all render the same
    TypeScript declaration (under JavaScript it is documentation).
    ``"python"``/``"py"`` render a stub of ``TypedDict`` declarations. Python
    has no intersection type and no anonymous record type, so ``allOf`` and
    nested objects degrade there to ``Any`` and ``dict[str, Any]``.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Optional, TypeGuard

from .. import _validators as v
from ..tooling import caller_parameters
from ._tool_search import WordIndex

__all__ = [
    "GLOBAL",
    "ERROR_CLASS",
    "DISCOVERY_GLOBAL",
    "BLOBS_GLOBAL",
    "DEFAULT_BUDGET",
    "MIN_BUDGET",
    "STEPS",
    "json_schema_to_type",
    "coerce_language",
    "languages",
    "ToolIndex",
]

#: The global a program calls tools through; bindings must use the same name.
GLOBAL = "tools"
#: The error a failed or denied call raises in the program.
ERROR_CLASS = "ToolError"
#: The global through which a program asks about tools (``describe``, ``search``):
#: outside ``tools``, whose keys are arbitrary tool names.
DISCOVERY_GLOBAL = "sdk"
#: The object a program reads its blobs through (``blobs.read``, ``nous_sched.blobs``).
BLOBS_GLOBAL = "blobs"
#: ``run_code_tool``'s budget (characters) for its description: about 8k tokens.
DEFAULT_BUDGET = 32_000
#: The smallest budget :func:`render` and ``run_code_tool`` take.
MIN_BUDGET = 1_500
#: How a budgeted SDK shrinks, largest first; each is used only when the one
#: before it does not fit (see the module docstring).
STEPS = ("full", "lines", "names", "groups", "search")

_CANONICAL = {
    "typescript": "typescript",
    "ts": "typescript",
    "javascript": "typescript",
    "js": "typescript",
    "python": "python",
    "py": "python",
}

# Deeper than any schema a tool plausibly declares. The cap makes the walk
# total, and its recursion bounded, whatever a hand-written schema nests.
_MAX_DEPTH = 12
# References followed inline per document: with the depth cap this bounds the
# work on a document whose references fan out (each used many times).
_MAX_EXPANSIONS = 256

TS_ANY = "unknown"
_PY_ANY = "Any"
_TS_SCALARS = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean", "null": "null"}
_PY_SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "None"}

TS_HEADER = f"""\
// Tool SDK (generated). These declarations are the only description of the
// tools your program may call.
//
//     const out = await {GLOBAL}["<tool name>"]({{ /* arguments */ }});
//
// `{GLOBAL}` is indexed by each tool's EXACT name; each takes one arguments
// object. A call that is denied or fails throws `{ERROR_CLASS}` (the tool's
// name and a message). Write JavaScript or TypeScript (types are removed;
// not enum, namespace or decorators); `await` every call; the result is
// what the program returns, else its last expression's value.
// A result too big to cross is a handle: pass it on, or {BLOBS_GLOBAL}.read(h, i, n).
"""

PY_HEADER = f"""\
# Tool SDK (generated). These declarations are the only description of the
# tools your program may call.
#
#     out = {GLOBAL}["<tool name>"]({{"argument": ...}})
#
# `{GLOBAL}` is indexed by each tool's EXACT name, so a name that is not a
# valid identifier needs no alias. Every tool takes a single arguments
# mapping. Calls go through the same permission policy as a direct tool call:
# one that is denied or fails raises `{ERROR_CLASS}` carrying only the tool
# name and a message.
"""
PY_IMPORTS = "\nfrom typing import Any, Callable, Literal, NotRequired, TypedDict\n"
# Control characters count as whitespace too: a NUL or a line separator in a
# one-line comment would break the Python stub.
_RUNS_OF_SPACE = re.compile(r"[\s\x00-\x1f\x7f]+")
_ESCAPE = ("escape",)
_MISSING = object()
#: A search question holds at most this many characters and words: its cost
#: is words times tools, and a program may ask many.
MAX_QUERY_CHARS = 1_000
MAX_QUERY_WORDS = 32
_QUERY_SHAPE = f"a string of at most {MAX_QUERY_WORDS} words and {MAX_QUERY_CHARS} characters"


def _fits_query(value: Any) -> bool:
    # The length first: the words of an over-long string are never split.
    return isinstance(value, str) and len(value) <= MAX_QUERY_CHARS and len(split_words(value)) <= MAX_QUERY_WORDS


_QUERY = v.Check(_QUERY_SHAPE, _fits_query)
_LIMIT = v.int_between(1, 100, "an integer from 1 to 100")
#: A search hit lists at most this many argument names, each at most this long.
SEARCH_ARGS = 32
SEARCH_ARG_CHARS = 64
# A named type is written as a placeholder until every name is chosen. NUL
# never reaches the output otherwise: literals are JSON-escaped and comments
# have their control characters replaced.
_PLACEHOLDER = re.compile("\x00(\\d+)\x00")
_SUMMARY_MAX = 160

# Names a declaration must not take: TypeScript's reserved words and the
# global types and values an SDK reader relies on.
_RESERVED = frozenset(
    """
    any as asserts async await bigint boolean break case catch class const constructor continue debugger declare
    default delete do else enum export extends false finally for from function get if implements import in infer
    instanceof interface is keyof let module namespace never new null number object of package private protected
    public readonly require return set static string super switch symbol this throw true try type typeof undefined
    unique unknown var void while with yield Array Boolean Date Error Function JSON Map Math Number Object Promise
    Record RegExp Set String Symbol
    """.split()
) | {GLOBAL, ERROR_CLASS, DISCOVERY_GLOBAL, BLOBS_GLOBAL}


def languages() -> tuple[str, ...]:
    """Every language name :func:`render` accepts."""
    return tuple(_CANONICAL)


def coerce_language(value: Any) -> str | None:
    """The canonical language (``"typescript"`` or ``"python"``) for ``value``.

    Returns ``None`` rather than raising for anything unknown (including
    non-strings), so a caller holding a configured language can fall back.
    """
    return _CANONICAL.get(value) if isinstance(value, str) else None


def json_schema_to_type(schema: Any, language: str = "typescript") -> str:
    """The ``language`` type expression for one JSON Schema node.

    Accepts any value: whatever cannot be expressed becomes ``unknown``
    (TypeScript) or ``Any`` (Python) instead of raising. Local ``$ref`` pointers
    resolve against ``schema`` itself and are written inline; a cycle ends in
    the escape hatch, since a lone expression has nowhere to declare a name.
    """
    doc = _Doc(schema, None)
    return _py(schema, 0, doc) if require_language("json_schema_to_type", language) == "python" else _ts(schema, 0, doc)


class ToolIndex:
    """Answers what a program may ask about a tool set: a tool's declaration, or the tools matching some words.

    Built once per tool set (the same tools :func:`render` declares: first
    occurrence of a name wins) and read-only afterwards, so one index may
    serve many runs and threads. The results are deterministic: the same tool
    set and question give the same answer.
    """

    def __init__(self, tools: Iterable[Any], language: str = "typescript") -> None:
        self._language = require_language("ToolIndex", language)
        ordered = unique_sorted(tools)
        self._tools = {tool.name: tool for tool in ordered}
        self._order = list(self._tools)
        self._search: Optional[WordIndex] = None

    @property
    def names(self) -> tuple[str, ...]:
        """Every tool's name, sorted."""
        return tuple(self._tools)

    def describe(self, name: Any) -> Optional[str]:
        """The full declaration of tool ``name`` (with any named types it uses), or ``None`` if there is none.

        The text is the tool's part of the full SDK, without the header.
        """
        tool = self._tools.get(name) if isinstance(name, str) else None
        if tool is None:
            return None
        if self._language == "python":
            return render_python([tool], header=False)
        return render_typescript([tool], header=False)

    def search(self, query: Any, limit: int = 10) -> list[dict[str, Any]]:
        """The tools best matching the words of ``query``, best first: ``[{"name", "summary", "args"}]``.

        ``summary`` is the first sentence of the tool's description; ``args``
        its top-level argument names, required first, an optional one ending
        in ``?`` (at most :data:`SEARCH_ARGS` of them, each cut to
        :data:`SEARCH_ARG_CHARS` characters; :meth:`describe` has them all).

        Ranked by BM25F (:mod:`nous_sched.sdk._tool_search`) over the tool's name
        (weighted most), its argument names, and its own and its arguments'
        descriptions, case-insensitively: ``snake_case`` and ``camelCase``
        names count as separate words, a word of three or more letters also
        matches as a prefix (half weight), and a word every tool has counts
        for almost nothing. Ties go to the name that sorts first. Tools
        matching no word are left out; at most ``limit`` (1 to 100) are
        returned. A query holds at most :data:`MAX_QUERY_WORDS` words and
        :data:`MAX_QUERY_CHARS` characters, which bounds its cost.

        :raises ConfigError: ``query`` is not such a string, or ``limit`` is out of range.
        """
        v.require("search", "query", query, _QUERY)
        v.require("search", "limit", limit, _LIMIT)
        if self._search is None:
            # Built on the first question: describing tools never pays for it.
            # Two threads asking at once may both build it; either result is
            # the same, and the assignment is atomic.
            self._search = WordIndex([_tool_words(self._tools[name]) for name in self._order])
        hits = self._search.rank(list(dict.fromkeys(split_words(query))), limit)
        return [self._hit(self._tools[self._order[i]]) for i in hits]

    @staticmethod
    def _hit(tool: Any) -> dict[str, Any]:
        args = [
            name if len(name) <= SEARCH_ARG_CHARS else name[: SEARCH_ARG_CHARS - 1] + "…" for name in _arg_names(tool)
        ]
        return {"name": tool.name, "summary": _summary(tool), "args": args[:SEARCH_ARGS]}


def require_language(owner: str, language: Any) -> str:
    lang = coerce_language(language)
    if lang is None:
        v.fail(owner, "language", language, "one of " + ", ".join(repr(name) for name in _CANONICAL))
    return lang


def unique_sorted(tools: Iterable[Any]) -> list[Any]:
    """The tools a program may call, one per name, sorted: a tool only the model may
    call (``callers={"model"}``) is left out, and so is a nameless one."""
    chosen: dict[str, Any] = {}
    for tool in tools:
        callers = getattr(tool, "callers", None)
        if callers is not None and "code" not in callers:
            continue
        name = getattr(tool, "name", None)
        if isinstance(name, str) and name and name not in chosen:
            chosen[name] = tool
    return [chosen[name] for name in sorted(chosen)]


# --- References ---------------------------------------------------------------


class _Doc:
    """One schema document (a tool's ``parameters`` or ``returns``): the root its local ``$ref`` pointers name.

    ``types`` is the SDK-wide registry of named declarations, or ``None`` to
    write every reference inline.
    """

    def __init__(self, root: Any, types: Optional[_Types]) -> None:
        self.root = root
        self.types = types
        self.named = _named_pointers(root) if types is not None else frozenset()
        self.active: set[str] = set()
        self.expansions = 0

    def resolve(self, ref: Any) -> tuple[Optional[str], Any]:
        """``(pointer, target)`` for a local reference, ``(None, _MISSING)`` if it does not resolve."""
        pointer = _local_pointer(ref)
        if pointer is None:
            return None, _MISSING
        return pointer, _lookup(self.root, pointer)

    def unwrap(self, node: Any) -> Any:
        """``node`` with any chain of references followed (``_MISSING`` if the chain breaks or loops)."""
        seen: set[str] = set()
        while isinstance(node, Mapping) and node.get("$ref") is not None:
            pointer, node = self.resolve(node["$ref"])
            if pointer is None or node is _MISSING or pointer in seen:
                return _MISSING
            seen.add(pointer)
        return node

    def inline(self, ref: Any, render: Any) -> Any:
        """``render(target)`` with the reference's pointer marked active, or ``None`` to escape."""
        pointer, target = self.resolve(ref)
        if pointer is None or target is _MISSING or pointer in self.active:
            return None
        if self.expansions >= _MAX_EXPANSIONS:
            return None
        self.expansions += 1
        self.active.add(pointer)
        try:
            return render(target)
        finally:
            self.active.discard(pointer)


class _Types:
    """The named declarations of one TypeScript SDK, written as placeholders until every name is chosen."""

    def __init__(self) -> None:
        self.keys: dict[tuple[int, str], int] = {}  # (id of the document, pointer) -> index
        self.held: list[_Doc] = []  # keeps each document alive, so its id is never reused in `keys`
        self.bases: list[str] = []
        self.docs: list[str] = []
        self.bodies: list[str] = []
        # Declarations whose bodies are being written and not yet inside an
        # object, array or tuple: TypeScript rejects a type alias that refers
        # to itself there (`type A = A | null`, `type A = Record<string, A>`),
        # and so does JSON Schema's own sense (validating it never ends).
        self.open: frozenset[int] = frozenset()

    def reference(self, doc: _Doc, pointer: str) -> str:
        key = (id(doc), pointer)
        index = self.keys.get(key)
        if index is None:
            self.held.append(doc)
            index = len(self.bases)
            self.keys[key] = index
            target = _lookup(doc.root, pointer)
            self.bases.append(_type_name(pointer, target))
            self.docs.append(_description_of(target) or "")
            self.bodies.append("")  # taken before rendering: the body may refer to itself
            outer, self.open = self.open, self.open | {index}
            try:
                self.bodies[index] = _ts(doc.unwrap(target), 0, doc)
            finally:
                self.open = outer
        elif index in self.open:
            return TS_ANY
        return f"\x00{index}\x00"

    def finish(self, texts: list[str]) -> tuple[list[str], list[str]]:
        """Choose the names, and return ``texts`` and the declarations they use, placeholders replaced."""
        classes = self._classes()
        names: dict[int, str] = {}
        taken: set[str] = set()
        for index in range(len(self.bases)):
            cls = classes[index]
            if cls not in names:
                base, n = self.bases[index], 2
                name = base
                while name in taken:
                    name, n = f"{base}_{n}", n + 1
                taken.add(name)
                names[cls] = name

        def fill(text: str, used: set[int]) -> str:
            def one(match: re.Match[str]) -> str:
                index = int(match.group(1))
                used.add(index)
                return names[classes[index]]

            return _PLACEHOLDER.sub(one, text)

        used: set[int] = set()
        filled = [fill(text, used) for text in texts]
        declared: dict[str, str] = {}
        pending = sorted(used)
        while pending:
            index = pending.pop()
            name = names[classes[index]]
            if name in declared:
                continue
            more: set[int] = set()
            body = fill(self.bodies[index], more)
            doc = f"/** {_close_safe(one_line(self.docs[index]))} */\n" if self.docs[index] else ""
            declared[name] = f"{doc}type {name} = {body};"
            pending.extend(sorted(more - used))
            used |= more
        return filled, [declared[name] for name in sorted(declared)]

    def _classes(self) -> list[int]:
        # Partition refinement: two declarations are one type when they have
        # the same base name, doc and body, with the placeholders in their
        # bodies standing for the same types in turn.
        count = len(self.bases)
        classes = self._group(lambda i: (self.bases[i], self.docs[i], _PLACEHOLDER.sub("\x00", self.bodies[i])))
        while True:

            def signature(i: int, current: list[int] = classes) -> tuple[int, str]:
                body = _PLACEHOLDER.sub(lambda m: f"\x00{current[int(m.group(1))]}\x00", self.bodies[i])
                return (current[i], body)

            refined = self._group(signature)
            if len(set(refined)) == len(set(classes)) or count == 0:
                return refined
            classes = refined

    def _group(self, key: Any) -> list[int]:
        ids: dict[Any, int] = {}
        return [ids.setdefault(key(i), len(ids)) for i in range(len(self.bases))]


def _local_pointer(ref: Any) -> Optional[str]:
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    fragment = urllib.parse.unquote(ref[1:])
    if fragment and not fragment.startswith("/"):
        return None  # a plain-name anchor (`#foo`) is not a pointer
    return fragment


def _lookup(root: Any, pointer: str) -> Any:
    node = root
    if pointer == "":
        return node
    for token in pointer[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping):
            node = node.get(token, _MISSING) if isinstance(token, str) else _MISSING
        elif isinstance(node, (list, tuple)) and token.isdigit():
            index = int(token)
            node = node[index] if index < len(node) else _MISSING
        else:
            return _MISSING
        if node is _MISSING:
            return _MISSING
    return node


# Keywords whose values are data, not schemas: a `$ref` key inside them is not a reference.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example"})
_DEFINITIONS = frozenset({"$defs", "definitions"})
# Keywords whose values map names (any names, `default` included) to schemas.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "dependentSchemas"})


def _named_pointers(root: Any) -> frozenset[str]:
    """The pointers to declare by name: referenced from more than one place, or from inside themselves."""
    counts: dict[str, int] = {}
    edges: dict[str, set[str]] = {}
    todo, seen = [""], {""}
    while todo:
        source = todo.pop()
        targets = edges.setdefault(source, set())
        for ref in _refs_in(_lookup(root, source)):
            pointer = _local_pointer(ref)
            if pointer is None or _lookup(root, pointer) is _MISSING:
                continue
            counts[pointer] = counts.get(pointer, 0) + 1
            targets.add(pointer)
            if pointer not in seen:
                seen.add(pointer)
                todo.append(pointer)
    named = {pointer for pointer, count in counts.items() if count > 1}
    for pointer in counts:
        if pointer not in named and _reaches(edges, pointer, pointer):
            named.add(pointer)
    return frozenset(named)


def _refs_in(node: Any) -> list[Any]:
    # Every `$ref` in the subtree, not descending into definitions (each is
    # walked as a target of its own) or into data (`enum`, `default`...).
    found: list[Any] = []
    stack: list[tuple[Any, int, bool]] = [(node, 0, False)]  # (node, depth, is a map of name -> schema)
    while stack:
        node, depth, named_schemas = stack.pop()
        if depth > 4 * _MAX_DEPTH:
            continue
        if isinstance(node, Mapping):
            if named_schemas:
                stack.extend((value, depth + 1, False) for value in node.values())
                continue
            ref = node.get("$ref")
            if ref is not None:
                found.append(ref)
            for key, value in node.items():
                if key in _SCHEMA_MAPS:
                    stack.append((value, depth + 1, True))
                elif key not in _DATA_KEYWORDS and key not in _DEFINITIONS and key != "$ref":
                    stack.append((value, depth + 1, False))
        elif isinstance(node, (list, tuple)):
            stack.extend((item, depth + 1, False) for item in node)
    return found


def _reaches(edges: dict[str, set[str]], start: str, goal: str) -> bool:
    stack, seen = list(edges.get(start, ())), set()
    while stack:
        pointer = stack.pop()
        if pointer == goal:
            return True
        if pointer not in seen:
            seen.add(pointer)
            stack.extend(edges.get(pointer, ()))
    return False


def _type_name(pointer: str, target: Any) -> str:
    last = pointer.rsplit("/", 1)[-1].replace("~1", "/").replace("~0", "~") if pointer else ""
    title = target.get("title") if isinstance(target, Mapping) else None
    raw = last if last and not last.isdigit() else (title if isinstance(title, str) and title else "Root")
    name = re.sub(r"[^A-Za-z0-9_$]", "_", raw)[:64]
    if not name or name[0].isdigit():
        name = "T" + name
    return name + "_" if name in _RESERVED else name


# --- TypeScript ---------------------------------------------------------------


def render_typescript(tools: list[Any], *, header: bool = True, note: str = "") -> str:
    """The full TypeScript SDK; ``note`` (comment lines) goes right after the header."""
    types = _Types()
    members = [_ts_member(tool, types) for tool in tools]
    members, declarations = types.finish(members)
    body = "\n" + "\n\n".join(members) + "\n" if members else ""
    declared = "\n".join(declarations) + "\n\n" if declarations else ""
    head = TS_HEADER + note + "\n" if header else ""
    return f"{head}{declared}declare const {GLOBAL}: {{{body}}};\n"


def _ts_member(tool: Any, types: _Types) -> str:
    args = _ts_args(caller_parameters(tool), types)
    returns = getattr(tool, "returns", None)
    result = TS_ANY if returns is None else _ts(returns, 0, _Doc(returns, types))
    return _ts_doc(getattr(tool, "description", None)) + f"  {literal(tool.name)}(args: {args}): Promise<{result}>;"


def _ts_doc(description: Any) -> str:
    if not isinstance(description, str) or not (text := description.strip()):
        return ""
    text = _CONTROL.sub("\ufffd", _close_safe(text))
    lines = "".join(f"   * {line.rstrip()}\n" for line in re.split(r"\r?\n", text))
    return f"  /**\n{lines}   */\n"


# Control characters but the line breaks a multi-line doc comment splits on.
_CONTROL = re.compile(r"[\x00-\x09\x0b\x0c\x0e-\x1f\x7f]")


def _ts_args(parameters: Any, types: _Types) -> str:
    # The top-level arguments are the one place a parameter's own description
    # can reach the model, so they get a line and a doc comment each; nested
    # types stay on one line to keep the prompt prefix small.
    doc = _Doc(parameters, types)
    match _classify(doc.unwrap(parameters), 0):
        case ("object", [_, *_] as fields, _):
            return "{\n" + "\n".join(_ts_documented_field(field, doc) for field in fields) + "\n  }"
        case _:
            return _ts(parameters, 0, doc)


def _ts_documented_field(field: tuple[str, Any, bool], doc: _Doc) -> str:
    description = _documented(field[1])
    comment = f"    /** {_close_safe(one_line(description))} */\n" if description else ""
    return f"{comment}    {_ts_field(field, 1, doc)};"


def _ts_field(field: tuple[str, Any, bool], depth: int, doc: _Doc) -> str:
    name, node, required = field
    return f"{literal(name)}{'' if required else '?'}: {_ts(node, depth, doc)}"


def _ts(node: Any, depth: int, doc: _Doc) -> str:
    if depth <= _MAX_DEPTH and isinstance(node, Mapping) and node.get("$ref") is not None:
        pointer, target = doc.resolve(node["$ref"])
        if doc.types is not None and pointer in doc.named:
            # A chain of references that loops without a shape is no type at all.
            return TS_ANY if doc.unwrap(target) is _MISSING else doc.types.reference(doc, pointer)
        inlined = doc.inline(node["$ref"], lambda target: _ts(target, depth + 1, doc))
        return TS_ANY if inlined is None else inlined
    match _classify(node, depth):
        case ("scalar", name):
            return _TS_SCALARS[name]
        case ("enum", values):
            return " | ".join(_literals(values, _ts_literal)) or TS_ANY
        case ("union", nodes):
            return _unique_join((_ts(n, depth + 1, doc) for n in nodes), " | ", TS_ANY)
        case ("intersection", nodes):
            # `&` binds tighter than `|`: a union member needs its parentheses.
            parts = (_ts(n, depth + 1, doc) for n in nodes)
            return _unique_join((f"({p})" if " | " in p else p for p in parts), " & ", TS_ANY)
        case ("array", items):
            return f"Array<{_guarded(doc, lambda: _ts(items, depth + 1, doc))}>"
        case ("tuple", nodes, rest):
            members = _guarded(doc, lambda: [_ts(n, depth + 1, doc) for n in nodes])
            if rest is not None:
                members.append(f"...Array<{_ts(rest, depth + 1, doc)}>")
            return "[" + ", ".join(members) + "]"
        case ("object", [], additional):
            return f"Record<string, {_ts(additional, depth + 1, doc)}>"
        case ("object", fields, _):
            parts = _guarded(doc, lambda: [_ts_field(field, depth + 1, doc) for field in fields])
            return "{ " + "; ".join(parts) + " }"
    return TS_ANY


def _guarded(doc: _Doc, render: Any) -> Any:
    """``render()`` inside an object, array or tuple, where a named type may refer to itself."""
    types = doc.types
    if types is None or not types.open:
        return render()
    outer, types.open = types.open, frozenset()
    try:
        return render()
    finally:
        types.open = outer


def _ts_literal(value: Any) -> str | None:
    if isinstance(value, str):
        return literal(value)
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return _int_literal(value)
    if isinstance(value, float) and math.isfinite(value):
        return float.__repr__(value)
    return None


# --- Python -------------------------------------------------------------------


def render_python(tools: list[Any], *, header: bool = True, note: str = "") -> str:
    """The full Python stub; ``note`` (comment lines) goes right after the header."""
    aliases, members = [], []
    for index, tool in enumerate(tools, 1):
        alias, arg_type = _py_args(tool, index)
        if alias:
            aliases.append(alias)
        returns = getattr(tool, "returns", None)
        result = _PY_ANY if returns is None else _py(returns, 0, _Doc(returns, None))
        members.append(f"    {literal(tool.name)}: Callable[[{arg_type}], {result}],")
    alias_text = "\n".join(aliases) + "\n" if aliases else ""
    body = "\n" + "\n".join(members) + "\n" if members else ""
    head = (PY_HEADER + note + PY_IMPORTS if header else PY_IMPORTS.lstrip("\n")) + "\n"
    return f'{head}{alias_text}\nTools = TypedDict("Tools", {{{body}}})\n\n{GLOBAL}: Tools\n'


def _py_args(tool: Any, index: int) -> tuple[str, str]:
    # Python has no anonymous record type, so an arguments object becomes a
    # TypedDict named by the tool's position in the sorted list: deterministic,
    # and no two tools can collide the way mangled names could.
    parameters = caller_parameters(tool)
    doc = _Doc(parameters, None)
    match _classify(doc.unwrap(parameters), 0):
        case ("object", [_, *_] as fields, _):
            name = f"Args{index}"
            entries = ", ".join(_py_field(field, doc) for field in fields)
            return f"{_py_comment(tool, fields)}{name} = TypedDict({literal(name)}, {{{entries}}})\n", name
        case _:
            return "", _py(parameters, 0, doc)


def _py_field(field: tuple[str, Any, bool], doc: _Doc) -> str:
    name, node, required = field
    kind = _py(node, 1, doc)
    return f"{literal(name)}: {kind if required else f'NotRequired[{kind}]'}"


def _py_comment(tool: Any, fields: list[tuple[str, Any, bool]]) -> str:
    description = getattr(tool, "description", None)
    summary = one_line(description) if isinstance(description, str) else ""
    lines = [f"# {one_line(tool.name)} — {summary}" if summary else f"# {one_line(tool.name)}"]
    for name, node, _required in fields:
        if doc := _documented(node):
            lines.append(f"#   {one_line(name)}: {one_line(doc)}")
    return "\n".join(lines) + "\n"


def _py(node: Any, depth: int, doc: _Doc) -> str:
    if depth <= _MAX_DEPTH and isinstance(node, Mapping) and node.get("$ref") is not None:
        inlined = doc.inline(node["$ref"], lambda target: _py(target, depth + 1, doc))
        return _PY_ANY if inlined is None else inlined
    match _classify(node, depth):
        case ("scalar", name):
            return _PY_SCALARS[name]
        case ("enum", values):
            literals = _literals(values, _py_literal)
            return f"Literal[{', '.join(literals)}]" if literals else _PY_ANY
        case ("union", nodes):
            return _unique_join((_py(n, depth + 1, doc) for n in nodes), " | ", _PY_ANY)
        case ("array", items):
            return f"list[{_py(items, depth + 1, doc)}]"
        case ("tuple", [], None):
            return "tuple[()]"  # `tuple[]` is a syntax error
        case ("tuple", nodes, None):
            return "tuple[" + ", ".join(_py(n, depth + 1, doc) for n in nodes) + "]"
        case ("tuple", _, _):
            return f"list[{_PY_ANY}]"  # an open tuple: Python cannot type its tail
        case ("object", [], additional):
            return f"dict[str, {_py(additional, depth + 1, doc)}]"
        case ("object", _, _):
            # A nested record would need a name; only the arguments get one.
            return f"dict[str, {_PY_ANY}]"
    # Also `allOf`: Python has no intersection type.
    return _PY_ANY


def _py_literal(value: Any) -> str | None:
    if isinstance(value, str):
        return literal(value)
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return _int_literal(value)
    return None  # `Literal[...]` admits no float


# --- Schema classification ----------------------------------------------------

# One classifier, two formatters. Schemas come from tool authors, so every
# field's shape is checked before it is used. References are the formatters'
# business: they know which document a node belongs to.


def _classify(node: Any, depth: int) -> tuple[Any, ...]:
    if depth > _MAX_DEPTH or not isinstance(node, Mapping) or node.get("$ref") is not None:
        return _ESCAPE
    if "const" in node:
        return ("enum", [node["const"]])
    for key, kind in (("enum", "enum"), ("oneOf", "union"), ("anyOf", "union"), ("allOf", "intersection")):
        if _is_list(node.get(key)):
            return (kind, node[key])
    declared = node.get("type")
    if _is_list(declared):
        # One member per distinct type: a repeated one would walk the same
        # subtree again, multiplying the work at every level.
        names = dict.fromkeys(name if isinstance(name, str) else None for name in declared)
        return ("union", [None if name is None else {**node, "type": name} for name in names])
    if declared is None:
        # JSON Schema does not require `type`; hand-written schemas omit it.
        if isinstance(node.get("properties"), Mapping):
            declared = "object"
        elif node.get("items") is not None or _is_list(node.get("prefixItems")):
            declared = "array"
    if declared == "object":
        return _classify_object(node)
    if declared == "array":
        return _classify_array(node)
    if isinstance(declared, str) and declared in _TS_SCALARS:
        return ("scalar", declared)
    return _ESCAPE


def _classify_object(node: Mapping[str, Any]) -> tuple[Any, ...]:
    properties = node.get("properties")
    required = node.get("required")
    required = {name for name in required if isinstance(name, str)} if _is_list(required) else set()
    # Sorted, required first: a schema built in a different order must render the same bytes.
    pairs = properties.items() if isinstance(properties, Mapping) else ()
    fields = sorted(
        ((name, sub, name in required) for name, sub in pairs if isinstance(name, str)),
        key=lambda field: (not field[2], field[0]),
    )
    return ("object", fields, node.get("additionalProperties"))


def _classify_array(node: Mapping[str, Any]) -> tuple[Any, ...]:
    items, prefix = node.get("items"), node.get("prefixItems")
    if _is_list(prefix):
        # Draft 2020-12 tuples: `items` is then the schema of the rest, if any.
        max_items = node.get("maxItems")
        closed = items is False or (type(max_items) is int and max_items <= len(prefix))
        rest = None if closed else (items if isinstance(items, Mapping) else {})
        return ("tuple", list(prefix), rest)
    if _is_list(items):  # draft 4 to 2019-09 tuples
        return ("tuple", list(items), None)
    return ("array", items if isinstance(items, Mapping) else None)


# --- Discovery ----------------------------------------------------------------


def _summary(tool: Any) -> str:
    """The first sentence (or line) of a tool's description, on one line and cut short."""
    description = getattr(tool, "description", None)
    if not isinstance(description, str):
        return ""
    first = re.split(r"(?<=[.!?])\s|\n\s*\n", description.strip(), maxsplit=1)[0]
    text = one_line(first)
    return text if len(text) <= _SUMMARY_MAX else text[: _SUMMARY_MAX - 1] + "…"


def compact_comment(tool: Any, *, args: bool) -> str:
    summary = _summary(tool)
    names = ", ".join(_arg_names(tool)) if args else ""
    parts = (summary, f"Args: {one_line(names)}" if names else "")
    return " ".join(part for part in parts if part) or "(no description)"


def _arg_names(tool: Any) -> list[str]:
    """A tool's top-level argument names, required first, an optional one marked with ``?``."""
    parameters = caller_parameters(tool)
    match _classify(_Doc(parameters, None).unwrap(parameters), 0):
        case ("object", fields, _):
            return [name + ("" if required else "?") for name, _, required in fields]
    return []


_NON_WORD = re.compile(r"[\W_]+")
_CASE_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_UPPER = re.compile(r"[A-Z]")


def split_words(text: str) -> list[str]:
    """``text``'s words, lower-cased: split at non-word characters, ``_`` and camelCase boundaries."""
    words: list[str] = []
    for chunk in _NON_WORD.split(text):
        if _UPPER.search(chunk):
            words.extend(word.lower() for word in _CASE_BOUNDARY.split(chunk) if word)
        elif chunk:
            words.append(chunk.lower())
    return words


def _tool_words(tool: Any) -> tuple[list[str], list[str], list[str]]:
    """The words of a tool's name, of its argument names, and of its descriptions."""
    parameters = caller_parameters(tool)
    arg_names, texts = [], [getattr(tool, "description", None)]
    if (kind := _classify(_Doc(parameters, None).unwrap(parameters), 0))[0] == "object":
        for name, node, _ in kind[1]:
            arg_names.append(name)
            texts.append(_description_of(node))
    described = " ".join(text for text in texts if isinstance(text, str))
    return split_words(tool.name), split_words(" ".join(arg_names)), split_words(described)


# --- Helpers ------------------------------------------------------------------


def _is_list(value: Any) -> TypeGuard[list[Any] | tuple[Any, ...]]:
    return isinstance(value, (list, tuple))


#: A default longer than this many characters is shown cut, with "…".
_MAX_DEFAULT = 60


def _documented(node: Any) -> str | None:
    """A top-level argument's comment: its description, and its default when the schema has one."""
    description = _description_of(node)
    if not isinstance(node, Mapping) or "default" not in node:
        return description
    try:
        shown = json.dumps(node["default"], ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return description
    if len(shown) > _MAX_DEFAULT:
        shown = shown[:_MAX_DEFAULT] + "…"
    return f"{description.strip()} (default: {shown})" if description else f"default: {shown}"


def _description_of(node: Any) -> str | None:
    text = node.get("description") if isinstance(node, Mapping) else None
    return text if isinstance(text, str) and text.strip() else None


def _literals(values: Iterable[Any], formatter: Callable[[Any], Optional[str]]) -> list[str]:
    # Every member or none: dropping one would make the type silently narrower
    # than the schema, which is worse than no type.
    rendered = []
    for value in values:
        literal = formatter(value)
        if literal is None:
            return []
        rendered.append(literal)
    return rendered


def _int_literal(value: int) -> str | None:
    try:
        return int.__repr__(value)
    except ValueError:  # beyond the interpreter's int-to-str digit limit
        return None


def _unique_join(parts: Iterable[str], joiner: str, empty: str) -> str:
    return joiner.join(dict.fromkeys(parts)) or empty


def literal(text: str) -> str:
    # A JSON string literal escapes every quote, backslash and control
    # character a careless or hostile name could use to break out.
    return json.dumps(text, ensure_ascii=False)


def one_line(text: str) -> str:
    return _RUNS_OF_SPACE.sub(" ", text).strip()


def _close_safe(text: str) -> str:
    # An unescaped `*/` would end the doc comment early and leave the rest of
    # the description as broken code.
    return text.replace("*/", "*\\/")

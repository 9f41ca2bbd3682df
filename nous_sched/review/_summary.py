"""A program's static summary: what its text says it will call, read by a real parser.

:func:`summarize` reads the program the run would execute (Markdown fences
off, TypeScript types removed: :mod:`nous_sched.runtime._program`) with
tree-sitter's grammar, never patterns over the text, so ``tools.x`` in a
comment or a string is no call. What it reports (:class:`ProgramSummary`):

* each **call site** of a tool (``tools.x(...)``, ``tools["x"](...)``,
  ``tools[`x`](...)``, ``tools?.x(...)``: the only ways the sandbox's
  ``tools`` global is indexed), with its line and column, the **arguments
  known statically** (object and array literals of literal values; any other
  value is a :class:`Dynamic` holding its source text), whether it sits **in a
  loop** (``for``, ``for-of``/``for-in``, ``while``, ``do``; the callback of
  ``.map``/``.forEach``/``.filter``/``.reduce``/...; a named function called
  from one, or calling itself) or **in parallel** (inside
  ``Promise.all``/``allSettled``/``race``/``any``), and whether it is
  **called** there or only referenced (``const f = tools.x``): a referenced
  tool may run any number of times;
* **dynamic access** (:attr:`ProgramSummary.dynamic`, each reason with its
  place): a computed tool name (``tools[name]``), the ``tools`` object itself
  escaping (aliased, passed, spread, destructured), and what can reach it
  without its name (``globalThis``, ``eval``, ``Function``, ``import()``,
  ``this`` outside a class, a ``constructor`` property, a call of a computed
  member ``x[k](...)``). Any of them: the program **may call any granted tool**;
* the **unknown** names (no tool of the run), the **denied** ones (the
  policy's), the **gated** ones it names (those needing approval:
  :func:`nous_sched.gate.dispatch.needs_approval`, with the policy's names), and
  whether it **can reach a gated tool** (named, or any, with dynamic access);
* its **size** (UTF-8 bytes, lines).

A summary is a reading of the text: conditions are not evaluated (a call
in a branch counts as a call site), and a program written to hide what it
calls can only do so through the constructs above, which make it dynamic.
It never replaces the run-time gates: every call still passes the policy,
the budgets and per-call approval.

Total and bounded: a syntax error (or TypeScript that cannot run) is a
summary that says so (:attr:`ProgramSummary.error`), never an exception; a
program over :data:`MAX_BYTES` or :data:`MAX_NODES` syntax nodes, nesting
deeper than :data:`MAX_DEPTH` or with more than :data:`MAX_SITES` call sites is summarized as far as the bound
(:attr:`ProgramSummary.complete` False) and is dynamic. The walk is
iterative (no recursion on the program's nesting), each node visited once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any, Iterable, Optional, Union

import attrs

from .. import _tree_sitter
from .._validators import fail
from ..gate.dispatch import needs_approval
from ..gate.policy import PermissionPolicy, approval_names, partition
from ..runtime._program import unfence
from ..tooling import Tool

__all__ = [
    "summarize",
    "summarize_parts",
    "ProgramSummary",
    "ToolCallSite",
    "CallCount",
    "Dynamic",
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_SITES",
    "ANY_TOOL",
]

#: A program over this many UTF-8 bytes is not parsed: its summary is incomplete and dynamic.
MAX_BYTES = 256 * 1024
#: Nodes nested deeper than this are not walked: the summary is incomplete and dynamic.
MAX_DEPTH = 400
#: Syntax nodes walked at most (the walk's cost); past them the summary is incomplete and dynamic.
MAX_NODES = 150_000
#: Call sites listed at most; past them the summary is incomplete and dynamic.
MAX_SITES = 2000
#: What a dynamic summary says of the program.
ANY_TOOL = "dynamic: may call any granted tool"
#: A literal nested deeper, or a container longer, or a string longer, is a :class:`Dynamic`.
_LITERAL_DEPTH = 16
_LITERAL_ITEMS = 256
_LITERAL_CHARS = 4000
#: Source text kept in a :class:`Dynamic` or a reason, in characters.
_SOURCE_CHARS = 120
#: Dynamic reasons listed at most (the first ones, in the program's order).
_REASONS = 32

_ITERATING = frozenset(
    "map forEach filter flatMap reduce reduceRight some every find findIndex findLast findLastIndex sort from".split()
)
_PARALLEL = frozenset(("all", "allSettled", "race", "any"))
_GLOBAL_REACH = {
    "globalThis": "`globalThis` (the global object holds `tools`)",
    "eval": "`eval` (code from a string)",
    "Function": "`Function` (code from a string)",
}
_FUNCTIONS = frozenset(("arrow_function", "function_expression", "function", "generator_function"))
_CALLBACKS = _FUNCTIONS | {"identifier", "member_expression"}
#: Node types the walk has nothing to say about: only their children are walked.
#: TypeScript's type syntax (removed before the program runs): not walked.
_TYPES = frozenset(
    """type_annotation type_arguments type_parameters type_predicate_annotation asserts_annotation
    interface_declaration type_alias_declaration implements_clause ambient_declaration function_signature
    abstract_method_signature index_signature method_signature type_query""".split()
)
#: TypeScript with a value at run time: the run refuses it.
_REFUSED = frozenset(("enum_declaration", "internal_module", "module", "decorator"))
_PLAIN = frozenset(
    """program expression_statement statement_block lexical_declaration await_expression
    binary_expression assignment_expression augmented_assignment_expression parenthesized_expression
    return_statement if_statement else_clause arguments object pair array string string_fragment number
    property_identifier ; , ( ) { } [ ] . = : ? true false null template_string template_substitution
    ternary_expression update_expression unary_expression try_statement catch_clause finally_clause
    throw_statement switch_statement switch_body switch_case switch_default formal_parameters
    required_parameter optional_parameter spread_element comment escape_sequence
    break_statement continue_statement""".split()
)


@attrs.frozen
class Dynamic:
    """A value the summary cannot know before the program runs: ``source``,
    the expression as the program wrote it (clipped)."""

    source: str

    def as_dict(self) -> dict[str, str]:
        """``{"$dynamic": source}``: how JSON output (the audit, live events) writes it."""
        return {"$dynamic": self.source}


@attrs.frozen
class ToolCallSite:
    """One place the program names a tool.

    ``tool`` as written; ``line`` and ``column`` (1-based; the column in UTF-8
    bytes, as run errors count it); ``arguments``: JSON-shaped literals with
    a :class:`Dynamic` for each value not known statically (the whole
    argument when it is not a literal; ``None`` for no argument);
    ``in_loop``, ``in_parallel``; ``called``: False when the tool is only
    referenced here (aliased, passed on), so it may run any number of times;
    ``known``: the run has a tool of this name.
    """

    tool: str
    line: int
    column: int
    arguments: Any
    in_loop: bool = False
    in_parallel: bool = False
    called: bool = True
    known: bool = True

    @property
    def repeated(self) -> bool:
        """Whether this site may run its tool more than once (in a loop, or only referenced)."""
        return self.in_loop or not self.called

    def as_dict(self) -> dict[str, Any]:
        """JSON-shaped (each :class:`Dynamic` as ``{"$dynamic": source}``)."""
        return {
            "tool": self.tool,
            "line": self.line,
            "column": self.column,
            "arguments": _plain(self.arguments),
            "in_loop": self.in_loop,
            "in_parallel": self.in_parallel,
            "called": self.called,
            "known": self.known,
        }


@attrs.frozen
class CallCount:
    """How a program calls one tool (:meth:`ProgramSummary.calls_to`): ``sites``
    (call sites naming it), ``in_loop`` and ``in_parallel`` (of them),
    ``referenced`` (sites that only reference it) and ``bounded``: the number of
    calls is at most ``sites`` (no site repeats, no dynamic access)."""

    sites: int
    in_loop: int
    in_parallel: int
    referenced: int
    bounded: bool

    @property
    def at_most(self) -> Optional[int]:
        """The most calls the program can make to the tool, or ``None``: unbounded."""
        return self.sites if self.bounded else None


@attrs.frozen
class ProgramSummary:
    """What a program's text says it will do (see :func:`summarize`). Frozen.

    ``calls``: every :class:`ToolCallSite`, in the program's order;
    ``dynamic``: why the program may call any granted tool (each reason with
    its ``line:column``; empty when it names every tool it can call);
    ``unknown``, ``denied``, ``gated``: names it calls that the run does not
    have, that the policy denies, that need approval; ``reaches_gated``:
    whether it can reach a tool needing approval; ``bytes``, ``lines``: its
    size; ``error``: why it could not be read whole (a syntax error, the size
    or depth bound), else ``None``; ``complete``: the whole program was read.
    """

    calls: tuple[ToolCallSite, ...] = ()
    dynamic: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    denied: tuple[str, ...] = ()
    gated: tuple[str, ...] = ()
    reaches_gated: bool = False
    bytes: int = 0
    lines: int = 0
    error: Optional[str] = None
    complete: bool = True

    @property
    def is_dynamic(self) -> bool:
        """Whether the program may call any granted tool (its ``dynamic`` reasons are not empty)."""
        return bool(self.dynamic)

    @property
    def parsed(self) -> bool:
        """Whether the program parsed (no syntax error; TypeScript that can run)."""
        return self.error is None or not self.error.startswith("SyntaxError")

    @property
    def tools(self) -> tuple[str, ...]:
        """The tools the program names, sorted, each once."""
        return tuple(sorted({site.tool for site in self.calls}))

    def calls_to(self, name: str) -> CallCount:
        """How the program calls ``name``: its sites, how many are in a loop or in
        parallel, and whether the number of calls is bounded by them."""
        sites = [s for s in self.calls if s.tool == name]
        return CallCount(
            sites=len(sites),
            in_loop=sum(s.in_loop for s in sites),
            in_parallel=sum(s.in_parallel for s in sites),
            referenced=sum(not s.called for s in sites),
            bounded=not self.dynamic and not any(s.repeated for s in sites),
        )

    def coming(self, name: str) -> str:
        """What the program's text says is coming for tool ``name``, in words, for an
        approval question (``ApprovalRequest.coming``): how many calls at most, or that
        they are unbounded (a site in a loop, or dynamic access); ``""`` when the text
        names no call to it and has no dynamic access."""
        count = self.calls_to(name)
        if count.sites == 0 and not self.dynamic:
            return ""
        where = []
        if count.in_loop:
            where.append(f"{count.in_loop} in a loop")
        if count.in_parallel:
            where.append(f"{count.in_parallel} in parallel")
        sites = f"{count.sites} call site{'s' if count.sites != 1 else ''}" + (
            f" ({', '.join(where)})" if where else ""
        )
        if count.at_most is not None:
            return f"the program's text has {sites}: at most {count.at_most} call{'s' if count.at_most != 1 else ''} in all"
        why = "dynamic access to the tools" if self.dynamic else "a call site that repeats"
        return f"the program's text has {sites}, and {why}: no bound on how many calls may come"

    def describe(self) -> tuple[str, ...]:
        """The summary in lines a person reads (not yet escaped: the approval
        question escapes and clips them, ``nous_sched.gate.approval_text``)."""
        lines = [f"Size: {self.bytes:,} bytes, {self.lines:,} lines."]
        if self.error is not None:
            lines.append(f"Not read whole: {self.error}")
        if self.dynamic:
            lines.append(f"{ANY_TOOL.capitalize()}: " + "; ".join(self.dynamic))
        for name in self.tools:
            count = self.calls_to(name)
            how = [f"{count.sites} site{'s' if count.sites != 1 else ''}"]
            if count.in_loop:
                how.append(f"{count.in_loop} in a loop")
            if count.in_parallel:
                how.append(f"{count.in_parallel} in parallel")
            if count.referenced:
                how.append(f"{count.referenced} referenced, not called")
            marks = [m for m, on in (("unknown", name in self.unknown), ("needs approval", name in self.gated)) if on]
            lines.append(f"Calls {name}: {', '.join(how)}" + (f" ({', '.join(marks)})" if marks else ""))
        for site in self.calls[:_SITE_LINES]:
            lines.append(f"At {site.line}:{site.column}: {_shown(site)}")
        if len(self.calls) > _SITE_LINES:
            lines.append(f"… and {len(self.calls) - _SITE_LINES} more call sites.")
        if not self.calls and not self.dynamic:
            lines.append("Calls no tool.")
        if self.reaches_gated:
            lines.append("Can reach a tool that needs approval.")
        return tuple(lines)

    def as_dict(self) -> dict[str, Any]:
        """JSON-shaped: every field, each call site's :meth:`~ToolCallSite.as_dict`."""
        return {
            "calls": [site.as_dict() for site in self.calls],
            "dynamic": list(self.dynamic),
            "unknown": list(self.unknown),
            "denied": list(self.denied),
            "gated": list(self.gated),
            "reaches_gated": self.reaches_gated,
            "bytes": self.bytes,
            "lines": self.lines,
            "error": self.error,
            "complete": self.complete,
        }


#: Call sites :meth:`ProgramSummary.describe` shows one per line, at most.
_SITE_LINES = 12


def _shown(site: ToolCallSite) -> str:
    """A call site in words: ``tool(arguments)`` and where it runs, each unknown value as ``<its source>``."""
    if not site.called:
        return f"{site.tool} referenced, not called (it may run any number of times)"
    try:
        arguments = "" if site.arguments is None else json.dumps(_marked(site.arguments), ensure_ascii=False)
        arguments = arguments.replace('"\ue000', "<").replace('\ue001"', ">")  # an unknown value unquoted
    except (TypeError, ValueError):
        arguments = "…"
    where = [w for w, on in (("in a loop", site.in_loop), ("in parallel", site.in_parallel)) if on]
    return f"{site.tool}({arguments})" + (f" {', '.join(where)}" if where else "")


def _marked(value: Any) -> Any:
    if isinstance(value, Dynamic):
        return f"\ue000{value.source}\ue001"
    if isinstance(value, dict):
        return {k: _marked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_marked(v) for v in value]
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, Dynamic):
        return value.as_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def summarize(code: str, tools: Iterable[Tool] = (), *, policy: Optional[PermissionPolicy] = None) -> ProgramSummary:
    """The static summary of ``code`` run with ``tools`` under ``policy`` (see the module docstring).

    Never raises for any string: a syntax error is a summary whose ``error``
    says so. Cost: one tree-sitter parse and one walk of the tree, within
    ``MAX_BYTES``, ``MAX_NODES``, ``MAX_DEPTH`` and ``MAX_SITES``
    (``nous_sched.review._summary``).

    :raises ConfigError: ``tools`` is not an iterable of :class:`~nous_sched.Tool`,
        or ``code`` is not a string.
    """
    if not isinstance(code, str):
        fail("summarize", "code", code, "a string: the program")
    granted, denied = partition(tools, policy, "summarize")
    return summarize_parts(code, granted, denied, approval_names(policy, granted.values()))


def summarize_parts(
    code: str, granted: Mapping[str, Tool], denied: Mapping[str, Tool], gated_names: frozenset[str]
) -> ProgramSummary:
    """:func:`summarize` of a run already partitioned: its ``granted`` and
    ``denied`` tools by name, and the names its policy gates."""
    data = code.encode("utf-8", "surrogatepass")
    size = {"bytes": len(data), "lines": code.count("\n") + 1 if code else 0}
    reading = _Reading(granted, denied, gated_names)
    if len(data) > MAX_BYTES:
        error = f"the program is {len(data):,} bytes, over the {MAX_BYTES:,} this summary reads"
        return reading.summary(size, error, complete=False, reason=f"not read: {error}")
    root, named = _parse(unfence(code).encode("utf-8", "surrogatepass"))
    if root.has_error:
        error = f"SyntaxError: the program does not parse (first at {_first_error(root)})"
        return reading.summary(size, error, complete=False, reason="not read: a syntax error")
    reading.walk(root, named)
    return reading.summary(size, reading.error, complete=reading.error is None)


# -- the parse -------------------------------------------------------------------------

_NAMES_QUERY = """
(function_declaration name: (identifier) @name)
(generator_function_declaration name: (identifier) @name)
(variable_declarator name: (identifier) @name value: [(arrow_function) (function_expression)])
"""


def _parse(data: bytes) -> tuple[Any, frozenset[str]]:
    """The tree of ``data`` and the names its named functions are declared under."""
    root, found = _tree_sitter.parse(data, _NAMES_QUERY)
    return root, frozenset(_text(n) for n in found.get("name", ()))


def _text(node: Any) -> str:
    return bytes(node.text).decode("utf-8", "replace")


def _at(node: Any) -> str:
    row, column = node.start_point
    return f"{row + 1}:{column + 1}"


def _first_error(root: Any) -> str:
    """Where the first syntax error is (``line:column``), found by descending only into erring nodes."""
    node = root
    for _ in range(MAX_DEPTH):
        if node.is_error or node.is_missing:
            return _at(node)
        nxt = next((c for c in node.children if c.has_error or c.is_missing), None)
        if nxt is None:
            return _at(node)
        node = nxt
    return _at(node)


def _source(node: Any) -> str:
    text = " ".join(_text(node).split())
    return text if len(text) <= _SOURCE_CHARS else text[: _SOURCE_CHARS - 1] + "…"


# -- the walk -------------------------------------------------------------------------


@attrs.frozen
class _Context:
    loop: bool = False
    parallel: bool = False
    functions: tuple[str, ...] = ()  # the named functions around, innermost last
    in_class: bool = False


class _Frame:
    """How a node's children are walked: each in ``ctx``, but those in ``special``
    (by node id) as it says: ``None`` skips one, a :class:`_Context` is its
    context, a :class:`_Frame` is its context and how its own children are walked."""

    __slots__ = ("ctx", "special")

    def __init__(self, ctx: _Context, special: Optional[dict[int, Any]] = None) -> None:
        self.ctx = ctx
        self.special = special

    def of(self, node: Any) -> Any:
        return self.ctx if self.special is None else self.special.get(node.id, self.ctx)


class _Reading:
    """One walk of one tree: the call sites, the dynamic reasons, the named functions' uses."""

    def __init__(self, granted: Mapping[str, Tool], denied: Mapping[str, Tool], gated: frozenset[str]) -> None:
        self.granted = granted
        self.denied = denied
        self.gated_names = gated
        self.sites: list[tuple[ToolCallSite, tuple[str, ...]]] = []
        self.reasons: list[str] = []
        self.error: Optional[str] = None
        # A named function's uses: (loop, parallel, the functions around the use).
        self.uses: dict[str, list[tuple[bool, bool, tuple[str, ...]]]] = {}

    def dynamic(self, why: str, node: Any) -> None:
        if len(self.reasons) < _REASONS:
            self.reasons.append(f"{why} at {_at(node)}")

    def walk(self, root: Any, functions: frozenset[str]) -> None:
        """One cursor walk of the tree (no node object made for a node it only passes)."""
        cursor = root.walk()
        frames: list[_Frame] = []
        nodes = 0
        while True:
            node = cursor.node
            entry = _Context() if not frames else frames[-1].of(node)
            forced = entry if isinstance(entry, _Frame) else None
            ctx = forced.ctx if forced is not None else entry
            if ctx is not None:
                nodes += 1
                if nodes > MAX_NODES or len(self.sites) > MAX_SITES:
                    self._stop(node, nodes > MAX_NODES)
                    return
                kind = node.type
                if forced is not None:
                    frame: Optional[_Frame] = forced
                elif kind in _PLAIN:
                    frame = _Frame(ctx)
                else:
                    frame = None if kind in _TYPES else self._visit(node, ctx, functions)
                if frame is not None and node.child_count:
                    if len(frames) >= MAX_DEPTH:
                        self._too_deep(node)
                    elif cursor.goto_first_child():
                        frames.append(frame)
                        continue
            while not cursor.goto_next_sibling():
                if not cursor.goto_parent():
                    return
                frames.pop()

    def _stop(self, node: Any, nodes: bool) -> None:
        what = f"more than {MAX_NODES:,} syntax nodes" if nodes else f"tools named at more than {MAX_SITES:,} places"
        self.error = f"the program has {what}; not read past them"
        self.dynamic(what, node)

    def _too_deep(self, node: Any) -> None:
        if self.error is None:
            self.error = f"the program nests deeper than {MAX_DEPTH} at {_at(node)}; not read past it"
            self.dynamic(f"nesting deeper than {MAX_DEPTH}", node)

    def _visit(self, node: Any, ctx: _Context, functions: frozenset[str]) -> Optional[_Frame]:
        """What ``node`` says, and how to walk its children (``None``: not at all)."""
        kind = node.type
        if kind in ("identifier", "shorthand_property_identifier"):
            self._name(node, ctx, functions)
            return None
        visit = _VISITS.get(kind)
        if visit is not None:
            return visit(self, node, ctx)
        if kind == "this" and not ctx.in_class:
            self.dynamic("`this` outside a class (may be the global object, which holds `tools`)", node)
        elif kind in _REFUSED:
            self.error = f"SyntaxError: TypeScript that cannot run ({kind} at {_at(node)})"
            self.dynamic("TypeScript that cannot run", node)
        return _Frame(ctx)

    def _member(self, node: Any, ctx: _Context) -> Optional[_Frame]:
        target = node.child_by_field_name("object")
        if target is not None and target.type == "identifier" and _text(target) == "tools":
            return self._tool(node, ctx)
        if node.type == "member_expression":
            prop = node.child_by_field_name("property")
            key = _text(prop) if prop is not None else None
        else:
            index = node.child_by_field_name("index")
            key = _literal_string(index) if index is not None else None
        if key == "constructor":
            self.dynamic("a `constructor` property (reaches `Function`: code from a string)", node)
        return _Frame(ctx)

    def _name(self, node: Any, ctx: _Context, functions: frozenset[str]) -> None:
        name = _text(node)
        if name == "tools":
            self.dynamic("the `tools` object used as a value (aliased or passed on)", node)
        elif name in _GLOBAL_REACH:
            self.dynamic(_GLOBAL_REACH[name], node)
        elif name in functions:
            self.uses.setdefault(name, []).append((ctx.loop, ctx.parallel, ctx.functions))

    def _for(self, node: Any, ctx: _Context) -> _Frame:
        once = [node.child_by_field_name(f) for f in ("initializer", "right", "left")]
        return _Frame(attrs.evolve(ctx, loop=True), {n.id: ctx for n in once if n is not None})

    def _loop(self, node: Any, ctx: _Context) -> _Frame:
        return _Frame(attrs.evolve(ctx, loop=True))

    def _class(self, node: Any, ctx: _Context) -> _Frame:
        return _Frame(attrs.evolve(ctx, in_class=True))

    def _function(self, node: Any, ctx: _Context) -> _Frame:
        """A named function: its body knows it is inside it (for the uses of its name)."""
        name = node.child_by_field_name("name")
        if node.type == "variable_declarator":
            value = node.child_by_field_name("value")
            if name is None or name.type != "identifier" or value is None or value.type not in _FUNCTIONS:
                return _Frame(ctx)
        if name is None:
            return _Frame(ctx)
        return _Frame(attrs.evolve(ctx, functions=(*ctx.functions, _text(name))), {name.id: None})

    def _call(self, node: Any, ctx: _Context) -> _Frame:
        callee = node.child_by_field_name("function")
        args = node.child_by_field_name("arguments")
        if callee is None or args is None:
            return _Frame(ctx)
        if callee.type == "import":
            self.dynamic("`import()` (code from elsewhere)", callee)
        arg_ctx, callback_ctx = ctx, ctx
        if callee.type == "member_expression":
            target, prop = callee.child_by_field_name("object"), callee.child_by_field_name("property")
            method = _text(prop) if prop is not None else ""
            on = _text(target) if target is not None else ""
            if on == "Promise" and method in _PARALLEL:
                arg_ctx = callback_ctx = attrs.evolve(ctx, parallel=True)
            elif method in _ITERATING and on != "tools":
                callback_ctx = attrs.evolve(ctx, loop=True)
        elif callee.type == "subscript_expression":
            target, index = callee.child_by_field_name("object"), callee.child_by_field_name("index")
            is_tools = target is not None and target.type == "identifier" and _text(target) == "tools"
            if not is_tools and index is not None and _literal_string(index) is None:
                self.dynamic("a call of a computed member (`x[k](...)`: may reach `Function`)", callee)
        if arg_ctx is ctx and callback_ctx is ctx:
            return _Frame(ctx)
        # The arguments' own children: a frame for `arguments` whose children get their contexts.
        inner = {c.id: (callback_ctx if c.type in _CALLBACKS else arg_ctx) for c in args.children}
        return _Frame(ctx, {args.id: _Frame(ctx, inner)})

    def _tool(self, node: Any, ctx: _Context) -> Optional[_Frame]:
        """``tools.x`` / ``tools[...]``: a call site, or a computed name (dynamic)."""
        if node.type == "member_expression":
            prop = node.child_by_field_name("property")
            name: Optional[str] = _text(prop) if prop is not None else None
            index = None
        else:
            index = node.child_by_field_name("index")
            name = _literal_string(index) if index is not None else None
        if name is None:
            self.dynamic("a computed tool name (`tools[...]`)", node)
            target = node.child_by_field_name("object")
            return _Frame(ctx, {target.id: None}) if target is not None else None  # (its index is walked)
        parent = node.parent
        fn = parent.child_by_field_name("function") if parent is not None and parent.type == "call_expression" else None
        called = fn is not None and fn.id == node.id
        arguments: Any = None
        if called:
            args = parent.child_by_field_name("arguments")
            values = [c for c in args.named_children if c.type != "comment"] if args is not None else []
            if values:
                first = values[0]
                arguments = Dynamic(_source(first)) if first.type == "spread_element" else _literal(first, 0)
        else:
            arguments = Dynamic("(referenced, not called here)")
        row, column = node.start_point
        site = ToolCallSite(
            tool=name,
            line=row + 1,
            column=column + 1,
            arguments=arguments,
            in_loop=ctx.loop,
            in_parallel=ctx.parallel,
            called=called,
            known=name in self.granted or name in self.denied,
        )
        self.sites.append((site, ctx.functions))
        return None

    def summary(
        self, size: dict[str, int], error: Optional[str], complete: bool, reason: Optional[str] = None
    ) -> ProgramSummary:
        if reason is not None:
            self.reasons.append(reason)
        looped, parallel = self._propagated()
        sites = []
        for site, around in self.sites:
            loop = site.in_loop or any(f in looped for f in around)
            par = site.in_parallel or any(f in parallel for f in around)
            sites.append(
                attrs.evolve(site, in_loop=loop, in_parallel=par)
                if (loop, par) != (site.in_loop, site.in_parallel)
                else site
            )
        names = {s.tool for s in sites}
        gated = sorted(n for n in names if n in self.granted and needs_approval(self.granted[n], self.gated_names))
        any_gated = any(needs_approval(t, self.gated_names) for t in self.granted.values())
        return ProgramSummary(
            calls=tuple(sites),
            dynamic=tuple(self.reasons),
            unknown=tuple(sorted(n for n in names if n not in self.granted and n not in self.denied)),
            denied=tuple(sorted(n for n in names if n in self.denied)),
            gated=tuple(gated),
            reaches_gated=bool(gated) or (bool(self.reasons) and any_gated),
            bytes=size["bytes"],
            lines=size["lines"],
            error=error,
            complete=complete,
        )

    def _propagated(self) -> tuple[set[str], set[str]]:
        """The named functions run in a loop (or recursively) and in parallel: a
        use in one, or inside a function that is, until nothing changes."""
        looped: set[str] = set()
        parallel: set[str] = set()
        for name, uses in self.uses.items():
            for loop, par, around in uses:
                if loop or name in around:  # (a function using itself: recursion)
                    looped.add(name)
                if par:
                    parallel.add(name)
        for _ in range(len(self.uses) + 1):
            changed = False
            for name, uses in self.uses.items():
                for _loop, _par, around in uses:
                    if name not in looped and any(f in looped for f in around):
                        looped.add(name)
                        changed = True
                    if name not in parallel and any(f in parallel for f in around):
                        parallel.add(name)
                        changed = True
            if not changed:
                break
        return looped, parallel


#: The node types the walk has something to do for, by type.
_VISITS: dict[str, Callable[[_Reading, Any, _Context], Optional[_Frame]]] = {
    "member_expression": _Reading._member,  # noqa: SLF001
    "subscript_expression": _Reading._member,  # noqa: SLF001
    "call_expression": _Reading._call,  # noqa: SLF001
    "for_statement": _Reading._for,  # noqa: SLF001
    "for_in_statement": _Reading._for,  # noqa: SLF001
    "while_statement": _Reading._loop,  # noqa: SLF001
    "do_statement": _Reading._loop,  # noqa: SLF001
    "class_declaration": _Reading._class,  # noqa: SLF001
    "class": _Reading._class,  # noqa: SLF001
    "abstract_class_declaration": _Reading._class,  # noqa: SLF001
    "function_declaration": _Reading._function,  # noqa: SLF001
    "generator_function_declaration": _Reading._function,  # noqa: SLF001
    "variable_declarator": _Reading._function,  # noqa: SLF001
}


# -- literals -------------------------------------------------------------------------

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "v": "\v", "0": "\0"}


def _literal_string(node: Any) -> Optional[str]:
    """The value of a string literal (or a template with no substitution), else ``None``."""
    if node.type not in ("string", "template_string"):
        return None
    out = []
    for child in node.named_children:
        if child.type == "string_fragment":
            out.append(_text(child))
        elif child.type == "escape_sequence":
            out.append(_unescape(_text(child)))
        else:  # a substitution, a comment
            return None
    return "".join(out)


def _unescape(escape: str) -> str:
    body = escape[1:]
    if not body or body[0] in "\r\n\u2028\u2029":
        return ""  # a line continuation
    if body[0] in _ESCAPES and len(body) == 1:
        return _ESCAPES[body[0]]
    try:
        if body[0] == "x":
            return chr(int(body[1:3], 16))
        if body[0] == "u":
            digits = body[2:-1] if body.startswith("u{") else body[1:5]
            return chr(int(digits, 16))
    except ValueError:
        return escape
    return body


def _number(text: str) -> Union[int, float, None]:
    text = text.replace("_", "")
    if text.endswith("n"):
        return None  # a BigInt crosses as no JSON number
    try:
        if text[:2].lower() in ("0x", "0o", "0b"):
            return int(text, 0)
        if len(text) > 1 and text[0] == "0" and text[1].isdigit():
            return None  # a legacy octal: not read here
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    if value.is_integer() and not any(c in text for c in ".eE"):
        return int(text)
    return value


def _literal(node: Any, depth: int) -> Any:
    """``node``'s value when it is a literal (recursively), else a :class:`Dynamic`."""
    kind = node.type
    if depth > _LITERAL_DEPTH:
        return Dynamic(_source(node))
    if kind == "array":
        return _array(node, depth)
    if kind == "object":
        return _object(node, depth)
    if kind == "parenthesized_expression" and node.named_child_count == 1:
        return _literal(node.named_children[0], depth + 1)
    value = _scalar(node, kind)
    return Dynamic(_source(node)) if value is _NOT_LITERAL else value


_NOT_LITERAL = object()


def _scalar(node: Any, kind: str) -> Any:
    """A string, number, boolean or null literal's value (a negated number too), else :data:`_NOT_LITERAL`."""
    if kind in ("string", "template_string"):
        text = _literal_string(node)
        return _NOT_LITERAL if text is None or len(text) > _LITERAL_CHARS else text
    if kind in ("true", "false"):
        return kind == "true"
    if kind == "null":
        return None
    sign = 1
    if kind == "unary_expression" and node.child_count == 2 and node.children[0].type in ("-", "+"):
        sign = -1 if node.children[0].type == "-" else 1
        node = node.children[1]
        kind = node.type
    if kind == "number":
        value = _number(_text(node))
        return _NOT_LITERAL if value is None else sign * value
    return _NOT_LITERAL


def _array(node: Any, depth: int) -> Any:
    items = [c for c in node.named_children if c.type != "comment"]
    if len(items) > _LITERAL_ITEMS or any(c.type == "spread_element" for c in items):
        return Dynamic(_source(node))
    return [_literal(c, depth + 1) for c in items]


def _object(node: Any, depth: int) -> Any:
    members = [c for c in node.named_children if c.type != "comment"]
    if len(members) > _LITERAL_ITEMS:
        return Dynamic(_source(node))
    out: dict[str, Any] = {}
    for member in members:
        if member.type == "shorthand_property_identifier":
            out[_text(member)] = Dynamic(_text(member))
            continue
        if member.type != "pair":
            return Dynamic(_source(node))  # a spread, a method, a getter: its keys are not all known
        key_node, value = member.child_by_field_name("key"), member.child_by_field_name("value")
        if key_node is None or value is None:
            return Dynamic(_source(node))
        if key_node.type == "property_identifier":
            key = _text(key_node)
        elif key_node.type == "number":
            number = _number(_text(key_node))
            if number is None:
                return Dynamic(_source(node))
            key = str(number)
        else:
            literal = _literal_string(key_node)
            if literal is None:
                return Dynamic(_source(node))  # a computed key
            key = literal
        out[key] = _literal(value, depth + 1)
    return out

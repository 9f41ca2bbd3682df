"""TypeScript syntax removed from a program, every position kept.

Models shown the SDK as TypeScript declarations answer in TypeScript. The
engine runs JavaScript, so before a program runs its type syntax is replaced
by spaces (newlines kept): every remaining character stays at the line and
column it had, and an error QuickJS reports points into the model's own text.

The program is parsed by tree-sitter's TypeScript grammar (a maintained
parser, never patterns over the text). What is removed: type annotations
(``: T`` on variables, parameters, fields and return types), ``as`` and
``satisfies`` casts, non-null ``!``, generic arguments and parameters
(``f<T>(x)``, ``<T>x``), ``interface`` and ``type`` declarations, ``declare``
statements, overload signatures, ``implements`` clauses, optional-mark ``?``
and the modifiers ``private``/``public``/``protected``/``readonly``/
``abstract``/``override``. What cannot be removed because it has a value at
run time (``enum``, ``namespace``, decorators, constructor parameter
properties) is refused with a :class:`Refused` naming the construct, its
position and what to write instead.

The same parse tells whether the program's last top-level statement is an
expression (:attr:`Stripped.last`), for the REPL rule of
:mod:`nous_sched.runtime._program`.
"""

from __future__ import annotations

from typing import Any, Optional

from .. import _tree_sitter

__all__ = ["Refused", "Stripped", "strip"]

#: What to remove and refuse, found by one tree-sitter query (run in C: a
#: walk in Python would cost more than the parse). ``whole``: nodes of which
#: nothing runs; ``cast``: ``as T`` / ``satisfies T`` after the expression;
#: ``bang``: a non-null ``!``; ``token``: an optional mark or a modifier;
#: ``refused``/``property``: constructs with a value at run time.
_QUERY = """
[(type_annotation) (type_arguments) (type_parameters) (type_predicate_annotation) (asserts_annotation)
 (interface_declaration) (type_alias_declaration) (implements_clause) (accessibility_modifier)
 (override_modifier) (ambient_declaration) (function_signature) (abstract_method_signature)
 (index_signature) (method_signature)] @whole
[(as_expression) (satisfies_expression)] @cast
(non_null_expression) @bang
(optional_parameter "?" @token)
(public_field_definition ["?" "!" "readonly" "declare" "abstract"] @token)
(method_definition "?" @token)
(abstract_class_declaration "abstract" @token)
[(enum_declaration) (internal_module) (module) (decorator)] @refused
(required_parameter [(accessibility_modifier) (override_modifier) "readonly"]) @property
"""
#: Constructs with a value at run time: what to write instead.
_REFUSED = {
    "enum_declaration": "an `enum` has a value at run time; write a plain object instead, "
    "e.g. const Color = {Red: 0, Green: 1}",
    "internal_module": "a `namespace` has a value at run time; write a plain object of functions instead",
    "module": "a `module` block has a value at run time; write a plain object of functions instead",
    "decorator": "a decorator has a value at run time; call the function on the class or method yourself",
}
_PARAMETER_PROPERTY = (
    "a constructor parameter property (`public x` in a constructor's parameters) assigns a field at run time; "
    "declare the field and assign it in the constructor's body"
)


class Refused(Exception):
    """TypeScript that cannot be removed: ``message`` says what and what to write
    instead, ``line`` and ``column`` (1-based) where."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


class Stripped:
    """The program without its type syntax: ``data``, its UTF-8 (same length
    in bytes, same lines, the same columns as QuickJS counts them: UTF-8
    bytes), ``changed`` when anything was removed, ``clean`` when the parse
    found no syntax error, and ``last``: the last top-level statement as
    ``(start, end, ends_with_semicolon, previous_end)`` byte offsets when it
    is an expression statement (``previous_end`` is where the statement
    before it ends, or ``None``), else ``None``."""

    __slots__ = ("data", "changed", "clean", "last")

    def __init__(self, data: bytes, changed: bool, clean: bool, last: Optional[tuple[int, int, bool, Optional[int]]]):
        self.data = data
        self.changed = changed
        self.clean = clean
        self.last = last

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "surrogatepass")


def _parse(data: bytes) -> tuple[Any, dict[str, list[Any]]]:
    """The tree of ``data`` and the query's captures in it."""
    return _tree_sitter.parse(data, _QUERY)


_KEPT = ("\n", "\r", "\u2028", "\u2029")


def strip(text: str) -> Stripped:
    """``text`` with its TypeScript syntax replaced by spaces.

    :raises Refused: the program uses TypeScript with a value at run time.
    """
    data = text.encode("utf-8", "surrogatepass")
    root, found = _parse(data)
    spans: list[tuple[int, int]] = []
    try:
        _collect(found, spans)
    except _At as at:
        raise _refused(at, data) from None
    if spans:
        out = bytearray(data)
        for start, end in spans:
            out[start:end] = _blank(data[start:end])
        data = bytes(out)
    return Stripped(data, bool(spans), not root.has_error, _last(root))


def _blank(piece: bytes) -> bytes:
    """``piece`` as spaces, one per byte (QuickJS counts columns in UTF-8 bytes), its line ends kept."""
    text = piece.decode("utf-8", "surrogatepass")
    if text.isascii() and "\n" not in text and "\r" not in text:
        return b" " * len(piece)
    return b"".join(c.encode("utf-8") if c in _KEPT else b" " * len(c.encode("utf-8", "surrogatepass")) for c in text)


def _collect(found: dict[str, list[Any]], spans: list[tuple[int, int]]) -> None:
    """Every byte span to blank; :class:`_At` the first construct that cannot go."""
    refused = [(n.start_byte, _REFUSED[n.type]) for n in found.get("refused", ())]
    refused += [(n.start_byte, _PARAMETER_PROPERTY) for n in found.get("property", ())]
    if refused:
        raise _At(*min(refused)[::-1])
    spans.extend((n.start_byte, n.end_byte) for n in found.get("whole", ()))
    spans.extend((n.start_byte, n.end_byte) for n in found.get("token", ()))
    for node in found.get("cast", ()):
        spans.append((node.children[0].end_byte, node.end_byte))
    for node in found.get("bang", ()):
        spans.append((node.children[-1].start_byte, node.end_byte))


class _At(Exception):
    def __init__(self, why: str, start: int) -> None:
        self.why = why
        self.start = start


def _refused(at: _At, data: bytes) -> Refused:
    index = at.start
    line_start = data.rfind(b"\n", 0, index) + 1
    line = data.count(b"\n", 0, index) + 1
    shown = data[index:].split(b"\n", 1)[0][:60].decode("utf-8", "replace")
    return Refused(f"TypeScript that cannot run: {at.why} (at `{shown}`)", line, index - line_start + 1)


def _last(root: Any) -> Optional[tuple[int, int, bool, Optional[int]]]:
    """The last top-level statement, when it is an expression statement (see :class:`Stripped`)."""
    statements = [c for c in root.named_children if c.type != "comment"]
    if not statements or root.has_error:
        return None
    last = statements[-1]
    if last.type != "expression_statement" or any(c.type == "internal_module" for c in last.children):
        return None
    semicolon = last.child_count > 1 and last.children[-1].type == ";"
    previous = _code_end(statements[-2]) if len(statements) > 1 else None
    return int(last.start_byte), _code_end(last), semicolon, previous


def _code_end(node: Any) -> int:
    """Where ``node``'s last token ends: a statement ended by a newline (no
    semicolon) may span the comment after it, up to the newline."""
    while node.child_count:
        tokens = [c for c in node.children if c.type != "comment" and c.end_byte > c.start_byte]
        if not tokens:
            break
        node = tokens[-1]
    return int(node.end_byte)

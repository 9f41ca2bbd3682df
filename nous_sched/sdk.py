"""Render the tool SDK: the declarations a program is written against.

The text goes into the ``run_code`` tool's description and is the program's
*only* description of the tools it may call, which drives every rule here.

Byte stability
    Tools are de-duplicated by name (the first occurrence wins), then sorted by
    name, and every property map is walked in sorted order. The same tool *set*
    therefore renders to the same bytes whatever order it arrives in or how its
    dicts were built. The SDK sits in the prompt prefix of every request, so an
    unstable ordering would defeat the provider's prompt cache on every turn.

Total on schemas
    :func:`json_schema_to_type` and :func:`render` never raise on a schema. A
    node that cannot be expressed - a ``$ref`` (there is no resolver), an
    unknown ``type``, a malformed value, nesting deeper than a dozen levels -
    becomes the escape hatch (``unknown`` in TypeScript, ``Any`` in Python).
    That costs the node its type and nothing else: a program cannot call any
    tool if the SDK does not parse.

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
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import ConfigError

__all__ = ["GLOBAL", "ERROR_CLASS", "render", "json_schema_to_type", "coerce_language", "languages"]

#: The global a program calls tools through; bindings must use the same name.
GLOBAL = "tools"
#: The error a failed or denied call raises in the program.
ERROR_CLASS = "ToolError"

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

_TS_ANY = "unknown"
_PY_ANY = "Any"
_TS_SCALARS = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean", "null": "null"}
_PY_SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "None"}

_TS_HEADER = f"""\
// Tool SDK (generated). These declarations are the only description of the
// tools your program may call.
//
//     const out = await {GLOBAL}["<tool name>"]({{ /* arguments */ }});
//
// `{GLOBAL}` is indexed by each tool's EXACT name, so a name that is not a
// valid identifier needs no alias. Every tool takes a single arguments
// object. Calls go through the same permission policy as a direct tool call:
// one that is denied or fails raises `{ERROR_CLASS}` carrying only the tool
// name and a message.
"""

_PY_HEADER = f"""\
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

from typing import Any, Callable, Literal, NotRequired, TypedDict
"""

# Control characters count as whitespace too: a NUL or a line separator in a
# one-line comment would break the Python stub.
_RUNS_OF_SPACE = re.compile(r"[\s\x00-\x1f\x7f]+")
_ESCAPE = ("escape",)


def languages() -> tuple[str, ...]:
    """Every language name :func:`render` accepts."""
    return tuple(_CANONICAL)


def coerce_language(value: Any) -> str | None:
    """The canonical language (``"typescript"`` or ``"python"``) for ``value``.

    Returns ``None`` rather than raising for anything unknown (including
    non-strings), so a caller holding a configured language can fall back.
    """
    return _CANONICAL.get(value) if isinstance(value, str) else None


def render(tools: Iterable[Any], language: str = "typescript") -> str:
    """Render the SDK declaring ``tools``.

    A tool is any object with ``name``, ``description`` and ``parameters`` (a
    JSON Schema mapping or ``None``). Tools whose name is not a non-empty
    string are skipped; of several with one name the first wins. The output
    depends only on the resulting set of tools, never on their order, and is
    identical on every call. Never raises on a schema; raises
    :class:`~nous_sched.errors.ConfigError` for an unknown ``language``.
    """
    lang = _require_language(language)
    chosen: dict[str, Any] = {}
    for tool in tools:
        name = getattr(tool, "name", None)
        if isinstance(name, str) and name and name not in chosen:
            chosen[name] = tool
    ordered = [chosen[name] for name in sorted(chosen)]
    return _render_python(ordered) if lang == "python" else _render_typescript(ordered)


def json_schema_to_type(schema: Any, language: str = "typescript") -> str:
    """The ``language`` type expression for one JSON Schema node.

    Accepts any value: whatever cannot be expressed becomes ``unknown``
    (TypeScript) or ``Any`` (Python) instead of raising.
    """
    return _py(schema, 0) if _require_language(language) == "python" else _ts(schema, 0)


def _require_language(language: Any) -> str:
    lang = coerce_language(language)
    if lang is None:
        accepted = ", ".join(repr(name) for name in _CANONICAL)
        raise ConfigError(f"unsupported SDK language {language!r}; expected one of {accepted}")
    return lang


# --- TypeScript ---------------------------------------------------------------


def _render_typescript(tools: list[Any]) -> str:
    members = "\n\n".join(_ts_member(tool) for tool in tools)
    body = f"\n{members}\n" if members else ""
    return f"{_TS_HEADER}\ndeclare const {GLOBAL}: {{{body}}};\n"


def _ts_member(tool: Any) -> str:
    args = _ts_args(getattr(tool, "parameters", None))
    return _ts_doc(getattr(tool, "description", None)) + f"  {_literal(tool.name)}(args: {args}): Promise<{_TS_ANY}>;"


def _ts_doc(description: Any) -> str:
    if not isinstance(description, str) or not (text := description.strip()):
        return ""
    lines = "".join(f"   * {line.rstrip()}\n" for line in re.split(r"\r?\n", _close_safe(text)))
    return f"  /**\n{lines}   */\n"


def _ts_args(parameters: Any) -> str:
    # The top-level arguments are the one place a parameter's own description
    # can reach the model, so they get a line and a doc comment each; nested
    # types stay on one line to keep the prompt prefix small.
    match _classify(parameters, 0):
        case ("object", [_, *_] as fields, _):
            return "{\n" + "\n".join(_ts_documented_field(field) for field in fields) + "\n  }"
        case _:
            return _ts(parameters, 0)


def _ts_documented_field(field: tuple[str, Any, bool]) -> str:
    description = _description_of(field[1])
    doc = f"    /** {_close_safe(_one_line(description))} */\n" if description else ""
    return f"{doc}    {_ts_field(field, 1)};"


def _ts_field(field: tuple[str, Any, bool], depth: int) -> str:
    name, node, required = field
    return f"{_literal(name)}{'' if required else '?'}: {_ts(node, depth)}"


def _ts(node: Any, depth: int) -> str:
    match _classify(node, depth):
        case ("scalar", name):
            return _TS_SCALARS[name]
        case ("enum", values):
            return " | ".join(_literals(values, _ts_literal)) or _TS_ANY
        case ("union", nodes):
            return _unique_join((_ts(n, depth + 1) for n in nodes), " | ", _TS_ANY)
        case ("intersection", nodes):
            # `&` binds tighter than `|`: a union member needs its parentheses.
            parts = (_ts(n, depth + 1) for n in nodes)
            return _unique_join((f"({p})" if " | " in p else p for p in parts), " & ", _TS_ANY)
        case ("array", items):
            return f"Array<{_ts(items, depth + 1)}>"
        case ("tuple", nodes):
            return "[" + ", ".join(_ts(n, depth + 1) for n in nodes) + "]"
        case ("object", [], additional):
            return f"Record<string, {_ts(additional, depth + 1)}>"
        case ("object", fields, _):
            return "{ " + "; ".join(_ts_field(field, depth + 1) for field in fields) + " }"
    return _TS_ANY


def _ts_literal(value: Any) -> str | None:
    if isinstance(value, str):
        return _literal(value)
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return _int_literal(value)
    if isinstance(value, float) and math.isfinite(value):
        return float.__repr__(value)
    return None


# --- Python -------------------------------------------------------------------


def _render_python(tools: list[Any]) -> str:
    aliases, members = [], []
    for index, tool in enumerate(tools, 1):
        alias, arg_type = _py_args(tool, index)
        if alias:
            aliases.append(alias)
        members.append(f"    {_literal(tool.name)}: Callable[[{arg_type}], {_PY_ANY}],")
    alias_text = "\n".join(aliases) + "\n" if aliases else ""
    body = "\n" + "\n".join(members) + "\n" if members else ""
    return f'{_PY_HEADER}\n{alias_text}\nTools = TypedDict("Tools", {{{body}}})\n\n{GLOBAL}: Tools\n'


def _py_args(tool: Any, index: int) -> tuple[str, str]:
    # Python has no anonymous record type, so an arguments object becomes a
    # TypedDict named by the tool's position in the sorted list: deterministic,
    # and no two tools can collide the way mangled names could.
    parameters = getattr(tool, "parameters", None)
    match _classify(parameters, 0):
        case ("object", [_, *_] as fields, _):
            name = f"Args{index}"
            entries = ", ".join(_py_field(field) for field in fields)
            return f"{_py_comment(tool, fields)}{name} = TypedDict({_literal(name)}, {{{entries}}})\n", name
        case _:
            return "", _py(parameters, 0)


def _py_field(field: tuple[str, Any, bool]) -> str:
    name, node, required = field
    kind = _py(node, 1)
    return f"{_literal(name)}: {kind if required else f'NotRequired[{kind}]'}"


def _py_comment(tool: Any, fields: list[tuple[str, Any, bool]]) -> str:
    description = getattr(tool, "description", None)
    summary = _one_line(description) if isinstance(description, str) else ""
    lines = [f"# {_one_line(tool.name)} — {summary}" if summary else f"# {_one_line(tool.name)}"]
    for name, node, _required in fields:
        if doc := _description_of(node):
            lines.append(f"#   {_one_line(name)}: {_one_line(doc)}")
    return "\n".join(lines) + "\n"


def _py(node: Any, depth: int) -> str:
    match _classify(node, depth):
        case ("scalar", name):
            return _PY_SCALARS[name]
        case ("enum", values):
            literals = _literals(values, _py_literal)
            return f"Literal[{', '.join(literals)}]" if literals else _PY_ANY
        case ("union", nodes):
            return _unique_join((_py(n, depth + 1) for n in nodes), " | ", _PY_ANY)
        case ("array", items):
            return f"list[{_py(items, depth + 1)}]"
        case ("tuple", []):
            return "tuple[()]"  # `tuple[]` is a syntax error
        case ("tuple", nodes):
            return "tuple[" + ", ".join(_py(n, depth + 1) for n in nodes) + "]"
        case ("object", [], additional):
            return f"dict[str, {_py(additional, depth + 1)}]"
        case ("object", _, _):
            # A nested record would need a name; only the arguments get one.
            return f"dict[str, {_PY_ANY}]"
    # Also `allOf`: Python has no intersection type.
    return _PY_ANY


def _py_literal(value: Any) -> str | None:
    if isinstance(value, str):
        return _literal(value)
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return _int_literal(value)
    return None  # `Literal[...]` admits no float


# --- Schema classification ----------------------------------------------------

# One classifier, two formatters. Schemas come from tool authors, so every
# field's shape is checked before it is used.


def _classify(node: Any, depth: int) -> tuple:
    if depth > _MAX_DEPTH or not isinstance(node, Mapping) or node.get("$ref") is not None:
        return _ESCAPE
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
        elif node.get("items") is not None:
            declared = "array"
    if declared == "object":
        return _classify_object(node)
    if declared == "array":
        items = node.get("items")
        return ("tuple", list(items)) if _is_list(items) else ("array", items if isinstance(items, Mapping) else None)
    if isinstance(declared, str) and declared in _TS_SCALARS:
        return ("scalar", declared)
    return _ESCAPE


def _classify_object(node: Mapping) -> tuple:
    properties = node.get("properties")
    required = node.get("required")
    required = {name for name in required if isinstance(name, str)} if _is_list(required) else set()
    # Sorted: a schema built in a different order must render the same bytes.
    pairs = properties.items() if isinstance(properties, Mapping) else ()
    fields = sorted(
        ((name, sub, name in required) for name, sub in pairs if isinstance(name, str)),
        key=lambda field: field[0],
    )
    return ("object", fields, node.get("additionalProperties"))


# --- Helpers ------------------------------------------------------------------


def _is_list(value: Any) -> bool:
    return isinstance(value, (list, tuple))


def _description_of(node: Any) -> str | None:
    text = node.get("description") if isinstance(node, Mapping) else None
    return text if isinstance(text, str) and text.strip() else None


def _literals(values: Iterable[Any], formatter) -> list[str]:
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


def _literal(text: str) -> str:
    # A JSON string literal escapes every quote, backslash and control
    # character a careless or hostile name could use to break out.
    return json.dumps(text, ensure_ascii=False)


def _one_line(text: str) -> str:
    return _RUNS_OF_SPACE.sub(" ", text).strip()


def _close_safe(text: str) -> str:
    # An unescaped `*/` would end the doc comment early and leave the rest of
    # the description as broken code.
    return text.replace("*/", "*\\/")

"""Check a call's arguments against its tool's JSON Schema, before the tool runs.

A model writes the arguments, so they are checked like any untrusted input:
with the ``jsonschema`` library, under the draft a schema names in its
``$schema`` (draft 2020-12, as MCP uses, when it names none or one that
``jsonschema`` does not know). Local references (``$ref`` into ``$defs`` or
``definitions``) resolve; nothing is ever fetched over the network.

What a caller may rely on:

* **One validator per tool.** The first check of a tool compiles its schema;
  later checks reuse it for as long as the :class:`~nous_sched.Tool` lives.
  Checks are thread-safe; two threads racing on a tool's first check may both
  compile, and either result is used. The schema is read once: mutating a
  tool's ``parameters`` mapping afterwards does not change what is checked.
* **Messages written for the program**, one line per problem found, up to
  :data:`MAX_PROBLEMS`, each naming the path and what was expected::

      invalid arguments: $.items[2].qty: expected integer, got "3"

  Paths use the program's own syntax (``$.a.b[0]``, ``$["odd key"]``); values
  are JSON, cut to a few dozen characters; the whole message is clamped like
  every other message a program reads.
* **Fails closed.** A schema that is itself invalid, or that cannot be
  evaluated (an unresolvable ``$ref``, a ``$ref`` cycle with no end), refuses
  the call with a message saying so and logs a warning on the ``nous_sched``
  logger: a broken schema must not become no schema. A remote ``$ref`` is
  unresolvable by design: validation never touches the network.
* **Opt-out.** A tool with ``validate_arguments=False`` or with no
  ``parameters`` is never checked.

``format`` is an annotation here, as the 2020-12 default says: whether a
string is an e-mail address is the tool's call, and the answer would
otherwise depend on which optional format libraries happen to be installed.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Optional

import jsonschema
import jsonschema.exceptions
import jsonschema.validators
import referencing

from ..crossing import describe_path
from ..errors import ToolError
from ..outcome import clamp
from ..tooling import caller_parameters
from ._linear import linear, pattern_problem, search

if TYPE_CHECKING:  # only the name: schema.py sits below tool.py
    from ..tooling import Tool

__all__ = ["argument_error", "check_arguments", "schema_error", "MAX_PROBLEMS"]

log = logging.getLogger("nous_sched")

#: At most this many problems are listed in one message; the rest are counted.
MAX_PROBLEMS = 5
# How much of an offending value a message shows.
_MAX_SHOWN = 60
_PREFIX = "invalid arguments: "

_DEFAULT = jsonschema.Draft202012Validator


class _Broken:
    """A schema that cannot be compiled: every call is refused with ``message``."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


# id(tool) -> (a weak reference to the tool, its compiled validator or _Broken).
# The weak reference both frees the entry with its tool and guards against a
# recycled id: an entry counts only while its referent is the tool asked about.
_compiled: dict[int, tuple[weakref.ref[Any], Any]] = {}
_compiled_lock = threading.Lock()  # guards the removal callback against a re-insert


def argument_error(tool: Tool, args: Any) -> Optional[str]:
    """The message for the program if ``args`` do not satisfy ``tool.parameters``, else ``None``.

    ``None`` too when the tool opts out (``validate_arguments=False``) or has
    no ``parameters``. Never raises. The schema is the one a caller sees
    (:func:`~nous_sched.tooling.caller_parameters`: without the tool's bound
    arguments, which the caller does not send).
    """
    schema = caller_parameters(tool)
    if schema is None or not getattr(tool, "validate_arguments", True):
        return None
    checker = _checker(tool, schema)
    if isinstance(checker, _Broken):
        return checker.message
    try:
        errors = list(checker.iter_errors(args))
    except Exception as exc:  # an unresolvable $ref, a $ref cycle with no end, a bad pattern
        name, why = getattr(tool, "name", "?"), f"{type(exc).__name__}: {str(exc)[:200]}"
        log.warning("argument check for tool %r failed, so the call was refused: %s", name, why)
        return f"the arguments could not be checked against the tool's schema ({why}); the call was refused"
    if not errors:
        return None
    return clamp(_PREFIX + _describe(errors))


def check_arguments(tool: Tool, args: Any) -> None:
    """Raise :class:`~nous_sched.ToolError` (naming the tool) if ``args`` fail :func:`argument_error`."""
    message = argument_error(tool, args)
    if message is not None:
        raise ToolError(message, tool=getattr(tool, "name", None))


def schema_error(schema: Any) -> Optional[str]:
    """Why ``schema`` is not a valid JSON Schema under its draft, or ``None`` if it is.

    For checking a tool set up front (the per-call check refuses calls of a
    tool whose schema this rejects).
    """
    if not isinstance(schema, (Mapping, bool)):
        return f"a JSON Schema must be an object or a boolean, got {type(schema).__name__}"
    try:
        _validator_class(schema).check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        where = _path(exc.absolute_path)
        return clamp(f"invalid JSON Schema at {where}: {exc.message}")
    except Exception as exc:  # a schema so odd the meta-schema check itself fails
        return f"invalid JSON Schema ({type(exc).__name__}: {exc})"
    return None


# --- compiling -----------------------------------------------------------------


def _validator_class(schema: Any) -> Any:
    if isinstance(schema, Mapping) and not isinstance(schema.get("$schema", ""), str):
        return _DEFAULT
    return jsonschema.validators.validator_for(schema, default=_DEFAULT)


def _checker(tool: Any, schema: Any) -> Any:
    key = id(tool)
    entry = _compiled.get(key)
    if entry is not None and entry[0]() is tool:
        return entry[1]
    checker = _compile(getattr(tool, "name", "?"), schema)

    def forget(dead: weakref.ref[Any]) -> None:
        _forget(key, dead)

    try:
        ref = weakref.ref(tool, forget)
    except TypeError:  # not weak-referenceable: compile per call rather than leak
        return checker
    with _compiled_lock:
        _compiled[key] = (ref, checker)
    return checker


def _forget(key: int, dead: weakref.ref[Any]) -> None:
    with _compiled_lock:
        entry = _compiled.get(key)
        if entry is not None and entry[0] is dead:
            del _compiled[key]


def _compile(name: str, schema: Any) -> Any:
    problem = schema_error(_plain(schema))
    if problem is not None:
        log.warning("tool %r has an invalid parameters schema; its calls are refused: %s", name, problem)
        return _Broken(f"the tool's parameters schema is invalid, so the call was refused ({problem})")
    plain = _plain(schema)
    problem = pattern_problem(plain)
    if problem is not None:
        log.warning(
            "tool %r has a parameters schema the host cannot check safely; its calls are refused: %s", name, problem
        )
        return _Broken(f"the tool's parameters schema cannot be checked, so the call was refused ({problem})")
    # An empty registry, whose retrieval refuses every URI: without one,
    # jsonschema would fetch a remote `$ref` over the network, on a tool
    # author's or a server's say-so.
    return linear(_validator_class(plain))(plain, registry=_NO_RETRIEVAL)


_NO_RETRIEVAL: referencing.Registry[Any] = referencing.Registry()


def _plain(node: Any) -> Any:
    # jsonschema walks dicts and lists; a tool may declare its schema with any
    # Mapping (a MappingProxyType, say) and tuples. Copy once, at compile time.
    if isinstance(node, Mapping):
        return {key: _plain(value) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
        return [_plain(value) for value in node]
    return node


# --- messages ------------------------------------------------------------------


def _describe(errors: list[Any]) -> str:
    problems: list[str] = []
    for error in sorted((_deepest(e) for e in errors), key=_order):
        line = f"{_path(error.absolute_path)}: {_what(error)}"
        if line not in problems:
            problems.append(line)
    shown = problems[:MAX_PROBLEMS]
    text = "; ".join(shown)
    if len(problems) > len(shown):
        text += f"; and {len(problems) - len(shown)} more"
    return text


def _order(error: Any) -> tuple[Any, ...]:
    # By where in the arguments the problem is: the same input, the same message.
    return (tuple((isinstance(p, int), str(p)) for p in error.absolute_path), str(error.validator))


def _deepest(error: Any) -> Any:
    # For anyOf/oneOf, name the most specific failure inside it, unless every
    # branch failed the same way (then the keyword's own error says it best).
    if error.validator in ("anyOf", "oneOf") and _all_type_errors(error):
        return error
    best = jsonschema.exceptions.best_match([error])
    return best if best is not None else error


def _all_type_errors(error: Any) -> bool:
    context = error.context or []
    return bool(context) and all(sub.validator == "type" and not sub.relative_path for sub in context)


def _what(error: Any) -> str:
    # One describer per keyword (_SAYS); one that has nothing better to say
    # answers None, and jsonschema's own message stands.
    say = _SAYS.get(error.validator)
    said = say(error) if say is not None else None
    return said if said is not None else str(error.message)


def _got(error: Any) -> str:
    return f"got {_show(error.instance)}"


def _say_type(error: Any) -> str:
    return f"expected {_or(error.validator_value)}, {_got(error)}"


def _say_shapes(error: Any) -> str:
    # anyOf/oneOf: the types every branch wanted, when each failed on type alone.
    if _all_type_errors(error):
        types = [sub.validator_value for sub in error.context]
        flat = [t for value in types for t in (value if isinstance(value, list) else [value])]
        return f"expected {_or(list(dict.fromkeys(flat)))}, {_got(error)}"
    exactly = "exactly " if error.validator == "oneOf" else ""
    return f"expected {exactly}one of the allowed shapes, {_got(error)}"


def _say_required(error: Any) -> Optional[str]:
    expected, instance = error.validator_value, error.instance
    if not (isinstance(instance, Mapping) and isinstance(expected, list)):
        return None
    missing = [name for name in expected if name not in instance]
    noun = "property" if len(missing) == 1 else "properties"
    return f"missing required {noun} {_names(missing)}"


def _say_unexpected(error: Any) -> Optional[str]:
    extra = _unexpected(error.schema, error.instance) if isinstance(error.instance, Mapping) else []
    if not extra:
        return None
    noun = "property" if len(extra) == 1 else "properties"
    declared = sorted(p for p in (error.schema.get("properties") or {}) if isinstance(p, str))
    hint = f" (expected only {_names(declared)})" if declared else ""
    return f"unexpected {noun} {_names(extra)}{hint}"


def _say_enum(error: Any) -> Optional[str]:
    if not isinstance(error.validator_value, list):
        return None
    return f"expected one of {_values(error.validator_value)}, {_got(error)}"


def _say_bound(error: Any) -> str:
    wanted, counted = _BOUNDS[error.validator]
    expected = error.validator_value
    limit = _count(expected, counted) if counted is not None and isinstance(expected, int) else _show(expected)
    return f"expected {wanted} {limit}, {_got(error)}"


def _say_items(error: Any) -> Optional[str]:
    # items/additionalItems: false past a fixed prefix: say how many fit.
    if error.validator_value is not False or not isinstance(error.instance, list):
        return None
    fixed = error.schema.get("prefixItems" if error.validator == "items" else "items")
    if not isinstance(fixed, list):
        return None
    return f"expected at most {_count(len(fixed), 'item')}, got {len(error.instance)}"


def _expected(phrase: str) -> Callable[[Any], str]:
    # A keyword whose message is "expected <phrase> <its value>, got <instance>".
    def say(error: Any) -> str:
        return f"expected {phrase}{_show(error.validator_value)}, {_got(error)}"

    return say


# keyword -> (what is expected, the noun counted or None for a plain number)
_BOUNDS = {
    "minimum": ("a number >=", None),
    "maximum": ("a number <=", None),
    "exclusiveMinimum": ("a number >", None),
    "exclusiveMaximum": ("a number <", None),
    "minLength": ("a string of at least", "character"),
    "maxLength": ("a string of at most", "character"),
    "minItems": ("at least", "item"),
    "maxItems": ("at most", "item"),
    "minProperties": ("at least", "property"),
    "maxProperties": ("at most", "property"),
}


_SAYS: dict[str, Callable[[Any], Optional[str]]] = {
    "type": _say_type,
    "anyOf": _say_shapes,
    "oneOf": _say_shapes,
    "required": _say_required,
    "additionalProperties": _say_unexpected,
    "unevaluatedProperties": _say_unexpected,
    "enum": _say_enum,
    "const": _expected(""),
    **{keyword: _say_bound for keyword in _BOUNDS},
    "pattern": _expected("a string matching "),
    "multipleOf": _expected("a multiple of "),
    "items": _say_items,
    "additionalItems": _say_items,
    "uniqueItems": lambda error: "expected unique items",
    "not": _expected("a value not matching "),
}


def _unexpected(schema: Any, instance: Mapping[str, Any]) -> list[str]:
    properties = schema.get("properties") or {}
    patterns = [p for p in (schema.get("patternProperties") or {}) if isinstance(p, str)]
    extra = []
    for name in instance:
        if name in properties:
            continue
        try:
            if any(search(pattern, name) for pattern in patterns):
                continue
        except ValueError:
            pass
        extra.append(name)
    return sorted(extra)


def _count(n: int, noun: str) -> str:
    plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
    return f"{n} {noun}" if n == 1 else f"{n} {plural}"


def _path(parts: Any) -> str:
    return describe_path(parts)  # the snapshot rules' spelling: one path description everywhere


def _show(value: Any) -> str:
    text = _json(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 1] + "…"


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


def _or(types: Any) -> str:
    items = types if isinstance(types, list) else [types]
    return " or ".join(str(t) for t in items)


def _names(names: list[Any]) -> str:
    shown = ", ".join(_json(n) for n in names[:10])
    return shown + (f", … ({len(names) - 10} more)" if len(names) > 10 else "")


def _values(values: list[Any]) -> str:
    text = ", ".join(_json(v) for v in values)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 1] + "…"

"""Private: the JSON Schema keywords whose stock ``jsonschema`` code can cost more
than linear time in the arguments, rewritten so it cannot.

A model (or an untrusted MCP server's ``inputSchema``) decides both sides of a
schema check, and the stock code would let either stall the whole host:

* ``pattern``, ``patternProperties`` (and the ``patternProperties`` that
  ``additionalProperties`` and ``unevaluatedProperties`` consult) run on
  Python's backtracking ``re``, which holds the GIL: ``^(\\w+\\s?)*$`` against
  27 characters took seconds. Here they run on RE2 (``google-re2``), whose
  time is linear in the text. RE2 refuses what needs backtracking
  (lookaround, backreferences): :func:`pattern_problem` says so at compile
  time, and the schema counts as broken, so its calls are refused with the
  reason instead of silently unchecked.
* ``uniqueItems`` compared every pair of items; here each item's canonical
  JSON goes into a set. ``unevaluatedItems``/``unevaluatedProperties`` looked
  indexes and keys up in lists; here in sets.

Patterns are searched, not matched (JSON Schema's rule), and a string holding
a lone surrogate is searched as if it held U+FFFD there (RE2 reads UTF-8).
The keyword functions keep the stock ones' signatures and error shapes, so
:mod:`nous_sched.gate.schema` words their messages the same way.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from typing import Any, Optional

import jsonschema.validators
import re2
from jsonschema import _keywords, _utils
from jsonschema.exceptions import ValidationError
from referencing.jsonschema import lookup_recursive_ref

__all__ = ["linear", "pattern_problem", "search"]

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is reported as data, not printed on stderr
# Keys whose values are data, not schemas: a "pattern" in an enum value is no pattern.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})


class PatternError(ValueError):
    """A schema pattern the linear-time engine cannot run."""


@functools.lru_cache(maxsize=1024)
def _regex(pattern: str) -> Any:
    try:
        return re2.compile(pattern, options=_OPTIONS)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        raise PatternError(f"pattern {json.dumps(pattern)[:200]} cannot run in linear time ({detail})") from None
    except UnicodeEncodeError:
        raise PatternError(f"pattern {json.dumps(pattern)[:200]} holds a lone surrogate") from None


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches somewhere in ``text``, in time linear in ``text``.

    :raises PatternError: the pattern cannot run on the linear-time engine.
    """
    regex = _regex(pattern)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: read as U+FFFD
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return regex.search(text) is not None


def pattern_problem(schema: Any) -> Optional[str]:
    """Why one of ``schema``'s patterns (``pattern`` values, ``patternProperties``
    keys, at any depth) cannot run on the linear-time engine, or ``None``."""
    for pattern in _patterns(schema):
        try:
            _regex(pattern)
        except PatternError as exc:
            return str(exc)
    return None


def _patterns(schema: Any) -> Iterator[str]:
    # Iterative: a schema is data, and its depth is its author's to choose.
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, Mapping):
            continue
        for key, value in node.items():
            if key in _DATA_KEYWORDS:
                continue
            if key == "pattern" and isinstance(value, str):
                yield value
            elif key == "patternProperties" and isinstance(value, Mapping):
                yield from (p for p in value if isinstance(p, str))
            stack.append(value)


# --- the keywords --------------------------------------------------------------


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not search(pattern, instance):
        yield ValidationError(f"{_short(instance)} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional(instance: Mapping[str, Any], schema: Any) -> list[str]:
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [key for key in instance if key not in properties and not any(search(p, key) for p in patterns)]


def _additional_properties(validator: Any, additional: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    extras = _additional(instance, schema)
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        yield ValidationError(
            "Additional properties are not allowed (%s %s unexpected)" % _utils.extras_msg(sorted(extras, key=str))
        )


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if unique and validator.is_type(instance, "array") and not _distinct(instance):
        yield ValidationError("the array has non-unique elements")


def _distinct(items: list[Any]) -> bool:
    seen: set[str] = set()
    for item in items:
        key = canonical(item)
        if key in seen:
            return False
        seen.add(key)
    return True


def canonical(value: Any) -> str:
    """One text per JSON value, equal exactly when JSON Schema calls two values
    equal (``1`` and ``1.0`` are; ``1`` and ``true`` are not; key order is not
    significant). Linear in the value's size."""
    if value is None or value is True or value is False:
        return json.dumps(value)
    if isinstance(value, float):
        return repr(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, (int, str)):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(json.dumps(k) + ":" + canonical(value[k]) for k in sorted(value)) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(canonical(item) for item in value) + "]"
    return repr(value)


def _unevaluated_items(validator: Any, unevaluated: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "array"):
        return
    evaluated = set(_utils.find_evaluated_item_indexes_by_schema(validator, instance, schema))
    left = [item for index, item in enumerate(instance) if index not in evaluated]
    if left:
        yield ValidationError("Unevaluated items are not allowed (%s %s unexpected)" % _utils.extras_msg(left))


def _unevaluated_properties(validator: Any, unevaluated: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(validator, instance, schema)
    left = [
        key
        for key in instance
        if key not in evaluated
        and not _utils.is_valid(validator.descend(instance[key], unevaluated, path=key, schema_path=key))
    ]
    if not left:
        return
    if unevaluated is False:
        message = "Unevaluated properties are not allowed (%s %s unexpected)"
        yield ValidationError(message % _utils.extras_msg(sorted(left, key=str)))
    else:
        message = "Unevaluated properties are not valid under the given schema (%s %s unevaluated and invalid)"
        yield ValidationError(message % _utils.extras_msg(left))


def _evaluated_keys(validator: Any, instance: Mapping[str, Any], schema: Any) -> set[str]:
    """The keys some keyword of ``schema`` evaluated (the stock function's rules,
    with RE2 for ``patternProperties`` and a set for the result)."""
    if validator.is_type(schema, "boolean"):
        return set()
    keys: set[str] = set()
    for resolved in _referenced(validator, schema):
        inner = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
        keys |= _evaluated_keys(inner, instance, resolved.contents)
    properties = schema.get("properties")
    if validator.is_type(properties, "object"):
        keys |= properties.keys() & instance.keys()
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        if (sub := schema.get(keyword)) is not None:
            keys |= {k for k, v in instance.items() if _utils.is_valid(validator.descend(v, sub))}
    patterns = schema.get("patternProperties") or {}
    keys |= {k for k in instance if any(search(p, k) for p in patterns)}
    keys |= _evaluated_by_subschemas(validator, instance, schema)
    return keys


def _referenced(validator: Any, schema: Any) -> Iterator[Any]:
    """What ``schema``'s references resolve to: ``$ref``, ``$dynamicRef`` (2020-12), ``$recursiveRef`` (2019-09)."""
    # jsonschema's own resolver (the validator's private): it has no public way to follow a reference.
    for ref in ("$ref", "$dynamicRef"):
        if schema.get(ref) is not None:
            yield validator._resolver.lookup(schema[ref])  # noqa: SLF001
    if "$recursiveRef" in schema:
        yield lookup_recursive_ref(validator._resolver)  # noqa: SLF001


def _evaluated_by_subschemas(validator: Any, instance: Mapping[str, Any], schema: Any) -> set[str]:
    keys: set[str] = set()
    for key, sub in (schema.get("dependentSchemas") or {}).items():
        if key in instance:
            keys |= _evaluated_keys(validator, instance, sub)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for sub in schema.get(keyword, []):
            if _utils.is_valid(validator.descend(instance, sub)):
                keys |= _evaluated_keys(validator, instance, sub)
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys |= _evaluated_keys(validator, instance, schema["if"])
            if "then" in schema:
                keys |= _evaluated_keys(validator, instance, schema["then"])
        elif "else" in schema:
            keys |= _evaluated_keys(validator, instance, schema["else"])
    return keys


def _short(text: str) -> str:
    return repr(text) if len(text) <= 80 else repr(text[:80]) + "…"


_REPLACED = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
    "unevaluatedItems": _unevaluated_items,
    "unevaluatedProperties": _unevaluated_properties,
}
_extended: dict[Any, Any] = {}


def linear(cls: Any) -> Any:
    """``cls`` (a ``jsonschema`` validator class) with the keywords above replaced."""
    found = _extended.get(cls)
    if found is None:
        replaced = {k: f for k, f in _REPLACED.items() if k in cls.VALIDATORS and cls.VALIDATORS[k] is not None}
        # Draft 2019-09's unevaluatedItems has its own rules ($recursiveRef): kept.
        if cls.VALIDATORS.get("unevaluatedItems") is not _keywords.unevaluatedItems:
            replaced.pop("unevaluatedItems", None)
        found = _extended[cls] = jsonschema.validators.extend(cls, validators=replaced)  # type: ignore[no-untyped-call]
    return found

"""What every pydantic-backed tool needs, imported lazily: JSON results and error text for the program."""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["jsonable", "validation_message", "is_validation_error"]

_MAX_PROBLEMS = 5


def jsonable(value: Any) -> Any:
    """``value`` with pydantic models, dataclasses and the like turned into JSON-shaped data.

    Field aliases are used, as in the schemas pydantic writes. A value
    pydantic cannot convert is returned unchanged, for the snapshot to refuse
    with the path of the offending part.
    """
    try:
        import pydantic_core
    except ImportError:
        return value
    try:
        return pydantic_core.to_jsonable_python(value, by_alias=True)
    except (pydantic_core.PydanticSerializationError, TypeError, ValueError):
        return value


def is_validation_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a pydantic ``ValidationError`` (never imports pydantic to find out)."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(exc, pydantic.ValidationError)


def validation_message(exc: Any) -> str:
    """A pydantic ``ValidationError`` as the program reads it: ``$.path: what is wrong``, a few at most."""
    problems = []
    for error in exc.errors(include_url=False):
        path = "$" + "".join(_step(part) for part in error.get("loc", ()))
        problems.append(f"{path}: {error.get('msg', 'invalid')}")
    shown = problems[:_MAX_PROBLEMS]
    more = f"; and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
    return "invalid arguments: " + "; ".join(shown) + more


def _step(part: Any) -> str:
    if isinstance(part, int):
        return f"[{part}]"
    text = str(part)
    return f".{text}" if text.isidentifier() and text.isascii() else f"[{json.dumps(text, ensure_ascii=False)}]"

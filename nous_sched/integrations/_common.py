"""What the adapters share: the lazy import, the overrides, and the Tool they build."""

from __future__ import annotations

import importlib
import inspect
import typing
from typing import Any, Callable, Optional, Union

from .. import _validators as v
from .._extras import install_command
from ..errors import ConfigError
from ..tooling import CALLERS, Tool, always_safe, no_return_type, stdlib_schema

Predicate = Union[Callable[[dict[str, Any]], Any], bool, None]


_OPTIONAL_BOOL = v.optional(v.BOOL)


def require(module: str, extra: str, adapter: str) -> Any:
    """Import ``module``, or raise a :class:`ConfigError` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"{adapter} needs the `{module.split('.')[0]}` package ({exc}); install it with: {install_command(extra)}"
        ) from None


def build(
    *,
    adapter: str,
    name: Optional[str],
    default_name: Any,
    function: Callable[[dict[str, Any]], Any],
    description: Any,
    parameters: Any,
    returns: Any,
    concurrency_safe: Predicate,
    derived_concurrency_safe: Optional[Callable[[dict[str, Any]], Any]],
    requires_approval: Optional[bool],
    derived_requires_approval: bool,
    category: str,
    throttles: Any = (),
    bound: Any = None,
    callers: Any = None,
) -> Tool:
    """The Tool, with the caller's overrides applied over what the framework's flags say
    (``bound`` and ``callers`` are :class:`~nous_sched.Tool`'s; ``None``: nothing bound, both callers)."""
    if concurrency_safe is None:
        predicate = derived_concurrency_safe
    elif concurrency_safe is True:
        predicate = always_safe
    elif concurrency_safe is False:
        predicate = None
    elif callable(concurrency_safe):
        predicate = concurrency_safe
    else:
        v.fail(adapter, "concurrency_safe", concurrency_safe, "a predicate, True, False or None")
    v.require(adapter, "requires_approval", requires_approval, _OPTIONAL_BOOL)
    tool_name = name if name is not None else default_name
    # No `name=` given: the message names the option that fixes it.
    v.require(adapter, "name", tool_name, v.NON_EMPTY_STR)
    return Tool(
        name=tool_name,
        function=function,
        description=description if isinstance(description, str) else "",
        parameters=parameters,
        returns=returns or None,
        requires_approval=derived_requires_approval if requires_approval is None else requires_approval,
        category=category,
        concurrency_safe=predicate,
        throttles=throttles,
        bound=bound,
        callers=CALLERS if callers is None else callers,
    )


def return_schema(fn: Any) -> Optional[dict[str, Any]]:
    """The JSON Schema of ``fn``'s return annotation (``-> int`` is ``{"type": "integer"}``),
    for a framework tool that keeps its function but no output schema; ``None``
    when there is no function, no annotation, or no schema for it."""
    if not callable(fn):
        return None
    try:
        hint = typing.get_type_hints(fn).get("return", inspect.Signature.empty)
    except Exception:  # a forward reference that does not resolve: the plain annotation
        try:
            hint = inspect.signature(fn).return_annotation
        except (TypeError, ValueError):
            return None
    if no_return_type(hint):
        return None
    schema = stdlib_schema(hint)
    if schema is None:
        try:
            import pydantic

            schema = pydantic.TypeAdapter(hint).json_schema(mode="serialization")
        except Exception:
            return None
    return schema or None

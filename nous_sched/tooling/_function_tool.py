"""Tools from Python functions: the schema from the type hints, the text from the docstring.

::

    @function_tool
    def get_weather(city: str, unit: Literal["C", "F"] = "C") -> Forecast:
        '''Today's forecast for a city.

        Args:
            city: The city's name, e.g. "Lyon".
            unit: The temperature unit.
        '''

``get_weather`` is now a :class:`~nous_sched.Tool` named ``"get_weather"``:
its ``parameters`` are the JSON Schema of the function's parameters (with the
docstring's per-parameter text as their descriptions), its ``returns`` the
schema of the return type, its ``description`` the docstring without the
parameter section. ``function_tool(fn, name=...)`` is the same as a plain
call; ``@function_tool(requires_approval=True)`` passes options.

How the schema is derived
    With pydantic installed (``pip install -e '.[pydantic]'``), pydantic
    derives it, as FastMCP, pydantic-ai and the OpenAI Agents SDK do: models,
    dataclasses, enums, dates, ``Annotated[..., Field(...)]`` and every other
    type pydantic supports. Each call's arguments are then validated (and
    coerced, in pydantic's lax mode) into those types before the function
    runs, and the result is turned into JSON the same way. Without pydantic,
    a small built-in mapping covers the hints whose JSON value *is* the Python
    value: ``str``, ``int``, ``float``, ``bool``, ``None``, ``Any``, ``list``,
    ``dict`` with ``str`` keys, ``Literal`` and unions of them; any other hint
    is a :class:`~nous_sched.ConfigError` naming the parameter and the extra.
    Either way a parameter's description can also be given as
    ``Annotated[T, "text"]``.

How a call runs
    The tool's function receives the arguments object and calls the Python
    function with keyword arguments (positional-only parameters positionally;
    keys a ``**kwargs`` parameter accepts go there). Arguments that do not
    fit are a :class:`~nous_sched.ToolError` whose message names the path, for
    the program to read. An ``async def`` function runs to completion on the
    tool's own thread (a fresh event loop per call). ``*args`` parameters
    cannot be given by name and are refused when the tool is built.
"""

from __future__ import annotations

import enum
import functools
import inspect
import json
import types
import typing
from collections.abc import Mapping
from typing import Any, Callable, Optional, Protocol, Sequence, Union

from .. import _validators as v
from .._extras import install_command
from ..errors import ConfigError, ToolError
from ..throttle import Throttle
from . import _docstring
from ._pydantic import jsonable, validation_message
from ._tool import CALLERS, Tool

__all__ = ["function_tool", "always_safe", "no_return_type", "stdlib_schema"]

_EMPTY = inspect.Parameter.empty


def function_tool(
    fn: Optional[Callable[..., Any]] = None,
    /,
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
    concurrency_safe: Union[Callable[[dict[str, Any]], Any], bool, None] = None,
    requires_approval: bool = False,
    category: str = "read",
    validate_arguments: bool = True,
    throttles: Sequence[Throttle] = (),
    bound: Optional[Mapping[str, Any]] = None,
    callers: Any = CALLERS,
) -> Any:
    """A :class:`~nous_sched.Tool` that calls ``fn``; as ``@function_tool(...)``, a decorator making one.

    ``name`` defaults to ``fn.__name__``, ``description`` to the docstring
    without its parameter section. ``concurrency_safe`` is the tool's
    predicate (``args -> bool``), or ``True`` for a tool whose every call may
    run beside others; ``requires_approval``, ``category`` and
    ``validate_arguments`` are the :class:`~nous_sched.Tool` fields, and so is
    ``throttles`` (:class:`~nous_sched.Throttle` limits every call waits for),
    ``bound`` (arguments the host supplies; the function still takes them as
    parameters) and ``callers``.

    :raises ConfigError: ``fn`` is not callable, has a ``*args`` parameter or a
        type hint that cannot become a JSON Schema (naming the parameter), or
        an option is invalid.
    """

    _check_options(name, description, concurrency_safe, requires_approval, category, validate_arguments)
    try:  # their own checks, where they are written
        Tool("function_tool", _unused, bound=bound, callers=callers)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("Tool:", "function_tool:", 1)) from None

    def build(fn: Callable[..., Any]) -> Tool:
        return _build(
            fn,
            name=name,
            description=description,
            concurrency_safe=concurrency_safe,
            requires_approval=requires_approval,
            category=category,
            validate_arguments=validate_arguments,
            throttles=throttles,
            bound=bound,
            callers=callers,
        )

    return build if fn is None else build(fn)


def _unused(args: dict[str, Any]) -> None:
    return None


_CONCURRENCY_SAFE = v.Check(
    "None, a bool or a predicate (args -> bool)",
    lambda value: value is None or isinstance(value, bool) or callable(value),
)


def _check_options(
    name: Any, description: Any, concurrency_safe: Any, requires_approval: Any, category: Any, validate: Any
) -> None:
    # The Tool fields' own checks, run when function_tool is called: as a
    # decorator, a bad option is refused where it is written, not when applied.
    v.require("function_tool", "name", name, v.optional(v.NON_EMPTY_STR))
    v.require("function_tool", "description", description, v.OPTIONAL_STR)
    v.require("function_tool", "concurrency_safe", concurrency_safe, _CONCURRENCY_SAFE)
    v.require("function_tool", "requires_approval", requires_approval, v.BOOL)
    v.require("function_tool", "category", category, v.STR)
    v.require("function_tool", "validate_arguments", validate, v.BOOL)


def _build(
    fn: Callable[..., Any],
    *,
    name: Optional[str],
    description: Optional[str],
    concurrency_safe: Union[Callable[[dict[str, Any]], Any], bool, None],
    requires_approval: bool,
    category: str,
    validate_arguments: bool,
    throttles: Sequence[Throttle] = (),
    bound: Optional[Mapping[str, Any]] = None,
    callers: Any = CALLERS,
) -> Tool:
    if not callable(fn):
        v.fail("function_tool", "fn", fn, "a function or a callable object")
    label = getattr(fn, "__qualname__", None) or repr(fn)
    predicate = always_safe if concurrency_safe is True else (concurrency_safe or None)
    doc_text, doc_params = _docstring.parse(inspect.getdoc(fn))
    signature = _parameters(fn, label, doc_params)
    plan: _Plan
    try:
        import pydantic  # noqa: F401 - only to learn whether it is installed
    except ImportError:
        plan = _StdlibPlan(signature, label)
    else:
        plan = _PydanticPlan(signature, label)
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)

    def function(args: dict[str, Any]) -> Any:
        positional, keywords = plan.arguments(args)
        if is_async:
            from ._async import run_coroutine  # asyncio only for those who use it

            value = run_coroutine(lambda: fn(*positional, **keywords))
        else:
            value = fn(*positional, **keywords)
        return plan.result(value)

    return Tool(
        name=name if name is not None else getattr(fn, "__name__", label),
        function=function,
        description=description if description is not None else doc_text,
        parameters=plan.parameters,
        returns=plan.returns(signature.return_hint),
        requires_approval=requires_approval,
        category=category,
        concurrency_safe=predicate,
        validate_arguments=validate_arguments,
        throttles=tuple(throttles) if isinstance(throttles, list) else throttles,
        bound=bound,
        callers=callers,
    )


class _Plan(Protocol):
    """How a signature becomes a schema, and a call's arguments and result cross to and from Python."""

    parameters: dict[str, Any]

    def arguments(self, args: Any) -> tuple[list[Any], dict[str, Any]]: ...

    def result(self, value: Any) -> Any: ...

    def returns(self, hint: Any) -> Optional[dict[str, Any]]: ...


def always_safe(args: dict[str, Any]) -> bool:
    """The ``concurrency_safe`` predicate of a tool whose every call may run beside others."""
    return True


# --- the signature ---------------------------------------------------------------


class _Param:
    __slots__ = ("name", "hint", "default", "description", "positional")

    def __init__(self, name: str, hint: Any, default: Any, description: Optional[str], positional: bool) -> None:
        self.name = name
        self.hint = hint
        self.default = default
        self.description = description
        self.positional = positional


class _Signature:
    __slots__ = ("params", "var_keyword", "return_hint")

    def __init__(self, params: list[_Param], var_keyword: bool, return_hint: Any) -> None:
        self.params = params
        self.var_keyword = var_keyword
        self.return_hint = return_hint


def _parameters(fn: Callable[..., Any], label: str, doc_params: dict[str, str]) -> _Signature:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"function_tool({label}): cannot read its signature ({exc})") from None
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # an unresolvable forward reference, most often
        raise ConfigError(f"function_tool({label}): cannot resolve its type hints ({exc})") from None
    params: list[_Param] = []
    var_keyword = False
    for param in signature.parameters.values():
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            raise ConfigError(
                f"function_tool({label}): `*{param.name}` cannot be given by name in an arguments object; "
                "take a list parameter instead"
            )
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            var_keyword = True
            continue
        hint = hints.get(param.name, Any)
        hint, annotated = _split_annotated_text(hint)
        params.append(
            _Param(
                param.name,
                hint,
                param.default,
                annotated or doc_params.get(param.name),
                param.kind is inspect.Parameter.POSITIONAL_ONLY,
            )
        )
    return _Signature(params, var_keyword, hints.get("return", _EMPTY))


def _split_annotated_text(hint: Any) -> tuple[Any, Optional[str]]:
    """``Annotated[T, "text", ...]`` -> (``Annotated[T, ...]`` or ``T``, ``"text"``)."""
    if typing.get_origin(hint) is not typing.Annotated:
        return hint, None
    base, *extras = typing.get_args(hint)
    texts = [extra for extra in extras if isinstance(extra, str)]
    others = [extra for extra in extras if not isinstance(extra, str)]
    rebuilt = typing.Annotated[tuple([base, *others])] if others else base
    return rebuilt, (texts[0] if texts else None)


def _split(
    signature: _Signature, values: Mapping[str, Any], extra: Mapping[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    positional, keywords = [], {}
    for param in signature.params:
        if param.name not in values:
            continue
        if param.positional:
            positional.append(values[param.name])
        else:
            keywords[param.name] = values[param.name]
    keywords.update(extra)
    return positional, keywords


# --- with pydantic ----------------------------------------------------------------


class _PydanticPlan:
    """The schema, the argument validation and the result conversion, by pydantic."""

    def __init__(self, signature: _Signature, label: str) -> None:
        import pydantic

        self.signature = signature
        self.label = label
        fields: dict[str, Any] = {}
        # Fields get neutral names and the parameter's name as their alias, so
        # a parameter may be called `json`, `schema` or `model_config`.
        self.by_field: dict[str, str] = {}
        for index, param in enumerate(signature.params):
            field = f"p{index}"
            self.by_field[field] = param.name
            default = ... if param.default is _EMPTY else param.default
            info = pydantic.Field(default, alias=param.name, description=param.description)
            fields[field] = (param.hint, info)
        config = pydantic.ConfigDict(
            extra="allow" if signature.var_keyword else "forbid",
            validate_by_alias=True,
            validate_by_name=False,
            serialize_by_alias=True,
        )
        try:
            self.model = pydantic.create_model(f"{label}_arguments", __config__=config, **fields)
            schema = self.model.model_json_schema(schema_generator=_schema_generator())
        except Exception as exc:  # pydantic's errors name the type it cannot handle
            raise ConfigError(f"function_tool({label}): cannot derive a JSON Schema of its parameters: {exc}") from None
        schema.pop("title", None)
        self.parameters = schema

    def arguments(self, args: Any) -> tuple[list[Any], dict[str, Any]]:
        import pydantic

        try:
            model = self.model.model_validate(args)
        except pydantic.ValidationError as exc:
            raise ToolError(validation_message(exc)) from None
        # Only what the call gave: an omitted parameter keeps the function's own default.
        values = {self.by_field[f]: getattr(model, f) for f in model.model_fields_set if f in self.by_field}
        return _split(self.signature, values, dict(model.model_extra or {}))

    def result(self, value: Any) -> Any:
        return jsonable(value)

    def returns(self, hint: Any) -> Optional[dict[str, Any]]:
        if no_return_type(hint):
            return None
        import pydantic

        try:
            schema = pydantic.TypeAdapter(hint).json_schema(mode="serialization", schema_generator=_schema_generator())
        except Exception as exc:
            raise ConfigError(
                f"function_tool({self.label}): cannot derive a JSON Schema of its return type: {exc}"
            ) from None
        return schema or None


@functools.lru_cache(maxsize=1)
def _schema_generator() -> type:
    from pydantic.json_schema import GenerateJsonSchema

    class ToolJsonSchema(GenerateJsonSchema):  # type: ignore[misc,unused-ignore]  # Any without the pydantic extra
        # A default with no JSON form is simply not shown; the function keeps it.
        ignored_warning_kinds = {*GenerateJsonSchema.ignored_warning_kinds, "non-serializable-default"}

        # A property's title repeats its name ("city" -> "City"): noise in a
        # model's prompt. Model and enum titles (class names) stay.
        def field_title_should_be_set(self, schema: Any) -> bool:
            return False

    return ToolJsonSchema


# --- without pydantic -------------------------------------------------------------


class _StdlibPlan:
    """JSON-native hints only: the arguments reach the function as the JSON values they are."""

    def __init__(self, signature: _Signature, label: str) -> None:
        self.signature = signature
        self.label = label
        properties: dict[str, Any] = {}
        required: list[str] = []
        for param in signature.params:
            schema = stdlib_schema(param.hint)
            if schema is None:
                raise ConfigError(
                    f"function_tool({label}): the type hint of `{param.name}` ({_hint_name(param.hint)}) needs "
                    f"pydantic to become a JSON Schema: {install_command('pydantic')}, or use str, int, float, "
                    "bool, None, list, dict, Literal and unions of them"
                )
            if param.description:
                schema["description"] = param.description
            if param.default is _EMPTY:
                required.append(param.name)
            elif _is_json(param.default):
                schema["default"] = param.default
            properties[param.name] = schema
        parameters: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            parameters["required"] = required
        if not signature.var_keyword:
            parameters["additionalProperties"] = False
        self.parameters = parameters
        self.known = {param.name for param in signature.params}

    def arguments(self, args: Any) -> tuple[list[Any], dict[str, Any]]:
        if not isinstance(args, Mapping):
            raise ToolError(f"invalid arguments: $: expected object, got {_show(args)}")
        missing = [p.name for p in self.signature.params if p.default is _EMPTY and p.name not in args]
        if missing:
            raise ToolError("invalid arguments: $: missing required " + ", ".join(json.dumps(m) for m in missing))
        extra = {key: value for key, value in args.items() if key not in self.known}
        if extra and not self.signature.var_keyword:
            names = ", ".join(json.dumps(key, ensure_ascii=False) for key in sorted(extra))
            raise ToolError(f"invalid arguments: $: unexpected {names}")
        return _split(self.signature, {k: v for k, v in args.items() if k in self.known}, extra)

    def result(self, value: Any) -> Any:
        return value

    def returns(self, hint: Any) -> Optional[dict[str, Any]]:
        # A return hint the mapping does not cover costs the SDK its type, not the tool.
        return None if no_return_type(hint) else stdlib_schema(hint)


_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


def stdlib_schema(hint: Any) -> Optional[dict[str, Any]]:
    """The JSON Schema of a standard-library type hint, or ``None`` when it has none (pydantic may)."""
    if hint is Any or hint is _EMPTY:
        return {}
    if hint is None or hint in _SCALARS:
        return {"type": _SCALARS[type(None) if hint is None else hint]}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return stdlib_schema(args[0])
    if hint in (list, dict):
        return {"type": "array"} if hint is list else {"type": "object"}
    if origin is list:
        items = stdlib_schema(args[0]) if args else {}
        return None if items is None else {"type": "array", "items": items}
    if origin is dict:
        if args and args[0] is not str:
            return None
        values = stdlib_schema(args[1]) if args else {}
        return None if values is None else {"type": "object", "additionalProperties": values}
    if origin is typing.Literal:
        if all(isinstance(value, (str, int, bool)) or value is None for value in args):
            return {"enum": list(args)}
        return None
    if origin is Union or origin is types.UnionType:
        members = [stdlib_schema(arg) for arg in args]
        return None if any(m is None for m in members) else {"anyOf": members}
    return None


def no_return_type(hint: Any) -> bool:
    """Whether a return hint says nothing of the result (absent, ``Any`` or ``None``): no ``returns`` schema."""
    return hint is _EMPTY or hint is Any or hint is None or hint is type(None)


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return not isinstance(value, enum.Enum)


def _hint_name(hint: Any) -> str:
    return getattr(hint, "__qualname__", None) or repr(hint)


def _show(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = type(value).__name__
    return text if len(text) <= 60 else text[:59] + "…"

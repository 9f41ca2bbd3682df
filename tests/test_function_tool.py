"""Tools from Python functions: function_tool, its docstring reading, pydantic and the stdlib fallback."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import re
import sys
import threading
from typing import Annotated, Any, Literal, Optional

import pytest
from pydantic import BaseModel
from tscheck import check_typescript

from nous_sched import (
    PARALLEL,
    ConfigError,
    Tool,
    ToolError,
    concurrency_mode,
    current_call,
    function_tool,
    run_code,
    sdk,
)
from nous_sched.tooling._docstring import parse

# --- docstrings --------------------------------------------------------------------------

GOOGLE = """Create an order.

    It is shipped the next day.

    Args:
        items (list[Item]): The lines to order,
            one per SKU.
        ship_to: Where to ship.
        **extra: Ignored.

    Returns:
        The order's id.
    """

NUMPY = """Create an order.

    It is shipped the next day.

    Parameters
    ----------
    items : list of Item
        The lines to order,
        one per SKU.
    ship_to : Address
        Where to ship.

    Returns
    -------
    str
        The order's id.
    """

SPHINX = """Create an order.

    It is shipped the next day.

    :param items: The lines to order,
        one per SKU.
    :param Address ship_to: Where to ship.
    :type items: list
    :returns: The order's id.
    """


@pytest.mark.parametrize("docstring", [GOOGLE, NUMPY, SPHINX], ids=["google", "numpy", "sphinx"])
def test_each_docstring_style_gives_the_parameters_and_keeps_the_rest(docstring):
    description, params = parse(docstring)
    assert params["items"] == "The lines to order, one per SKU."
    assert params["ship_to"] == "Where to ship."
    assert description.startswith("Create an order.\n\nIt is shipped the next day.\n\n")
    assert "The order's id." in description
    assert "Where to ship" not in description and "one per SKU" not in description


def test_a_docstring_without_parameters_is_all_description():
    assert parse("  Just this.\n\n  And this.  ") == ("Just this.\n\nAnd this.", {})
    assert parse(None) == ("", {})
    assert parse("") == ("", {})
    assert parse("Summary.\n\n    Args:\n        nonsense without a colon\n") == ("Summary.", {})


# --- the decorator and the plain form --------------------------------------------------------


class Status(str, enum.Enum):
    open = "open"
    shipped = "shipped"


class Address(BaseModel):
    """A postal address."""

    street: str
    city: str


class Line(BaseModel):
    sku: str
    qty: int = 1


class Order(BaseModel):
    id: str
    ship_to: Address
    lines: list[Line]
    status: Status
    placed: datetime.date


@function_tool(requires_approval=True)
def place_order(lines: list[Line], ship_to: Address, note: Annotated[Optional[str], "Free text."] = None) -> Order:
    """Place an order.

    Args:
        lines: What to order.
        ship_to: Where it goes.
    """
    return Order(
        id=f"o-{len(lines)}", ship_to=ship_to, lines=lines, status=Status.open, placed=datetime.date(2026, 1, 2)
    )


def test_the_decorator_builds_a_tool_from_hints_and_docstring():
    assert isinstance(place_order, Tool)
    assert place_order.name == "place_order"
    assert place_order.description == "Place an order."
    assert place_order.requires_approval is True
    parameters = place_order.parameters
    assert parameters["required"] == ["lines", "ship_to"]
    assert parameters["additionalProperties"] is False
    assert parameters["properties"]["lines"]["description"] == "What to order."
    assert parameters["properties"]["note"]["description"] == "Free text."
    assert parameters["properties"]["ship_to"] == {"$ref": "#/$defs/Address", "description": "Where it goes."}
    assert "title" not in parameters and "title" not in parameters["properties"]["lines"]
    assert set(parameters["$defs"]) == {"Address", "Line"}
    assert place_order.returns["$defs"]["Status"]["enum"] == ["open", "shipped"]


def test_the_tool_validates_coerces_and_calls_with_keywords_and_returns_json():
    value = place_order.function({"lines": [{"sku": "a", "qty": "2"}], "ship_to": {"street": "1 Rue", "city": "Lyon"}})
    assert value == {
        "id": "o-1",
        "ship_to": {"street": "1 Rue", "city": "Lyon"},
        "lines": [{"sku": "a", "qty": 2}],
        "status": "open",
        "placed": "2026-01-02",
    }


def test_arguments_that_do_not_fit_are_a_tool_error_naming_the_paths():
    with pytest.raises(ToolError) as raised:
        place_order.function({"lines": [{"qty": "x"}], "shipto": {}})
    message = raised.value.message
    assert message.startswith("invalid arguments: ")
    for part in (
        "$.lines[0].sku: Field required",
        "$.lines[0].qty: Input should be a valid integer",
        "$.ship_to: Field required",
        "$.shipto: Extra inputs are not permitted",
    ):
        assert part in message


def test_the_sdk_of_a_decorated_tool_is_typed_through():
    text = sdk.render([place_order])
    check_typescript(text)
    assert '    /** Where it goes. */\n    "ship_to": { "city": string; "street": string };' in text
    assert '"status": "open" | "shipped"' in text and '"placed": string' in text


def test_options_and_the_plain_function_form():
    def lookup(key: str) -> str:
        """Find a key."""
        return key.upper()

    safe = function_tool(lookup, name="find", description="Look it up.", concurrency_safe=True, category="search")
    assert (safe.name, safe.description, safe.category) == ("find", "Look it up.", "search")
    assert concurrency_mode(safe, {"key": "a"}) == PARALLEL
    assert function_tool(lookup).concurrency_safe is None
    assert function_tool(lookup, concurrency_safe=False).concurrency_safe is None
    custom = function_tool(lookup, concurrency_safe=lambda args: args["key"] == "a")
    assert concurrency_mode(custom, {"key": "a"}) == PARALLEL
    assert function_tool(lookup, validate_arguments=False).validate_arguments is False
    assert function_tool(lookup).returns == {"type": "string"}
    assert function_tool()(lookup).name == "lookup"
    assert function_tool(lookup).function({"key": "x"}) == "X"


def test_parameter_names_that_pydantic_reserves_still_work():
    @function_tool
    def odd(json: int, schema: str = "s", model_config: bool = False) -> dict:
        return {"json": json, "schema": schema, "model_config": model_config}

    assert set(odd.parameters["properties"]) == {"json", "schema", "model_config"}
    assert odd.function({"json": "3"}) == {"json": 3, "schema": "s", "model_config": False}


def test_an_omitted_parameter_keeps_the_functions_own_default():
    marker = object()
    seen = []

    @function_tool
    def f(a: int, b: Any = marker) -> None:
        seen.append(b)

    f.function({"a": 1})
    assert seen == [marker]
    assert f.parameters["properties"]["b"] == {}  # a default with no JSON form is not shown


def test_positional_only_keyword_catch_all_and_star_args():
    @function_tool
    def mixed(a: int, /, b: int, **rest: Any) -> list:
        return [a, b, rest]

    assert mixed.parameters["required"] == ["a", "b"]
    assert mixed.parameters.get("additionalProperties", True) is True
    assert mixed.function({"a": 1, "b": 2, "c": 3}) == [1, 2, {"c": 3}]

    def star(*values: int) -> int:
        return sum(values)

    with pytest.raises(ConfigError, match=r"`\*values` cannot be given by name"):
        function_tool(star)


@dataclasses.dataclass
class Point:
    x: float
    y: float


class Geometry:
    def __init__(self, scale: float) -> None:
        self.scale = scale

    def norm(self, p: Point) -> float:
        """Scaled length."""
        return self.scale * (p.x**2 + p.y**2) ** 0.5


class Opaque:
    pass


def test_a_method_and_a_dataclass_parameter():
    tool = function_tool(Geometry(2).norm)
    assert tool.name == "norm" and list(tool.parameters["properties"]) == ["p"]
    assert tool.function({"p": {"x": 3, "y": 4}}) == 10.0


def test_unresolvable_hints_and_non_functions_are_configuration_errors():
    def broken(a: "NoSuchType") -> None:  # noqa: F821
        pass

    with pytest.raises(ConfigError, match="cannot resolve its type hints"):
        function_tool(broken)
    with pytest.raises(ConfigError, match="`fn` must be a function"):
        function_tool(42)

    def takes_opaque(x: Opaque) -> None:
        pass

    with pytest.raises(ConfigError, match="cannot derive a JSON Schema of its parameters"):
        function_tool(takes_opaque)


# --- async functions run on the tool's own thread ------------------------------------------


def test_an_async_function_runs_to_completion_on_the_calling_thread():
    seen = {}

    @function_tool
    async def fetch(n: int) -> list[int]:
        """Fetch n numbers."""
        seen["thread"] = threading.current_thread()
        seen["call"] = current_call.get()
        await asyncio.sleep(0)
        # A framework's `to_thread` hop stays on this thread too.
        seen["hop"] = await asyncio.to_thread(threading.current_thread)
        return list(range(n))

    assert fetch.function({"n": 3}) == [0, 1, 2]
    assert seen["thread"] is threading.current_thread() is seen["hop"]
    result = run_code("return await tools.fetch({n: 2})", [fetch], description="test")
    assert result.ok and result.result == [0, 1]
    assert seen["call"] is not None and seen["call"].tool == "fetch"
    # No default executor was made for the hop (its threads are "asyncio_<n>"; an earlier test's
    # asyncio subprocess may still have its "asyncio-waitpid-<n>" watcher, which is not ours).
    assert not any(t.name.startswith("asyncio_") for t in threading.enumerate())


def test_an_async_function_called_from_inside_an_event_loop_runs_on_a_helper_thread():
    @function_tool
    async def inner() -> str:
        return threading.current_thread().name

    async def caller():
        return inner.function({})

    assert asyncio.run(caller()).startswith("nous-sched-async-")


def test_a_coroutine_that_raises_and_leaves_tasks_behind():
    started = threading.Event()

    @function_tool
    async def leaky() -> None:
        async def forever():
            started.set()
            await asyncio.sleep(3600)

        asyncio.get_running_loop().create_task(forever())
        await asyncio.sleep(0)
        raise ToolError("gave up")

    with pytest.raises(ToolError, match="gave up"):
        leaky.function({})
    assert started.is_set()  # and the task was cancelled with the loop: nothing hangs


# --- end to end ----------------------------------------------------------------------------


def test_decorated_tools_in_a_program():
    @function_tool(concurrency_safe=True)
    def square(x: int) -> int:
        """Square a number."""
        return x * x

    program = """
    const squares = await Promise.all([1, 2, 3].map((x) => tools.square({x})));
    const order = await tools.place_order({lines: [{sku: "a"}], ship_to: {street: "s", city: "c"}});
    let bad;
    try { await tools.square({x: "nine"}); } catch (e) { bad = e.message; }
    return {squares, id: order.id, placed: order.placed, bad};
    """
    result = run_code(program, [square, place_order], approval_handler=lambda request: True, description="test")
    assert result.ok, result.error
    assert result.result["squares"] == [1, 4, 9]
    assert result.result["id"] == "o-1" and result.result["placed"] == "2026-01-02"
    # The gate checks the tool's JSON Schema before the function (and its pydantic model) runs.
    assert result.result["bad"] == 'invalid arguments: $.x: expected integer, got "nine"'


# --- without pydantic ------------------------------------------------------------------------


@pytest.fixture
def no_pydantic(monkeypatch):
    """Make `import pydantic` fail, as on a machine without the extra."""
    for name in [m for m in sys.modules if m == "pydantic" or m.startswith("pydantic.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pydantic", None)


def test_without_pydantic_simple_hints_still_make_a_schema(no_pydantic):
    @function_tool
    def search(
        query: str, limit: int = 10, tags: Optional[list[str]] = None, mode: Literal["a", "b"] = "a", **extra: Any
    ) -> dict[str, float]:
        """Search.

        :param query: Words to look for.
        """
        return {"n": float(limit)}

    assert search.parameters == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "Words to look for."},
            "limit": {"type": "integer", "default": 10},
            "tags": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}], "default": None},
            "mode": {"enum": ["a", "b"], "default": "a"},
        },
        "required": ["query"],
    }
    assert search.returns == {"type": "object", "additionalProperties": {"type": "number"}}
    assert search.function({"query": "x", "limit": 2, "other": 1}) == {"n": 2.0}
    with pytest.raises(ToolError, match=r'missing required "query"'):
        search.function({})


def test_without_pydantic_unknown_keys_are_refused_and_a_rich_hint_names_the_extra(no_pydantic):
    @function_tool
    def strict(a: int | None, b: bool = False) -> None:
        pass

    assert strict.parameters["additionalProperties"] is False
    with pytest.raises(ToolError, match=r'unexpected "c"'):
        strict.function({"a": 1, "c": 2})

    def rich(when: datetime.date) -> None:
        pass

    from nous_sched._extras import install_command

    with pytest.raises(ConfigError, match=r"`when` \(date\) needs pydantic.*" + re.escape(install_command("pydantic"))):
        function_tool(rich)

    def rich_return(a: int) -> datetime.date:
        return datetime.date.today()

    assert function_tool(rich_return).returns is None  # costs the SDK its type, not the tool

"""Adapters in: tools of LangChain, the OpenAI Agents SDK, pydantic-ai and LlamaIndex, run by the real libraries."""

from __future__ import annotations

import asyncio
import re
import sys
import threading

import pytest
from pydantic import BaseModel

from nous_sched import (
    EXCLUSIVE,
    PARALLEL,
    ConfigError,
    Tool,
    ToolError,
    concurrency_mode,
    from_langchain,
    from_llamaindex,
    from_openai_agents,
    from_pydantic_ai,
    run_code,
    sdk,
)


class Forecast(BaseModel):
    city: str
    celsius: float


# --- LangChain -------------------------------------------------------------------------------

from langchain_core.tools import StructuredTool, ToolException  # noqa: E402
from langchain_core.tools import tool as langchain_tool  # noqa: E402


@langchain_tool(parse_docstring=True)
def lc_add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


@langchain_tool
def lc_refuse(reason: str) -> str:
    """Always refuses."""
    raise ToolException(f"refused: {reason}")


async def _lc_forecast(city: str) -> Forecast:
    await asyncio.sleep(0)
    return Forecast(city=city, celsius=21.5)


lc_forecast = StructuredTool.from_function(
    coroutine=_lc_forecast, name="lc_forecast", description="Forecast, async only."
)


def test_langchain_schema_description_and_defaults():
    tool = from_langchain(lc_add)
    assert isinstance(tool, Tool) and tool.name == "lc_add"
    assert tool.description.startswith("Add two integers.")
    assert tool.parameters["properties"]["a"] == {"type": "integer", "description": "The first."}
    assert tool.parameters["required"] == ["a", "b"]
    assert tool.returns == {"type": "integer"}  # from the function's `-> int`
    assert tool.requires_approval is False
    assert concurrency_mode(tool, {"a": 1, "b": 2}) == EXCLUSIVE


def test_langchain_calls_errors_and_async_only_tools():
    assert from_langchain(lc_add).function({"a": 2, "b": 3}) == 5
    with pytest.raises(ToolError, match="refused: no"):
        from_langchain(lc_refuse).function({"reason": "no"})
    with pytest.raises(ToolError, match=r"^invalid arguments: \$\.a: Input should be a valid integer"):
        from_langchain(lc_add).function({"a": "x", "b": 1})
    assert from_langchain(lc_forecast).function({"city": "Lyon"}) == {"city": "Lyon", "celsius": 21.5}


def test_langchain_overrides():
    tool = from_langchain(lc_add, name="add", concurrency_safe=True, requires_approval=True, category="math")
    assert (tool.name, tool.requires_approval, tool.category) == ("add", True, "math")
    assert concurrency_mode(tool, {}) == PARALLEL
    with pytest.raises(ConfigError, match="concurrency_safe"):
        from_langchain(lc_add, concurrency_safe="yes")
    with pytest.raises(ConfigError, match="expected a langchain_core BaseTool"):
        from_langchain(lambda: None)


# --- OpenAI Agents SDK -------------------------------------------------------------------------

import agents  # noqa: E402
from agents import function_tool as agents_tool  # noqa: E402


@agents_tool(failure_error_function=None)
def ag_forecast(city: str) -> Forecast:
    """Today's forecast.

    Args:
        city: The city's name.
    """
    if city == "Atlantis":
        raise ValueError("no such city")
    return Forecast(city=city, celsius=18.0)


@agents_tool
def ag_default_policy(city: str) -> str:
    """Fails under the SDK's default failure policy."""
    raise ValueError("boom")


@agents_tool(needs_approval=True, allowed_callers=["direct", "programmatic"])
async def ag_delete(path: str) -> Forecast:
    """Delete something (async, needs approval)."""
    await asyncio.sleep(0)
    return Forecast(city=path, celsius=threading.current_thread().ident or 0.0)


def test_agents_schema_output_schema_and_approval():
    plain = from_openai_agents(ag_forecast)
    assert plain.parameters["properties"]["city"]["description"] == "The city's name."
    assert plain.requires_approval is False
    assert plain.returns["properties"]["celsius"]["type"] == "number"  # from the function's `-> Forecast`
    deleting = from_openai_agents(ag_delete)
    assert deleting.requires_approval is True
    assert deleting.returns["properties"]["celsius"] == {"title": "Celsius", "type": "number"}
    assert "Promise<{ " in sdk.render([deleting])


async def _needs_approval(context, params, call_id):
    return params["city"] == "Paris"


def test_agents_a_per_call_approval_callable_means_every_call_asks():
    tool = agents.FunctionTool(
        name="gated",
        description="",
        params_json_schema=ag_forecast.params_json_schema,
        on_invoke_tool=ag_forecast.on_invoke_tool,
        needs_approval=_needs_approval,
    )
    assert from_openai_agents(tool).requires_approval is True
    assert from_openai_agents(tool, requires_approval=False).requires_approval is False


def test_agents_calls_run_as_a_program_caller_on_the_tool_thread():
    assert from_openai_agents(ag_forecast).function({"city": "Lyon"}) == {"city": "Lyon", "celsius": 18.0}
    assert from_openai_agents(ag_delete).function({"path": "x"})["celsius"] == threading.current_thread().ident
    with pytest.raises(ValueError, match="no such city"):
        from_openai_agents(ag_forecast).function({"city": "Atlantis"})
    # The SDK's default policy answers a failure with an error string, as documented.
    assert from_openai_agents(ag_default_policy).function({"city": "x"}).startswith("An error occurred while running")
    with pytest.raises(ToolError, match="Invalid JSON input for tool ag_forecast"):
        from_openai_agents(ag_forecast).function({"town": "Lyon"})


def test_agents_tools_that_only_the_sdk_runner_can_honour_are_refused():
    direct_only = agents_tool(lambda city: city, name_override="direct_only", allowed_callers=["direct"])
    with pytest.raises(ConfigError, match="allows only \\['direct'\\] callers"):
        from_openai_agents(direct_only)

    @agents.tool_input_guardrail
    def guard(data):
        return agents.ToolGuardrailFunctionOutput.allow()

    guarded = agents_tool(lambda city: city, name_override="guarded", tool_input_guardrails=[guard])
    with pytest.raises(ConfigError, match="tool guardrails"):
        from_openai_agents(guarded)
    with pytest.raises(ConfigError, match="expected an agents.FunctionTool"):
        from_openai_agents(lc_add)


# --- pydantic-ai -----------------------------------------------------------------------------

import pydantic_ai  # noqa: E402


def pa_lookup(sku: str, warehouse: str = "main") -> Forecast:
    """Look up a SKU.

    Args:
        sku: The SKU.
        warehouse: Where to look.
    """
    if sku == "gone":
        raise pydantic_ai.ModelRetry("that SKU was discontinued; try its successor")
    if sku == "broken":
        raise pydantic_ai.exceptions.ToolFailed("the catalogue is down")
    return Forecast(city=warehouse, celsius=float(len(sku)))


async def pa_double(x: int) -> int:
    """Double it, asynchronously."""
    await asyncio.sleep(0)
    return 2 * x


def test_pydantic_ai_flags_map_onto_ours():
    sequential = from_pydantic_ai(pydantic_ai.Tool(pa_lookup, sequential=True, requires_approval=True))
    assert concurrency_mode(sequential, {"sku": "a"}) == EXCLUSIVE
    assert sequential.requires_approval is True
    free = from_pydantic_ai(pa_double)  # a plain function, as pydantic-ai wraps it: it runs side by side
    assert concurrency_mode(free, {"x": 1}) == PARALLEL and free.requires_approval is False
    assert concurrency_mode(from_pydantic_ai(pa_double, concurrency_safe=False), {"x": 1}) == EXCLUSIVE
    assert sequential.parameters["properties"]["sku"] == {"description": "The SKU.", "type": "string"}
    assert sequential.returns["properties"]["celsius"]["type"] == "number"
    assert free.returns == {"type": "integer"}


def test_pydantic_ai_calls_validate_and_map_retries_to_tool_errors():
    lookup = from_pydantic_ai(pydantic_ai.Tool(pa_lookup))
    assert lookup.function({"sku": "abc"}) == {"city": "main", "celsius": 3.0}
    with pytest.raises(ToolError, match="^that SKU was discontinued; try its successor$"):
        lookup.function({"sku": "gone"})
    with pytest.raises(ToolError, match="the catalogue is down"):
        lookup.function({"sku": "broken"})
    with pytest.raises(ToolError, match=r"^invalid arguments: \$\.sku: "):
        lookup.function({"sku": 5})
    assert from_pydantic_ai(pa_double).function({"x": 21}) == 42


def test_pydantic_ai_tools_that_need_an_agent_run_are_refused():
    def with_ctx(ctx: pydantic_ai.RunContext[None], x: int) -> int:
        return x

    with pytest.raises(ConfigError, match="takes a RunContext"):
        from_pydantic_ai(pydantic_ai.Tool(with_ctx))

    async def prepare(ctx, definition):
        return definition

    with pytest.raises(ConfigError, match="has a prepare function"):
        from_pydantic_ai(pydantic_ai.Tool(pa_double, prepare=prepare))
    with pytest.raises(ConfigError, match="expected a pydantic_ai.Tool or a function"):
        from_pydantic_ai(42)


# --- LlamaIndex ------------------------------------------------------------------------------

from llama_index.core.tools import FunctionTool, ToolMetadata, ToolOutput  # noqa: E402
from llama_index.core.tools.types import BaseTool as LlamaBaseTool  # noqa: E402


def li_subtract(a: int, b: int) -> int:
    """Subtract b from a."""
    return a - b


async def li_forecast(city: str) -> Forecast:
    """Async forecast."""
    return Forecast(city=city, celsius=12.5)


class Echo(LlamaBaseTool):
    """A plain LlamaIndex tool: one string input, an error output on demand."""

    @property
    def metadata(self) -> ToolMetadata:
        return ToolMetadata(name="echo", description="Echo the input.")

    def __call__(self, input: str) -> ToolOutput:
        return ToolOutput(
            tool_name="echo",
            content=f"echo: {input}",
            raw_input={"input": input},
            raw_output=object(),
            is_error=input == "fail",
        )


def test_llamaindex_function_tools():
    subtract = from_llamaindex(FunctionTool.from_defaults(fn=li_subtract))
    assert subtract.name == "li_subtract" and subtract.parameters["required"] == ["a", "b"]
    assert "Subtract b from a." in subtract.description
    assert subtract.function({"a": 5, "b": 3}) == 2
    forecast = from_llamaindex(FunctionTool.from_defaults(async_fn=li_forecast))
    assert forecast.function({"city": "Oslo"}) == {"city": "Oslo", "celsius": 12.5}
    assert concurrency_mode(subtract, {}) == EXCLUSIVE and subtract.requires_approval is False


def test_llamaindex_text_output_and_error_output():
    echo = from_llamaindex(Echo())
    assert echo.parameters["required"] == ["input"]
    assert echo.function({"input": "hi"}) == "echo: hi"  # raw_output has no JSON form: the text goes back
    with pytest.raises(ToolError, match="echo: fail"):
        echo.function({"input": "fail"})
    with pytest.raises(ConfigError, match="expected a llama_index.core BaseTool"):
        from_llamaindex(lc_add)


# --- all four in one program ------------------------------------------------------------------


def test_one_program_fans_out_over_all_four_frameworks():
    tools = [
        from_langchain(lc_add),
        from_langchain(lc_forecast),
        from_openai_agents(ag_forecast),
        from_pydantic_ai(pa_double),
        from_llamaindex(FunctionTool.from_defaults(fn=li_subtract)),
    ]
    program = """
    const [sum, weather, agents, doubled, diff] = await Promise.all([
      tools.lc_add({a: 1, b: 2}),
      tools.lc_forecast({city: "Lyon"}),
      tools.ag_forecast({city: "Oslo"}),
      tools.pa_double({x: 4}),
      tools.li_subtract({a: 9, b: 4}),
    ]);
    let failed;
    try { await tools.ag_forecast({city: "Atlantis"}); } catch (e) { failed = e.message; }
    return {sum, weather, agents, doubled, diff, failed};
    """
    result = run_code(program, tools, description="test")
    assert result.ok, result.error
    assert result.result == {
        "sum": 3,
        "weather": {"city": "Lyon", "celsius": 21.5},
        "agents": {"city": "Oslo", "celsius": 18.0},
        "doubled": 8,
        "diff": 5,
        "failed": "no such city",
    }
    assert [event.tool for event in result.calls][:5] == [
        "lc_add",
        "lc_forecast",
        "ag_forecast",
        "pa_double",
        "li_subtract",
    ]


# --- a missing framework names its extra ---------------------------------------------------------


@pytest.mark.parametrize(
    ("adapter", "module", "extra"),
    [
        (from_langchain, "langchain_core.tools", "langchain"),
        (from_openai_agents, "agents", "openai-agents"),
        (from_pydantic_ai, "pydantic_ai", "pydantic-ai"),
        (from_llamaindex, "llama_index.core.tools.types", "llamaindex"),
    ],
)
def test_a_missing_framework_is_a_configuration_error_naming_the_extra(monkeypatch, adapter, module, extra):
    monkeypatch.setitem(sys.modules, module, None)
    from nous_sched._extras import install_command

    with pytest.raises(ConfigError, match=re.escape(f"install it with: {install_command(extra)}")):
        adapter(object())

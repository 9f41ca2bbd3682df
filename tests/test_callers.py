"""Who may call a tool (issue 41): ``Tool(callers={"model"})``, ``{"code"}`` or both."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nous_sched import (
    ConfigError,
    QuickJSRuntime,
    SessionLog,
    Tool,
    call_tool,
    function_tool,
    run_code,
    run_code_tool,
    start_run,
    visible_tools,
)
from nous_sched.mcp import ToolOverride
from nous_sched.sdk import ToolIndex, render

WAIT = 30
ran: list[str] = []


def _tool(name: str, callers: Any = None) -> Tool:
    def function(args: dict[str, Any]) -> Any:
        ran.append(name)
        return name

    extra = {} if callers is None else {"callers": callers}
    return Tool(name, function, f"The {name} tool.", {"type": "object", "properties": {}}, **extra)


ASK_USER = _tool("ask_user", {"model"})
CRUNCH = _tool("crunch", {"code"})
BOTH = _tool("search", {"model", "code"})
TOOLS = [ASK_USER, CRUNCH, BOTH]


def test_a_model_only_tool_is_refused_from_code_with_the_rule_and_audited() -> None:
    ran.clear()
    log = SessionLog()
    program = """
let said = null;
try { await tools.ask_user({}); } catch (e) { said = e.message + " | " + e.tool; }
return {said, crunched: await tools.crunch({}), searched: await tools.search({})};
"""
    run = start_run(program, TOOLS, description="d", session_log=log, timeout=WAIT)
    events = list(run.events())
    result = run.result(WAIT)
    assert result.error is None, result.error
    said = result.result["said"]
    assert 'may be called only by the model directly, not from code (Tool.callers={"model"})' in said
    assert said.endswith("| ask_user")
    assert result.result["crunched"] == "crunch" and result.result["searched"] == "search"
    assert ran == ["crunch", "search"]  # ask_user never ran
    assert [(r.tool, "Tool.callers" in r.message) for r in result.refused] == [("ask_user", True)]
    assert [e.type for e in log.events if e.data.get("name") == "ask_user"] == ["tool_refused"]
    assert [e.data["reason"] for e in events if e.kind == "refused"] == ["callers"]


def test_a_code_only_tool_is_absent_from_visible_tools_and_refused_to_a_direct_call() -> None:
    for mode in ("native", "both"):
        names = [t.name for t in visible_tools(mode, TOOLS, runtime=QuickJSRuntime())]
        assert "crunch" not in names and {"ask_user", "search"} <= set(names), (mode, names)
    assert [t.name for t in visible_tools("code", TOOLS, runtime=QuickJSRuntime())] == ["run_code"]
    ran.clear()
    answer = json.loads(call_tool(CRUNCH, {}))
    assert "may be called only from code" in answer["error"] and ran == []
    assert json.loads(call_tool(ASK_USER, {})) == "ask_user" and ran == ["ask_user"]


def test_a_model_only_tool_is_absent_from_the_sdk_the_program_reads() -> None:
    description = run_code_tool(TOOLS, runtime=QuickJSRuntime()).description
    assert "crunch" in description and "search" in description and "ask_user" not in description
    assert "ask_user" not in render(TOOLS) and "ask_user" not in ToolIndex(TOOLS).names
    result = run_code(
        'return [await sdk.describe("crunch"), JSON.stringify(await sdk.search("tool")), '
        'await sdk.describe("ask_user").catch(e => "no: " + e.message)]',
        TOOLS,
        description="d",
        timeout=WAIT,
    )
    crunch, found, ask = result.result
    assert "crunch" in crunch and "ask_user" not in found and ask.startswith("no: ")


@pytest.mark.parametrize("bad", ["model", {"human"}, set(), ["code", 1], None, 3])
def test_a_bad_callers_value_is_a_config_error_naming_callers(bad: Any) -> None:
    with pytest.raises(ConfigError, match="`callers` must be a non-empty set of 'model' and/or 'code'"):
        Tool("t", lambda a: a, callers=bad)


def test_overrides_and_adapters_set_callers() -> None:
    assert ToolOverride(callers=["model"]).callers == frozenset({"model"})
    assert ToolOverride().callers is None
    with pytest.raises(ConfigError, match="ToolOverride: `callers`"):
        ToolOverride(callers="code")

    @function_tool
    def f() -> int:
        """A tool."""
        return 1

    assert f.callers == frozenset({"model", "code"})


def test_framework_adapters_take_callers_and_the_agents_sdk_says_its_own() -> None:
    import agents
    import langchain_core.tools as langchain_tools

    from nous_sched.integrations import from_langchain, from_openai_agents

    programmatic = agents.function_tool(lambda city: city, name_override="p_only", allowed_callers=["programmatic"])
    both = agents.function_tool(lambda city: city, name_override="both", allowed_callers=["programmatic", "direct"])
    plain = agents.function_tool(lambda city: city, name_override="plain")
    assert from_openai_agents(programmatic).callers == frozenset({"code"})
    assert from_openai_agents(both).callers == frozenset({"model", "code"})
    assert from_openai_agents(plain, callers={"model"}).callers == frozenset({"model"})
    assert from_openai_agents(programmatic, callers={"model", "code"}).callers == frozenset({"model", "code"})

    @langchain_tools.tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    assert from_langchain(add, callers={"code"}).callers == frozenset({"code"})
    with pytest.raises(ConfigError, match="`callers`"):
        from_langchain(add, callers="code")

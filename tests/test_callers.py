"""Who may call a tool (issue 41): ``Tool(callers={"model"})``, ``{"code"}`` or both."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic_ai import RunContext

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
    assert "crunch" in crunch and "ask_user" not in found
    assert ask.startswith("no: ") and "may be called only by the model directly" in ask


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


def test_a_pydantic_ai_switch_offers_model_only_tools_directly_and_binds_arguments() -> None:
    import asyncio

    from pydantic_ai import Agent
    from pydantic_ai.exceptions import ApprovalRequired
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.toolsets import FunctionToolset

    from nous_sched import ApprovalRequest
    from nous_sched.integrations.pydantic_ai import CodeModeToolset

    secret = "sk-switch-" + "9f" * 8
    got: list[Any] = []

    def ask_user(question: str) -> str:
        got.append(("ask_user", question))
        return "yes"

    def fetch(ctx: RunContext[None], url: str, api_key: str) -> str:
        if not ctx.tool_call_approved:
            raise ApprovalRequired()
        got.append(("fetch", url, api_key))
        return f"fetched {url}"

    program = (
        'let said = null; try { await tools.ask_user({question: "?"}); } catch (e) { said = e.message; }\n'
        'return {said, fetched: await tools.fetch({url: "u"})};'
    )
    seen: dict[str, Any] = {}

    def respond(messages: Any, info: Any) -> Any:
        returns = [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
        if not returns:
            seen["offered"] = sorted(t.name for t in info.function_tools)
            seen["sdk"] = next(t.description for t in info.function_tools if t.name == "run_code")
            return ModelResponse(parts=[ToolCallPart("ask_user", {"question": "direct?"})])
        if len(returns) == 1:
            return ModelResponse(parts=[ToolCallPart("run_code", {"code": program, "description": "fetch"})])
        seen["answer"] = returns[-1].content
        return ModelResponse(parts=[TextPart("ok")])

    asked: list[ApprovalRequest] = []
    functions = FunctionToolset([ask_user])
    functions.add_function(fetch, takes_ctx=True)
    toolset = CodeModeToolset(
        functions,
        callers={"ask_user": {"model"}},
        bound={"fetch": {"api_key": secret}},
        approval_handler=lambda request: asked.append(request) or True,
        timeout=WAIT,
    )
    agent = Agent(FunctionModel(respond), toolsets=[toolset])

    async def go() -> Any:
        async with agent:
            return await agent.run("go")

    assert asyncio.run(go()).output == "ok"
    assert seen["offered"] == ["ask_user", "run_code"]  # the model-only tool, offered directly
    assert "ask_user" not in seen["sdk"] and "api_key" not in seen["sdk"] and "fetch" in seen["sdk"]
    answer = json.loads(seen["answer"])["result"]
    assert 'may be called only by the model directly, not from code (Tool.callers={"model"})' in answer["said"]
    assert answer["fetched"] == "fetched u"
    assert got == [("ask_user", "direct?"), ("fetch", "u", secret)]
    assert [r.arguments for r in asked] == [{"url": "u", "api_key": "[bound]"}]  # asked from inside the tool
    assert secret not in repr(asked) + seen["answer"] + seen["sdk"]
    with pytest.raises(ConfigError, match=r"CodeModeToolset: `callers\['ask_user'\]`"):
        CodeModeToolset(functions, callers={"ask_user": "model"})


def test_a_langchain_switch_keeps_a_model_only_tool_offered_beside_run_code() -> None:
    from langchain.agents import create_agent
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool as langchain_tool

    from nous_sched.integrations.langchain import CodeModeMiddleware

    program = (
        'let said = null; try { await tools.ask_user({question: "?"}); } catch (e) { said = e.message; }\n'
        'return {said, loud: await tools.shout({text: "hi"})};'
    )
    seen: dict[str, Any] = {}

    class Scripted(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            seen["offered"] = [t.name for t in tools]
            seen["sdk"] = tools[-1].description
            return self

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
            answers = [m for m in messages if isinstance(m, ToolMessage)]
            if not answers:
                call = {
                    "name": "run_code",
                    "args": {"code": program, "description": "d"},
                    "id": "c1",
                    "type": "tool_call",
                }
                return ChatResult(generations=[ChatGeneration(message=AIMessage(content="", tool_calls=[call]))])
            seen["answer"] = answers[-1].content
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content="done"))])

    @langchain_tool
    def ask_user(question: str) -> str:
        """Ask the person."""
        return "yes"

    @langchain_tool
    def shout(text: str) -> str:
        """Shout."""
        return text.upper()

    agent = create_agent(
        Scripted(),
        [ask_user, shout],
        middleware=[CodeModeMiddleware(callers={"ask_user": {"model"}}, timeout=WAIT)],
    )
    state = agent.invoke({"messages": [{"role": "user", "content": "go"}]})
    assert state["messages"][-1].content == "done"
    assert seen["offered"] == ["ask_user", "run_code"]
    assert "ask_user" not in seen["sdk"] and '"shout"(' in seen["sdk"]
    answer = json.loads(seen["answer"])["result"]
    assert "may be called only by the model directly" in answer["said"] and answer["loud"] == "HI"


def test_an_agents_sdk_switch_offers_what_callers_gives_the_model() -> None:
    import asyncio

    import agents

    from nous_sched.integrations.openai_agents import code_mode

    ask_user = agents.function_tool(lambda question: "yes", name_override="ask_user")
    shout = agents.function_tool(lambda text: text.upper(), name_override="shout")
    agent = code_mode(agents.Agent(name="a", tools=[ask_user, shout]), callers={"ask_user": {"model"}}, timeout=WAIT)
    offered = asyncio.run(agent.get_all_tools(agents.RunContextWrapper(context=None)))
    names = [t.name for t in offered]
    assert names == ["ask_user", "run_code"]
    assert "ask_user" not in offered[-1].description and '"shout"(' in offered[-1].description

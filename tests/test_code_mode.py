"""One switch turns an agent's own tools into Code Mode, in each framework, run for real with a scripted model.

Each agent has a tool that reads its run's context (per-run deps), the tools
of a real MCP server (tests/mcp_servers/lab.py, a subprocess) through the
framework's own MCP support, and a tool its owner gated behind approval. One
line switches it to Code Mode; the scripted model then sees only
``run_code``, writes a program that fans out over all of them (two MCP
``meet`` calls that only return together prove the fan-out), the gated tool
asks the approval handler, and the model reads the program's answer. Traces:
the framework's agent span, the ``run_code`` span under it, one
``execute_tool`` span per nested call under that.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import otel_global
import pytest
from otel_global import ancestors, named

from nous_sched import ApprovalRequest, ConfigError, SessionLog

LAB = Path(__file__).parent / "mcp_servers" / "lab.py"
WAIT = 60.0
ORDERS = {"ada": ["A-1", "A-2"], "bob": ["B-7"]}

PROGRAM = """
const [mine, a, b, entry] = await Promise.all([
  tools.my_orders({ status: "open" }),
  tools.meet({ group: "fan", n: 2, key: "a" }),
  tools.meet({ group: "fan", n: 2, key: "b" }),
  tools.lookup({ key: "k1" }),
]);
const cancelled = await tools.cancel_order({ order_id: mine[0] });
return { mine, met: [a.met, b.met], entry: entry.value, cancelled };
"""


def expected(user):
    first = ORDERS[user][0]
    return {"mine": ORDERS[user], "met": [True, True], "entry": 2, "cancelled": f"cancelled {first} for {user}"}


@dataclass
class Deps:
    user: str


class Asked:
    """An approval handler that approves, remembering what it was asked."""

    def __init__(self):
        self.requests: list[ApprovalRequest] = []
        self.lock = threading.Lock()

    def __call__(self, request):
        with self.lock:
            self.requests.append(request)
        return True


def answer_of(text):
    """The program's result out of run_code's JSON answer."""
    return json.loads(text)["result"]


# -- pydantic-ai -------------------------------------------------------------------------------------

from pydantic_ai import Agent, RunContext  # noqa: E402
from pydantic_ai.mcp import MCPToolset  # noqa: E402
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart  # noqa: E402
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402

from nous_sched.integrations.pydantic_ai import CodeMode, CodeModeToolset  # noqa: E402


def pydantic_ai_model(seen):
    def respond(messages, info: AgentInfo):
        returns = [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
        if not returns:
            seen["offered"] = [t.name for t in info.function_tools]
            seen["description"] = info.function_tools[0].description
            return ModelResponse(
                parts=[ToolCallPart("run_code", {"code": PROGRAM, "description": "open orders, cancel the first"})]
            )
        seen["answer"] = returns[-1].content
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(respond)


def pydantic_ai_agent(seen, **code_mode):
    """The agent as its owner wrote it, plus the one line (capabilities=[CodeMode(...)])."""
    agent = Agent(
        pydantic_ai_model(seen),
        deps_type=Deps,
        toolsets=[MCPToolset(LAB, id="lab", init_timeout=WAIT, read_timeout=WAIT)],
        capabilities=[CodeMode(**code_mode)],
    )

    @agent.tool
    async def my_orders(ctx: RunContext[Deps], status: str) -> list[str]:
        """The current user's orders with this status."""
        assert ctx.tool_name == "my_orders" and ctx.tool_call_id  # the nested call's own
        return ORDERS[ctx.deps.user]

    @agent.tool(requires_approval=True)
    def cancel_order(ctx: RunContext[Deps], order_id: str) -> str:
        """Cancel an order."""
        assert ctx.tool_call_approved
        return f"cancelled {order_id} for {ctx.deps.user}"

    return agent


def test_pydantic_ai_agent_switched_to_code_mode_in_one_line():
    asked = Asked()
    log = SessionLog()
    seen = {}
    agent = pydantic_ai_agent(seen, approval_handler=asked, session_log=log, timeout=WAIT)

    async def go():
        async with agent:
            first = await agent.run("cancel my first open order", deps=Deps("ada"))
            second = await agent.run("cancel my first open order", deps=Deps("bob"))
        return first, second

    first, second = asyncio.run(go())
    assert first.output == second.output == "done"
    assert seen["offered"] == ["run_code"]  # the model sees run_code in place of the tools
    for name in ("my_orders", "cancel_order", "meet", "lookup"):
        assert f'"{name}"(' in seen["description"]  # the tools, declared in run_code's SDK
    assert answer_of(seen["answer"]) == expected("bob")  # the last run's deps reached the tool
    # The gated tool asked on every call, with its real arguments, once per run.
    assert [(r.tool, r.arguments) for r in asked.requests] == [
        ("cancel_order", {"order_id": "A-1"}),
        ("cancel_order", {"order_id": "B-7"}),
    ]
    # The audit: every nested call of both runs.
    calls = [e for e in log.events if e.type == "tool_call"]
    assert sorted(e.data["name"] for e in calls) == sorted(
        ["run_code", "my_orders", "meet", "meet", "lookup", "cancel_order"] * 2
    )


def test_pydantic_ai_code_mode_toolset_over_chosen_toolsets_and_mcp_read_only_rule():
    from pydantic_ai.toolsets import FunctionToolset

    def shout(text: str) -> str:
        return text.upper()

    seen = {}
    program = 'return [await tools.shout({ text: "hi" }), (await tools.lookup({ key: "abc" })).value];'

    def respond(messages, info):
        returns = [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
        if not returns:
            return ModelResponse(parts=[ToolCallPart("run_code", {"code": program, "description": "shout"})])
        seen["answer"] = returns[-1].content
        return ModelResponse(parts=[TextPart("ok")])

    toolset = CodeModeToolset(
        FunctionToolset([shout]), MCPToolset(LAB, id="lab", init_timeout=WAIT, read_timeout=WAIT), timeout=WAIT
    )
    agent = Agent(FunctionModel(respond), toolsets=[toolset])

    async def go():
        async with agent:
            assert (await agent.run("go")).output == "ok"
            from pydantic_ai.models.test import TestModel
            from pydantic_ai.usage import RunUsage

            ctx = RunContext(deps=None, model=TestModel(), usage=RunUsage())
            return {t.name: t.concurrency_safe is not None for t in await toolset.nested_tools(ctx)}

    safe = asyncio.run(go())
    assert answer_of(seen["answer"]) == ["HI", 3]
    # MCP tools run beside others only when the server says read-only; function tools as pydantic-ai runs them.
    assert safe["lookup"] is True and safe["put"] is False and safe["plain"] is False
    assert safe["shout"] is True


def test_pydantic_ai_code_mode_refuses_bad_options_where_the_agent_is_built():
    with pytest.raises(ConfigError, match="CodeModeToolset: .*timeout"):
        CodeModeToolset(timeout=-1)
    with pytest.raises(ConfigError, match="expected pydantic-ai toolsets"):
        CodeModeToolset(object())
    with pytest.raises(ConfigError, match="deps"):
        CodeMode(deps=1)
    with pytest.raises(ConfigError, match="requires_approval"):
        CodeModeToolset(requires_approval={"x": "yes"})


def test_pydantic_ai_traces_nest_under_the_agent_span():
    spans = otel_global.global_spans()
    exporter = next(spans)
    try:
        from opentelemetry import trace

        seen = {}
        agent = pydantic_ai_agent(seen, approval_handler=Asked(), timeout=WAIT)
        agent.instrument = True  # pydantic-ai's own OpenTelemetry spans, on the global provider
        with trace.get_tracer("test").start_as_current_span("request"):
            assert agent.run_sync("go", deps=Deps("ada")).output == "done"
        assert answer_of(seen["answer"]) == expected("ada")
        finished = exporter.get_finished_spans()
    finally:
        spans.close()
    (run_span,) = named(finished, "nous_sched.run_code")
    above = ancestors(run_span, finished)
    # pydantic-ai's own spans: the agent run, its tool call (nous_sched adds no second one for it).
    assert above == ["execute_tool run_code", "invoke_agent agent", "request"]
    nested = [s for s in finished if s.parent is not None and s.parent.span_id == run_span.context.span_id]
    assert sorted(s.attributes["gen_ai.tool.name"] for s in nested) == sorted(
        ["my_orders", "meet", "meet", "lookup", "cancel_order"]
    )
    for span in nested:
        assert span.name == "execute_tool " + span.attributes["gen_ai.tool.name"]
        assert span.attributes["gen_ai.operation.name"] == "execute_tool"
        assert span.attributes["gen_ai.tool.call.id"].startswith(run_span.attributes["nous_sched.call_id"] + ":code:")
    (cancel,) = [s for s in nested if s.attributes["gen_ai.tool.name"] == "cancel_order"]
    assert cancel.attributes["nous_sched.approved"] is True
    assert {s.attributes["nous_sched.mode"] for s in nested if s.attributes["gen_ai.tool.name"] == "meet"} == {
        "parallel"
    }


# -- OpenAI Agents SDK -------------------------------------------------------------------------------

import agents  # noqa: E402
from agents.items import ModelResponse as AgentsResponse  # noqa: E402
from agents.mcp import MCPServerStdio  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.usage import Usage  # noqa: E402
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText  # noqa: E402

from nous_sched.integrations.openai_agents import code_mode  # noqa: E402


class ScriptedAgentsModel(Model):
    """The Agents SDK's model seam: one run_code call with PROGRAM, then a final message."""

    def __init__(self, seen):
        self.seen = seen

    async def get_response(self, system_instructions, input, model_settings, tools, *args, **kwargs):
        outputs = [i["output"] for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"]
        if not outputs:
            self.seen["offered"] = [t.name for t in tools]
            self.seen["description"] = tools[-1].description
            arguments = json.dumps({"code": PROGRAM, "description": "open orders, cancel the first"})
            call = ResponseFunctionToolCall(
                type="function_call", call_id="call_1", name="run_code", arguments=arguments, id="fc_1"
            )
            return AgentsResponse(output=[call], usage=Usage(), response_id=None)
        self.seen["answer"] = outputs[-1]
        text = ResponseOutputText(type="output_text", text="done", annotations=[])
        message = ResponseOutputMessage(type="message", id="msg", role="assistant", status="completed", content=[text])
        return AgentsResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError


@agents.function_tool
def my_orders(ctx: agents.RunContextWrapper[Deps], status: str) -> list[str]:
    """The current user's orders with this status."""
    return ORDERS[ctx.context.user]


@agents.function_tool(needs_approval=True)
def cancel_order(ctx: agents.RunContextWrapper[Deps], order_id: str) -> str:
    """Cancel an order."""
    return f"cancelled {order_id} for {ctx.context.user}"


def lab_server():
    params = {"command": sys.executable, "args": [str(LAB)]}
    return MCPServerStdio(params, cache_tools_list=True, client_session_timeout_seconds=WAIT)


def test_openai_agents_agent_switched_to_code_mode_in_one_line():
    asked = Asked()
    seen = {}

    async def go():
        async with lab_server() as lab:
            agent = agents.Agent(
                name="orders",
                model=ScriptedAgentsModel(seen),
                tools=[my_orders, cancel_order],
                mcp_servers=[lab],
            )
            agent = code_mode(agent, approval_handler=asked, timeout=WAIT)  # the one line
            first = await agents.Runner.run(agent, "cancel my first open order", context=Deps("ada"))
            first_answer = seen["answer"]
            second = await agents.Runner.run(agent, "cancel my first open order", context=Deps("bob"))
            return first, first_answer, second

    first, first_answer, second = asyncio.run(go())
    assert first.final_output == second.final_output == "done"
    assert seen["offered"] == ["run_code"]
    for name in ("my_orders", "cancel_order", "meet", "lookup"):
        assert f'"{name}"(' in seen["description"]
    assert answer_of(first_answer) == expected("ada")  # each run's own context reached the tool
    assert answer_of(seen["answer"]) == expected("bob")
    assert [(r.tool, r.arguments) for r in asked.requests] == [
        ("cancel_order", {"order_id": "A-1"}),
        ("cancel_order", {"order_id": "B-7"}),
    ]


def test_openai_agents_code_mode_refuses_what_it_cannot_honour():
    with pytest.raises(ConfigError, match="expected an agents.Agent"):
        code_mode(object())
    with pytest.raises(ConfigError, match="code_mode: .*max_parallel"):
        code_mode(agents.Agent(name="a"), max_parallel=0)

    def guard(ctx, agent, data):
        return agents.ToolGuardrailFunctionOutput.allow()

    guarded = agents.function_tool(lambda x: x, name_override="guarded")
    guarded.tool_input_guardrails = [agents.tool_input_guardrail(guard)]
    with pytest.raises(ConfigError, match="guardrails"):
        code_mode(agents.Agent(name="a", tools=[guarded]))


# -- LangChain create_agent ----------------------------------------------------------------------------

from langchain.agents import create_agent  # noqa: E402
from langchain.agents.middleware import HumanInTheLoopMiddleware  # noqa: E402
from langchain.tools import ToolRuntime  # noqa: E402
from langchain_core.language_models.chat_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.tools import tool as langchain_tool  # noqa: E402
from mcp_servers import stdio_command  # noqa: E402

from nous_sched.integrations import to_langchain  # noqa: E402
from nous_sched.integrations.langchain import CodeModeMiddleware  # noqa: E402
from nous_sched.mcp import ServerSpec, connect  # noqa: E402


class ScriptedChatModel(BaseChatModel):
    """One run_code call with PROGRAM, then "done"; remembers the tools it was offered and what it read."""

    seen: Any = None  # the test's own dict (a `dict` field would be copied)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools, **kwargs):
        self.seen["offered"] = [t.name for t in tools]
        self.seen["description"] = tools[-1].description
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        answers = [m for m in messages if isinstance(m, ToolMessage)]
        if not answers:
            args = {"code": PROGRAM, "description": "open orders, cancel the first"}
            call = {"name": "run_code", "args": args, "id": "call_1", "type": "tool_call"}
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content="", tool_calls=[call]))])
        self.seen["answer"] = answers[-1].content
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content="done"))])


@langchain_tool("my_orders")
def lc_my_orders(status: str, runtime: ToolRuntime[Deps]) -> list[str]:
    """The current user's orders with this status."""
    assert runtime.tool_call_id and runtime.tool_call_id != "call_1"  # the nested call's own id
    return ORDERS[runtime.context.user]


@langchain_tool("cancel_order")
def lc_cancel_order(order_id: str, runtime: ToolRuntime[Deps]) -> str:
    """Cancel an order."""
    return f"cancelled {order_id} for {runtime.context.user}"


def mcp_as_langchain(conn):
    """The lab server's tools as LangChain tools, their MCP read-only hint in metadata
    (as langchain-mcp-adapters copies a tool's annotations)."""
    tools = []
    for tool in conn.tools():
        lc = to_langchain(tool)
        lc.metadata = {"readOnlyHint": conn.flags()[tool.name].parallel}
        tools.append(lc)
    return tools


def langchain_agent(seen, conn, **options):
    hitl = HumanInTheLoopMiddleware(interrupt_on={"cancel_order": True})
    return create_agent(
        ScriptedChatModel(seen=seen),
        [lc_my_orders, lc_cancel_order, *mcp_as_langchain(conn)],
        context_schema=Deps,
        middleware=[CodeModeMiddleware(interrupt_on=hitl, **options)],  # the one line
    )


@pytest.mark.parametrize("door", ["invoke", "ainvoke"])
def test_langchain_agent_switched_to_code_mode_in_one_line(door):
    asked = Asked()
    seen = {}
    with connect(ServerSpec(stdio_command(f"code-mode-{door}"), trusted=True), connect_timeout=WAIT) as conn:
        agent = langchain_agent(seen, conn, approval_handler=asked, timeout=WAIT)
        answers = []
        for user in ("ada", "bob"):
            question = {"messages": [{"role": "user", "content": "cancel my first open order"}]}
            if door == "invoke":
                state = agent.invoke(question, context=Deps(user))
            else:
                state = asyncio.run(agent.ainvoke(question, context=Deps(user)))
            assert state["messages"][-1].content == "done"
            answers.append(seen["answer"])
    assert seen["offered"] == ["run_code"]
    for name in ("my_orders", "cancel_order", "meet", "lookup"):
        assert f'"{name}"(' in seen["description"]
    assert [answer_of(a) for a in answers] == [expected("ada"), expected("bob")]
    assert [(r.tool, r.arguments) for r in asked.requests] == [
        ("cancel_order", {"order_id": "A-1"}),
        ("cancel_order", {"order_id": "B-7"}),
    ]


def test_langchain_code_mode_refuses_bad_options():
    with pytest.raises(ConfigError, match="interrupt_on"):
        CodeModeMiddleware(interrupt_on=["cancel_order"])
    with pytest.raises(ConfigError, match="CodeModeMiddleware: .*output_budget"):
        CodeModeMiddleware(output_budget=5)


# -- traces: the agent span, run_code under it, the nested calls under that -----------------------------


def _traced(run):
    """``run()`` under an agent span on a global tracer provider; the finished spans."""
    spans = otel_global.global_spans()
    exporter = next(spans)
    try:
        from opentelemetry import trace

        with trace.get_tracer("test").start_as_current_span("invoke_agent orders"):
            run()
        return exporter.get_finished_spans()
    finally:
        spans.close()


def _check_nested(finished):
    (run_span,) = named(finished, "nous_sched.run_code")
    assert ancestors(run_span, finished) == ["execute_tool run_code", "invoke_agent orders"]
    nested = [s for s in finished if s.parent is not None and s.parent.span_id == run_span.context.span_id]
    assert sorted(s.attributes["gen_ai.tool.name"] for s in nested) == sorted(
        ["my_orders", "meet", "meet", "lookup", "cancel_order"]
    )
    for span in nested:
        assert span.attributes["gen_ai.operation.name"] == "execute_tool"
        assert span.attributes["gen_ai.tool.call.id"].startswith(run_span.attributes["nous_sched.call_id"] + ":code:")
    (cancel,) = [s for s in nested if s.attributes["gen_ai.tool.name"] == "cancel_order"]
    assert cancel.attributes["nous_sched.approved"] is True
    return nested


def test_openai_agents_traces_nest_under_the_agent_span():
    seen = {}

    async def go():
        async with lab_server() as lab:
            agent = agents.Agent(
                name="orders", model=ScriptedAgentsModel(seen), tools=[my_orders, cancel_order], mcp_servers=[lab]
            )
            await agents.Runner.run(code_mode(agent, approval_handler=Asked(), timeout=WAIT), "go", context=Deps("ada"))

    _check_nested(_traced(lambda: asyncio.run(go())))
    assert answer_of(seen["answer"]) == expected("ada")


def test_langchain_traces_nest_under_the_agent_span():
    seen = {}
    with connect(ServerSpec(stdio_command("code-mode-traces"), trusted=True), connect_timeout=WAIT) as conn:
        agent = langchain_agent(seen, conn, approval_handler=Asked(), timeout=WAIT)
        question = {"messages": [{"role": "user", "content": "go"}]}
        nested = _check_nested(_traced(lambda: agent.invoke(question, context=Deps("ada"))))
    assert answer_of(seen["answer"]) == expected("ada")
    # The MCP tools came in as LangChain tools that call through nous_sched: their own call spans nest too.
    (lookup,) = [s for s in nested if s.attributes["gen_ai.tool.name"] == "lookup"]
    assert lookup.attributes["nous_sched.mode"] == "parallel"


# -- failure is data, hostile values cross, approval refused ------------------------------------------

HOSTILE = "a\ud800b\x00c\u202ed\U000e0041e"


def test_pydantic_ai_code_mode_failures_and_hostile_values_reach_the_model_as_answers():
    from pydantic_ai import ModelRetry
    from pydantic_ai.toolsets import ApprovalRequiredToolset, FunctionToolset

    def odd(ctx: RunContext[None], kind: str) -> object:
        """Misbehaves as asked."""
        if kind == "raise":
            raise RuntimeError("broke " + HOSTILE)
        if kind == "retry":
            raise ModelRetry("try again " + HOSTILE)
        if kind == "nan":
            return float("nan")
        return HOSTILE * 2000

    def delete(path: str) -> str:
        """Deletes a file."""
        raise AssertionError("never approved")

    program = """
    const out = {};
    for (const kind of ["raise", "retry", "nan", "big"]) {
      try { const v = await tools.odd({ kind }); out[kind] = typeof v === "string" ? v.length : v; }
      catch (e) { out[kind] = e.message; }
    }
    try { await tools.delete({ path: "/" }); } catch (e) { out.delete = e.message; }
    return out;
    """
    answers = []
    scripts = [program, "while (true) {}"]

    def respond(messages, info):
        returns = [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
        answers[:] = [p.content for p in returns]
        if len(returns) < len(scripts):
            code = scripts[len(returns)]
            return ModelResponse(parts=[ToolCallPart("run_code", {"code": code, "description": "probe"})])
        return ModelResponse(parts=[TextPart("ok")])

    asked = []
    toolset = CodeModeToolset(
        FunctionToolset([odd]),
        ApprovalRequiredToolset(FunctionToolset([delete])),
        approval_handler=lambda request: asked.append(request.tool) and False,
        timeout=3,
    )
    agent = Agent(FunctionModel(respond), toolsets=[toolset])
    assert agent.run_sync("go").output == "ok"  # nothing raised into the agent run
    first, second = (json.loads(a) for a in answers)
    out = first["result"]
    # NUL, bidi and tag characters intact; the lone surrogate U+FFFD, as in every text the model is handed
    seen = HOSTILE.replace("\ud800", "\ufffd")
    assert out["raise"] == "broke " + seen
    assert out["retry"] == "try again " + seen
    assert out["nan"] == "tool returned a value that is not JSON: $: nan is not JSON (JSON has no NaN or Infinity)"
    assert out["big"] == 2000 * len(HOSTILE.encode("utf-16-le", "surrogatepass")) // 2  # JavaScript's length
    assert "rejected" in out["delete"] and asked == ["delete"]  # asked when the toolset said so, refused
    assert second["error"]["kind"] == "timeout"


def test_openai_agents_a_needs_approval_function_is_asked_per_call_and_direct_only_tools_stay_the_models():
    async def only_big(ctx, params, call_id):
        return params["amount"] > 100

    @agents.function_tool(needs_approval=only_big)
    def refund(ctx: agents.RunContextWrapper[Deps], amount: int) -> str:
        """Refund an amount."""
        return f"refunded {amount} to {ctx.context.user}"

    @agents.function_tool
    def direct_only(x: int) -> int:
        """Only the model may call this."""
        return x

    direct_only.allowed_callers = ["direct"]
    program = "return [await tools.refund({ amount: 5 }), await tools.refund({ amount: 500 })];"
    seen = {}

    class Model(ScriptedAgentsModel):
        async def get_response(self, system_instructions, input, model_settings, tools, *args, **kwargs):
            outputs = [i["output"] for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"]
            seen["offered"] = [t.name for t in tools]
            if outputs:
                seen["answer"] = outputs[-1]
                text = ResponseOutputText(type="output_text", text="done", annotations=[])
                message = ResponseOutputMessage(
                    type="message", id="m", role="assistant", status="completed", content=[text]
                )
                return AgentsResponse(output=[message], usage=Usage(), response_id=None)
            arguments = json.dumps({"code": program, "description": "refunds"})
            call = ResponseFunctionToolCall(type="function_call", call_id="c1", name="run_code", arguments=arguments)
            return AgentsResponse(output=[call], usage=Usage(), response_id=None)

    asked = Asked()
    agent = code_mode(agents.Agent(name="a", model=Model(seen), tools=[refund, direct_only]), approval_handler=asked)
    result = asyncio.run(agents.Runner.run(agent, "refund", context=Deps("ada")))
    assert result.final_output == "done"
    assert seen["offered"] == ["direct_only", "run_code"]
    assert answer_of(seen["answer"]) == ["refunded 5 to ada", "refunded 500 to ada"]
    assert [(r.tool, r.arguments) for r in asked.requests] == [("refund", {"amount": 500})]


def test_langchain_a_hitl_when_predicate_picks_the_calls_that_ask():
    @langchain_tool
    def refund(amount: int, runtime: ToolRuntime[Deps]) -> str:
        """Refund an amount."""
        return f"refunded {amount} to {runtime.context.user}"

    class Model(ScriptedChatModel):
        def _generate(self, messages, stop=None, run_manager=None, **kwargs):
            answers = [m for m in messages if isinstance(m, ToolMessage)]
            if answers:
                self.seen["answer"] = answers[-1].content
                return ChatResult(generations=[ChatGeneration(message=AIMessage(content="done"))])
            program = """
            const out = [];
            for (const amount of [5, 500, 50]) {
              try { out.push(await tools.refund({ amount })); } catch (e) { out.push(e.message); }
            }
            return out;"""
            args = {"code": program, "description": "refunds"}
            call = {"name": "run_code", "args": args, "id": "call_1", "type": "tool_call"}
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content="", tool_calls=[call]))])

    def big(request):
        return request.tool_call["args"]["amount"] > 100

    seen = {}
    asked = []
    hitl = {"refund": {"allowed_decisions": ["approve", "reject"], "when": big}}
    agent = create_agent(
        Model(seen=seen),
        [refund],
        context_schema=Deps,
        middleware=[CodeModeMiddleware(interrupt_on=hitl, approval_handler=lambda r: asked.append(r.arguments))],
    )
    state = agent.invoke({"messages": [{"role": "user", "content": "refund"}]}, context=Deps("ada"))
    assert state["messages"][-1].content == "done"
    assert answer_of(seen["answer"]) == [
        "refunded 5 to ada",
        'tool "refund" was rejected by the approval handler',
        "refunded 50 to ada",
    ]
    assert asked == [{"amount": 500}]

"""run_code handed out to real agent frameworks, and the asyncio door.

Each framework's own agent machinery runs the tool, driven by a scripted model
(the framework's own test/fake model seam): LangChain (a ``BaseChatModel``
subclass; tool calls executed by ``BaseTool.ainvoke``), the OpenAI Agents SDK
(a ``Model`` under ``Runner.run``) and pydantic-ai (``FunctionModel`` under
``Agent.run``). The model calls ``run_code`` correctly once, then without a
description: the second call is answered with the gate's message, which the
model reads as the tool's result, and the agent goes on.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from nous_sched import (
    ConfigError,
    SessionLog,
    Tool,
    WorkerPool,
    acall_tool,
    arun_code,
    function_tool,
    run_code_tool,
)
from nous_sched.integrations import to_langchain, to_openai_agents, to_pydantic_ai

GOOD = {"code": "return (await tools.add({a: 2, b: 3})) * 10", "description": "add and scale"}
NO_DESCRIPTION = {"code": "return 1"}
MISSING = "description"  # what the gate's answer names


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def rc(**options):
    return run_code_tool([add], **options)


def answered_ok(text):
    return json.loads(text) == {"logs": [], "result": 50}


def answered_missing_description(text):
    error = json.loads(text)["error"]
    return "invalid arguments" in error and MISSING in error


# -- LangChain -----------------------------------------------------------------------------------

from langchain_core.language_models.chat_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.tools import BaseTool  # noqa: E402


class ScriptedChatModel(BaseChatModel):
    """Answers with the next scripted tool call, then a final text; records the tools it was bound with."""

    script: list = []
    bound: list = []

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools, **kwargs):
        self.bound.extend(tools)
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        turn = sum(1 for m in messages if isinstance(m, AIMessage))
        if turn < len(self.script):
            call = {"name": "run_code", "args": self.script[turn], "id": f"call_{turn}", "type": "tool_call"}
            message = AIMessage(content="", tool_calls=[call])
        else:
            message = AIMessage(content="done")
        return ChatResult(generations=[ChatGeneration(message=message)])


async def langchain_agent(model, tools, question):
    """The tool-calling loop, with LangChain's own pieces: the model's tool calls run by the tool's ainvoke."""
    by_name = {t.name: t for t in tools}
    bound = model.bind_tools(tools)
    messages = [HumanMessage(question)]
    while True:
        reply = await bound.ainvoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            return messages
        for call in reply.tool_calls:
            messages.append(await by_name[call["name"]].ainvoke(call))


def test_langchain_agent_calls_run_code_and_reads_a_missing_description_as_an_error():
    log = SessionLog()
    tool = to_langchain(rc(), session_log=log)
    assert isinstance(tool, BaseTool) and tool.name == "run_code"
    assert '"add"(args: {' in tool.description  # the SDK of the tools it may call
    assert tool.tool_call_schema["required"] == ["code", "description"]
    model = ScriptedChatModel(script=[GOOD, NO_DESCRIPTION], bound=[])
    messages = asyncio.run(langchain_agent(model, [tool], "what is (2+3)*10?"))
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert len(results) == 2 and messages[-1].content == "done"
    assert answered_ok(results[0].content)
    assert answered_missing_description(results[1].content)
    # The sync form answers the same way.
    assert answered_ok(tool.invoke(GOOD))
    # Audited as direct calls: the good one ran its sub-call, the other was refused by the gate.
    types = [e.type for e in log.events]
    assert types.count("tool_refused") == 1 and types.count("tool_outcome") >= 2


# -- OpenAI Agents SDK ---------------------------------------------------------------------------

import agents  # noqa: E402
from agents.items import ModelResponse  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.usage import Usage  # noqa: E402
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText  # noqa: E402


class ScriptedAgentsModel(Model):
    """The Agents SDK's model seam: scripted raw tool-call JSON, then a final message."""

    def __init__(self, script):
        self.script = list(script)
        self.outputs = []  # the tool outputs the model was shown

    async def get_response(self, system_instructions, input, model_settings, tools, *args, **kwargs):
        if isinstance(input, list):
            self.outputs = [item["output"] for item in input if item.get("type") == "function_call_output"]
        assert [t.name for t in tools] == ["run_code"]
        if self.script:
            arguments = self.script.pop(0)
            n = len(self.outputs)
            call = ResponseFunctionToolCall(
                type="function_call", call_id=f"call_{n}", name="run_code", arguments=arguments, id=f"fc_{n}"
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = ResponseOutputText(type="output_text", text="done", annotations=[])
        message = ResponseOutputMessage(type="message", id="msg", role="assistant", status="completed", content=[text])
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError


def test_openai_agents_runner_calls_run_code_and_reads_mistakes_as_errors():
    tool = to_openai_agents(rc())
    assert isinstance(tool, agents.FunctionTool) and tool.params_json_schema["required"] == ["code", "description"]
    model = ScriptedAgentsModel([json.dumps(GOOD), json.dumps(NO_DESCRIPTION), '{"code": "return 1", '])
    agent = agents.Agent(name="coder", instructions="use run_code", model=model, tools=[tool])
    result = asyncio.run(agents.Runner.run(agent, "what is (2+3)*10?"))
    assert result.final_output == "done"
    first, second, third = model.outputs
    assert answered_ok(first)
    assert answered_missing_description(second)
    assert "not valid JSON" in json.loads(third)["error"] or "JSON" in json.loads(third)["error"]


# -- pydantic-ai ---------------------------------------------------------------------------------

import pydantic_ai  # noqa: E402
from pydantic_ai.messages import ModelResponse as PaiResponse  # noqa: E402
from pydantic_ai.messages import TextPart, ToolCallPart, ToolReturnPart  # noqa: E402
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402


def test_pydantic_ai_agent_calls_run_code_and_reads_a_missing_description_as_an_error():
    script = [GOOD, NO_DESCRIPTION]
    seen = []

    def model(messages, info: AgentInfo):
        assert [t.name for t in info.function_tools] == ["run_code"]
        returns = [p for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart)]
        seen[:] = [r.content for r in returns]
        if len(returns) < len(script):
            return PaiResponse(parts=[ToolCallPart("run_code", script[len(returns)], tool_call_id=f"c{len(returns)}")])
        return PaiResponse(parts=[TextPart("done")])

    agent = pydantic_ai.Agent(FunctionModel(model), tools=[to_pydantic_ai(rc())])
    result = asyncio.run(agent.run("what is (2+3)*10?"))
    assert result.output == "done"
    assert answered_ok(seen[0])
    assert answered_missing_description(seen[1])  # no TypeError: the function takes what the model sent


def test_handoffs_refuse_what_is_not_a_tool_and_unknown_options():
    for handoff in (to_langchain, to_openai_agents, to_pydantic_ai):
        with pytest.raises(ConfigError, match="a nous_sched.Tool"):
            handoff(add.function)
        with pytest.raises(ConfigError, match="`aproval_handler` is not an option of call_tool; did you mean"):
            handoff(rc(), aproval_handler=lambda r: True)


def test_any_tool_not_only_run_code_is_handed_over():
    tool = to_pydantic_ai(add)
    assert tool.name == "add"
    langchain = to_langchain(add)
    assert json.loads(asyncio.run(langchain.ainvoke({"a": 1, "b": 2}))) == 3


# -- the asyncio door ----------------------------------------------------------------------------

BUSY = "await tools.ping({}); console.log('spinning'); while (true) {}"


def pinged():
    """A tool that says the program reached it, and the event it sets."""
    reached = threading.Event()

    def ping(args):
        reached.set()
        return True

    return Tool("ping", ping, concurrency_safe=lambda args: True), reached


def test_arun_code_returns_what_run_code_returns():
    result = asyncio.run(arun_code("return await tools.add({a: 1, b: 2})", [add], description="add"))
    assert result.result == 3 and [e.type for e in result.events] == ["tool_call", "tool_outcome"]


async def cancel_when_busy(task, reached):
    """Cancel ``task`` once its program is past ``ping`` and spinning; seconds until the await ends."""
    assert await asyncio.to_thread(reached.wait, 30)
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return time.monotonic() - started


def test_cancelling_the_task_stops_a_busy_run_within_the_cancel_bound():
    pool = WorkerPool(size=1)
    ping, reached = pinged()
    try:
        cancel = threading.Event()

        async def main():
            run = arun_code(BUSY, [ping], description="spin", runtime=pool, timeout=60, cancel=cancel)
            return await cancel_when_busy(asyncio.create_task(run), reached)

        took = asyncio.run(main())
        assert cancel.is_set()
        assert took < 5.0, f"the run took {took:.2f}s to stop"  # the worker stops it in ~50 ms; generous
        # The pool's one worker is free again: the cancelled run is over, not still spinning.
        assert asyncio.run(arun_code("return 2", description="after", runtime=pool, timeout=10)).result == 2
    finally:
        pool.close()


def test_cancelling_acall_tool_cancels_the_run_code_it_started():
    pool = WorkerPool(size=1)
    ping, reached = pinged()
    try:

        async def main():
            tool = run_code_tool([ping], runtime=pool, timeout=60)
            task = asyncio.create_task(acall_tool(tool, {"code": BUSY, "description": "spin"}))
            return await cancel_when_busy(task, reached)

        assert asyncio.run(main()) < 5.0
        assert asyncio.run(arun_code("return 2", description="after", runtime=pool, timeout=10)).result == 2
    finally:
        pool.close()


def test_acall_tool_answers_mistakes_as_call_tool_does():
    text = asyncio.run(acall_tool(rc(), '{"code": '))
    assert "error" in json.loads(text)
    assert answered_ok(asyncio.run(acall_tool(rc(), GOOD)))


def test_tool_is_the_decorator():
    from nous_sched import tool

    @tool
    def shout(text: str) -> str:
        """Shout."""
        return text.upper()

    assert isinstance(shout, Tool) and shout.name == "shout"


def test_cancelling_the_task_stops_an_in_process_run_inside_its_loop():
    from nous_sched import QuickJSRuntime

    ping, reached = pinged()
    cancel = threading.Event()

    async def main():
        run = arun_code(BUSY, [ping], description="spin", runtime=QuickJSRuntime(), timeout=60, cancel=cancel)
        return await cancel_when_busy(asyncio.create_task(run), reached)

    assert asyncio.run(main()) < 5.0 and cancel.is_set()
    calls = [t for t in threading.enumerate() if t.name.startswith("nous-sched-async-call-")]
    for thread in calls:
        thread.join(10)  # the run is over: its thread only has to return
    assert not [t for t in calls if t.is_alive()]


def test_cancelling_the_task_stops_a_run_whose_cancel_only_says_is_set():
    # A caller's cancel need only be a Cancel (is_set()); the door adds its own event beside it.
    from nous_sched import QuickJSRuntime

    class Flag:
        def __init__(self):
            self.asked = 0

        def is_set(self):
            self.asked += 1
            return False

    ping, reached = pinged()
    flag = Flag()

    async def main():
        run = arun_code(BUSY, [ping], description="spin", runtime=QuickJSRuntime(), timeout=60, cancel=flag)
        return await cancel_when_busy(asyncio.create_task(run), reached)

    assert asyncio.run(main()) < 5.0
    assert flag.asked > 0, "the caller's cancel is still asked"

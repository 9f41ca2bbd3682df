"""A minimal agent loop around ``run_code``, with a scripted model (no network).

Run it from the repository root with::

    python examples/agent_loop.py

The loop is the shape of any real one: offer the model its tools in the
provider's format (:func:`nous_sched.openai_tool` / :func:`nous_sched.anthropic_tool`),
run each tool call it makes with :func:`nous_sched.call_tool`, append the tool
result to the conversation, and ask again until it answers in text.

In "code mode" the only tool offered is ``run_code`` (:func:`nous_sched.run_code_tool`):
its description carries the SDK of the example tools, and the model answers
with one program instead of a chain of calls. The audit records of the
program's sub-calls go to the ``SessionLog``, never to the conversation.

``ScriptedModel`` stands in for the provider: on the first turn it "writes" a
program (``examples/fanout.js``); once it sees the tool result, it answers.
Swap it for a real client call (``client.chat.completions.create(...,
tools=[openai_tool(t) for t in offered])``) and nothing else changes.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, Optional

from nous_sched import SessionLog, anthropic_tool, call_tool, openai_tool, run_code_tool

HERE = Path(__file__).resolve().parent


def _example_tools() -> Any:
    """``examples/tools.py``, loaded by path so this file runs from anywhere."""
    spec = importlib.util.spec_from_file_location("nous_sched_example_tools", HERE / "tools.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


class ScriptedModel:
    """A fake chat model in the OpenAI message shape: one ``run_code`` call, then an answer."""

    def __init__(self, program: str) -> None:
        self.program = program
        self.requests: list[dict] = []

    def complete(self, messages: list[dict], tools: list[dict]) -> dict:
        self.requests.append({"messages": list(messages), "tools": tools})
        results = [m for m in messages if m["role"] == "tool"]
        if not results:
            offered = [t["function"]["name"] for t in tools]
            assert "run_code" in offered, offered
            return {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "run_code",
                            "arguments": json.dumps(
                                {
                                    "code": self.program,
                                    "description": "Look up twelve cities and total their populations.",
                                }
                            ),
                        },
                    }
                ],
            }
        answer = json.loads(results[-1]["content"])
        if isinstance(answer.get("error"), str):  # call_tool's answer to a malformed call
            return {"role": "assistant", "content": f"The call was refused: {answer['error']}"}
        if "error" in answer:
            return {"role": "assistant", "content": f"The program failed ({answer['error']['kind']})."}
        result = answer["result"]
        return {
            "role": "assistant",
            "content": f"Those {result['cities']} cities have {result['total_population']:,} people; "
            f"the largest is {result['largest']}.",
        }


def run_agent(question: str, model: Optional[ScriptedModel] = None, *, max_turns: int = 4) -> dict:
    """Run the loop to a text answer; returns ``{"answer", "messages", "session_log"}``."""
    tools_module = _example_tools()
    run_code = run_code_tool(tools_module.make_tools(), max_parallel=8, timeout=10)
    offered = {run_code.name: run_code}
    openai_tools = [openai_tool(t) for t in offered.values()]
    # The same tool in Anthropic's format, for a Messages API loop:
    anthropic_tools = [anthropic_tool(t) for t in offered.values()]
    assert anthropic_tools[0]["input_schema"]["required"] == ["code", "description"]

    if model is None:
        model = ScriptedModel((HERE / "fanout.js").read_text(encoding="utf-8"))
    session_log = SessionLog()
    messages: list[dict] = [{"role": "user", "content": question}]
    for _ in range(max_turns):
        reply = model.complete(messages, openai_tools)
        messages.append(reply)
        calls = reply.get("tool_calls") or []
        if not calls:
            return {"answer": reply["content"], "messages": messages, "session_log": session_log}
        for call in calls:
            fn = call["function"]
            tool = offered.get(fn["name"])
            if tool is None:
                content = json.dumps({"error": f"unknown tool {fn['name']!r}"})
            else:
                # The program's sub-calls are appended to `session_log` as audit events.
                content = call_tool(tool, fn["arguments"], session_log)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
    raise RuntimeError(f"no answer after {max_turns} turns")


def main() -> int:
    outcome = run_agent("How many people live in the twelve biggest cities you know, and which is largest?")
    for message in outcome["messages"]:
        if message.get("tool_calls"):
            for call in message["tool_calls"]:
                print(f"assistant -> {call['function']['name']}(...)")
        elif message["role"] == "tool":
            print(f"tool      <- {message['content'][:100]}...")
        else:
            print(f"{message['role']:<9} : {message['content']}")
    audit = [e for e in outcome["session_log"].events if e.type == "tool_call"]
    direct = sum(1 for e in audit if e.data.get("source") == "direct")
    outcomes = sum(1 for e in outcome["session_log"].events if e.type == "tool_outcome")
    print(
        f"\naudit log: {direct} direct call(s) and {len(audit) - direct} sub-calls as tool_call events, "
        f"{outcomes} tool_outcome events (none of them in the conversation)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

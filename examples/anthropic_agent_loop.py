"""The agent loop of ``agent_loop.py`` in the Anthropic Messages API's shape, with a scripted model (no network).

Run it from the repository root with::

    python examples/anthropic_agent_loop.py

Claude's tool use differs from OpenAI's in shape only: tools are offered as
``{"name", "description", "input_schema"}`` (:func:`nous_sched.anthropic_tool`),
the model answers with ``tool_use`` content blocks whose ``input`` is already
a dict, and each result goes back in a *user* message as a ``tool_result``
block with the same id (``is_error`` set when the program failed). The tool
result text comes from :func:`nous_sched.call_tool`, as in the OpenAI loop,
and the program's sub-calls go to the ``SessionLog``, never to the
conversation.

``ScriptedClaude`` stands in for ``anthropic.Anthropic().messages.create``:
swap ``model.create(...)`` for ``client.messages.create(model=...,
max_tokens=..., system=..., messages=messages, tools=offered_tools)`` and use
the response's ``content`` blocks; nothing else changes.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, Optional

from nous_sched import SessionLog, anthropic_tool, call_tool, run_code_tool

HERE = Path(__file__).resolve().parent
SYSTEM = "Answer with one run_code program when the work loops, branches or fans out."


def _example_tools() -> Any:
    """``examples/tools.py``, loaded by path so this file runs from anywhere."""
    spec = importlib.util.spec_from_file_location("nous_sched_example_tools", HERE / "tools.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


class ScriptedClaude:
    """A fake Messages API model: one ``run_code`` tool use, then a text answer."""

    def __init__(self, program: str) -> None:
        self.program = program
        self.requests: list[dict[str, Any]] = []

    def create(self, *, system: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        self.requests.append(
            {
                "model": "claude-scripted",
                "max_tokens": 1024,
                "system": system,
                "messages": list(messages),
                "tools": tools,
            }
        )
        results = [
            block
            for message in messages
            if message["role"] == "user" and isinstance(message["content"], list)
            for block in message["content"]
            if block["type"] == "tool_result"
        ]
        if not results:
            assert "run_code" in [tool["name"] for tool in tools], tools
            return {
                "role": "assistant",
                "stop_reason": "tool_use",
                "content": [
                    {"type": "text", "text": "I'll look the cities up in one program."},
                    {
                        "type": "tool_use",
                        "id": "toolu_01",
                        "name": "run_code",
                        "input": {
                            "code": self.program,
                            "description": "Look up twelve cities and total their populations.",
                        },
                    },
                ],
            }
        answer = json.loads(results[-1]["content"])
        if isinstance(answer.get("error"), str):  # call_tool's answer to a malformed call
            text = f"The call was refused: {answer['error']}"
        elif "error" in answer:
            text = f"The program failed ({answer['error']['kind']})."
        else:
            result = answer["result"]
            text = (
                f"Those {result['cities']} cities have {result['total_population']:,} people; "
                f"the largest is {result['largest']}."
            )
        return {"role": "assistant", "stop_reason": "end_turn", "content": [{"type": "text", "text": text}]}


def run_agent(question: str, model: Optional[ScriptedClaude] = None, *, max_turns: int = 4) -> dict[str, Any]:
    """Run the loop to a text answer; returns ``{"answer", "messages", "session_log"}``."""
    run_code = run_code_tool(_example_tools().make_tools(), max_parallel=8, timeout=10)
    offered = {run_code.name: run_code}
    offered_tools = [anthropic_tool(tool) for tool in offered.values()]
    if model is None:
        model = ScriptedClaude((HERE / "fanout.js").read_text(encoding="utf-8"))
    session_log = SessionLog()
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    for _ in range(max_turns):
        reply = model.create(system=SYSTEM, messages=messages, tools=offered_tools)
        messages.append({"role": "assistant", "content": reply["content"]})
        uses = [block for block in reply["content"] if block["type"] == "tool_use"]
        if not uses:
            answer = "".join(block["text"] for block in reply["content"] if block["type"] == "text")
            return {"answer": answer, "messages": messages, "session_log": session_log}
        results = []
        for use in uses:
            tool = offered.get(use["name"])
            if tool is None:
                content, failed = f"unknown tool {use['name']!r}; the only tool is run_code", True
            else:
                # The program's sub-calls are appended to `session_log` as audit events.
                content = call_tool(tool, use["input"], session_log)
                failed = "error" in json.loads(content)
            results.append({"type": "tool_result", "tool_use_id": use["id"], "content": content, "is_error": failed})
        messages.append({"role": "user", "content": results})
    raise RuntimeError(f"no answer after {max_turns} turns")


def main() -> int:
    outcome = run_agent("How many people live in the twelve biggest cities you know, and which is largest?")
    for message in outcome["messages"]:
        blocks = (
            message["content"]
            if isinstance(message["content"], list)
            else [{"type": "text", "text": message["content"]}]
        )
        for block in blocks:
            if block["type"] == "tool_use":
                print(f"assistant -> {block['name']}(...)")
            elif block["type"] == "tool_result":
                print(f"user      <- tool_result {block['content'][:90]}...")
            else:
                print(f"{message['role']:<9} : {block['text']}")
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

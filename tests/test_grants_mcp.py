"""Grants through serve-mcp's elicitation (nous_sched/mcp/serve.py): the form's
``scope`` (once, next, matching) makes a Grant; the audit log writes the
granting answer and each call it covered."""

from __future__ import annotations

import pytest
from mcp import Client
from mcp_servers import lab, loop_threads, wait_until
from mcp_types import ElicitResult
from test_mcp_serve import AuditSink, call_run_code

from nous_sched import Grant
from nous_sched.mcp import CodeModeServer, ServerSpec, connect
from nous_sched.mcp.serve import _APPROVAL_SCHEMA, _accepted

PROGRAM = """
const out = [];
for (const [key, value] of [["a", 1], ["a", 2], ["a", 3], ["a", 4], ["b", 5]]) {
  try { out.push((await tools.put({ key, value })).value); } catch (e) { out.push("no"); }
}
return out;
"""


@pytest.fixture
def upstream():
    with connect(ServerSpec(lab.build(), trusted=True)) as conn:
        yield conn.tools()
    wait_until(lambda: not [t for t in loop_threads() if t.startswith("nous-sched-mcp-")], what="loop threads")


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_one_elicitation_answer_grants_the_matching_calls(upstream, mode):
    audit = []
    server = CodeModeServer(upstream, audit_log=AuditSink(audit), timeout=60)
    asked = []

    async def on_elicit(ctx, params):
        asked.append(params)
        if '"key": "a"' in params.message:
            return ElicitResult(action="accept", content={"approve": True, "scope": "matching", "keys": "key"})
        return ElicitResult(action="accept", content={"approve": False})

    _, result = call_run_code(lambda: Client(server.server, mode=mode, elicitation_callback=on_elicit), PROGRAM)
    server.close()
    assert result.structured_content["result"] == [1, 2, 3, 4, "no"]
    assert len(asked) == 2  # one for the four "a" writes, one for "b", outside the grant
    assert asked[0].requested_schema["properties"]["scope"]["enum"] == ["once", "next", "matching"]
    lines = [e for e in audit if e["event"] == "approval"]
    assert [(e["seq"], e["approved"], e["by"], e.get("grant")) for e in lines] == [
        (0, True, "client", "g0"),
        (1, True, "grant", "g0"),
        (2, True, "grant", "g0"),
        (3, True, "grant", "g0"),
        (4, False, "client", None),
    ]
    assert lines[0]["granted"] == {"calls": None, "matching": {"key": "a"}, "by": "client"}
    assert all("covered by grant g0" in e["reason"] for e in lines[1:4])


def test_the_form_answer_makes_a_grant_or_refuses():
    class Answer:
        def __init__(self, content, action="accept"):
            self.content, self.action = content, action

    args = {"key": "a", "value": 1}
    assert _accepted(Answer({"approve": True}), args) is True
    assert _accepted(Answer({"approve": True, "scope": "once"}), args) is True
    assert _accepted(Answer({"approve": True, "scope": "next", "calls": 3}), args) == Grant(calls=3, by="client")
    assert _accepted(Answer({"approve": True, "scope": "matching", "keys": " key "}), args) == Grant(
        matching={"key": "a"}, by="client"
    )
    for content in (
        {"approve": False, "scope": "next", "calls": 3},
        {"approve": True, "scope": "next", "calls": 0},
        {"approve": True, "scope": "next"},
        {"approve": True, "scope": "next", "calls": "3"},
        {"approve": True, "scope": "matching", "keys": "nope"},
        {"approve": True, "scope": "matching", "keys": ""},
        {"approve": True, "scope": "matching"},
        {"approve": True, "scope": "all"},
    ):
        assert _accepted(Answer(content), args) is False, content
    assert _accepted(Answer({"approve": True}, action="decline"), args) is False
    assert _APPROVAL_SCHEMA["required"] == ["approve"]

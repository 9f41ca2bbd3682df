"""One way to run an admitted call (nous_sched/gate/_admitted.py) and one approval rule
(nous_sched.gate.dispatch.needs_approval): a program's sub-call (run_code, through the
scheduler) and a model's direct call (call_tool) of the same tool, doing the same
thing, end the same way: what the caller reads, the call's ``tool_outcome`` audit
record and its ``approval`` records. The only difference is who hears of an
exception other than a ToolError: the program reads the failure, call_tool's host
gets the exception (after the same audit).
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Optional

import attrs
import pytest

from nous_sched import (
    Outcome,
    PermissionPolicy,
    QuickJSRuntime,
    SessionLog,
    Tool,
    ToolError,
    call_tool,
    run_code,
)
from nous_sched.gate.dispatch import needs_approval
from nous_sched.gate.policy import approval_names

PROGRAM = "try { return {ok: true, value: await tools.t({n: 1})} } catch (e) { return {ok: false, message: e.message} }"


class Boom(Exception):
    pass


def _raise(exc: BaseException) -> Callable[[Any], Any]:
    def function(args: Any) -> Any:
        raise exc

    return function


@attrs.frozen
class Case:
    function: Callable[[Any], Any]
    requires_approval: bool = False
    category: str = "read"
    policy: Optional[PermissionPolicy] = None
    handler: Optional[Callable[[Any], Any]] = None
    raises: Optional[type] = None  # call_tool raises it to its host; the program reads the failure

    def tool(self) -> Tool:
        return Tool("t", self.function, requires_approval=self.requires_approval, category=self.category)


CASES = {
    "returns a value": Case(lambda a: {"city": "Zürich", "n": [a["n"], 2.5, None]}),
    "returns an ok Outcome": Case(lambda a: Outcome(True, {"x": "y"}, None)),
    "returns a failed Outcome": Case(lambda a: Outcome.failure("t", "no rows")),
    "raises a ToolError": Case(_raise(ToolError("no such city: " + "x" * 5000))),
    "raises an empty ToolError": Case(_raise(ToolError(""))),
    "raises another exception": Case(_raise(Boom("host bug")), raises=Boom),
    "returns a value that is not JSON": Case(lambda a: {"n": math.nan}),
    "returns an object that is not JSON": Case(lambda a: object()),
    "needs approval, no handler": Case(lambda a: 1, requires_approval=True),
    "needs approval, rejected": Case(lambda a: 1, requires_approval=True, handler=lambda r: False),
    "needs approval, approved": Case(lambda a: 1, requires_approval=True, handler=lambda r: True),
    "needs approval, the handler raises": Case(lambda a: 1, requires_approval=True, handler=_raise(Boom("desk down"))),
    "the policy gates it by name": Case(lambda a: 1, policy=PermissionPolicy(require_approval="t")),
    "the policy gates it by category, approved": Case(
        lambda a: 1, category="execute", policy=PermissionPolicy(approval_categories="execute"), handler=lambda r: True
    ),
    "a category no policy gates": Case(lambda a: 1, category="read", policy=PermissionPolicy(approval_categories="x")),
}


def _record(record: Any) -> tuple[str, dict[str, Any]]:
    event = record.as_event()
    return event.type, dict(event.data)


def through_run_code(case: Case) -> tuple[dict[str, Any], list[Any]]:
    result = run_code(
        PROGRAM,
        [case.tool()],
        runtime=QuickJSRuntime(),
        policy=case.policy,
        approval_handler=case.handler,
        description="test",
    )
    assert result.error is None, result.error
    read = {"ok": True, "value": result.result["value"]} if result.result["ok"] else {"error": result.result["message"]}
    records = [_record(r) for r in result.events if r.type != "tool_call"]
    return read, records


def through_call_tool(case: Case) -> tuple[dict[str, Any], list[Any]]:
    session_log = SessionLog()
    if case.raises is not None:
        with pytest.raises(case.raises):
            call_tool(case.tool(), {"n": 1}, session_log, policy=case.policy, approval_handler=case.handler)
        read = None
    else:
        text = call_tool(case.tool(), {"n": 1}, session_log, policy=case.policy, approval_handler=case.handler)
        answer = json.loads(text)
        read = answer if isinstance(answer, dict) and set(answer) == {"error"} else {"ok": True, "value": answer}
    records = [(e.type, dict(e.data)) for e in session_log.events if e.type != "tool_call"]
    return read, records


@pytest.mark.parametrize("name", list(CASES))
def test_a_sub_call_and_a_direct_call_end_the_same_way(name):
    case = CASES[name]
    program_read, program_records = through_run_code(case)
    direct_read, direct_records = through_call_tool(case)
    assert direct_records == program_records
    assert direct_read == (None if case.raises is not None else program_read)
    assert program_records[-1][0] == "tool_outcome"


def test_the_cases_cover_each_way_a_call_ends():
    kinds = set()
    for case in CASES.values():
        _, records = through_call_tool(case)
        error = records[-1][1]["error"]
        kinds.add(None if error is None else error["kind"])
    assert kinds == {None, "tool_error", "invalid_result", "denied"}


def test_what_the_caller_reads_for_each_behaviour():
    read = {name: through_call_tool(case)[0] for name, case in CASES.items()}
    assert read["returns a value"] == {"ok": True, "value": {"city": "Zürich", "n": [1, 2.5, None]}}
    assert read["returns a failed Outcome"] == {"error": "no rows"}
    assert read["raises a ToolError"]["error"].startswith("no such city: xxx")
    assert len(read["raises a ToolError"]["error"]) < 5000  # clipped, as every message to a model
    assert read["raises an empty ToolError"] == {"error": "tool call failed"}
    assert read["returns a value that is not JSON"] == {
        "error": "tool returned a value that is not JSON: $.n: nan is not JSON (JSON has no NaN or Infinity)"
    }
    assert read["needs approval, no handler"] == {
        "error": 'tool "t" requires approval and no approval handler is configured'
    }
    assert read["needs approval, rejected"] == {"error": 'tool "t" was rejected by the approval handler'}
    assert read["needs approval, the handler raises"] == {"error": "desk down"}
    assert read["the policy gates it by name"]["error"].endswith("no approval handler is configured")
    assert read["the policy gates it by category, approved"] == {"ok": True, "value": 1}
    assert read["a category no policy gates"] == {"ok": True, "value": 1}


def test_a_direct_call_that_raises_is_audited_before_its_host_hears_of_it():
    session_log = SessionLog()
    with pytest.raises(Boom):
        call_tool(Tool("t", _raise(Boom("host bug"))), {}, session_log)
    assert [(e.type, e.data.get("error")) for e in session_log.events] == [
        ("tool_call", None),
        ("tool_outcome", {"kind": "tool_error", "message": "host bug"}),
    ]


def test_one_approval_rule_the_tools_own_flag_a_name_or_a_category():
    plain, flagged = Tool("p", lambda a: 1), Tool("f", lambda a: 1, requires_approval=True)
    shell = Tool("s", lambda a: 1, category="execute")
    assert not needs_approval(plain) and needs_approval(flagged)
    assert needs_approval(plain, {"p"}) and not needs_approval(plain, {"q"})
    assert needs_approval(shell, (), {"execute"}) and not needs_approval(shell, (), {"read"})
    policy = PermissionPolicy(require_approval="p", approval_categories="execute")
    for tool in (plain, flagged, shell, Tool("other", lambda a: 1)):
        assert policy.needs_approval(tool) == needs_approval(tool, {"p"}, {"execute"})
    # The policy is applied once, at the door: the run's names, asked later by the same rule.
    assert approval_names(policy, [plain, flagged, shell, Tool("other", lambda a: 1)]) == {"p", "f", "s"}
    assert approval_names(None, [flagged]) == frozenset()

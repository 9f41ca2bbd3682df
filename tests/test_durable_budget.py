"""A suspension within the budget (nous_sched/durable/, "Within the output budget").

What a model reads of a suspended run fits the run's ``output_budget`` like
any answer and always carries the suspension and its token: with four gated
calls of 200,000-character arguments (once an 800,692-character answer under
a budget of 2,000), after 300 log lines (once ``{"error": {"kind":
"cancelled"}}`` with no token), with hostile text, with 60 calls pending; in a
worker and in-process, parked, and suspended again on resume. The check and
the cases are tests/durable/suspended_budget.py, for the hostile-value matrix too.
"""

import os
import sys

import pytest

from nous_sched import QuickJSRuntime, SqliteApprovalStore, resume, run_code
from nous_sched.result.budget import MIN_OUTPUT_BUDGET

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durable")
sys.path.insert(0, HERE)

import durable_tools  # noqa: E402
from suspended_budget import CASES, check_suspended_answer, suspend_case  # noqa: E402


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("NOUS_DURABLE_COUNT", str(tmp_path / "ran.jsonl"))
    return SqliteApprovalStore(str(tmp_path / "approvals.db"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_suspended_answer_fits_a_2000_byte_budget_and_carries_its_token(store, case, runtime):
    result = suspend_case(case, store, 2000, timeout=120)
    answer = check_suspended_answer(result, 2000, pending=CASES[case][1])
    assert result.usage.answer_bytes > 2000  # the whole answer would not have fit
    assert durable_tools.ran(os.environ["NOUS_DURABLE_COUNT"]) == []
    if case == "four-huge-arguments":  # every pending call shown, its arguments cut with their size said
        assert [p["seq"] for p in answer["suspended"]["pending"]] == [0, 1, 2, 3]
        for shown in answer["suspended"]["pending"]:
            memo = shown["arguments"]["memo"]
            assert memo.startswith("x") and memo.endswith(f"… [{200_000 - memo.index('…'):,} more characters]")
    if case == "300-log-lines":  # the logs cut around the suspension, head and tail, the rest counted
        logs = answer["logs"]
        assert logs[0].startswith("line 0 ") and logs[-1].startswith("line 299 ")
        assert any(line.endswith("lines omitted]") for line in logs)


@pytest.mark.parametrize("budget", [MIN_OUTPUT_BUDGET, 300, 700, 20_000])
def test_every_budget_keeps_the_token(store, budget):
    for case in ("four-huge-arguments", "300-log-lines", "many-pending"):
        check_suspended_answer(suspend_case(case, store, budget, runtime=QuickJSRuntime()), budget)


def test_a_suspension_that_fits_is_not_cut(store):
    result = suspend_case("four-huge-arguments", store, None, runtime=QuickJSRuntime())
    assert result.budgeted is None and result.for_model() == result.to_dict()
    assert result.usage.model_bytes == result.usage.answer_bytes > 800_000


def test_a_parked_suspension_fits_the_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("NOUS_DURABLE_COUNT", str(tmp_path / "ran.jsonl"))
    parked = SqliteApprovalStore(str(tmp_path / "parked.db"), park=60)
    result = suspend_case("four-huge-arguments", parked, 2000, timeout=120, runtime=QuickJSRuntime())
    check_suspended_answer(result, 2000, pending=4)
    done = resume(result.suspended.token, dict.fromkeys(range(4), True), durable_tools.TOOLS, approval_store=parked)
    assert done.ok and len(done.result) == 4


def test_a_resume_that_suspends_again_fits_its_budget(store):
    program = (
        'for (let i = 0; i < 300; i++) console.log("before " + i);\n'
        'const first = await tools.pay({memo: "a".repeat(100000)});\n'
        'for (let i = 0; i < 300; i++) console.log("after " + i);\n'
        'return [first, await tools.pay({memo: "b".repeat(100000)})];'
    )
    suspended = run_code(
        program,
        durable_tools.TOOLS,
        approval_store=store,
        output_budget=1000,
        runtime=QuickJSRuntime(),
        description="t",
    )
    check_suspended_answer(suspended, 1000, pending=1)
    again = resume(
        suspended.suspended.token,
        {0: True},
        durable_tools.TOOLS,
        approval_store=store,
        output_budget=600,
        runtime=QuickJSRuntime(),
    )
    answer = check_suspended_answer(again, 600, pending=1)
    assert answer["suspended"]["pending"][0]["seq"] == 1

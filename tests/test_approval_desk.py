"""nous_sched.ApprovalDesk: an approval handler that waits for a person's answer from another thread."""

from __future__ import annotations

import threading

from nous_sched import ApprovalDesk, PermissionPolicy, Tool, start_run

WAIT = 60
NEEDS = PermissionPolicy(require_approval={"write"})
WRITE = Tool(name="write", function=lambda a: {"wrote": a["text"]}, description="w")
PROGRAM = 'try { return await tools.write({text: "hi"}); } catch (e) { return {refused: e.message}; }'


def _asked(run):
    for event in run.events():
        if event.kind == "approval" and event.data["state"] == "asked":
            return event


def test_an_answer_from_another_thread_decides_the_call_and_is_audited(runtime):
    desk = ApprovalDesk()
    run = start_run(PROGRAM, [WRITE], description="writes hi", policy=NEEDS, approval_handler=desk)
    asked = _asked(run)
    call_id = asked.data["call_id"]
    assert desk.wait_for(call_id, WAIT)
    assert list(desk.pending()) == [call_id] and desk.pending()[call_id].arguments == {"text": "hi"}
    assert threading.Thread(target=desk.answer, args=(call_id, True)).start() is None
    result = run.result(timeout=WAIT)
    assert result.result == {"wrote": "hi"}
    assert [(e.seq, e.approved) for e in result.events if e.type == "approval"] == [(0, True)]
    assert desk.pending() == {} and desk.answer(call_id, True) is False  # decided once


def test_a_denial_is_what_the_program_sees(runtime):
    desk = ApprovalDesk()
    run = start_run(PROGRAM, [WRITE], description="writes hi", policy=NEEDS, approval_handler=desk)
    call_id = _asked(run).data["call_id"]
    assert desk.wait_for(call_id, WAIT) and desk.answer(call_id, False)
    result = run.result(timeout=WAIT)
    assert result.result == {"refused": 'tool "write" was rejected by the approval handler'}


def test_an_unanswered_call_is_rejected_when_its_run_is_over(runtime):
    desk = ApprovalDesk()
    answers, returned = [], threading.Event()

    def handler(request):
        answers.append(desk(request))
        returned.set()
        return answers[-1]

    run = start_run(PROGRAM, [WRITE], description="writes hi", policy=NEEDS, approval_handler=handler, timeout=1.0)
    assert run.result(timeout=WAIT).error.kind == "timeout"
    assert returned.wait(WAIT) and answers == [False]
    assert desk.pending() == {}


def test_an_answer_for_no_waiting_call_is_refused():
    desk = ApprovalDesk()
    assert desk.answer("run_code-x:code:0", True) is False
    assert desk.wait_for("run_code-x:code:0", 0.01) is False

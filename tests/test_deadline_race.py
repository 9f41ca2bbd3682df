"""A wait that gives up at the run's deadline never hands the program an error (engine.drive's promise).

A throttle's wait and an approval desk's wait end at the run's deadline, the
instant the runtime's own deadline (counted from its start, a little later)
also ends the run; under load the refusal used to reach the program first,
which caught it and returned. Here the runtime's own deadline is made much
later than the run's, so the refusal always comes while the runtime still has
time: the interleaving that used to lose is the only one.
"""

from __future__ import annotations

import time
from typing import Any

import attrs
import pytest

from nous_sched import ApprovalDesk, Limits, PermissionPolicy, Throttle, Tool, run_code
from nous_sched.gate.dispatch import current_call
from nous_sched.runtime import CodeRuntime, Host, RuntimeOutcome

pytestmark = pytest.mark.usefixtures("runtime")

CAUGHT = 'try { return await tools.{tool}({}); } catch (e) { return "caught: " + e.message; }'


@attrs.frozen
class _LateClock(CodeRuntime):
    """``inner``, given ``LATER`` more seconds than the run has (a worker's deadline
    is later than the run's by the run frame's transit; this, by much more)."""

    inner: CodeRuntime
    language: str = "javascript"

    def run(self, program: str, host: Host, limits: Limits) -> RuntimeOutcome:
        return self.inner.run(program, host, attrs.evolve(limits, timeout=limits.timeout + LATER))


LATER = 1.0


def test_a_throttle_that_gives_up_at_the_deadline_ends_the_run_as_a_timeout(runtime: Any) -> None:
    geo = Throttle("geo-api", max_running=1)
    tool = Tool("geocode", lambda args: "x", throttles=[geo])
    with geo.hold():  # its one place is taken for the whole run
        result = run_code(
            CAUGHT.replace("{tool}", "geocode"), [tool], runtime=_LateClock(runtime), timeout=0.5, description="t"
        )
    assert result.error is not None, result.result  # old: "caught: ToolError: the run's deadline passed ..."
    assert result.error.kind == "timeout"
    assert "(waiting for a place in throttle 'geo-api' before tool 'geocode' (call 0))" in result.error.message
    assert [r.began for r in result.trail] == [None]  # it never ran


def test_an_approval_that_gives_up_at_the_deadline_ends_the_run_as_a_timeout(runtime: Any) -> None:
    desk = ApprovalDesk()  # nobody answers: it rejects as the run's deadline passes
    tool = Tool("write", lambda args: "wrote")
    result = run_code(
        CAUGHT.replace("{tool}", "write"),
        [tool],
        runtime=_LateClock(runtime),
        timeout=0.5,
        description="t",
        policy=PermissionPolicy(require_approval={"write"}),
        approval_handler=desk,
    )
    assert result.error is not None, result.result  # old: "caught: ... was rejected by the approval handler"
    assert result.error.kind == "timeout"
    assert [(e.seq, e.approved) for e in result.events if e.type == "approval"] == [(0, False)]
    assert desk.pending() == {}


def _bounded_by_the_deadline(args: Any) -> Any:
    """A tool that bounds its wait by its run's deadline (as the MCP tools do), then gives up."""
    info = current_call.get()
    deadline = info.run_ctx.deadline if info is not None and info.run_ctx is not None else None
    assert deadline is not None
    while time.monotonic() < deadline:
        time.sleep(max(0.0, deadline - time.monotonic()))
    raise TimeoutError("the server did not answer before the run's deadline")


def test_a_tool_that_gives_up_at_the_deadline_ends_the_run_as_a_timeout(runtime: Any) -> None:
    tool = Tool("fetch", _bounded_by_the_deadline)
    result = run_code(
        CAUGHT.replace("{tool}", "fetch"), [tool], runtime=_LateClock(runtime), timeout=0.5, description="t"
    )
    assert result.error is not None, result.result  # old: "caught: TimeoutError: the server did not answer ..."
    assert result.error.kind == "timeout"
    assert "(waiting for tool 'fetch' (call 0) to return)" in result.error.message


def test_a_program_that_returned_keeps_its_result_when_an_unawaited_call_gives_up(runtime: Any) -> None:
    # The run's deadline ends the run, not the program's own end: what it returned stands.
    geo = Throttle("geo-api", max_running=1)
    tool = Tool("geocode", lambda args: "x", throttles=[geo])
    with geo.hold():
        result = run_code(
            'tools.geocode({}).catch(() => null); return "done"',
            [tool],
            runtime=_LateClock(runtime),
            timeout=0.5,
            description="t",
        )
    assert result.error is None and result.result == "done"

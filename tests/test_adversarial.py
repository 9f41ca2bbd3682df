"""The adversarial corpus: hostile programs, each with its expected outcome.

Every ``tests/adversarial/*.js`` program runs through :func:`nous_sched.run_code`
with four tools: ``echo`` (returns its arguments), ``add`` (``x + y``), ``fail``
(raises ``ToolError(args.message)``) and ``secret``, which the policy denies and
whose Python function must never run. ``tests/adversarial/expectations.json``
holds one entry per program:

* ``result``: the exact JSON result of a successful run, or
* ``kind`` plus ``message`` (substrings) or ``exact`` (the whole message), or
* ``kind_in``: ``{kind: message substring}`` when the engine legitimately picks
  one of several outcomes (noted in ``note``), or
* ``any_outcome``: only "run_code returned a RunResult" (plus the invariants);
* ``one_of``: a list of such specs, when a race picks between outcomes;
* optionally ``logs`` (exact), ``logs_startswith``, ``log_count``, ``last_log``,
  ``log_bytes`` (UTF-8 bytes of the kept lines, marker excluded), ``max_refused``
  (the most refusals the gate may audit), ``events``
  (exact tool names, in order), ``min_events``, ``timeout`` (seconds; 1 for
  runaway loops, 10 otherwise) and ``note`` (why the outcome is what it is).

Every program also gets the invariants: ``run_code`` returns a ``RunResult``
whose model-facing dict is JSON with no Python traceback in it; audit events
have unique ids and seqs contiguous from 0 and name only granted tools; the
denied tool never ran; the log budget holds; the run ended within
``MAX_ELAPSED``; no ``nous-sched-*`` thread it started is alive after a brief
join; and the next run in this process (a one-call canary) is correct.

Limits are small to keep this fast: ``memory_bytes`` is 32 MiB for every run.
"""

from __future__ import annotations

import json
import pathlib
import threading
import time

import pytest

from nous_sched import ERROR_KINDS, Limits, PermissionPolicy, RunResult, Tool, ToolError, run_code
from nous_sched.scheduler._tool_threads import retire_shared

# Every test runs against both runtimes (conftest.py `runtime`).
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("runtime")]

CORPUS = pathlib.Path(__file__).parent / "adversarial"
EXPECTATIONS = json.loads((CORPUS / "expectations.json").read_text(encoding="utf-8"))
PROGRAMS = sorted(p.name for p in CORPUS.glob("*.js"))

MIB = 1024 * 1024
MEMORY = 32 * MIB
DEFAULT_TIMEOUT = 10.0
MAX_LOG_BYTES = Limits().max_log_bytes
TRUNCATION_MARK = f"[output truncated at {MAX_LOG_BYTES} bytes]"
# The QuickJS time limit is a slice of *process CPU time*, so on a loaded 2-core
# machine a 1 s runaway loop can take several wall seconds to be stopped. This
# bound only proves the run ends; it is not a latency target.
MAX_ELAPSED = 30.0
THREAD_JOIN = 10.0

SECRET_CALLS: list = []


def _fail(args: dict) -> None:
    raise ToolError(str(args.get("message", "nope")))


def _secret(args: dict) -> str:
    SECRET_CALLS.append(args)
    return "SECRET"


TOOLS = [
    Tool("echo", lambda args: args),
    Tool("add", lambda args: args["x"] + args["y"]),
    Tool("fail", _fail),
    Tool("secret", _secret),
]
GRANTED = {"echo", "add", "fail"}
POLICY = PermissionPolicy(deny={"secret"})


def _sched_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith(("nous-sched-driver-", "nous-sched-tool-"))}


def _assert_threads_released(before: set[threading.Thread]) -> None:
    retire_shared(0)  # the shared tool threads stay warm: retired, each exits (joined below) unless busy
    for t in _sched_threads() - before:
        t.join(THREAD_JOIN)
    alive = sorted(t.name for t in _sched_threads() - before)
    assert not alive, f"scheduler threads still alive after the run: {alive}"


def _assert_canary() -> None:
    before = _sched_threads()
    canary = run_code(
        "return await tools.add({x: 2, y: 3});", TOOLS, policy=POLICY, limits=Limits(timeout=10), description="test"
    )
    assert canary.error is None, canary.error
    assert canary.result == 5
    assert [e.tool for e in canary.calls] == ["add"]
    _assert_threads_released(before)


def _run(name: str, spec: dict) -> tuple[RunResult, float]:
    code = (CORPUS / name).read_text(encoding="utf-8")
    limits = Limits(timeout=float(spec.get("timeout", DEFAULT_TIMEOUT)), memory_bytes=MEMORY)
    started = time.perf_counter()
    result = run_code(code, TOOLS, policy=POLICY, limits=limits, call_id="adv", description="test")
    return result, time.perf_counter() - started


def _utf8(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _check_invariants(result: RunResult, elapsed: float) -> None:
    assert isinstance(result, RunResult)
    assert elapsed < MAX_ELAPSED, f"the run took {elapsed:.1f}s"
    if result.error is not None:
        assert result.error.kind in ERROR_KINDS
        assert isinstance(result.error.message, str) and result.error.message
        assert result.result is None
    # What the model reads is JSON, and no Python internals leak into it.
    shown = json.dumps(result.to_dict(), allow_nan=False)
    for leak in ("Traceback (most recent call last)", 'File "/', "nous_sched/", "<class '", " object at 0x"):
        assert leak not in shown, f"{leak!r} leaked into the model-facing result"
    # Logs: strings, within the byte budget (the marker is extra).
    assert all(isinstance(line, str) for line in result.logs)
    assert sum(_utf8(line) for line in result.logs if line != TRUNCATION_MARK) <= MAX_LOG_BYTES
    # Audit: one event per started call, unique ids, seqs contiguous from 0, granted tools only.
    events = result.calls
    assert [e.seq for e in events] == list(range(len(events)))
    assert len({e.id for e in events}) == len(events)
    assert all(e.id == f"adv:code:{e.seq}" for e in events)
    assert {e.tool for e in events} <= GRANTED
    assert len(result.trail) == len(events)
    assert not SECRET_CALLS, "the denied tool's function ran"


def _check_expected(spec: dict, result: RunResult) -> None:
    if "one_of" in spec:
        misses = []
        for option in spec["one_of"]:
            try:
                _check_expected(option, result)
                return
            except AssertionError as miss:
                misses.append(str(miss).split("\n")[0])
        raise AssertionError(f"no expected outcome matched {result!r}: {misses}")
    if "result" in spec:
        assert result.error is None, result.error
        assert result.result == spec["result"]
    elif "kind" in spec:
        assert result.error is not None, f"expected {spec['kind']}, got result {result.result!r}"
        assert result.error.kind == spec["kind"], result.error
        if "exact" in spec:
            assert result.error.message == spec["exact"]
        for part in spec.get("message", []):
            assert part in result.error.message, result.error
    elif "kind_in" in spec:
        assert result.error is not None, f"expected one of {sorted(spec['kind_in'])}, got {result.result!r}"
        assert result.error.kind in spec["kind_in"], result.error
        assert spec["kind_in"][result.error.kind] in result.error.message, result.error
    else:
        assert spec.get("any_outcome"), "expectation names no outcome"

    logs = list(result.logs)
    if "logs" in spec:
        assert logs == spec["logs"]
    if "logs_startswith" in spec:
        assert len(logs) == len(spec["logs_startswith"]), logs
        for line, prefix in zip(logs, spec["logs_startswith"]):
            assert line.startswith(prefix), (line, prefix)
    if "log_count" in spec:
        assert len(logs) == spec["log_count"]
    if "last_log" in spec:
        assert logs and logs[-1] == spec["last_log"], logs[-1:]
    if "log_bytes" in spec:
        assert sum(_utf8(line) for line in logs if line != TRUNCATION_MARK) == spec["log_bytes"]

    if "max_refused" in spec:
        assert len(result.refused) <= spec["max_refused"], len(result.refused)
    names = [e.tool for e in result.calls]
    if "events" in spec:
        assert names == spec["events"]
    if "min_events" in spec:
        assert len(names) >= spec["min_events"]


def test_every_program_has_an_expectation():
    assert len(PROGRAMS) >= 40
    assert sorted(k for k in EXPECTATIONS if not k.startswith("_")) == PROGRAMS


def _params():
    for name in PROGRAMS:
        yield pytest.param(name, id=name[:-3])


@pytest.fixture(autouse=True)
def _no_secret_calls():
    SECRET_CALLS.clear()
    yield
    SECRET_CALLS.clear()


@pytest.mark.parametrize("name", list(_params()))
def test_adversarial_program(name):
    spec = EXPECTATIONS[name]
    before = _sched_threads()
    result, elapsed = _run(name, spec)
    _check_expected(spec, result)
    _check_invariants(result, elapsed)
    _assert_threads_released(before)
    _assert_canary()

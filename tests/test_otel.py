"""nous_sched.otel: a span per run and per sub-call, checked with the SDK's in-memory exporter."""

from __future__ import annotations

import importlib
import re
import sys
import threading

import pytest

import nous_sched
from nous_sched import Scheduler, Tool
from nous_sched.scheduler import _driver_threads
from nous_sched.scheduler._tool_threads import retire_shared

WAIT = 10.0


@pytest.fixture
def otel():
    """``(module, tracer, exporter)``: nous_sched.otel and a tracer whose spans land in memory.

    The tracer comes from a private provider: the global one is never touched.
    """
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    module = importlib.import_module("nous_sched.otel")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield module, provider.get_tracer("test_otel"), exporter
    provider.shutdown()


def _safe(args):
    return True


def _echo(args):
    return args.get("v")


def _boom(args):
    raise nous_sched.ToolError("no such thing", "boom")


ECHO = Tool("echo", _echo, concurrency_safe=_safe)
WRITE = Tool("write", _echo)  # exclusive
BOOM = Tool("boom", _boom)

PROGRAM = """
const a = await Promise.all([1, 2, 3].map(v => tools.echo({v})));
const w = await tools.write({v: "w"});
let caught = null;
try { await tools.boom({}); } catch (e) { caught = e.message; }
console.log("done");
return {a, w, caught};
"""


def _by_name(spans):
    out = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


def test_a_run_and_its_calls_become_parented_spans(otel):
    module, tracer, exporter = otel
    seen = []
    result = module.traced_run_code(
        PROGRAM,
        [ECHO, WRITE, BOOM],
        tracer=tracer,
        call_id="t1",
        observer=lambda record, phase: seen.append((record.seq, phase)),
        timeout=WAIT,
        description="test",
    )
    assert result.ok, result.error
    assert result.result == {"a": [1, 2, 3], "w": "w", "caught": "no such thing"}

    spans = exporter.get_finished_spans()
    names = _by_name(spans)
    assert sorted(names) == [
        "execute_tool boom",
        "execute_tool echo",
        "execute_tool write",
        "nous_sched.run_code",
    ]
    (run,) = names["nous_sched.run_code"]
    calls = sorted((s for s in spans if s is not run), key=lambda s: s.attributes["nous_sched.seq"])

    # One span per started call, and the user's observer still saw every start and commit.
    assert len(calls) == len(result.trail) == 5
    assert sorted(p for _, p in seen) == ["commit"] * 5 + ["start"] * 5
    assert run.attributes["nous_sched.calls"] == 5

    # Parentage: every sub-call span is a child of the run span, in its trace.
    assert run.parent is None
    for span in calls:
        assert span.parent is not None and span.parent.span_id == run.context.span_id
        assert span.context.trace_id == run.context.trace_id

    # Attributes.
    assert dict(run.attributes) == {
        "nous_sched.call_id": "t1",
        "nous_sched.calls": 5,
        "nous_sched.logs": 1,
        "nous_sched.ok": True,
        # The run's usage ledger (result.usage), the same numbers.
        "nous_sched.usage.call_chars": tuple(c.chars for c in result.usage.calls),
        "nous_sched.usage.received_chars": result.usage.received_chars,
        "nous_sched.usage.answer_bytes": result.usage.answer_bytes,
        "nous_sched.usage.model_bytes": result.usage.model_bytes,
        "nous_sched.usage.cut_bytes": 0,
    }
    attributes = [dict(s.attributes) for s in calls]
    waited = [a.pop("nous_sched.waited") for a in attributes]
    # How long each waited for a tool thread after the scheduler started it, from its record.
    assert waited == [pytest.approx(r.began - r.started) for r in result.trail]
    assert attributes == [
        {
            # The OpenTelemetry GenAI conventions for a tool execution; the call id is the audit event's.
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": f"t1:code:{i}",
            "gen_ai.tool.type": "function",
            "nous_sched.seq": i,
            "nous_sched.tool": tool,
            "nous_sched.mode": mode,
            "nous_sched.outcome": outcome,
        }
        for i, (tool, mode, outcome) in enumerate(
            [
                ("echo", "parallel", "ok"),
                ("echo", "parallel", "ok"),
                ("echo", "parallel", "ok"),
                ("write", "exclusive", "ok"),
                ("boom", "exclusive", "error"),
            ]
        )
    ]
    from opentelemetry.trace import StatusCode

    assert [s.status.status_code for s in calls] == [StatusCode.UNSET] * 4 + [StatusCode.ERROR]
    assert run.status.status_code == StatusCode.UNSET

    # Timing: sub-calls sit inside the run, each ends at its commit, commits in seq order,
    # and the finished event is between start and end.
    for span, record in zip(calls, result.trail):
        assert run.start_time <= span.start_time <= span.end_time <= run.end_time
        (event,) = span.events
        assert event.name == "nous_sched.finished"
        assert span.start_time <= event.timestamp <= span.end_time
        assert abs((span.end_time - span.start_time) - (record.committed - record.started) * 1e9) < 1e3
    ends = [s.end_time for s in calls]
    assert ends == sorted(ends)
    # The exclusive write started only after the parallel echoes had all ended.
    assert calls[3].start_time >= max(s.end_time for s in calls[:3])


def test_a_failed_program_marks_the_run_span(otel):
    module, tracer, exporter = otel
    result = module.traced_run_code(
        "await tools.echo({v: 1}); throw new Error('no')", [ECHO], tracer=tracer, timeout=WAIT, description="test"
    )
    assert result.error.kind == "exception"
    names = _by_name(exporter.get_finished_spans())
    (run,) = names["nous_sched.run_code"]
    from opentelemetry.trace import StatusCode

    assert run.status.status_code == StatusCode.ERROR
    assert run.attributes["nous_sched.error.kind"] == "exception"
    assert run.attributes["error.type"] == "exception"
    assert run.attributes["nous_sched.ok"] is False
    assert run.attributes["nous_sched.calls"] == 1
    assert run.attributes["nous_sched.call_id"].startswith("run_code-")
    assert len(names["execute_tool echo"]) == 1


def test_no_calls_no_sub_call_spans(otel):
    module, tracer, exporter = otel
    result = module.traced_run_code("return 42", [], tracer=tracer, timeout=WAIT, description="test")
    assert result.result == 42
    (run,) = exporter.get_finished_spans()
    assert run.name == "nous_sched.run_code" and run.attributes["nous_sched.calls"] == 0


def test_spans_made_inside_a_tool_are_children_of_its_call_span(otel):
    module, tracer, exporter = otel

    def fetch(args):
        with tracer.start_as_current_span("inner.fetch"):
            return args["v"]

    tool = Tool("fetch", fetch, concurrency_safe=_safe)
    result = module.traced_run_code(
        "return await Promise.all([1, 2].map(v => tools.fetch({v})))",
        [tool],
        tracer=tracer,
        timeout=WAIT,
        description="test",
    )
    assert result.result == [1, 2]
    names = _by_name(exporter.get_finished_spans())
    calls = {s.context.span_id: s for s in names["execute_tool fetch"]}
    inner = names["inner.fetch"]
    assert len(inner) == 2 and len(calls) == 2
    assert {s.parent.span_id for s in inner} == set(calls)


def test_a_call_abandoned_by_the_deadline_still_ends_its_span(otel, make_event):
    module, tracer, exporter = otel
    gate = make_event()
    hung = Tool("hang", lambda args: gate.wait(WAIT))
    result = module.traced_run_code(
        "await tools.hang({}); return 1", [hung], tracer=tracer, timeout=0.5, description="test"
    )
    assert result.error.kind == "timeout"
    names = _by_name(exporter.get_finished_spans())
    (call,) = names["execute_tool hang"]
    (run,) = names["nous_sched.run_code"]
    from opentelemetry.trace import StatusCode

    assert call.attributes["nous_sched.outcome"] == "abandoned"
    assert call.status.status_code == StatusCode.ERROR
    assert call.parent.span_id == run.context.span_id
    assert run.attributes["nous_sched.error.kind"] == "timeout"


def test_a_run_that_never_starts_records_the_exception(otel):
    module, tracer, exporter = otel
    with pytest.raises(nous_sched.RunCodeError):
        module.traced_run_code(None, [], tracer=tracer, description="test")
    (run,) = exporter.get_finished_spans()
    from opentelemetry.trace import StatusCode

    assert run.status.status_code == StatusCode.ERROR
    assert [e.name for e in run.events] == ["exception"]
    assert run.attributes["nous_sched.calls"] == 0


def test_span_observer_on_a_plain_scheduler(otel):
    module, tracer, exporter = otel
    from opentelemetry import trace

    with tracer.start_as_current_span("parent") as parent:
        observer = module.SpanObserver(tracer, context=trace.set_span_in_context(parent))
        with Scheduler(observer=observer, timeout=WAIT) as s:
            outcomes = [s.wait(t) for t in [s.submit(ECHO, {"v": i}) for i in range(3)]]
            trail = s.trail()
        observer.close(trail)
    assert [o.value for o in outcomes] == [0, 1, 2]
    names = _by_name(exporter.get_finished_spans())
    (parent_span,) = names["parent"]
    assert [s.parent.span_id for s in names["execute_tool echo"]] == [parent_span.context.span_id] * 3
    assert observer.started == 3


def test_a_broken_tracer_costs_the_run_nothing(otel, caplog):
    module, _tracer, _exporter = otel

    class Broken:
        def start_span(self, *a, **k):
            raise RuntimeError("exporter down")

    observer = module.SpanObserver(Broken())
    with Scheduler(observer=observer, timeout=WAIT) as s:
        assert s.call(ECHO, {"v": 7}).value == 7
    assert any("could not record" in r.getMessage() for r in caplog.records)


def test_default_tracer_is_the_global_one_and_harmless(otel):
    module, _tracer, _exporter = otel
    result = module.traced_run_code("return await tools.echo({v: 'x'})", [ECHO], timeout=WAIT, description="test")
    assert result.result == "x"


def test_importing_without_opentelemetry_says_how_to_install(monkeypatch):
    monkeypatch.delitem(sys.modules, "nous_sched.otel", raising=False)
    monkeypatch.delattr(nous_sched, "otel", raising=False)
    for name in [n for n in sys.modules if n == "opentelemetry" or n.startswith("opentelemetry.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # what an absent package looks like to import
    from nous_sched._extras import install_command

    with pytest.raises(ImportError, match=re.escape(install_command("otel"))):
        importlib.import_module("nous_sched.otel")


def test_no_thread_is_left_behind(otel):
    module, tracer, _exporter = otel
    before = {t.name for t in threading.enumerate() if t.name.startswith("nous-sched")}
    module.traced_run_code("return await tools.echo({v: 1})", [ECHO], tracer=tracer, timeout=WAIT, description="test")
    for t in threading.enumerate():
        if t.name.startswith("nous-sched-spares-"):  # the worker pool's, ends once its spares are started
            t.join(WAIT)
    retire_shared()  # the idle, warm tool threads exit; a busy one from before this test is in `before`
    _driver_threads.retire_shared()  # so do the idle drivers; one still driving a scheduler would not
    after = {t.name for t in threading.enumerate() if t.name.startswith("nous-sched")}
    assert after <= before


def test_the_traced_dispatch_pickles_as_the_dispatch_it_wraps(otel):
    """So a serializing executor (Dask, a process pool) can still ship the calls."""
    import pickle

    module, tracer, _exporter = otel
    wrapped = module.SpanObserver(tracer).wrap_dispatch(nous_sched.direct_dispatch)
    assert wrapped(ECHO, {"v": 3}, None) == 3  # outside a call: plain dispatch
    assert pickle.loads(pickle.dumps(wrapped)) is nous_sched.direct_dispatch

"""The examples run and say what they claim; the documents render cleanly."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import sys
import types
from pathlib import Path

import pytest

from nous_sched import ToolError, run_code

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
README = ROOT / "README.rst"


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example_tools():
    return _load("nous_sched_test_example_tools", EXAMPLES / "tools.py")


def _peak(trail) -> int:
    """Most calls running at one instant."""
    return max(sum(1 for r in trail if r.started <= t.started < r.finished) for t in trail)


def _run(example_tools, name: str, **options):
    program = (EXAMPLES / name).read_text(encoding="utf-8")
    result = run_code(program, example_tools.make_tools(), timeout=20, description=name, **options)
    assert result.ok, result.error
    return result


# -- the JavaScript examples -------------------------------------------------------


def test_fanout(example_tools):
    result = _run(example_tools, "fanout.js")
    assert result.result == {
        "cities": 12,
        "total_population": 151216015,
        "largest": "Shanghai",
        "by_country": {
            "Japan": 16712412,
            "India": 29230314,
            "China": 46763990,
            "Brazil": 12325232,
            "Mexico": 9209944,
            "Egypt": 9539673,
            "Nigeria": 15388000,
            "France": 2102650,
            "Peru": 9943800,
        },
    }
    assert result.logs == ("looked up 12 cities in 9 countries", "largest: Shanghai, China (24870895)")
    assert [(r.seq, r.tool, r.mode, r.ok) for r in result.trail] == [
        (i, "lookup_city", "parallel", True) for i in range(12)
    ]
    assert [e.arguments["name"] for e in result.calls][:3] == ["Tokyo", "Delhi", "Shanghai"]
    # A real fan-out: lookups ran side by side (all twelve were submitted at
    # once; how many overlap depends on the machine's load, but not one at a time).
    assert _peak(result.trail) >= 2


def test_fanout_respects_max_parallel(example_tools):
    result = _run(example_tools, "fanout.js", max_parallel=3)
    assert result.result["cities"] == 12
    assert _peak(result.trail) <= 3


def test_notes_shows_the_barrier(example_tools):
    result = _run(example_tools, "notes.js")
    assert result.result == {
        "words": 42,
        "trip_lines": 2,
        "stops": ["Lisbon, Portugal", "Osaka, Japan", "Nairobi, Kenya"],
        "notes": ["spring trip"],
    }
    assert result.logs == ("travel.txt: 42 words; 2 lines mention a trip", "saved note 1: spring trip")
    trail = result.trail
    assert [(r.tool, r.mode) for r in trail] == [
        ("read_file", "parallel"),
        ("word_count", "parallel"),
        ("search_files", "parallel"),
        ("lookup_city", "parallel"),
        ("lookup_city", "parallel"),
        ("add_note", "exclusive"),
        ("lookup_city", "parallel"),
        ("list_notes", "parallel"),
    ]
    assert all(r.ok for r in trail)
    # The two lookups before the note overlapped; the note waited for both to
    # commit; the calls after it started only once it had committed.
    assert trail[4].started < trail[3].finished
    assert trail[5].started >= max(trail[3].committed, trail[4].committed)
    assert min(trail[6].started, trail[7].started) >= trail[5].committed
    # Commits are in submission order.
    commits = [r.committed for r in trail]
    assert commits == sorted(commits)


def test_errors_catches_and_continues(example_tools):
    result = _run(example_tools, "errors.js")
    assert result.result == {
        "found": ["Lisbon", "Nairobi"],
        "missing": ["Atlantis"],
        "reads": ["fulfilled", "rejected"],
    }
    assert result.logs == (
        "skipping Atlantis: lookup_city failed",
        "refused: '../../setup.cfg' is outside the data folder",
    )
    assert [r.ok for r in result.trail] == [True, False, True, True, False]


def test_notes_are_per_tool_set(example_tools):
    # make_tools() gives each run its own database: running twice saves note 1 twice.
    for _ in range(2):
        assert _run(example_tools, "notes.js").logs[-1] == "saved note 1: spring trip"


# -- the example tools themselves ----------------------------------------------------


def _tool(example_tools, name, **kwargs):
    return next(t for t in example_tools.make_tools(**kwargs) if t.name == name)


def test_example_tools_behave(example_tools, tmp_path):
    assert [t.name for t in example_tools.TOOLS] == [
        "search_files",
        "read_file",
        "word_count",
        "lookup_city",
        "list_notes",
        "add_note",
    ]
    for tool in example_tools.TOOLS:
        assert tool.description and tool.parameters["type"] == "object"
        assert (tool.concurrency_safe is None) == (tool.name == "add_note")

    lookup = _tool(example_tools, "lookup_city", latency=0)
    assert lookup.function({"name": "lisbon"}) == {
        "name": "Lisbon",
        "country": "Portugal",
        "population": 545796,
        "lat": 38.7223,
        "lon": -9.1393,
    }
    with pytest.raises(ToolError, match="no city named 'Atlantis'; known cities: Beijing, Berlin"):
        lookup.function({"name": "Atlantis"})
    with pytest.raises(ToolError, match="`name` must be a non-empty string"):
        lookup.function({})

    read = _tool(example_tools, "read_file")
    assert read.function({"path": "travel.txt"})["text"].startswith("Trip ideas for the spring.")
    for outside in ("../tools.py", "/etc/passwd", "data/../../setup.cfg"):
        with pytest.raises(ToolError, match="outside the data folder|no file"):
            read.function({"path": outside})

    search = _tool(example_tools, "search_files")
    hits = search.function({"query": "COMMIT"})
    assert {m["file"] for m in hits["matches"]} == {"scheduler.txt"}
    assert hits["matches"][0] == {
        "file": "scheduler.txt",
        "line": 2,
        "text": "Calls commit strictly in submission order, however the work raced.",
    }
    assert search.function({"query": "Lisbon", "glob": "*.csv"})["matches"][0]["line"] == 15
    assert search.function({"query": "e", "max_results": 2})["truncated"] is True
    assert search.function({"query": "root", "glob": "../../*"})["matches"] == []

    assert _tool(example_tools, "word_count").function({"text": "a b\nc"}) == {"words": 3, "lines": 2, "chars": 5}

    # Another data folder and a file database.
    (tmp_path / "cities.csv").write_text("name,country,population,lat,lon\nAtlantis,Sea,1,0,0\n")
    tools = {t.name: t for t in example_tools.make_tools(tmp_path, notes_db=str(tmp_path / "notes.db"), latency=0)}
    assert tools["lookup_city"].function({"name": "Atlantis"})["country"] == "Sea"
    assert tools["add_note"].function({"title": "x", "text": "y"}) == {"id": 1, "title": "x"}
    again = {t.name: t for t in example_tools.make_tools(tmp_path, notes_db=str(tmp_path / "notes.db"), latency=0)}
    assert again["list_notes"].function({}) == [{"id": 1, "title": "x", "text": "y"}]


# -- the agent loop -----------------------------------------------------------------


def test_agent_loop(capsys):
    agent = _load("nous_sched_test_agent_loop", EXAMPLES / "agent_loop.py")
    outcome = agent.run_agent("How many people?")
    assert outcome["answer"] == "Those 12 cities have 151,216,015 people; the largest is Shanghai."
    roles = [m["role"] for m in outcome["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    tool_message = json.loads(outcome["messages"][2]["content"])
    assert tool_message["result"]["cities"] == 12 and len(tool_message["logs"]) == 2
    # The direct call and its sub-calls are audit events in the session log, not messages.
    events = [e for e in outcome["session_log"].events if e.type == "tool_call"]
    assert [e.type for e in events] == ["tool_call"] * 13
    assert [e.type for e in outcome["session_log"].events].count("tool_outcome") == 13
    assert [e.data["source"] for e in events] == ["direct"] + ["code_mode"] * 12
    assert outcome["session_log"].messages() == []

    assert agent.main() == 0
    out = capsys.readouterr().out
    assert "assistant -> run_code(...)" in out
    assert "audit log: 1 direct call(s) and 12 sub-calls as tool_call events" in out


def test_agent_loop_offers_run_code_with_the_sdk():
    agent = _load("nous_sched_test_agent_loop2", EXAMPLES / "agent_loop.py")
    model = agent.ScriptedModel(
        "return { cities: 1, total_population: 2, largest: (await tools.lookup_city({name: 'Lima'})).name }"
    )
    assert agent.run_agent("q", model)["answer"] == "Those 1 cities have 2 people; the largest is Lima."
    failing = agent.ScriptedModel("throw new Error('bad program')")
    assert agent.run_agent("q", failing)["answer"] == "The program failed (exception)."
    # A malformed call (no program) is answered, not raised: the loop goes on.
    answer = agent.run_agent("q", agent.ScriptedModel(None))["answer"]
    # run_code's schema requires the program: the gate refuses the call before it runs.
    assert answer.startswith("The call was refused: invalid arguments: $.code: expected string")
    tools = model.requests[0]["tools"]
    assert [t["function"]["name"] for t in tools] == ["run_code"]
    description = tools[0]["function"]["description"]
    for name in ("lookup_city", "add_note", "search_files"):
        assert name in description


def test_anthropic_agent_loop(capsys):
    agent = _load("nous_sched_test_anthropic_loop", EXAMPLES / "anthropic_agent_loop.py")
    outcome = agent.run_agent("How many people?")
    assert outcome["answer"] == "Those 12 cities have 151,216,015 people; the largest is Shanghai."
    assert [m["role"] for m in outcome["messages"]] == ["user", "assistant", "user", "assistant"]
    (result,) = outcome["messages"][2]["content"]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_01" and result["is_error"] is False
    assert json.loads(result["content"])["result"]["cities"] == 12
    assert [e.type for e in outcome["session_log"].events if e.type != "tool_outcome"] == ["tool_call"] * 13
    assert agent.main() == 0
    out = capsys.readouterr().out
    assert "assistant -> run_code(...)" in out and "audit log: 1 direct call(s) and 12 sub-calls" in out


def test_anthropic_agent_loop_sends_requests_the_anthropic_sdk_accepts():
    from anthropic.types import message_create_params
    from pydantic import TypeAdapter

    agent = _load("nous_sched_test_anthropic_loop2", EXAMPLES / "anthropic_agent_loop.py")
    failing = agent.ScriptedClaude("throw new Error('bad program')")
    assert agent.run_agent("q", failing)["answer"] == "The program failed (exception)."
    request_type = TypeAdapter(message_create_params.MessageCreateParamsNonStreaming)
    for request in failing.requests:
        request_type.validate_python(request)
    assert failing.requests[1]["messages"][2]["content"][0]["is_error"] is True
    refused = agent.run_agent("q", agent.ScriptedClaude(None))["answer"]
    assert refused.startswith("The call was refused: invalid arguments: $.code: expected string")
    (offered,) = failing.requests[0]["tools"]
    assert offered["name"] == "run_code" and "lookup_city" in offered["description"]


# -- the documents (README.rst's and the manual's code blocks and commands: test_docs.py) ----------


# docs/django.rst includes files (Sphinx's literalinclude): Sphinx builds it (test_docs.py, and
# test_example_commands.py::test_the_guide_includes_the_projects_files_and_shows_no_code_of_its_own).
@pytest.mark.parametrize("name", ["README.rst", "ARCHITECTURE.rst", "CHANGELOG.rst"])
def test_docs_render_cleanly(name):
    docutils_core = pytest.importorskip("docutils.core")
    warnings = io.StringIO()
    docutils_core.publish_doctree(
        (ROOT / name).read_text(encoding="utf-8"),
        settings_overrides={"warning_stream": warnings, "report_level": 2, "halt_level": 5},
    )
    assert warnings.getvalue() == ""


def test_architecture_names_files_that_exist():
    text = (ROOT / "ARCHITECTURE.rst").read_text(encoding="utf-8")
    named = set(re.findall(r"``((?:[a-z_]+/)*[a-z_]+\.(?:py|js))``", text))
    assert {"scheduler/_shell.py", "scheduler/lane.py", "runtime/prelude.js", "_run/runner.py"} <= named
    package = ROOT / "nous_sched"
    missing = [f for f in named if not ((package / f).exists() or (ROOT / f).exists() or (ROOT / "tests" / f).exists())]
    assert not missing, f"ARCHITECTURE.rst names files that do not exist: {missing}"

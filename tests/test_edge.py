"""The host's side of the edge: nothing a program or a peer can size stalls the host.

Issue 18's host-side reproductions, each with its class: schema patterns on a
linear-time engine (a property test over random patterns, the issue's own
pattern through a program and through a real MCP server's ``inputSchema``),
``uniqueItems`` in linear time, over-long tool names and questions, refusals
after the deadline, a step's calls handed over only while the run has time,
``Limits.max_code_bytes``, lone surrogates as data everywhere (both runtimes),
and what log records and the CLI show. Programs that are attacks in themselves
are in ``tests/adversarial/`` (``name_20m_characters``, ``search_80000_words``,
``refusals_after_deadline``, ``lone_surrogates_everywhere``).

Time bounds here are generous ceilings for a loaded 2-core machine, far below
what the unbounded code took (seconds that grew 1.8x per character).
"""

from __future__ import annotations

import io
import json
import logging
import time
import unicodedata
from typing import Annotated

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import Field

from nous_sched import ConfigError, Limits, RunCodeError, SessionLog, Tool, run_code
from nous_sched._text import inert, json_inert, machine_json, machine_text, machine_value, one_line
from nous_sched.cli.render import inert as cli_inert
from nous_sched.cli.render import json_text
from nous_sched.gate import MAX_NAME_CHARS, Gate
from nous_sched.gate._linear import canonical, pattern_problem, search
from nous_sched.gate.approval_text import inert_line
from nous_sched.gate.dispatch import RUN_OVER
from nous_sched.gate.schema import argument_error
from nous_sched.mcp.serve import AuditLog
from nous_sched.sdk import MAX_QUERY_CHARS, MAX_QUERY_WORDS, ToolIndex
from nous_sched.sdk.discovery import Discovery, closest_names

# The issue's pattern: Python's backtracking `re` took seconds on 27 characters.
EVIL = r"^(\w+\s?)*$"
# Ceiling for one argument check of a bounded argument (the bug took seconds at 27
# characters, 1.8x more per character); a loaded 2-core machine needs the headroom.
CHECK_BOUND = 1.0


def echo(args):
    return args


def _tool(schema, name="t"):
    return Tool(name, echo, parameters=schema)


def _timed(fn, *args):
    started = time.perf_counter()
    value = fn(*args)
    return value, time.perf_counter() - started


# -- schema patterns ----------------------------------------------------------------

_atoms = st.sampled_from(["a", "\\w", "\\s?", ".", "[ab]", "\\d", "a|b", "(a|aa)", "\\w\\s?"])


def _group(inner):
    return st.tuples(inner, st.sampled_from(["*", "+", "?", "{1,3}", "*?", ""])).map(lambda t: f"({t[0]}){t[1]}")


_bodies = st.recursive(_atoms, lambda inner: st.lists(_group(inner), min_size=1, max_size=3).map("".join), max_leaves=8)
_patterns = st.tuples(st.booleans(), _bodies, st.booleans()).map(
    lambda t: ("^" if t[0] else "") + t[1] + ("$" if t[2] else "")
)
# Long runs that almost match, then a character that breaks the match: what makes backtracking explode.
_texts = st.tuples(
    st.sampled_from(["a", "ab", "a ", "1", "aa"]), st.integers(0, 2_000), st.sampled_from(["", "!", " !", "\u00e9"])
).map(lambda t: (t[0] * t[1])[:4_000] + t[2])


@settings(max_examples=150, deadline=None)
@given(pattern=_patterns, text=_texts, where=st.sampled_from(["pattern", "patternProperties", "propertyNames"]))
def test_no_argument_of_bounded_size_makes_a_pattern_check_slow(pattern, text, where):
    schema = {
        "pattern": {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}},
        "patternProperties": {
            "type": "object",
            "patternProperties": {pattern: {"type": "integer"}},
            "additionalProperties": False,
        },
        "propertyNames": {"type": "object", "propertyNames": {"pattern": pattern}},
    }[where]
    args = {"s": text} if where == "pattern" else {text: 1}
    tool = _tool(schema)
    argument_error(tool, {})  # the schema is compiled once per tool: not what is measured
    message, elapsed = _timed(argument_error, tool, args)
    assert elapsed < CHECK_BOUND, (pattern, len(text), elapsed)
    assert message is None or message.startswith("invalid arguments: ")


def test_the_issues_pattern_is_refused_at_once_in_a_program(runtime):
    tool = _tool({"type": "object", "properties": {"q": {"type": "string", "pattern": EVIL}}}, "report")
    program = """
    const out = [];
    for (const q of ["Quarterly report for board", "a".repeat(26) + "!", "a".repeat(100000) + "!"]) {
      try { await tools.report({q}); out.push("ok"); } catch (e) { out.push(e.message.slice(0, 41)); }
    }
    return out;
    """
    result = run_code(program, [tool], limits=Limits(timeout=10), description="test")
    assert result.error is None, result.error
    refused = "invalid arguments: $.q: expected a string"
    assert result.result == ["ok", refused, refused]
    assert result.elapsed < 5


def _report(title: Annotated[str, Field(pattern=EVIL)]) -> str:
    """File a report."""
    return "filed " + title


def test_a_real_mcp_servers_input_schema_pattern_is_checked_in_linear_time():
    from mcp.server.mcpserver import MCPServer

    from nous_sched.mcp import connect

    server = MCPServer("patterns", log_level="WARNING")
    server.tool(name="report")(_report)
    with connect(server) as conn:
        (tool,) = conn.tools()
        assert tool.parameters["properties"]["title"]["pattern"] == EVIL
        # An honest program, an untrusted server's schema: the check is the host's, and bounded.
        argument_error(tool, {})  # compiled once per tool: not what is measured
        message, elapsed = _timed(argument_error, tool, {"title": "Quarterly_report_for_board!"})
    assert message is not None and message.startswith("invalid arguments: $.title: expected a string matching")
    assert elapsed < CHECK_BOUND


@pytest.mark.parametrize("pattern", ["(?=a)b", "(a)\\1", "(?<!x)y", "a{1001}"])
def test_a_pattern_the_linear_engine_cannot_run_makes_the_schema_broken(pattern, caplog):
    tool = _tool({"type": "object", "properties": {"q": {"type": "string", "pattern": pattern}}})
    with caplog.at_level(logging.WARNING, logger="nous_sched"):
        first = argument_error(tool, {"q": "b"})
        second = argument_error(tool, {})  # every call, even one the pattern would never see
    assert first == second
    assert first.startswith("the tool's parameters schema cannot be checked, so the call was refused (pattern ")
    assert "cannot run in linear time" in first
    assert any("cannot check safely" in r.getMessage() for r in caplog.records)


def test_patterns_in_data_keywords_are_not_patterns():
    schema = {
        "enum": [{"pattern": "(?=x)"}],
        "properties": {"pattern": {"type": "string"}},
        "default": {"pattern": "("},
    }
    assert pattern_problem(schema) is None
    assert pattern_problem({"$defs": {"x": {"patternProperties": {"(?=a)": {}}}}}) is not None


def test_search_reads_a_lone_surrogate_as_the_replacement_character():
    assert search("^x.y$", "x\ud800y")
    assert search("\ufffd", "\udc00")
    assert not search("^\\d+$", "1\ud8002")


def test_additional_and_unevaluated_properties_consult_patterns_linearly():
    key = "a" * 5_000 + "!"
    for schema in (
        {"type": "object", "patternProperties": {EVIL: {}}, "additionalProperties": False},
        {"type": "object", "patternProperties": {EVIL: {}}, "unevaluatedProperties": False},
        {"type": "object", "allOf": [{"patternProperties": {EVIL: {}}}], "unevaluatedProperties": False},
    ):
        tool = _tool(schema)
        argument_error(tool, {})
        message, elapsed = _timed(argument_error, tool, {key: 1, "ok": 2})
        assert elapsed < CHECK_BOUND
        assert message is not None and "unexpected propert" in message
        assert argument_error(_tool(schema), {"ok": 1}) is None


# -- uniqueItems and the other list-bound keywords ------------------------------------


def test_unique_items_of_3000_distinct_objects_is_linear():
    tool = _tool({"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}})
    argument_error(tool, {})
    message, elapsed = _timed(argument_error, tool, {"xs": [{"i": i, "s": "x" * 10} for i in range(3_000)]})
    assert message is None
    assert elapsed < CHECK_BOUND
    message = argument_error(tool, {"xs": [{"i": i} for i in range(3_000)] + [{"i": 7}]})
    assert message == "invalid arguments: $.xs: expected unique items"


@pytest.mark.parametrize(
    "items, unique",
    [
        ([1, 1.0], False),
        ([1, True], True),
        ([0, False], True),
        ([{"a": 1, "b": 2}, {"b": 2, "a": 1}], False),
        ([[1, 2], [2, 1]], True),
        (["1", 1], True),
        ([None, "null"], True),
        ([{"a": [1.0]}, {"a": [1]}], False),
    ],
)
def test_unique_items_follows_json_schema_equality(items, unique):
    tool = _tool({"type": "array", "uniqueItems": True})
    assert (argument_error(tool, items) is None) == unique
    assert (canonical(items[0]) != canonical(items[1])) == unique


def test_unevaluated_items_of_many_items_is_linear():
    tool = _tool({"type": "array", "prefixItems": [{"type": "integer"}], "unevaluatedItems": False})
    argument_error(tool, [])
    message, elapsed = _timed(argument_error, tool, [1] + list(range(30_000)))
    assert message is not None
    assert elapsed < CHECK_BOUND * 4


# -- names and questions -----------------------------------------------------------


def test_a_long_name_is_refused_before_any_lookup():
    asked = []
    gate = Gate({"t": _tool({})}, {}, Limits(), unknown=lambda name: asked.append(name) or "unknown")
    outcome = gate.admit_json("a" * 20_000_000, "{}")
    assert not outcome.ok
    assert (
        outcome.error.message
        == f"a tool name may be at most {MAX_NAME_CHARS} characters; this one is longer, so no tool has it"
    )
    assert outcome.error.tool == "a" * 200 + "…"
    assert asked == []  # no "did you mean" search ran on it
    assert gate.calls == 1 and len(gate.refused) == 1
    # At the limit, the name is looked up as usual.
    assert gate.admit_json("b" * MAX_NAME_CHARS, "{}").error.message == "unknown"
    assert asked == ["b" * MAX_NAME_CHARS]


def test_discovery_never_searches_a_long_name():
    assert closest_names("get_weather" * 1_000, ["get_weather"]) == []
    discovery = Discovery({"t": _tool({})}, ["t"])
    outcome, elapsed = _timed(discovery.answer, ["describe", ["x" * 1_000_000]])
    assert not outcome.ok and "at most 256 characters" in outcome.error.message
    assert elapsed < CHECK_BOUND


def test_a_search_question_is_bounded_in_words_and_characters():
    index = ToolIndex([Tool("get_weather", echo, "Weather for a city")])
    assert index.search(" ".join(["weather"] * MAX_QUERY_WORDS))[0]["name"] == "get_weather"
    for query in (" ".join(f"w{i}" for i in range(MAX_QUERY_WORDS + 1)), "x" * (MAX_QUERY_CHARS + 1)):
        with pytest.raises(ConfigError, match="at most 32 words and 1000 characters"):
            index.search(query)
    big = " ".join(f"w{i}" for i in range(80_000))
    outcome, elapsed = _timed(
        Discovery({"get_weather": index._tools["get_weather"]}, ["get_weather"]).answer, ["search", [big]]
    )
    assert not outcome.ok and "at most 32 words" in outcome.error.message
    assert elapsed < CHECK_BOUND


# -- the budget and the deadline -------------------------------------------------------


def test_refusals_after_the_deadline_count_so_the_audit_is_bounded():
    audit = SessionLog()
    limits = Limits(max_calls=100)
    gate = Gate({"t": _tool({})}, {}, limits, deadline=time.monotonic() - 1, audit=audit.append)
    for i in range(30_000):
        assert not gate.admit_json("t", "{}").ok
    for i in range(100):
        assert not gate.admit_question('["search", ["x"]]').ok
    assert gate.calls == 30_100
    assert len(gate.refused) == len(audit) == limits.max_calls + 1
    assert gate.refused[0].message == "code run is over; the call was not started"


def test_a_steps_calls_are_handed_over_only_while_the_run_has_time(runtime):
    # Each call's check costs the host tens of milliseconds (3,000 items, each
    # checked, and unique); 200 in one step would take seconds. Past the
    # deadline the host stops handing them to the gate: the gate never sees
    # them, so it refuses (almost) none as "run over" (the gate's deadline is
    # a hair before the runtime's, so a handful may fall in between).
    tool = _tool(
        {
            "type": "object",
            "properties": {"xs": {"type": "array", "uniqueItems": True, "items": {"type": "integer", "minimum": 0}}},
        },
        "slow",
    )
    program = """
    const xs = Array.from({length: 3000}, (_, i) => i);
    const calls = [];
    for (let i = 0; i < 200; i++) calls.push(tools.slow({xs}));
    await Promise.all(calls);
    return "all";
    """
    started = time.perf_counter()
    result = run_code(program, [tool], limits=Limits(timeout=1, max_total_args_bytes=10**9), description="test")
    elapsed = time.perf_counter() - started
    assert result.error is not None and result.error.kind == "timeout", result.error
    assert elapsed < 8, elapsed
    run_over = [r for r in result.refused if r.message == RUN_OVER]
    assert len(result.events) + len(run_over) < 100, (len(result.events), len(run_over))


# -- the program's size ----------------------------------------------------------------


def test_a_program_over_max_code_bytes_is_refused_before_anything_runs_or_is_audited(runtime):
    audit = SessionLog()
    limits = Limits(max_code_bytes=1_000)
    with pytest.raises(
        RunCodeError,
        match=r"the program is 1001 bytes of UTF-8, over the limit of 1000 bytes \(Limits.max_code_bytes\)",
    ):
        run_code("return 1;" + " " * 990 + "é", [], limits=limits, session_log=audit, description="test")
    with pytest.raises(RunCodeError, match="the program is 20000000 characters"):
        run_code("x" * 20_000_000, [], session_log=audit, description="test")
    assert len(audit) == 0
    assert run_code("return 1;" + " " * 991, [], limits=limits, description="test").result == 1
    assert Limits().max_code_bytes == 1024 * 1024
    with pytest.raises(ConfigError, match="max_code_bytes"):
        Limits(max_code_bytes=0)


# -- lone surrogates, both runtimes -------------------------------------------------------


def test_a_lone_surrogate_in_the_program_text_is_data_not_a_dead_worker(runtime):
    tool = _tool({"type": "object"}, "echo")
    # In a string literal it is the code unit it spells, as in any JavaScript engine.
    result = run_code(
        'const s = "a\ud800b"; console.log(s); return [s.length, s.charCodeAt(1), await tools.echo({s})];',
        [tool],
        description="test",
    )
    assert result.error is None, result.error
    assert result.result == [3, 0xD800, {"s": "a\ud800b"}]
    assert result.logs == ("a\ud800b",)
    assert json.loads(json.dumps(result.events[0].arguments)) == {"s": "a\ud800b"}
    # Outside one it is no JavaScript: an exception, like any syntax error.
    broken = run_code("return 1 \udc00;", [tool], description="test")
    assert broken.error.kind == "exception" and "SyntaxError" in broken.error.message
    # And the next run is unharmed.
    assert run_code("return 2;", [tool], description="test").result == 2


def test_a_nul_in_the_program_text_is_an_ordinary_character(runtime):
    tool = _tool({"type": "object"}, "echo")
    # In a string, template and regular expression literal, and after a backslash (an escaped NUL).
    result = run_code(
        'const s = "a\x00b"; console.log(s);\n'
        'return [s.length, s.charCodeAt(1), `t\x00`.length, /\x00/.test(s), "\\\x00".charCodeAt(0),'
        ' "\\\ud800".charCodeAt(0), await tools.echo({s})]; // a comment \x00 too',
        [tool],
        description="test",
    )
    assert result.error is None, result.error
    assert result.result == [3, 0, 2, True, 0, 0xD800, {"s": "a\x00b"}]
    assert result.logs == ("a\x00b",)
    # Outside a literal it is no JavaScript: an exception, like any syntax error.
    broken = run_code("return 1 \x00;", [tool], description="test")
    assert broken.error.kind == "exception" and "SyntaxError" in broken.error.message
    assert run_code("return 2;", [tool], description="test").result == 2


def test_a_lone_surrogate_in_the_description_is_logged_escaped(runtime, caplog):
    with caplog.at_level(logging.INFO, logger="nous_sched"):
        result = run_code("return 1;", [], description="sum \ud800\nrun_code forged: approved\u202e")
    assert result.result == 1
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("run_code ")]
    assert line.endswith(": sum \\ud800\\nrun_code forged: approved\\u202e")
    assert "\n" not in line


def test_the_audit_log_replaces_a_lone_surrogate_and_loses_no_line(tmp_path):
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path)
    audit.write("tool_call", args={"path": "/tmp/\ud800", "\udc00": "é"})
    audit.write("after", n=1)
    audit.close()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    first = orjson.loads(lines[0])  # strict: a lone surrogate, even escaped, would be refused
    assert first["args"] == {"path": "/tmp/\ufffd", "\ufffd": "é"}
    assert "é" in lines[0]  # still readable UTF-8, not all escapes


# -- what people read --------------------------------------------------------------------


def test_the_cli_escapes_every_format_character_the_tag_block_and_u061c():
    formats = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf"]
    assert "\u061c" in formats
    tags = [chr(c) for c in range(0xE0000, 0xE0080)]
    for char in formats + tags + ["\u061c", "\x1b", "\x85", "\u2028", "\ud800"]:
        shown = cli_inert("a" + char + "b")
        assert char not in shown and shown.startswith("a\\") and shown.endswith("b"), repr(char)
    assert cli_inert("tab\tand\nnewline") == "tab\tand\nnewline"
    assert cli_inert("\U000e0041") == "\\U000e0041"


def test_json_output_escapes_the_same_characters_and_stays_the_same_json():
    value = {"k\u202e": ["\U000e0041\u061c\x7f\x9f", "\ud800", "é\u2029"]}
    text = json_text(value, indent=2)
    # The same JSON, but a lone surrogate, which no strict decoder takes, is U+FFFD.
    assert orjson.loads(text) == {"k\u202e": ["\U000e0041\u061c\x7f\x9f", "\ufffd", "é\u2029"]}
    for char in ("\u202e", "\U000e0041", "\u061c", "\x7f", "\x9f", "\ud800", "\u2029"):
        assert char not in text and char not in json_text(value)
    assert "é" in text
    assert json.loads(json_inert(json.dumps("\U000e0020", ensure_ascii=False))) == "\U000e0020"


def test_the_approval_questions_escaper_is_the_one_line_rule_and_writes_what_it_wrote_before():
    # approval_text.inert_line had its own escaper, by Unicode category; it is now _text.one_line.
    def by_category(char: str) -> str:  # the old rule, kept here to compare against
        if unicodedata.category(char) not in ("Cc", "Cf", "Zl", "Zp", "Cs"):
            return char
        code = ord(char)
        named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char)
        if named is not None:
            return named
        return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"

    changed = []
    for start in range(0, 0x110000, 0x1000):
        chars = [chr(c) for c in range(start, start + 0x1000)]
        if inert_line("".join(chars)) == one_line("".join(chars)) == "".join(map(by_category, chars)):
            continue
        changed += [c for c in chars if not inert_line("x" + c) == one_line("x" + c) == "x" + by_category(c)]
    # The one difference: code points this Python's Unicode leaves unassigned that the rule's
    # fixed list escapes (the whole tag block; format characters of a later Unicode), which the
    # old rule, asking this Python, let through. Nothing it escaped is let through now.
    assert all(by_category(c) == c and unicodedata.category(c) == "Cn" for c in changed)
    assert all(inert_line(c) == one_line(c) == f"\\U{ord(c):08x}" for c in changed)
    assert {"\U000e0000", "\U000e0002", "\U000e001f"} <= set(changed)


def test_one_line_escapes_newlines_and_tabs_too():
    assert one_line("a\nb\tc\r\u2028\u200b") == "a\\nb\\tc\\r\\u2028\\u200b"
    assert inert("a\nb") == "a\nb"
    assert machine_text('"\ud800é"') == '"\ufffdé"'


def test_machine_json_is_strict_json_and_inert():
    value = {"k\ud800": ["\udc00x", float("nan"), float("inf"), -float("inf"), "\u202e\U000e0041\x1b", 1.5]}
    text = machine_json(value)
    assert orjson.loads(text) == {"k\ufffd": ["\ufffdx", None, None, None, "\u202e\U000e0041\x1b", 1.5]}
    assert text.isascii() or all(c not in text for c in "\u202e\U000e0041\x1b")
    assert machine_json({"a": 1}, indent=2) == '{\n  "a": 1\n}'
    assert machine_json(object(), default=lambda o: "obj") == '"obj"'


def test_machine_value_replaces_lone_surrogates_and_keeps_a_clean_value_itself():
    clean = {"a": ["é", "\u202e", 1]}
    assert machine_value(clean) is clean
    assert machine_value({"\ud800": ["x\udfff"]}) == {"\ufffd": ["x\ufffd"]}
    assert machine_text("ok") == "ok" and machine_text("a\ud800") == "a\ufffd"


def test_every_record_of_the_library_logger_is_made_one_inert_line():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("nous_sched")
    logger.addHandler(handler)
    try:
        try:
            raise ValueError("bad \x1b[2J\u202e\ud800")
        except ValueError:
            logger.error("tool %s failed\nforged line", "x\u2066\ud800", exc_info=True)
    finally:
        logger.removeHandler(handler)
    written = stream.getvalue()
    written.encode("utf-8")
    assert "tool x\\u2066\\ud800 failed\\nforged line" in written
    assert "ValueError: bad \\x1b[2J\\u202e\\ud800" in written
    assert not [c for c in written if c not in "\n" and unicodedata.category(c) in ("Cc", "Cf", "Cs")]


def test_a_tool_name_in_a_log_record_is_escaped(caplog):
    tool = Tool("bad\nname", echo, parameters={"type": "object", "properties": {"q": {"pattern": "(?=x)"}}})
    with caplog.at_level(logging.WARNING, logger="nous_sched"):
        argument_error(tool, {})
    assert caplog.records and all("\n" not in r.getMessage() for r in caplog.records)


def test_a_log_handler_writing_the_record_never_fails(runtime):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("nous_sched")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        run_code("return 1;", [], description="x\ud800\x1b[2J")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    written = stream.getvalue()
    written.encode("utf-8")  # encodable: the lone surrogate is an escape
    assert "\\ud800\\x1b[2J" in written and "\x1b" not in written


def test_a_program_that_changed_object_prototype_still_calls_its_tools(runtime):
    # A tool call's promise gets its own descriptors (the iterator guards):
    # what a program puts on Object.prototype (an accessor's `get`, a
    # `writable`) neither makes the call throw nor loosens them.
    program = """
    Object.defineProperty(Object.prototype, "get", {value: function () { return 5; }, configurable: true});
    Object.prototype.writable = true;
    const p = tools.t({});
    const guard = Object.getOwnPropertyDescriptor(p, Symbol.iterator);
    const items = Object.getOwnPropertyDescriptor(p, Symbol.asyncIterator);
    return [await p, await tools.t({}), guard.writable, guard.configurable, items.writable, typeof items.value];
    """
    result = run_code(program, [Tool("t", lambda args: 1)], limits=Limits(timeout=10), description="test")
    assert result.error is None, result.error
    assert result.result == [1, 1, False, False, False, "function"]


def test_a_tools_name_crosses_as_its_json_text_however_it_was_reached(runtime):
    # Declared or not, whole or past the longest name the host reads, with
    # characters JSON escapes: the host reads the name the program wrote.
    odd = 'q"uo\\te\u0001\u2028'
    program = f"""
    const out = [await tools.t({{}}), await tools.t({{}})];
    for (const name of [{json.dumps(odd)}, "x".repeat(5000)]) {{
      try {{ out.push(await tools[name]({{}})); }} catch (e) {{ out.push(e.message.slice(0, 40)); }}
    }}
    return out;
    """
    tools = [Tool("t", lambda args: 1), Tool(odd, lambda args: 2)]
    result = run_code(program, tools, limits=Limits(timeout=10), description="test")
    assert result.error is None, result.error
    assert result.result[:3] == [1, 1, 2]
    assert result.result[3].startswith("a tool name may be at most")

"""The pure parts of ``nous_sched.mcp``: annotation flags, result values, names, specs, config files."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp_types import CallToolResult, ImageContent, TextContent, ToolAnnotations

from nous_sched import ConfigError, PermissionPolicy, ToolError
from nous_sched.mcp import ServerSpec, ToolOverride, load_config
from nous_sched.mcp.config import load_policy, parse_config
from nous_sched.mcp.mapping import flags, result_value, server_name, stable_name, tool_name

HINT = st.sampled_from([None, True, False])


def hints(read_only=None, destructive=None, idempotent=None, open_world=None):
    return ToolAnnotations(
        read_only_hint=read_only, destructive_hint=destructive, idempotent_hint=idempotent, open_world_hint=open_world
    )


# -- flags -----------------------------------------------------------------------


@given(HINT, HINT, HINT, HINT, st.booleans())
def test_an_untrusted_servers_hints_never_matter(read_only, destructive, idempotent, open_world, missing):
    annotations = None if missing else hints(read_only, destructive, idempotent, open_world)
    assert flags(annotations, trusted=False) == flags(None, trusted=False)
    f = flags(annotations, trusted=False)
    assert (f.parallel, f.requires_approval, f.category, f.reason) == (False, True, "write", "untrusted server")


@given(HINT, HINT, HINT)
def test_a_trusted_server_is_parallel_exactly_when_read_only(destructive, idempotent, open_world):
    assert flags(hints(True, destructive, idempotent, open_world), trusted=True).parallel
    for read_only in (None, False):
        f = flags(hints(read_only, destructive, idempotent, open_world), trusted=True)
        assert not f.parallel  # idempotentHint never makes a call parallel
        assert f.requires_approval is (destructive is not False)  # destructive unless it says otherwise


def test_a_trusted_server_without_annotations_gets_the_spec_defaults():
    f = flags(None, trusted=True)
    assert (f.parallel, f.requires_approval, f.category) == (False, True, "write")
    assert f.reason == "destructive (MCP default)"
    assert flags(hints(None, None), trusted=True).reason == "destructive (MCP default)"


@pytest.mark.parametrize("trusted", [True, False])
def test_a_read_only_override_runs_in_parallel_without_approval_and_says_so(trusted):
    f = flags(None, trusted=trusted, override=ToolOverride(read_only=True))
    assert (f.parallel, f.requires_approval, f.category) == (True, False, "read")
    assert f.reason.endswith("; overridden: read_only=True")
    # parallel and requires_approval, when given, beat read_only
    f = flags(None, trusted=trusted, override=ToolOverride(requires_approval=True, read_only=True))
    assert (f.parallel, f.requires_approval) == (True, True)


@given(HINT, HINT, st.booleans(), st.sampled_from([None, True, False]), st.sampled_from([None, True, False]))
def test_an_override_beats_everything(read_only, destructive, trusted, parallel, approval):
    f = flags(hints(read_only, destructive), trusted=trusted, override=ToolOverride(parallel, approval))
    plain = flags(hints(read_only, destructive), trusted=trusted)
    assert f.parallel == (plain.parallel if parallel is None else parallel)
    assert f.requires_approval == (plain.requires_approval if approval is None else approval)
    assert f.category == ("read" if f.parallel else "write")


# -- result values -------------------------------------------------------------------


def text(*texts, **fields):
    return CallToolResult(content=[TextContent(type="text", text=t) for t in texts], **fields)


def test_structured_content_wins_over_text():
    assert result_value(text("ignored", structured_content={"a": 1})) == {"a": 1}


@pytest.mark.parametrize(
    "texts, value",
    [
        (("42",), 42),
        (('{"a": [1, null]}',), {"a": [1, None]}),
        (("not json",), "not json"),
        (("NaN",), "NaN"),
        (("Infinity",), "Infinity"),
        (("", "2"), ["", 2]),
        ((), None),
    ],
)
def test_text_is_parsed_as_json_where_it_parses(texts, value):
    assert result_value(text(*texts)) == value


def test_other_blocks_become_their_json_form():
    image = ImageContent(type="image", data="aGk=", mime_type="image/png")
    result = CallToolResult(content=[image, TextContent(type="text", text="caption")])
    assert result_value(result) == [{"type": "image", "data": "aGk=", "mimeType": "image/png"}, "caption"]


def test_is_error_raises_the_servers_text():
    with pytest.raises(ToolError) as caught:
        result_value(text("first", "second", is_error=True, structured_content={"ignored": True}))
    assert caught.value.message == "first\nsecond"
    with pytest.raises(ToolError, match="reported an error without a message"):
        result_value(CallToolResult(content=[], is_error=True))


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)
    )
)
def test_json_text_round_trips(value):
    assert result_value(text(json.dumps(value))) == value


# -- names ---------------------------------------------------------------------------------


def test_tool_names_are_prefixed_only_when_namespaced():
    assert stable_name(None, "read") == "read" and stable_name("files", "read") == "files__read"
    assert stable_name("files", "read", ToolOverride(name="cat")) == "files__cat"
    assert tool_name("files", "read", namespaced=False) == "read"
    assert tool_name("files", "read", namespaced=True) == "files__read"


@pytest.mark.parametrize(
    "reported, name",
    [
        ("lab", "lab"),
        ("My Server!", "My_Server"),
        ("a.b/c", "a_b_c"),
        ("", "fallback"),
        (None, "fallback"),
        ("x" * 99, "x" * 64),
    ],
)
def test_reported_server_names_are_made_usable(reported, name):
    assert server_name(reported, "fallback") == name


# -- specs ---------------------------------------------------------------------------------


def test_a_spec_knows_its_transport_and_describes_itself():
    assert ServerSpec("https://h.example/mcp?token=secret").describe() == "https://h.example/mcp"
    assert ServerSpec(["python", "s.py"]).transport == "stdio"
    assert ServerSpec(["python", "s.py"]).target == ("python", "s.py")
    assert ServerSpec(SimpleNamespace()).transport == "in-process"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: ServerSpec("s.py"), r"ServerSpec: `target` must be an http:// or https:// URL, .*got 's.py'"),
        (lambda: ServerSpec([]), r"`target` must be .*a non-empty list of strings.*got \(\)"),
        (lambda: ServerSpec(["python", 3]), "`target` must be"),
        (lambda: ServerSpec(None), "`target` must be"),
        (lambda: ServerSpec(["x"], name="a b"), "ServerSpec: `name` must be None or 1-64 letters"),
        (lambda: ServerSpec(["x"], trusted="yes"), "ServerSpec: `trusted` must be a bool, got 'yes'"),
        (lambda: ServerSpec(["x"], env={"A": 1}), "`env` must be None or a mapping of strings to strings"),
        (lambda: ServerSpec(["x"], cwd=3), "`cwd` must be None or a str"),
        (lambda: ServerSpec(["x"], overrides=["read"]), "`overrides` must be a mapping of tool names"),
        (lambda: ServerSpec(["x"], overrides={"t": 1}), r"overrides\['t'\] must be a ToolOverride or a mapping"),
        (lambda: ServerSpec(["x"], overrides={"t": {"paralel": True}}), r"overrides\['t'\]: unknown key 'paralel'"),
        (
            lambda: ServerSpec(["x"], overrides={"t": {"parallel": 1}}),
            "ToolOverride: `parallel` must be None or a bool",
        ),
        (lambda: ToolOverride(requires_approval="no"), "`requires_approval` must be None or a bool, got 'no'"),
    ],
)
def test_bad_spec_options_are_config_errors_naming_them(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


# -- config files ------------------------------------------------------------------------


def test_a_config_file_lists_servers_in_order(tmp_path):
    path = tmp_path / "servers.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "files": {
                        "command": "python",
                        "args": ["files.py", "--root", "/srv"],
                        "env": {"A": "1"},
                        "cwd": "/tmp",
                        "trusted": True,
                        "overrides": {"delete": {"requires_approval": True}},
                    },
                    "web": {"url": "https://web.example/mcp", "headers": {"Authorization": "Bearer t"}},
                }
            }
        )
    )
    files, web = load_config(path)
    assert files == ServerSpec(
        ["python", "files.py", "--root", "/srv"],
        name="files",
        trusted=True,
        overrides={"delete": ToolOverride(requires_approval=True)},
        env={"A": "1"},
        cwd="/tmp",
    )
    assert web == ServerSpec("https://web.example/mcp", name="web", headers={"Authorization": "Bearer t"})


@pytest.mark.parametrize(
    "document, message",
    [
        ({}, '"mcpServers" object'),
        ({"mcpServers": {"a": {"command": "x", "trustd": True}}}, "mcpServers.a: unknown key 'trustd'"),
        ({"mcpServers": {"a": {}}}, 'exactly one of "command"'),
        ({"mcpServers": {"a": {"command": "x", "url": "http://h"}}}, 'exactly one of "command"'),
        ({"mcpServers": {"a": {"url": "http://h", "args": []}}}, '"args" goes with "command"'),
        ({"mcpServers": {"a": {"command": "x", "headers": {}}}}, '"headers" goes with "url"'),
        ({"mcpServers": {"a": {"command": "x", "args": "y"}}}, '"args" must be a list of strings'),
        ({"mcpServers": {"a": {"command": "x", "trusted": "yes"}}}, "mcpServers.a: ServerSpec: `trusted`"),
        ({"mcpServers": {"a b": {"command": "x"}}}, "`name` must be"),
        ({"mcpServers": {"a": "x"}}, "expected an object"),
    ],
)
def test_a_malformed_config_is_a_config_error_naming_the_entry(document, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(document, source="servers.json")


def test_an_unreadable_config_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read it"):
        load_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="not JSON"):
        load_config(tmp_path / "bad.json")


def test_a_policy_file_gives_a_policy_and_the_pre_approved_tools(tmp_path):
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"deny": ["rm"], "require_approval": ["put"], "approve": ["note"], "allow": None}))
    policy, approve = load_policy(path)
    assert policy == PermissionPolicy(deny={"rm"}, require_approval={"put"})
    assert approve == frozenset({"note"})
    path.write_text(json.dumps({"aprove": ["x"]}))
    with pytest.raises(ConfigError, match="unknown key 'aprove'"):
        load_policy(path)
    path.write_text(json.dumps({"deny": "rm"}))
    with pytest.raises(ConfigError, match="'deny' must be a list of strings"):
        load_policy(path)

"""Calling a tool the run does not declare: a ToolError naming it, the closest
declared names and how to list them; `tools` still reads as the declared tools.

The promises are in ``runtime/prelude.js`` (the `tools` proxy) and
``discovery.py`` (the names suggested); hostile probes of the proxy are
``tests/adversarial/forge_tools_proxy.js`` and
``forge_call_sites_during_capture.js``.
"""

from __future__ import annotations

import pytest

from nous_sched import PermissionPolicy, Tool, run_code
from nous_sched.sdk.discovery import closest_names, unknown_tool_message

NAMES = ["get_weather", "get_forecast", "search_docs", "send_email", "list_files"]


def tools(names=NAMES):
    return [Tool(name, lambda args: args, description=f"The {name} tool.") for name in names]


@pytest.mark.parametrize(
    "asked, first",
    [
        ("getWeather", "get_weather"),  # camelCase for snake_case
        ("GetWeather", "get_weather"),
        ("get-weather", "get_weather"),
        ("GET_WEATHER", "get_weather"),
        ("get_wether", "get_weather"),  # a typo
        ("weather", "get_weather"),  # a word of it
        ("searchDoc", "search_docs"),
        ("sendMail", "send_email"),
    ],
)
def test_the_closest_declared_name_comes_first(asked, first):
    assert closest_names(asked, NAMES)[0] == first


def test_closest_names_are_few_deterministic_and_may_be_none():
    assert closest_names("get", NAMES) == closest_names("get", list(reversed(NAMES)))
    assert len(closest_names("get_f", NAMES)) <= 3
    assert closest_names("zzzzqqq", NAMES) == []
    assert closest_names("x", []) == []


def test_the_message_names_the_tool_the_suggestions_and_how_to_list_them():
    assert unknown_tool_message("getWeather", NAMES) == (
        'unknown tool "getWeather"; did you mean "get_weather"? Object.keys(tools) lists the 5 declared tools; '
        'sdk.search("words") finds them by what they do.'
    )
    assert unknown_tool_message("zzz", NAMES).startswith('unknown tool "zzz". Object.keys(tools) lists the 5')
    assert (
        unknown_tool_message("zzz", [])
        == 'unknown tool "zzz"; this run declares no tools (Object.keys(tools) is empty)'
    )


def test_calling_an_undeclared_tool_rejects_with_a_tool_error_naming_it(runtime):
    program = """
    try { await tools.getWeather({city: "Oslo"}); }
    catch (e) { return [e instanceof ToolError, e.name, e.tool, e.message]; }
    """
    result = run_code(program, tools(), description="test")
    assert result.ok, result.error
    assert result.result == [
        True,
        "ToolError",
        "getWeather",
        'unknown tool "getWeather"; did you mean "get_weather"? Object.keys(tools) lists the 5 declared tools; '
        'sdk.search("words") finds them by what they do.',
    ]
    assert result.calls == ()  # refused by the host: no tool ran, nothing audited


def test_uncaught_the_error_says_which_tool_and_where_it_was_called(runtime):
    program = 'const a = 1;\nconst r = await tools.getWeather({city: "Oslo"});'
    result = run_code(program, tools(), description="test")
    assert result.error.kind == "exception"
    first, location = result.error.message.split("\n")
    assert first.startswith('ToolError: unknown tool "getWeather"; did you mean "get_weather"?')
    assert first.endswith('(tool "getWeather")')
    # QuickJS places a method call at the method's name: `getWeather` starts at column 23.
    assert location == "    at program (<input>:2:23)"


def test_reading_tools_shows_only_the_declared_tools(runtime):
    program = """
    return {
      keys: Object.keys(tools), json: JSON.stringify(tools),
      declared: "get_weather" in tools, undeclared: "getWeather" in tools,
      own: Object.getOwnPropertyNames(tools), frozen: Object.isFrozen(tools),
      then: typeof tools.then, toJSON: typeof tools.toJSON, undeclaredType: typeof tools.getWeather,
      awaited: Object.keys(await Promise.resolve(tools)),
    };
    """
    result = run_code(program, tools(), description="test")
    assert result.ok, result.error
    declared = sorted(NAMES)
    assert result.result == {
        "keys": declared,
        "json": "{}",
        "declared": True,
        "undeclared": False,
        "own": declared,
        "frozen": True,
        "then": "undefined",
        "toJSON": "undefined",
        "undeclaredType": "function",
        "awaited": declared,
    }


def test_a_tool_named_like_a_protocol_method_is_still_callable(runtime):
    weird = [Tool("then", lambda args: "then ran"), Tool("toJSON", lambda args: "toJSON ran")]
    result = run_code('return [await tools.then({}), await tools["toJSON"]({})]', weird, description="test")
    assert result.result == ["then ran", "toJSON ran"]


def test_a_denied_tool_is_denied_not_unknown(runtime):
    program = "try { await tools.send_email({}); } catch (e) { return e.message; }"
    result = run_code(program, tools(), policy=PermissionPolicy(deny=["send_email"]), description="test")
    assert result.result == 'tool "send_email" is denied by the permission policy'

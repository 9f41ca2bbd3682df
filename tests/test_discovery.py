"""The program's ``sdk`` global: a tool's declaration and a search by words,
answered by the host from :class:`nous_sched.sdk.ToolIndex` (``discovery.py``),
in both runtimes, without a tool call's policy, approval or audit.
"""

from __future__ import annotations

from nous_sched import PermissionPolicy, Tool, run_code, run_code_tool, sdk
from nous_sched.sdk import ToolIndex


def weather(args):
    return {"city": args["city"], "temp": 21}


TOOLS = [
    Tool(
        "get_weather",
        weather,
        description="Current weather for a city. Uses the national service.",
        parameters={
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name."}},
            "required": ["city"],
        },
        returns={"type": "object", "properties": {"temp": {"type": "number"}}, "required": ["temp"]},
    ),
    Tool("send_email", lambda args: "sent", description="Send an email to one address."),
    Tool("list_files", lambda args: [], description="List the files in a folder."),
]


def test_describe_resolves_to_the_tools_declaration(runtime):
    result = run_code('return await sdk.describe("get_weather");', TOOLS, description="test")
    assert result.ok, result.error
    assert result.result == ToolIndex(TOOLS).describe("get_weather")
    assert '"get_weather"(args: {' in result.result and 'Promise<{ "temp": number }>' in result.result
    assert result.calls == ()  # a question is not a tool call


def test_search_resolves_to_the_best_matches(runtime):
    result = run_code(
        'return [await sdk.search("weather city"), await sdk.search("email", 1)];', TOOLS, description="test"
    )
    assert result.ok, result.error
    assert result.result == [
        [{"name": "get_weather", "summary": "Current weather for a city.", "args": ["city"]}],
        [{"name": "send_email", "summary": "Send an email to one address.", "args": []}],
    ]


def test_a_program_can_discover_then_call(runtime):
    program = """
    const [best] = await sdk.search("weather");
    return await tools[best.name]({city: "Oslo"});
    """
    result = run_code(program, TOOLS, description="test")
    assert result.result == {"city": "Oslo", "temp": 21}
    assert [e.tool for e in result.calls] == ["get_weather"]


def test_questions_and_calls_settle_in_the_order_the_program_made_them(runtime):
    program = """
    const order = [];
    await Promise.all([
      tools.get_weather({city: "A"}).then(() => order.push("call 1")),
      sdk.search("email").then(() => order.push("search")),
      tools.get_weather({city: "B"}).then(() => order.push("call 2")),
    ]);
    return order;
    """
    assert run_code(program, TOOLS, description="test").result == ["call 1", "search", "call 2"]


def test_describing_an_unknown_tool_names_the_closest_ones(runtime):
    program = (
        'try { await sdk.describe("getWeather"); } catch (e) { return [e instanceof ToolError, e.tool, e.message]; }'
    )
    result = run_code(program, TOOLS, description="test")
    assert result.result[:2] == [True, "getWeather"]
    assert result.result[2].startswith('unknown tool "getWeather"; did you mean "get_weather"?')


def test_bad_questions_reject_with_a_tool_error_naming_the_question(runtime):
    program = """
    const out = [];
    for (const ask of [() => sdk.describe(5), () => sdk.search(), () => sdk.search(7), () => sdk.search("x", 500)]) {
      try { await ask(); out.push("answered"); } catch (e) { out.push(e.tool + ": " + e.message); }
    }
    return out;
    """
    result = run_code(program, TOOLS, description="test")
    assert result.result == [
        'sdk.describe: expects a tool\'s name (a string), e.g. sdk.describe("search_docs")',
        'sdk.search: `words` must be a string of words, e.g. sdk.search("weather"), got None',
        'sdk.search: `words` must be a string of words, e.g. sdk.search("weather"), got 7',
        "sdk.search: `limit` must be an integer from 1 to 100, got 500",
    ]


def test_only_granted_tools_are_described_or_found(runtime):
    policy = PermissionPolicy(deny=["send_email"])
    program = """
    let denied;
    try { await sdk.describe("send_email"); } catch (e) { denied = e.message; }
    return [denied, await sdk.search("email")];
    """
    result = run_code(program, TOOLS, policy=policy, description="test")
    assert result.result == ['tool "send_email" is denied by the permission policy', []]


def test_sdk_is_frozen_and_cannot_be_replaced(runtime):
    program = """
    "use strict";
    const out = [Object.keys(sdk), Object.isFrozen(sdk), Object.getPrototypeOf(sdk)];
    try { sdk.describe = () => "fake"; } catch (e) { out.push(e.name); }
    try { globalThis.sdk = {}; } catch (e) { out.push(e.name); }
    out.push(typeof (await sdk.describe("list_files")));
    return out;
    """
    result = run_code(program, TOOLS, description="test")
    assert result.result == [["describe", "search"], True, None, "TypeError", "TypeError", "string"]


def many_tools(n=60):
    schema = {"type": "object", "properties": {"id": {"type": "string", "description": "The record's id."}}}
    kinds = [f"kind{i:02d}" for i in range(n)]
    return [
        Tool(f"get_{k}", lambda args: {"id": args.get("id")}, description=f"Fetch one {k} by id.", parameters=schema)
        for k in kinds
    ]


def test_run_code_tool_over_its_budget_describes_each_tool_in_one_line_and_the_program_asks(runtime):
    tools = many_tools()
    full = run_code_tool(tools, budget=None).description
    compact = run_code_tool(tools, budget=len(full) - 1).description
    assert sdk.step_of(compact) == "lines"
    assert len(compact) < len(full)
    assert compact.count("\n") < full.count("\n")
    assert 'sdk.describe("<tool name>")' in compact and "sdk.describe" not in full
    assert '  "get_kind07"(args: object): Promise<unknown>; // Fetch one kind07 by id. Args: id?' in compact
    tool = run_code_tool(tools, budget=len(full) - 1)
    answer = tool.function({"code": 'return await sdk.describe("get_kind07");', "description": "read a declaration"})
    assert answer["result"] == ToolIndex(tools).describe("get_kind07")
    assert "/** The record's id. */" in answer["result"]


def test_the_default_budget_keeps_a_small_tool_set_in_full():
    assert run_code_tool(TOOLS).description == run_code_tool(TOOLS, budget=None).description
    assert "Current weather for a city." in run_code_tool(TOOLS).description


def test_sdk_is_there_with_no_tools_and_finds_nothing(runtime):
    program = 'let d; try { await sdk.describe("x"); } catch (e) { d = e.message; } return [await sdk.search("x"), d];'
    result = run_code(program, [], description="test")
    assert result.result == [[], 'unknown tool "x"; this run declares no tools (Object.keys(tools) is empty)']


def test_tools_named_like_the_discovery_global_do_not_collide(runtime):
    named = [Tool("sdk", lambda args: "the sdk tool"), Tool("describe", lambda args: "the describe tool")]
    program = """
    return [await tools.sdk({}), await tools.describe({}), typeof (await sdk.describe("sdk")),
            (await sdk.search("describe")).map((t) => t.name)];
    """
    result = run_code(program, named, description="test")
    assert result.result == ["the sdk tool", "the describe tool", "string", ["describe"]]

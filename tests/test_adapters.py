"""Handing ``run_code`` to agent loops: provider tool shapes and ``call_tool``."""

from __future__ import annotations

import copy
import json
import typing

import pytest
from pydantic import TypeAdapter, ValidationError

from nous_sched import (
    ConfigError,
    Event,
    SessionLog,
    Tool,
    ToolError,
    WithContextUpdate,
    anthropic_tool,
    call_tool,
    function_tool,
    openai_tool,
    run_code_tool,
)
from nous_sched.outcome import TRUNCATION_MARK


def echo(name="echo"):
    return Tool(name=name, function=lambda args: args)


def rc(*tools, **options):
    return run_code_tool(list(tools) or [echo()], **options)


def args(code, description="test program"):
    return {"code": code, "description": description}


# --- tool shapes -----------------------------------------------------------------------


def test_openai_tool_shape_for_run_code():
    tool = rc()
    shape = openai_tool(tool)
    assert shape == {
        "type": "function",
        "function": {"name": "run_code", "description": tool.description, "parameters": dict(tool.parameters)},
    }
    params = shape["function"]["parameters"]
    assert params["required"] == ["code", "description"]
    assert params["properties"]["code"]["type"] == "string"
    assert params["properties"]["description"]["type"] == "string"
    assert "declare const tools" in shape["function"]["description"]
    json.dumps(shape)  # ready to send


def test_anthropic_tool_shape_for_run_code():
    tool = rc()
    shape = anthropic_tool(tool)
    assert shape == {"name": "run_code", "description": tool.description, "input_schema": dict(tool.parameters)}
    assert set(shape) == {"name", "description", "input_schema"}
    assert shape["input_schema"]["required"] == ["code", "description"]
    json.dumps(shape)


def test_shapes_hand_out_a_copy_of_the_top_level_schema():
    tool = rc()
    before = copy.deepcopy(dict(tool.parameters))
    openai_tool(tool)["function"]["parameters"]["strict"] = True
    anthropic_tool(tool)["input_schema"]["extra"] = 1
    assert dict(tool.parameters) == before


def test_tool_without_parameters_gets_an_empty_object_schema():
    plain = echo("plain")
    assert openai_tool(plain)["function"]["parameters"] == {"type": "object", "properties": {}}
    assert anthropic_tool(plain)["input_schema"] == {"type": "object", "properties": {}}
    assert openai_tool(plain)["function"]["description"] == ""


def test_empty_schemas_are_not_shared_between_tools():
    first = openai_tool(echo("first"))
    properties = first["function"]["parameters"]["properties"]
    properties["injected"] = {"type": "string"}
    try:
        assert anthropic_tool(echo("second"))["input_schema"] == {"type": "object", "properties": {}}
    finally:
        properties.pop("injected", None)  # undo the leak for every later test


def test_openai_tool_targets_chat_completions_or_the_flat_responses_shape():
    tool = rc()
    assert openai_tool(tool) == openai_tool(tool, "chat")
    flat = openai_tool(tool, api="responses")
    assert flat == {
        "type": "function",
        "name": "run_code",
        "description": tool.description,
        "parameters": dict(tool.parameters),
        "strict": False,  # the Responses API reads an absent `strict` as true
    }
    strict_chat = openai_tool(tool, strict=True)
    assert strict_chat["function"]["strict"] is True
    assert openai_tool(tool, "responses", strict=True)["strict"] is True
    assert "strict" not in openai_tool(tool)["function"]


def test_the_responses_shape_carries_the_output_schema():
    returns = {"type": "object", "properties": {"n": {"type": "integer"}}}
    typed = Tool("count", lambda args: {"n": 1}, parameters={"properties": {}}, returns=returns)
    flat = openai_tool(typed, "responses")
    assert flat["output_schema"] == returns and flat["output_schema"] is not returns
    assert flat["parameters"] == {"type": "object", "properties": {}}  # `type` filled in
    assert "output_schema" not in openai_tool(rc(), "responses")


def test_a_bad_api_or_strict_is_a_configuration_error():
    with pytest.raises(ConfigError, match="`api` must be one of 'chat', 'responses', got 'assistants'"):
        openai_tool(rc(), "assistants")
    with pytest.raises(ConfigError, match="`strict`"):
        openai_tool(rc(), strict="yes")


# --- checked against the official SDKs' own request types -------------------------------


def _conforms(shape, typed_dict):
    """``shape`` validates as ``typed_dict`` (required keys, value types) and uses no key it does not declare."""
    TypeAdapter(typed_dict).validate_python(shape)
    assert set(shape) <= set(typing.get_type_hints(typed_dict)), set(shape) - set(typing.get_type_hints(typed_dict))


def _sample_tools():
    @function_tool
    def lookup(city: str, days: int = 1) -> dict[str, float]:
        """Forecast for a city."""
        return {}

    return [rc(), lookup, echo("plain")]


def test_shapes_conform_to_the_openai_sdk_request_types():
    from openai.types.chat import ChatCompletionFunctionToolParam, completion_create_params
    from openai.types.responses import FunctionToolParam, response_create_params
    from openai.types.shared_params import FunctionDefinition

    for tool in _sample_tools():
        chat, flat = openai_tool(tool), openai_tool(tool, "responses")
        _conforms(chat, ChatCompletionFunctionToolParam)
        _conforms(chat["function"], FunctionDefinition)
        _conforms(flat, FunctionToolParam)
        _conforms(openai_tool(tool, "responses", strict=True), FunctionToolParam)
        # Whole requests, as the client would send them.
        TypeAdapter(completion_create_params.CompletionCreateParamsNonStreaming).validate_python(
            {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}], "tools": [chat]}
        )
        TypeAdapter(response_create_params.ResponseCreateParamsNonStreaming).validate_python(
            {"model": "gpt-test", "input": "hi", "tools": [flat]}
        )
    # The check has teeth: the nested Chat shape is not a Responses function tool.
    with pytest.raises(ValidationError):
        TypeAdapter(FunctionToolParam).validate_python(openai_tool(rc()))


def test_shapes_conform_to_the_anthropic_sdk_request_types():
    from anthropic.types import ToolParam, message_create_params

    for tool in _sample_tools():
        shape = anthropic_tool(tool)
        _conforms(shape, ToolParam)
        TypeAdapter(message_create_params.MessageCreateParamsNonStreaming).validate_python(
            {
                "model": "claude-test",
                "max_tokens": 64,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [shape],
            }
        )
    with pytest.raises(ValidationError):
        TypeAdapter(ToolParam).validate_python({"name": "x", "parameters": {}})


# --- call_tool ---------------------------------------------------------------------------


def test_call_tool_returns_json_text_for_a_json_string_argument():
    text = call_tool(rc(), json.dumps(args("console.log('hi'); return await tools.echo({a: 1})")))
    assert isinstance(text, str)
    assert json.loads(text) == {"logs": ["hi"], "result": {"a": 1}}


def test_call_tool_accepts_dicts_and_bytes():
    assert json.loads(call_tool(rc(), args("return 1"))) == {"logs": [], "result": 1}
    assert json.loads(call_tool(rc(), json.dumps(args("return 2")).encode())) == {"logs": [], "result": 2}


def test_call_tool_keeps_non_ascii_text():
    text = call_tool(rc(), args("return 'é😀'"))
    assert "é😀" in text
    assert json.loads(text)["result"] == "é😀"


def test_call_tool_applies_the_context_update_to_the_session():
    session_log = SessionLog(
        [Event("system_message", {"content": "be brief"}), Event("user_message", {"content": "go"})]
    )
    before = session_log.messages()
    code = "const a = await tools.alpha({n: 1}); const b = await tools.beta({n: 2}); return [a, b]"
    text = call_tool(rc(echo("alpha"), echo("beta"), call_id="turn-1"), json.dumps(args(code)), session_log)
    # Only the value goes back to the model...
    assert json.loads(text) == {"logs": [], "result": [{"n": 1}, {"n": 2}]}
    # ...the direct call itself is audited first, then its sub-calls, in submission order...
    direct, *added = [e for e in session_log.events[2:] if e.type == "tool_call"]
    # each sub-call's outcome, then the direct call's own, close the audit
    outcomes = [(e.data["seq"], e.data["tool"]) for e in session_log.events if e.type == "tool_outcome"]
    assert outcomes == [(0, "alpha"), (1, "beta"), (0, "run_code")]
    assert (direct.type, direct.data["name"], direct.data["source"]) == ("tool_call", "run_code", "direct")
    assert direct.data["arguments"] == args(code) and not direct.surface
    assert [e.type for e in added] == ["tool_call", "tool_call"]
    assert [(e.data["id"], e.data["name"], e.data["arguments"], e.data["seq"]) for e in added] == [
        ("turn-1:code:0", "alpha", {"n": 1}, 0),
        ("turn-1:code:1", "beta", {"n": 2}, 1),
    ]
    assert all(e.data["source"] == "code_mode" and not e.surface for e in added)
    # ...and the model-visible history is unchanged.
    assert (
        session_log.messages()
        == before
        == [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "go"},
        ]
    )


def test_call_tool_without_a_session_returns_only_the_value():
    text = call_tool(rc(), args("return await tools.echo({x: 1})"))
    assert json.loads(text) == {"logs": [], "result": {"x": 1}}
    # The raw function returns the update; call_tool never leaks it into the text.
    raw = rc().function(args("return await tools.echo({x: 1})"))
    assert isinstance(raw, WithContextUpdate)
    assert "tool_call" not in text


def test_call_tool_with_no_sub_calls_audits_only_the_direct_call():
    session_log = SessionLog()
    assert json.loads(call_tool(rc(), args("return 'none'"), session_log)) == {"logs": [], "result": "none"}
    assert [(e.type, e.data.get("name"), e.data.get("source")) for e in session_log.events] == [
        ("tool_call", "run_code", "direct"),
        ("tool_outcome", None, None),
    ]


def test_call_tool_failed_run_returns_the_error_and_still_audits():
    session_log = SessionLog()
    text = call_tool(rc(), args("await tools.echo({}); throw new Error('late')"), session_log)
    body = json.loads(text)
    assert set(body) == {"logs", "error"}
    assert body["error"]["kind"] == "exception" and "late" in body["error"]["message"]
    assert [e.data["name"] for e in session_log.events if e.type == "tool_call"] == ["run_code", "echo"]
    assert session_log.messages() == []


def test_call_tool_answers_a_model_mistake_and_audits_the_refusal():
    session_log = SessionLog()
    blank = json.loads(call_tool(rc(), json.dumps(args("return 1", "  ")), session_log))
    assert set(blank) == {"error"} and "non-empty `description`" in blank["error"]
    # run_code's schema requires `code`: the gate refuses before the tool runs.
    for missing in ("null", None, {}, {"description": "no code"}):  # null arguments become {}
        error = json.loads(call_tool(rc(), missing, session_log))["error"]
        assert error.startswith("invalid arguments") and "code" in error
    assert [e.type for e in session_log.events] == ["tool_call", "tool_outcome"] + ["tool_refused"] * 4
    assert session_log.messages() == []


def test_call_tool_with_a_plain_tool():
    got = []
    plain = Tool("plain", lambda a: got.append(a) or {"ok": True, "n": a.get("n")})
    assert json.loads(call_tool(plain, '{"n": 3}')) == {"ok": True, "n": 3}
    assert json.loads(call_tool(plain, None)) == {"ok": True, "n": None}
    assert got == [{"n": 3}, {}]


def test_call_tool_answers_malformed_arguments_instead_of_raising():
    for text in ("{not json", '{"a": 1'):
        error = json.loads(call_tool(rc(), text))["error"]
        assert error.startswith("the arguments are not valid JSON (") and error.endswith("send one JSON object")
    error = json.loads(call_tool(rc(), b"\xff"))["error"]
    assert error.startswith("the arguments are not valid UTF-8 (") and error.endswith("send one JSON object")
    assert json.loads(call_tool(rc(), "[1, 2]")) == {"error": "arguments must be an object, got [1, 2]"}
    assert json.loads(call_tool(rc(), '"text"')) == {"error": 'arguments must be an object, got "text"'}


def test_call_tool_returns_a_tool_error_but_lets_a_host_bug_propagate():
    def refusing(args):
        raise ToolError("no such city: " + "x" * 5000)

    message = json.loads(call_tool(Tool("refusing", refusing), {}))["error"]
    assert message.startswith("no such city: xxx") and message.endswith(TRUNCATION_MARK)

    def buggy(args):
        raise KeyError("host bug")

    with pytest.raises(KeyError):
        call_tool(Tool("buggy", buggy), {})

"""nous_sched.result.budget and run_code_tool(output_budget=N): the model-facing answer within N
bytes of UTF-8, valid JSON, cut structurally, and saying in place what it left out."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nous_sched import ConfigError, Tool, WithContextUpdate, run_code, run_code_tool, visible_tools
from nous_sched.result.budget import DEFAULT_OUTPUT_BUDGET, MIN_OUTPUT_BUDGET, MORE_KEYS, fit, size

_CHARS = re.compile(r"^… \[([\d,]+) more characters\]$")
_ITEMS = re.compile(r"^… ([\d,]+) more items$")
_KEYS = re.compile(r"^([\d,]+) more keys$")
_LINES = re.compile(r"^… \[([\d,]+) lines omitted\]$")


def _count(match):
    return int(match.group(1).replace(",", ""))


def _text(answer):
    return json.dumps(answer, ensure_ascii=False)


def _bytes(text):
    """What the budget bounds: UTF-8 bytes, a lone surrogate as its 6-byte escape (computed here on its own)."""
    return sum(6 if 0xD800 <= ord(c) <= 0xDFFF else len(c.encode("utf-8")) for c in text)


# -- the checker: every difference between the original and the cut value is a marker that counts it --------


def _accounts_for(original, cut):
    """True when ``cut`` is ``original`` with every cut marked, in place, with the exact count."""
    if cut == original and type(cut) is type(original):
        return True
    if isinstance(original, str):
        return _string_accounted(original, cut)
    if isinstance(original, list):
        return _list_accounted(original, cut)
    if isinstance(original, dict):
        return _dict_accounted(original, cut)
    return False


def _string_accounted(original, cut):
    if not isinstance(cut, str):
        return False
    for i in range(len(cut), -1, -1):  # the marker is the longest suffix that is one
        m = _CHARS.match(cut[i:])
        if m and original.startswith(cut[:i]) and _count(m) == len(original) - i:
            return True
    return False


def _list_accounted(original, cut):
    if not isinstance(cut, list):
        return False
    if cut and isinstance(cut[-1], str) and (m := _ITEMS.match(cut[-1])) and len(cut) - 1 < len(original):
        kept = cut[:-1]
        if _count(m) != len(original) - len(kept):
            return False
    else:
        kept = cut
        if len(kept) != len(original):
            return False
    return all(_accounts_for(o, c) for o, c in zip(original, kept))


def _dict_accounted(original, cut):
    if not isinstance(cut, dict):
        return False
    keys = list(cut)
    marker = next((k for k in keys if k.startswith(MORE_KEYS) and k not in original), None)
    kept = [k for k in keys if k != marker]
    if kept != list(original)[: len(kept)]:
        return False
    if marker is not None:
        m = _KEYS.match(cut[marker])
        if not m or _count(m) != len(original) - len(kept):
            return False
    elif len(kept) != len(original):
        return False
    return all(_accounts_for(original[k], cut[k]) for k in kept)


def _logs_accounted(original, cut):
    if cut == original:
        return True
    omitted = [i for i, line in enumerate(cut) if isinstance(line, str) and _LINES.match(line)]
    omitted = [i for i in omitted if not (i < len(original) and original[i] == cut[i])]
    if not omitted:
        return len(cut) == len(original) and all(_accounts_for(o, c) for o, c in zip(original, cut))
    at = omitted[0]
    head, tail = cut[:at], cut[at + 1 :]
    if _count(_LINES.match(cut[at])) != len(original) - len(head) - len(tail):
        return False
    heads_ok = all(_accounts_for(o, c) for o, c in zip(original, head))
    tails_ok = all(_accounts_for(o, c) for o, c in zip(original[len(original) - len(tail) :], tail))
    return heads_ok and tails_ok


# -- every JSON type -----------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=300),
    lambda children: st.lists(children, max_size=40) | st.dictionaries(st.text(max_size=12), children, max_size=20),
    max_leaves=300,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    result=json_values,
    logs=st.lists(st.text(max_size=200), max_size=60),
    budget=st.integers(MIN_OUTPUT_BUDGET, 3000),
)
def test_any_answer_is_cut_to_valid_json_within_the_budget_saying_what_it_left_out(result, logs, budget):
    answer = {"logs": logs, "result": result}
    cut = fit(answer, budget)
    text = _text(cut)
    assert _bytes(text) <= budget
    assert json.loads(text) == cut  # valid JSON, and what the model reads is this value
    assert set(cut) == {"logs", "result"}
    assert _logs_accounted(logs, cut["logs"])
    assert _accounts_for(result, cut["result"]) or _CHARS.match(cut["result"])
    if size(answer) <= budget:
        assert cut == answer  # nothing cut when it fits


@settings(max_examples=150, deadline=None)
@given(
    message=st.text(max_size=5000),
    logs=st.lists(st.text(max_size=500), max_size=30),
    budget=st.integers(MIN_OUTPUT_BUDGET, 2000),
)
def test_an_error_answer_keeps_its_kind_and_cuts_its_message(message, logs, budget):
    answer = {"logs": logs, "error": {"kind": "exception", "message": message}}
    cut = fit(answer, budget)
    assert _bytes(_text(cut)) <= budget
    assert cut["error"]["kind"] == "exception"
    assert _accounts_for(message, cut["error"]["message"])
    assert _logs_accounted(logs, cut["logs"])


@pytest.mark.parametrize(
    "result, marker",
    [
        (list(range(5000)), r'"… [\d,]+ more items"\]'),
        ("x" * 50_000, r'… \[[\d,]+ more characters\]"'),
        ({f"key{i}": i for i in range(3000)}, r'"…": "[\d,]+ more keys"\}'),
        ([{"id": i, "body": "y" * 100} for i in range(1000)], r'"… [\d,]+ more items"\]'),
        ({"nested": {"deeper": ["z" * 10_000]}}, r'… \[[\d,]+ more characters\]"'),
    ],
    ids=["array", "string", "object", "array-of-objects", "nested-string"],
)
def test_each_json_type_is_cut_structurally(result, marker):
    answer = {"logs": ["one line"], "result": result}
    cut = fit(answer, 1000)
    text = _text(cut)
    assert _bytes(text) <= 1000
    assert re.search(marker, text)
    assert _accounts_for(result, cut["result"])
    assert cut["logs"] == ["one line"]  # the small part keeps all it needs


def test_an_array_says_how_many_items_it_left_out():
    cut = fit({"logs": [], "result": list(range(5000))}, 500)
    assert cut["result"][0] == 0
    m = _ITEMS.match(cut["result"][-1])
    assert m and _count(m) == 5000 - (len(cut["result"]) - 1)
    assert "more items" in cut["result"][-1] and "," in cut["result"][-1]  # "… 4,9xx more items"


def test_logs_keep_head_and_tail_with_the_lines_omitted():
    lines = [f"line {i}" for i in range(2000)]
    cut = fit({"logs": lines, "result": None}, 600)["logs"]
    assert cut[0] == "line 0" and cut[-1] == "line 1999"
    marker = next(line for line in cut if _LINES.match(line))
    assert _count(_LINES.match(marker)) == 2000 - (len(cut) - 1)


def test_scalars_and_small_answers_are_untouched():
    for result in (None, True, 0, -1.5, "short", [], {}):
        answer = {"logs": [], "result": result}
        assert fit(answer, MIN_OUTPUT_BUDGET) is answer


# -- through run_code_tool and run_code -------------------------------------------------------------------------


def _big(args):
    return [{"id": i, "name": f"item {i}"} for i in range(5000)]


def _answer(value):
    return value.value if isinstance(value, WithContextUpdate) else value


def test_run_code_tool_cuts_what_the_model_reads_by_default():
    tool = run_code_tool([Tool(name="big", function=_big, description="b")])
    out = _answer(
        tool.function(
            {
                "code": "for (let i = 0; i < 3000; i++) console.log('row ' + i); return await tools.big({})",
                "description": "lists everything",
            }
        )
    )
    text = _text(out)
    assert _bytes(text) <= DEFAULT_OUTPUT_BUDGET
    assert re.search(r"… [\d,]+ more items", text)
    assert re.search(r"… \[[\d,]+ lines omitted\]", text)
    assert out["logs"][0] == "row 0" and out["result"][0] == {"id": 0, "name": "item 0"}


def test_run_code_tool_output_budget_option_and_none_for_no_limit():
    tools = [Tool(name="big", function=_big, description="b")]
    small = run_code_tool(tools, output_budget=500)
    out = _answer(small.function({"code": "return await tools.big({})", "description": "all"}))
    assert _bytes(_text(out)) <= 500
    unlimited = run_code_tool(tools, output_budget=None)
    out = _answer(unlimited.function({"code": "return await tools.big({})", "description": "all"}))
    assert len(out["result"]) == 5000


def test_bad_output_budgets_are_config_errors_naming_the_option():
    for bad in (0, 255, "20000", 1.5, True):
        with pytest.raises(ConfigError, match="output_budget"):
            run_code_tool([], output_budget=bad)
        with pytest.raises(ConfigError, match="output_budget"):
            visible_tools("code", [], output_budget=bad)
        with pytest.raises(ConfigError, match="output_budget"):
            run_code("return 1", output_budget=bad, description="test")


def test_run_code_output_budget_keeps_the_full_result_and_cuts_only_for_the_model():
    result = run_code("return 'x'.repeat(10000)", output_budget=300, description="test")
    assert result.result == "x" * 10000  # the caller keeps everything
    model = result.for_model()
    assert _bytes(_text(model)) <= 300
    assert _accounts_for("x" * 10000, model["result"])
    assert result.to_dict()["result"] == "x" * 10000


# -- the unit: bytes of UTF-8, which bound what a model pays -----------------------------------------------------


def test_the_budget_bounds_utf8_bytes_of_astral_text():
    # 20,000 astral characters are 80,000 bytes: a budget in code points let 79,838 of them through.
    astral = "\U0001f600" * 20_000
    cut = fit({"logs": [], "result": astral}, 20_000)
    text = _text(cut)
    assert _bytes(text) <= 20_000 < len(text) * 4
    assert _accounts_for(astral, cut["result"])
    result = run_code('return "\\u{1F600}".repeat(20000)', output_budget=20_000, description="astral")
    model = _text(result.for_model())
    assert result.result == astral
    assert _bytes(model) == result.usage.model_bytes <= 20_000
    assert result.usage.answer_bytes == _bytes(_text(result.to_dict())) > 80_000


def test_a_lone_surrogate_counts_as_its_escape_and_ascii_as_characters():
    assert size("\ud800") == len('"\\ud800"') == 8
    assert size("\U0001f600") == 6 and size("é") == 4 and size("abc") == 5
    assert size({"logs": ["a, b"], "result": None}) == len('{"logs": ["a, b"], "result": null}')


any_text = st.text(alphabet=st.characters(blacklist_categories=()), max_size=300)
unicode_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | any_text,
    lambda children: st.lists(children, max_size=20) | st.dictionaries(any_text, children, max_size=10),
    max_leaves=100,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(result=unicode_values, logs=st.lists(any_text, max_size=30), budget=st.integers(MIN_OUTPUT_BUDGET, 2000))
def test_any_unicode_answer_is_cut_within_the_budgets_bytes(result, logs, budget):
    answer = {"logs": logs, "result": result}
    cut = fit(answer, budget)
    assert _bytes(_text(cut)) <= budget
    assert _logs_accounted(logs, cut["logs"])
    assert _accounts_for(result, cut["result"]) or _CHARS.match(cut["result"])


# -- a suspension: its token always --------------------------------------------------------------------------

small_values = st.recursive(
    st.none() | st.integers(-(2**53) + 1, 2**53 - 1) | any_text,
    lambda children: st.lists(children, max_size=8) | st.dictionaries(any_text, children, max_size=4),
    max_leaves=20,
)
_TOKEN = "0123456789abcdef01234567.1765000000.QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWZnaGk"
pending_calls = st.lists(
    st.fixed_dictionaries(
        {
            "seq": st.integers(0, 10_000),
            "tool": st.text(min_size=1, max_size=40),
            "arguments": st.dictionaries(any_text, small_values, max_size=4),
            "description": any_text,
            "site": st.just("3:14"),
            "committed": st.lists(st.fixed_dictionaries({"seq": st.integers(0, 99), "ok": st.booleans()}), max_size=5),
        }
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pending=pending_calls, logs=st.lists(any_text, max_size=300), budget=st.integers(MIN_OUTPUT_BUDGET, 3000))
def test_a_suspension_is_cut_within_the_budget_and_keeps_its_token(pending, logs, budget):
    suspension = {"token": _TOKEN, "expires_at": 1765000000.0, "pending": pending}
    answer = {"logs": logs, "suspended": suspension}
    cut = fit(answer, budget)
    assert _bytes(_text(cut)) <= budget
    assert set(cut) == {"logs", "suspended"}
    assert cut["suspended"]["token"] == _TOKEN and cut["suspended"]["expires_at"] == 1765000000.0
    assert _logs_accounted(logs, cut["logs"])
    shown = cut["suspended"]["pending"]
    calls = [p for p in shown if isinstance(p, dict)]
    assert [(p["seq"], p["tool"]) for p in calls] == [(p["seq"], p["tool"]) for p in pending[: len(calls)]]
    if len(calls) < len(pending):
        m = _ITEMS.match(shown[-1])
        assert m and _count(m) == len(pending) - len(calls)
    for original, call in zip(pending, calls):
        arguments = call.get("arguments", original["arguments"])
        size_said = isinstance(arguments, str) and _CHARS.match(arguments)
        assert size_said or _accounts_for(original["arguments"], arguments)
    if size(answer) <= budget:
        assert cut == answer

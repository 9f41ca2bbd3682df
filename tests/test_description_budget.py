"""The run_code description stays within its budget for any tool set, and sdk.search is a way in.

Tool sets of 10 to 2,500 generated tools (``tests/toolsets.py``: 25 services
as an aggregated MCP server names them) under budgets down to
:data:`nous_sched.sdk.MIN_BUDGET`: the description never exceeds the budget,
names its step, and its TypeScript part checks; a program that reads nothing
but ``sdk.search`` and ``sdk.describe`` finds and calls the right tool.
"""

from __future__ import annotations

import json
import pathlib
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolsets import SERVICES, api_tools, size_table
from tscheck import check_typescript

from nous_sched import PermissionPolicy, Tool, run_code, run_code_tool, sdk
from nous_sched.agent import RUN_CODE_DESCRIPTION
from nous_sched.errors import ConfigError
from nous_sched.sdk import _render, _steps
from nous_sched.sdk._tool_groups import group_names
from nous_sched.sdk._tool_search import WordIndex

COUNTS = (10, 100, 1_000, 2_500)
BUDGETS = (1_500, 2_000, 4_000, 8_000, 16_000, sdk.DEFAULT_BUDGET)
TOOLS = {n: api_tools(n) for n in COUNTS}


def sdk_part(description: str) -> str:
    assert description.startswith(RUN_CODE_DESCRIPTION + "\n\n")
    return description[len(RUN_CODE_DESCRIPTION) + 2 :]


@pytest.mark.parametrize("count", COUNTS)
def test_the_description_is_within_every_budget_names_its_step_and_type_checks(count):
    tools = TOOLS[count]
    seen = []
    for budget in BUDGETS:
        description = run_code_tool(tools, budget=budget).description
        assert len(description) <= budget, (count, budget, len(description))
        step = sdk.step_of(description)
        assert step in sdk.STEPS
        assert f'// SDK step "{step}": ' in description
        check_typescript(sdk_part(description))
        python = sdk.render(tools, "python", budget=budget)
        assert len(python) <= budget and sdk.step_of(python) in sdk.STEPS
        compile(python, "<sdk>", "exec")
        seen.append(sdk.STEPS.index(step))
    # A larger budget never takes a later (smaller) step.
    assert seen == sorted(seen, reverse=True), seen


def test_every_step_is_used_when_the_one_before_does_not_fit():
    tools = TOOLS[100]
    texts = {
        step: _steps._render_step(step, _render.unique_sorted(tools), "typescript", (), None) for step in sdk.STEPS
    }
    sizes = [len(texts[step]) for step in sdk.STEPS]
    assert sizes == sorted(sizes, reverse=True), sizes  # each step is smaller than the one before
    for step in sdk.STEPS[:-1]:
        # Exactly its size: this step. One less: a later one.
        assert sdk.step_of(_steps.fitted(tools, "typescript", len(texts[step]), ())) == step
        shorter = _steps.fitted(tools, "typescript", len(texts[step]) - 1, ())
        if step == "groups":  # first the same counts with fewer words
            assert sdk.step_of(shorter) == "groups" and len(shorter) < len(texts[step])
        else:
            assert sdk.STEPS.index(sdk.step_of(shorter)) > sdk.STEPS.index(step)
    assert sdk.step_of(_steps.fitted(tools, "typescript", len(texts["search"]), ())) == "search"
    assert sdk.render(tools) == texts["full"]


def test_the_steps_say_what_they_show():
    tools = TOOLS[100]
    ordered = _render.unique_sorted(tools)
    lines = _steps._render_step("lines", ordered, "typescript", (), None)
    assert (
        '  "github__get_issue"(args: object): Promise<unknown>; // Get one issue from Github by its id, with every '
        "field. Args: issue_id\n"
    ) in lines
    names = _steps._render_step("names", ordered, "typescript", (), None)
    assert (
        '  "github__get_issue"(args: object): Promise<unknown>; // Get one issue from Github by its id, with ' in names
    )
    assert "Args:" not in names and names.count("(args: object)") == 100
    groups = _steps._render_step("groups", _render.unique_sorted(TOOLS[2_500]), "typescript", (), None)
    assert "  // github__*: 100 tools (" in groups and "  // stripe__*: 100 tools (" in groups
    assert groups.count("__*: 100 tools") == 25
    assert "2,500 tools, too many to list" in groups
    search = sdk.render(TOOLS[2_500], budget=sdk.MIN_BUDGET)
    assert "2,500 tools, too many to list here" in search
    assert "__" not in search  # no tool is named
    for text in (lines, names, groups, search):
        assert 'sdk.search("words")' in text and 'sdk.describe("<tool name>")' in text


def test_a_group_lists_the_words_its_names_use_and_not_the_verbs_every_group_shares():
    groups = _steps._render_step("groups", _render.unique_sorted(TOOLS[2_500]), "typescript", (), None)
    (stripe,) = [row for row in groups.split("\n") if "stripe__*" in row]
    listed = stripe.split("(", 1)[1].rstrip(", ...)").split(", ")
    assert len(listed) == 6 and set(listed) <= set(SERVICES["stripe"])


def test_groups_give_up_their_words_before_the_step_is_given_up():
    # 300 flat names in 60 groups of 5: the counts fit a budget their words do not.
    tools = [
        Tool(f"ns{g:02}__{verb}_{thing}", print, description="x")
        for g in range(60)
        for verb, thing in [("get", "alpha"), ("set", "beta"), ("put", "gamma"), ("del", "delta"), ("add", "omega")]
    ]
    with_words = _steps._render_step("groups", _render.unique_sorted(tools), "typescript", (), None)
    assert "  // ns00__*: 5 tools (" in with_words
    budget = len(with_words) - 1
    fitted = sdk.render(tools, budget=budget)
    assert len(fitted) <= budget and sdk.step_of(fitted) == "groups"
    assert "  // ns00__*: 5 tools (add, alpha, beta, ...)\n" in fitted
    assert sdk.step_of(_steps.fitted(tools, "typescript", len(fitted) - 1, ())) == "groups"
    assert "  // ns00__*: 5 tools\n" in _steps.fitted(tools, "typescript", len(fitted) - 1, ())


def test_names_with_no_common_prefix_skip_to_the_last_step():
    tools = [Tool(f"t{i}", print, description=f"Tool number {i}.") for i in range(2_500)]
    text = sdk.render(tools, budget=4_000)
    assert sdk.step_of(text) == "search" and len(text) <= 4_000
    check_typescript(text)


def test_tools_in_no_group_are_counted_as_other():
    tools = [Tool(name, print) for name in ("a__x", "a__y", "b__x", "ping", "pong")]
    groups = _steps._render_step("groups", _render.unique_sorted(tools), "typescript", (), None)
    assert "  // a__*: 2 tools (x, y)\n  // 3 other tools\n" in groups


def test_the_last_step_fits_the_smallest_budget_for_any_count():
    room = sdk.MIN_BUDGET - len(RUN_CODE_DESCRIPTION) - 2
    for count in (0, 1, 9, 10_000, 10**9):
        tools = [Tool(f"t{i}", print) for i in range(min(count, 3))]
        for language in ("typescript", "python"):
            text = _steps._searched(tools, language == "python", (), None).replace(
                f"{len(tools):,} tool", f"{count:,} tool"
            )
            assert len(text) <= room, (count, language, len(text))


def test_the_last_step_names_the_callers_ranked_tools_that_are_granted_as_far_as_they_fit():
    tools = TOOLS[2_500]
    ranking = ["stripe__create_refund", "no_such_tool", "github__delete_branch", "slack__list_channels"]
    policy = PermissionPolicy(deny=["github__delete_branch"])
    description = run_code_tool(tools, budget=sdk.MIN_BUDGET + 200, ranking=ranking, policy=policy).description
    assert sdk.step_of(description) == "search"
    assert '// Most relevant: "stripe__create_refund", "slack__list_channels".' in description
    assert "github__delete_branch" not in description and "no_such_tool" not in description
    tight = run_code_tool(tools, budget=sdk.MIN_BUDGET, ranking=ranking * 30).description
    assert len(tight) <= sdk.MIN_BUDGET
    long_ranking = [t.name for t in tools[:50]]
    roomy = sdk.render(tools, budget=sdk.MIN_BUDGET, ranking=long_ranking)
    assert roomy.count('"github__') == sdk.RANKED_NAMES
    check_typescript(roomy)


def test_a_bad_budget_or_ranking_is_a_configuration_error_naming_it():
    for bad in (0, 1_499, 1.5e3, "2000", True):
        with pytest.raises(
            ConfigError, match="run_code_tool: `budget` must be None or a number of characters of at least 1,500"
        ):
            run_code_tool(TOOLS[10], budget=bad)
    for bad in ("stripe__create_refund", [1], {"a": 1}, 3):
        with pytest.raises(ConfigError, match="`ranking` must be None or a list or tuple of tool names"):
            run_code_tool(TOOLS[10], ranking=bad)
        with pytest.raises(ConfigError, match="render: `ranking`"):
            sdk.render(TOOLS[10], ranking=bad)


TASKS = {
    "create a refund in stripe": "stripe__create_refund",
    "list the slack channels": "slack__list_channels",
    "export stripe invoices as csv": "stripe__export_invoices",
    "restore an archived trello card": "trello__restore_card",
    "get one cloudflare dns record by its id": "cloudflare__get_dns_record",
    "count zendesk tickets": "zendesk__count_tickets",
    "delete a github branch": "github__delete_branch",
    "search hubspot deals": "hubspot__search_deals",
}

# Written only from what the description says: search by the task's words,
# read the declaration, fill the required arguments the hit names.
PROGRAM = """
const calls = [];
for (const task of TASKS) {
  const [hit] = await sdk.search(task, 3);
  const declaration = await sdk.describe(hit.name);
  const args = {};
  for (const arg of hit.args) {
    if (arg.endsWith("?")) continue;
    if (!declaration.includes(JSON.stringify(arg))) throw new Error("not declared: " + arg);
    args[arg] = arg === "fields" || arg === "filter" ? { note: task } : "x-1";
  }
  calls.push([hit.name, await tools[hit.name](args)]);
}
return calls;
"""


def test_a_program_written_from_search_and_describe_calls_the_right_tool_among_2500(runtime):
    called = []
    lock = threading.Lock()

    def record(name, args):
        with lock:
            called.append(name)
        return {"done": name}

    tools = api_tools(2_500, function=record)
    description = run_code_tool(tools, budget=sdk.MIN_BUDGET).description
    assert sdk.step_of(description) == "search" and "stripe__" not in description
    program = f"const TASKS = {json.dumps(list(TASKS))};\n{PROGRAM}"
    result = run_code(program, tools, description="find and call tools by search")
    assert result.ok, result.error
    assert [name for name, _ in result.result] == list(TASKS.values())
    assert [answer for _, answer in result.result] == [{"done": name} for name in TASKS.values()]
    assert called == list(TASKS.values())


def test_search_hits_carry_the_argument_names_required_first_and_are_bounded():
    index = sdk.ToolIndex(TOOLS[2_500])
    (hit,) = index.search("stripe export invoices", 1)
    assert hit == {
        "name": "stripe__export_invoices",
        "summary": "Export invoices from Stripe as CSV or JSON for a date range.",
        "args": ["since", "until", "format?"],
    }
    wide = Tool(
        "wide",
        print,
        description="Many arguments.",
        parameters={"type": "object", "properties": {("a" * 100 + str(i)): {} for i in range(50)}},
    )
    (hit,) = sdk.ToolIndex([wide]).search("wide")
    assert len(hit["args"]) == sdk.SEARCH_ARGS and all(len(a) <= sdk.SEARCH_ARG_CHARS for a in hit["args"])
    assert hit["args"][0].endswith("…")


def test_search_ranks_by_bm25_a_word_every_tool_has_counts_for_almost_nothing():
    index = sdk.ToolIndex(TOOLS[2_500])
    # "in" and "the" are in most descriptions; "stripe" and "refund" decide.
    assert (
        index.search("refund in the stripe", 1)[0]["name"].startswith("stripe__")
        and "refund" in (index.search("refund in the stripe", 1)[0]["name"])
    )
    # More of the question's words beat one word many times.
    assert index.search("slack list channels", 1)[0]["name"] == "slack__list_channels"
    # A prefix, and a word whose stem is a tool's word.
    assert (
        index.search("subscr", 1)[0]["name"].startswith("stripe__")
        and "subscription" in (index.search("subscr", 1)[0]["name"])
    )
    orders = sdk.ToolIndex([Tool("get_order", print), Tool("get_user", print), Tool("list_orderings", print)])
    assert [hit["name"] for hit in orders.search("orders")] == ["get_order"]
    assert index.search("zzzz") == []


def test_the_index_is_shared_by_the_runs_of_one_tool_set(runtime):
    from nous_sched.sdk import discovery

    tools = api_tools(200)
    first = discovery.shared_index(tools)
    assert discovery.shared_index(list(tools)) is first
    assert discovery.shared_index(tools[:100]) is not first
    result = run_code('return (await sdk.search("github issue", 1))[0].name;', tools, description="search")
    assert result.ok and result.result.startswith("github__")


def test_the_manuals_table_is_what_the_tools_give():
    page = (pathlib.Path(__file__).parent.parent / "docs" / "tools.rst").read_text()
    assert size_table() in page, "the SDK's sizes changed: paste `python tests/toolsets.py` into docs/tools.rst"


def test_a_ranked_name_cannot_end_its_comment_early():
    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "y" * 100} for i in range(20)}}
    tools = [Tool("a\u2028b", print), Tool("c\nd", print), Tool("x", print, description="y" * 2_000, parameters=big)]
    text = _steps.fitted(tools, "typescript", 1_100, [t.name for t in tools])
    assert sdk.step_of(text) == "search"
    assert '// Most relevant: "a\\u2028b", "c\\nd", "x".\n' in text
    check_typescript(text)
    python = _steps.fitted(tools, "python", 1_100, [t.name for t in tools])
    assert '# Most relevant: "a\\u2028b", "c\\nd", "x".\n' in python
    compile(python, "<sdk>", "exec")


# --- the pure parts, driven by hypothesis ------------------------------------------------

names = st.lists(
    st.text(alphabet="ab_:.Z/-x", min_size=1, max_size=10) | st.sampled_from(["gh__a", "gh__b", "getX", "get_y"]),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(names, st.randoms())
def test_every_name_is_counted_once_whatever_the_order(listed, rnd):
    groups, alone = group_names(listed, _render.split_words)
    assert sum(group.count for group in groups) + alone == len(set(listed))
    assert all(group.count >= 2 for group in groups)
    assert [group.prefix for group in groups] == sorted(group.prefix for group in groups)
    for group in groups:
        assert sum(name.startswith(group.prefix) for name in set(listed)) >= group.count
    shuffled = list(listed)
    rnd.shuffle(shuffled)
    assert group_names(shuffled, _render.split_words) == (groups, alone)


words = st.lists(st.sampled_from(["get", "issue", "issues", "list", "pull", "a", "stripe", "refund"]), max_size=6)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(words, words, words), max_size=20), words, st.integers(1, 5))
def test_ranking_returns_only_matches_best_first_within_the_limit(documents, terms, limit):
    index = WordIndex(documents)
    terms = list(dict.fromkeys(terms))
    ranked = index.rank(terms, limit)
    assert len(ranked) <= limit and len(set(ranked)) == len(ranked)
    for doc in ranked:
        loose = {w for field in documents[doc] for w in field for t in terms if w.startswith(t) or t.startswith(w)}
        assert loose, (doc, terms)
    # A document with every field empty never ranks.
    assert all(any(documents[doc]) for doc in ranked)
    assert index.rank(terms, limit) == ranked

"""Private: the SDK within a budget, the first of :data:`~nous_sched.sdk.STEPS` that fits.

:func:`render` checks its options and asks each step in turn (``full``: every
tool declared; ``lines`` and ``names``: one line per tool; ``groups``: counts
by name prefix; ``search``: none listed, how to ask ``sdk``); each step's text
is written by the language renderers of :mod:`nous_sched.sdk._render`.
"""

from __future__ import annotations

import json
import re
import textwrap
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, Optional

from .. import _validators as v
from ..tooling import Tool
from ._render import (
    DISCOVERY_GLOBAL,
    GLOBAL,
    MIN_BUDGET,
    PY_HEADER,
    PY_IMPORTS,
    STEPS,
    TS_ANY,
    TS_HEADER,
    compact_comment,
    literal,
    one_line,
    render_python,
    render_typescript,
    require_language,
    split_words,
    unique_sorted,
)
from ._tool_groups import group_names

__all__ = ["render", "step_of", "fitted", "RANKED_NAMES", "BUDGET_RULE", "RANKING_RULE", "SDK_TEXTS"]

#: ``render``'s and ``run_code_tool``'s check of ``budget``.
BUDGET_RULE = v.optional(v.int_at_least(MIN_BUDGET, f"a number of characters of at least {MIN_BUDGET:,}"))
RANKING_RULE = v.optional(
    v.Check(
        "a list or tuple of tool names (str), most relevant first",
        lambda value: isinstance(value, (list, tuple)) and all(isinstance(name, str) for name in value),
    )
)


def render(
    tools: Iterable[Any],
    language: str = "typescript",
    *,
    budget: Optional[int] = None,
    ranking: Optional[Sequence[str]] = None,
) -> str:
    """Render the SDK declaring ``tools``.

    A tool is any object with ``name``, ``description`` and ``parameters`` (a
    JSON Schema mapping or ``None``), and optionally ``returns`` (the JSON
    Schema of its result). Tools whose name is not a non-empty string are
    skipped; of several with one name the first wins. The output depends only
    on the resulting set of tools (and ``ranking``), never on their order,
    and is identical on every call.

    ``budget`` (characters, at least :data:`MIN_BUDGET`, or ``None`` for no
    limit): the text is never longer. It is the first of the :data:`STEPS`
    that fits (see the module docstring), and says which one it is.

    ``ranking`` (tool names, most relevant first; optional): the last step,
    which lists no tools, names the first few of them that are in ``tools``.

    Never raises on a schema; raises :class:`~nous_sched.errors.ConfigError`
    for an unknown ``language``, a ``budget`` that is not an int of at least
    :data:`MIN_BUDGET`, or a ``ranking`` that is not a sequence of strings.
    """
    lang = require_language("render", language)
    v.require("render", "budget", budget, BUDGET_RULE)
    v.require("render", "ranking", ranking, RANKING_RULE)
    return fitted(tools, lang, budget, ranking or ())


def fitted(tools: Iterable[Any], lang: str, budget: Optional[int], ranking: Sequence[str]) -> str:
    """:func:`render` after its checks; ``budget`` may be smaller than :data:`MIN_BUDGET` by ``run_code``'s own words.

    The last step without ranked names is under 1,000 characters for any tool
    count (a test holds it to ``MIN_BUDGET`` less ``run_code``'s words).

    A text is made once per tool set: the same :class:`~nous_sched.Tool`
    objects (frozen values, by identity, in the same order) with the same
    language, budget and ranking give the kept text (the last
    :data:`SDK_TEXTS`), equal to a fresh one; a set holding anything but
    ``Tool`` objects is rendered every time.
    """
    tools = tuple(tools)
    # Only Tools are frozen values: any other object may change, and is rendered afresh.
    kept = all(type(tool) is Tool for tool in tools)
    key = (tuple(map(id, tools)), lang, budget, tuple(ranking))
    if kept:
        with _texts_lock:
            hit = _texts.get(key)
            if hit is not None:
                _texts.move_to_end(key)
                return hit[1]
    text = _fitted(tools, lang, budget, ranking)
    if kept:
        with _texts_lock:
            _texts[key] = (tools, text)
            while len(_texts) > SDK_TEXTS:
                _texts.popitem(last=False)
    return text


#: How many SDK texts :func:`fitted` keeps, each with its tools (a text is at most its budget,
#: or its tools' full declarations without one).
SDK_TEXTS = 16
_texts_lock = threading.Lock()  # guards _texts
# (ids of the tools in order, language, budget, ranking) -> (the tools, held so no id is reused; the text)
_texts: OrderedDict[tuple[Any, ...], tuple[tuple[Any, ...], str]] = OrderedDict()


def _fitted(tools: Iterable[Any], lang: str, budget: Optional[int], ranking: Sequence[str]) -> str:
    ordered = unique_sorted(tools)
    for step in STEPS:
        text = _render_step(step, ordered, lang, ranking, budget)
        if text is not None and (budget is None or len(text) <= budget):
            return text
    raise AssertionError(f"the last step is longer than {budget}")  # pragma: no cover: tests hold every count


def step_of(text: str) -> Optional[str]:
    """The step (one of :data:`STEPS`) a text :func:`render` returned says it is, or ``None``."""
    found = _STEP_LINE.search(text)
    return found.group(1) if found else None


# --- Steps: an SDK within its budget -------------------------------------------------


def _render_step(step: str, tools: list[Any], lang: str, ranking: Sequence[str], budget: Optional[int]) -> str | None:
    """``step``'s text for ``tools``, or ``None`` when the step has nothing to show for them."""
    python = lang == "python"
    if step == "full":
        note = _note(python, [_step_line("full", "every tool is declared in full below.")])
        return render_python(tools, note=note) if python else render_typescript(tools, note=note)
    if step in ("lines", "names"):
        comments = [compact_comment(tool, args=step == "lines") for tool in tools]
        if python:
            rows = [
                f"    {literal(t.name)}: Callable[[Any], Any],  # {c}" for t, c in zip(tools, comments, strict=True)
            ]
        else:
            rows = [
                f"  {literal(t.name)}(args: object): Promise<{TS_ANY}>; // {c}"
                for t, c in zip(tools, comments, strict=True)
            ]
        return _listed(python, step, rows)
    if step == "groups":
        return _grouped(tools, python, budget)
    return _searched(tools, python, ranking, budget)


_HOW_TO_ASK_TS = [
    "",
    f'    return await {DISCOVERY_GLOBAL}.search("words");          // [{{ name, summary, args }}], best first',
    f'    return await {DISCOVERY_GLOBAL}.describe("<tool name>");  // one tool\'s full declaration',
    "",
]
_HOW_TO_ASK_PY = [
    "",
    f'    return {DISCOVERY_GLOBAL}.search("words")          # [{{name, summary, args}}], best first',
    f'    return {DISCOVERY_GLOBAL}.describe("<tool name>")  # one tool\'s full declaration',
    "",
]
_ASK_FIRST = (
    "Before calling a tool, read its full declaration: return it from a program, then write the next program with it."
)
_LISTED_NOTES = {
    "lines": "the tool set is large, so each tool below is listed in one line: its name, what it does and its "
    'argument names ("?" marks an optional one). ' + _ASK_FIRST,
    "names": "the tool set is large, so each tool below is listed in one line: its name and what it does. "
    + _ASK_FIRST,
}
_STEP_LINE = re.compile(r'^(?://|#) SDK step "([a-z]+)"', re.MULTILINE)
#: How many of a ``ranking``'s names the last step shows at most.
RANKED_NAMES = 8
#: How many of a group's words its line shows at most.
_GROUP_WORDS = 6
_INDEX_SIGNATURE = f"  [name: string]: (args: object) => Promise<{TS_ANY}>;"


def _step_line(step: str, text: str) -> str:
    return f'SDK step "{step}": {text}'


def _note(python: bool, paragraphs: list[str], *, ask: bool = False, after: tuple[str, ...] = ()) -> str:
    """Comment lines: ``paragraphs`` wrapped to 78 columns, how to ask ``sdk`` if ``ask``, then ``after``."""
    mark = "#" if python else "//"

    def wrapped(paragraph: str) -> list[str]:
        width = 78 - len(mark) - 1
        return [
            f"{mark} {row}" for row in textwrap.wrap(paragraph, width, break_long_words=False, break_on_hyphens=False)
        ]

    rows = [mark, *(row for paragraph in paragraphs for row in wrapped(paragraph))]
    if ask:
        rows.extend(f"{mark} {row}".rstrip() for row in (_HOW_TO_ASK_PY if python else _HOW_TO_ASK_TS))
    for paragraph in after:
        rows.extend([*wrapped(paragraph), mark])
    return "\n".join(rows) + "\n"


def _listed(python: bool, step: str, rows: list[str]) -> str:
    note = _note(python, [_step_line(step, _LISTED_NOTES[step])], ask=True)
    body = "\n" + "\n".join(rows) + "\n" if rows else ""
    if python:
        return f'{PY_HEADER}{note}{PY_IMPORTS}\n\nTools = TypedDict("Tools", {{{body}}})\n\n{GLOBAL}: Tools\n'
    return f"{TS_HEADER}{note}\ndeclare const {GLOBAL}: {{{body}}};\n"


def _open_ended(python: bool, note: str, comments: list[str]) -> str:
    """An SDK that declares ``tools`` as indexed by any name, with ``comments`` inside the declaration."""
    if python:
        listed = "".join(f"# {row}\n" for row in comments) + ("\n" if comments else "")
        imports = "\nfrom typing import Any, Callable\n"
        return f"{PY_HEADER}{note}{imports}\n{listed}Tools = dict[str, Callable[[Any], Any]]\n\n{GLOBAL}: Tools\n"
    listed = "".join(f"  // {row}\n" for row in comments)
    return f"{TS_HEADER}{note}\ndeclare const {GLOBAL}: {{\n{listed}{_INDEX_SIGNATURE}\n}};\n"


def _grouped(tools: list[Any], python: bool, budget: Optional[int]) -> str | None:
    groups, alone = group_names((tool.name for tool in tools), split_words)
    if not groups:
        return None
    count = len(tools)
    text = (
        f"{count:,} tools, too many to list, so below they are counted by the prefix of their names, with the "
        "words those names use most. Find a tool by what it does, read its full declaration, then call it in "
        "the next program:"
    )
    note = _note(python, [_step_line("groups", text)], ask=True)
    # Fewer words per group before giving the step up: the counts are what matters.
    for shown in (_GROUP_WORDS, 3, 0):
        rows = []
        for group in groups:
            words = group.words[:shown]
            more = ", ..." if len(group.words) > shown else ""
            about = f" ({', '.join(words)}{more})" if words else ""
            rows.append(one_line(f"{group.prefix}*: {group.count:,} tools{about}"))
        if alone:
            rows.append(f"{alone:,} other tool{'s' if alone != 1 else ''}")
        text = _open_ended(python, note, rows)
        if budget is None or len(text) <= budget:
            break
    return text


def _searched(tools: list[Any], python: bool, ranking: Sequence[str], budget: Optional[int]) -> str:
    count = len(tools)
    many = f"{count:,} tools, too many to list here" if count >= 10 else f"{count} tool(s), too long to declare here"
    text = f"{many}. Find a tool by what it does, read its full declaration, then call it in the next program:"
    paragraphs = [_step_line("search", text)]
    note = _note(python, paragraphs, ask=True)
    plain = _open_ended(python, note, [])
    known = {tool.name for tool in tools}
    # ASCII JSON: exact, and no line separator in a name can end the comment early.
    names = [json.dumps(name) for name in dict.fromkeys(ranking) if name in known][:RANKED_NAMES]
    # As many of the ranked names as the budget leaves room for.
    while names:
        ranked = _note(python, paragraphs, ask=True, after=(f"Most relevant: {', '.join(names)}.",))
        text = _open_ended(python, ranked, [])
        if budget is None or len(text) <= budget:
            return text
        names.pop()
    return plain

"""A gate that has admitted a tool before checks its later calls exactly as it checked the first.

The gate decides what a tool's name alone decides (granted, a plain tool,
callers) once per tool, so a Promise.all of a thousand calls is checked in
one frame each (``Gate.admit_json``). Every call still passes every check:
here each case's call is made twice over, by a gate that has just admitted
the same tool ("warm") and by a gate that has never seen it ("cold", brought
to the same budget), and the two must give the same answer, the same audit
and the same budget after. The expected refusals are spelled out as well.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest

from nous_sched import BlobStore, Limits, Tool
from nous_sched.gate import Gate
from nous_sched.gate._gate import BUDGET_SPENT, Admitted
from nous_sched.gate.dispatch import RUN_OVER
from nous_sched.outcome import Outcome

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "additionalProperties": False}


def noop(args: dict[str, Any]) -> None:
    return None


PLAIN = Tool("noop", noop)
TYPED = Tool("typed", noop, parameters=SCHEMA)
MODEL_ONLY = Tool("model_only", noop, callers={"model"})
KEYED = {"type": "object", "properties": {"q": {"type": "string"}, "key": {"type": "string"}}}
BOUND = Tool("keyed", noop, parameters=KEYED, bound={"key": "s"})
TOOLS = {tool.name: tool for tool in (PLAIN, TYPED, MODEL_ONLY, BOUND)}


def make(limits: Limits, **extra: Any) -> Gate:
    gate = Gate(dict(TOOLS), {"banned": Tool("banned", noop)}, limits, time.monotonic() + 600)
    for name, value in extra.items():
        setattr(gate, name, value)
    return gate


def answer(outcome: Any) -> tuple[Any, ...]:
    if type(outcome) is Admitted:
        return ("admitted", outcome.tool.name, outcome.args, outcome.text)
    assert isinstance(outcome, Outcome) and outcome.error is not None
    return ("refused", outcome.error.tool, outcome.error.message)


def both(
    limits: Limits, name: Any, first: str, then: str, setup: Callable[[Gate], None] = lambda gate: None
) -> tuple[Any, ...]:
    """The answer to ``then`` (a call of ``name``) from a warm gate and a cold one; asserts they agree."""
    warm = make(limits)
    primed = warm.admit_json(name, first)
    assert type(primed) is Admitted, primed
    cold = make(limits)
    cold.calls, cold.args_bytes = warm.calls, warm.args_bytes
    answers = []
    for gate in (warm, cold):
        setup(gate)
        before = len(gate.refused)
        answers.append((answer(gate.admit_json(name, then)), gate.calls, gate.args_bytes, gate.refused[before:]))
    assert answers[0] == answers[1]
    return answers[0][0]  # type: ignore[no-any-return]


ROOMY = Limits(max_calls=10)


def test_a_warm_gate_admits_as_a_cold_one() -> None:
    assert both(ROOMY, "noop", "{}", '{"a":[1,"é"]}') == ("admitted", "noop", {"a": [1, "é"]}, '{"a":[1,"é"]}')
    assert both(ROOMY, "typed", '{"n":1}', '{"n":2}') == ("admitted", "typed", {"n": 2}, '{"n":2}')
    # `null` is no arguments: {} and no text standing for them.
    assert both(ROOMY, "noop", "{}", "null") == ("admitted", "noop", {}, None)


@pytest.mark.parametrize(
    ("limits", "name", "then", "setup", "expected"),
    [
        (Limits(max_calls=1), "noop", "{}", None, BUDGET_SPENT.format(n=1)),
        (ROOMY, "noop", "{}", lambda gate: setattr(gate, "deadline", time.monotonic() - 1), RUN_OVER),
        (Limits(max_args_bytes=8), "noop", '{"a":"xyz"}', None, "over the limit of 8 for one call"),
        # UTF-8 bytes, not characters: 7 characters, 9 bytes.
        (Limits(max_args_bytes=8), "noop", '{"é":"é"}', None, "arguments are 11 bytes of JSON"),
        (Limits(max_total_args_bytes=10), "noop", '{"a":1234}', None, "sent 2 bytes of arguments in all"),
        (ROOMY, "noop", '{"a":1e400}', None, "arguments cannot cross"),
        (ROOMY, "noop", '{"a":9007199254740993}', None, "arguments cannot cross"),
        (ROOMY, "noop", "[1]", None, "arguments must be an object, got [1]"),
        (ROOMY, "noop", '"text"', None, 'arguments must be an object, got "text"'),
        (ROOMY, "typed", '{"n":"one"}', None, "n"),
        (ROOMY, "typed", '{"m":1}', None, "m"),
        (ROOMY, "noop", 7, None, "arguments must be a JSON object"),
        (ROOMY, "noop", "{}", lambda gate: gate.granted.pop("noop"), 'unknown tool "noop"'),
        (ROOMY, "noop", '{"b":{"$blob":"nope"}}', lambda gate: setattr(gate, "blobs", BlobStore(64)), "nope"),
    ],
)
def test_a_warm_gate_refuses_as_a_cold_one(limits: Limits, name: str, then: Any, setup: Any, expected: str) -> None:
    first = '{"n":1}' if name == "typed" else "{}"
    said = both(limits, name, first, then, setup or (lambda gate: None))
    assert said[0] == "refused" and said[1] == name and expected in said[2], said


def test_the_calls_a_name_alone_refuses_are_refused_every_time() -> None:
    """Tools the warm path never takes: one this caller may not call, one with bound arguments."""
    gate = make(Limits(max_calls=20))
    for _ in range(3):
        said = answer(gate.admit_json("model_only", "{}"))
        assert said[0] == "refused" and "may be called only by the model" in said[2]
        said = answer(gate.admit_json("keyed", '{"q":"x","key":"mine"}'))
        assert said[0] == "refused" and "key" in said[2]
        admitted = gate.admit_json("keyed", '{"q":"x"}')
        assert type(admitted) is Admitted and admitted.args == {"q": "x", "key": "[bound]"}
        said = answer(gate.admit_json("banned", "{}"))
        assert said == ("refused", "banned", 'tool "banned" is denied by the permission policy')
    assert gate.calls == 12
    assert len(gate.refused) == 9


def test_every_call_counts_once_whichever_way_it_is_checked() -> None:
    """The budget and the bytes after a mix of admitted and refused calls of a warm tool."""
    gate = make(Limits(max_calls=6))
    texts = ["{}", '{"a":1}', "[1]", '{"a":1e400}', "{}", "{}", "{}"]
    said = [answer(gate.admit_json("noop", text))[0] for text in texts]
    assert said == ["admitted", "admitted", "refused", "refused", "admitted", "admitted", "refused"]
    assert gate.calls == 7
    # Every text within the size limits is counted, a refused one too (the budget's rule); the
    # seventh was refused for the call budget, before its size was looked at.
    assert gate.args_bytes == sum(len(text) for text in texts[:6])


def test_a_warm_gate_hands_a_blob_handle_on_as_a_cold_one() -> None:
    """In a run with a blob store a handle becomes its value (the text stays as written), and text
    without one is the arguments as they are."""
    store = BlobStore(4096)
    _, _, made = store.hold("y" * 5000, '"' + "y" * 5000 + '"')
    handle = '{"b":{"$blob":"' + made[0].id + '"}}'

    def with_store(gate: Gate) -> None:
        gate.blobs = store

    assert both(ROOMY, "noop", "{}", handle, with_store) == ("admitted", "noop", {"b": "y" * 5000}, handle)
    assert both(ROOMY, "noop", "{}", '{"c":2}', with_store) == ("admitted", "noop", {"c": 2}, '{"c":2}')

"""The worker's reading of a settle frame (``worker.settle_items``): every
call the host's frame carries, in order, with its id, its ok flag and its
payload exactly as sent, whatever the payloads hold (spaces, non-ASCII,
digits right after a payload, empty text), and a malformed body refused
with ``ValueError`` as before, never read as other calls."""

from __future__ import annotations

import json
import random

import pytest

from nous_sched.runtime import worker
from nous_sched.runtime._remote import settle_frame


def _reference(body: bytes) -> list[tuple[int, None, None, bool, str]]:
    """The frame's grammar read one field at a time (what the worker did before)."""
    items = []
    at = 0
    while at < len(body):
        first = body.index(b" ", at)
        second = body.index(b" ", first + 1)
        third = body.index(b" ", second + 1)
        stop = third + 1 + int(body[second + 1 : third])
        if stop > len(body):
            raise ValueError("a settle frame cut short")
        payload = body[third + 1 : stop].decode("utf-8", "surrogatepass")
        items.append((int(body[at:first]), None, None, body[first + 1 : second] == b"1", payload))
        at = stop
    return items


def _body(batch: list[tuple[int, None, None, bool, str]]) -> bytes:
    frame = settle_frame(batch)
    assert frame[4:5] == worker.SETTLE
    return frame[5:]


PAYLOADS = [
    "null",
    "1",
    "12345",
    "",
    '"a b"',
    '" "',
    '"  two  spaces  "',
    '{"tool": "t", "message": "no such thing"}',
    '"1 1 4 null"',
    "[1, 2, 3]",
    '"caf\\u00e9"',
    '"café"',
    '"\\ud800"',
    "x" * 300,
    '"' + "y " * 200 + '"',
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_each_payload_crosses_as_sent_alone_first_and_last(payload):
    for batch in (
        [(7, None, None, True, payload), (8, None, None, False, "null")],
        [(7, None, None, True, "null"), (8, None, None, False, payload)],
        [(7, None, None, False, "1"), (8, None, None, True, payload), (9, None, None, True, "2")],
    ):
        assert worker.settle_items(_body(batch)) == batch


def test_a_batch_of_many_calls_reads_back_in_order():
    rng = random.Random(44)
    for _ in range(300):
        batch = [
            (rng.randrange(1, 10**6), None, None, rng.random() < 0.8, rng.choice(PAYLOADS))
            for _ in range(rng.randrange(1, 40))
        ]
        body = _body(batch)
        assert worker.settle_items(body) == batch == _reference(body)


def test_a_payload_followed_by_digits_keeps_its_length():
    # The next call's id follows the payload with no space: "12" then "34" is
    # a payload "12" and an id 34, never a payload "1234".
    batch = [(1, None, None, True, "12"), (34, None, None, True, "5"), (6, None, None, True, "789")]
    body = _body(batch)
    assert body == b"1 1 2 1234 1 1 56 1 3 789"
    assert worker.settle_items(body) == batch


@pytest.mark.parametrize(
    "body",
    [
        b"1 1 4 nul",  # cut short
        b"1 1 4 null2",  # a call with no fields after its id
        b"1 1 4 null ",  # a space after the last payload
        b"1 1 4 null 2 1 4 null",  # a space between two calls
        b"1 1 x null",  # a length that is not a number
        b"a 1 4 null",  # an id that is not a number
        b"1 1 4 null2 1 9 null",  # the last length past the end
        b"1 1 4",  # no payload at all
    ],
)
def test_a_malformed_body_is_refused(body):
    with pytest.raises(ValueError):
        _reference(body)
    with pytest.raises(ValueError):
        worker.settle_items(body)


@pytest.mark.parametrize("body", [b"", b"5 0 0 ", b"5 1 4 null6 0 0 ", b"1 1 -1 null2 1 4 null"])
def test_an_edge_body_reads_as_the_grammar_says(body):
    try:
        expected = _reference(body)
    except ValueError:
        with pytest.raises(ValueError):
            worker.settle_items(body)
    else:
        assert worker.settle_items(body) == expected


def test_a_long_or_non_ascii_frame_is_read_call_by_call_the_same():
    batch = [(1, None, None, True, json.dumps("é" * 50, ensure_ascii=False)), (2, None, None, True, "null")]
    assert worker.settle_items(_body(batch)) == batch
    big = [(1, None, None, True, '"' + "z" * (70 * 1024) + '"'), (2, None, None, False, "3")]
    assert worker.settle_items(_body(big)) == big

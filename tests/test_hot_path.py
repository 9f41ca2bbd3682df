"""The hot path's promises: what the fast paths must never change.

Each test checks behaviour, never timing: the costs themselves are measured by
hand in ``benchmarks/`` (see ``benchmarks/README.rst``).
"""

from __future__ import annotations

import json
import time

from nous_sched import Limits
from nous_sched.runtime.engine import Engine


def _main_of(text: str):
    return json.loads(text)["main"]


def test_a_result_returned_while_calls_are_outstanding_crosses_once():
    # The program returns while two calls it started are still outstanding:
    # the envelope that first carries the result is the only one that does.
    program = "tools.a({}); tools.a({}); return 'x'.repeat(1000);"
    engine = Engine(program, ["a"], Limits(), time.monotonic() + 30)
    try:
        first = json.loads(engine.start())
        assert [c[0] for c in first["calls"]] == [1, 2]
        assert first["main"] is not None and first["main"]["state"] == "fulfilled"
        assert _main_of(engine.settle(1, True, "null")) is None
        assert _main_of(engine.settle(2, True, "null")) is None
    finally:
        engine.close()

"""A suspended run's answer within its output budget (issue 34, item 7): the
check and the cases, for any test to reuse (tests/test_durable_budget.py, and
a row of the hostile-value matrix).

    sys.path.insert(0, os.path.join(TESTS, "durable"))  # as tests/test_durable_budget.py does
    from suspended_budget import CASES, check_suspended_answer, suspend_case

    store = nous_sched.SqliteApprovalStore(str(tmp_path / "approvals.db"))
    for name in CASES:  # one matrix row each
        check_suspended_answer(suspend_case(name, store, 2000), 2000, pending=CASES[name][1])

No tool runs (every case suspends at its first gated call), so no count file is needed.

``check_suspended_answer`` asserts what a model reads of a suspended run: at
most ``budget`` bytes of UTF-8 (a lone surrogate counted as its 6-byte
escape), the suspension and its token there whole (never an error, never
``cancelled``), each pending call shown with its seq and tool or counted in
``"… N more items"``, and the usage ledger saying those sizes.
"""

import json
import re

import durable_tools

import nous_sched

#: Programs that suspend at ``pay`` (tests/durable/durable_tools.py), each with its number of pending calls.
CASES = {
    # Four gated calls, each with 200,000 characters of arguments: 800,000 characters unbudgeted.
    "four-huge-arguments": (
        'const big = "x".repeat(200000);\nreturn await Promise.all([0, 1, 2, 3].map(i => tools.pay({i, memo: big})));',
        4,
    ),
    # 300 log lines, then a suspension: the cut once dropped the suspension and said "cancelled".
    "300-log-lines": (
        'for (let i = 0; i < 300; i++) console.log("line " + i + " " + "y".repeat(60));\n'
        'return await tools.pay({to: "alice", amount: 20});',
        1,
    ),
    # Arguments and logs of astral characters, a lone surrogate, bidi and tag characters, NUL.
    "hostile-text": (
        'const odd = "\\u{1F600}".repeat(30000) + "\\ud800\\u202e\\u{E0041}\\u0000";\n'
        "for (let i = 0; i < 50; i++) console.log(odd.slice(0, 500));\n"
        "return await Promise.all([tools.pay({memo: odd}), tools.pay({[odd.slice(0, 900)]: 1})]);",
        2,
    ),
    # Many gated calls at once: more than their seqs and tools alone can show in a small budget.
    "many-pending": ("return await Promise.all(Array.from({length: 60}, (_, i) => tools.pay({i})));", 60),
}

_ITEMS = re.compile(r"^… ([\d,]+) more items$")


def utf8_bytes(text):
    """What the output budget bounds, counted here on its own: UTF-8, a lone surrogate as ``\\udXXX``."""
    return sum(6 if 0xD800 <= ord(c) <= 0xDFFF else len(c.encode("utf-8")) for c in text)


def suspend_case(name, store, budget, **options):
    """Run case ``name`` with ``approval_store=store`` and ``output_budget=budget``: its result."""
    program, _ = CASES[name]
    options.setdefault("description", f"suspended answer case {name}")
    return nous_sched.run_code(program, durable_tools.TOOLS, approval_store=store, output_budget=budget, **options)


def check_suspended_answer(result, budget, pending=None):
    """Assert ``result.for_model()`` is a suspension within ``budget`` bytes that carries its token; return it."""
    assert result.suspended is not None, result.error
    assert result.error is None
    answer = result.for_model()
    text = json.dumps(answer, ensure_ascii=False)
    assert utf8_bytes(text) <= budget, (utf8_bytes(text), budget)
    assert json.loads(text) == answer
    assert set(answer) == {"logs", "suspended"}  # never an error: not "cancelled"
    shown = answer["suspended"]
    assert shown["token"] == result.suspended.token
    assert shown["expires_at"] == result.suspended.expires_at
    requests = result.suspended.pending
    if pending is not None:
        assert len(requests) == pending
    calls = [p for p in shown["pending"] if isinstance(p, dict)]
    assert [(p["seq"], p["tool"]) for p in calls] == [(r.seq, r.tool) for r in requests[: len(calls)]]
    if len(calls) < len(requests):
        m = _ITEMS.match(shown["pending"][-1])
        assert m and int(m.group(1).replace(",", "")) == len(requests) - len(calls), shown["pending"]
    else:
        assert len(shown["pending"]) == len(requests)
    assert result.usage.model_bytes == utf8_bytes(text)
    assert result.usage.answer_bytes == utf8_bytes(json.dumps(result.to_dict(), ensure_ascii=False))
    return answer

"""Both built-in runtimes keep the runtime contract (``tests/runtime_contract.py``):
each check, once per runtime."""

from __future__ import annotations

import pytest
from runtime_contract import CHECKS

from nous_sched import CodeRuntime, QuickJSRuntime, WorkerPool


@pytest.fixture(scope="module", params=["worker", "in_process"])
def contract_runtime(request):
    if request.param == "in_process":
        yield QuickJSRuntime()
        return
    pool = WorkerPool(size=4)
    yield pool
    pool.close()


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_runtime_contract(contract_runtime: CodeRuntime, check) -> None:
    check(contract_runtime)


def test_the_contract_covers_each_host_capability():
    # A capability the Host declares that no check exercises is a promise no one keeps.
    import inspect

    from nous_sched.runtime import Host

    source = inspect.getsource(__import__("runtime_contract"))
    declared = [n for n, f in vars(Host).items() if callable(f) and not n.startswith("_")]
    assert sorted(declared) == sorted(
        [
            "call",
            "call_json",
            "batch",
            "discover",
            "on_logs",
            "on_settled",
            "on_main",
            "clock",
            "sites",
            "attach_reader",
            "when_begun",
        ]
    )
    for name in declared:
        if name != "call":  # the default: call_json with the arguments encoded
            assert f"def {name}(" in source, name

"""A call whose arguments hold a Promise (a call the program forgot to await)
is refused in the sandbox with the Promise's path; arguments that hold none,
the usual ``{}`` among them, cross as they are. The prelude looks at the
arguments themselves and the converter inside them, in one order, so a
Proxy's traps run once each, whatever the arguments."""

from __future__ import annotations

import pytest

from nous_sched import Limits, Tool, run_code

REFUSED = "is a Promise, not a value: a call whose result was not awaited; write `await` before that call"


def _echo(args):
    return args


TOOLS = [Tool("echo", _echo), Tool("slow", lambda args: 1)]


def _run(program: str):
    result = run_code(program, TOOLS, limits=Limits(timeout=20), description="test")
    assert result.error is None, result.error
    return result.result


@pytest.mark.parametrize(
    ("args", "path"),
    [
        ("p", "$"),
        ("[1, p]", "$[1]"),
        ("{a: {b: p}}", "$.a.b"),
        ('{"x y": [p]}', '$["x y"][0]'),
        ("Object.assign(Object.create(null), {n: p})", "$.n"),
        # (Each crosses as {}: a key whose Promise has a toJSON giving nothing still counts.)
        ("{q: Object.assign(tools.slow({}), {toJSON() { return undefined; }})}", "$.q"),
    ],
)
def test_a_promise_in_a_calls_arguments_is_refused_with_its_path(runtime, args, path):
    program = f"""
const p = tools.slow({{}});
try {{ await tools.echo({args}); return "crossed"; }} catch (e) {{ await p; return e.message; }}
"""
    assert _run(program) == f"argument {path} {REFUSED}"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ("{}", {}),
        ("Object.create(null)", {}),
        ("{a: undefined}", {}),
        ("{a: {}}", {"a": {}}),
        ("new Map()", {}),
    ],
)
def test_arguments_that_hold_no_promise_cross(runtime, args, expected):
    assert _run(f"return await tools.echo({args});") == expected


def test_a_proxys_traps_run_once_each_in_order_for_its_arguments(runtime):
    # JSON.stringify's look first, then the Promise check's: its prototype, then its keys.
    program = """
const seen = [];
const handler = {};
for (const trap of ["getPrototypeOf", "ownKeys", "getOwnPropertyDescriptor", "get", "has"]) {
  handler[trap] = (...args) => { seen.push(trap); return Reflect[trap](...args); };
}
await tools.echo(new Proxy({}, handler));
return seen;
"""
    assert _run(program) == ["get", "ownKeys", "getPrototypeOf", "ownKeys"]

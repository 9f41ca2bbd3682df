"""The floor: the least a bridge with nous_sched's semantics can cost.

A minimal QuickJS bridge, written here so the benchmarks can measure it beside
``run_code`` (the probe's "Variant B"): a fresh ``quickjs.Context`` per run,
the program as the body of an async function, tool calls pushed to a JS
outbox as ``[id, name, argsJson]`` (the arguments stringified at the call, so
a later mutation cannot change them), one drain per step returning JSON text,
each call handed to an executor (one thread hop there and back), and the
*oldest* outstanding call settled first, whatever order they finish in, so
the program sees one deterministic order. A run ends when the program has
settled and every call it started has been settled.

Nothing else: no limits, no scheduler or driver thread, no audit events, no
policy, no snapshots, no logs. What ``run_code`` costs above this is what its
guarantees and its bookkeeping cost.

It is built to be cheap where that is free: arguments are spliced into the
drained JSON as they are (parsed once, by the C parser), and the program's
result is sent once.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
from typing import Any, Callable, Mapping, Optional

import quickjs

PRELUDE = r"""
var __outbox = [], __next = 0, __pending = new Map(), __main = null;
function __call(name, argsJson) {
  var id = ++__next;
  __outbox.push(["[", id, ",", JSON.stringify(name), ",", argsJson, "]"].join(""));
  return new Promise(function (res, rej) { __pending.set(id, [res, rej]); });
}
var tools = new Proxy({}, { get: function (_, name) {
  return function (args) { return __call(String(name), JSON.stringify(args === undefined ? null : args)); };
} });
function __run(fn) {
  fn().then(
    function (v) { __main = ["[true,", JSON.stringify(v === undefined ? null : v), "]"].join(""); },
    function (e) { __main = ["[false,", JSON.stringify(String(e)), "]"].join(""); });
}
function __drain() {
  var main = __main;
  __main = null;
  // join, not +: quickjs-ng makes long concatenations ropes, which the binding cannot return.
  var out = ["[", main === null ? "null" : main, ",[", __outbox.join(","), "]]"].join("");
  __outbox = [];
  return out;
}
function __settle(id, ok, payload) {
  var p = __pending.get(id);
  __pending.delete(id);
  if (ok) p[0](JSON.parse(payload)); else p[1](new Error(payload));
}
"""

_dumps = json.JSONEncoder().encode


class FloorError(Exception):
    """The program threw, or waits on a promise nothing will settle."""


def run(
    program: str,
    tools: Mapping[str, Callable[[Any], Any]],
    executor: Optional[concurrent.futures.Executor] = None,
) -> Any:
    """Run ``program`` (an async function body) and return its JSON result.

    ``tools[name](args)`` runs on ``executor`` (a fresh ``ThreadPoolExecutor(10)``
    per run when ``None``, as ``run_code`` makes a private one).
    """
    if executor is not None:
        return _run(program, tools, executor)
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        return _run(program, tools, pool)


def _run(program: str, tools: Mapping[str, Callable[[Any], Any]], pool: concurrent.futures.Executor) -> Any:
    ctx = quickjs.Context()
    ctx.eval(PRELUDE)
    drain = ctx.get("__drain")
    settle = ctx.get("__settle")
    ctx.eval("__run(async function program() {" + program + "\n});")
    execute = ctx.execute_pending_job
    submit = pool.submit
    loads = json.loads
    outstanding: collections.deque[tuple[int, concurrent.futures.Future[Any]]] = collections.deque()
    main = None
    while True:
        while execute():
            pass
        settled, calls = loads(drain())
        if settled is not None:
            main = settled
        for call_id, name, args in calls:
            outstanding.append((call_id, submit(tools[name], args)))
        if not outstanding:
            break
        call_id, future = outstanding.popleft()  # ids grow: the left end is the oldest
        try:
            payload = _dumps(future.result())
        except Exception as exc:  # noqa: BLE001 - a failed call rejects its promise
            settle(call_id, False, str(exc))
        else:
            settle(call_id, True, payload)
    del drain, settle, ctx
    if main is None:
        raise FloorError("the program waits for a promise that nothing will settle")
    ok, value = main
    if not ok:
        raise FloorError(value)
    return value

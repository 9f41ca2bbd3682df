"""3. run_code bridge: what the JS <-> host bridge adds on top of the lane.

A JS program making N sequential ``await tools.noop({})`` calls, run by
``run_code``, against the same N calls through a ``Scheduler`` from Python
(``scheduler.call`` in a loop). Both sides include creating and stopping their
scheduler (and its private executor). Target: ratio at most 1.5; reported in
microseconds per call. Then ``Promise.all`` over 1,000 calls against Python
submitting 1,000 and waiting for each: reported.
"""

from __future__ import annotations

import time

import _common as c

from nous_sched import Outcome, Scheduler, Tool, run_code

TARGET = 1.5
_OK = Outcome.success(None)


def noop(args: dict) -> None:
    return None


TOOL = Tool("noop", noop, concurrency_safe=lambda args: True)

SEQUENTIAL_JS = """
for (let i = 0; i < {n}; i++) {{
  await tools.noop({{}});
}}
return {n};
"""

PROMISE_ALL_JS = """
const calls = [];
for (let i = 0; i < {n}; i++) calls.push(tools.noop({{}}));
const results = await Promise.all(calls);
return results.length;
"""


def js(program: str, n: int) -> float:
    code = program.format(n=n)
    t0 = time.perf_counter()
    result = run_code(code, [TOOL], timeout=120)
    dt = time.perf_counter() - t0
    assert result.ok and result.result == n, result.error
    return dt


def py_sequential(n: int) -> float:
    t0 = time.perf_counter()
    with Scheduler(max_parallel=10, timeout=120) as sched:
        call = sched.call
        for _ in range(n):
            out = call(TOOL, {})
    dt = time.perf_counter() - t0
    assert out.ok
    return dt


def py_fanout(n: int) -> float:
    t0 = time.perf_counter()
    with Scheduler(max_parallel=10, timeout=120) as sched:
        tickets = [sched.submit(TOOL, {}) for _ in range(n)]
        outs = [sched.wait(t) for t in tickets]
    dt = time.perf_counter() - t0
    assert all(o.ok for o in outs)
    return dt


class _AtOnce:
    """A host whose every call has already committed: the bridge with no threads."""

    names = ("noop",)

    class _Done:
        __slots__ = ()

        def wait(self, timeout: float):
            return _OK

    _done = _Done()

    def call(self, name, args):
        return self._done


def bridge_alone(n: int) -> float:
    """The QuickJS run loop alone: settle, pump, drain, parse, per call; no scheduler."""
    from nous_sched import Limits
    from nous_sched.runtime.quickjs import QuickJSRuntime

    code = SEQUENTIAL_JS.format(n=n)
    t0 = time.perf_counter()
    out = QuickJSRuntime().run(code, _AtOnce(), Limits(timeout=120))
    dt = time.perf_counter() - t0
    assert out.error is None and out.result == n, out.error
    return dt


def main() -> None:
    opts = c.options(__doc__.splitlines()[0], default_reps=5, quick_reps=3)
    n = 1_000 if opts.quick else 10_000
    m = 1_000
    js(SEQUENTIAL_JS, 100)
    py_sequential(100)  # warm-up

    o, b = c.interleave(opts.reps, lambda: js(SEQUENTIAL_JS, n), lambda: py_sequential(n))
    us = 1e6 / n
    os_, bs = c.Stats.of([x * us for x in o]), c.Stats.of([x * us for x in b])
    ratio = os_.median / bs.median

    alone = c.Stats.of([bridge_alone(n) * us for _ in range(opts.reps)])
    reps_all = max(opts.reps, 5)
    oa, ba = c.interleave(reps_all, lambda: js(PROMISE_ALL_JS, m), lambda: py_fanout(m))
    usm = 1e6 / m
    rows = [
        c.Row(
            f"run_code: {n:,} sequential awaits",
            os_,
            bs,
            unit="us/call",
            target=f"ratio <= {TARGET}",
            status=c.check(ratio <= TARGET),
            base_name="Scheduler.call loop",
        ),
        c.Row(
            "  the bridge alone (host answers at once)",
            alone,
            c.Stats.of([(x - y) * us for x, y in zip(o, b)]),
            unit="us/call",
            target="report",
            status="INFO",
            base_name="in a run (js - py)",
            note="the real QuickJS run loop against a host whose calls have already committed: "
            "its own cost per call, no threads; beside it, what it adds in a real run",
        ),
        c.Row(
            f"run_code: Promise.all over {m:,} calls",
            c.Stats.of([x * usm for x in oa]),
            c.Stats.of([x * usm for x in ba]),
            unit="us/call",
            target="report",
            status="INFO",
            base_name="submit all, wait each",
        ),
    ]
    c.emit("3. run_code bridge (tool = no-op, concurrency-safe)", rows, opts)


if __name__ == "__main__":
    main()

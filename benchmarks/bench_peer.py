"""9. A peer, side by side: nous_sched against langchain-quickjs (the deepagents JS REPL).

Two programs, the same as the Vercel rows (``bench_vercel.py``), run by
``run_code`` (defaults but ``max_parallel``: a fresh sandbox, scheduler
per run, its calls on the shared tool threads, all in the clock) and by langchain-quickjs's
``CodeInterpreterMiddleware``:

- sequential: 1,000 ``await tools.noop({ i })`` in a loop;
- fan-out: ``Promise.all`` over 50 calls of a tool that blocks 5 ms.

Equal threads: on both sides the tool is the same blocking Python function
run on 50 threads, as many as the fan-out has calls and as Vercel's rows
allow in flight (ours: ``max_parallel`` 50; the peer's: its LangChain tool
awaits ``loop.run_in_executor`` on a ``ThreadPoolExecutor(50)``; left to
LangChain, a sync tool would get the loop's default executor, 6 threads on
2 cores, and the peer has no in-flight cap of its own for these calls).
Target: nous_sched ahead in every repetition, the whole (min-max) range of
the paired ratios below 1 (``_common.every_ratio_below``, a sign test).
Beside them, the peer's own best case, native ``async`` tools on its event
loop (no threads at all), and nous_sched with one shared executor.

The peer is driven the way an agent drives it: ``before_agent`` gives the
conversation its REPL slot (a worker thread with its own event loop, a
``quickjs_rs`` runtime and context), the model-call hook installs the
programmatic tool bridges as ``tools.<name>``, and each timed run is one
call of the middleware's ``eval`` tool, awaited (``ainvoke``, as its README
asks for async tools) with a real ``langgraph`` ``ToolRuntime``. The slot is
made once and reused (only the eval is timed), which favours the peer. Its
call budget (``max_ptc_calls``, 256 by default) is lifted for the
sequential program. Optional extra: ``pip install -e '.[peer]'``; without it
the rows say ``skipped: <reason>``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import time
import warnings
from typing import Any, Optional, cast

import _common as c

from nous_sched import Tool, run_code

FAN = 50
SLEEP = 0.005
THREADS = FAN  # equal threads on both sides, and as many as Vercel's rows allow in flight
FAN_EXPECTED = FAN * (FAN - 1) // 2

SEQUENTIAL = "let s = 0;\nfor (let i = 0; i < {n}; i++) {{ await tools.noop({{ i }}); s += 1; }}\nreturn s;"
FANOUT = (
    f"const parts = await Promise.all(Array.from({{ length: {FAN} }}, (_, i) => tools.sleepy({{ i }})));\n"
    "return parts.reduce((a, b) => a + b, 0);"
)


def noop_fn(args: dict[str, Any]) -> Any:
    return args["i"]


def sleepy_fn(args: dict[str, Any]) -> Any:
    time.sleep(SLEEP)
    return args["i"]


OURS_TOOLS = [
    Tool("noop", noop_fn, concurrency_safe=lambda args: True),
    Tool("sleepy", sleepy_fn, concurrency_safe=lambda args: True),
]


def ours(program: str, expected: int, runtime: Any, executor: Optional[concurrent.futures.Executor] = None) -> float:
    t0 = time.perf_counter()
    r = run_code(
        program, OURS_TOOLS, runtime=runtime, max_parallel=THREADS, timeout=120, executor=executor, description="test"
    )
    dt = time.perf_counter() - t0
    assert r.ok and r.result == expected, r.error
    return dt


class PeerFailed(Exception):
    """The peer failed a run (raised, or answered something else): its rows are SKIP, saying why."""


class Peer:
    """One langchain-quickjs middleware with one conversation slot, driven through its hooks."""

    def __init__(self, native_async: bool, pool: concurrent.futures.Executor) -> None:
        from langchain_core.tools import StructuredTool
        from langchain_quickjs import CodeInterpreterMiddleware
        from langgraph.prebuilt import ToolRuntime

        if native_async:

            async def noop(i: int) -> int:
                """Return i."""
                return i

            async def sleepy(i: int) -> int:
                """Wait 5 ms, return i."""
                await asyncio.sleep(SLEEP)
                return i

        else:

            async def noop(i: int) -> int:
                """Return i (on the shared thread pool)."""
                return await asyncio.get_running_loop().run_in_executor(pool, noop_fn, {"i": i})

            async def sleepy(i: int) -> int:
                """Block 5 ms, return i (on the shared thread pool)."""
                return await asyncio.get_running_loop().run_in_executor(pool, sleepy_fn, {"i": i})

        tools = [
            StructuredTool.from_function(coroutine=noop, name="noop", description="Return i."),
            StructuredTool.from_function(coroutine=sleepy, name="sleepy", description="Block 5 ms, return i."),
        ]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "beta" warning
            # Any: the hooks are driven with duck-typed stand-ins for an agent's objects.
            self.mw: Any = cast(Any, CodeInterpreterMiddleware)(
                ptc=tools, mode="thread", timeout=120, max_ptc_calls=None
            )
        self.loop = asyncio.new_event_loop()
        try:
            self.state = dict(self.mw.before_agent({}, None) or {})
            seen: dict[str, Any] = {}
            state = self.state

            class _Request:
                """The part of a langchain ModelRequest that wrap_model_call reads."""

                system_message = None

                def __init__(self) -> None:
                    self.tools = tools
                    self.state = state

                def override(self, **changes: Any) -> Any:
                    seen.update(changes)
                    return self

            # The model-call hook installs the bridges (tools.noop, tools.sleepy) in the slot.
            self.mw.wrap_model_call(_Request(), lambda request: None)
            assert "tools.sleepy" in str(seen.get("system_message")), "the peer's tool prompt was not rendered"
            self.eval_tool: Any = self.mw.tools[0]
            self.runtime = ToolRuntime(
                state=self.state,
                context=None,
                config={},
                stream_writer=lambda _: None,
                tool_call_id="bench",
                store=None,
            )
        except BaseException:
            self.close()
            raise

    def run(self, program: str, expected: int) -> float:
        code = "(async () => {\n" + program + "\n})()"

        async def once() -> float:
            t0 = time.perf_counter()
            msg = await self.eval_tool.coroutine(runtime=self.runtime, code=code)
            dt = time.perf_counter() - t0
            content = str(getattr(msg, "content", msg))
            if f"<result>{expected}</result>" not in content:
                raise PeerFailed(f"the peer's eval answered {content[:160]!r}, not <result>{expected}</result>")
            return dt

        try:
            return self.loop.run_until_complete(once())
        except PeerFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - the peer's failure is its SKIP row's reason
            raise PeerFailed(f"the peer's eval raised {type(exc).__name__}: {exc}".splitlines()[0][:200]) from exc

    def close(self) -> None:
        # Close the slot explicitly: left to __del__ at interpreter exit, the
        # middleware's close waits on a worker thread that is already gone.
        self.mw._registry.close()
        self.loop.close()


def tool_layer_us(n: int = 200) -> float:
    """Microseconds per ``BaseTool.arun`` of a no-op async tool: LangChain's per-call cost."""
    import uuid

    from langchain_core.tools import StructuredTool

    async def noop(i: int) -> int:
        """Return i."""
        return i

    tool = StructuredTool.from_function(coroutine=noop, name="noop", description="Return i.")

    async def go() -> float:
        await tool.arun({"i": 1}, run_id=uuid.uuid4(), config={})
        t0 = time.perf_counter()
        for _ in range(n):
            await tool.arun({"i": 1}, run_id=uuid.uuid4(), config={})
        return (time.perf_counter() - t0) / n * 1e6

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(go())
    finally:
        loop.close()


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=7, quick_reps=2)
    # The peer takes milliseconds per sequential call: fewer in a smoke run.
    n = 50 if opts.quick else 1_000
    sequential = SEQUENTIAL.format(n=n)
    ms = 1000.0
    peers: list[Peer] = []
    pool = concurrent.futures.ThreadPoolExecutor(THREADS, thread_name_prefix="bench-peer-pool")
    shared = concurrent.futures.ThreadPoolExecutor(THREADS, thread_name_prefix="bench-shared")
    try:
        from importlib.metadata import version

        import langchain_quickjs  # noqa: F401

        peer_version = version("langchain-quickjs")
        threaded = Peer(native_async=False, pool=pool)
        peers.append(threaded)
        # The peer's best case is a second slot (seconds to build): not in a smoke run.
        native = None if opts.quick else Peer(native_async=True, pool=pool)
        if native is not None:
            peers.append(native)
    except Exception as exc:  # noqa: BLE001 - a peer that cannot run is a SKIP row, not a failure
        for p in peers:
            p.close()
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if isinstance(exc, ImportError):
            reason += "; pip install -e '.[peer]'"
        return c.run("9. peer: langchain-quickjs", [("peer", lambda: [c.skip_row("langchain-quickjs", reason)])], opts)

    def section(rc: c.RuntimeChoice) -> list[c.Row]:
        try:
            return measure(rc)
        except PeerFailed as exc:
            return [c.skip_row(f"vs langchain-quickjs [{rc.name}]", str(exc))]

    def measure(rc: c.RuntimeChoice) -> list[c.Row]:
        rt = rc.runtime
        sides = [threaded] + ([native] if native else [])
        for _ in range(1 if opts.quick else 2):  # warm-up, and a check that each side computes the same result
            ours(sequential, n, rt), ours(FANOUT, FAN_EXPECTED, rt)
            for peer in sides:
                peer.run(sequential, n), peer.run(FANOUT, FAN_EXPECTED)
        s = c.interleave(
            opts.reps,
            lambda: ours(sequential, n, rt),
            *[(lambda peer=peer: peer.run(sequential, n)) for peer in sides],
        )
        f = c.interleave(
            opts.reps,
            lambda: ours(FANOUT, FAN_EXPECTED, rt),
            lambda: ours(FANOUT, FAN_EXPECTED, rt, shared),
            *[(lambda peer=peer: peer.run(FANOUT, FAN_EXPECTED)) for peer in sides],
        )
        us = 1e6 / n
        peer_name = "langchain-quickjs"
        ahead = f"PASS only when all {opts.reps} paired ratios are < 1 (sign test: p = 1/{2**opts.reps} by chance)"
        rows = [
            c.ours_vs(
                f"vs langchain-quickjs: {n:,} sequential calls [{rc.name}]",
                s[0],
                s[1],
                s,
                scale=us,
                unit="us/call",
                base_name=peer_name,
                target=c.every_ratio_below(1.0, "(ahead)"),
                note=f"the same blocking no-op on {THREADS} threads on both sides; {ahead}",
            ),
            c.ours_vs(
                f"vs langchain-quickjs: fan-out {FAN} x 5 ms [{rc.name}]",
                f[0],
                f[2],
                f,
                scale=ms,
                unit="ms",
                base_name=peer_name,
                target=c.every_ratio_below(1.0, "(ahead)"),
                note=f"the same blocking 5 ms tool on {THREADS} threads on both sides "
                f"(ideal {FAN / THREADS * SLEEP * ms:g} ms); {ahead}",
            ),
            c.ours_vs(
                "  ours with one shared executor",
                f[1],
                f[2],
                f,
                scale=ms,
                unit="ms",
                base_name=peer_name,
                note=f"run_code(..., executor=<one ThreadPoolExecutor({THREADS})>): warm threads, like the peer's warm slot",
            ),
        ]
        if native is not None:
            rows += [
                c.ours_vs(
                    "  peer's best case: an async no-op, no threads",
                    s[0],
                    s[2],
                    s,
                    scale=us,
                    unit="us/call",
                    base_name=peer_name,
                ),
                c.ours_vs(
                    "  peer's best case: asyncio.sleep, no threads",
                    f[0],
                    f[3],
                    f,
                    scale=ms,
                    unit="ms",
                    base_name=peer_name,
                    note=f"all {FAN} waits at once on the peer's loop, no thread hand-off: ideal {SLEEP * ms:g} ms",
                ),
            ]
        return rows

    def tool_layer() -> list[c.Row]:
        return [
            c.Row(
                "peer's tool layer alone: BaseTool.arun",
                c.Stats.of([tool_layer_us() for _ in range(3)]),
                None,
                unit="us/call",
                note="a no-op async tool awaited 200 times on one loop: what each of the peer's calls pays first",
            )
        ]

    try:
        return c.run(
            f"9. peer: langchain-quickjs {peer_version} (ratio = nous_sched / peer)",
            c.per_runtime(opts, "peer", section) + [("peer's tool layer", tool_layer)],
            opts,
        )
    finally:
        for p in peers:
            p.close()
        pool.shutdown()
        shared.shutdown()


if __name__ == "__main__":
    sys.exit(main())

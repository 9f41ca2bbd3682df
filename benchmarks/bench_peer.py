"""6. A peer, side by side: nous_sched against langchain-quickjs (the deepagents JS REPL).

The same fan-out program - 50 calls of a tool that blocks 5 ms, results summed
- run by ``run_code`` (``max_parallel`` 10, a fresh sandbox and scheduler per
run, all included in the time) and by langchain-quickjs's
``CodeInterpreterMiddleware(ptc=[tool])``, driven the way an agent drives it:
``before_agent`` gives the conversation its REPL slot, the model-call hook
installs the PTC bridges as ``tools.<camelCase>``, and each run is one call of
the middleware's own ``eval`` tool (sync ``func`` and async ``coroutine``).
Its slot (worker thread, runtime, context) is made once and reused: only the
eval is timed, which favours the peer.

Two tool shapes: the same blocking ``time.sleep(0.005)`` function on both
sides (LangChain runs a sync tool with ``run_in_executor`` on the default
executor), and, for the peer only, a native ``async`` tool
(``asyncio.sleep``), its best case. Ratio = nous_sched / peer (below 1: we
are faster). One more nous_sched row passes a shared executor, the closest
match to the peer's warm slot; the last row times the peer's tool layer
(``BaseTool.arun`` of a no-op) alone. Optional extra: ``pip install -e .[peer]``; without it the rows
say ``unavailable: <reason>``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import warnings

import _common as c

from nous_sched import Tool, run_code

CALLS = 50
SLEEP = 0.005

OURS_JS = f"""
const parts = await Promise.all(Array.from({{ length: {CALLS} }}, (_, i) => tools.sleepy({{ i }})));
return parts.reduce((a, b) => a + b, 0);
"""
# langchain-quickjs evaluates a script and returns its completion value, awaiting
# a final promise: the same program as an async IIFE.
PEER_JS = f"""
(async () => {{
  const parts = await Promise.all(Array.from({{ length: {CALLS} }}, (_, i) => tools.sleepy({{ i }})));
  return parts.reduce((a, b) => a + b, 0);
}})()
"""
EXPECTED = CALLS * (CALLS - 1) // 2


def sleepy_fn(args: dict) -> int:
    time.sleep(SLEEP)
    return args["i"]


OURS_TOOL = Tool("sleepy", sleepy_fn, concurrency_safe=lambda args: True)


def ours(executor=None) -> float:
    t0 = time.perf_counter()
    r = run_code(OURS_JS, [OURS_TOOL], max_parallel=10, timeout=60, executor=executor)
    dt = time.perf_counter() - t0
    assert r.ok and r.result == EXPECTED, r.error
    return dt


class Peer:
    """One langchain-quickjs middleware with one conversation slot, driven through its hooks."""

    def __init__(self, asynchronous_tool: bool) -> None:
        from langchain_core.tools import StructuredTool
        from langchain_quickjs import CodeInterpreterMiddleware
        from langgraph.prebuilt import ToolRuntime

        def sleepy(i: int) -> int:
            """Block 5 ms, return i."""
            time.sleep(SLEEP)
            return i

        async def asleepy(i: int) -> int:
            """Wait 5 ms, return i."""
            await asyncio.sleep(SLEEP)
            return i

        if asynchronous_tool:
            tool = StructuredTool.from_function(coroutine=asleepy, name="sleepy", description="Wait 5 ms, return i.")
        else:
            tool = StructuredTool.from_function(sleepy)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "beta" warning
            self.mw = CodeInterpreterMiddleware(ptc=[tool], mode="thread", timeout=60)
        self.loop = None
        try:
            self._setup(tool, ToolRuntime)
        except BaseException:
            self.close()
            raise

    def _setup(self, tool, ToolRuntime) -> None:
        self.state = dict(self.mw.before_agent({}, None) or {})
        seen = {}

        class _Request:
            """The part of a langchain ModelRequest that wrap_model_call reads."""

            tools = [tool]
            state = self.state
            system_message = None

            def override(self, **changes):
                seen.update(changes)
                return self

        # The model-call hook installs the PTC bridges (tools.sleepy) in the slot.
        self.mw.wrap_model_call(_Request(), lambda request: None)
        assert "tools.sleepy" in str(seen.get("system_message")), "PTC prompt not rendered"
        self.eval_tool = self.mw.tools[0]
        self.runtime = ToolRuntime(
            state=self.state, context=None, config={}, stream_writer=lambda _: None, tool_call_id="bench", store=None
        )
        self.loop = asyncio.new_event_loop()

    def _check(self, message) -> None:
        content = getattr(message, "content", message)
        assert f"<result>{EXPECTED}</result>" in content, content

    def sync(self) -> float:
        t0 = time.perf_counter()
        msg = self.eval_tool.func(runtime=self.runtime, code=PEER_JS)
        dt = time.perf_counter() - t0
        self._check(msg)
        return dt

    def run_async(self) -> float:
        async def once():
            t0 = time.perf_counter()
            msg = await self.eval_tool.coroutine(runtime=self.runtime, code=PEER_JS)
            dt = time.perf_counter() - t0
            self._check(msg)
            return dt

        return self.loop.run_until_complete(once())

    def close(self) -> None:
        # Close the slot explicitly: left to __del__ at interpreter exit, the
        # middleware's close waits on a worker thread that is already gone.
        self.mw._registry.close()
        if self.loop is not None:
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


def unavailable_rows(reason: str) -> list[c.Row]:
    return [
        c.Row(
            "peer: langchain-quickjs fan-out 50 x 5 ms",
            None,
            None,
            target="report",
            status="UNAVAILABLE",
            note=f"unavailable: {reason}",
        )
    ]


def main() -> None:
    opts = c.options(__doc__.splitlines()[0], default_reps=15, quick_reps=3)
    ideal = c.Stats.fixed(CALLS / 10 * SLEEP * 1000)
    ms = 1000.0
    peers = []
    try:
        try:
            import langchain_quickjs  # noqa: F401
        except ImportError as exc:
            raise RuntimeError(f"langchain-quickjs is not installed ({exc}); pip install -e '.[peer]'") from None
        sync_peer = Peer(asynchronous_tool=False)
        peers.append(sync_peer)
        async_peer = Peer(asynchronous_tool=True)
        peers.append(async_peer)
        for _ in range(3):  # warm-up, and a check that each side computes the sum
            ours(), sync_peer.sync(), sync_peer.run_async(), async_peer.run_async()
    except Exception as exc:  # noqa: BLE001 - report why, never fail the run
        for p in peers:
            p.close()
        o = c.Stats.of([ours() * ms for _ in range(opts.reps)])
        rows = [c.Row("nous_sched fan-out 50 x 5 ms", o, ideal, unit="ms", base_name="ideal")]
        rows += unavailable_rows(f"{type(exc).__name__}: {exc}")
        c.emit("6. peer: langchain-quickjs", rows, opts)
        return

    # The peer keeps its slot (thread, runtime, context) between evals; the
    # closest nous_sched set-up keeps its tool threads: a shared executor.
    shared = concurrent.futures.ThreadPoolExecutor(10, thread_name_prefix="shared-tools")
    try:
        ours(shared)
        o, osh, ps, pa, pn = c.interleave(
            opts.reps, ours, lambda: ours(shared), sync_peer.sync, sync_peer.run_async, async_peer.run_async
        )
    finally:
        shared.shutdown()
        for p in peers:
            p.close()
    o, osh, ps, pa, pn = (c.Stats.of([x * ms for x in s]) for s in (o, osh, ps, pa, pn))
    from importlib.metadata import version

    import langchain_quickjs as lq

    arun_us = c.Stats.of([tool_layer_us() for _ in range(5)])
    rows = [
        c.Row("nous_sched run_code fan-out 50 x 5 ms", o, ideal, unit="ms", base_name="ideal (p=10)"),
        c.Row(
            "vs peer eval (sync), same blocking tool", o, ps, unit="ms", base_name="langchain-quickjs", target="report"
        ),
        c.Row(
            "vs peer eval (async), same blocking tool", o, pa, unit="ms", base_name="langchain-quickjs", target="report"
        ),
        c.Row("vs peer eval (async), async tool", o, pn, unit="ms", base_name="langchain-quickjs", target="report"),
        c.Row(
            "nous_sched, shared executor, vs peer (sync)",
            osh,
            ps,
            unit="ms",
            base_name="langchain-quickjs",
            target="report",
            note="run_code(..., executor=<one ThreadPoolExecutor(10) for every run>): no tool threads started per run",
        ),
        c.Row(
            "  peer's tool layer alone: BaseTool.arun",
            arun_us,
            None,
            unit="us/call",
            target="report",
            note="a no-op async tool awaited 200 times on one loop: what each PTC call pays before QuickJS",
        ),
    ]
    c.emit(f"6. peer: langchain-quickjs {version('langchain-quickjs')} (ratio = nous_sched / peer)", rows, opts)
    del lq


if __name__ == "__main__":
    main()

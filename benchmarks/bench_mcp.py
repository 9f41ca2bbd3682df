"""11. MCP: the cost of one MCP tool call through the lane, beside a direct SDK call.

An MCP server with one read-only tool that answers at once (``_mcp_echo.py``),
reached in-process and over stdio (a subprocess). For each transport, three
ways to make N sequential calls, measured back to back in the same process:

- ``run_code``: a program making N sequential ``await tools.echo({i})``
  through ``nous_sched.mcp`` (the sandbox, the lane, a tool thread, the
  connection's loop thread, the SDK), end to end;
- the same tool's function called N times from Python (the connection alone:
  one hop to the loop thread and back per call);
- the baseline: ``await client.call_tool("echo", ...)`` N times in a loop on
  the SDK's own event loop, no thread hop at all: the floor any synchronous
  wrapper of the SDK starts from.

And a fan-out: ``Promise.all`` over M calls (trusted, so parallel, at most 10
at once) against M concurrent SDK calls in one task group. Rows report
(INFO); they need the mcp extra (``pip install -e '.[bench,mcp]'``) and are
SKIP rows without it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import _common as c

from nous_sched import run_code

HERE = Path(__file__).resolve().parent

TITLE = "11. MCP: one call through the lane, beside a direct SDK call"
SEQUENTIAL = "for (let i = 0; i < {n}; i++) await tools.echo({{ i }});\nreturn {n};"
FANOUT = "const r = await Promise.all(Array.from({{ length: {n} }}, (_, i) => tools.echo({{ i }})));\nreturn r.length;"


def target(transport: str) -> Any:
    if transport == "stdio":
        return [sys.executable, str(HERE / "_mcp_echo.py")]
    import _mcp_echo

    return _mcp_echo.build()


class Direct:
    """An SDK client on its own loop thread; each measurement runs entirely on that loop."""

    def __init__(self, transport: str) -> None:
        import anyio.from_thread
        from mcp import Client, StdioServerParameters

        self._portal_cm = anyio.from_thread.start_blocking_portal(name="bench-mcp-direct")
        self.portal = self._portal_cm.__enter__()
        server = target(transport)
        if isinstance(server, list):
            server = StdioServerParameters(command=server[0], args=server[1:])
        self._client_cm = self.portal.wrap_async_context_manager(Client(server))
        self.client = self._client_cm.__enter__()
        self.portal.call(self.client.list_tools)

    def sequential(self, n: int) -> float:
        async def go() -> float:
            t0 = time.perf_counter()
            for i in range(n):
                await self.client.call_tool("echo", {"i": i})
            return time.perf_counter() - t0

        return self.portal.call(go)

    def fanout(self, n: int) -> float:
        import anyio

        async def go() -> float:
            limit = anyio.CapacityLimiter(10)

            async def one(i: int) -> None:
                async with limit:
                    await self.client.call_tool("echo", {"i": i})

            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(one, i)
            return time.perf_counter() - t0

        return self.portal.call(go)

    def close(self) -> None:
        self._client_cm.__exit__(None, None, None)
        self._portal_cm.__exit__(None, None, None)


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=5, quick_reps=2)
    n = {"in-process": 50 if opts.quick else 300, "stdio": 50 if opts.quick else 300}
    m = 50 if opts.quick else 200

    try:
        from nous_sched.mcp import ServerSpec, connect  # `connect` imports the SDK
    except ImportError as exc:
        reason = f"needs the mcp extra ({exc})"
        return c.run(TITLE, [("mcp", lambda: [c.skip_row("MCP rows", reason)])], opts)

    def section(transport: str, rc: c.RuntimeChoice) -> list[c.Row]:
        rt = rc.runtime
        direct = Direct(transport)
        conn = connect(ServerSpec(target(transport), trusted=True))
        try:
            (echo,) = conn.tools()
            calls = n[transport]

            def ours(program: str, k: int) -> float:
                t0 = time.perf_counter()
                r = run_code(program.format(n=k), conn.tools(), runtime=rt, timeout=300, description="test")
                dt = time.perf_counter() - t0
                assert r.ok and r.result == k, r.error
                return dt

            def portal_only(k: int) -> float:
                t0 = time.perf_counter()
                for i in range(k):
                    echo.function({"i": i})
                return time.perf_counter() - t0

            for fn in (lambda: ours(SEQUENTIAL, 20), lambda: portal_only(20), lambda: direct.sequential(20)):
                fn()  # warm-up: first calls compile schemas, warm pools
            s = c.interleave(
                opts.reps,
                lambda: ours(SEQUENTIAL, calls),
                lambda: direct.sequential(calls),
                lambda: portal_only(calls),
                lambda: ours(FANOUT, m),
                lambda: direct.fanout(m),
            )
            us = 1e6 / calls
            return [
                c.ours_vs(
                    f"MCP call via run_code, {calls} sequential, {transport} server [{rc.name}]",
                    s[0],
                    s[1],
                    s,
                    scale=us,
                    unit="us/call",
                    base_name="SDK direct",
                    note="SDK direct: `await client.call_tool(...)` in a loop on the SDK's own event loop",
                ),
                c.ours_vs(
                    "  beside: the tool's function from Python",
                    s[2],
                    s[1],
                    s,
                    scale=us,
                    unit="us/call",
                    base_name="SDK direct",
                    note="the Tool's function called from Python: the connection's thread hop without the lane",
                ),
                c.ours_vs(
                    f"  Promise.all over {m} MCP calls",
                    s[3],
                    s[4],
                    s,
                    scale=1e3,
                    unit="ms",
                    base_name="SDK task group",
                    note="SDK task group: the same calls concurrent on the SDK's loop, at most 10 at once",
                ),
            ]
        finally:
            conn.close()
            direct.close()

    sections = []
    for transport in ("in-process", "stdio"):
        sections += c.per_runtime(opts, f"mcp {transport}", lambda rc, t=transport: section(t, rc))
    return c.run(TITLE, sections, opts)


if __name__ == "__main__":
    sys.exit(main())

"""11. A peer, side by side: nous_sched against pydantic-monty (a Python sandbox in worker processes).

pydantic-monty runs a *Python* program in a pool of ``monty`` worker
processes (a Rust interpreter of a Python subset; the host never runs the
program), and calls the host's functions from it, so it is the peer whose
design is nearest ours: a sandbox in a worker process, one pipe round trip
per call. The same two programs as the other peers' rows, in each side's
language:

- sequential: N calls of a no-op tool in a loop (``await tools.noop({ i })``
  against ``noop(i)`` or ``await noop(i)``);
- fan-out: 50 calls of a tool that waits 5 ms, all at once (``Promise.all``
  against ``asyncio.gather``).

Each timed run of the peer is what a run of ours is: a session checked out
of its pool (a warm worker, as ours takes a spare), the program fed, the
session handed back. Its pools are made once and kept warm (``Monty`` and
``AsyncMonty``, ``max_suspensions`` raised to the program's call count),
which favours the peer. The sides:

- the **sync pool** (``Monty``): the tool runs on the calling thread between
  two reads of the worker's pipe, no thread hand-off at all. It cannot run
  calls concurrently, so it has no fan-out row;
- the **async pool** (``AsyncMonty``): the tool is a coroutine; the blocking
  tool runs on a ``ThreadPoolExecutor(50)`` (``run_in_executor``), the same
  50 threads as ours (``max_parallel`` 50); beside it the peer's best case,
  ``asyncio.sleep`` on its loop, no threads.

Target: nous_sched ahead in every repetition (``_common.every_ratio_below``);
where the peer's design does less per call (the sync pool: no thread, no
scheduler, no per-call record), the row's note says what it skips.
Optional: ``pip install -e '.[bench]'`` (pydantic-monty); without it the
rows say ``skipped: <reason>``. ``run_all.py`` runs it with ``--peers``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
import time
from typing import Any, Callable, Coroutine, Optional

import _common as c
from bench_peer import FAN, FAN_EXPECTED, FANOUT, SEQUENTIAL, SLEEP, THREADS, ours

PY_SEQUENTIAL = "s = 0\nfor i in range({n}):\n    noop(i)\n    s += 1\ns"
PY_SEQUENTIAL_AWAIT = "s = 0\nfor i in range({n}):\n    await noop(i)\n    s += 1\ns"
PY_FANOUT = f"import asyncio\nparts = await asyncio.gather(*[sleepy(i) for i in range({FAN})])\nsum(parts)"


class PeerFailed(Exception):
    """The peer failed a run: its rows are SKIP, saying why."""


def noop(i: int) -> int:
    return i


def sleepy_blocking(i: int) -> int:
    time.sleep(SLEEP)
    return i


class MontyPeer:
    """pydantic-monty's two pools, kept warm; the async one on a loop of its own thread."""

    def __init__(self, calls: int) -> None:
        import pydantic_monty

        self.limits: Any = {"max_suspensions": max(calls, FAN) * 2 + 100}
        self.sync = pydantic_monty.Monty(min_processes=1)
        self.sync.__enter__()
        self.threads = concurrent.futures.ThreadPoolExecutor(THREADS, thread_name_prefix="bench-monty-pool")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bench-monty-loop", daemon=True)
        self.thread.start()

        async def start() -> Any:  # (it wants a running loop, even to be made)
            pool = pydantic_monty.AsyncMonty(min_processes=1)
            await pool.__aenter__()
            return pool

        self.aio = self._await(start())

    def _await(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def run_sync(self, code: str, expected: int) -> float:
        t0 = time.perf_counter()
        try:
            with self.sync.checkout(limits=self.limits) as session:
                got = session.feed_run(code, external_lookup={"noop": noop})
        except Exception as exc:  # noqa: BLE001 - the peer's failure is a SKIP row
            raise PeerFailed(f"the sync pool failed: {type(exc).__name__}: {exc}") from None
        dt = time.perf_counter() - t0
        if got != expected:
            raise PeerFailed(f"the sync pool answered {got!r}, not {expected!r}")
        return dt

    def run_async(self, code: str, expected: int, tools: dict[str, Callable[..., Any]]) -> float:
        async def once() -> tuple[float, Any]:
            t0 = time.perf_counter()
            async with self.aio.checkout(limits=self.limits) as session:
                got = await session.feed_run(code, external_lookup=tools)
            return time.perf_counter() - t0, got

        try:
            dt, got = self._await(once())
        except Exception as exc:  # noqa: BLE001
            raise PeerFailed(f"the async pool failed: {type(exc).__name__}: {exc}") from None
        if got != expected:
            raise PeerFailed(f"the async pool answered {got!r}, not {expected!r}")
        return dt

    def threaded_tools(self) -> dict[str, Callable[..., Any]]:
        threads = self.threads

        async def anoop(i: int) -> int:
            return await asyncio.get_running_loop().run_in_executor(threads, noop, i)

        async def sleepy(i: int) -> int:
            return await asyncio.get_running_loop().run_in_executor(threads, sleepy_blocking, i)

        return {"noop": anoop, "sleepy": sleepy}

    @staticmethod
    def native_tools() -> dict[str, Callable[..., Any]]:
        async def anoop(i: int) -> int:
            return i

        async def sleepy(i: int) -> int:
            await asyncio.sleep(SLEEP)
            return i

        return {"noop": anoop, "sleepy": sleepy}

    def close(self) -> None:
        async def stop() -> None:  # (made on the loop: it wants a running one)
            await self.aio.__aexit__(None, None, None)

        try:
            self._await(stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.sync.__exit__(None, None, None)
            self.threads.shutdown()


def main() -> int:
    opts = c.options(__doc__.splitlines()[0], default_reps=7, quick_reps=2)
    n = 200 if opts.quick else 1_000
    sequential = SEQUENTIAL.format(n=n)
    py_seq, py_seq_await = PY_SEQUENTIAL.format(n=n), PY_SEQUENTIAL_AWAIT.format(n=n)
    title = "11. peer: pydantic-monty"
    peer: Optional[MontyPeer] = None
    try:
        from importlib.metadata import version

        peer = MontyPeer(n)
        title += f" {version('pydantic-monty')} (ratio = nous_sched / peer)"
    except Exception as exc:  # noqa: BLE001 - a peer that cannot run is a SKIP row, not a failure
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if isinstance(exc, ImportError):
            reason += "; pip install -e '.[bench]'"
        return c.run(title, [("monty", lambda: [c.skip_row("pydantic-monty", reason)])], opts)
    threaded, native = peer.threaded_tools(), peer.native_tools()
    ms = 1000.0
    us = 1e6 / n
    ahead = f"PASS only when all {opts.reps} paired ratios are < 1 (sign test: p = 1/{2**opts.reps} by chance)"

    def section(rc: c.RuntimeChoice) -> list[c.Row]:
        try:
            return measure(rc)
        except PeerFailed as exc:
            return [c.skip_row(f"vs pydantic-monty [{rc.name}]", str(exc))]

    def measure(rc: c.RuntimeChoice) -> list[c.Row]:
        assert peer is not None
        rt = rc.runtime
        for _ in range(2):  # warm-up, and a check that every side computes the same result
            ours(sequential, n, rt), ours(FANOUT, FAN_EXPECTED, rt)
            peer.run_sync(py_seq, n)
            peer.run_async(py_seq_await, n, threaded), peer.run_async(py_seq_await, n, native)
            peer.run_async(PY_FANOUT, FAN_EXPECTED, threaded), peer.run_async(PY_FANOUT, FAN_EXPECTED, native)
        s = c.interleave(
            opts.reps,
            lambda: ours(sequential, n, rt),
            lambda: peer.run_sync(py_seq, n),
            lambda: peer.run_async(py_seq_await, n, threaded),
            lambda: peer.run_async(py_seq_await, n, native),
        )
        f = c.interleave(
            opts.reps,
            lambda: ours(FANOUT, FAN_EXPECTED, rt),
            lambda: peer.run_async(PY_FANOUT, FAN_EXPECTED, threaded),
            lambda: peer.run_async(PY_FANOUT, FAN_EXPECTED, native),
        )
        return [
            c.ours_vs(
                f"vs monty sync pool: {n:,} sequential calls [{rc.name}]",
                s[0],
                s[1],
                s,
                scale=us,
                unit="us/call",
                base_name="Monty",
                target=c.every_ratio_below(1.0, "(ahead)"),
                note="the peer runs each call on the calling thread between two reads of its worker's pipe: "
                "no thread hand-off, no scheduler, no per-call record or event, calls one at a time; ours: "
                f"the tool on the run's executor (max_parallel {THREADS}) under the scheduler; {ahead}",
            ),
            c.ours_vs(
                f"vs monty async pool: {n:,} sequential calls [{rc.name}]",
                s[0],
                s[2],
                s,
                scale=us,
                unit="us/call",
                base_name="AsyncMonty",
                target=c.every_ratio_below(1.0, "(ahead)"),
                note=f"the same blocking no-op on {THREADS} threads on both sides (the peer: run_in_executor); {ahead}",
            ),
            c.ours_vs(
                "  peer's best case: an async no-op, no threads",
                s[0],
                s[3],
                s,
                scale=us,
                unit="us/call",
                base_name="AsyncMonty",
            ),
            c.ours_vs(
                f"vs monty async pool: fan-out {FAN} x 5 ms [{rc.name}]",
                f[0],
                f[1],
                f,
                scale=ms,
                unit="ms",
                base_name="AsyncMonty",
                target=c.every_ratio_below(1.0, "(ahead)"),
                note=f"the same blocking 5 ms tool on {THREADS} threads on both sides "
                f"(ideal {FAN / THREADS * SLEEP * ms:g} ms); {ahead}",
            ),
            c.ours_vs(
                "  peer's best case: asyncio.sleep, no threads",
                f[0],
                f[2],
                f,
                scale=ms,
                unit="ms",
                base_name="AsyncMonty",
                note=f"all {FAN} waits at once on the peer's loop, no thread hand-off: ideal {SLEEP * ms:g} ms",
            ),
        ]

    try:
        return c.run(title, c.per_runtime(opts, "monty", section), opts)
    finally:
        peer.close()


if __name__ == "__main__":
    sys.exit(main())

"""14. The wall: what a fresh worker per run costs.

Rows, each measured in the same process against its baseline, alternating
which goes first:

* warm start-up of a run with one tool call on a fresh worker (spares ready,
  forked from the pool's fork server), against the same run reusing a warm
  worker of one trust domain (``pool.domain(key)``, the old default).
  Target: median at most 2.0 ms.
* runs per second from 16 threads with a fresh worker per run, against the
  reuse mode. Target: at least 0.8x (as time per run: at most 1.25x). Beside
  it, the CPU each run cost the host and the pool's processes (the fork
  server, the workers, and, through the fork server's reaped children, the
  workers already gone), fresh against reuse;
* one cancel (a program cancelled while it loops), end to end, with workers
  forked from the fork server, against workers started as fresh interpreters
  (``start_method="spawn"``, which every cancel used to pay for with a
  replacement worker); beside it, the CPU the host and the pool's processes
  spent per cancel (from ``/proc``).

The costs of the wall's parts added for issue 34 (section ``changes``), each
pool made with ``nous_sched.runtime.pool.WALL`` set one way, both measured in
this process, alternating which goes first:

* warm start-up and time per run (16 threads), every part on (after) against
  every part off (before), then each part alone off against all on: the task
  bound (a second filter per thread), a session per worker, a fork server
  replaced every ``SERVER_CHILDREN`` workers;
* the fresh address layout the replacement stands in for: a worker that is a
  fresh interpreter (``spawn``, a layout of its own) against one forked from
  the fork server (start-up), and what one fork server costs to start (wall
  and CPU), spread over its ``SERVER_CHILDREN`` workers;
* (section ``share``) an honest CPU-bound run beside a compromised worker of
  the same pool that tries to start 32 threads spinning natively (and spins
  itself), wall on against wall off, each against the same run alone.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Callable

import _common as c

import nous_sched.runtime.pool as pool_module
from nous_sched import Tool, WorkerPool, run_code
from nous_sched.runtime import worker

TARGET_MS = 2.0
ONE_CALL = "return await tools.noop({});"
TOOL = Tool("noop", lambda args: 1, concurrency_safe=lambda args: True)


def _tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and its live descendants (from /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / tick
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as fh:
                    todo += [int(k) for k in fh.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def main() -> int:
    opts = c.options(
        __doc__.splitlines()[0],
        default_reps=5,
        quick_reps=2,
        add_arguments=lambda p: p.add_argument(
            "--sections",
            default="",
            help="comma-separated: start-up, throughput, cancel, changes, share (default: all)",
        ),
    )
    per = 15 if opts.quick else 40
    threads, each = 16, (5 if opts.quick else 20)
    ms = 1000.0
    pool = WorkerPool(size=8)
    spawned = WorkerPool(size=8, start_method="spawn")
    reuse = pool.domain("bench")
    pool.prestart()
    spawned.prestart()

    def one(rt: Any) -> None:
        r = run_code(ONE_CALL, [TOOL], runtime=rt, description="test")
        assert r.ok and r.result == 1, r.error

    ready = getattr(pool, "wait_for_spares", None)  # (older copies of the package have none)

    def startup(rt: Any) -> float:
        samples = []
        for _ in range(per):
            time.sleep(0.15)  # the spares are ready again (started in the background)
            if ready is not None:
                assert ready(30.0), "the spares are ready"
            t0 = time.perf_counter()
            one(rt)
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    run_cpu: dict[str, list[float]] = {"fresh": [], "reuse": []}

    def per_run(rt: Any, key: str = "") -> float:
        barrier = threading.Barrier(threads + 1)

        def work() -> None:
            barrier.wait()
            for _ in range(each):
                one(rt)

        ts = [threading.Thread(target=work) for _ in range(threads)]
        for t in ts:
            t.start()
        barrier.wait()
        cpu0 = _tree_cpu(os.getpid())
        t0 = time.perf_counter()
        for t in ts:
            t.join()
        took = (time.perf_counter() - t0) / (threads * each)
        if key:
            time.sleep(0.3)  # the last discarded workers are gone (their CPU reaped into the fork server's)
            run_cpu[key].append((_tree_cpu(os.getpid()) - cpu0) / (threads * each))
        return took

    cpu: dict[str, list[float]] = {"forkserver": [], "spawn": []}

    def cancels(p: WorkerPool, key: str) -> Callable[[], float]:
        def sample() -> float:
            n = 10 if opts.quick else 25
            total = 0.0
            cpu0 = _tree_cpu(os.getpid())
            for _ in range(n):
                cancel = threading.Event()
                mark = Tool("mark", lambda a, cancel=cancel: threading.Timer(0.01, cancel.set).start())
                t0 = time.perf_counter()
                r = run_code(
                    "await tools.mark({}); for (;;) {}",
                    [mark],
                    runtime=p,
                    cancel=cancel,
                    timeout=30,
                    description="test",
                )
                total += time.perf_counter() - t0 - 0.01
                assert r.error is not None and r.error.kind == "cancelled", r.error
            time.sleep(0.3)  # the replacements have started
            cpu[key].append((_tree_cpu(os.getpid()) - cpu0) / n)
            return total / n

        return sample

    def section_startup() -> list[c.Row]:
        for rt in (pool, reuse):
            startup(rt)
        s = c.interleave(opts.reps, lambda: startup(pool), lambda: startup(reuse))
        return [
            c.ours_vs(
                "wall: warm start-up, one tool call, fresh worker (spares ready)",
                s[0],
                s[1],
                s,
                scale=ms,
                unit="ms",
                base_name="reusing a warm worker (domain)",
                target=c.value_at_most(TARGET_MS, "ms"),
                note="run_code end to end; the fresh worker was forked by the pool's fork server",
            )
        ]

    def section_throughput() -> list[c.Row]:
        per_run(pool)
        s = c.interleave(opts.reps, lambda: per_run(pool, "fresh"), lambda: per_run(reuse, "reuse"))
        return [
            c.ours_vs(
                f"wall: time per run, {threads} threads, fresh worker per run",
                s[0],
                s[1],
                s,
                scale=ms,
                unit="ms",
                base_name="reusing warm workers (domain)",
                target=c.ratio_at_most(1.25, "(runs/s >= 0.8x reuse)"),
                note=f"size 8; runs/s fresh {1 / statistics.median(s[0]):.0f}, reuse {1 / statistics.median(s[1]):.0f}",
            ),
            c.Row(
                "  CPU per run, 16 threads (host + pool processes)",
                c.Stats.of([x * ms for x in run_cpu["fresh"]]),
                c.Stats.of([x * ms for x in run_cpu["reuse"]]),
                unit="ms",
                base_name="reuse",
                note="from /proc: the host's and its descendants' CPU time, the reaped workers' included; "
                "not the kernel's own threads (a worker's namespaces are freed by a kernel worker)",
            ),
        ]

    def section_cancel() -> list[c.Row]:
        s = c.interleave(opts.reps, cancels(pool, "forkserver"), cancels(spawned, "spawn"))
        return [
            c.ours_vs(
                "wall: one cancel, 10 ms into a loop, to the result",
                s[0],
                s[1],
                s,
                scale=ms,
                unit="ms",
                base_name="workers as fresh interpreters (spawn)",
                note="soft stop first (logs kept), then the worker is discarded and a spare started",
            ),
            c.Row(
                "  CPU per cancel (host + pool processes)",
                c.Stats.of([x * ms for x in cpu["forkserver"]]),
                c.Stats.of([x * ms for x in cpu["spawn"]]),
                unit="ms",
                base_name="spawn",
                note="from /proc, the host's and its live descendants' CPU time",
            ),
        ]

    sections = [
        ("start-up", section_startup),
        ("throughput", section_throughput),
        ("cancel", section_cancel),
        ("changes", lambda: _section_changes(opts, startup, per_run)),
        ("share", lambda: _section_share(opts)),
    ]
    chosen = {x.strip() for x in opts.args.sections.split(",") if x.strip()}
    try:
        return c.run("14. the wall: fresh workers", [x for x in sections if not chosen or x[0] in chosen], opts)
    finally:
        pool.close()
        spawned.close()


# -- the wall's parts of issue 34 ---------------------------------------------------

_ALL_ON = dict(pool_module.WALL)
_ALL_OFF = {"task_bound": False, "own_session": False, "server_children": 0}
_PARTS = {
    "task bound": {"task_bound": False},
    "own session": {"own_session": False},
    "fork server replaced": {"server_children": 0},
}


def _pool_with(wall: dict[str, Any], **options: Any) -> WorkerPool:
    saved = dict(pool_module.WALL)
    pool_module.WALL.update(wall)
    try:
        p = WorkerPool(size=8, **options)
    finally:
        pool_module.WALL.clear()
        pool_module.WALL.update(saved)
    p.prestart()
    return p


def _section_changes(opts: Any, startup: Callable[[Any], float], per_run: Callable[[Any], float]) -> list[c.Row]:
    ms = 1000.0
    rows: list[c.Row] = []
    after, before = _pool_with(_ALL_ON), _pool_with(_ALL_OFF)
    pools = [after, before]
    try:
        for rt in (after, before):
            startup(rt)
        s = c.interleave(opts.reps, lambda: startup(after), lambda: startup(before))
        rows.append(
            c.ours_vs(
                "wall parts (34): warm start-up, every part on",
                s[0],
                s[1],
                s,
                scale=ms,
                unit="ms",
                base_name="every part off",
                note="task bound, a session per worker, fork server replaced every "
                f"{pool_module.SERVER_CHILDREN} workers",
            )
        )
        s = c.interleave(opts.reps, lambda: per_run(after), lambda: per_run(before))
        rows.append(
            c.ours_vs(
                "wall parts (34): time per run, 16 threads, every part on",
                s[0],
                s[1],
                s,
                scale=ms,
                unit="ms",
                base_name="every part off",
                note=f"runs/s on {1 / statistics.median(s[0]):.0f}, off {1 / statistics.median(s[1]):.0f}",
            )
        )
        for name, off in _PARTS.items():
            without = _pool_with({**_ALL_ON, **off})
            pools.append(without)
            startup(without)
            s = c.interleave(opts.reps, lambda: startup(after), lambda w=without: startup(w))
            rows.append(
                c.ours_vs(f"  {name}: warm start-up", s[0], s[1], s, scale=ms, unit="ms", base_name=f"{name} off")
            )
            s = c.interleave(opts.reps, lambda: per_run(after), lambda w=without: per_run(w))
            rows.append(
                c.ours_vs(
                    f"  {name}: time per run, 16 threads",
                    s[0],
                    s[1],
                    s,
                    scale=ms,
                    unit="ms",
                    base_name=f"{name} off",
                    note=f"runs/s on {1 / statistics.median(s[0]):.0f}, off {1 / statistics.median(s[1]):.0f}",
                )
            )
        spawned = _pool_with(_ALL_ON, start_method="spawn")
        pools.append(spawned)
        startup(spawned)
        s = c.interleave(opts.reps, lambda: startup(spawned), lambda: startup(after))
        rows.append(
            c.ours_vs(
                "  a fresh layout per worker (spawn): warm start-up",
                s[0],
                s[1],
                s,
                scale=ms,
                unit="ms",
                base_name="forked (fork server's layout)",
                note="spares ready in both: the exec's cost is off the run's path but not off the CPU",
            )
        )
        s = c.interleave(opts.reps, lambda: per_run(spawned), lambda: per_run(after))
        rows.append(
            c.ours_vs(
                "  a fresh layout per worker (spawn): time per run, 16 threads",
                s[0],
                s[1],
                s,
                scale=ms,
                unit="ms",
                base_name="forked, server replaced",
                note=f"runs/s spawn {1 / statistics.median(s[0]):.0f}, forked {1 / statistics.median(s[1]):.0f}",
            )
        )
        rows += _server_start_rows(opts)
    finally:
        for p in pools:
            p.close()
    return rows


def _server_start_rows(opts: Any) -> list[c.Row]:
    """What starting one fork server costs (wall, and its CPU to ready), and that
    CPU spread over the workers it forks before it is replaced."""
    from nous_sched.runtime.procio import ForkServer, quickjs_origin

    walls, cpus = [], []
    folder = tempfile.mkdtemp(prefix="nous-bench-")
    try:
        for _ in range(max(3, opts.reps * 2)):
            t0 = time.perf_counter()
            server = ForkServer(sys.executable, quickjs_origin(), folder, {"root": folder}, 30.0)
            walls.append(time.perf_counter() - t0)
            cpus.append(_tree_cpu(server.proc.pid))
            server.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    n = pool_module.SERVER_CHILDREN
    return [
        c.Row("  one fork server started, to ready (wall)", c.Stats.of([x * 1000 for x in walls]), unit="ms"),
        c.Row(
            f"  its CPU, and per worker over {n}",
            c.Stats.of([x * 1000 for x in cpus]),
            c.Stats.of([x * 1000 / n for x in cpus]),
            unit="ms",
            base_name=f"per worker (/{n})",
            note="from /proc (clock ticks: 10 ms resolution per sample)",
        ),
    ]


_SPINNER = """
import ctypes, json, os, struct, _thread
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
page = libc.mmap(None, 4096, 3, 0x22, -1, 0)
ctypes.memmove(page, bytes([0xEB, 0xFE]), 2)  # jmp . (x86-64): spins without the interpreter's lock
libc.mprotect(ctypes.c_void_p(page), ctypes.c_size_t(4096), 5)
spin = ctypes.CFUNCTYPE(None)(page)
started = 0
for _ in range(32):
    try:
        _thread.start_new_thread(spin, ())
        started += 1
    except RuntimeError:
        pass
body = json.dumps({"calls": [[1, "started", json.dumps({"threads": started})]], "logs": [], "dropped": 0,
                   "main": None}).encode()
os.write(1, struct.pack(">I", len(body) + 1) + b"E" + body)
spin()
"""
_HONEST = "let x = 0; for (let i = 0; i < 3e6; i++) x = (x + i * 7) % 1000003; return x"


def _section_share(opts: Any) -> list[c.Row]:
    """An honest run beside a compromised worker of the same pool that spins on
    every thread it can start: with the wall's parts on, and off."""
    if os.uname().machine != "x86_64":
        return [c.Row("wall parts (34): CPU share", None, note="x86-64 only (the spinner is machine code)")]
    folder = tempfile.mkdtemp(prefix="nous-bench-")
    payload = os.path.join(folder, "spin.py")
    with open(payload, "w", encoding="utf-8") as fh:
        fh.write(_SPINNER)
    os.chmod(folder, 0o755)
    os.chmod(payload, 0o644)
    rows: list[c.Row] = []
    threads_started: dict[str, list[int]] = {"on": [], "off": []}
    try:
        for label, wall in (("on", _ALL_ON), ("off", _ALL_OFF)):
            # One pool: the honest runs take its other workers (only a program
            # marked /*payload*/ runs the spinner), the worst case, as the
            # workers of one pool shared one session (the fork server's).
            os.environ[worker.PAYLOAD_ENV] = payload
            try:
                pool = _pool_with(wall)
            finally:
                del os.environ[worker.PAYLOAD_ENV]
            try:
                alone, beside = _share_samples(opts, pool, pool, threads_started[label])
            finally:
                pool.close()
            rows.append(
                c.Row(
                    f"wall parts (34): honest run beside a spinning worker, parts {label}",
                    c.Stats.of([x * 1000 for x in beside]),
                    c.Stats.of([x * 1000 for x in alone]),
                    unit="ms",
                    base_name="the same run alone",
                    note=f"threads the compromised worker started: {sorted(set(threads_started[label]))}; "
                    f"slowdown {statistics.median(beside) / statistics.median(alone):.2f}x",
                )
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return rows


def _share_samples(
    opts: Any, honest: WorkerPool, bomb: WorkerPool, started: list[int]
) -> tuple[list[float], list[float]]:
    def timed() -> float:
        t0 = time.perf_counter()
        r = run_code(_HONEST, runtime=honest, timeout=300, description="test")
        assert r.ok, r.error
        return time.perf_counter() - t0

    def beside() -> float:
        cancel, spinning, done = threading.Event(), threading.Event(), threading.Event()

        def mark(args: Any) -> int:
            started.append(args["threads"])
            spinning.set()
            done.wait(60)
            return 1

        t = threading.Thread(
            target=run_code,
            args=("/*payload*/", [Tool("started", mark)]),
            kwargs={"runtime": bomb, "cancel": cancel, "timeout": 120, "description": "test"},
        )
        t.start()
        assert spinning.wait(60), "the spinner started"
        time.sleep(0.2)
        took = timed()
        done.set()
        cancel.set()
        t.join()
        return took

    timed()
    alone_s, beside_s = [], []
    for i in range(opts.reps):
        pair = [
            lambda: alone_s.append(statistics.median([timed() for _ in range(3)])),
            lambda: beside_s.append(beside()),
        ]
        for fn in pair if i % 2 == 0 else pair[::-1]:
            fn()
    return alone_s, beside_s


if __name__ == "__main__":
    raise SystemExit(main())

"""Ctrl-C at every step of a run, one run per step: ``python
_interrupt_steps.py [STRIDE] [opcodes | calls] [handoff]``.

``handoff``: a sequential program (each answer stepped by the scheduler's
driver while the run's thread sleeps), and only the steps the main thread
takes in the hand-off's modules (``runtime/_remote.py``, ``engine.py``,
``_handoffcore.py``), so every one of them is swept at stride 1.

A first few runs count the steps the main thread takes in nous_sched's code
(lines, or with ``opcodes`` each instruction, or with ``calls`` each
function's start and each return from a built-in; the shortest count is the sweep's); then, for every ``STRIDE``-th
step k, a run on a fresh pool's worker gets a real ``SIGINT`` raised at its
k-th step (``signal.raise_signal`` from a trace function, so the handler
runs where the interpreter next checks for signals, as a Ctrl-C's would:
deferred steps hold it back as they would a real one).

``calls`` interrupts only where CPython itself looks for a pending signal
(a Python function's first instruction, the instruction after a call into
C): every such moment is one a real Ctrl-C can hit. A line or an
instruction is not always one: the end of a ``with lock:`` block calls the
lock's ``__exit__`` from instructions outside the block's handler, so an
interrupt raised *by a trace function* on that line leaves the lock held,
where a real one never lands. After each, the pool
must be whole and the next run must work; at the end, nothing may be left:
no place or CPU share held (nor a run left waiting for one), no process the pool does not know, no zombie, the
descriptors and threads of the baseline. Prints one JSON line.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback

from _interrupt_fuzz import others, processes, settle

from nous_sched import Tool, WorkerPool, run_code

PROGRAM = "const r = await Promise.all([1, 2].map(i => tools.echo({i}))); return r.length"
SEQUENTIAL = "let n = 0; for (let i = 0; i < 3; i++) n += 1 + 0 * (await tools.echo({i})); return n - 1"
HANDOFF = ("runtime/_remote.py", "runtime/engine.py", "runtime/_handoffcore.py")
TOOLS = [Tool("echo", lambda a: a["i"])]
#: Runs whose step counts are taken before the sweep (it goes to the shortest).
COUNTING_RUNS = 5
#: The hand-off's sweep (``handoff``): its program, and the files whose steps are counted.
SWEEP: dict = {"program": PROGRAM, "files": None}


def run(pool: WorkerPool) -> object:
    return run_code(SWEEP["program"], TOOLS, runtime=pool, description="steps", timeout=20).result


def tracer(at: int, opcodes: bool, count: list[int]):  # type: ignore[no-untyped-def]
    def local(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == ("opcode" if opcodes else "line"):
            count[0] += 1
            if count[0] == at:
                signal.raise_signal(signal.SIGINT)
        return local

    def outer(frame, event, arg):  # type: ignore[no-untyped-def]
        name = frame.f_code.co_filename
        if "nous_sched" not in name or (SWEEP["files"] is not None and not name.endswith(SWEEP["files"])):
            return None
        frame.f_trace_opcodes = opcodes
        return local

    return outer


def profiler(at: int, count: list[int]):  # type: ignore[no-untyped-def]
    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        name = frame.f_code.co_filename
        if (
            event in ("call", "c_return")
            and "nous_sched" in name
            and (SWEEP["files"] is None or name.endswith(SWEEP["files"]))
        ):
            count[0] += 1
            if count[0] == at:
                signal.raise_signal(signal.SIGINT)

    return profile


def watch(at: int, mode: str, count: list[int]) -> None:
    """Start counting this thread's steps (``mode``: lines, opcodes or calls), interrupting at the ``at``-th."""
    if mode == "calls":
        sys.setprofile(profiler(at, count))
    else:
        sys.settrace(tracer(at, mode == "opcodes", count))


def unwatch() -> None:
    sys.settrace(None)
    sys.setprofile(None)


def main(stride: int, mode: str) -> dict:
    faulthandler.dump_traceback_later(240, exit=True)  # a hang says where, on stderr
    signal.signal(signal.SIGINT, signal.default_int_handler)
    pool = WorkerPool(size=2, spares=1)
    assert run(pool) == 2
    # A run's step count varies with timing (how often it looks for an answer
    # busily before one is there): the sweep goes to the shortest of a few, so
    # its k-th step is one (nearly) every run takes.
    counted = []
    for _ in range(COUNTING_RUNS):
        count = [0]
        watch(-1, mode, count)
        run(pool)
        unwatch()
        counted.append(count[0])
    steps = min(counted)
    settle(pool)
    base = {"fds": others(pool), "threads": sorted(t.name for t in threading.enumerate())}
    interrupted = 0
    broken = []
    first = int(os.environ.get("STEPS_FROM", "1"))
    for at in range(first, steps + 1, stride):
        faulthandler.dump_traceback_later(60, exit=True)
        count = [0]
        try:
            watch(at, mode, count)
            try:
                run(pool)
            finally:
                unwatch()
        except KeyboardInterrupt:
            interrupted += 1
            if os.environ.get("STEPS_VERBOSE"):
                traceback.print_exc(limit=-3)
        with pool._lock:
            held: list = [s for s in pool._core.slots.values() if s.holder is not None or s.state == "busy"]
            held += [*pool._core.computing, *pool._core.share_queue, *pool._share_waits]
        t0 = time.monotonic()
        try:
            works = run(pool) == 2
        except Exception as exc:  # (said, not raised: the next steps still run)
            works = False
            sys.stderr.write(f"step {at}: the next run raised {exc!r}\n")
        if held or not works:
            broken.append(at)
        if os.environ.get("STEPS_VERBOSE"):
            sys.stderr.write(f"{at} {time.monotonic() - t0:.3f}s {held}\n")
    settle(pool)
    end = time.monotonic() + 10.0
    while True:
        kids = processes(pool)
        if "Z" not in kids.values() or time.monotonic() > end:
            break
        time.sleep(0.05)
    out = {
        "steps": steps,
        "counted": counted,
        "runs": len(range(first, steps + 1, stride)),
        "interrupted": interrupted,
        "broken_at": broken,
        "zombies": sorted(p for p, s in kids.items() if s == "Z"),
        "processes": len(kids),
        "workers": len(pool._workers),
        "fds": others(pool),
        "base_fds": base["fds"],
        "threads": sorted(t.name for t in threading.enumerate() if not t.name.startswith("nous-sched-spares")),
        "base_threads": sorted(n for n in base["threads"] if not n.startswith("nous-sched-spares")),
    }
    pool.close()
    return out


if __name__ == "__main__":
    stride = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    if "handoff" in sys.argv[2:]:
        SWEEP.update(program=SEQUENTIAL, files=HANDOFF)
    modes = [m for m in sys.argv[2:] if m in ("opcodes", "calls")]
    sys.stdout.write(json.dumps(main(stride, modes[0] if modes else "lines")) + "\n")

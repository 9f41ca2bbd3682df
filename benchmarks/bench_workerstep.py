"""The worker's own step per call, against a minimal child over the same pipes.

A trivial host (this script: no scheduler, no driver, no tools) drives one
worker process (``runtime/worker.py``, the real one, its OS bounds applied)
through one run of ``for (...) await tools.noop({})`` (or, with
``--promise-all``, one ``Promise.all`` of as many calls), ``S`` frames of
``--batch`` calls each, exactly as the host's relay writes them, and reads
each answer. Beside it, the *minimal child*: the same QuickJS (``_quickjs``)
in a child process over the same kind of pipes and frames, the same batches,
running ``_floor.py``'s prelude (no limits, no logs, no call sites, no
guards). Per call, for each:

* **CPU** of the child process (``/proc``, every thread's ``schedstat``), and of this host for reference;
* with ``--callgrind``, **instructions per call** of the child process, from
  two runs of different lengths under ``valgrind --tool=callgrind`` (the
  start-up cancels out). The worker then runs without its OS bounds (its
  seccomp filter, its empty root and its dropped privileges stop valgrind
  writing its output); its step is otherwise the same;
* with ``--perf``, the kernel's count per call of the child process (``perf
  stat``: its CPU clock, page faults, context switches, migrations), from
  two runs of different lengths the same way, the worker with its OS bounds:
  what the instruction count cannot see (page faults of a fresh heap, system
  calls, the seccomp filter they pass).

Run by hand (not part of ``run_all.py``), in each order::

    python benchmarks/bench_workerstep.py [--calls 5000] [--reps 3] [--callgrind] [--perf] [--promise-all [--batch 256] [--args '{}']]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import _floor

from nous_sched.runtime import procio
from nous_sched.runtime import worker as W

HEADER = struct.Struct(">I")
SEQUENTIAL = "for (let i = 0; i < {n}; i++) await tools.noop({{}});\nreturn {n};"
PROMISE_ALL = (
    "const r = await Promise.all(Array.from({{length: {n}}}, (_, i) => tools.noop({args})));\nreturn r.length;"
)
#: Each call's arguments in the ``Promise.all`` (``--args``): ``bench_batch.py``'s row passes ``{}``.
ARGS = "{ i }"

# The minimal child: the same engine and framing, the floor's prelude.
CHILD = r"""
import importlib.machinery, importlib.util, json, os, struct, sys
spec = importlib.util.spec_from_file_location(
    "_quickjs", sys.argv[1], loader=importlib.machinery.ExtensionFileLoader("_quickjs", sys.argv[1]))
q = importlib.util.module_from_spec(spec)
spec.loader.exec_module(q)
H = struct.Struct(">I")
ctx = q.Context()
ctx.eval(sys.argv[2])
drain, settle = ctx.get("__drain"), ctx.get("__settle")
buf = b""
def read():
    global buf
    while len(buf) < 4 or len(buf) < 4 + H.unpack_from(buf)[0]:
        data = os.read(0, 1 << 20)
        if not data:
            os._exit(0)
        buf += data
    n = 4 + H.unpack_from(buf)[0]
    body, buf = buf[5:n], buf[n:]
    return body
def answer(text):
    data = text.encode()
    return H.pack(len(data) + 1) + b"E" + data
ctx.eval("__run(async function program() {" + json.loads(read())["program"] + "\n});")
while ctx.execute_pending_job():
    pass
os.write(1, answer(drain()))
while True:
    # The worker's settle frame: per call "<id> <1|0> <bytes> <payload>"; one write of the answers.
    body, at, out = read(), 0, []
    while at < len(body):
        i, ok, n, rest = body[at : at + 64].split(b" ", 3)
        at += len(i) + len(ok) + len(n) + 3
        stop = at + int(n)
        settle(int(i), ok == b"1", body[at:stop].decode())
        at = stop
        while ctx.execute_pending_job():
            pass
        out.append(answer(drain()))
    os.write(1, b"".join(out))
"""

# The worker without its OS bounds, for callgrind only.
UNBOUND = r"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("nous_sched_worker", sys.argv[1])
worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker)
load_all = worker._load_all
def unbound(path):
    quickjs, engine, oslimits = load_all(path)
    oslimits.apply = lambda **kwargs: {}
    oslimits.forbid_tasks = lambda: False
    return quickjs, engine, oslimits
worker._load_all = unbound
worker.main(sys.argv[1:])
"""


def _cpu(pid: int) -> float:
    """CPU seconds of every thread of ``pid`` (``schedstat``: nanoseconds, not clock ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total / 1e9


class _Frames:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()

    def read(self) -> tuple[bytes, bytes]:
        buf = self.buf
        while True:
            if len(buf) >= 4:
                (n,) = HEADER.unpack_from(buf)
                if len(buf) >= 4 + n:
                    op, body = bytes(buf[4:5]), bytes(buf[5 : 4 + n])
                    del buf[: 4 + n]
                    return op, body
            data = os.read(self.fd, 1 << 20)
            if not data:
                raise EOFError
            buf += data


def one(
    child: str, n: int, promise_all: bool, wrap: list[str], unbound: bool = False, batch: int = 1
) -> dict[str, float]:
    """One run of ``n`` calls in a fresh child (``worker`` or ``minimal``): per call figures.
    ``batch``: the settles go ``batch`` to a frame (the host's batches), an envelope
    each back, a frame's answers in one write (both children, as the worker does)."""
    program = PROMISE_ALL.format(n=n, args=ARGS) if promise_all else SEQUENTIAL.format(n=n)
    qpath = procio.quickjs_origin()
    to_child, from_host = os.pipe()
    to_host, from_child = os.pipe()
    life_r, life_w = os.pipe()
    python = [sys.executable, "-I", "-S", "-B"]
    quiet = subprocess.DEVNULL if wrap else None  # (valgrind's own report)
    if child == "worker":
        script = ["-c", UNBOUND] if unbound else []
        argv = [*wrap, *python, *script, W.__file__, "nous-sched-worker-bench-1", qpath, str(life_r), "{}"]
        proc = subprocess.Popen(
            argv, stdin=to_child, stdout=from_child, stderr=quiet, pass_fds=(life_r,), start_new_session=True
        )
        limits = [600, 256 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20, 1000, n + 1, 1 << 30, None]
        spec = {"program": program, "names": ["noop"], "limits": limits, "remaining": 600, "memory_cap": 0}
        run = W.frame(W.RUN, json.dumps({**spec, "cpu_limit": None}).encode())
    else:
        argv = [*wrap, *python, "-c", CHILD, qpath, _floor.PRELUDE]
        proc = subprocess.Popen(argv, stdin=to_child, stdout=from_child, stderr=quiet, start_new_session=True)
        run = W.frame(W.RUN, json.dumps({"program": program}).encode())
    os.close(to_child)
    os.close(from_child)
    os.close(life_r)
    frames = _Frames(to_host)
    try:
        if child == "worker":
            op, _ = frames.read()
            assert op == W.HELLO, op
        time.sleep(0.1)  # (the worker's boot is done: its hello came; the child's is the engine's import)
        c0, h0, t0 = _cpu(proc.pid), time.process_time(), time.perf_counter()
        os.write(from_host, run)
        op, body = frames.read()
        step = batch
        for first in range(1, n + 1, step):
            ids = range(first, min(first + step, n + 1))
            settle = b"".join(b"%d 1 4 null" % i for i in ids)
            os.write(from_host, HEADER.pack(len(settle) + 1) + W.SETTLE + settle)
            for _ in ids:
                op, body = frames.read()
                assert op == W.ENVELOPE, (op, body[:200])
        wall, host, cpu = time.perf_counter() - t0, time.process_time() - h0, _cpu(proc.pid) - c0
        assert b'"fulfilled"' in body or b"true," in body, body[-300:]
    finally:
        os.close(from_host)
        os.close(life_w)
        proc.wait()
        os.close(to_host)
    return {"wall": wall / n * 1e6, "child_cpu": cpu / n * 1e6, "host_cpu": host / n * 1e6}


def instructions(child: str, promise_all: bool, small: int = 300, large: int = 1300, batch: int = 1) -> int:
    """The child's instructions per call (callgrind, two run lengths)."""
    counts = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (small, large):
            out = os.path.join(tmp, f"cg.{n}")
            one(
                child,
                n,
                promise_all,
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"],
                unbound=True,
                batch=batch,
            )
            with open(out) as f:
                counts.append(next(int(line.split()[1]) for line in f if line.startswith("summary:")))
    return (counts[1] - counts[0]) // (large - small)


PERF_EVENTS = "task-clock,page-faults,context-switches,cpu-migrations"


def perf_counts(child: str, promise_all: bool, small: int = 300, large: int = 3300, batch: int = 1) -> dict[str, float]:
    """The child's ``perf stat`` counts per call (two run lengths; task-clock in us)."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (small, large):
            out = os.path.join(tmp, f"perf.{n}")
            one(child, n, promise_all, ["perf", "stat", "-x,", "-o", out, "-e", PERF_EVENTS, "--"], batch=batch)
            counts = {}
            with open(out) as f:
                for line in f:
                    fields = line.strip().split(",")
                    if len(fields) > 2 and fields[2] in PERF_EVENTS.split(","):
                        counts[fields[2]] = float(fields[0]) * (1000.0 if fields[2] == "task-clock" else 1.0)
            runs.append(counts)
    return {event: (runs[1][event] - runs[0][event]) / (large - small) for event in runs[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--promise-all", action="store_true", help="one Promise.all of the calls, not a sequential loop"
    )
    parser.add_argument("--callgrind", action="store_true", help="also the child's instructions per call (slow)")
    parser.add_argument("--perf", action="store_true", help="also the child's perf stat counts per call")
    parser.add_argument(
        "--batch", type=int, default=1, help="settles per frame to the worker (the host batches up to 256)"
    )
    parser.add_argument(
        "--args", default=ARGS, help="each call's arguments with --promise-all (JavaScript; bench_batch.py's are {})"
    )
    args = parser.parse_args()
    globals()["ARGS"] = args.args
    shape = f"one Promise.all (arguments {args.args}) of" if args.promise_all else "sequential"
    load = os.getloadavg()
    print(
        f"# {shape} {args.calls} calls, {args.batch} a frame, {args.reps} repetitions (each in both orders); load {load[0]:.2f}"
    )
    rows: dict[str, list[dict[str, float]]] = {"worker": [], "minimal": []}
    for rep in range(args.reps):
        for child in ("worker", "minimal") if rep % 2 == 0 else ("minimal", "worker"):
            rows[child].append(one(child, args.calls, args.promise_all, [], batch=args.batch))
    base = statistics.median(r["child_cpu"] for r in rows["minimal"])
    for child, samples in rows.items():
        cells = []
        for col in ("child_cpu", "host_cpu", "wall"):
            values = [r[col] for r in samples]
            cells.append(f"{col} {statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f}) us")
        ratio = statistics.median(r["child_cpu"] for r in samples) / base
        print(f"{child:8s} " + ", ".join(cells) + f"; child CPU {ratio:.2f}x the minimal child's")
    if args.callgrind:
        if shutil.which("valgrind") is None:
            raise SystemExit("valgrind is not installed")
        counts = {child: instructions(child, args.promise_all, batch=args.batch) for child in ("worker", "minimal")}
        for child, count in counts.items():
            print(f"instructions per call [{child}]: {count:,} ({count / counts['minimal']:.2f}x)")
    if args.perf:
        if shutil.which("perf") is None:
            raise SystemExit("perf is not installed")
        for child in ("worker", "minimal"):
            counts = perf_counts(child, args.promise_all, batch=args.batch)
            cells = ", ".join(
                f"{event} {value:.2f}" + (" us" if event == "task-clock" else "") for event, value in counts.items()
            )
            print(f"perf stat per call [{child}]: {cells}")
    print(f"# load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Ctrl-C at random moments of short fan-out runs, then a health check.

Run as a script (tests/test_pool_interrupts.py runs it in a subprocess; the
reliability benchmark runs it with more interrupts): ``python
_interrupt_fuzz.py N [SEED] [contended] [SIGNAL]``. One ``SIGINT`` per run, sent to the main
thread after a random delay within about one run's length (as a person at a
REPL, or a worker loop that catches ``KeyboardInterrupt``). With ``SIGTERM``
(or another signal's name) that signal instead, its handler raising
``SystemExit`` as gunicorn's and Celery's workers do, caught the same way. Prints one JSON
line: how many interrupts landed in a run, then the pool and process
afterwards against the baseline taken before the first: places busy, CPU
shares held or waited for, zombie children, open descriptors, driver
threads, and whether the next run works. ``contended``: the pool has one CPU
share, and a thread of its own runs programs that compute beside the
interrupted runs (never interrupted itself), so interrupts also land while a
run waits for the share, and while the relay hands a batch to a run's own
thread for want of one.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import statistics
import sys
import threading
import time

from nous_sched import Tool, WorkerPool, run_code
from nous_sched.scheduler import _driver_threads
from nous_sched.scheduler._tool_threads import retire_shared

PROGRAM = "const r = await Promise.all([1, 2, 3, 4].map(i => tools.echo({i}))); return r.length"
#: What the contending thread runs: a few milliseconds of JavaScript between calls.
HOG = "let x = 0; for (let k = 0; k < 3; k++) { for (let i = 0; i < 2e5; i++) x += i; await tools.echo({i: k}); } return 1"


def children(pid: "int | str" = "self") -> dict[int, str]:
    """A process's children and their states (``Z``: a zombie)."""
    out = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:  # (gone: it has no children)
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                found = fh.read().split()
        except FileNotFoundError:  # (a thread that ended since the listing: its children are another's)
            continue
        for p in found:
            try:
                with open(f"/proc/{p}/stat") as st:
                    out[int(p)] = st.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                pass
    return out


def servers(pool: WorkerPool) -> set[int]:
    """The pool's fork servers: the current one and those replaced but not yet
    closed (past SERVER_CHILDREN workers; each closes once its last child is gone)."""
    with pool._lock:
        every = ([pool._server] if pool._server else []) + list(pool._retired)
    return {s.proc.pid for s in every if s.alive()}


def processes(pool: WorkerPool) -> dict[int, str]:
    """This process's children and every fork server's (the workers), but the servers."""
    kids = children()
    ours = servers(pool)
    for server in ours:
        kids.update(children(server))
    return {pid: state for pid, state in kids.items() if pid not in ours}


def others(pool: WorkerPool) -> int:
    """Descriptors open beside the pool's workers' own (pipes, pidfds) and its
    fork servers' sockets (one more while a replaced server still has a child)."""
    with pool._lock:
        mine = {fd for w in pool._workers.values() for fd in (w.fd_in, w.fd_out, w.lifeline)}
        mine |= {getattr(w.proc, "pidfd", -1) for w in pool._workers.values()}
        every = ([pool._server] if pool._server else []) + list(pool._retired)
        mine |= {s.sock.fileno() for s in every if s.alive()}
    return len(set(map(int, os.listdir("/proc/self/fd"))) - mine)


def settle(pool: WorkerPool) -> None:
    """Let the background work finish: reaping, retiring idle threads."""
    pool._reaped(10.0)
    pool.wait_for_spares(10.0)
    end = time.monotonic() + 10.0
    while time.monotonic() < end:  # (no spare half made: its descriptors are in flight)
        with pool._lock:
            if all(s.state != "starting" for s in pool._core.slots.values()) and pool._spare_thread is None:
                break
        time.sleep(0.05)
    retire_shared(0)
    _driver_threads.retire_shared(0)
    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.name.startswith("nous-sched-spares"):
            t.join(5.0)


def _exit(signum: int, frame: object) -> None:
    raise SystemExit(0)  # as gunicorn's and Celery's workers do on SIGTERM


def main(n: int, seed: int, contended: bool = False, signame: str = "SIGINT") -> dict:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signum = getattr(signal, signame)
    if signum != signal.SIGINT:
        signal.signal(signum, _exit)
    caught = KeyboardInterrupt if signum == signal.SIGINT else SystemExit
    rng = random.Random(seed)
    pool = WorkerPool(size=4, spares=1, cpu_shares=1) if contended else WorkerPool(size=4, spares=1)
    tools = [Tool("echo", lambda a: a["i"])]
    main_id = threading.main_thread().ident
    assert run_code(PROGRAM, tools, runtime=pool, description="fuzz").result == 4
    settle(pool)
    # A run's length, kept up to date: the median of the last runs that ended
    # before their interrupt. (Measured once, up front, a slow start (the
    # first fork server's work, the machine's load then) made the delays
    # overshoot the runs, and too few interrupts landed inside one.)
    lengths: collections.deque[float] = collections.deque(maxlen=9)
    for _ in range(5):
        t0 = time.monotonic()
        run_code(PROGRAM, tools, runtime=pool, description="fuzz")
        lengths.append(time.monotonic() - t0)
    settle(pool)
    base = {"fds": others(pool), "threads": sorted(t.name for t in threading.enumerate())}
    landed = 0
    stop_hog = threading.Event()
    hog_errors: list = []

    def hog() -> None:
        while not stop_hog.is_set():
            r = run_code(HOG, tools, runtime=pool, timeout=30, description="hog")
            if r.error is not None:
                hog_errors.append(r.error.kind)

    hogs = [threading.Thread(target=hog, name="hog", daemon=True)] if contended else []
    for t in hogs:
        t.start()
    for _ in range(n):
        delay = rng.uniform(0, statistics.median(lengths) * 1.5)
        fired = threading.Event()

        def fire(delay: float = delay, fired: threading.Event = fired) -> None:
            time.sleep(delay)
            signal.pthread_kill(main_id, signum)
            fired.set()

        returned = False
        try:
            threading.Thread(target=fire, daemon=True).start()
            t0 = time.monotonic()
            run_code(PROGRAM, tools, runtime=pool, description="fuzz")
            lengths.append(time.monotonic() - t0)
            returned = True
            while True:  # the interrupt comes after the run: wait for it here
                fired.wait(0.05)
        except caught:
            landed += not returned
    stop_hog.set()
    for t in hogs:
        t.join(60)
    ok = run_code(PROGRAM, tools, runtime=pool, timeout=10, description="fuzz").result == 4
    settle(pool)
    with pool._lock:
        busy = pool._core.busy()
        places = {s.state for s in pool._core.slots.values()}
        shares = len(pool._core.computing) + len(pool._core.share_queue) + len(pool._share_waits)
    # Descriptors beside the workers' own (3 pipes and a pidfd each: the
    # spares kept ready may differ from the baseline's).
    spares = pool._core.spares_ready()
    rest = others(pool)
    end = time.monotonic() + 10.0
    while True:  # (a killed worker is a zombie until the fork server reaps it, at once)
        kids = processes(pool)  # the workers: the fork servers' children
        if "Z" not in kids.values() or time.monotonic() > end:
            break
        time.sleep(0.05)
    out = {
        "interrupts": n,
        "in_a_run": landed,
        "next_run_works": ok,
        "busy_places": busy,
        "shares_held_or_waited": shares,
        "hog_errors": hog_errors,
        "place_states": sorted(places),
        "zombies": sorted(p for p, s in kids.items() if s == "Z"),
        "processes": len(kids),
        "workers": len(pool._workers),
        "spares_ready": spares,
        "fds": rest,
        "base_fds": base["fds"],
        "threads": sorted(t.name for t in threading.enumerate()),
        "base_threads": base["threads"],
    }
    pool.close()
    return out


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    rest = sys.argv[3:]
    signame = next((a for a in rest if a.startswith("SIG")), "SIGINT")
    sys.stdout.write(json.dumps(main(n, seed, "contended" in rest, signame)) + "\n")

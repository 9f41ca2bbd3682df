"""4b. Start-up, step by step: what each step of a fork server's child costs in CPU.

A diagnostic beside ``bench_startup.py`` (which times whole runs): it drives
the worker's own functions, so unlike the other rows it reads the runtime's
internals. A probe process is started the way a fork server is
(``python -I -S -B``, ``worker.py`` loaded by path, the engine loaded, the
first context prepared, ``gc.freeze``); it then forks children that each do
the steps of ``worker._become_worker`` up to one point and exit, and reads
each child's CPU (user + system) from ``wait4``: to the microsecond, and
immune to the machine's load but for cache effects. Each step's row is the
median over many children, against the bare fork and exit before it:

* fork and exit: the child's share of a fork (its faults) and its teardown;
* namespaces: ``unshare`` of IPC, network, UTS and mount (and user when not
  root), then ``chroot`` into an empty folder; where the fork server shares
  IPC, network and UTS namespaces with its children
  (``oslimits.share_namespaces``), the probe enters them once too and each
  child makes only its mount namespace (``NOUS_PROBE_SHARE=0``: each child
  makes all of its own, as before). The kernel frees a network
  namespace later on a worker thread of its own, which no process's CPU
  shows (a system-wide profile here: about 0.35 ms per worker);
* privilege drop (as root): the bounding set, groups, uid and gid, capsets;
* the death signal and the seccomp filter (``PR_SET_NO_NEW_PRIVS``, the
  allow list with the child's pid written in);
* the second thread and the task bound (a filter per thread);
* the prepared context: its ``Math.random`` reseeded (and, in versions
  before the fork server's context left the collector room, a collection of
  the child's copy: its copy-on-write faults, made while booting).

Beside them: the fork server's own boot (a new interpreter loading the
engine, amortized over the ``SERVER_CHILDREN`` workers it forks before it is
retired) and a whole one-shot run's CPU, host and child processes.
"""

from __future__ import annotations

import os
import sys
from typing import Any

# (Nothing more at the top: the probe process is a fork server's look-alike,
# and every module it loads is in each child it forks.)

HERE = os.path.dirname(os.path.abspath(__file__))


def probe(worker_py: str, quickjs_path: str, n: int) -> dict[str, float]:  # runs in the probe process
    import importlib.util

    spec = importlib.util.spec_from_file_location("nous_sched_worker_probe", worker_py)
    assert spec is not None and spec.loader is not None
    w: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(w)
    modules = w._load_all(quickjs_path)
    offset, seed_at, prepared = w._prepare_server(modules)
    oslimits = modules[2]
    # As a fork server does before its first fork (where the version measured has it).
    share = getattr(oslimits, "share_namespaces", None)
    shared = share() if share is not None and os.environ.get("NOUS_PROBE_SHARE", "1") == "1" else []
    root = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"nous-probe-root-{os.getpid()}")
    os.makedirs(root, exist_ok=True)
    import _thread
    import gc

    gc.collect()
    gc.freeze()
    libc = oslimits.c_library()
    machine = os.uname().machine
    root_user = os.geteuid() == 0
    parent = os.getpid()

    def namespaces() -> None:
        oslimits._isolate(libc, root, {"namespaces": []})

    def drop() -> None:
        if root_user:
            oslimits._drop_privilege(libc, 65534, 65534, {}, oslimits._BOUNDING or [])

    def seccomp() -> None:
        oslimits._die_with(libc, parent)
        oslimits._install_seccomp(libc, machine)

    def thread() -> None:
        done = _thread.allocate_lock()
        done.acquire()

        def run() -> None:
            oslimits.forbid_tasks()
            done.release()

        _thread.stack_size(w.JS_STACK)
        _thread.start_new_thread(run, ())
        oslimits.forbid_tasks()
        done.acquire()

    # (Before the shared context left the collector room, each child collected its copy while booting.)
    collects = not hasattr(modules[1], "_HEADROOM")

    def context() -> None:
        if prepared is not None:
            w._reseed(prepared, seed_at)
            if collects:
                prepared[0].gc()

    steps = [("fork and exit", None), ("namespaces", namespaces), ("privilege drop", drop)]
    steps += [("death signal, seccomp filter", seccomp), ("second thread, task bound", thread)]
    steps += [("prepared context: reseed (and collect, where the version does)", context)]
    out: dict[str, float] = {}
    for upto in range(len(steps)):
        todo = [fn for _, fn in steps[1 : upto + 1] if fn is not None]
        samples = []
        for _ in range(n + 3):
            pid = os.fork()
            if pid == 0:
                try:
                    for fn in todo:
                        fn()
                finally:
                    os._exit(0)
            _, _, ru = os.wait4(pid, 0)
            samples.append(ru.ru_utime + ru.ru_stime)
        kept = sorted(samples[3:])
        out[steps[upto][0]] = kept[len(kept) // 2]
    os.rmdir(root)
    out["shared"] = len(shared)
    return out


def kernel_threads() -> dict[int, float]:
    """CPU seconds of each kernel worker and RCU thread of the machine (from
    /proc, clock ticks), by pid: where the kernel frees a network namespace,
    which no process's CPU shows."""
    found: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                text = fh.read()
        except OSError:
            continue
        comm = text[text.index(b"(") + 1 : text.rindex(b")")]
        if comm.startswith((b"kworker", b"rcu")):
            fields = text.rsplit(b")", 1)[1].split()
            found[int(pid)] = (int(fields[11]) + int(fields[12])) / tick
    return found


def kernel_threads_since(before: dict[int, float]) -> float:
    """The CPU the kernel's threads used since ``before`` (a thread that
    exited meanwhile counts for nothing; one that started counts whole)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in kernel_threads().items())


def main() -> int:
    import json

    if len(sys.argv) > 1 and sys.argv[1] == "--probe":
        print(json.dumps(probe(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
        return 0
    import resource
    import subprocess
    import time

    import _common as c

    import nous_sched.runtime.pool as pool_module
    from nous_sched import Tool, WorkerPool, run_code
    from nous_sched.runtime import worker
    from nous_sched.runtime.procio import ForkServer, quickjs_origin

    opts = c.options(__doc__.splitlines()[0], default_reps=5, quick_reps=2)
    n = 40 if opts.quick else 150
    us = 1e6
    argv = [sys.executable, "-I", "-S", "-B", os.path.abspath(__file__), "--probe", worker.__file__, quickjs_origin()]
    argv.append(str(n))

    def steps() -> list[c.Row]:
        runs = []
        for _ in range(opts.reps):
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "probe failed")
            runs.append(json.loads(proc.stdout))
        shared = runs[0].pop("shared", 0)
        for r in runs[1:]:
            r.pop("shared", 0)
        names = list(runs[0])
        rows = [
            c.Row(
                "child: fork and exit",
                c.Stats.of([r[names[0]] * us for r in runs]),
                unit="us CPU",
                note=f"median of {n} children per sample, CPU from wait4 (to the microsecond); "
                + (
                    f"{shared} namespaces entered once by the probe, as a fork server does"
                    if shared
                    else "every namespace made by each child"
                ),
            )
        ]
        for before, name in zip(names, names[1:]):
            rows.append(
                c.Row(
                    f"  + {name}",
                    c.Stats.of([(r[name] - r[before]) * us for r in runs]),
                    unit="us CPU",
                )
            )
        rows.append(
            c.Row(
                "child: all of the above",
                c.Stats.of([r[names[-1]] * us for r in runs]),
                unit="us CPU",
            )
        )
        return rows

    def server_boot() -> list[c.Row]:
        import tempfile

        cwd = tempfile.mkdtemp()
        options = WorkerPool()._options_for(cwd)  # noqa: SLF001 - the options a pool gives its server
        costs = []
        for _ in range(max(3, opts.reps)):
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            server = ForkServer(sys.executable, quickjs_origin(), cwd, options, 30.0, 1)
            server.close()
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            costs.append((r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime))
        os.rmdir(cwd)
        per = pool_module.SERVER_CHILDREN
        return [
            c.Row("fork server: boot", c.Stats.of([x * 1e3 for x in costs]), unit="ms CPU"),
            c.Row(
                f"  per worker (retired after {per} children)",
                c.Stats.of([x * us / per for x in costs]),
                unit="us CPU",
                note="without __pycache__ beside worker.py, engine.py and oslimits.py (PYTHONDONTWRITEBYTECODE, "
                "an editable install) the server compiles them on each boot: 10-15 ms more (python -m compileall "
                "nous_sched/runtime writes it; the server reads worker.py's too since it loads it as a module)",
            ),
        ]

    def one_shot() -> list[c.Row]:
        tool = Tool("noop", lambda args: 1, concurrency_safe=lambda args: True)
        pool = WorkerPool()
        me = os.getpid()
        per = 50 if opts.quick else 200

        def own() -> float:
            r = resource.getrusage(resource.RUSAGE_SELF)
            return r.ru_utime + r.ru_stime

        def batch() -> tuple[float, float, float]:
            k0, t0, h0 = kernel_threads(), c.tree_cpu(me), own()
            for _ in range(per):
                r = run_code("return await tools.noop({});", [tool], runtime=pool, description="test")
                assert r.ok, r.error
            time.sleep(0.3)  # the discarded workers reaped, their CPU in the fork server's
            h1 = own()
            t1 = c.tree_cpu(me)
            time.sleep(0.7)  # (the kernel frees a network namespace later)
            return (t1 - t0) / per, (h1 - h0) / per, kernel_threads_since(k0) / per

        try:
            batch()
            samples = [batch() for _ in range(opts.reps)]
        finally:
            pool.close()
        return [
            c.Row(
                "a one-shot run, one tool call: host + child processes",
                c.Stats.of([x * 1e3 for x, _, _ in samples]),
                unit="ms CPU",
                target=c.value_at_most(4.0, "ms CPU"),
                note=f"{per} runs back to back per sample (c.tree_cpu), fork servers' boots and reaped workers included",
            ),
            c.Row("  the host process (every thread)", c.Stats.of([h * 1e3 for _, h, _ in samples]), unit="ms CPU"),
            c.Row(
                "  child processes (fork servers, workers)",
                c.Stats.of([(x - h) * 1e3 for x, h, _ in samples]),
                unit="ms CPU",
                note="the kernel's own threads (a network namespace's cleanup) are in neither",
            ),
            c.Row(
                "  beside them: the machine's kernel threads",
                c.Stats.of([k * 1e3 for _, _, k in samples]),
                unit="ms CPU",
                note="every kworker and rcu thread of the machine, clock ticks, the same runs (another process's "
                "load counts too): where a network namespace is freed",
            ),
        ]

    return c.run(
        "4b. start-up, step by step (CPU)",
        [("steps", steps), ("fork server", server_boot), ("one-shot", one_shot)],
        opts,
    )


if __name__ == "__main__":
    sys.exit(main())

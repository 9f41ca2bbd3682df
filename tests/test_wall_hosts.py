"""The wall holds on a root host and for an unprivileged one.

Each test runs a host program of its own, as root and as an unprivileged
user (:mod:`wallhosts`), whose workers run a compromised-engine stand-in
(native code through ctypes, after every bound applies, as in
``test_wall.py``). The payload talks to its host by writing frames itself:
a call to a tool (``started``, ``ready``) tells the host it is at work.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
from procs import wait_gone
from wallhosts import HOSTS, last_json, run_host, shared_dir, write

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not (sys.platform.startswith("linux") and os.uname().machine == "x86_64"),
        reason="the payloads use x86-64 system call numbers",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="the hosts are started by root (CI runs as root)"),
]

MIB = 1024 * 1024

# Shared by every payload: a raw system call, its errno name, and a frame to the host.
_PRELUDE = """
import ctypes, errno, json, os, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
def call(tool, args):
    envelope = {"calls": [[1, tool, json.dumps(args)]], "logs": [], "dropped": 0, "main": None}
    body = json.dumps(envelope).encode()
    os.write(1, struct.pack(">I", len(body) + 1) + b"E" + body)
"""

# The host's side: a pool whose workers run the payload named by argv[1].
_HOST = """
import json, os, sys, threading, time
from nous_sched import Limits, Tool, WorkerPool, run_code
from nous_sched.runtime import worker

def compromised(size=1):
    os.environ[worker.PAYLOAD_ENV] = sys.argv[1]
    pool = WorkerPool(size=size)
    pool.prestart(1)
    del os.environ[worker.PAYLOAD_ENV]
    return pool

def rss():
    with open("/proc/self/status", encoding="ascii") as fh:
        fields = dict(line.split(":", 1) for line in fh.read().splitlines())
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}

def threads(pid):
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        return int(fh.read().split("Threads:")[1].split()[0])
"""


def _host(kind: str, payload: str, body: str) -> subprocess.CompletedProcess:
    folder = shared_dir()
    try:
        path = write(folder, "payload.py", _PRELUDE + textwrap.dedent(payload))
        return run_host(kind, folder, _HOST + textwrap.dedent(body), path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("kind", HOSTS)
def test_a_worker_outlives_no_sigkilled_host(kind):
    # The payload tells its host it is running, then holds the interpreter's
    # lock for an hour: the worker's watchdog can never act on the lifeline's
    # end, so only the parent-death signal can end it. The host is SIGKILLed.
    proc = _host(
        kind,
        """
        call("ready", {"pid": os.getpid()})
        ctypes.PyDLL(None).sleep(3600)  # (a PyDLL call keeps the lock)
        """,
        """
        pool = compromised()
        def ready(args):
            print(json.dumps({"worker": args["pid"], "layers": pool.layers}), flush=True)
            os.kill(os.getpid(), 9)
        run_code("/*payload*/", [Tool("ready", ready)], runtime=pool, limits=Limits(timeout=120), description="t")
        """,
    )
    assert proc.returncode == -signal.SIGKILL, (proc.stdout, proc.stderr[-4000:])
    report = last_json(proc)
    assert report["layers"]["parent_death_signal"] is True, "what the kernel holds, read back"
    gone = wait_gone(report["worker"], 30.0)
    if not gone:  # (a failure must not leave it holding its lock for an hour)
        os.kill(report["worker"], signal.SIGKILL)
    assert gone, "the worker died with its fork server, which died with the host"


_BOMB = """
import _thread, time
attempts = {"clone_thread": sc(56, 0x3D0F00, 0, 0, 0, 0), "clone3": sc(435, 0, 0)}
started = 0
def idle():
    libc.sleep(600)
try:
    _thread.start_new_thread(idle, ())
    started += 1
except RuntimeError as exc:
    attempts["thread"] = str(exc)
call("started", {"pid": os.getpid(), "attempts": attempts, "started": started})
# Go on trying for as long as the worker lives (at most 200 threads: were the
# bound ever gone, this test must not take the machine's pids with it).
refused = 0
while True:
    try:
        if started < 200:
            _thread.start_new_thread(idle, ())
            started += 1
        else:
            time.sleep(0.01)
    except RuntimeError:
        refused += 1
"""


@pytest.mark.parametrize("kind", HOSTS)
def test_a_thread_bomb_stops_at_the_bound_and_another_pool_runs_meanwhile(kind):
    # While the bomb keeps trying in one pool's worker, another pool runs 30
    # programs with a tool call each; then the bomb's run is cancelled.
    proc = _host(
        kind,
        _BOMB,
        """
        bomb, honest = compromised(), WorkerPool(size=2)
        cancel = threading.Event()
        report = {}
        add = Tool("add", lambda a: a["x"] + 1)
        def started(args):
            report.update(args, during=threads(args["pid"]))
            results = [
                run_code("return await tools.add({x: %d})" % i, [add], runtime=honest, description="t")
                for i in range(30)
            ]
            report["honest"] = [r.result if r.error is None else r.error.kind for r in results]
            report["after"] = threads(args["pid"])
            cancel.set()
            return 1
        result = run_code("/*payload*/", [Tool("started", started)], runtime=bomb, cancel=cancel,
                          limits=Limits(timeout=200), description="t")
        report["bomb"] = result.error.kind if result.error else "finished"
        report["task_bound"] = bomb.layers["task_bound"]
        print(json.dumps(report), flush=True)
        """,
    )
    report = last_json(proc)
    assert report["attempts"]["clone_thread"] == "EPERM", report
    assert report["attempts"]["clone3"] != "ok", report
    assert report["started"] == 0 and "can't start new thread" in report["attempts"]["thread"], report
    assert report["during"] == 2 and report["after"] == 2, "the worker's own two threads, no more"
    assert report["honest"] == list(range(1, 31)), report["honest"]
    assert report["bomb"] == "cancelled" and report["task_bound"] is True


@pytest.mark.parametrize("kind", HOSTS)
def test_a_frame_past_the_runs_limits_is_refused_with_the_hosts_memory_unchanged(kind):
    # Under a 10,000-byte log limit (and a 32 MiB heap, whose old bound let
    # 65 MiB through) the payload sends a whole 60 MiB frame. The host
    # refuses it at its header: it never reads the body, and neither its
    # memory now nor its peak grows; the worker is killed and the run gets
    # an error; the pool's next run is correct.
    proc = _host(
        kind,
        """
        body = b"x" * (60 * 1024 * 1024)
        os.write(1, struct.pack(">I", len(body) + 1) + b"E")
        view = memoryview(body)
        while view:
            view = view[os.write(1, view):]
        """,
        """
        pool = compromised(size=2)
        add = Tool("add", lambda a: a["x"] + 1)
        # (Its last expression is its value: the host's TypeScript parser is loaded before the measure.)
        warm = run_code("const v = await tools.add({x: 1}); v", [add], runtime=pool, description="t")
        limits = Limits(max_log_bytes=10_000, memory_bytes=32 * 1024 * 1024)
        before = rss()
        result = run_code("/*payload*/", runtime=pool, limits=limits, description="t")
        after = rss()
        again = run_code("return await tools.add({x: 41})", [add], runtime=pool, description="t")
        print(json.dumps({"before": before, "after": after, "kind": result.error and result.error.kind,
                          "message": result.error and result.error.message, "warm": warm.result,
                          "again": again.result}), flush=True)
        """,
    )
    report = last_json(proc)
    assert report["kind"] == "abort" and "broke the protocol" in report["message"], report
    assert report["after"]["VmRSS"] - report["before"]["VmRSS"] < 4 * MIB, report
    assert report["after"]["VmHWM"] - report["before"]["VmHWM"] < 4 * MIB, report
    assert report["warm"] == 2 and report["again"] == 42


def test_a_worker_whose_parent_is_gone_before_its_death_signal_exits():
    # The race the read-back closes: the parent died after the fork and before
    # PR_SET_PDEATHSIG; the signal would never come, so apply() exits at once.
    code = (
        "import os\n"
        "from nous_sched.runtime import oslimits\n"
        "oslimits.apply(parent=os.getppid() + 1, namespaces=False)\n"
        "print('survived', flush=True)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0 and "survived" not in proc.stdout, (proc.stdout, proc.stderr)
    alive = "import os\nfrom nous_sched.runtime import oslimits\n" + (
        "r = oslimits.apply(parent=os.getppid(), namespaces=False)\nos.write(1, repr(r['pdeathsig']).encode())\n"
    )
    proc = subprocess.run([sys.executable, "-c", alive], capture_output=True, text=True, env=env, timeout=60)
    assert proc.stdout == "True", (proc.stdout, proc.stderr)

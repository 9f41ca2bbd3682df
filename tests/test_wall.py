"""The wall: a worker holds even when the engine inside it is compromised.

A stand-in for a compromised QuickJS: Python code, making native system
calls through ctypes, run inside a real worker of a real pool, at the point
where the engine would run the program (after every bound of the worker
applied: seccomp, the dropped privileges, the namespaces, the memory cap).
The worker reads it from the file named by ``NOUS_SCHED_TEST_PAYLOAD``, which
the host passes on from its own environment only; a program marked
``/*payload*/`` runs it, and the run's result is the payload's report. Each
attack is refused or harmless, the host lives, and the next run is correct.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap

import pytest
from procs import children, descendants, wait_gone

import nous_sched.runtime.pool as pool_module
from nous_sched import Limits, Tool, WorkerPool, run_code
from nous_sched.runtime import worker
from nous_sched.runtime._remote import max_frame

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        not (sys.platform.startswith("linux") and os.uname().machine == "x86_64"),
        reason="the payloads use x86-64 system call numbers",
    ),
]

ROOT = os.geteuid() == 0
MIB = 1024 * 1024

# Shared by every payload: a raw system call, its errno name ("ok" on success).
_PRELUDE = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
HOST = {host}
def sc(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[a if isinstance(a, (bytes, ctypes.Array)) else ctypes.c_long(a) for a in args])
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
"""

SIGNALS = """
siginfo = (ctypes.c_int * 32)(9, 0, -1)  # si_signo SIGKILL, si_code SI_QUEUE
report["kill"] = sc(62, HOST, 9)
report["tkill"] = sc(200, HOST, 9)
report["tgkill"] = sc(234, HOST, HOST, 9)
report["rt_sigqueueinfo"] = sc(129, HOST, 9, siginfo)
report["rt_tgsigqueueinfo"] = sc(297, HOST, HOST, 9, siginfo)
report["pidfd_open"] = sc(434, HOST, 0)
report["pidfd_send_signal"] = sc(424, 0, 9, 0, 0)
report["kill_group"] = sc(62, -HOST, 9)
report["kill_all"] = sc(62, -1, 9)
report["timer_create"] = sc(222, 1, 0, ctypes.create_string_buffer(8))
report["ptrace"] = sc(101, 16, HOST, 0, 0)
report["process_vm_writev"] = sc(311, HOST, 0, 0, 0, 0, 0)
report["F_SETOWN"] = sc(72, 0, 8, HOST)
report["F_SETOWN_EX"] = sc(72, 0, 15, ctypes.create_string_buffer(8))
report["F_SETSIG"] = sc(72, 0, 10, 9)
report["F_SETFL_O_ASYNC"] = sc(72, 0, 4, 0o20000)
report["ioctl_FIOASYNC"] = sc(16, 0, 0x5452, ctypes.create_string_buffer(b"\\1\\0\\0\\0"))
report["ioctl_FIOSETOWN"] = sc(16, 0, 0x8901, ctypes.create_string_buffer(8))
report["F_GETFL"] = sc(72, 0, 3)
"""

CRIPPLE = """
limit = (ctypes.c_uint64 * 2)(5, 5)
report["prlimit_host"] = sc(302, HOST, 7, limit, 0)
report["prlimit_self_by_pid"] = sc(302, os.getpid(), 7, limit, 0)
report["setpriority_host"] = sc(141, 0, HOST, 19)
report["setpriority_self"] = sc(141, 0, 0, 19)
param = (ctypes.c_int * 1)(0)
report["sched_setscheduler_host"] = sc(144, HOST, 5, param)
report["sched_setaffinity_host"] = sc(203, HOST, 8, (ctypes.c_uint64 * 1)(1))
report["sched_setattr_host"] = sc(314, HOST, ctypes.create_string_buffer(56), 0)
report["ioprio_set_host"] = sc(251, 1, HOST, 0)
"""

IPC = """
report["shmget"] = sc(29, 0, 4096, 0o1600)
report["msgget"] = sc(68, 0, 0o1600)
report["semget"] = sc(64, 0, 1, 0o1600)
report["mq_open"] = sc(240, b"nous-wall", 0o100 | 2, 0o600, 0)
report["socket"] = sc(41, 1, 1, 0)
"""

PATHS = """
target = {target!r}.encode()
report["utimensat"] = sc(280, -100, target, 0, 0)
report["setxattr"] = sc(188, target, b"user.wall", b"x", 1, 0)
report["stat"] = sc(4, target, ctypes.create_string_buffer(256))
report["newfstatat"] = sc(262, -100, target, ctypes.create_string_buffer(256), 0)
report["readlink_proc"] = sc(89, b"/proc/%d/cwd" % HOST, ctypes.create_string_buffer(256), 256)
report["readlinkat_proc"] = sc(267, -100, b"/proc/%d/cwd" % HOST, ctypes.create_string_buffer(256), 256)
report["openat"] = sc(257, -100, target, 0)
report["chdir"] = sc(80, b"/")
report["getcwd"] = sc(79, ctypes.create_string_buffer(256), 256)
"""

MEMORY = """
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
size = 800 * 1024 * 1024
addr = libc.mmap(None, size, 3, 0x21, -1, 0)  # PROT_READ|PROT_WRITE, MAP_SHARED|MAP_ANONYMOUS
report["mmap_shared_800MiB"] = "refused" if addr in (None, ctypes.c_void_p(-1).value) else "mapped"
"""

ROOT_ONLY = """
report["reboot"] = sc(169, 0xfee1dead, 672274793, 0x4321FEDC, 0)
report["init_module"] = sc(175, 0, 0, b"")
report["kexec_load"] = sc(246, 0, 0, 0, 0)
report["settimeofday"] = sc(164, ctypes.create_string_buffer(16), 0)
report["setuid0"] = sc(105, 0)
report["capset"] = sc(126, (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)(*[0xFFFFFFFF] * 6))
report["mount"] = sc(165, b"none", b"/", b"tmpfs", 0, 0)
report["chroot"] = sc(161, b"/")
report["unshare"] = sc(272, 0x10000000)
report["setns"] = sc(308, 0, 0)
report["bpf"] = sc(321, 0, 0, 0)
report["execve"] = sc(59, b"/bin/sh", 0, 0)
report["fork"] = sc(57)
report["clone_process"] = sc(56, 17, 0, 0, 0, 0)
report["prctl_pdeathsig_off"] = sc(157, 1, 0, 0, 0, 0)
"""


@pytest.fixture
def compromised(tmp_path, monkeypatch):
    """A pool whose workers run ``body`` (a payload) for a ``/*payload*/`` program."""
    made = []

    def make(body: str, **options) -> WorkerPool:
        path = tmp_path / f"payload-{len(made)}.py"
        path.write_text(_PRELUDE.format(host=os.getpid()) + textwrap.dedent(body), encoding="utf-8")
        monkeypatch.setenv(worker.PAYLOAD_ENV, str(path))
        pool = WorkerPool(size=2, **options)
        pool.prestart(1)
        monkeypatch.delenv(worker.PAYLOAD_ENV)
        made.append(pool)
        return pool

    yield make
    for pool in made:
        pool.close()


def attack(pool: WorkerPool, **limits) -> dict:
    result = run_code("/*payload*/", runtime=pool, limits=Limits(**limits) if limits else None, description="test")
    assert result.error is None, result.error
    assert "payload_error" not in result.result, result.result
    return result.result


def assert_next_run_correct(pool: WorkerPool) -> None:
    seen = []
    tool = Tool("add", lambda a: seen.append(a) or a["x"] + 1)
    result = run_code("return await tools.add({x: 41})", [tool], runtime=pool, description="test")
    assert result.error is None and result.result == 42 and seen == [{"x": 41}]


def test_nothing_can_signal_another_process_or_arrange_a_signal(compromised):
    pool = compromised(SIGNALS)
    report = attack(pool)
    refused = {name: why for name, why in report.items() if name != "F_GETFL"}
    assert refused and all(why == "EPERM" for why in refused.values()), report
    assert report["F_GETFL"] == "ok", "reading flags stays allowed"
    assert_next_run_correct(pool)


def test_the_host_keeps_its_limits_priority_policy_and_cpus(compromised):
    before = (resource.getrlimit(resource.RLIMIT_NOFILE), os.getpriority(os.PRIO_PROCESS, 0), os.sched_getaffinity(0))
    policy = os.sched_getscheduler(0)
    report = attack(compromised(CRIPPLE))
    assert all(why == "EPERM" for why in report.values()), report
    after = (resource.getrlimit(resource.RLIMIT_NOFILE), os.getpriority(os.PRIO_PROCESS, 0), os.sched_getaffinity(0))
    assert after == before and os.sched_getscheduler(0) == policy


def test_no_ipc_channel_and_no_path_reaches_the_host(compromised, tmp_path):
    target = tmp_path / "host-file"
    target.write_text("keep")
    mtime = os.stat(target).st_mtime_ns
    report = attack(compromised(IPC + PATHS.replace("{target!r}", repr(str(target)))))
    assert all(why == "EPERM" for why in report.values()), report
    assert os.stat(target).st_mtime_ns == mtime and target.read_text() == "keep"
    assert os.listxattr(target) == []


# What a worker would need to reach a sibling in the network namespace they
# share (an abstract unix socket, the loopback, netlink), the host's network,
# or a socket it might hold: each call that makes, finds or uses a socket.
NET = """
abstract = ctypes.create_string_buffer(b"\\1\\0\\0nous-wall-sibling", 20)  # sockaddr_un, abstract name
loopback = ctypes.create_string_buffer(b"\\2\\0\\0\\x50\\x7f\\0\\0\\1", 16)  # sockaddr_in 127.0.0.1:80
pair = (ctypes.c_int * 2)()
msg = ctypes.create_string_buffer(56)  # an empty msghdr
report["socket_unix"] = sc(41, 1, 1, 0)
report["socket_unix_dgram"] = sc(41, 1, 2, 0)
report["socket_inet"] = sc(41, 2, 1, 0)
report["socket_inet6"] = sc(41, 10, 2, 0)
report["socket_netlink"] = sc(41, 16, 3, 0)
report["socket_packet"] = sc(41, 17, 3, 0)
report["socketpair"] = sc(53, 1, 1, 0, pair)
report["connect_abstract"] = sc(42, 0, abstract, 20)
report["connect_loopback"] = sc(42, 0, loopback, 16)
report["bind_abstract"] = sc(49, 0, abstract, 20)
report["listen"] = sc(50, 0, 1)
report["accept4"] = sc(288, 0, 0, 0, 0)
report["sendto_abstract"] = sc(44, 1, b"x", 1, 0, abstract, 20)
report["sendmsg"] = sc(46, 1, msg, 0)
report["recvmsg"] = sc(47, 0, msg, 0)
report["sendmmsg"] = sc(307, 1, msg, 1, 0)
report["getsockname"] = sc(51, 0, abstract, (ctypes.c_int * 1)(20))
report["setsockopt"] = sc(54, 0, 1, 2, pair, 4)
report["io_uring_setup"] = sc(425, 1, ctypes.create_string_buffer(120))
"""


def _namespace(pid: int, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


@pytest.mark.skipif(not ROOT, reason="reading another process's namespaces from /proc needs root here")
def test_siblings_share_one_empty_network_namespace_that_none_can_use(compromised):
    # A fork server enters one network (IPC, UTS) namespace for all its
    # children (oslimits: shared namespaces). What keeps siblings apart in it
    # is the allow list: no call that makes, finds or uses a socket.
    pool = compromised(NET)
    pool.prestart(2)
    siblings = pool.pids()
    assert len(siblings) == 2
    bounds = pool.os_bounds
    assert bounds is not None and bounds.get("shared_namespaces") == ["ipc", "net", "uts"], bounds
    host = os.getpid()
    for kind in ("net", "ipc", "uts"):
        assert _namespace(siblings[0], kind) == _namespace(siblings[1], kind) != _namespace(host, kind)
    assert _namespace(siblings[0], "mnt") != _namespace(siblings[1], "mnt"), "each its own mount namespace"
    for pid in siblings:
        with open(f"/proc/{pid}/net/dev", encoding="ascii") as fh:
            interfaces = [line.split(":")[0].strip() for line in fh.read().splitlines()[2:]]
        assert interfaces == ["lo"], interfaces
        with open(f"/proc/{pid}/net/unix", encoding="ascii") as fh:
            assert fh.read().splitlines()[1:] == [], "no unix socket, abstract or bound, in the namespace"
    report = attack(pool)
    assert report and all(why == "EPERM" for why in report.values()), report
    with open(f"/proc/{siblings[1]}/net/unix", encoding="ascii") as fh:
        assert fh.read().splitlines()[1:] == [], "the attack left no socket behind for a sibling"
    assert_next_run_correct(pool)


def test_a_child_sharing_its_servers_namespaces_without_the_filter_does_not_start():
    # Siblings share namespaces only because the filter keeps them apart in
    # them: a child that could not install it refuses to become a worker.
    code = (
        "import os\n"
        "from nous_sched.runtime import oslimits\n"
        "oslimits._SHARED = ('ipc', 'net', 'uts')\n"
        "def broken(libc, machine):\n"
        "    raise OSError(22, 'no filter here')\n"
        "oslimits._install_seccomp = broken\n"
        "try:\n"
        "    oslimits.apply(namespaces=False, uid=os.geteuid(), gid=os.getegid())\n"
        "except OSError as exc:\n"
        "    print('refused:', exc, flush=True)\n"
        "else:\n"
        "    print('started', flush=True)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.stdout.startswith("refused:") and "seccomp" in proc.stdout, (proc.stdout, proc.stderr)


def test_a_pool_without_namespaces_shares_none():
    with WorkerPool(size=1, namespaces=False) as pool:
        pool.prestart(1)
        bounds = pool.os_bounds
    assert bounds is not None and bounds["namespaces"] == [] and "shared_namespaces" not in bounds, bounds


def test_a_shared_mapping_over_the_memory_cap_is_refused(compromised):
    pool = compromised(MEMORY)
    report = attack(pool, memory_bytes=64 * MIB)
    assert report["mmap_shared_800MiB"] == "refused"
    assert_next_run_correct(pool)


def test_the_memory_cap_only_ever_lowers_the_address_space_limit():
    # (oslimits.cap_memory, as a worker's runs call it, in a process of its own.)
    script = textwrap.dedent(
        """
        import resource
        from nous_sched.runtime import oslimits
        base = oslimits._baseline_vm
        # One lowered behind its back before any cap stays.
        resource.setrlimit(resource.RLIMIT_AS, (base + (1 << 32),) * 2)
        assert oslimits.cap_memory(1 << 33) == base + (1 << 32)
        assert resource.getrlimit(resource.RLIMIT_AS) == (base + (1 << 32),) * 2
        assert oslimits.cap_memory(1 << 30) == base + (1 << 30)
        assert resource.getrlimit(resource.RLIMIT_AS) == (base + (1 << 30),) * 2
        # A later, larger cap leaves the lower limit in force.
        assert oslimits.cap_memory(1 << 31) == base + (1 << 30)
        # So does one over a limit lowered behind its back.
        resource.setrlimit(resource.RLIMIT_AS, (base + (1 << 29),) * 2)
        oslimits.cap_memory(1 << 30)
        assert resource.getrlimit(resource.RLIMIT_AS) == (base + (1 << 29),) * 2
        assert oslimits.cap_memory(1 << 28) == base + (1 << 28)
        assert resource.getrlimit(resource.RLIMIT_AS) == (base + (1 << 28),) * 2
        """
    )
    done = subprocess.run([sys.executable, "-c", script], timeout=120, check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(not ROOT, reason="the host runs as root here only")
def test_a_root_hosts_worker_has_no_privilege(compromised):
    pool = compromised(ROOT_ONLY)
    report = attack(pool)
    assert all(why == "EPERM" for why in report.values()), report
    assert pool.os_bounds["dropped_to"] == [65534, 65534]
    assert pool.os_bounds["capabilities_cleared"] is True
    assert pool.layers["unprivileged"] and pool.layers["capabilities_cleared"]
    assert_next_run_correct(pool)


def test_a_frame_far_over_the_limits_is_refused_at_its_header(compromised):
    # The payload writes a header for a 200 MiB envelope and then garbage,
    # instead of letting the engine answer.
    pool = compromised(
        """
        import struct
        os.write(1, struct.pack(">I", 200 * 1024 * 1024) + b"E" + b"x" * 65536)
        report["sent"] = "ok"
        """
    )
    small = Limits(max_output_bytes=1000, max_log_bytes=1000, max_args_bytes=1000, max_calls=10)
    rss = _rss()
    result = run_code("/*payload*/", runtime=pool, limits=small, description="test")
    assert result.error is not None and result.error.kind == "abort", result
    assert "broke the protocol" in result.error.message
    assert _rss() - rss < 50 * MIB
    assert_next_run_correct(pool)


def test_a_compromised_worker_never_sees_a_later_run(compromised):
    # The payload cannot leave a thread behind (the task bound), so it answers
    # its run itself and stays reading everything the host sends after it; the
    # host discards the worker after that run, so the next caller's program
    # and its secret tool result go to another process.
    pool = compromised(
        """
        import json, struct, threading
        try:
            threading.Thread(target=lambda: None, daemon=True).start()
            thread = "started"
        except RuntimeError:
            thread = "refused"
        mine = {"pid": libc.syscall(ctypes.c_long(39)), "thread": thread}
        main = {"state": "fulfilled", "json": json.dumps(mine)}
        envelope = json.dumps({"calls": [], "logs": [], "dropped": 0, "main": main}).encode()
        os.write(1, struct.pack(">I", len(envelope) + 1) + b"E" + envelope)
        while os.read(0, 65536):
            pass
        """
    )
    answer = attack(pool)
    assert answer["thread"] == "refused"
    compromised_pid = answer["pid"]
    assert wait_gone(compromised_pid, 15.0), "the worker that ran the payload was discarded"
    secret = Tool("secret", lambda a: "s3cr3t")
    result = run_code("return await tools.secret({})", [secret], runtime=pool, description="test")
    assert result.result == "s3cr3t"
    assert compromised_pid not in pool.pids()


def test_reuse_is_scoped_to_one_trust_domain(compromised):
    pool = compromised('report["pid"] = libc.syscall(ctypes.c_long(39))')
    alice = pool.domain("alice")
    first = run_code("/*payload*/", runtime=alice, description="test").result["pid"]
    again = run_code("/*payload*/", runtime=alice, description="test").result["pid"]
    assert again == first, "alice's runs reuse her warm worker"
    bob = run_code("/*payload*/", runtime=pool.domain("bob"), description="test").result["pid"]
    anyone = run_code("/*payload*/", runtime=pool, description="test").result["pid"]
    assert len({first, bob, anyone}) == 3


_ORPHAN_HOST = r"""
import os, sys
from nous_sched import WorkerPool, run_code
pool = WorkerPool(size=1)
result = run_code("/*payload*/", runtime=pool, description="payload")
print(result.result["pid"], pool._server.proc.pid, flush=True)
os.kill(os.getpid(), 9)
"""


def test_a_worker_that_skips_its_exit_does_not_outlive_its_host(tmp_path):
    # The payload tries to turn off the parent-death signal and leaves the
    # worker holding its run; the host is then SIGKILLed.
    payload = tmp_path / "payload.py"
    payload.write_text(
        _PRELUDE.format(host=0)
        + 'report["pdeathsig_off"] = sc(157, 1, 0, 0, 0, 0)\nreport["pid"] = libc.syscall(ctypes.c_long(39))\n'
    )
    env = {**os.environ, worker.PAYLOAD_ENV: str(payload)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", _ORPHAN_HOST], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pids = [int(p) for p in proc.stdout.split()]
    assert pids and all(wait_gone(pid, 15.0) for pid in pids), "no worker or fork server outlives its host"


def test_performance_clock_tells_nothing_about_other_runs():
    with WorkerPool(size=1) as pool:
        d = pool.domain("k")
        run_code("let x = 0; for (let i = 0; i < 1e6; i++) x += i; return x", runtime=d, description="test")
        result = run_code(
            "return [performance.now(), Date.now() - performance.timeOrigin]", runtime=d, description="test"
        ).result
    assert 0 <= result[0] < 1000 and 0 <= result[1] < 1000


def test_every_layer_is_reported_on_the_pool():
    with WorkerPool(size=1) as pool:
        assert pool.layers == {}
        pool.prestart(1)
        layers = pool.layers
    assert layers["seccomp_allow_list"] and layers["no_new_privs"] and layers["parent_death_signal"]
    assert layers["unprivileged"] and layers["capabilities_cleared"]
    assert layers["task_bound"] and layers["own_session"]
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled", encoding="ascii") as fh:
            grouped = fh.read().strip() == "1"
    except FileNotFoundError:  # a kernel without autogroup
        grouped = False
    assert layers["cpu_share"] == ("session" if grouped else "one thread")
    assert set(layers) >= {"namespaces", "empty_root", "address_space_limit", "wall_clock_stop"}


def test_a_spawned_worker_reports_no_parent_death_signal_it_does_not_have():
    # A worker started as a fresh interpreter has no parent-death signal (its
    # parent is one of the host's threads): the layer says what the kernel holds.
    with WorkerPool(size=1, start_method="spawn") as pool:
        pool.prestart(1)
        layers = pool.layers
    assert layers["parent_death_signal"] is False
    assert layers["task_bound"] and layers["own_session"] and layers["seccomp_allow_list"]


def _fork_servers() -> set[int]:
    found = set()
    for pid in children():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"--fork-server" in fh.read():
                    found.add(pid)
        except FileNotFoundError:
            pass
    return found


def test_a_fork_server_is_replaced_after_its_children_and_closed_after_the_last(monkeypatch):
    # Every child of a fork server shares its address layout: after
    # SERVER_CHILDREN children (3 here) the pool forks from a new server, and
    # the old one is closed once its last child is gone. Runs go on correct.
    monkeypatch.setitem(pool_module.WALL, "server_children", 3)
    seen: set[int] = set()
    others = _fork_servers()  # other pools' servers (earlier tests' in this process) are not this pool's

    def look(args):
        seen.update(_fork_servers() - others)
        return args["x"] + 1

    with WorkerPool(size=2, spares=1) as pool:
        results = [
            run_code(f"return await tools.look({{x: {i}}})", [Tool("look", look)], runtime=pool, description="t").result
            for i in range(12)
        ]
        assert pool.wait_for_spares(30.0)  # (no spawn in flight: it holds a server that has no child yet)
        successor = pool._successor
        if successor is not None:
            successor.join(30.0)
        assert pool._reaped(15.0)
        current = pool._server.proc.pid
        # Every server still there is the current one or has a child alive.
        idle = [pid for pid in _fork_servers() - others if pid != current and not descendants(pid)]
    assert results == list(range(1, 13))
    assert len(seen) >= 4, "a new fork server every 3 workers"
    assert idle == [], "a replaced server is closed once its last child is gone"
    assert all(wait_gone(pid, 15.0) for pid in seen)


def test_calls_past_the_budget_are_refused_before_they_cross():
    # Past Limits.max_calls the host refuses every call, and audits the first
    # refusal only: the prelude refuses the rest itself, in the host's words,
    # so what a worker sends stays within what the limits let through.
    program = """
        const out = [];
        const calls = [];
        for (let i = 0; i < 10; i++) calls.push(tools.add({x: i}).then(v => v, e => e.message));
        return await Promise.all(calls);
    """
    add = Tool("add", lambda a: a["x"] + 1)
    with WorkerPool(size=1) as pool:
        result = run_code(program, [add], runtime=pool, limits=Limits(max_calls=3), description="test")
    assert result.result[:3] == [1, 2, 3]
    assert all("(Limits.max_calls)" in m for m in result.result[3:]) and len(set(result.result[3:])) == 1
    assert len(result.refused) == 1


def test_arguments_past_the_runs_total_are_refused_before_they_cross():
    program = """
        const r = [];
        for (let i = 0; i < 6; i++) {
            try { r.push(await tools.echo({s: "é".repeat(290)})); } catch (e) { r.push(e.message); }
        }
        return r.map(x => typeof x === "string" ? x : "ok");
    """
    echo = Tool("echo", lambda a: {"n": len(a["s"])})
    with WorkerPool(size=1) as pool:
        result = run_code(program, [echo], runtime=pool, limits=Limits(max_total_args_bytes=1000), description="t")
    assert result.result[0] == "ok"
    assert all("Limits.max_total_args_bytes" in m for m in result.result[2:]), result.result


def test_the_frame_bound_follows_the_runs_limits():
    # A 10,000-byte log limit under a 32 MiB heap: the old bound (twice the
    # heap) let a 60 MiB frame through; the run's limits let far less cross.
    assert max_frame(Limits(max_log_bytes=10_000, memory_bytes=32 * MIB)) < 30 * MIB
    assert max_frame(Limits(max_log_bytes=1000, max_output_bytes=1000, max_total_args_bytes=1000)) < 8 * MIB


def test_a_run_that_uses_every_limit_to_the_full_is_not_cut_by_the_frame_bound():
    # The worst an honest run can send under small limits, in one step: logs
    # of characters escaped in 6 bytes each, a result and arguments of 3-byte
    # characters (the prelude counts characters, the host then refuses them
    # in bytes: the arguments as too big, the result as over its limit), as
    # many calls as the total allows. The run ends as the limits say, never
    # as a broken protocol.
    limits = Limits(
        max_log_bytes=20_000,
        max_log_lines=100,
        max_output_bytes=20_000,
        max_args_bytes=20_000,
        max_total_args_bytes=60_000,
        max_calls=4,
    )
    program = """
        for (let i = 0; i < 100; i++) console.log("\u0001".repeat(199));
        const calls = [];
        for (let i = 0; i < 6; i++) calls.push(tools.echo({s: "\u0800".repeat(19990)}).then(v => 1, e => 0));
        const got = await Promise.all(calls);
        return ["\u0800".repeat(19990 - 20), got];
    """
    echo = Tool("echo", lambda a: 1)
    with WorkerPool(size=1) as pool:
        result = run_code(program, [echo], runtime=pool, limits=limits, description="test")
    assert result.error is not None and result.error.kind == "output_limit", result.error
    assert len(result.logs) == 100 and len(result.refused) == 3
    assert all("Limits.max_args_bytes" in r.message for r in result.refused)


def _rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_the_payload_hook_needs_the_hosts_environment():
    # Without the variable in the host's environment a marked program is just a program.
    assert worker.PAYLOAD_ENV not in os.environ
    with WorkerPool(size=1) as pool:
        result = run_code("/*payload*/ return 1", runtime=pool, description="test")
    assert result.result == 1


def test_fresh_workers_draw_different_random_numbers():
    # The fork server prepares the first run's context once, and every
    # child inherits a copy: each must reseed it, or every run on a fresh
    # worker would draw the same Math.random() sequence as every other.
    with WorkerPool(size=2) as pool:
        drawn = [
            tuple(run_code("return [Math.random(), Math.random()]", runtime=pool, description="test").result)
            for _ in range(6)
        ]
    assert len(set(drawn)) == len(drawn)
    assert all(0 <= x < 1 for pair in drawn for x in pair)


def test_a_durable_run_reading_the_clock_many_times_in_one_step_is_not_cut(tmp_path):
    # A durable run's envelope also carries every clock value it read: 60,000
    # in one step (about 1.4 MB) under limits whose own bound is 1 MiB and a bit.
    from nous_sched import SqliteApprovalStore

    limits = Limits(max_log_bytes=100, max_output_bytes=100, max_total_args_bytes=100, max_calls=1)
    program = "let s = 0; for (let i = 0; i < 60000; i++) s += Math.random(); return s > 0"
    with WorkerPool(size=1) as pool:
        result = run_code(
            program,
            [],
            runtime=pool,
            limits=limits,
            approval_store=SqliteApprovalStore(str(tmp_path / "a.db")),
            description="test",
        )
    assert result.error is None and result.result is True, result.error


_NAMES_PROBE = """
import sys
_, at, size, marker = program.split()
at, size = int(at), int(size)
report["mapped"] = sc(10, at, size, 3)  # mprotect: ENOMEM where any of it is unmapped
report["found"] = report["mapped"] == "ok" and bytes.fromhex(marker) in ctypes.string_at(at, size)
report["held"] = [len(m._NAMES_HELD) for m in list(sys.modules.values()) if hasattr(m, "_NAMES_HELD")]
"""


def _find_in(pid: int, needle: bytes) -> list[int]:
    """Where ``needle`` starts in process ``pid``'s writable memory."""
    found = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            if not fields[1].startswith("rw"):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                data = mem.read(end - start)
            except OSError:
                continue
            at = data.find(needle)
            while at >= 0:
                found.append(start + at)
                at = data.find(needle, at + 1)
    return found


def test_a_compromised_worker_never_sees_another_tool_sets_names(compromised):
    # The fork server keeps a tool set's names text for its later children
    # (tests/test_names_cache.py); a child unmaps every such text at its first
    # run, before the program: native code running as the program finds no
    # trace of another set's names where the server holds them.
    from nous_sched.runtime import engine

    pool = compromised(_NAMES_PROBE)
    marker = os.urandom(8).hex()
    secret = [Tool(f"secret_{marker}_{i}", lambda a: 1) for i in range(200)]  # (over NAMES_OFFER_MIN)
    text, _, key = engine.names_keyed(tuple(sorted(t.name for t in secret)))
    for _ in range(5):  # (the offer follows the run's frame; a spare forked after it holds the text)
        assert run_code("return 1", secret, runtime=pool, description="test").ok
        assert pool.wait_for_spares(30.0)
        if any(key in w.names_held for w in pool._workers.values() if not w.busy):
            break
    assert any(key in w.names_held for w in pool._workers.values() if not w.busy), "a spare inherited it"
    server = pool._server
    assert server is not None
    at = _find_in(server.proc.pid, text)
    assert len(at) == 1, "the server holds the text once, in its own mapping (no copy on its heap)"
    program = f"/*payload*/ {at[0]} {len(text)} {f'secret_{marker}'.encode().hex()}"
    report = run_code(program, [Tool("other", lambda a: 1)], runtime=pool, description="test").result
    assert report["found"] is False and report["mapped"] == "ENOMEM", report
    assert report["held"] == [0], report
    assert_next_run_correct(pool)

"""OS-level bounds a worker process puts on itself before it runs any program.

Standard library only (a worker loads this file by path). :func:`apply` is
called once per worker, after it has imported everything it will ever need
and before the first program; it returns a report of what was applied, which
the worker sends to the host (see :attr:`nous_sched.WorkerPool.os_bounds` and
:attr:`nous_sched.WorkerPool.layers`). In order:

* ``RLIMIT_CORE`` 0, ``RLIMIT_NOFILE`` :data:`NOFILE`;
* namespaces (Linux): new IPC, network, UTS and mount namespaces (and a new
  user namespace when not root), then ``chroot`` into the pool's empty
  folder. Where the kernel refuses, the worker goes on without them and the
  report says so. No PID namespace: a worker cannot start processes, so one
  would hold only itself. A fork server's children share the IPC, network
  and UTS namespaces it entered once (:func:`share_namespaces`): see
  **Shared namespaces** below;
* when running as root: every capability dropped from the bounding set,
  supplementary groups cleared, then the real, effective and saved uid and
  gid set to an unprivileged pair (default 65534, ``nobody``), which clears
  the permitted, effective and ambient sets; the inheritable set is cleared
  with ``capset``;
* ``PR_SET_PDEATHSIG`` (``SIGKILL``) for a fork server's child: it dies with
  its parent (which exits when the host does), as well as on its lifeline's
  end of file. Set *after* the last change of credentials (a change of uid
  clears it), read back with ``PR_GET_PDEATHSIG`` (the report says what the
  kernel holds, not what was asked), and then the parent is checked to be
  still there: a parent that died before the signal was set would never
  send it, so the worker exits at once;
* ``PR_SET_NO_NEW_PRIVS`` and a seccomp filter (Linux x86-64 and AArch64;
  classic BPF installed through ``prctl``, no library needed). It is an
  **allow list**: :data:`ALLOWED` names every system call the worker makes
  once it is set up, each with its reason, found by tracing workers across
  the test suite (``strace -f``); every other call fails with ``EPERM``. A
  few allowed calls are checked by argument (:data:`ARGUMENT_RULES`); a system
  call of another ABI (i386, x32) kills the process.

:func:`prepare`, in a fork server, builds once what every child would
build alike (the filter, with each child's pid written in; the bounding set
emptied but ``CAP_SETPCAP``, which each child then drops itself).

**Shared namespaces.** A fork server enters new IPC, network and UTS
namespaces once, before its first fork, and its children (at most
``SERVER_CHILDREN``) inherit them; each child still makes its own mount
namespace and ``chroot`` (when not root, the server's new user namespace,
which owns them, is shared too). Measured in
``benchmarks/bench_startup_steps.py``: the network namespace was the largest
step of a child's start (about 0.45 ms of its CPU, and about 0.35 ms more on
the kernel's own thread that frees it). What sharing changes: sibling
workers of one fork server are in one empty network namespace (no interface
but a loopback that is down, nothing bound in it), one IPC namespace and one
UTS namespace, which neither the host nor any other fork server's workers
share. What keeps siblings apart there is the allow list, which a worker
holds before any program runs: it names no call that makes, finds or uses a
socket (``socket``, ``socketpair``, ``connect``, ``bind``, ``sendmsg`` ...),
so no abstract unix socket, netlink socket or loopback address can be made
or reached; no System V IPC call (``shmget``, ``msgget``, ``semget``) and no
``mq_open``; no ``sethostname``; and the descriptors a worker holds are its
own two pipes and lifeline. So only a server whose children will install the
filter shares (:func:`share_namespaces` checks that the kernel has seccomp
filters and the machine is one the filter knows), and a child of a sharing
server that fails to install it exits before any program runs
(:func:`apply`). ``tests/test_wall.py`` checks it from both sides.

``RLIMIT_AS`` (the address space, so shared and anonymous mappings count
alike) is set by :func:`cap_memory` before the worker's first program, to the
address space in use when :func:`apply` ran plus that run's allowance.
``RLIMIT_CPU`` is set by :func:`cap_cpu` before a program with a CPU budget:
the kernel's backstop, which holds even where the engine's own stop cannot
run (one long builtin call, native code).

**The task bound.** A worker has exactly two threads, its main thread (the
watchdog) and the thread that runs programs, and can make no more: once the
second exists, each thread installs a second filter of its own
(:func:`forbid_tasks`) that refuses ``clone`` and ``clone3`` (``EPERM``, as
the allow list refuses what it does not name). A thread bomb in a
compromised worker stops at its first ``clone``: it can neither take the
machine's pids nor the quota of the uid the workers of every pool share.
Chosen over the alternatives, measured in ``benchmarks/bench_wall.py``: a
per-worker uid with ``RLIMIT_NPROC`` exists only for a root host (and needs
a range of uids nobody else uses), and a pids cgroup only where cgroup v2 is
delegated to the host; the filter holds on every host that has seccomp, for
any user, and costs one ``prctl`` per thread at start-up (no cost per run).
Without threads, a worker's CPU is at most its one running thread's; each
worker is also the leader of a session of its own (``worker._child``), so
where the kernel groups tasks by session (``sched_autogroup``) one worker
gets one share of the CPU against the host's and every other worker's,
whatever it runs.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
from typing import Any, Optional

__all__ = [
    "apply",
    "cap_memory",
    "cap_cpu",
    "filter_bytes",
    "forbid_tasks",
    "prepare",
    "share_namespaces",
    "ALLOWED",
    "ARGUMENT_RULES",
    "NOFILE",
    "UNPRIVILEGED",
]

NOFILE = 16
#: The uid and gid a worker started by root drops to (``nobody``).
UNPRIVILEGED = 65534

#: Every system call a set-up worker may make, and why. Anything else: EPERM.
ALLOWED = {
    "read": "frames from the host, the lifeline",
    "readv": "a large frame read straight into its buffer",
    "write": "frames to the host",
    "writev": "the C library's buffered writes",
    "close": "closing its own descriptors harms no one",
    "mmap": "the engine's and the interpreter's memory (RLIMIT_AS bounds it)",
    "munmap": "freeing memory",
    "mremap": "growing a buffer",
    "mprotect": "thread stacks' guard pages",
    "madvise": "the allocator returning freed pages",
    "brk": "the heap",
    "futex": "locks between the worker's two threads",
    "set_robust_list": "thread start",
    "rseq": "thread start",
    "clone": "threads only (CLONE_THREAD required, see ARGUMENT_RULES)",
    "clone3": "refused with ENOSYS, so the C library falls back to clone",
    "exit": "a thread ends",
    "exit_group": "the worker ends",
    "rt_sigaction": "the deadline signal's handler",
    "rt_sigprocmask": "the JS thread blocks the deadline signal",
    "rt_sigreturn": "return from the deadline signal's handler",
    "sigaltstack": "the interpreter's fault handler",
    "restart_syscall": "a read interrupted by the deadline signal",
    "tgkill": "to this process only: abort() and raise()",
    "getpid": "the C library's raise()",
    "gettid": "the C library's raise() and thread names",
    "clock_gettime": "deadlines and the engine's CPU budget",
    "clock_getres": "the clock's resolution",
    "gettimeofday": "Date.now()",
    "clock_nanosleep": "sleeping harms no one",
    "nanosleep": "sleeping harms no one",
    "sched_yield": "yielding the CPU to the host between runs",
    "sched_setscheduler": "this thread's own policy between runs (pid 0 only)",
    "prlimit64": "lowering its own limits (pid 0 only)",
    "prctl": "naming its own threads, one more filter per thread (PR_SET_NAME, PR_GET_NAME, PR_SET_SECCOMP)",
    "fcntl": "reading descriptor flags (F_GETFD, F_GETFL, F_SETFD only)",
    "getrandom": "the interpreter's hash seed and Math.random",
}
#: Calls allowed only with these arguments: (argument index, allowed values).
#: ``0`` as a pid means the caller itself. Not ``F_SETFL`` (``O_ASYNC``),
#: ``F_SETOWN``, ``F_SETOWN_EX`` or ``F_SETSIG`` (a signal to another process).
ARGUMENT_RULES = {
    "sched_setscheduler": (0, (0,)),
    "prlimit64": (0, (0,)),
    "prctl": (0, (15, 16, 22)),  # PR_SET_NAME, PR_GET_NAME, PR_SET_SECCOMP (a filter only adds refusals)
    "fcntl": (1, (1, 2, 3)),  # F_GETFD, F_SETFD, F_GETFL
}

_X86_64 = {
    "read": 0, "write": 1, "close": 3, "mmap": 9, "mprotect": 10, "munmap": 11, "brk": 12,
    "rt_sigaction": 13, "rt_sigprocmask": 14, "rt_sigreturn": 15, "readv": 19, "writev": 20,
    "sched_yield": 24, "mremap": 25, "madvise": 28, "nanosleep": 35, "getpid": 39, "clone": 56,
    "exit": 60, "fcntl": 72, "gettimeofday": 96, "sigaltstack": 131, "sched_setscheduler": 144,
    "prctl": 157, "gettid": 186, "futex": 202, "restart_syscall": 219, "clock_gettime": 228,
    "clock_getres": 229, "clock_nanosleep": 230, "exit_group": 231, "tgkill": 234,
    "set_robust_list": 273, "prlimit64": 302, "getrandom": 318, "rseq": 334, "clone3": 435,
    "capset": 126, "unshare": 272,
}  # fmt: skip
_AARCH64 = {
    "fcntl": 25, "close": 57, "read": 63, "write": 64, "readv": 65, "writev": 66, "exit": 93,
    "exit_group": 94, "futex": 98, "set_robust_list": 99, "nanosleep": 101, "clock_gettime": 113,
    "clock_getres": 114, "clock_nanosleep": 115, "sched_setscheduler": 119, "sched_yield": 124,
    "restart_syscall": 128, "tgkill": 131, "sigaltstack": 132, "rt_sigaction": 134,
    "rt_sigprocmask": 135, "rt_sigreturn": 139, "prctl": 167, "gettimeofday": 169, "getpid": 172,
    "gettid": 178, "brk": 214, "munmap": 215, "mremap": 216, "clone": 220, "mmap": 222,
    "mprotect": 226, "madvise": 233, "prlimit64": 261, "getrandom": 278, "rseq": 293, "clone3": 435,
    "capset": 91, "unshare": 97,
}  # fmt: skip
# (audit architecture, syscall table, the first number of a foreign ABI on this arch or None)
_ARCHES = {
    "x86_64": (0xC000003E, _X86_64, 0x40000000),  # x32 system calls have bit 30 set
    "aarch64": (0xC00000B7, _AARCH64, None),
}

# Classic BPF and seccomp constants (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JA = 0x05  # (BPF_JMP | BPF_JA: jump k instructions ahead)
_JSET_K = 0x45
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_EPERM = 1
_ENOSYS = 38
_CLONE_THREAD = 0x00010000
_PR_SET_PDEATHSIG = 1
_PR_GET_PDEATHSIG = 2
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_CAP_LAST = 63
_CAP_SETPCAP = 8
# unshare(2) flags.
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
# Offsets into struct seccomp_data: nr, arch, then args[i] at 16 + 8*i (low word first: little-endian).
_NR = 0
_ARCH = 4
_ARG0 = 16

_baseline_vm = 0  # the address space in use when apply() ran (bytes)


_LIBC: Any = None
#: Made once by :func:`prepare` in a fork server, which its children inherit:
#: the bounding set it left (each child's own, as fork keeps it), and the
#: ``capset`` call with its arguments ready.
_BOUNDING: Optional[list[int]] = None
_CAPSET: Any = None


def c_library() -> Any:
    """The C library (made once: a fork server's children inherit it ready)."""
    global _LIBC
    if _LIBC is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        libc.prctl.restype = ctypes.c_int
        _LIBC = libc
    return _LIBC


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def apply(
    *,
    uid: int = UNPRIVILEGED,
    gid: int = UNPRIVILEGED,
    namespaces: bool = True,
    root: Optional[str] = None,
    parent: Optional[int] = None,
) -> dict[str, Any]:
    """Apply every bound available here; a report of what was applied.

    ``parent``: the pid of the parent to die with (only for a parent with one
    thread: the signal comes when the thread that started this process
    ends); if it is already gone, the process exits (status 0) here.
    ``uid``/``gid``: what a worker started as root drops to. ``namespaces``:
    try new namespaces; ``root``: an empty folder to ``chroot`` into (when
    a namespace or root privilege allows it)."""
    report: dict[str, Any] = {
        "rlimits": {},
        "seccomp": None,
        "no_new_privs": False,
        "pdeathsig": False,
        "namespaces": [],
        "empty_root": False,
        "dropped_to": None,
        "capabilities_cleared": False,
    }
    try:
        import resource
    except ImportError:  # not POSIX
        return report
    linux = sys.platform.startswith("linux")
    libc = c_library() if linux else None
    for name, value in (("RLIMIT_CORE", 0), ("RLIMIT_NOFILE", NOFILE)):
        try:
            resource.setrlimit(getattr(resource, name), (value, value))
            report["rlimits"][name] = value
        except (AttributeError, ValueError, OSError):
            pass
    global _baseline_vm
    _baseline_vm = _vm_size()
    if libc is None:
        return report
    machine = os.uname().machine
    if machine in _ARCHES and _NO_TASKS is None:
        _make_no_tasks(machine)
    root_user = os.geteuid() == 0
    # (Read before the empty root hides /proc; a fork server read it once.)
    bounding = (_bounding_set() if _BOUNDING is None else _BOUNDING) if root_user else []
    if namespaces:
        _isolate(libc, root, report)
    if root_user:
        _drop_privilege(libc, uid, gid, report, bounding)
    if parent is not None:  # after the last change of credentials, which clears it
        report["pdeathsig"] = _die_with(libc, parent)
    if machine in _ARCHES:
        try:
            _install_seccomp(libc, machine)
            report["no_new_privs"] = True
            report["seccomp"] = {"arch": machine, "allowed": sorted(ALLOWED)}
        except OSError as exc:
            report["seccomp_error"] = str(exc)
    if _SHARED and report["seccomp"] is None:
        # Siblings share these namespaces only because the filter keeps them
        # apart in them (see the module docstring): no filter, no worker.
        raise OSError("a fork server's child shares its namespaces but could not install the seccomp filter")
    return report


def _die_with(libc: Any, parent: int) -> bool:
    """``SIGKILL`` when ``parent`` ends; whether the kernel holds it (read
    back). Exits at once if ``parent`` is gone already (its death, before the
    signal was set, would never send it)."""
    libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)
    held = ctypes.c_int(0)
    libc.prctl(_PR_GET_PDEATHSIG, ctypes.addressof(held), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)
    return held.value == 9


def forbid_tasks() -> bool:
    """Refuse every further ``clone`` and ``clone3`` of the calling thread
    (``EPERM``) with a filter of its own, stacked on the allow list; whether
    it is installed. Each thread of a worker calls it once both exist (see
    the module docstring: the task bound)."""
    if _NO_TASKS is None:  # (made by apply() or prepare(), before the filter refuses uname)
        return False
    # (No new privileges: inherited from the thread that installed the allow list.)
    return bool(c_library().prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(_NO_TASKS[1]), 0, 0) == 0)


#: The task bound's filter, ready to install: (its buffer, the ``sock_fprog``).
_NO_TASKS: Any = None


def _make_no_tasks(machine: str) -> None:
    global _NO_TASKS
    raw = _pack(no_tasks_program(machine))
    buf = ctypes.create_string_buffer(raw, len(raw))
    _NO_TASKS = (buf, _Fprog(len(raw) // 8, ctypes.addressof(buf)))


def no_tasks_program(machine: str) -> list[tuple[int, int, int, int]]:
    """The task bound's BPF program: ``clone`` and ``clone3`` fail with
    ``EPERM``, everything else passes on to the allow list."""
    audit_arch, table, _ = _ARCHES[machine]
    return [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ_K, 1, 0, audit_arch),
        (_RET_K, 0, 0, _RET_KILL_PROCESS),
        (_LD_W_ABS, 0, 0, _NR),
        (_JEQ_K, 1, 0, table["clone"]),
        (_JEQ_K, 0, 1, table["clone3"]),
        (_RET_K, 0, 0, _RET_ERRNO | _EPERM),
        (_RET_K, 0, 0, _RET_ALLOW),
    ]


def _vm_size() -> int:
    try:  # (os.open: the io module's text layer costs a millisecond here)
        fd = os.open("/proc/self/statm", os.O_RDONLY)
        try:
            return int(os.read(fd, 256).split()[0]) * os.sysconf("SC_PAGE_SIZE")
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        return 0


#: The namespaces a fork server entered for all its children
#: (:func:`share_namespaces`); its children inherit this.
_SHARED: tuple[str, ...] = ()
#: The namespaces a fork server enters once for all its children.
SHARED_NAMESPACES = ("ipc", "net", "uts")
_FLAGS = {
    "user": _CLONE_NEWUSER,
    "ipc": _CLONE_NEWIPC,
    "net": _CLONE_NEWNET,
    "uts": _CLONE_NEWUTS,
    "mount": _CLONE_NEWNS,
}


def share_namespaces() -> list[str]:
    """In a fork server, before its first fork: enter new IPC, network and
    UTS namespaces once, for every child it will fork (each then makes only
    its own mount namespace); the ones
    entered (and, when not root, the user namespace that owns them). Only
    where each child will install the seccomp filter, which is
    what keeps siblings apart in them (see the module docstring); elsewhere
    nothing, and each child makes all of its own."""
    global _SHARED
    if not sys.platform.startswith("linux") or os.uname().machine not in _ARCHES or not _has_seccomp_filters():
        return []
    libc = c_library()
    names = list(SHARED_NAMESPACES)
    if os.geteuid() != 0:
        # The right to make the others, shared too: a child's uid is not
        # mapped in it, so it could not make a user namespace of its own.
        names = ["user", *names]
    together = 0
    for name in names:
        together |= _FLAGS[name]
    if libc.unshare(together) != 0:
        return []
    _SHARED = tuple(names)
    return list(_SHARED)


def _has_seccomp_filters() -> bool:
    """Whether this kernel has seccomp filters (``Seccomp:`` in
    ``/proc/self/status``; a kernel without ``CONFIG_SECCOMP`` has none)."""
    try:
        fd = os.open("/proc/self/status", os.O_RDONLY)
        try:
            return b"\nSeccomp:" in os.read(fd, 1 << 16)
        finally:
            os.close(fd)
    except OSError:
        return False


def _isolate(libc: Any, root: Optional[str], report: dict[str, Any]) -> None:
    """New namespaces (but those a fork server shares with this process, see
    :func:`share_namespaces`), then the empty root; each only where the
    kernel allows."""
    names = ["ipc", "net", "uts", "mount"]
    if os.geteuid() != 0:
        names = ["user", *names]
    flags = {name: _FLAGS[name] for name in names if name not in _SHARED}
    together = 0
    for flag in flags.values():
        together |= flag
    if libc.unshare(together) == 0:
        report["namespaces"] = sorted(flags)
    else:  # one at a time: keep what the kernel grants
        for name, flag in flags.items():
            if libc.unshare(flag) == 0:
                report["namespaces"].append(name)
    if _SHARED:
        report["namespaces"] = sorted({*report["namespaces"], *_SHARED})
        report["shared_namespaces"] = sorted(_SHARED)
    if root is not None and ("mount" in report["namespaces"] or os.geteuid() == 0):
        try:
            os.chroot(root)
            os.chdir("/")
            report["empty_root"] = True
        except OSError:
            pass


def _drop_privilege(libc: Any, uid: int, gid: int, report: dict[str, Any], bounding: list[int]) -> None:
    """Root: empty the bounding set (``bounding``, what is in it), drop to
    ``uid``/``gid``, clear every capability set."""
    try:
        for cap in bounding:  # (a fork server's child has one left: see prepare())
            libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last: fine
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)  # clears the permitted, effective and ambient sets
        report["dropped_to"] = [uid, gid]
        _clear_capabilities(libc)
        report["capabilities_cleared"] = True
    except OSError as exc:
        report["privilege_error"] = str(exc)


def _capset_call(libc: Any) -> Any:
    """``capset`` with arguments that clear every set of this process, ready
    to call: ``(function, number, header, data)``, or ``None`` here."""
    table = _ARCHES.get(os.uname().machine, (0, {}, None))[1]
    if "capset" not in table:
        return None
    call = libc.syscall
    call.restype = ctypes.c_long
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2: all zero
    return call, ctypes.c_long(table["capset"]), header, data


def _clear_capabilities(libc: Any) -> None:
    capset = _CAPSET if _CAPSET is not None else _capset_call(libc)
    if capset is not None:
        call, number, header, data = capset
        _check(call(number, header, data), "capset")


def cap_memory(limit: int) -> int:
    """Lower ``RLIMIT_AS`` (soft and hard) to the address space in use when
    :func:`apply` ran plus ``limit`` bytes, unless it is lower already; the
    limit now in force (0 when there is none to set)."""
    try:
        import resource
    except ImportError:
        return 0
    total = _baseline_vm + limit
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY and hard <= total:
            return int(hard)
        resource.setrlimit(resource.RLIMIT_AS, (total, total))
    except (AttributeError, ValueError, OSError):  # a platform without it
        return 0
    return total


def cap_cpu(seconds: float) -> int:
    """Lower ``RLIMIT_CPU`` so this process may use ``seconds`` more CPU time:
    its soft limit (``SIGXCPU``, whose default action ends the process) the
    CPU used so far plus ``seconds``, rounded up to the kernel's whole
    seconds, and its hard limit (``SIGKILL``, which nothing catches) one
    second later; unless it is lower already. The soft limit now in force
    (0 when there is none to set). An unprivileged process cannot raise it
    again: the worker serves no further run."""
    try:
        import resource
        import time
    except ImportError:
        return 0
    soft = int(-(-(time.process_time() + seconds) // 1))  # (math is not loaded in a worker)
    try:
        old_soft, old_hard = resource.getrlimit(resource.RLIMIT_CPU)
        infinite = resource.RLIM_INFINITY
        if old_hard != infinite and old_hard <= soft + 1:
            resource.setrlimit(resource.RLIMIT_CPU, (min(soft, old_hard), old_hard))
            return min(soft, int(old_hard))
        if old_soft != infinite and old_soft <= soft:
            soft = int(old_soft)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))
    except (AttributeError, ValueError, OSError):  # a platform without it
        return 0
    return soft


def filter_program(machine: str, own_pid: int) -> list[tuple[int, int, int, int]]:
    """The BPF program as ``(code, jt, jf, k)`` instructions."""
    audit_arch, table, foreign = _ARCHES[machine]
    special = {"clone", "clone3", "tgkill", *ARGUMENT_RULES}
    simple = [table[name] for name in ALLOWED if name not in special]
    prog: list[tuple[int, int, int, int]] = []
    # Wrong architecture (e.g. an i386 `int 0x80` on x86-64): kill.
    prog.append((_LD_W_ABS, 0, 0, _ARCH))
    prog.append((_JEQ_K, 1, 0, audit_arch))
    prog.append((_RET_K, 0, 0, _RET_KILL_PROCESS))
    prog.append((_LD_W_ABS, 0, 0, _NR))
    if foreign is not None:
        prog.append((_JGE_K, 0, 1, foreign))
        prog.append((_RET_K, 0, 0, _RET_KILL_PROCESS))
    # The plainly allowed numbers: a binary search (about eight instructions
    # to a verdict, against one per number in a list). The kernel runs the
    # filter once per system call number when it is installed, to cache the
    # verdicts that read no argument: the install takes about 30 us less
    # (tests/test_seccomp_program.py checks the verdicts). A number found
    # jumps to the shared ALLOW return at the end (offsets filled in once the
    # program's length is known); one not found falls through to the calls
    # with rules, then EPERM.
    jumps: list[int] = []
    _search(sorted(set(simple)), prog, jumps)
    # clone: threads only.
    prog += _arg_block(table["clone"], 0, (), jset=_CLONE_THREAD)
    # clone3: ENOSYS, so the C library falls back to clone (whose flags we can see).
    prog.append((_JEQ_K, 0, 1, table["clone3"]))
    prog.append((_RET_K, 0, 0, _RET_ERRNO | _ENOSYS))
    # tgkill: only to this process (abort() and raise() use it).
    prog += _arg_block(table["tgkill"], 0, (own_pid,))
    for name, (index, values) in ARGUMENT_RULES.items():
        prog += _arg_block(table[name], index, values)
    prog.append((_RET_K, 0, 0, _RET_ERRNO | _EPERM))
    allow_at = len(prog)
    prog.append((_RET_K, 0, 0, _RET_ALLOW))
    for at in jumps:
        code, _, jf, k = prog[at]
        offset = allow_at - at - 1
        if offset > 255:  # a classic BPF jump reaches at most 255 instructions
            raise OSError("seccomp filter too long")
        prog[at] = (code, offset, jf, k)
    return prog


#: The most numbers :func:`_search` tests one by one, in a leaf of its tree.
_LEAF = 4


def _search(nrs: list[int], prog: list[tuple[int, int, int, int]], jumps: list[int]) -> None:
    """Append to ``prog`` a binary search for the number in the accumulator
    among ``nrs`` (sorted): each equality test's true branch is left for the
    caller to aim at ALLOW (its index appended to ``jumps``); a number not
    among them falls through past the code appended here."""
    if len(nrs) <= _LEAF:
        for nr in nrs:
            jumps.append(len(prog))
            # (False: the next test, or past the leaf's last one.)
            prog.append((_JEQ_K, 0, 0, nr))
        return
    half = len(nrs) // 2
    low, high = nrs[:half], nrs[half:]
    test = len(prog)
    prog.append((_JGE_K, 0, 0, high[0]))  # true: the high half, filled in below
    _search(low, prog, jumps)
    # The low half's miss must skip the high half's code: one jump over it.
    skip = len(prog)
    prog.append((_JA, 0, 0, 0))
    prog[test] = (_JGE_K, len(prog) - test - 1, 0, high[0])
    _search(high, prog, jumps)
    prog[skip] = (_JA, 0, 0, len(prog) - skip - 1)


def _arg_block(nr: int, index: int, values: tuple[int, ...], jset: int = 0) -> list[tuple[int, int, int, int]]:
    """System call ``nr``: allowed if the low word of argument ``index`` is one of
    ``values`` (or has a bit of ``jset``), else EPERM; other calls skip the block."""
    tests = [(_JSET_K, 0, 0, jset)] if jset else [(_JEQ_K, 0, 0, v) for v in values]
    n = len(tests)
    block = [(_JEQ_K, 0, n + 3, nr), (_LD_W_ABS, 0, 0, _ARG0 + 8 * index)]
    block += [(code, n - i, 0, k) for i, (code, _, _, k) in enumerate(tests)]
    block += [(_RET_K, 0, 0, _RET_ERRNO | _EPERM), (_RET_K, 0, 0, _RET_ALLOW)]
    return block


#: The filter built once (by :func:`prepare`): (machine, its bytes, the
#: instructions that hold the process's own pid).
_TEMPLATE: Optional[tuple[str, bytes, list[int]]] = None
#: That filter ready to install, also made by :func:`prepare`: (machine, its
#: buffer, the ``sock_fprog`` pointing to it, the byte offsets of the pid).
#: A fork server's child writes its own pid into its copy and installs it.
_FILTER: Any = None


def _pack(prog: list[tuple[int, int, int, int]]) -> bytes:
    return b"".join(struct.pack("=HBBI", code, jt, jf, k) for code, jt, jf, k in prog)


def filter_bytes(machine: str, own_pid: int) -> bytes:
    """:func:`filter_program` as the kernel reads it: from the template
    :func:`prepare` made, with ``own_pid`` written in, when there is one."""
    if _TEMPLATE is not None and _TEMPLATE[0] == machine:
        raw = bytearray(_TEMPLATE[1])
        for at in _TEMPLATE[2]:
            struct.pack_into("=I", raw, 8 * at + 4, own_pid)  # the instruction's k
        return bytes(raw)
    return _pack(filter_program(machine, own_pid))


def prepare() -> None:
    """What every worker's :func:`apply` would otherwise do alike, done once in
    a fork server before it forks them: the C library, the seccomp filter
    (each child writes only its own pid in), and, as root, every capability
    but ``CAP_SETPCAP`` out of the bounding set (it limits only what an
    ``execve`` could gain, which a fork server never does; each child drops
    the last one itself), what is left in it, and the ``capset`` call's
    arguments. Best effort: whatever fails here, :func:`apply` does in full."""
    global _TEMPLATE, _BOUNDING, _CAPSET, _FILTER
    if not sys.platform.startswith("linux"):
        return
    libc = c_library()
    machine = os.uname().machine
    if machine in _ARCHES:
        _make_no_tasks(machine)
        one, two = filter_program(machine, 1), filter_program(machine, 2)
        _TEMPLATE = (machine, _pack(one), [i for i, (a, b) in enumerate(zip(one, two, strict=True)) if a != b])
        buf = ctypes.create_string_buffer(_TEMPLATE[1], len(_TEMPLATE[1]))
        _FILTER = (machine, buf, _Fprog(len(buf) // 8, ctypes.addressof(buf)), [8 * at + 4 for at in _TEMPLATE[2]])
    if os.geteuid() == 0:
        for cap in _bounding_set():
            if cap != _CAP_SETPCAP:
                libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
        _BOUNDING = _bounding_set()
        _CAPSET = _capset_call(libc)


def _bounding_set() -> list[int]:
    """The capabilities in this process's bounding set (every one if unreadable)."""
    try:
        fd = os.open("/proc/self/status", os.O_RDONLY)
        try:
            text = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
        bits = int(text.split(b"CapBnd:", 1)[1].split()[0], 16)
    except (OSError, ValueError, IndexError):
        return list(range(_CAP_LAST + 1))
    return [cap for cap in range(_CAP_LAST + 1) if bits >> cap & 1]


def _ready_filter(machine: str, own_pid: int) -> tuple[Any, Any]:
    """The filter for ``own_pid`` as the kernel takes it: ``(sock_fprog, its
    buffer)`` (the buffer must live until it is installed). A fork server's
    child writes its pid into its copy of the one :func:`prepare` built."""
    if _FILTER is not None and _FILTER[0] == machine:
        _, buf, fprog, words = _FILTER
        for at in words:
            struct.pack_into("=I", buf, at, own_pid)  # the instruction's k
        return fprog, buf
    raw = filter_bytes(machine, own_pid)
    buf = ctypes.create_string_buffer(raw, len(raw))
    return _Fprog(len(raw) // 8, ctypes.addressof(buf)), buf


def _install_seccomp(libc: Any, machine: str) -> None:
    fprog, buf = _ready_filter(machine, os.getpid())
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    _check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "prctl(PR_SET_SECCOMP)")
    del buf

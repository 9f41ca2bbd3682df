"""OS-level bounds a worker process puts on itself before it runs any program.

Standard library only (a worker loads this file by path). :func:`apply` is
called once per worker, after it has imported everything it will ever need
and before the first program; it returns a report of what was applied, which
the worker sends to the host (see :attr:`nous_sched.WorkerPool.os_bounds`).

On POSIX:

* ``RLIMIT_CORE`` 0: a crashed or killed worker leaves no core file;
* ``RLIMIT_NOFILE`` :data:`NOFILE`: a few descriptors, none to spare;
* ``RLIMIT_DATA`` (private writable memory: heap and anonymous mappings),
  set by :func:`cap_memory` before the worker's first program, from that
  run's ``memory_bytes`` (see :class:`nous_sched.WorkerPool`). Soft and hard
  are lowered together, so nothing the worker does later can raise them.

On Linux x86-64 and AArch64, also ``PR_SET_NO_NEW_PRIVS`` and a seccomp
filter (classic BPF, installed through ``prctl``, no library needed). It is a
deny list: every call in :data:`DENIED` fails with ``EPERM`` (so the
interpreter fails cleanly rather than being killed); ``clone`` is allowed only
with ``CLONE_THREAD`` (threads, not processes); ``clone3`` fails with
``ENOSYS``, which makes the C library fall back to ``clone``; ``tgkill`` only
to the worker itself (``abort()`` uses it); a system call of another
architecture or ABI (i386, x32) kills the process. Everything else is
allowed: the worker still needs ``read``/``write`` on its pipes, memory
management, futexes and clocks. Opening any file, even for reading, is
denied, so a compromised engine cannot read the host's files either.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
from typing import Any

__all__ = ["apply", "cap_memory", "DENIED", "NOFILE"]

NOFILE = 16

#: System calls that fail with EPERM, by name (the same list on every architecture).
DENIED = (
    # new programs and processes
    "execve",
    "execveat",
    "fork",
    "vfork",
    # files: no path is ever opened, created, changed or removed
    "open",
    "openat",
    "openat2",
    "creat",
    "open_by_handle_at",
    "name_to_handle_at",
    "unlink",
    "unlinkat",
    "rename",
    "renameat",
    "renameat2",
    "mkdir",
    "mkdirat",
    "rmdir",
    "link",
    "linkat",
    "symlink",
    "symlinkat",
    "chmod",
    "fchmod",
    "fchmodat",
    "chown",
    "fchown",
    "lchown",
    "fchownat",
    "truncate",
    "mknod",
    "mknodat",
    "memfd_create",
    # the network and other processes
    "socket",
    "socketpair",
    "connect",
    "bind",
    "listen",
    "accept",
    "accept4",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_open",
    "pidfd_getfd",
    "pidfd_send_signal",
    "kill",
    "tkill",
    # the system
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "setns",
    "unshare",
    "fsopen",
    "fsmount",
    "move_mount",
    "open_tree",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "personality",
)

_X86_64 = {
    "open": 2, "openat": 257, "openat2": 437, "creat": 85, "open_by_handle_at": 304, "name_to_handle_at": 303,
    "execve": 59, "execveat": 322, "fork": 57, "vfork": 58, "clone": 56, "clone3": 435,
    "socket": 41, "socketpair": 53, "connect": 42, "bind": 49, "listen": 50, "accept": 43, "accept4": 288,
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "pidfd_open": 434, "pidfd_getfd": 438, "pidfd_send_signal": 424, "kill": 62, "tkill": 200, "tgkill": 234,
    "unlink": 87, "unlinkat": 263, "rename": 82, "renameat": 264, "renameat2": 316, "mkdir": 83, "mkdirat": 258,
    "rmdir": 84, "link": 86, "linkat": 265, "symlink": 88, "symlinkat": 266, "chmod": 90, "fchmod": 91,
    "fchmodat": 268, "chown": 92, "fchown": 93, "lchown": 94, "fchownat": 260, "truncate": 76, "mknod": 133,
    "mknodat": 259, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "setns": 308, "unshare": 272,
    "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248, "request_key": 249,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "memfd_create": 319, "personality": 135,
    "fsopen": 430, "fsmount": 432, "move_mount": 429, "open_tree": 428,
}  # fmt: skip
# AArch64 has only the *at forms, and no fork or vfork.
_AARCH64 = {
    "openat": 56, "openat2": 437, "open_by_handle_at": 265, "name_to_handle_at": 264,
    "execve": 221, "execveat": 281, "clone": 220, "clone3": 435,
    "socket": 198, "socketpair": 199, "connect": 203, "bind": 200, "listen": 201, "accept": 202, "accept4": 242,
    "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
    "pidfd_open": 434, "pidfd_getfd": 438, "pidfd_send_signal": 424, "kill": 129, "tkill": 130, "tgkill": 131,
    "unlinkat": 35, "renameat": 38, "renameat2": 276, "mkdirat": 34, "linkat": 37, "symlinkat": 36,
    "fchmod": 52, "fchmodat": 53, "fchown": 55, "fchownat": 54, "truncate": 45, "mknodat": 33,
    "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "setns": 268, "unshare": 97,
    "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "keyctl": 219, "add_key": 217, "request_key": 218,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "memfd_create": 279, "personality": 92,
    "fsopen": 430, "fsmount": 432, "move_mount": 429, "open_tree": 428,
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
_JSET_K = 0x45
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_EPERM = 1
_ENOSYS = 38
_CLONE_THREAD = 0x00010000
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
# Offsets into struct seccomp_data: nr, arch, then args[i] at 16 + 8*i (low word first: little-endian).
_NR = 0
_ARCH = 4
_ARG0 = 16


def apply() -> dict[str, Any]:
    """Apply every bound available here; a report of what was applied."""
    report: dict[str, Any] = {"rlimits": {}, "seccomp": None, "no_new_privs": False}
    try:
        import resource
    except ImportError:  # not POSIX
        return report
    for name, value in (("RLIMIT_CORE", 0), ("RLIMIT_NOFILE", NOFILE)):
        try:
            resource.setrlimit(getattr(resource, name), (value, value))
            report["rlimits"][name] = value
        except (AttributeError, ValueError, OSError):
            pass
    if sys.platform.startswith("linux"):
        machine = os.uname().machine
        if machine in _ARCHES:
            try:
                _install_seccomp(machine)
                report["no_new_privs"] = True
                report["seccomp"] = {"arch": machine, "denied": list(DENIED)}
            except OSError as exc:
                report["seccomp_error"] = str(exc)
    return report


def cap_memory(limit: int) -> int:
    """Lower ``RLIMIT_DATA`` (soft and hard) to ``limit`` bytes unless it is lower
    already; the limit now in force (0 when there is none to set)."""
    try:
        import resource
    except ImportError:
        return 0
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY and hard <= limit:
            return hard
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    except (AttributeError, ValueError, OSError):  # a platform without it
        return 0
    return limit


def filter_program(machine: str, own_pid: int) -> list[tuple[int, int, int, int]]:
    """The BPF program as ``(code, jt, jf, k)`` instructions."""
    audit_arch, table, foreign = _ARCHES[machine]
    denied = [table[name] for name in DENIED if name in table]
    prog: list[tuple[int, int, int, int]] = []
    # Wrong architecture (e.g. an i386 `int 0x80` on x86-64): kill.
    prog.append((_LD_W_ABS, 0, 0, _ARCH))
    prog.append((_JEQ_K, 1, 0, audit_arch))
    prog.append((_RET_K, 0, 0, _RET_KILL_PROCESS))
    prog.append((_LD_W_ABS, 0, 0, _NR))
    if foreign is not None:
        prog.append((_JGE_K, 0, 1, foreign))
        prog.append((_RET_K, 0, 0, _RET_KILL_PROCESS))
    # Each denied number jumps to the shared EPERM return at the end. The
    # offsets are filled in once the length of the program is known.
    jumps = []
    for nr in denied:
        jumps.append(len(prog))
        prog.append((_JEQ_K, 0, 0, nr))
    # clone: threads only.
    prog.append((_JEQ_K, 0, 4, table["clone"]))
    prog.append((_LD_W_ABS, 0, 0, _ARG0))
    prog.append((_JSET_K, 1, 0, _CLONE_THREAD))
    prog.append((_RET_K, 0, 0, _RET_ERRNO | _EPERM))
    prog.append((_RET_K, 0, 0, _RET_ALLOW))
    # clone3: ENOSYS, so the C library falls back to clone (whose flags we can see).
    prog.append((_JEQ_K, 0, 1, table["clone3"]))
    prog.append((_RET_K, 0, 0, _RET_ERRNO | _ENOSYS))
    # tgkill: only to this process (abort() and raise() use it).
    prog.append((_JEQ_K, 0, 4, table["tgkill"]))
    prog.append((_LD_W_ABS, 0, 0, _ARG0))
    prog.append((_JEQ_K, 1, 0, own_pid))
    prog.append((_RET_K, 0, 0, _RET_ERRNO | _EPERM))
    prog.append((_RET_K, 0, 0, _RET_ALLOW))
    prog.append((_RET_K, 0, 0, _RET_ALLOW))
    deny_at = len(prog)
    prog.append((_RET_K, 0, 0, _RET_ERRNO | _EPERM))
    for at in jumps:
        code, _, jf, k = prog[at]
        offset = deny_at - at - 1
        if offset > 255:  # a classic BPF jump reaches at most 255 instructions
            raise OSError("seccomp filter too long")
        prog[at] = (code, offset, jf, k)
    return prog


def _install_seccomp(machine: str) -> None:
    prog = filter_program(machine, os.getpid())
    raw = b"".join(struct.pack("=HBBI", code, jt, jf, k) for code, jt, jf, k in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class _Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _Fprog(len(prog), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    if prctl(_PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")

"""The seccomp filter's program, run by a classic-BPF interpreter here against
its specification (oslimits.ALLOWED and ARGUMENT_RULES): every system call
number, both architectures, the arguments each rule reads. The filter is a
binary search over the plainly allowed numbers (shorter to run, and to cache
when the kernel installs it): it must give exactly the list's verdicts."""

from __future__ import annotations

import struct

import pytest

from nous_sched.runtime import oslimits

ALLOW = 0x7FFF0000
KILL = 0x80000000
EPERM = 0x00050000 | 1
ENOSYS = 0x00050000 | 38
CLONE_THREAD = 0x00010000


def run(prog: list[tuple[int, int, int, int]], nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """The verdict of ``prog`` for one call (``struct seccomp_data``, little-endian)."""
    data = (
        struct.pack("<iI", nr, arch)
        + struct.pack("<Q", 0)
        + b"".join(struct.pack("<Q", a) for a in (tuple(args) + (0,) * 6)[:6])
    )
    acc = 0
    pc = 0
    steps = 0
    while True:
        steps += 1
        assert steps < 1000 and 0 <= pc < len(prog)
        code, jt, jf, k = prog[pc]
        pc += 1
        if code == 0x20:  # LD | W | ABS
            (acc,) = struct.unpack_from("<I", data, k)
        elif code == 0x15:  # JEQ K
            pc += jt if acc == k else jf
        elif code == 0x35:  # JGE K
            pc += jt if acc >= k else jf
        elif code == 0x45:  # JSET K
            pc += jt if acc & k else jf
        elif code == 0x05:  # JA
            pc += k
        elif code == 0x06:  # RET K
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


def expected(machine: str, nr: int, args: tuple[int, ...], own_pid: int) -> int:
    _, table, foreign = oslimits._ARCHES[machine]
    if foreign is not None and nr & 0xFFFFFFFF >= foreign:
        return KILL
    names = {number: name for name, number in table.items()}
    name = names.get(nr)
    first = args[0] if args else 0
    if name == "clone":
        return ALLOW if first & CLONE_THREAD else EPERM
    if name == "clone3":
        return ENOSYS
    if name == "tgkill":
        return ALLOW if first & 0xFFFFFFFF == own_pid else EPERM
    if name in oslimits.ARGUMENT_RULES:
        index, values = oslimits.ARGUMENT_RULES[name]
        value = (args + (0,) * 6)[index] & 0xFFFFFFFF
        return ALLOW if value in values else EPERM
    if name in oslimits.ALLOWED:
        return ALLOW
    return EPERM


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_filter_gives_the_allow_lists_verdict_for_every_call(machine):
    own_pid = 4242
    prog = oslimits.filter_program(machine, own_pid)
    arch = oslimits._ARCHES[machine][0]
    numbers = [*range(0, 1024), 0x40000000, 0x40000000 + 1, 0x7FFFFFFF, -1]
    special = {"clone", "clone3", "tgkill", *oslimits.ARGUMENT_RULES}
    table = oslimits._ARCHES[machine][1]
    probes = {
        (),
        (CLONE_THREAD,),
        (own_pid,),
        (own_pid + 1,),
        (0, 1),
        (0, 2),
        (0, 3),
        (0, 4),
        (15,),
        (16,),
        (22,),
        (1,),
    }
    for nr in numbers:
        for args in probes if any(table[n] == nr for n in special) else [()]:
            assert run(prog, nr, arch, args) == expected(machine, nr, args, own_pid), (machine, nr, args)
    # Another architecture's calls are killed, whatever the number.
    for nr in (0, 1, 59, 435):
        assert run(prog, nr, 0x40000003) == KILL


def test_a_call_comes_to_its_verdict_in_few_instructions():
    # (A list would take one instruction per allowed number for a call not on it.)
    prog = oslimits.filter_program("x86_64", 1)
    longest = 0
    for nr in range(0, 512):
        data_steps = _steps(prog, nr)
        longest = max(longest, data_steps)
    assert longest <= 30, longest


def _steps(prog: list[tuple[int, int, int, int]], nr: int) -> int:
    arch = oslimits._ARCHES["x86_64"][0]
    count = 0
    pc = 0
    acc = 0
    while True:
        count += 1
        code, jt, jf, k = prog[pc]
        pc += 1
        if code == 0x20:
            acc = {0: nr & 0xFFFFFFFF, 4: arch}.get(k, 0)
        elif code in (0x15, 0x35, 0x45):
            hit = acc == k if code == 0x15 else acc >= k if code == 0x35 else bool(acc & k)
            pc += jt if hit else jf
        elif code == 0x05:
            pc += k
        else:
            return count

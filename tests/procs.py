"""Processes the tests count and wait for, read from /proc (Linux)."""

from __future__ import annotations

import contextlib
import os
import select
import signal

from polling import until


def children() -> set[int]:
    """This process's child processes (of every thread)."""
    pids: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children", encoding="ascii") as fh:
                pids.update(int(p) for p in fh.read().split())
        except FileNotFoundError:  # a thread that just exited
            pass
    return pids


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``: its children, theirs, and so on."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children", encoding="ascii") as fh:
                    kids = [int(k) for k in fh.read().split()]
                found.update(kids)
                todo += kids
        except (FileNotFoundError, ProcessLookupError):
            pass
    return found


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``pid`` to exit, on a pidfd (no
    polling); whether it has."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def thread_states(pid: int) -> list[str]:
    """The state letter (``R``, ``S``, ``D``, ``T``, ``Z``...) of every thread
    of process ``pid``; none once it is gone."""
    states = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii") as fh:
                states.append(fh.read().rsplit(")", 1)[1].split()[0])
    except (FileNotFoundError, ProcessLookupError):  # (gone, or a thread of it)
        return []
    return states


def stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (``T``).

    ``kill(pid, SIGSTOP)`` returning is not that: the kernel hands a
    process's signal to one thread, and the others stop only once that
    thread has run and taken it (and a thread inside a system call, a
    ``write`` of its answer, finishes it first); meanwhile the rest go on
    reading, answering and writing. A multi-threaded process (a pool
    worker's JavaScript thread, redis-server's io and bio threads, a Python
    process's lease renewer) can go on for a millisecond or more under load."""
    states = thread_states(pid)
    return bool(states) and set(states) <= {"T", "t"}


def silent(pid: int) -> bool:
    """Whether process ``pid`` can do nothing more until it is continued:
    every thread stopped, or the process ended (gone, or a zombie its
    stopped parent cannot reap)."""
    states = thread_states(pid)
    return set(states) <= {"T", "t", "Z", "X"}


def stop(pid: int, timeout: float = 60.0) -> None:
    """``SIGSTOP`` process ``pid`` and return once every thread of it is
    stopped (or it ended): from then on it answers, writes and computes
    nothing until ``SIGCONT``. ``SIGCONT`` needs no such wait: it takes the
    threads out of ``T`` before ``kill`` returns (they run once scheduled,
    which no test can tell from a slow process)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP)
    if not until(lambda: silent(pid), timeout):
        raise AssertionError(f"process {pid} did not stop within {timeout} s: {thread_states(pid)}")

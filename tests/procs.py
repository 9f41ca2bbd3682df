"""Processes the tests count and wait for, read from /proc (Linux)."""

from __future__ import annotations

import os
import select


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

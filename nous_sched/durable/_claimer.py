"""Who holds a claim, and whether it is still alive: how a dead resume is recognised.

A resume that claims a token names itself in the store (:func:`claimer`): its
host's identity (:func:`host_id`: ``NOUS_SCHED_HOST_ID`` when set, else the
host's name), the kernel's boot id, its pid and the pid's start time (in clock
ticks since boot, from ``/proc``). :func:`claim_alive` answers for such a name:

* ``True``: the same host and boot, and that pid is running with the same
  start time (so a reused pid does not count as the claimer);
* ``False``: the same host and boot and no such process (or a zombie, or
  another process under the pid), or the same host booted since;
* ``None``: it cannot be told from here (another host, no ``/proc``, a name
  in another form): the claim is treated as alive, and is never taken over.

This recognition is for processes sharing one machine. A claimer on another
host is judged by its *lease* (:func:`lease_alive`): the resume writes, in its
progress, the wall-clock time until which it holds the claim, and renews it
every third of the store's ``lease`` (:class:`nous_sched.durable._progress.Renewal`);
a claim whose lease ran out is dead, one without a lease (written before
leases) is never judged dead. The name is sealed with the claimed state
(:mod:`nous_sched.approval_store`), so a row's writer without the key cannot
point a live claim at a dead pid.

``NOUS_SCHED_HOST_ID`` is the seam for hosts whose names are not unique (a
container's name, copied), and for tests that stand for a second host: two
processes with different ids judge each other by the lease alone.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any, Optional

from .. import _validators as v

__all__ = ["claimer", "claim_alive", "lease_alive", "describe", "host_id", "HOST_ID_VARIABLE"]

#: The environment variable that names this host in a claim (default: the host's name).
HOST_ID_VARIABLE = "NOUS_SCHED_HOST_ID"

#: A claimer's name is a few hundred bytes; a longer one was not written here.
_MAX_NAME = 4096
_MAX_HOST = 255


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _started(pid: int) -> Optional[tuple[str, int]]:
    """``(state, start ticks)`` of a running pid, from /proc; None when there is none."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def host_id() -> str:
    """This host's identity in a claim: ``NOUS_SCHED_HOST_ID`` when set and not empty, else the host's name.

    :raises ConfigError: ``NOUS_SCHED_HOST_ID`` is longer than 255 characters or not printable.
    """
    given = os.environ.get(HOST_ID_VARIABLE)
    if not given:
        return socket.gethostname()
    if len(given) > _MAX_HOST or not given.isprintable():
        v.fail("resume", HOST_ID_VARIABLE, given, f"at most {_MAX_HOST} printable characters (this host's id)")
    return given


def claimer() -> str:
    """This process's name for a claim (JSON text)."""
    pid = os.getpid()
    started = _started(pid)
    name = {"host": host_id(), "boot": _boot_id(), "pid": pid, "start": started[1] if started else None}
    return json.dumps(name, separators=(",", ":"), sort_keys=True)


def _parsed(by: Any) -> Optional[dict[str, Any]]:
    if not isinstance(by, str) or len(by) > _MAX_NAME:
        return None
    try:
        found = json.loads(by)
    except (ValueError, RecursionError):  # not a name this module wrote
        return None
    if not isinstance(found, dict) or not isinstance(found.get("pid"), int) or isinstance(found.get("pid"), bool):
        return None
    return found


def claim_alive(by: Any) -> Optional[bool]:
    """Whether the claimer named ``by`` still runs: True, False, or None (cannot tell)."""
    found = _parsed(by)
    boot = _boot_id()
    if found is None or not boot or found.get("host") != host_id():
        return None
    if found.get("boot") != boot:
        return False  # this host booted since the claim
    started = _started(found["pid"])
    if started is None or started[0] in ("Z", "X"):
        return False
    return started[1] == found.get("start")


def lease_alive(by: Any, lease_until: Any, now: float) -> Optional[bool]:
    """Whether the claimer named ``by``, whose progress says it holds the claim until
    ``lease_until`` (epoch seconds; None: no lease), still runs: on this host as
    :func:`claim_alive` says; where that cannot tell, True while the lease lasts,
    False once it ran out, None without a lease."""
    here = claim_alive(by)
    if here is not None:
        return here
    if isinstance(lease_until, bool) or not isinstance(lease_until, (int, float)) or lease_until != lease_until:
        return None
    return bool(lease_until > now)


def describe(by: Any) -> str:
    """A claimer's name for people: ``pid N on HOST``."""
    found = _parsed(by)
    if found is None:
        return str(by)[:200] or "another process"
    return f"pid {found['pid']} on {str(found.get('host'))[:100]}"

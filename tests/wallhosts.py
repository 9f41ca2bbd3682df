"""Hosts of their own for the wall's tests: a host process run as root, or as
an unprivileged user, on the root machine CI runs on.

The unprivileged host is started by a root launcher. Where a folder on the
way to what the host needs (the interpreter, its libraries, this checkout)
is one only root may enter (``/root``, where pyenv and many CI images keep
Python), the launcher gives the host a mount namespace of its own in which
that folder is replaced by a bare one holding just the entries on those
paths, bound to the real ones. Nothing outside the namespace changes. The launcher then drops to :data:`UNPRIVILEGED_UID` (groups, gid,
uid; every capability goes with the uid) and executes the host afresh, so the
host and everything it starts run as that user with no privilege at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

#: The uid and gid of the unprivileged host: no account of the machine's.
UNPRIVILEGED_UID = 61_234
HOSTS = ("root", "unprivileged")

_LAUNCHER = r"""
import ctypes, os, sys, tempfile
libc = ctypes.CDLL(None, use_errno=True)
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
uid, base, host = int(sys.argv[1]), sys.argv[2], sys.argv[3:]

def check(result, what):
    if result != 0:
        raise OSError(ctypes.get_errno(), what)

def first_closed(paths):
    # The first folder on the way to one of `paths` that others may not pass
    # through, and every entry of it on those paths.
    # A needed folder may itself be closed (a checkout made by mktemp -d is
    # 0700): then every entry of it is on the way.
    for path in paths:
        parts = path.strip("/").split("/")
        for i in range(len(parts) + 1):
            folder = "/" + "/".join(parts[:i])
            if os.path.isdir(folder) and not os.stat(folder).st_mode & 0o001:
                entries = set()
                for other in paths:
                    if other == folder:
                        entries.update(os.listdir(folder))
                    elif other.startswith(folder.rstrip("/") + "/"):
                        entries.add(other[len(folder.rstrip("/")) + 1:].split("/")[0])
                return folder, entries
    return None, None

need = sorted({os.path.realpath(p) for p in [sys.executable, *sys.path] if p and os.path.exists(p)})
private = False
for _ in range(32):
    folder, entries = first_closed(need)
    if folder is None:
        break
    if not private:  # (only where something is closed: elsewhere no mount is needed)
        check(libc.unshare(0x00020000), "unshare(CLONE_NEWNS)")
        check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount(MS_PRIVATE)")
        private = True
    bare = tempfile.mkdtemp(dir=base)
    os.chmod(bare, 0o755)
    for entry in entries:
        real = os.path.join(folder, entry)
        stand_in = os.path.join(bare, entry)
        if os.path.isdir(real):
            os.mkdir(stand_in)
        else:
            open(stand_in, "w").close()
        check(libc.mount(real.encode(), stand_in.encode(), None, MS_BIND | MS_REC, None), "bind " + real)
    check(libc.mount(bare.encode(), folder.encode(), None, MS_BIND | MS_REC, None), "bind over " + folder)
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
os.execv(sys.executable, [sys.executable, *host])
"""


def shared_dir() -> str:
    """A fresh folder any user may read (the hosts' scripts and payloads)."""
    path = tempfile.mkdtemp(prefix="nous-wall-")
    os.chmod(path, 0o755)
    return path


def write(folder: str, name: str, text: str) -> str:
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(path, 0o644)
    return path


def run_host(kind: str, folder: str, script: str, *args: str, timeout: float = 240.0) -> subprocess.CompletedProcess:
    """Run ``script`` (a host program's text) as a host of ``kind``
    (:data:`HOSTS`) with ``args``; its completed process (text output)."""
    path = write(folder, "host.py", script)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    env.pop("NOUS_SCHED_TEST_PAYLOAD", None)
    if kind == "root":
        argv = [sys.executable, path, *args]
    else:
        launcher = write(folder, "launcher.py", _LAUNCHER)
        argv = [sys.executable, launcher, str(UNPRIVILEGED_UID), folder, path, *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False, cwd=folder)


def last_json(proc: subprocess.CompletedProcess) -> Any:
    """The last line the host printed, as JSON (its report)."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, (proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
    return json.loads(lines[-1])

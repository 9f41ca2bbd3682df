"""The fork server's own reading of a request and its answer's descriptor:
what ``socket.recv_fds`` / ``socket.send_fds`` would give, in fewer objects
(a page the server writes after a fork is a page copied)."""

from __future__ import annotations

import os
import socket

import pytest

from nous_sched import WorkerPool, run_code
from nous_sched.runtime import worker


def test_the_socket_constants_the_fork_server_uses_are_this_systems():
    assert worker._SOL_SOCKET == socket.SOL_SOCKET
    assert worker._SCM_RIGHTS == socket.SCM_RIGHTS
    assert worker._MSG_DONTWAIT == socket.MSG_DONTWAIT
    assert worker._REQUEST_ANCILLARY == socket.CMSG_LEN(3 * 4)


@pytest.mark.parametrize("count", [0, 1, 3])
def test_a_request_is_read_with_the_descriptors_it_carries(count):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    pipes = [os.pipe() for _ in range(count)]
    try:
        socket.send_fds(a, [b"worker-7 background"], [r for r, _ in pipes])
        msg, fds = worker._request(b.recvmsg)
        assert msg == b"worker-7 background"
        assert len(fds) == count
        for fd, (_, w) in zip(fds, pipes):
            os.write(w, b"x")
            assert os.read(fd, 1) == b"x", "each descriptor received is the one sent, in order"
            os.close(fd)
    finally:
        a.close()
        b.close()
        for r, w in pipes:
            os.close(r)
            os.close(w)


def test_the_answer_carries_a_pidfd_of_the_child_and_the_request():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.read(r, 1)
        os._exit(0)
    try:
        spare = os.pipe()
        worker._spawned(a, pid, list(spare), b"worker-7 background")
        with pytest.raises(OSError):
            os.fstat(spare[0])  # (the server's copies of the child's descriptors are closed)
        msg, fds, _, _ = socket.recv_fds(b, 256, 1)
        assert msg == b"P %d - worker-7 background" % pid
        assert len(fds) == 1
        os.write(w, b"x")
        os.waitpid(pid, 0)
        with pytest.raises(ChildProcessError):
            os.waitid(os.P_PIDFD, fds[0], os.WEXITED | os.WNOHANG)  # a pidfd of that child, now reaped
        os.close(fds[0])
    finally:
        a.close()
        b.close()
        os.close(r)
        os.close(w)


def test_a_fork_server_and_its_workers_load_neither_socket_nor_importlib_util(tmp_path, monkeypatch):
    # What a fork server imports, each worker it forks holds too: socket.py
    # (with selectors) and importlib.util (with importlib._abc) are ~2 ms of
    # every fork server's boot, and nothing there uses them.
    payload = tmp_path / "payload.py"
    payload.write_text(
        "import sys\n"
        "report['loaded'] = [m for m in ('socket', 'selectors', 'importlib.util', 'importlib.machinery') "
        "if m in sys.modules]\n"
        "report['engine'] = 'nous_sched_engine' in sys.modules\n"
        "import gc\n"
        "report['collector'] = gc.isenabled()\n",
        encoding="utf-8",
    )
    monkeypatch.setenv(worker.PAYLOAD_ENV, str(payload))
    with WorkerPool(size=1) as pool:
        pool.prestart(1)
        monkeypatch.delenv(worker.PAYLOAD_ENV)
        result = run_code("/*payload*/", runtime=pool, description="test")
    assert result.error is None, result.error
    # (The boot runs with the collector off: each worker has it on all the same.)
    assert result.result == {"loaded": [], "engine": True, "collector": True}

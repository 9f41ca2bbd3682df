"""A crashed resume is finished safely (issue 43, item 5): a resume killed
(SIGKILL, from outside, a real process) before, during and after each call of
a three-call program, then resumed again: every call runs at most once, every
call that never started runs, and a call whose fate is unknown is reported
for a person to settle (``nous-sched approvals list``/``settle``), after which
the resume completes. SQLite and Redis.

The tools count each run in a file every process shares
(tests/durable/durable_tools.py); the resume to be killed is held at one
point (in a tool, before or after its effect, or at one of the store's
progress writes: tests/durable/proc.py) and killed there.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durable")
sys.path.insert(0, HERE)

import durable_tools  # noqa: E402
import proc as proc_module  # noqa: E402
from procs import stop  # noqa: E402

PROC = os.path.join(HERE, "proc.py")
TOOLS = os.path.join(HERE, "durable_tools.py")
BOUND = 120  # generous: a loaded 2-core machine

# The first run suspends at call #0 (pay needs approval); the resume makes the three calls.
PROGRAM = """
async function safe(call) { try { return await call(); } catch (e) { return "lost: " + e.message; } }
const a = await safe(() => tools.pay({amount: 1}));
const b = await safe(() => tools.read({i: 2}));
const c = await safe(() => tools.read({i: 3}));
return [a, b, c];
"""
CALLS = [["pay", {"amount": 1}], ["read", {"i": 2}], ["read", {"i": 3}]]
ANSWERS = [{"paid": 1}, {"read": 2}, {"read": 3}]

# Where the resume dies, and whether the call's fate is then unknown.
POINTS = {
    "before the call starts": ("store", "before-start", False),
    "during the call, before its effect": ("tool", "before", True),
    "during the call, after its effect": ("tool", "after", True),
    "after the call, before its outcome is recorded": ("store", "before-commit", True),
    "after the call's outcome is recorded": ("store", "after-commit", False),
}


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def env(request, tmp_path):
    if request.param == "sqlite":
        spec = "sqlite:" + str(tmp_path / "approvals.db")
    elif request.param == "redis":
        spec = "redis:" + request.getfixturevalue("redis_url")  # the default prefix, as the command line uses
    else:
        spec = "postgres:" + request.getfixturevalue("postgres_dsn")  # a postgresql:// URL, as the command line takes
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environ = dict(os.environ, NOUS_DURABLE_COUNT=str(tmp_path / "ran.jsonl"), NOUS_DURABLE_MARK=str(tmp_path / "m"))
    environ.pop("NOUS_SCHED_APPROVAL_KEY", None)
    environ["PYTHONPATH"] = root + os.pathsep + environ.get("PYTHONPATH", "")
    return {"env": environ, "tmp": tmp_path, "spec": spec, "count": environ["NOUS_DURABLE_COUNT"]}


def _proc(env, *args, extra=None):
    done = subprocess.run(
        [sys.executable, PROC, *args],
        env={**env["env"], **(extra or {})},
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cli(env, *args):
    store = env["spec"].partition(":")[2]
    done = subprocess.run(
        [sys.executable, "-m", "nous_sched", *args, "--store", store],
        env=env["env"],
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=False,
    )
    return done


def _held_resume(env, token, hold):
    """A resume started and held at ``hold`` (env vars); the process and where it is held."""
    mark = env["tmp"] / "m"
    for old in (mark, env["tmp"] / "m.go"):
        if old.exists():
            old.unlink()
    proc = subprocess.Popen(
        [sys.executable, PROC, "resume", env["spec"], token, '{"0": true}'],
        env={**env["env"], **hold},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + BOUND
    while not (mark.exists() and mark.read_text()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the resume never reached its hold"
        time.sleep(0.02)
    return proc, mark.read_text()


def _killed_resume(env, token, hold):
    """A resume held at ``hold`` (env vars), then SIGKILLed from here."""
    proc, where = _held_resume(env, token, hold)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=BOUND)
    assert proc.returncode == -signal.SIGKILL
    return where


def _lease_ran_out(env, token):
    """Wait until the store judges the token's resume (on another host: by its lease) dead."""
    store = proc_module.store_of(env["spec"])
    deadline = time.monotonic() + BOUND
    while (store.claimed(token) or {}).get("alive") is not False:
        assert time.monotonic() < deadline, "the claim's lease never ran out"
        time.sleep(0.05)


@pytest.mark.parametrize("seq", [0, 1, 2])
@pytest.mark.parametrize("point", list(POINTS))
def test_a_resume_killed_at_each_step_is_finished_safely(env, seq, point):
    _killed_then_finished(env, seq, point, {}, {})


# Another host: the killed resume says it is host-a, the next one host-b (NOUS_SCHED_HOST_ID, the
# documented seam), each its own process; the operator's commands run on a third (this machine's
# name). The same-host rule (is its pid alive?) cannot answer across hosts: the claim's lease does.
HOST_A = {"NOUS_SCHED_HOST_ID": "host-a", "NOUS_DURABLE_LEASE": "1"}
HOST_B = {"NOUS_SCHED_HOST_ID": "host-b", "NOUS_DURABLE_LEASE": "1"}


@pytest.mark.parametrize("seq", [0, 1, 2])
@pytest.mark.parametrize("point", list(POINTS))
def test_a_resume_killed_at_each_step_is_finished_from_another_host(env, seq, point):
    _killed_then_finished(env, seq, point, HOST_A, HOST_B)


def _killed_then_finished(env, seq, point, first_host, next_host):
    program = env["tmp"] / "p.js"
    program.write_text(PROGRAM, encoding="utf-8")
    token = _proc(env, "run", env["spec"], str(program))["token"]
    assert token and durable_tools.ran(env["count"]) == []

    where, when, unknown = POINTS[point]
    name, args = CALLS[seq]
    hold = (
        {"NOUS_DURABLE_HOLD": json.dumps([name, args, when])}
        if where == "tool"
        else {"NOUS_DURABLE_HOLD_STORE": json.dumps([seq, when])}
    )
    said = _killed_resume(env, token, {**hold, **first_host})
    assert str(seq) in said or name in said
    if first_host:
        _lease_ran_out(env, token)
    ran_before = durable_tools.ran(env["count"])
    assert ran_before == CALLS[: seq + (1 if when in ("after", "before-commit", "after-commit") else 0)]

    again = _proc(env, "resume", env["spec"], token, '{"0": true}', extra=next_host)
    if unknown:
        # Stopped at the call whose fate is unknown, nothing run; a person is told what to do.
        assert again["unsettled"] == [seq] and "approvals settle" in again["token_error"]
        assert durable_tools.ran(env["count"]) == ran_before
        listed = _cli(env, "approvals", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        (row,) = [r for r in json.loads(listed.stdout) if r["token"] == token]  # Redis: other tests' rows too
        assert row["state"] == "claimed" and row["resume"]["alive"] is False
        assert row["resume"]["committed"] == list(range(seq))
        assert row["resume"]["in_flight"] == [{"seq": seq, "tool": name, "arguments": args, "settled": None}]
        human = _cli(env, "approvals", "list").stdout
        ours = human[human.index(token) :]
        assert f"#{seq} {name} (fate unknown)" in ours and f"approvals settle {token} {seq} --ran|--not-ran" in ours
        # The person checks the effect (here: the count file) and settles the call.
        fate = "--ran" if [name, args] in ran_before else "--not-ran"
        settled = _cli(env, "approvals", "settle", token, str(seq), fate)
        assert settled.returncode == 0, settled.stderr
        again = _proc(env, "resume", env["spec"], token, '{"0": true}', extra=next_host)

    result = again["out"]["result"]
    assert "error" not in again["out"], again
    lost = unknown and when != "before"  # settled as ran: the program got an error, the tool did not run again
    expected = list(ANSWERS)
    if lost:
        assert result[seq].startswith("lost: ") and "result was lost" in result[seq]
        expected[seq] = result[seq]
    assert result == expected
    (resumed,) = [data for kind, data in again["audit"] if kind == "resumed"]
    assert resumed["took_over"].endswith(" on " + first_host.get("NOUS_SCHED_HOST_ID", socket.gethostname()))
    # Every call ran exactly once, across the killed resume and the ones after it.
    assert durable_tools.ran(env["count"]) == CALLS
    # The token is used up.
    used = _proc(env, "resume", env["spec"], token, '{"0": true}')
    assert "already used" in used["token_error"]


def test_a_stalled_resume_on_another_host_is_taken_over_and_starts_nothing_more(env):
    # A resume on host-a stops (SIGSTOP: a paused VM, a host cut off) inside call #0, after its effect.
    # While its lease lasts, host-b is refused; once it ran out, #0's fate is unknown: a person checks
    # (it ran) and settles it, and host-b takes over and runs #1 and #2. host-a, let go on, finds its
    # claim gone: it records nothing and starts nothing more. Every call ran once.
    program = env["tmp"] / "p.js"
    program.write_text(PROGRAM, encoding="utf-8")
    token = _proc(env, "run", env["spec"], str(program))["token"]
    # host-a's resume is held in call #0 for the whole test (stopped for part of it); its run's deadline
    # (30 s by default) must not end it first, or, let go on, it reports that deadline (kind "timeout")
    # instead of finding its claim gone: a loaded machine took longer than 30 s here. 600 s: the hold's own bound.
    host_a = {"NOUS_SCHED_HOST_ID": "host-a", "NOUS_DURABLE_LEASE": "3", "NOUS_DURABLE_TIMEOUT": "600"}
    stalled, _ = _held_resume(env, token, {"NOUS_DURABLE_HOLD": json.dumps([*CALLS[0], "after"]), **host_a})
    try:
        refused = _proc(env, "resume", env["spec"], token, '{"0": true}', extra=HOST_B)
        assert "host-a" in refused["token_error"] and "lease" in refused["token_error"], refused
        listed = _cli(env, "approvals", "list")
        assert listed.returncode == 0, listed.stderr
        ours = listed.stdout[listed.stdout.index(token) :]
        assert "on host-a: running (its lease runs until" in ours, ours
        stop(stalled.pid)  # (stopped, its lease renewer too, before the wait for its lease to run out)
        _lease_ran_out(env, token)
        again = _proc(env, "resume", env["spec"], token, '{"0": true}', extra=HOST_B)
        assert again["unsettled"] == [0] and "host-a" in again["token_error"], again
        listed = _cli(env, "approvals", "list")
        ours = listed.stdout[listed.stdout.index(token) :]
        assert "on host-a: dead (its lease ran out at" in ours and "#0 pay (fate unknown)" in ours, ours
        assert durable_tools.ran(env["count"]) == CALLS[:1]  # the person checks: it ran
        settled = _cli(env, "approvals", "settle", token, "0", "--ran")
        assert settled.returncode == 0, settled.stderr
        again = _proc(env, "resume", env["spec"], token, '{"0": true}', extra=HOST_B)
        result = again["out"]["result"]
        assert result[0].startswith("lost: ") and result[1:] == ANSWERS[1:], again
        assert durable_tools.ran(env["count"]) == CALLS
    finally:
        (env["tmp"] / "m.go").write_text("go")
        stalled.send_signal(signal.SIGCONT)
    out, err = stalled.communicate(timeout=BOUND)
    assert stalled.returncode == 0, err
    late = json.loads(out.strip().splitlines()[-1])["out"]
    assert late["error"]["kind"] == "abort" and "another resume took over" in late["error"]["message"], late
    assert durable_tools.ran(env["count"]) == CALLS  # host-a ran nothing after it was let go on


_LOST_CLAIM = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import proc
spec, token = sys.argv[2], sys.argv[3]
child = os.fork()
if child == 0:  # host-a's resume: it claims the token and dies (judged dead at once: its process is gone)
    proc.store_of(spec).claim(token)
    os._exit(0)
os.waitpid(child, 0)
store = proc.store_of(spec)
found = store.claimed(token)
by_b = store.take_over(token, found)  # host-b's resume takes it over
out = {"dead": found["alive"] is False}
out["a_finished"] = store.finish_held(token, found["claimed_by"])  # host-a's resume ends after all
now = store.claimed(token)
out["b_holds"] = now is not None and now["claimed_by"] == by_b
out["b_finished"] = store.finish_held(token, by_b)
out["after"] = store.claimed(token)
print(json.dumps(out))
"""


def test_a_resume_that_lost_its_claim_never_finishes_the_token_under_the_one_that_took_it_over(env):
    # A resume judged dead and taken over may still come to its end (its own deadline, its program's last
    # step after its last progress write): the token is the other resume's to finish, not its.
    program = env["tmp"] / "p.js"
    program.write_text(PROGRAM, encoding="utf-8")
    token = _proc(env, "run", env["spec"], str(program))["token"]
    done = subprocess.run(
        [sys.executable, "-c", _LOST_CLAIM, HERE, env["spec"], token],
        env=env["env"],
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"dead": True, "a_finished": False, "b_holds": True, "b_finished": True, "after": None}

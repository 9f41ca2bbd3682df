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
import subprocess
import sys
import time

import pytest

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durable")
sys.path.insert(0, HERE)

import durable_tools  # noqa: E402

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


def _killed_resume(env, token, hold):
    """A resume held at ``hold`` (env vars), then SIGKILLed from here."""
    mark = env["tmp"] / "m"
    if mark.exists():
        mark.unlink()
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
    where = mark.read_text()
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=BOUND)
    assert proc.returncode == -signal.SIGKILL
    return where


@pytest.mark.parametrize("seq", [0, 1, 2])
@pytest.mark.parametrize("point", list(POINTS))
def test_a_resume_killed_at_each_step_is_finished_safely(env, seq, point):
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
    said = _killed_resume(env, token, hold)
    assert str(seq) in said or name in said
    ran_before = durable_tools.ran(env["count"])
    assert ran_before == CALLS[: seq + (1 if when in ("after", "before-commit", "after-commit") else 0)]

    again = _proc(env, "resume", env["spec"], token, '{"0": true}')
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
        again = _proc(env, "resume", env["spec"], token, '{"0": true}')

    result = again["out"]["result"]
    assert "error" not in again["out"], again
    lost = unknown and when != "before"  # settled as ran: the program got an error, the tool did not run again
    expected = list(ANSWERS)
    if lost:
        assert result[seq].startswith("lost: ") and "result was lost" in result[seq]
        expected[seq] = result[seq]
    assert result == expected
    # Every call ran exactly once, across the killed resume and the ones after it.
    assert durable_tools.ran(env["count"]) == CALLS
    # The token is used up.
    used = _proc(env, "resume", env["spec"], token, '{"0": true}')
    assert "already used" in used["token_error"]

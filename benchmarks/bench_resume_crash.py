"""Issue 43, item 5: a resume killed (``kill -9``) at random moments, before and after.

Each cycle: a run suspends at a call that needs approval (a fresh token);
a process resumes it with the call approved and is killed with ``SIGKILL`` at
a random moment of its life (uniform over the time an uncrashed resume
takes, start-up included); then the token is recovered as a person would:
resume it again, and while the resume names a call whose fate is unknown,
settle it from the tools' own count file (it ran iff its effect is there),
then resume again. Counted per store (SQLite, Redis) and per copy of the
package (``--baseline ROOT``: another checkout, e.g. ``/work/main``, run in
the same session):

* **stranded after the kill**: tokens left ``claimed``; of those, how many
  had the approved call never started;
* **stranded after recovery**: tokens still not finished (the baseline cannot
  recover any: a claimed token is never handed out again);
* **settled by a person**: recoveries that needed ``approvals settle``;
* **at-most-once violations**: any call that ran twice; **never ran**: calls
  of a finished token that did not run.

``--takeover``: the resume is killed on one host (``NOUS_SCHED_HOST_ID=host-a``,
the stores' ``lease`` 1 s) and recovered on another (``host-b``), which
cannot see whether host-a's process lives and judges it by its lease alone:
the same counts (:func:`takeover_row`).

    PYTHONPATH=$PWD python benchmarks/bench_resume_crash.py --cycles 50 --baseline /work/main

Needs ``redis-server`` on the PATH for the Redis rows (``--stores sqlite`` skips them).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

# Each call's error is caught, so a call settled as "ran" (its result lost) does not end the program.
PROGRAM = """
async function safe(call) { try { return await call(); } catch (e) { return String(e); } }
const a = await safe(() => tools.pay({amount: 1}));
const b = await safe(() => tools.step({i: 2}));
const c = await safe(() => tools.step({i: 3}));
return [a, b, c];
"""
CALLS = [["pay", {"amount": 1}], ["step", {"i": 2}], ["step", {"i": 3}]]


# -- the driver: one step in a process of its own, under whichever copy of the package PYTHONPATH names ----------


def _tools() -> list[Any]:
    from nous_sched import Tool

    def effect(name: str, args: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.05)  # a call takes a while: a kill can land during it, before or after its effect
        with open(os.environ["CRASH_COUNT"], "a", encoding="utf-8") as f:
            f.write(json.dumps([name, args], sort_keys=True) + "\n")
        time.sleep(0.05)
        return {name: args}

    return [
        Tool("pay", lambda a: effect("pay", a), parameters={"type": "object"}, requires_approval=True),
        Tool("step", lambda a: effect("step", a), parameters={"type": "object"}),
    ]


def _store(spec: str) -> Any:
    import nous_sched

    # BENCH_LEASE: the store's lease (seconds), short, for a recovery on another host that waits for it.
    lease = {"lease": float(os.environ["BENCH_LEASE"])} if os.environ.get("BENCH_LEASE") else {}
    if spec.startswith("redis://"):
        return nous_sched.RedisApprovalStore(spec, **lease)
    return nous_sched.SqliteApprovalStore(spec, **lease)


def driver(argv: list[str]) -> None:
    import nous_sched

    op, spec = argv[0], argv[1]
    store = _store(spec)
    out: dict[str, Any]
    if op == "run":
        result = nous_sched.run_code(PROGRAM, _tools(), approval_store=store, description="bench")
        out = {"token": result.suspended.token}
    elif op == "resume":
        try:
            result = nous_sched.resume(argv[2], {0: True}, _tools(), approval_store=store)
            out = {"error": None if result.error is None else result.error.kind}
        except nous_sched.TokenError as exc:
            out = {"token_error": str(exc), "unsettled": list(getattr(exc, "seqs", ()))}
    elif op == "settle":
        store.settle(argv[2], int(argv[3]), argv[4] == "ran")
        out = {}
    else:  # state
        sid = argv[2].split(".")[0]
        rows = [r for r in store.suspensions() if r["token"].split(".")[0] == sid]
        out = {"state": rows[0]["state"] if rows else None, "resume": rows[0].get("resume") if rows else None}
    sys.stdout.write(json.dumps(out) + "\n")


# -- the cycles ------------------------------------------------------------------------------------


def _call(root: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--driver", *args],
        env={**env, "PYTHONPATH": root},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def _ran(path: str) -> list[Any]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _recover(root: str, env: dict[str, str], spec: str, token: str) -> bool:
    """Resume again; settle a call of unknown fate from the count file, as a person would. Whether it settled one."""
    settled = False
    for _ in range(4):
        again = _call(root, env, "resume", spec, token)
        if not again.get("unsettled"):
            return settled
        seq = again["unsettled"][0]
        fate = "ran" if CALLS[seq] in _ran(env["CRASH_COUNT"]) else "not-ran"
        _call(root, env, "settle", spec, token, str(seq), fate)
        settled = True
    return settled


#: The hosts of a takeover: the resume killed on the first, recovered on the second (each judges the other's
#: claim by its lease alone).
HOSTS = ({"NOUS_SCHED_HOST_ID": "host-a", "BENCH_LEASE": "1"}, {"NOUS_SCHED_HOST_ID": "host-b", "BENCH_LEASE": "1"})


def _cycle(
    root: str, spec: str, folder: str, n: int, span: float, rng: random.Random, hosts: Any = ({}, {})
) -> dict[str, Any]:
    count = os.path.join(folder, f"ran-{n}.jsonl")
    base = dict(os.environ, CRASH_COUNT=count)
    env = {**base, **hosts[1]}
    token = _call(root, env, "run", spec)["token"]
    proc = subprocess.Popen(
        [sys.executable, __file__, "--driver", "resume", spec, token],
        env={**base, **hosts[0], "PYTHONPATH": root},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(rng.uniform(0.0, span))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if hosts[0] != hosts[1]:
        time.sleep(float(hosts[0].get("BENCH_LEASE", "0")) + 0.5)  # another host waits for the claim's lease
    after_kill = _call(root, env, "state", spec, token)["state"]
    pay_started = any(c[0] == "pay" for c in _ran(count))
    settled = _recover(root, env, spec, token) if after_kill == "claimed" else False
    final = _call(root, env, "state", spec, token)["state"]
    if final == "pending":  # killed before its claim: an ordinary resume finishes it
        _call(root, env, "resume", spec, token)
        final = _call(root, env, "state", spec, token)["state"]
    ran = _ran(count)
    return {
        "stranded": after_kill == "claimed",
        "never_started": after_kill == "claimed" and not pay_started,
        "still_stranded": final != "done",
        "settled": settled,
        "violations": sum(ran.count(c) > 1 for c in CALLS),
        "never_ran": sum(ran.count(c) == 0 for c in CALLS) if final == "done" else 0,
    }


def _span(root: str, spec: str, folder: str) -> float:
    env = dict(os.environ, CRASH_COUNT=os.path.join(folder, "span.jsonl"))
    token = _call(root, env, "run", spec)["token"]
    t0 = time.monotonic()
    _call(root, env, "resume", spec, token)
    return time.monotonic() - t0


def _row(root: str, spec: str, cycles: int, seed: int, hosts: Any = ({}, {})) -> dict[str, Any]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="nous-crash-") as folder:
        if not spec.startswith("redis://"):
            spec = os.path.join(folder, spec)
        span = _span(root, spec, folder)
        rows = [_cycle(root, spec, folder, n, span, rng, hosts) for n in range(cycles)]
    total = {k: sum(int(r[k]) for r in rows) for k in rows[0]}
    return {"cycles": cycles, "span_s": round(span, 2), **total}


def takeover_row(root: str, spec: str, cycles: int, seed: int) -> dict[str, Any]:
    """:func:`_row` with each resume killed on host-a and recovered on host-b (:data:`HOSTS`)."""
    return _row(root, spec, cycles, seed, HOSTS)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--driver":
        driver(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--baseline", default="", help="another copy of the package (a checkout's root)")
    parser.add_argument("--stores", default="sqlite,redis")
    parser.add_argument("--seed", type=int, default=43)
    parser.add_argument("--takeover", action="store_true", help="kill on host-a, recover on host-b")
    args = parser.parse_args()
    copies = [("this copy", ROOT)] + ([("baseline", args.baseline)] if args.baseline else [])
    from redis_server import redis_server

    with redis_server() as url:
        for store in args.stores.split(","):
            spec = url if store == "redis" else "approvals.db"
            for label, root in copies:
                row = (takeover_row if args.takeover else _row)(root, spec, args.cycles, args.seed)
                print(f"{store:6} {label:10} {json.dumps(row)}", flush=True)


if __name__ == "__main__":
    main()

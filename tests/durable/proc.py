"""One durable step in a process of its own, for the tests.

    python proc.py run STORE PROGRAM_FILE [auto]
    python proc.py resume STORE TOKEN DECISIONS_JSON [wait]

(a decision in DECISIONS_JSON is true, false or {"grant": {...}}, a Grant's as_dict)

STORE is ``sqlite:PATH``, ``redis:URL`` (``redis:URL#PREFIX`` for a store with its own key prefix) or
``postgres:DSN``. ``NOUS_DURABLE_LEASE`` sets the store's lease (seconds);
``NOUS_DURABLE_TIMEOUT`` a resume's run deadline (seconds; else the library's default, 30);
``NOUS_SCHED_HOST_ID`` (the library's) which host the process stands for. ``auto`` runs with no store and an
approval handler that approves everything (the un-suspended baseline).
``wait`` reads one line from standard input before resuming (a barrier the
test opens for two racing processes at once). Prints one JSON line: the
result's dict, its audit and the suspension.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import durable_tools  # noqa: E402

import nous_sched  # noqa: E402


class _Holding:
    """A real store that holds the resume at one progress write, to be killed there:
    ``NOUS_DURABLE_HOLD_STORE`` is ``[seq, "before-start"|"before-commit"|"after-commit"]``
    (before call seq's start is written, before its outcome is, after its outcome is)."""

    def write_progress(self, token, by, progress):
        seq, when = json.loads(os.environ["NOUS_DURABLE_HOLD_STORE"])
        key = str(seq)
        starting = key in progress["started"] and when == "before-start"
        committing = key in progress["committed"] and when in ("before-commit", "after-commit")
        if (starting or committing) and when != "after-commit":
            durable_tools.hold(f"{when} of call {seq}")
        written = super().write_progress(token, by, progress)
        if committing and when == "after-commit":
            durable_tools.hold(f"{when} of call {seq}")
        return written


class HoldingSqlite(_Holding, nous_sched.SqliteApprovalStore):
    pass


class HoldingRedis(_Holding, nous_sched.RedisApprovalStore):
    pass


class HoldingPostgres(_Holding, nous_sched.PostgresApprovalStore):
    pass


def store_of(spec):
    kind, _, where = spec.partition(":")
    holding = "NOUS_DURABLE_HOLD_STORE" in os.environ
    # NOUS_DURABLE_LEASE: the store's lease, short, for a test that waits for one to run out.
    lease = {"lease": float(os.environ["NOUS_DURABLE_LEASE"])} if os.environ.get("NOUS_DURABLE_LEASE") else {}
    if kind == "sqlite":
        return (HoldingSqlite if holding else nous_sched.SqliteApprovalStore)(where, **lease)
    if kind == "postgres":
        return (HoldingPostgres if holding else nous_sched.PostgresApprovalStore)(where, **lease)
    url, _, prefix = where.partition("#")
    return (HoldingRedis if holding else nous_sched.RedisApprovalStore)(
        url, **({"prefix": prefix} if prefix else {}), **lease
    )


def shown(result):
    return {
        "out": result.to_dict(),
        "audit": [[e.type, dict(e.data)] for e in result.audit],
        "started": [[e.tool, dict(e.arguments)] for e in result.calls],
        "token": result.suspended.token if result.suspended is not None else None,
    }


def _decision(value):
    """A decision as JSON: true, false, or {"grant": Grant.as_dict()} (approved, with that grant)."""
    if isinstance(value, dict) and "grant" in value:
        return nous_sched.Grant.from_dict(value["grant"])
    return value


def main(argv):
    op, spec = argv[0], argv[1]
    if op == "run":
        with open(argv[2], encoding="utf-8") as f:
            code = f.read()
        if len(argv) > 3 and argv[3] == "auto":
            result = nous_sched.run_code(
                code, durable_tools.TOOLS, approval_handler=lambda request: True, description="a test"
            )
        else:
            result = nous_sched.run_code(code, durable_tools.TOOLS, approval_store=store_of(spec), description="a test")
    else:
        decisions = {int(k): _decision(v) for k, v in json.loads(argv[3]).items()}
        if len(argv) > 4 and argv[4] == "wait":
            sys.stdout.write("ready\n")
            sys.stdout.flush()
            sys.stdin.readline()
        try:
            # NOUS_DURABLE_TIMEOUT: for a resume held (tests/durable/durable_tools.py hold) through a whole test.
            timeout = (
                {"timeout": float(os.environ["NOUS_DURABLE_TIMEOUT"])} if os.environ.get("NOUS_DURABLE_TIMEOUT") else {}
            )
            result = nous_sched.resume(
                argv[2], decisions, durable_tools.TOOLS, approval_store=store_of(spec), **timeout
            )
        except nous_sched.UnsettledError as exc:
            sys.stdout.write(json.dumps({"token_error": str(exc), "unsettled": list(exc.seqs)}) + "\n")
            return
        except nous_sched.TokenError as exc:
            sys.stdout.write(json.dumps({"token_error": str(exc)}) + "\n")
            return
    sys.stdout.write(json.dumps(shown(result)) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])

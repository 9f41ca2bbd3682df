"""The command line's durable approval (:mod:`nous_sched.durable`).

* ``nous-sched run PROGRAM.js --tools M --approval-store FILE``: a call that
  needs approval suspends the run; the pending requests and the token are
  printed, and the exit status is 3.
* ``nous-sched resume TOKEN --approve SEQ --deny SEQ --tools M --approval-store FILE``
  continues it by replay (it may suspend again: status 3).
* ``nous-sched approvals list|approve|deny --store FILE`` for an operator:
  the suspensions waiting in a store, and a decision recorded for a later
  resume (by ``nous-sched resume`` or :func:`nous_sched.resume`). ``approve``
  (and ``resume --approve``) may grant later calls to the same tool too
  (:class:`nous_sched.Grant`): ``--grant-calls N`` (N calls in all),
  ``--grant-match KEY`` (repeatable: the calls whose ``KEY`` equals this
  call's), ``--grant-all``; ``--by NAME`` is kept in the audit.
* ``nous-sched approvals settle TOKEN SEQ --ran|--not-ran --store FILE``: a
  person's word on a call a crashed resume started and never finished (``list``
  shows it under ``fate unknown``): ``--ran``, it ran (the program gets an
  error saying its result was lost); ``--not-ran``, the next resume runs it.
  Then ``nous-sched resume TOKEN`` continues the run.

``FILE`` is a SQLite file, a ``redis://`` URL for a Redis store, or a
``postgresql://`` URL for a Postgres store. The
store's tokens and seals use the key in ``NOUS_SCHED_APPROVAL_KEY`` (at least
16 characters) when it is set, else the one kept in the store: set it where
someone who can write the store must not be able to forge a row
(``nous_sched.approval_store``, the threat model); every command that opens
the store (``run``, ``resume``, ``approvals``, ``serve-mcp``) must see the same.

A pending call is shown as an approval question is
(:func:`nous_sched.gate.approval_text.question`: every key, each value clipped on
its own and escaped), so one huge argument can neither flood the terminal nor
push a later one out of sight; ``--json`` prints the whole values.
"""

from __future__ import annotations

import argparse
import os
import time
from types import SimpleNamespace
from typing import Any, Optional, TextIO

from ..errors import ConfigError
from ..gate.approval_text import description_line, question
from .loading import UsageError, load_tools
from .render import human, inert, json_text, result_json

__all__ = ["EXIT_SUSPENDED", "KEY_ENV", "open_store", "runtime_named", "add_parsers", "run", "show_suspended"]

#: The exit status of a run (or resume) that suspended for approval.
EXIT_SUSPENDED = 3


#: The URL schemes of a Postgres approval store (libpq's).
_POSTGRES_SCHEMES = ("postgresql://", "postgres://")

#: The environment variable holding the approval stores' HMAC key (its UTF-8 bytes).
KEY_ENV = "NOUS_SCHED_APPROVAL_KEY"
_MIN_KEY_CHARS = 16


def _key() -> Optional[bytes]:
    value = os.environ.get(KEY_ENV)
    if value is None:
        return None
    if len(value) < _MIN_KEY_CHARS:
        raise UsageError(f"{KEY_ENV} must hold at least {_MIN_KEY_CHARS} characters of secret (openssl rand -hex 32)")
    return value.encode("utf-8", "surrogateescape")


def open_store(spec: str) -> Any:
    """The approval store ``spec`` names: a ``redis://`` URL, a ``postgresql://``
    (or ``postgres://``) URL, or a SQLite file (its key from :data:`KEY_ENV` when set)."""
    from ..durable.approval_store import RedisApprovalStore, SqliteApprovalStore
    from ..durable.postgres_store import PostgresApprovalStore

    key = _key()
    try:
        if spec.startswith(("redis://", "rediss://", "unix://")):
            return RedisApprovalStore(spec, key=key)
        if spec.startswith(_POSTGRES_SCHEMES):
            return PostgresApprovalStore(spec, key=key)
        return SqliteApprovalStore(spec, key=key)
    except (ConfigError, OSError) as exc:
        raise UsageError(f"approval store {_shown(spec)}: {exc}") from None
    except Exception as exc:  # sqlite3.Error: not a database, a locked folder
        raise UsageError(f"approval store {_shown(spec)}: cannot open it: {exc}") from None


def _shown(spec: str) -> str:
    """A store's spec for a message: a URL's password left out."""
    import urllib.parse

    parts = urllib.parse.urlsplit(spec)
    if "://" not in spec or parts.password is None:
        return spec
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def open_state_option(spec: str) -> Any:
    """The state store a ``--state-store`` names (:func:`nous_sched.state.open_state_store`).

    :raises UsageError: it cannot be opened, the store named."""
    from ..state import open_state_store

    try:
        return open_state_store(spec)
    except ConfigError as exc:
        raise UsageError(f"state store {spec}: {exc}") from None


def state_option(args: argparse.Namespace) -> dict[str, Any]:
    """``{"state": State(...)}`` from ``--state SCOPE`` and ``--state-store STORE`` (``{}`` for neither).

    :raises UsageError: ``--state-store`` without ``--state``, or a store that cannot be opened."""
    scope, spec = getattr(args, "state", None), getattr(args, "state_store", None)
    if scope is None and spec is None:
        return {}
    from ..state import State

    if scope is None:
        raise UsageError("--state-store needs --state SCOPE: the scope of the store the program's state is")
    return {"state": State(scope, open_state_option(spec) if spec else None)}


def runtime_named(name: str) -> Any:
    """The runtime a ``--runtime`` choice names: ``None`` (the default pool) for ``worker``."""
    if name != "in-process":
        return None
    from ..runtime.quickjs import QuickJSRuntime

    return QuickJSRuntime()


def add_parsers(sub: Any) -> None:
    """The ``resume`` and ``approvals`` commands."""
    resume = sub.add_parser(
        "resume",
        help="continue a run that suspended for approval",
        description="Resume a suspended run by replay with your decisions. Exit status: 0 success, 1 the program "
        "failed, 2 usage error (a bad, expired or used token), 3 it suspended again.",
    )
    resume.add_argument("token", metavar="TOKEN", help="the token the suspension printed")
    resume.add_argument("--approve", type=int, action="append", default=[], metavar="SEQ", help="approve call SEQ")
    resume.add_argument("--deny", type=int, action="append", default=[], metavar="SEQ", help="deny call SEQ")
    resume.add_argument("--reason", default="", help="the reason kept in the audit with each decision")
    _grant_arguments(resume)
    resume.add_argument("--tools", required=True, metavar="MODULE", help="the same tools module the run used")
    resume.add_argument(
        "--approval-store", required=True, metavar="FILE", help="SQLite file, redis:// or postgresql:// URL"
    )
    resume.add_argument("--timeout", type=float, default=30.0, metavar="S", help="the resumed run's deadline")
    resume.add_argument("--runtime", choices=("worker", "in-process"), default="worker")
    resume.add_argument("--json", action="store_true", help="print one JSON object")
    resume.add_argument(
        "--state", metavar="SCOPE", help="the state scope the run used (run --state): its later operations use it"
    )
    resume.add_argument("--state-store", metavar="STORE", help="where --state's scope is kept, as the run had it")
    approvals = sub.add_parser(
        "approvals",
        help="list the suspended runs in a store, or record a decision",
        description="For an operator: list the suspensions waiting in an approval store, approve or deny a "
        "pending call (the run continues at its next resume), or settle a call a crashed resume left with an "
        "unknown fate (--ran or --not-ran).",
    )
    approvals.add_argument("action", choices=("list", "approve", "deny", "settle"))
    approvals.add_argument("token", nargs="?", metavar="TOKEN", help="the suspension (approve, deny, settle)")
    approvals.add_argument("seq", nargs="?", type=int, metavar="SEQ", help="the call (approve, deny, settle)")
    fate = approvals.add_mutually_exclusive_group()
    fate.add_argument("--ran", action="store_true", help="settle: the call ran (it is not run again)")
    fate.add_argument("--not-ran", action="store_true", help="settle: the call never ran (the next resume runs it)")
    approvals.add_argument("--store", required=True, metavar="FILE", help="SQLite file, redis:// or postgresql:// URL")
    approvals.add_argument("--reason", default="", help="the reason kept in the audit")
    _grant_arguments(approvals)
    approvals.add_argument("--json", action="store_true", help="list as one JSON array")


def _grant_arguments(parser: Any) -> None:
    group = parser.add_argument_group(
        "grants", "approve later calls to the same tool in the run too (with approve; nous_sched.Grant)"
    )
    group.add_argument("--grant-calls", type=int, metavar="N", help="N calls in all, this one counted")
    group.add_argument(
        "--grant-match",
        action="append",
        default=[],
        metavar="KEY",
        help="the calls whose argument KEY equals this call's (repeatable: every KEY must)",
    )
    group.add_argument("--grant-all", action="store_true", help="every call to the tool in the run")
    group.add_argument("--by", default="", help="who grants it, kept in the audit")


def _grant_of(args: argparse.Namespace, arguments: Any) -> Any:
    """The Grant the grant options ask for, for a call with ``arguments``; None when they ask for none."""
    from ..gate.grants import Grant

    if args.grant_calls is None and not args.grant_match and not args.grant_all:
        return None
    if args.grant_all and (args.grant_calls is not None or args.grant_match):
        raise UsageError("--grant-all is every call: give it alone, or --grant-calls / --grant-match")
    matching = None
    if args.grant_match:
        if not isinstance(arguments, dict) or any(k not in arguments for k in args.grant_match):
            missing = [k for k in args.grant_match if not isinstance(arguments, dict) or k not in arguments]
            raise UsageError(f"--grant-match: the call has no argument {inert(str(missing[0]))[:120]!r}")
        matching = {k: arguments[k] for k in args.grant_match}
    try:
        return Grant(calls=args.grant_calls, matching=matching, by=args.by)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _pending_arguments(store: Any, token: str, seq: int) -> Any:
    try:
        record = store.load(token)
    except ConfigError as exc:  # TokenError included
        raise UsageError(str(exc)) from None
    for request in record["pending"]:
        if request["seq"] == seq:
            return request["arguments"]
    return None


def show_suspended(result: Any, out: TextIO, as_json: bool) -> int:
    """Print a suspension: its token and pending requests; the exit status."""
    suspension = result.suspended
    if as_json:
        out.write(json_text({"suspended": suspension.as_dict(), "logs": list(result.logs)}, indent=2) + "\n")
        return EXIT_SUSPENDED
    out.write(f"suspended: {len(suspension.pending)} call(s) need approval\n")
    for request in suspension.pending:
        where = f" at line:col {request.site}" if request.site else ""
        _pending(out, request.seq, request.tool, request.arguments, where, request.code, request.program)
    out.write(f"\ntoken (expires {_when(suspension.expires_at)}):\n  {suspension.token}\n")
    out.write(f"\nlogs ({len(result.logs)}):\n")
    for line in result.logs:
        out.write("  " + inert(line) + "\n")
    return EXIT_SUSPENDED


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``resume`` or ``approvals``: the exit status."""
    if args.command == "resume":
        return _resume(args, out)
    return _approvals(args, out)


def _resume(args: argparse.Namespace, out: TextIO) -> int:
    from .._run.options import build
    from ..durable import ApprovalDecision, resume

    tools = load_tools(args.tools)
    store = open_store(args.approval_store)
    granting = args.grant_calls is not None or bool(args.grant_match) or args.grant_all
    if granting and not args.approve:
        raise UsageError("the grant options go with --approve SEQ")
    decisions = {
        seq: ApprovalDecision(
            True,
            args.reason or "approved",
            _grant_of(args, _pending_arguments(store, args.token, seq)) if granting else None,
        )
        for seq in args.approve
    }
    decisions.update({seq: ApprovalDecision(False, args.reason or "denied") for seq in args.deny})
    try:
        given = {"timeout": args.timeout, "runtime": runtime_named(args.runtime), **state_option(args)}
        options = build("resume", given)
        result = resume(args.token, decisions, tools, approval_store=store, options=options)
    except ConfigError as exc:  # TokenError included: nothing ran
        raise UsageError(str(exc)) from None
    if result.suspended is not None:
        return show_suspended(result, out, args.json)
    if args.json:
        out.write(json_text(result_json(result), indent=2) + "\n")
    else:
        human(result, out)
    return 0 if result.error is None else 1


def _approvals(args: argparse.Namespace, out: TextIO) -> int:
    store = open_store(args.store)
    if args.action == "list":
        return _list(store, out, args.json)
    if args.token is None or args.seq is None:
        raise UsageError(f"approvals {args.action} needs TOKEN and SEQ (see `nous-sched approvals list`)")
    if args.action == "settle":
        return _settle(store, args, out)
    grant = _grant_of(args, _pending_arguments(store, args.token, args.seq)) if args.action == "approve" else None
    if args.action != "approve" and (args.grant_calls is not None or args.grant_match or args.grant_all):
        raise UsageError("a grant approves: the grant options go with approve, not deny")
    try:
        store.decide(args.token, args.seq, args.action == "approve", args.reason, grant=grant)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    granting = "" if grant is None else f", granting {inert(grant.describe())[:300]}"
    out.write(f"{args.action}d call #{args.seq}{granting}; resume the run with its token to continue\n")
    return 0


def _settle(store: Any, args: argparse.Namespace, out: TextIO) -> int:
    if args.ran == args.not_ran:
        raise UsageError("approvals settle needs --ran or --not-ran: did the call run?")
    try:
        settled = store.settle(args.token, args.seq, bool(args.ran))
    except ConfigError as exc:  # TokenError included
        raise UsageError(str(exc)) from None
    if args.json:
        out.write(json_text(settled, indent=2) + "\n")
        return 0
    fate = "ran: the program gets an error saying its result was lost" if args.ran else "not run: the resume runs it"
    out.write(f"settled call #{args.seq} {inert(str(settled['tool'])[:120])}: {fate}\n")
    out.write("resume the run with its token to continue\n")
    return 0


def _list(store: Any, out: TextIO, as_json: bool) -> int:
    rows = store.suspensions()
    if as_json:
        out.write(json_text(rows, indent=2) + "\n")
        return 0
    if not rows:
        out.write("no suspended runs\n")
    for row in rows:
        out.write(f"{row['state']}  expires {_when(row['expires_at'])}\n")
        out.write(f"  token {row['token']}\n")
        if row["description"]:
            out.write(f"  {description_line(str(row['description']))}\n")
        for request in row["pending"]:
            decided = row["decisions"].get(str(request["seq"]))
            verdict = "" if decided is None else (" (approved)" if decided["approved"] else " (denied)")
            if decided is not None and decided.get("grant") is not None:
                verdict = " (approved, with a grant)"
            _pending(out, request["seq"], request["tool"], request["arguments"], verdict, request.get("code"))
        if row.get("resume") is not None:
            _resume_state(out, row)
    return 0


def _resume_state(out: TextIO, row: dict[str, Any]) -> None:
    """How a claimed token's resume stands, and what a person must do."""
    resume = row["resume"]
    alive = {True: "running", False: "dead", None: "cannot tell (another host?)"}[resume["alive"]]
    until = resume.get("lease_until")
    if until is not None and resume["alive"] is not None:
        alive += f" (its lease {'runs until' if resume['alive'] else 'ran out at'} {_when(until)})"
    out.write(f"  resume by {inert(str(row['claimed_by']))}: {alive}; committed {resume['committed']}\n")
    if not resume["tracked"]:
        out.write("  its calls were not recorded (a parked run): it cannot be continued\n")
        return
    for call in resume["in_flight"]:
        settled = call["settled"]
        note = " (fate unknown)" if settled is None else f" (settled: {settled})"
        _pending(out, call["seq"], call["tool"], call["arguments"], note)
    unknown = [c["seq"] for c in resume["in_flight"] if c["settled"] is None]
    if resume["alive"] is False and unknown:
        out.write(f"  it died mid-call: check whether #{unknown[0]} ran, then\n")
        out.write(f"    nous-sched approvals settle {row['token']} {unknown[0]} --ran|--not-ran\n")
    if resume["alive"] is False and not unknown:
        out.write("  it died: resume the token again to continue\n")


def _pending(
    out: TextIO, seq: Any, tool: Any, arguments: Any, note: str, code: Any = None, program: Any = None
) -> None:
    """One pending call: ``#SEQ tool`` and ``note``, then its approval question, indented
    (a reviewed program's own question, ``code`` set: the whole program)."""
    shown = "the program" if isinstance(code, str) else str(tool)[:120]
    out.write(f"  #{inert(str(seq))} {inert(shown)}{note}\n")
    code = code if isinstance(code, str) else None
    asked = SimpleNamespace(tool=tool, arguments=arguments, description="", code=code, program=program)
    for line in question(asked).splitlines():
        out.write(f"    {line}\n")


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(epoch))

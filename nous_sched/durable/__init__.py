"""Durable approval: a run suspends at a gated call and resumes by replay, anywhere, later.

``run_code(..., approval_store=store)`` runs the program as usual until a call
needs approval and no one can answer now (no ``approval_handler``, or one that
returns :data:`DEFER`). Then the run **suspends**: calls already started
finish and commit, no later call starts, and the result's ``suspended`` is a
:class:`Suspension` whose ``token`` resumes it, with the pending
:class:`~nous_sched.ApprovalRequest` (each with its ``seq``). Every gated call
submitted in the same step as the first one (one ``Promise.all``) is pending
with it, and they are decided together.

:func:`resume` (in any process that shares the store) claims the token, at
most once, and **replays**: the program runs again from the start in a fresh
sandbox, and each of its calls is numbered in the order the program made it
(its *seq*). A call whose seq is in the *ledger* (the calls that committed
before the suspension, and the calls a previous resume ran) gets its
recorded outcome without its tool running; ``Date.now()``, ``new Date()``,
``Math.random()`` and ``performance.now()`` return the recorded values, in
order. Because the scheduler commits in submission order, the program sees
exactly what it saw before, ``Promise.all`` included. A pending call gets its
decision: approved, it runs; denied, it rejects with a ``ToolError``. Calls
after the ledger's run live, and the run may suspend again.

A replay that makes a call other than the recorded one at a seq (another
tool, other arguments) ends with a ``replay_diverged`` error and runs
nothing; so does a tool set other than the one that suspended (a hash of the
names and schemas).

Audit: ``suspended`` (the pending seqs), ``approval`` (``seq``, ``tool``,
``approved``, ``reason``) per decision, and ``resumed`` events go to the run's
session log and :attr:`RunResult.audit <nous_sched.RunResult.audit>`;
replayed calls are not audited again as started.

**A crashed resume is finished safely.** A resume writes its progress to
the store as it goes (:mod:`nous_sched.durable._progress`): each call's start
before its tool runs, each outcome when the program gets it, sealed like the
record. When the resuming process dies, a later :func:`resume` of the same
token on the same host (the claimer judged dead: :mod:`nous_sched.durable._claimer`)
takes the claim over in one atomic step, replays what committed and runs
what never started; a call that started and never committed stops it
(:class:`~nous_sched.approval_store.UnsettledError`, nothing run) until a
person says whether it ran (``nous-sched approvals settle TOKEN SEQ
--ran|--not-ran``; ``approvals list`` shows such calls). A resume whose claim
was taken over starts nothing more: its run ends with an ``abort`` error.

**Park, then replay.** With a store's ``park`` seconds above 0, the run's
thread stays held where it suspended for that long (within the run's
timeout); a :func:`resume` in the same process then hands it the decisions
and it continues without replay. Past that time it ends, and a resume
replays. Both give the same result (a parked run's audit also says
``parked``; its suspended result has no logs yet).

**Within the output budget.** What the model reads of a suspended run
(:meth:`RunResult.for_model <nous_sched.RunResult.for_model>`: ``{"logs",
"suspended": {token, expires_at, pending}}``) fits the run's
``output_budget`` like any answer (:mod:`nous_sched.result.budget`): the token and
expiry always whole, each pending call's ``seq`` and ``tool`` kept and its
arguments cut with their sizes said, the logs cut around it. It is never
reported as an error; ``result.usage`` counts that answer.

With a user ``approval_handler`` the durable host asks it before the call is
submitted, on the thread driving the run: ``True`` approves, :data:`DEFER`
suspends, anything else denies.
"""

from __future__ import annotations

from ._replay import DEFER, ApprovalDecision, Suspension, resume, run_durable, tool_set_hash
from .approval_store import ApprovalStore, RedisApprovalStore, SqliteApprovalStore, TokenError, UnsettledError
from .postgres_store import PostgresApprovalStore

__all__ = [
    "DEFER",
    "ApprovalDecision",
    "Suspension",
    "resume",
    "tool_set_hash",
    "run_durable",
    "ApprovalStore",
    "SqliteApprovalStore",
    "RedisApprovalStore",
    "TokenError",
    "UnsettledError",
    "PostgresApprovalStore",
]

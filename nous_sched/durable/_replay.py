"""Private: the durable run itself (suspend, park, resume by replay); see :mod:`nous_sched.durable`."""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Optional, Union

import attrs

from .. import _validators as v
from .._run.options import RunOptions, build
from .._run.runner import STATE_OP, execute, live_stream, prepare, review_denied, reviewed, runtime_of
from .._validators import require
from ..errors import ConfigError
from ..events import ApprovalEvent, Event, ResumedEvent, ReviewEvent, SuspendedEvent
from ..gate import Admitted
from ..gate.approval_seam import ApprovalStoreSeam
from ..gate.dispatch import COVERED, ApprovalRequest, coming_for, needs_approval
from ..gate.grants import Grant, Grants, answer_of
from ..outcome import Outcome, quote_name
from ..result import RunError, RunResult
from ..result.budget import fit
from ..result.budget import size as budget_size
from ..runtime import AnyCancel, CodeRuntime, Host, Limits, PendingCall, RuntimeOutcome, Settled
from ..runtime.engine import CLOCK_MARK
from ..tooling import Tool
from . import _progress as progress_of
from ._claimer import describe
from ._progress import Progress, Renewal
from .approval_store import TokenError, UnsettledError

__all__ = ["DEFER", "ApprovalDecision", "Suspension", "resume", "tool_set_hash", "run_durable"]


#: How a state operation's question begins (``runtime/prelude.js``: ``["state.<op>", args]``).
_STATE_QUESTION = '["' + STATE_OP

#: The most clock values (``Date.now()``, ``Math.random()``...) one durable run may read.
MAX_CLOCK_VALUES = 100_000
CLOCK_OVERFLOW = (
    "the program read the clock or Math.random() more than {n} times; a durable run records every value "
    "it reads, so it was stopped"
)


class _Defer:
    """The type of :data:`DEFER`."""

    def __repr__(self) -> str:
        return "nous_sched.DEFER"


#: What an approval handler returns to defer a call to the run's approval store.
DEFER = _Defer()


def _grant_ok(decision: Any, attribute: Any, grant: Any) -> None:
    if grant is None:
        return
    if not isinstance(grant, Grant):
        v.fail("ApprovalDecision", "grant", grant, "None or a nous_sched.Grant")
    if decision.approved is not True:
        v.fail("ApprovalDecision", "grant", grant, "None when the call is not approved (a grant approves)")


@attrs.frozen
class ApprovalDecision:
    """A decision on one pending call: ``approved``, and why (``reason``, kept in the audit).
    ``grant`` (a :class:`~nous_sched.Grant`, approved only) approves later calls to
    the same tool in the run too: the resumed run spends it without suspending again."""

    approved: bool = attrs.field(validator=v.BOOL)
    reason: str = attrs.field(default="", validator=v.STR)
    grant: Optional[Grant] = attrs.field(default=None, validator=_grant_ok)

    def as_dict(self) -> dict[str, Any]:
        """JSON-shaped: ``{approved, reason}``, and ``grant`` (``Grant.as_dict()``) when there is one."""
        shown: dict[str, Any] = {"approved": self.approved, "reason": self.reason}
        if self.grant is not None:
            shown["grant"] = self.grant.as_dict()
        return shown

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ApprovalDecision:
        """The decision :meth:`as_dict` wrote (a store's, a progress record's).
        A ``grant`` that cannot be read refuses the call (fail safe)."""
        approved, reason = bool(data["approved"]), str(data.get("reason", ""))
        if "grant" not in data or data["grant"] is None:
            return cls(approved, reason)
        try:
            return cls(approved, reason, Grant.from_dict(data["grant"]))
        except ConfigError as exc:
            return cls(False, f"its grant could not be read ({exc}), so it refuses")


@attrs.frozen
class Suspension:
    """A suspended run: the ``token`` that resumes it (once), the ``pending``
    requests (each with its ``seq``), and ``expires_at`` (seconds since the epoch)."""

    token: str
    pending: tuple[ApprovalRequest, ...]
    expires_at: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-shaped: ``{token, expires_at, pending: [{seq, tool, arguments, site, ...}]}``."""
        return {"token": self.token, "expires_at": self.expires_at, "pending": [_request_dict(p) for p in self.pending]}


def _request_dict(request: ApprovalRequest) -> dict[str, Any]:
    return {
        "seq": request.seq,
        "tool": request.tool,
        "arguments": request.arguments,
        "description": request.description,
        "site": request.site,
        "committed": list(request.committed),
    }


def tool_set_hash(tools: Iterable[Tool]) -> str:
    """A hash of the tools' names and schemas: a resume must pass the same set."""
    shape = sorted(([t.name, t.parameters] for t in tools), key=lambda pair: str(pair[0]))
    text = json.dumps(shape, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# -- one durable run: the ledger it replays and the one it records -----------------


class _Run:
    """The state of one durable run (first or resumed), shared by its host and runtime."""

    def __init__(
        self,
        ledger: Mapping[int, list[Any]],
        clock: list[Any],
        decisions: Mapping[int, ApprovalDecision],
        pending: Mapping[int, list[Any]],
        handler: Optional[Callable[[ApprovalRequest], Any]],
        description: str,
        refused: Iterable[int] = (),
    ) -> None:
        self.ledger = ledger  # seq -> [tool, args text, ok, payload(, blobs)]: replayed
        # The seqs of the ledger's calls the gate refused before they started: in the
        # usage ledger they have no number (as in a plain run), replayed or not.
        self.refused: set[int] = set(refused)
        #: The next usage-ledger number: a plain run's seq, counting the calls that started (or were replayed).
        self.numbered = 0
        self.clock_replay = clock
        self.decisions = decisions
        self.prior_pending = pending  # seq -> [tool, args text] the decisions are for
        self.handler = handler
        self.description = description
        self.recorded: dict[int, list[Any]] = {}
        self.clock_new: list[Any] = []
        #: The program's state operations (``state.*``), in order: [question, ok, value or
        #: {tool, message}, key, version]; those of the runs before replayed, then the new ones.
        self.state_replay: list[list[Any]] = []
        self.state_new: list[list[Any]] = []
        self.state_at = 0
        self.state_events: list[Event] = []  # the live ones' audit events (a parked run's suspension shows them)
        self.seq = 0
        self.step = 0
        self.window: Optional[int] = None
        self.pending: list[ApprovalRequest] = []
        self.pending_texts: dict[int, list[Any]] = {}  # seq -> [tool, args text], saved with the suspension
        self.diverged: Optional[str] = None
        self.overflow: Optional[str] = None
        self.replayed = 0
        self.stop = threading.Event()
        self.audit: list[Event] = []
        self.sites: list[str] = []
        self._approved: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self.park: Optional[_Park] = None
        self.deferred: list[_Deferred] = []
        self.budget: Optional[int] = None  # the run's output_budget
        self.progress: Optional[Progress] = None  # a resume's progress in the store
        self.grants = Grants()  # the run's grants: kept across its suspensions (in the record)
        self.lost: Optional[str] = None  # why this resume may start nothing more (its claim was taken over)

    # The run's own approval handler: only calls the durable host let through.
    def approval_handler(self, request: ApprovalRequest) -> bool:
        key = (request.tool, _canonical(request.arguments))
        with self._lock:
            left = self._approved.get(key, 0)
            if left <= 0:
                return False
            self._approved[key] = left - 1
            return True

    def preapprove(self, tool: str, args: Any) -> None:
        key = (tool, _canonical(args))
        with self._lock:
            self._approved[key] = self._approved.get(key, 0) + 1

    def number(self) -> int:
        """The usage ledger's seq for the next call that starts (or is replayed)."""
        number, self.numbered = self.numbered, self.numbered + 1
        return number

    def record(self, seq: int, name: str, text: str, outcome: Outcome) -> None:
        if outcome.ok:
            self.recorded[seq] = [name, text, True, outcome.value]
            if outcome.blobs:  # the held parts, by id: a replay gives the program the same handles
                self.recorded[seq].append([[blob.id, blob.value] for blob in outcome.blobs])
        else:
            assert outcome.error is not None
            self.recorded[seq] = [name, text, False, outcome.error.as_dict()]
        if self.progress is not None and not self._wrote(lambda p: p.committed(seq, self.recorded[seq])):
            self.stop.set()

    def may_start(self, seq: int, name: str, text: str) -> bool:
        """Before a tool runs in a resume: its start written to the store (False: it must not start)."""
        if self.progress is None:
            return True
        return self._wrote(lambda p: p.started(seq, name, text, self.clock_values()))

    def _wrote(self, write: Callable[[Progress], bool]) -> bool:
        assert self.progress is not None
        try:
            if write(self.progress):
                return True
            self.lost = _TAKEN_OVER
        except Exception as exc:  # the store failed: start nothing whose start is not on record
            self.lost = f"the approval store could not record the resume's progress: {_clip(exc)}"
        self.progress = None
        self.stop.set()
        return False

    def clock_values(self) -> list[Any]:
        return [*self.clock_replay, *self.clock_new]

    def state_values(self) -> list[list[Any]]:
        return [*self.state_replay, *self.state_new]

    def stated(self) -> None:
        """After a state operation done live: in a resume, every answer so far written to its
        progress, so a resume that takes over from a dead one replays it, never does it again."""
        if self.progress is not None:
            self._wrote(lambda p: p.stated(self.state_values(), self.clock_values()))

    def committed(self) -> tuple[dict[str, Any], ...]:
        return tuple({"seq": s, "tool": e[0], "ok": e[2]} for s, e in sorted(self.recorded.items()))


@attrs.frozen
class _Covered:
    """A call a grant the run holds covered: its decision, and the grant's id."""

    decision: ApprovalDecision
    grant_id: str


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class _Answered(Settled):
    """An answer the durable host settles itself (a replayed one, a refusal, a denial), with
    ``number``, the usage ledger's seq (``None``: the gate refused it before it started)."""

    __slots__ = ("number",)
    tool: str  # always a tool's: a durable host answers no sdk question itself

    def __init__(self, outcome: Outcome, tool: str, number: Optional[int]) -> None:
        super().__init__(outcome, tool)
        self.number = number


@attrs.frozen
class _Row:
    """What the inner host's usage ledger reads of a pending call: its ``tool`` and ``seq``."""

    tool: str
    seq: Optional[int]


class _Stop(PendingCall):
    """A call that is not started: waiting for it ends the run (its ``stop`` is set)."""

    __slots__ = ("run",)

    def __init__(self, run: _Run) -> None:
        self.run = run

    def wait(self, timeout: float) -> None:
        self.run.stop.set()
        return None


class _Recording(PendingCall):
    """A started call whose outcome goes into the ledger when the program gets it."""

    __slots__ = ("pending", "run", "seq", "name", "text", "number")

    def __init__(self, pending: Any, run: _Run, seq: int, name: str, text: str) -> None:
        self.pending = pending
        self.run = run
        self.seq = seq
        self.name = name
        self.text = text
        self.number = run.number()

    def wait(self, timeout: float) -> Optional[Outcome]:
        outcome: Optional[Outcome] = self.pending.wait(timeout)
        if outcome is not None:
            self.run.record(self.seq, self.name, self.text, outcome)
        return outcome


class _Deferred(PendingCall):
    """A call of a parked run held at its suspension: waiting for it parks the run
    until its decisions come (then it runs, or is refused) or the park time passes
    (then the run ends, and a resume replays)."""

    __slots__ = ("host", "seq", "name", "text", "site", "admitted", "pending")

    def __init__(self, host: "_DurableHost", seq: int, name: Any, text: Any, site: str, admitted: Any) -> None:
        self.host = host
        self.seq = seq
        self.name = name
        self.text = text
        self.site = site
        self.admitted = admitted
        self.pending: Any = None

    def wait(self, timeout: float) -> Optional[Outcome]:
        run = self.host.run
        if self.pending is None:
            # Not `timeout`: drive polls its waits in short slices; the park lasts until the run's deadline.
            park = run.park
            deadline = self.host.inner.run_ctx.deadline
            left = timeout if deadline is None else deadline - time.monotonic()
            decisions = park.hold(left) if park is not None else None
            if decisions is None:
                run.stop.set()
                return None
            self.host.release(decisions)
        if self.pending is None:
            return None
        outcome: Optional[Outcome] = self.pending.wait(timeout)
        return outcome


class _Park:
    """A suspended run this process still holds, for ``seconds``: the hand-off
    between its thread (parked in :meth:`hold`) and the caller (:meth:`outcome`,
    :meth:`deliver`). ``state``: ``running``, ``parked`` or ``done``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.cond = threading.Condition()
        self.state = "running"
        self.decisions: Optional[Mapping[int, ApprovalDecision]] = None
        self.closed = False
        self.result: Optional[RunResult] = None
        self.token_id = ""
        self.run_state: Any = None  # the _Run it holds

    def hold(self, timeout: float) -> Optional[Mapping[int, ApprovalDecision]]:
        """On the run's thread: say the run is parked; its decisions, or None once the park time is over."""
        with self.cond:
            self.state = "parked"
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.decisions is not None, min(self.seconds, max(timeout, 0.0)))
            decisions, self.decisions = self.decisions, None
            if decisions is None:
                self.closed = True
        if decisions is None:
            with _PARKED_LOCK:
                _PARKED.pop(self.token_id, None)
        return decisions

    def deliver(self, decisions: Mapping[int, ApprovalDecision]) -> bool:
        """From ``resume``: hand the decisions to the parked run; False when it is no longer held."""
        with self.cond:
            if self.closed or self.state != "parked":
                return False
            self.decisions = decisions
            self.state = "running"
            self.cond.notify_all()
            return True

    def finish(self, result: RunResult) -> None:
        with self.cond:
            self.result = result
            self.state = "done"
            self.cond.notify_all()

    def outcome(self) -> Optional[RunResult]:
        """Wait until the run is parked (None) or done (its result)."""
        with self.cond:
            self.cond.wait_for(lambda: self.state != "running")
            return self.result if self.state == "done" else None


#: Runs parked in this process, by token id.
_PARKED: dict[str, _Park] = {}
_PARKED_LOCK = threading.Lock()


class _DurableHost(Host):
    """The run's host, seen through the ledger: what a runtime calls instead of run_code's own."""

    def __init__(self, inner: Any, run: _Run) -> None:
        self.inner = inner
        self.run = run
        self.names = inner.names
        self.cancel = AnyCancel(inner.cancel, run.stop)
        #: Inside a step's batch (:class:`_Step`): its calls are one step.
        self.batching = False

    @property
    def deadline(self) -> Optional[float]:
        """The run's deadline: the one the host it wraps keeps (see ``engine.drive``)."""
        deadline: Optional[float] = self.inner.deadline
        return deadline

    def clock(self, values: list[Any]) -> None:
        run = self.run
        run.clock_new.extend(values)
        if len(run.clock_replay) + len(run.clock_new) > MAX_CLOCK_VALUES and run.overflow is None:
            # The ledger is data the store keeps: bounded, like everything else a run records.
            run.overflow = CLOCK_OVERFLOW.format(n=MAX_CLOCK_VALUES)
            run.stop.set()

    def sites(self, sites: list[str]) -> None:
        self.run.sites.extend(sites)

    def on_logs(self, lines: Any) -> None:
        """The runtime's per-step log hook, passed on (a watched run's ``log`` events)."""
        self.inner.on_logs(lines)

    def when_begun(self, then: Callable[[], None]) -> bool:
        """Passed on: the calls that are not replayed begin on the inner host's tools."""
        told: bool = self.inner.when_begun(then)
        return told

    def on_settled(self, pending: Any, outcome: Any, payload: str) -> None:
        """The runtime's per-answer hook, passed on for every call the program received
        an answer to (the usage ledger, observed shapes): one that ran, a refusal or
        denial, a held call once released, and a replayed one (the whole program's
        calls, each once, numbered as in a plain run: :mod:`nous_sched.result.usage`)."""
        row = _row_of(pending)
        if row is not None:
            self.inner.on_settled(row, outcome, payload)

    def on_main(self, state: Any) -> None:
        """The runtime's hook for the program's end, passed on (the run's hint)."""
        self.inner.on_main(state)

    def batch(self) -> Any:
        return _Step(self)

    def discover(self, question: Any) -> Any:
        self._site()
        if isinstance(question, str) and question.startswith(_STATE_QUESTION):
            return self._state(question)
        return self.inner.discover(question)

    def _state(self, question: str) -> Any:
        """A state operation (``state.*``): the recorded answer while replaying (nothing is read
        or written again), else done live and recorded; none once the run stops or waits for approval."""
        run = self.run
        if run.stop.is_set() or run.diverged is not None or run.window is not None:
            return _Stop(run)  # after the suspension: not done (a resume does it)
        at = run.state_at
        run.state_at += 1
        if at < len(run.state_replay):
            entry = run.state_replay[at]
            if entry[0] != question:
                run.diverged = (
                    f"the replay diverged at state operation #{at}: the program asked {_clip(question)}, where the "
                    f"run that suspended asked {_clip(entry[0])}; nothing was run (is the program deterministic? "
                    "see the README's determinism rules)"
                )
                run.stop.set()
                return _Stop(run)
            self.inner.gate.calls += 1  # the budget counts it as the first run did
            session = self.inner.state
            if session is not None and isinstance(entry[3], str):
                session.remember(entry[3], entry[4])  # a later write of a key read before the suspension is checked
            if entry[1]:
                return Settled(Outcome.success(entry[2]))
            return Settled(Outcome.failure(entry[2]["tool"], entry[2]["message"]))
        events = self.inner.state_events
        before = len(events)
        pending = self.inner.discover(question)
        outcome: Outcome = pending.wait(0)
        key, version = (events[-1].key, events[-1].version) if len(events) > before else (None, 0)
        value = outcome.value if outcome.ok else (outcome.error.as_dict() if outcome.error is not None else {})
        run.state_new.append([question, outcome.ok, value, key, version])
        if len(events) > before:
            run.state_events.append(events[-1].as_event())
        run.stated()
        return pending

    def call(self, name: Any, args: Any) -> Any:
        return self.call_json(name, json.dumps(args))

    def call_json(self, name: Any, text: Any) -> Any:
        run = self.run
        seq = run.seq
        run.seq += 1
        site = self._site()
        if not self.batching:
            run.step += 1
        if run.stop.is_set() or run.diverged is not None:
            return _Stop(run)
        if run.window is not None and run.window != run.step:
            return self._held(seq, name, text, site)  # after the suspension: not started
        if seq in run.ledger:
            return self._replay(seq, name, text)
        if seq in run.prior_pending and run.prior_pending[seq] != [name, text]:
            return self._diverge(seq, name, text, run.prior_pending[seq])
        return self._live(seq, name, text, site)

    def _site(self) -> str:
        return self.run.sites.pop(0) if self.run.sites else ""

    def _replay(self, seq: int, name: Any, text: Any) -> Any:
        run = self.run
        entry = run.ledger[seq]
        if [entry[0], entry[1]] != [name, text]:
            return self._diverge(seq, name, text, entry)
        # The budget counts a replayed call as the first run did; the gate's
        # checks passed then, and the tool does not run now.
        self.inner.gate.calls += 1
        run.recorded[seq] = entry
        run.replayed += 1
        number = None if seq in run.refused else run.number()
        if entry[2]:
            blobs = self.inner.run_ctx.blobs
            if len(entry) > 4 and blobs is not None:
                for id, value in entry[4]:
                    blobs.adopt(id, value)
            return _Answered(Outcome.success(entry[3]), entry[0], number)
        return _Answered(Outcome.failure(entry[3]["tool"], entry[3]["message"]), entry[0], number)

    def _diverge(self, seq: int, name: Any, text: Any, entry: list[Any]) -> Any:
        run = self.run
        run.diverged = (
            f"the replay diverged at call #{seq}: the program called {quote_name(str(name))} with {_clip(text)}, "
            f"where the run that suspended called {quote_name(entry[0])} with {_clip(entry[1])}; "
            "nothing was run (is the program deterministic? see the README's determinism rules)"
        )
        run.stop.set()
        return _Stop(run)

    def _live(self, seq: int, name: Any, text: Any, site: str) -> Any:
        if self.run.window is not None:  # inside the suspension's window: only gated calls join it
            return self._join_window(seq, name, text, site)
        return self._admitted(seq, name, text, site, self.inner.gate.admit_json(name, text))

    def _admitted(self, seq: int, name: Any, text: Any, site: str, admitted: Any) -> Any:
        run = self.run
        if type(admitted) is not Admitted:
            run.refused.add(seq)
            run.record(seq, str(name), text, admitted)
            return _Answered(admitted, str(name), None)
        if not self._gated(admitted.tool):
            if not run.may_start(seq, str(name), text):
                return _Stop(run)
            return _Recording(self.inner.submit(admitted, name), run, seq, name, text)
        return self._decide(seq, admitted, text, site)

    def _join_window(self, seq: int, name: Any, text: Any, site: str) -> Any:
        tool = self.inner.gate.granted.get(name)
        if tool is None or not self._gated(tool):
            return self._held(seq, name, text, site)
        admitted = self.inner.gate.admit_json(name, text)
        if type(admitted) is Admitted:
            self._suspend_at(seq, admitted, text, site)
        return self._held(seq, name, text, site, admitted)

    def _held(self, seq: int, name: Any, text: Any, site: str, admitted: Any = None) -> Any:
        """A call made after the suspension: not started. A parked run keeps it for its release."""
        run = self.run
        if run.park is None:
            return _Stop(run)
        deferred = _Deferred(self, seq, name, text, site, admitted)
        run.deferred.append(deferred)
        return deferred

    def release(self, decisions: Mapping[int, ApprovalDecision]) -> None:
        """A parked run's decisions came: start its held calls, in the order the program made them."""
        run = self.run
        run.decisions, run.window, run.pending, run.pending_texts = decisions, None, [], {}
        held, run.deferred = run.deferred, []
        for d in held:
            if d.admitted is not None and not self._suspended_again():
                d.pending = self._admitted(d.seq, d.name, d.text, d.site, d.admitted)
            else:
                d.pending = self._live(d.seq, d.name, d.text, d.site)

    def _suspended_again(self) -> bool:
        return self.run.window is not None

    def _gated(self, tool: Tool) -> bool:
        return needs_approval(tool, self.inner.run_ctx.require_approval)

    def _decide(self, seq: int, admitted: Admitted, text: str, site: str) -> Any:
        run = self.run
        decision = self._decision(seq, admitted, site)
        if decision is DEFER:
            self._suspend_at(seq, admitted, text, site)
            return self._held(seq, admitted.tool.name, text, site, admitted)
        assert isinstance(decision, (ApprovalDecision, _Covered))
        name = admitted.tool.name
        decision, grant_id, granted = self._granting(seq, name, admitted, decision)
        event = ApprovalEvent(seq, name, decision.approved, decision.reason, grant_id, granted)
        run.audit.append(event.as_event())
        if not decision.approved:
            why = f": {decision.reason}" if decision.reason else ""
            outcome = Outcome.failure(name, f"tool {quote_name(name)} was denied approval{why}")
            run.record(seq, name, text, outcome)
            return _Answered(outcome, name, run.number())
        if not run.may_start(seq, name, text):
            return _Stop(run)
        run.preapprove(name, admitted.args)
        return _Recording(self.inner.submit(admitted, name), run, seq, name, text)

    def _granting(
        self, seq: int, name: str, admitted: Admitted, decision: Union[ApprovalDecision, _Covered]
    ) -> tuple[ApprovalDecision, str, Optional[dict[str, Any]]]:
        """The decision as the audit records it, the grant it made or spent (its id), and what it grants."""
        if isinstance(decision, _Covered):
            return decision.decision, decision.grant_id, None
        grant = decision.grant
        if grant is None:
            return decision, "", None
        why = grant.refusal(admitted.args)
        if why is not None:  # fail safe: a grant this call does not meet refuses it
            return ApprovalDecision(False, why), "", None
        held = self.run.grants.add(grant, name, seq)
        reason = f"{decision.reason or 'approved'}, granting {grant.describe()}"
        return ApprovalDecision(True, reason), held.id, grant.as_dict()

    def _decision(self, seq: int, admitted: Admitted, site: str) -> Union[ApprovalDecision, _Covered, _Defer]:
        run = self.run
        decided = run.decisions.get(seq)
        if decided is not None:
            return decided
        held = run.grants.cover(admitted.tool.name, admitted.args)
        if held is not None:
            reason = COVERED.format(id=held.id, what=held.grant.describe(), seq=held.id[1:])
            return _Covered(ApprovalDecision(True, reason), held.id)
        if run.handler is None:
            return DEFER
        try:
            answer = run.handler(self._request(seq, admitted, site))
        except Exception as exc:  # a handler that raises rejects, as on the live path
            return ApprovalDecision(False, f"the approval handler raised: {_clip(exc)}")
        if isinstance(answer, _Defer):
            return DEFER
        approved, grant, why = answer_of(answer)
        if approved:
            return ApprovalDecision(True, "approved by the approval handler", grant)
        return ApprovalDecision(False, why or "rejected by the approval handler")

    def _request(self, seq: int, admitted: Admitted, site: str) -> ApprovalRequest:
        # Arguments that hold blob handles are shown as the program wrote them: the suspension's
        # requests reach the model's answer and the store, where a handle stands for its megabytes.
        text = admitted.text
        return ApprovalRequest(
            admitted.tool.name,
            json.loads(text) if text is not None and '"$blob"' in text else json.loads(json.dumps(admitted.args)),
            description=self.run.description,
            tool_description=admitted.tool.description,
            seq=seq,
            site=site,
            committed=self.run.committed(),
            coming=coming_for(self.inner.run_ctx, admitted.tool.name),
        )

    def _suspend_at(self, seq: int, admitted: Admitted, text: str, site: str) -> None:
        run = self.run
        if run.window is None:
            run.window = run.step
        request = self._request(seq, admitted, site)
        run.pending.append(request)
        run.pending_texts[seq] = [admitted.tool.name, text]


def _row_of(pending: Any) -> Optional[_Row]:
    """The usage ledger's row of an answered call; None for an ``sdk`` answer (the inner host's own)."""
    if type(pending) is _Deferred:
        return _row_of(pending.pending)
    if type(pending) is _Recording:
        return _Row(pending.name, pending.number)
    if type(pending) is _Answered:
        return _Row(pending.tool, pending.number)
    return None


class _Step:
    """One step's calls, handed over as one batch (the program's Promise.all)."""

    def __init__(self, host: _DurableHost) -> None:
        self.host = host
        self.inner: Any = None

    def __enter__(self) -> None:
        self.host.run.step += 1
        self.host.batching = True
        self.inner = self.host.inner.batch()
        self.inner.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.host.batching = False
        self.inner.__exit__(*exc)


class _DurableRuntime(CodeRuntime):
    """The caller's runtime, run through the durable host, the program marked with its clock."""

    language = "javascript"

    def __init__(self, inner: Any, run: _Run) -> None:
        self.inner = inner
        self.run_state = run

    def run(self, program: str, host: Any, limits: Limits) -> RuntimeOutcome:
        marked = CLOCK_MARK + json.dumps(self.run_state.clock_replay) + "\x00" + program
        outcome: RuntimeOutcome = self.inner.run(marked, _DurableHost(host, self.run_state), limits)
        return outcome


def _clip(text: Any, n: int = 200) -> str:
    shown = str(text)
    return shown if len(shown) <= n else shown[:n] + "…"


# -- suspending and resuming ---------------------------------------------------------

_STORE = v.instance_of(
    ApprovalStoreSeam, "a nous_sched approval store (SqliteApprovalStore, RedisApprovalStore, PostgresApprovalStore)"
)
_DECISIONS = v.instance_of(Mapping, "a mapping of seq to True, False or an ApprovalDecision")


def run_durable(code: Any, tools: Iterable[Tool], options: RunOptions, store: ApprovalStoreSeam) -> RunResult:
    """``run_code(code, tools, options=options)`` with ``store``, its ``options.approval_store``: see the module docstring."""
    tools = list(tools)
    review = None
    if options.review is not None:  # once, before the first run: never again on a replay or a resume
        prepared = prepare(code, tools, options)
        review, denied = reviewed(prepared, live_stream.get(), DEFER)
        if denied is not None:
            return denied
        if review.verdict == "ask":  # no one to ask now: the store holds the program's question
            return _suspend_program(code, tools, store, options, review, prepared.program)
    run = _Run({}, [], {}, {}, options.approval_handler, options.description or "")
    if review is not None:
        run.audit.append(review.as_event())
    return _execute(code, tools, store, options, run)


def _execute(code: Any, tools: list[Tool], store: ApprovalStoreSeam, options: RunOptions, run: _Run) -> RunResult:
    runtime = _DurableRuntime(runtime_of(options.runtime), run)
    run.budget = options.output_budget
    if store.park <= 0:
        return _run_once(code, tools, store, options, run, runtime)
    park = run.park = _Park(store.park)
    park.run_state = run

    def target() -> None:
        try:
            park.finish(_run_once(code, tools, store, options, run, runtime))
        except BaseException as exc:  # handed to the caller below
            park.finish(RunResult(error=RunError("exception", f"the parked run failed: {_clip(exc)}")))

    threading.Thread(target=target, name=f"nous-sched-parked-{next(_parked_numbers)}", daemon=True).start()
    return _parked_result(code, tools, store, run, park)


_parked_numbers = itertools.count(1)

#: The seq of a reviewed program's own question in a suspension (its calls count from 0).
PROGRAM_SEQ = -1


def _suspend_program(
    code: str, tools: list[Tool], store: ApprovalStoreSeam, options: RunOptions, review: ReviewEvent, summary: Any
) -> RunResult:
    """Suspend a reviewed run before it starts: its one pending request is the
    whole program (``seq`` :data:`PROGRAM_SEQ`, ``tool`` ``""``, ``code`` and
    ``program`` set); a resume approving it runs the program, one denying it
    ends it ``review_denied``."""
    description = options.description or ""
    request = ApprovalRequest("", {}, description=description, seq=PROGRAM_SEQ, code=code, program=summary)
    record = {
        "v": 1,
        "code": code,
        "description": description,
        "tools": tool_set_hash(tools),
        "ledger": [],
        "refused": [],
        "clock": [],
        "pending": [{**_request_dict(request), "text": ["", ""], "code": code}],
        "review": json.loads(json.dumps(review.summary)),
    }
    token, expires_at = store.save(record)
    suspended = SuspendedEvent(token, (request,), expires_at)
    if options.session_log is not None:
        options.session_log.append(suspended.as_event())
    result = RunResult(
        suspended=Suspension(token, (request,), expires_at), audit=(review.as_event(), suspended.as_event())
    )
    return _within_budget(result, options.output_budget)


def _program_decided(
    record: dict[str, Any], merged: Mapping[int, ApprovalDecision], options: RunOptions
) -> tuple[Optional[ReviewEvent], Optional[RunResult]]:
    """A resume of a program suspended by its review: its review record, and the
    run's result when the decision denies it (nothing runs), else ``None``."""
    if "review" not in record or PROGRAM_SEQ not in merged:
        return None, None
    decision = merged[PROGRAM_SEQ]
    reason = decision.reason or ("approved" if decision.approved else "denied")
    review = ReviewEvent("allow" if decision.approved else "deny", reason, True, record["review"])
    if options.session_log is not None:
        options.session_log.append(review.as_event())
    if decision.approved:
        return review, None
    return review, review_denied(reason, review, (), options.output_budget)


def _parked_result(code: str, tools: list[Tool], store: ApprovalStoreSeam, run: _Run, park: _Park) -> RunResult:
    """The run's result once it ends, or its suspension once it parks (then it stays held for a resume)."""
    result = park.outcome()
    if result is not None:
        return result
    suspension = _suspend(code, tools, store, run)
    park.token_id = suspension.token.split(".")[0]
    with _PARKED_LOCK:
        _PARKED[park.token_id] = park
    # The logs so far are still in the parked run: its resumed result has all of them.
    audit = (*run.state_events, *run.audit)
    return _within_budget(RunResult(suspended=suspension, audit=audit), run.budget)


def _run_once(
    code: Any, tools: list[Tool], store: ApprovalStoreSeam, options: RunOptions, run: _Run, runtime: Any
) -> RunResult:
    # The machinery itself, with this run's replaying runtime and its gate of approvals.
    replaying = attrs.evolve(
        options, runtime=runtime, approval_handler=run.approval_handler, approval_store=None, review=None
    )
    result = execute(prepare(code, tools, replaying))
    error, suspended = result.error, None
    if run.diverged is not None:
        error = RunError("replay_diverged", run.diverged)
    elif run.lost is not None:
        error = RunError("abort", run.lost)
    elif run.overflow is not None:
        error = RunError("abort", run.overflow)
    elif run.pending and run.stop.is_set() and run.park is None:
        suspended = _suspend(code, tools, store, run)
        error = None
    log = options.session_log
    if log is not None:
        for event in run.audit:
            log.append(event)
    if error is result.error and suspended is None:
        return attrs.evolve(result, audit=(*result.audit, *run.audit))
    # The answer changed (a suspension, or the error that ended the replay): cut again what the model reads.
    told = attrs.evolve(result, error=error, suspended=suspended, audit=(*result.audit, *run.audit))
    return _within_budget(told, run.budget)


def _within_budget(result: RunResult, budget: Optional[int]) -> RunResult:
    """``result`` with what the model reads (``budgeted``) and the ledger's
    answer sizes made for its answer as it stands (:meth:`RunResult.to_dict`):
    a suspension fits ``budget`` like any answer, its token always kept
    (:mod:`nous_sched.result.budget`)."""
    answer = result.to_dict()
    answer_bytes = budget_size(answer)
    budgeted = fit(answer, budget) if budget is not None and answer_bytes > budget else None
    model_bytes = answer_bytes if budgeted is None else budget_size(budgeted)
    usage = attrs.evolve(result.usage, answer_bytes=answer_bytes, model_bytes=model_bytes)
    return attrs.evolve(result, budgeted=budgeted, usage=usage)


def _suspend(code: str, tools: list[Tool], store: ApprovalStoreSeam, run: _Run) -> Suspension:
    # What committed before each pending call, now that every earlier call has.
    committed = run.committed()
    run.pending = [
        attrs.evolve(p, committed=tuple(c for c in committed if c["seq"] < (p.seq or 0))) for p in run.pending
    ]
    record = {
        "v": 1,
        "code": code,
        "description": run.description,
        "tools": tool_set_hash(tools),
        "ledger": [[seq, *entry] for seq, entry in sorted(run.recorded.items())],
        "refused": sorted(s for s in run.refused if s in run.recorded),
        "clock": run.clock_values(),
        "state": run.state_values(),
        "pending": [{**_request_dict(p), "text": run.pending_texts[p.seq]} for p in run.pending if p.seq is not None],
        "grants": run.grants.state(),
    }
    token, expires_at = store.save(record)
    run.audit.append(SuspendedEvent(token, tuple(run.pending), expires_at).as_event())
    return Suspension(token, tuple(run.pending), expires_at)


def resume(
    token: str,
    decisions: Mapping[Any, Union[bool, ApprovalDecision]],
    tools: Iterable[Tool] = (),
    *,
    approval_store: ApprovalStoreSeam,
    **options: Any,
) -> RunResult:
    """Resume a suspended run by replay: see the module docstring.

    ``decisions`` maps each pending ``seq`` to ``True``, ``False`` or an
    :class:`ApprovalDecision`; decisions an operator recorded in the store
    (``nous-sched approvals approve``) count too, those given here win.
    ``options`` are :func:`~nous_sched.run_code`'s (``options=`` a
    :class:`~nous_sched.RunOptions` among them; its ``approval_store``, if
    set, must be ``approval_store``). The result may be
    suspended again. With a tool set other than the one that suspended, the
    result is a ``replay_diverged`` error, nothing runs and the token stays
    usable.

    A token whose resume died (its claimer is judged dead: on this host, its
    process is gone; on another, its lease ran out, ``approval_store.lease``
    seconds after its last renewal: ``nous_sched.durable._claimer``) is taken over: what that resume committed is
    replayed, what it never started runs, with the decisions it ran with
    (they win over ``decisions``). While a call it started has no recorded
    outcome, :exc:`~nous_sched.UnsettledError` is raised and
    nothing runs, until a person settles it
    (:meth:`~nous_sched.ApprovalStore.settle`, ``nous-sched
    approvals settle``).

    :raises TokenError: the token is forged or tampered with, expired, unknown,
        already finished, or held by a resume that is alive (on another
        host: whose lease has not run out); each call runs at most once.
    :raises UnsettledError: a dead resume's call has an unknown fate (a TokenError).
    :raises ConfigError: a pending call has no decision, or a bad option.
    """
    require("resume", "approval_store", approval_store, _STORE)
    require("resume", "decisions", decisions, _DECISIONS)
    given = build("resume", options)
    if given.approval_store not in (None, approval_store):
        v.fail("resume", "approval_store", approval_store, "the store of `options`, or `options` without one")
    found = approval_store.claimed(token)
    if found is not None:  # a resume began: continue it if its process died
        return _take_over(token, found, decisions, list(tools), approval_store, given)
    record = approval_store.load(token)
    _ledger_of(record)  # a damaged record is refused before the token is claimed
    _state_of(record)
    tools = list(tools)
    if tool_set_hash(tools) != record["tools"]:
        return RunResult(error=RunError("replay_diverged", _OTHER_TOOLS))
    merged = _merged_decisions(record, decisions)
    record = approval_store.claim(token, progress_of.initial(merged, approval_store.lease))
    progress = _progress(token, approval_store, record["claimed_by"], progress_of.initial(merged, approval_store.lease))
    renewal = Renewal(progress, approval_store.lease)
    try:
        return _resume_claimed(token, record, merged, tools, approval_store, given, progress)
    finally:
        renewal.stop()


def _resume_claimed(
    token: str,
    record: dict[str, Any],
    merged: dict[int, ApprovalDecision],
    tools: list[Tool],
    approval_store: ApprovalStoreSeam,
    given: RunOptions,
    progress: Progress,
) -> RunResult:
    """A resume once its claim is taken (its lease renewed meanwhile)."""
    by = record["claimed_by"]
    program, denied = _program_decided(record, merged, given)
    if denied is not None:
        approval_store.finish_held(token, by)
        return denied
    with _PARKED_LOCK:
        park = _PARKED.pop(token.split(".")[0], None)
    # A run this process still holds continues without replay; one whose park time passed is replayed.
    resumed = _resume_parked(token, record, tools, approval_store, park, merged, progress) if park else None
    if resumed is not None:
        approval_store.finish_held(token, by)
        return resumed
    run, given = _resumed_run(record, merged, given)
    run.progress = progress
    run.audit.append(ResumedEvent(token.split(".")[0], len(record["ledger"])).as_event())
    if program is not None:
        run.audit.append(program.as_event())
    try:
        result = _execute(record["code"], tools, approval_store, given, run)
    except ConfigError:  # a bad option: nothing ran, so the token stays usable
        approval_store.release(token)
        raise
    return _finished(token, approval_store, by, run, result)


def _finished(token: str, store: ApprovalStoreSeam, by: str, run: "_Run", result: RunResult) -> RunResult:
    """A resume's end: the token finished while ``by`` still holds its claim.
    A resume that lost the claim (taken over while it stalled, its own
    deadline come meanwhile) leaves the token to the one that took it over,
    and says so."""
    if run.lost is not None or store.finish_held(token, by):
        return result
    return attrs.evolve(result, result=None, error=RunError("abort", _TAKEN_OVER))


_TAKEN_OVER = "another resume took over this run's approval token (this one was judged dead)"

_OTHER_TOOLS = (
    "the tools differ from the ones the run suspended with (their names and schemas); "
    "resume with the same tools: nothing was run"
)


def _progress(token: str, store: ApprovalStoreSeam, by: str, state: dict[str, Any]) -> Progress:
    return Progress(state, lambda written: store.write_progress(token, by, written))


def _take_over(
    token: str,
    found: dict[str, Any],
    decisions: Mapping[Any, Any],
    tools: list[Tool],
    store: ApprovalStoreSeam,
    options: RunOptions,
) -> RunResult:
    """Continue a resume whose process died: replay what it committed, run what
    it never started; refused while a call it started has an unknown fate."""
    if found["alive"] is not False:
        store.load(token)  # raises: a live (or unknowable) claim is never taken over
        raise TokenError("the approval token is held by a resume that has not finished")
    progress, record = found["progress"], found["record"]
    if progress.get("tracked") is not True:
        raise TokenError(
            "the approval token's resume continued a parked run in memory and died; the calls it made after the "
            "suspension were not recorded and may have run, so it cannot be continued: nothing ran"
        )
    left = progress_of.unsettled(progress)
    if left:
        raise UnsettledError(_unsettled_message(token, found["claimed_by"], left), tuple(s for s, _ in left))
    _ledger_of(record)
    if tool_set_hash(tools) != record["tools"]:
        return RunResult(error=RunError("replay_diverged", _OTHER_TOOLS))
    more, prior = progress_of.recovered(progress)
    merged = {_seq(k): _decision_of(k, d) for k, d in decisions.items()}
    merged.update({seq: ApprovalDecision.from_dict(d) for seq, d in prior.items()})
    by = store.take_over(token, found)
    # No grants held: the dead resume spent some on calls replayed here, uncounted;
    # rather than over-grant, the calls they would cover ask again.
    run, options = _resumed_run(record, merged, options, grants=False)
    run.ledger = {**run.ledger, **more}
    clock = progress.get("clock") or []
    if len(clock) > len(run.clock_replay):
        run.clock_replay = list(clock)
    stated = _state_of(progress)  # what the dead resume did to its state, past the record's
    if len(stated) > len(run.state_replay):
        run.state_replay = stated
    # The take-over wrote a lease of its own; the dead resume's, run out, is never written back.
    state = {**progress_of.initial(merged), **progress, "lease": time.time() + store.lease}
    run.progress = _progress(token, store, by, state)
    renewal = Renewal(run.progress, store.lease)
    try:
        shown = ResumedEvent(token.split(".")[0], len(run.ledger), took_over=describe(found["claimed_by"]))
        run.audit.append(shown.as_event())
        result = _execute(record["code"], tools, store, options, run)
    finally:
        renewal.stop()
    return _finished(token, store, by, run, result)


def _unsettled_message(token: str, by: str, left: list[tuple[int, list[Any]]]) -> str:
    calls = "; ".join(f"#{seq} {quote_name(str(call[0]))} with {_clip(call[1])}" for seq, call in left)
    seqs = " ".join(str(seq) for seq, _ in left)
    return (
        f"the resume of this approval token died ({describe(by)}) while these calls had started and not "
        f"finished: {calls}. Whether they ran is unknown: check, then settle each "
        f"(nous-sched approvals settle {token} SEQ --ran|--not-ran; SEQ in: {seqs}) and resume again. "
        "Nothing ran."
    )


def _resume_parked(
    token: str,
    record: dict[str, Any],
    tools: list[Tool],
    store: ApprovalStoreSeam,
    park: _Park,
    decisions: dict[int, ApprovalDecision],
    progress: Progress,
) -> Optional[RunResult]:
    """Continue a run this process still holds, without replay; None when its park time is over."""
    run = park.run_state
    audit_from = len(run.audit)
    run.audit.append(ResumedEvent(token.split(".")[0], 0, parked=True).as_event())
    # Its calls are not written as they start: a crash from here on leaves a claim no one takes over.
    progress.track(False)
    if not park.deliver(decisions):
        progress.track(True)  # replayed instead: tracked again before anything starts
        del run.audit[audit_from:]
        return None
    result = _parked_result(record["code"], tools, store, run, park)
    state = tuple(e for e in result.audit if e.type == "state")  # the whole run's: one execute
    return attrs.evolve(result, audit=(*state, *run.audit[audit_from:]))


def _resumed_run(
    record: dict[str, Any], decisions: dict[int, ApprovalDecision], options: RunOptions, grants: bool = True
) -> tuple[_Run, RunOptions]:
    """The resumed run, and its options: the suspended run's description unless they have one."""
    ledger = _ledger_of(record)
    pending = {int(p["seq"]): list(p["text"]) for p in record["pending"]}
    if options.description is None:
        options = attrs.evolve(options, description=record["description"] or None)
    refused = [s for s in record.get("refused", ()) if type(s) is int]  # absent from an older record
    run = _Run(
        ledger, list(record["clock"]), decisions, pending, options.approval_handler, record["description"], refused
    )
    if grants:
        run.grants.restore(record.get("grants"))  # absent from an older record
    run.state_replay = _state_of(record)
    return run, options


def _state_of(record: dict[str, Any]) -> list[list[Any]]:
    """The record's state operations (absent from an older record). :raises TokenError: the wrong shape."""
    entries = record.get("state", [])
    if not (isinstance(entries, list) and all(_state_entry_ok(e) for e in entries)):
        raise TokenError("the suspension's record in the store is damaged: its state operations have the wrong shape")
    return [list(e) for e in entries]


def _state_entry_ok(entry: Any) -> bool:
    """A state entry's shape: [question, ok, value or {tool, message}, key or null, version]."""
    if not (isinstance(entry, list) and len(entry) == 5 and isinstance(entry[0], str) and isinstance(entry[1], bool)):
        return False
    if not (entry[3] is None or isinstance(entry[3], str)) or type(entry[4]) is not int:
        return False
    error = entry[2]
    return entry[1] or (
        isinstance(error, dict) and isinstance(error.get("tool"), str) and isinstance(error.get("message"), str)
    )


def _ledger_of(record: dict[str, Any]) -> dict[int, list[Any]]:
    """The record's ledger by seq. :raises TokenError: an entry has the wrong shape."""
    entries = record.get("ledger")
    ledger = {int(e[0]): list(e[1:]) for e in entries if _entry_ok(e)} if isinstance(entries, list) else {}
    if not isinstance(entries, list) or len(ledger) != len(entries):
        raise TokenError("the suspension's record in the store is damaged: its ledger has the wrong shape")
    return ledger


def _entry_ok(entry: Any) -> bool:
    """A ledger entry's shape: [seq, tool, args text, ok, value or {tool, message}], and after
    a value the blobs held of it, [[id, value], ...], when there were any."""
    if not (isinstance(entry, list) and len(entry) in (5, 6) and type(entry[0]) is int):
        return False
    if len(entry) == 6 and not (
        entry[3] is True
        and isinstance(entry[5], list)
        and all(isinstance(b, list) and len(b) == 2 and isinstance(b[0], str) for b in entry[5])
    ):
        return False
    if not (isinstance(entry[1], str) and isinstance(entry[2], str) and isinstance(entry[3], bool)):
        return False
    error = entry[4]
    return entry[3] or (
        isinstance(error, dict) and isinstance(error.get("tool"), str) and isinstance(error.get("message"), str)
    )


def _merged_decisions(record: dict[str, Any], given: Mapping[Any, Any]) -> dict[int, ApprovalDecision]:
    merged: dict[int, ApprovalDecision] = {}
    for key, stored in record.get("decisions", {}).items():
        merged[int(key)] = ApprovalDecision.from_dict(stored)
    for key, value in given.items():
        merged[_seq(key)] = _decision_of(key, value)
    # A pending call may go undecided when a decision grants calls to its tool: the
    # grant may cover it; if it does not, the resumed run asks (suspends) again.
    granted = {p["tool"] for p in record["pending"] if p["seq"] in merged and merged[p["seq"]].grant is not None}
    missing = [p["seq"] for p in record["pending"] if p["seq"] not in merged and p["tool"] not in granted]
    if missing:
        raise ConfigError(f"resume: `decisions` must decide every pending call; no decision for seq {missing}")
    return merged


def _seq(key: Any) -> int:
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str) and (key.isdigit() or (key.startswith("-") and key[1:].isdigit())):
        return int(key)
    v.fail("resume", "decisions", key, "keyed by the pending calls' seq (int)")


def _decision_of(key: Any, value: Any) -> ApprovalDecision:
    if isinstance(value, ApprovalDecision):
        return value
    if isinstance(value, Grant):
        return ApprovalDecision(True, "approved", value)
    if value is True:
        return ApprovalDecision(True, "approved")
    if value is False:
        return ApprovalDecision(False, "denied")
    v.fail("resume", f"decisions[{key!r}]", value, "True, False, a nous_sched.Grant or a nous_sched.ApprovalDecision")

"""Private: the review a run asks before its program starts (``run_code(review=...)``).

The reviewer is a callable ``review(request: ReviewRequest) -> ReviewDecision``.
It runs **before anything of the run**: no worker is taken, no scheduler
made, no tool called, on a thread of its own (``nous-sched-review-<n>``)
while the run's thread waits for it, at most the run's ``timeout``
(:attr:`Limits.timeout <nous_sched.Limits.timeout>`; the program then has its
whole timeout from when it starts). **Fail closed**: a reviewer that raises,
does not answer within that bound (it is left running, its answer ignored),
or answers anything but a :class:`ReviewDecision` denies, with a reason
saying which. A cancelled run (its ``cancel`` set while the reviewer thinks)
is denied too.

``ReviewDecision.ask()`` hands the whole program and its summary to the
run's approval handler as one :class:`~nous_sched.ApprovalRequest` (its
``code`` and ``program`` set, ``tool`` empty; its :meth:`question` is the
program's question, :func:`nous_sched.gate.approval_text.program_question`):
``True`` allows, anything else (or raising, or no handler) denies. The
handler is asked on the same bounded thread. A durable run
(``approval_store=``) whose ``ask`` no handler answers (none, or ``DEFER``)
suspends before the program starts instead (``nous_sched.durable``).
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Callable, Optional

import attrs

from .. import _validators as v
from ..gate import approval_text
from ..gate.dispatch import ApprovalRequest
from ._summary import ProgramSummary

__all__ = ["ReviewRequest", "ReviewDecision", "Verdict", "decide", "VERDICTS"]

#: A :class:`ReviewDecision`'s verdicts.
VERDICTS = ("allow", "deny", "ask")
#: A reason (the reviewer's, or the handler's error) is clipped to this many characters.
REASON_CHARS = 2000
_numbers = itertools.count(1)


@attrs.frozen
class ReviewRequest:
    """What a reviewer is asked about one program, before it runs: ``code``
    (the program as the model wrote it), ``description`` (the run's
    description, the model's own words) and ``summary``, its
    :class:`~nous_sched.ProgramSummary` (:func:`~nous_sched.summarize`)."""

    code: str
    description: str
    summary: ProgramSummary

    def question(self) -> str:
        """The program as a person should read it before allowing it
        (``nous_sched.gate.approval_text.program_question``: escaped, clipped)."""
        return approval_text.program_question(self.code, self.description, self.summary)


@attrs.frozen
class ReviewDecision:
    """A reviewer's answer: ``verdict`` (``"allow"``, ``"deny"`` or ``"ask"``)
    and ``reason``, which a denied run returns to the model as its error's
    message. Make one with :meth:`allow`, :meth:`deny` or :meth:`ask`."""

    verdict: str = attrs.field(validator=v.one_of(VERDICTS))
    reason: str = attrs.field(default="", validator=v.STR)

    @classmethod
    def allow(cls, reason: str = "") -> ReviewDecision:
        """The program may run."""
        return cls("allow", reason)

    @classmethod
    def deny(cls, reason: str) -> ReviewDecision:
        """Nothing runs; ``reason`` goes back to the model (a ``review_denied`` error)."""
        return cls("deny", reason)

    @classmethod
    def ask(cls, reason: str = "") -> ReviewDecision:
        """Ask the run's approval handler, with the whole program and its summary as one question."""
        return cls("ask", reason)


@attrs.frozen
class Verdict:
    """What the review decided: ``allowed``, ``reason`` and whether a person was ``asked``."""

    allowed: bool
    reason: str
    asked: bool = False
    #: An ``ask`` left to a durable run's approval store (no handler, or it answered ``DEFER``).
    deferred: bool = False


def _clip(text: str) -> str:
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS] + "… (clipped)"


def decide(
    reviewer: Callable[[ReviewRequest], Any],
    request: ReviewRequest,
    handler: Optional[Callable[[ApprovalRequest], Any]],
    bound: float,
    cancel: Any = None,
    defer: Any = None,
) -> Verdict:
    """The review's verdict: ``reviewer`` asked on a thread of its own, for at
    most ``bound`` seconds (then, or on ``cancel``, a deny); an ``ask`` asks
    ``handler`` within the same bound. With ``defer`` (a durable run's
    ``DEFER``), an ``ask`` with no handler, or one it answers with ``defer``,
    is a :attr:`Verdict.deferred` verdict. Never raises."""
    box: list[Verdict] = []
    done = threading.Event()

    def target() -> None:
        try:
            box.append(_answer(reviewer, request, handler, defer))
        except BaseException as exc:  # (a reviewer's SystemExit too: it denies, it does not end the process)
            box.append(Verdict(False, f"the reviewer raised {type(exc).__name__}: {_clip(str(exc))}"))
        finally:
            done.set()

    thread = threading.Thread(target=target, name=f"nous-sched-review-{next(_numbers)}", daemon=True)
    thread.start()
    end = time.monotonic() + bound
    while not done.is_set():
        left = end - time.monotonic()
        if left <= 0:
            return Verdict(False, f"the reviewer did not answer within {bound:g} s (the run's timeout)")
        if cancel is not None and cancel.is_set():
            return Verdict(False, "the run was cancelled while its program was being reviewed")
        done.wait(min(left, 0.05))
    return box[0]


def _answer(
    reviewer: Callable[[ReviewRequest], Any],
    request: ReviewRequest,
    handler: Optional[Callable[..., Any]],
    defer: Any = None,
) -> Verdict:
    decision = reviewer(request)
    if not isinstance(decision, ReviewDecision):
        shown = type(decision).__name__
        return Verdict(False, f"the reviewer answered a {shown}, not a nous_sched.ReviewDecision")
    if decision.verdict == "allow":
        return Verdict(True, _clip(decision.reason) or "allowed by the reviewer")
    if decision.verdict == "deny":
        return Verdict(False, _clip(decision.reason) or "denied by the reviewer")
    waits = "the program waits for approval in the run's approval store"
    if handler is None and defer is not None:
        return Verdict(False, waits, True, deferred=True)
    if handler is None:
        return Verdict(False, "the reviewer asked for approval, and the run has no approval handler to ask", True)
    question = ApprovalRequest("", {}, description=request.description, code=request.code, program=request.summary)
    try:
        answer = handler(question)
    except Exception as exc:
        return Verdict(False, f"the approval handler raised {type(exc).__name__}: {_clip(str(exc))}", True)
    if answer is True:
        return Verdict(True, "approved by the approval handler", True)
    if defer is not None and answer is defer:
        return Verdict(False, waits, True, deferred=True)
    return Verdict(False, "the program was rejected by the approval handler", True)

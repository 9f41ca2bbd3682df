"""The approval store seam: what ``approval_store=`` takes (:class:`ApprovalStoreSeam`).

Declared here, in the values layer, below :class:`~nous_sched.RunOptions`
(which types its ``approval_store`` field with it) and below
:mod:`nous_sched.durable` (whose stores implement it), so that the options
a run is made with name a public type without importing the durable runs
that read them.
"""

from __future__ import annotations

import abc
from typing import Any, Optional

__all__ = ["ApprovalStoreSeam"]


class ApprovalStoreSeam(abc.ABC):
    """What a durable run needs of the store where its suspensions wait.

    :class:`~nous_sched.ApprovalStore` implements it (the base of
    :class:`~nous_sched.SqliteApprovalStore`,
    :class:`~nous_sched.RedisApprovalStore` and
    :class:`~nous_sched.PostgresApprovalStore`); ``RunOptions(approval_store=...)``
    and ``run_code(approval_store=...)`` accept any instance of it and refuse
    anything else with a :class:`~nous_sched.ConfigError`. Every method is
    abstract: a class that leaves one out cannot be made (``TypeError``).
    """

    __slots__ = ()

    #: Seconds a process holds a run it suspended, so that a resume in the same
    #: process continues it without replay (0: never).
    park: float

    #: Seconds a resume holds its claim without renewing it (it renews every third
    #: of it); a claim on another host whose lease ran out may be taken over. A
    #: store that does not set it has the default, 30.
    lease: float = 30.0

    @abc.abstractmethod
    def save(self, record: dict[str, Any]) -> tuple[str, float]:
        """Keep a new suspension's record; its ``(token, expires_at)``."""

    @abc.abstractmethod
    def load(self, token: Any) -> dict[str, Any]:
        """The record of a pending token, without claiming it."""

    @abc.abstractmethod
    def claim(self, token: Any, first_progress: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        """Claim the token, at most once across every process sharing the store; its record."""

    @abc.abstractmethod
    def finish(self, token: str) -> None:
        """Mark a claimed token's resume finished."""

    def finish_held(self, token: str, by: str) -> bool:
        """Mark a claimed token's resume finished only while ``by`` still
        holds the claim (one atomic step); False when it does not (another
        resume took the token over: it is that one's to finish). A resume
        ends with it. This default, for a store written before it, is
        :meth:`finish` whoever holds the claim: override it."""
        self.finish(token)
        return True

    @abc.abstractmethod
    def release(self, token: str) -> None:
        """Give a claimed token back: only for a resume that ran nothing."""

    @abc.abstractmethod
    def decide(self, token: Any, seq: int, approved: bool, reason: str = "", grant: Any = None) -> None:
        """Record an operator's decision on pending call ``seq``, for a later resume;
        ``grant`` (a :class:`~nous_sched.Grant`) approves later calls to its tool too."""

    @abc.abstractmethod
    def suspensions(self) -> list[dict[str, Any]]:
        """Every unexpired suspension, with its state."""

    @abc.abstractmethod
    def write_progress(self, token: str, by: str, progress: dict[str, Any]) -> bool:
        """Replace the resume's progress record while ``by`` still holds the claim; False when it does not."""

    @abc.abstractmethod
    def claimed(self, token: Any) -> Optional[dict[str, Any]]:
        """A claimed token as the store holds it; None when it is not claimed."""

    @abc.abstractmethod
    def take_over(self, token: str, found: dict[str, Any]) -> str:
        """Claim a token whose claimer died (``found``: :meth:`claimed`'s answer); this process's claimer name."""

    @abc.abstractmethod
    def settle(self, token: Any, seq: int, ran: bool) -> dict[str, Any]:
        """A person's word on call ``seq`` of a crashed resume, whose fate is unknown."""

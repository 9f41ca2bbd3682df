"""Approval stores: where a suspended run waits for its approvals, and its token.

A durable run (:mod:`nous_sched.durable`) that reaches a call needing
approval suspends: its *record* (the program, its ledger of committed calls
and clock values, the pending requests) is saved in a store, and the caller
gets a *token*. Two stores ship:

* :class:`SqliteApprovalStore` (stdlib ``sqlite3``, WAL mode): one file, for
  one machine (many processes may share it);
* :class:`RedisApprovalStore` (``pip install -e '.[redis]'`` from a checkout): for a fleet
  of web servers.

A third, :class:`~nous_sched.PostgresApprovalStore` (:mod:`nous_sched.durable.postgres_store`),
keeps the same contract in a Postgres database.

What a caller may rely on, for both:

* **Authenticated.** A token is ``<id>.<expires>.<mac>``, the MAC an HMAC-SHA256
  of the id and expiry under a key the store holds (made once, at random, and
  kept in the store) or the one the caller passes (``key=``). A token changed
  in any way, or made up, is refused with :class:`TokenError` before the store
  is asked anything else.
* **The record bound to its token.** What a token approves is sealed under
  the same key, bound to the token's id and expiry: the record (the program,
  its description, the tool set's hash, the ledger of committed calls and
  clock values, and each pending call's seq, tool and arguments), the
  record's *pending* state, and each operator decision (its seq, verdict and
  reason). A row edited in the store (arguments changed, a record or a
  decision copied from another suspension, a claimed or finished state set
  back to ``pending``) is refused as tampered with :class:`TokenError`, and
  nothing runs; :meth:`suspensions` lists such a row as ``tampered``.
* **Expires.** Past ``expires_at`` (``ttl`` seconds after the suspension,
  24 hours by default) a token is refused; Redis drops the record then too.
* **At most once.** :meth:`claim` is atomic (SQLite: one conditional
  ``UPDATE`` in a transaction; Redis: a Lua script): of two concurrent
  resumes of one token exactly one gets the record, the other a
  :class:`TokenError`. A claimed token stays claimed while its resume runs
  and once it finishes (``done``). When its process dies mid-run
  (``claimed``, which :meth:`suspensions` shows), the resume's *progress*
  is in the store (:mod:`nous_sched.durable._progress`: each call's start,
  written before its tool runs, and each outcome), and a later resume takes
  the claim over (:meth:`take_over`, atomic; the claimer judged dead by
  :mod:`nous_sched.durable._claimer`: on the same host, its process is gone;
  on another, its *lease* ran out, ``lease`` seconds after its last renewal): it replays what committed, runs
  what never started, and refuses while a started call has no outcome until
  a person settles it (:meth:`settle`). Every write of a resume's progress is
  conditional on its claim still being its own, so a resume that was taken
  over starts nothing more: a resume judged dead that was only stalled
  (its host cut off from the store, paused) runs no call after the take-over,
  and the one it had started is the one a person settles.
* **Progress sealed.** The claimed state is sealed with its claimer's name,
  and the progress record with the token's id and expiry: a writer without
  the key cannot point a live claim at a dead process, nor forge a call's
  fate (``not ran``); a row so changed is ``tampered``. Rolling a row back
  to an earlier sealed progress is the limit said below.
* Records are JSON, data only, never code that the host runs.

**The threat model.** Someone who can read and write the store's rows (SQL on
the file, commands to Redis) but does not have the key: they cannot make a
row resume anything the key's holder did not save, or resume a token twice by
editing its state. Two limits follow from what a key can prove:

* The key must be out of their reach. By default it is kept *in* the store
  (table ``nous_meta``; Redis key ``<prefix>:hmac_key``), where whoever can
  read the rows can read it too: then the seals catch damage and edits made
  without it, not a deliberate attacker. Against one, pass ``key=`` from
  where the rows' writers cannot read it (a secret manager, an environment
  variable of the resuming service; the command line reads
  ``NOUS_SCHED_APPROVAL_KEY``), or keep the key's Redis key out of their ACL.
* A seal proves where a row came from, not that it is the latest one. A
  writer who copied a row's exact bytes before its claim and writes them all
  back afterwards restores a state the store itself cannot tell from the
  original (no data inside the store moves only forward); so does one who
  writes back an operator's earlier decision on a call that was decided
  again. A process keeps the ids it has claimed (until they expire) and
  refuses such a rolled-back token itself; another process trusts the
  store. Where at most once must hold against that writer too, keep the
  store where rows cannot be rolled back (no write access but the resuming
  services'). Deleting a row or a decision is always possible to such a
  writer: the token is then unknown, or the resume lacks a decision, and
  nothing runs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import sqlite3
import threading
import time
from typing import Any, Optional

from .. import _redis_client
from .. import _validators as v
from .._extras import install_command
from .._validators import require
from ..errors import RunCodeError
from ..gate.approval_seam import ApprovalStoreSeam
from ..gate.grants import Grant, canonical
from ._claimer import claim_alive, claimer, describe, lease_alive
from ._progress import DEFAULT_LEASE

__all__ = [
    "ApprovalStore",
    "SqliteApprovalStore",
    "RedisApprovalStore",
    "TokenError",
    "UnsettledError",
    "DEFAULT_TTL",
]

#: How long a suspension waits for its approvals by default: 24 hours.
DEFAULT_TTL = 24 * 3600.0
_KEY_BYTES = 32
_OPTIONAL_KEY = v.optional(v.instance_of(bytes, "bytes (an HMAC key)"))
_PARK = v.WAIT_SECONDS


class TokenError(RunCodeError):
    """A token that cannot resume anything (nothing ran): forged or tampered,
    expired, unknown to the store, or already claimed."""


class UnsettledError(TokenError):
    """A crashed resume left calls whose fate is unknown (started, never
    committed): a person must settle each (``nous-sched approvals settle``)
    before the token resumes. Nothing ran. ``seqs`` names them."""

    def __init__(self, message: str, seqs: tuple[int, ...]) -> None:
        super().__init__(message)
        self.seqs = seqs


def _now() -> float:
    return time.time()


def _mac(key: bytes, body: str) -> str:
    digest = hmac.new(key, body.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


# What each seal covers, one purpose word first (so a seal made for one can never pass as another),
# then the suspension's id and expiry (so a record, state or decision copied from another row fails).
def _record_body(sid: str, expires: float, record: str) -> str:
    return f"record\n{sid}\n{int(expires)}\n{record}"


def _pending_body(sid: str, expires: float) -> str:
    return f"pending\n{sid}\n{int(expires)}"


def _decision_body(sid: str, seq: str, approved: bool, reason: str, grant: Any = None) -> str:
    if grant is None:
        return f"decision\n{sid}\n{seq}\n{int(approved)}\n{reason}"
    # Its own first line, and the grant's JSON (one line: JSON escapes a newline) before the reason.
    return f"decision-grant\n{sid}\n{seq}\n{int(approved)}\n{canonical(grant)}\n{reason}"


def _claimed_body(sid: str, expires: float, by: str) -> str:
    return f"claimed\n{sid}\n{int(expires)}\n{by}"


def _progress_body(sid: str, expires: float, progress: str) -> str:
    return f"progress\n{sid}\n{int(expires)}\n{progress}"


#: Suspensions this process claimed, by id, with their expiry: a row rolled back
#: to ``pending`` after its claim is refused here even with its old seal.
_CLAIMED: dict[str, float] = {}
_CLAIMED_LOCK = threading.Lock()


def _remember_claim(sid: str, expires: float) -> None:
    now = _now()
    with _CLAIMED_LOCK:
        for old in [s for s, until in _CLAIMED.items() if until <= now]:
            del _CLAIMED[old]
        _CLAIMED[sid] = expires


def _forget_claim(sid: str) -> None:
    with _CLAIMED_LOCK:
        _CLAIMED.pop(sid, None)


def _claimed_here(sid: str) -> bool:
    with _CLAIMED_LOCK:
        return sid in _CLAIMED


_TAMPERED = "the suspension's {what} in the store was changed without the store's key (tampered): nothing ran"


class ApprovalStore(ApprovalStoreSeam):
    """The shared half of both stores: tokens, expiry and the record's life
    (it implements :class:`~nous_sched.ApprovalStoreSeam`, what ``approval_store=`` takes).

    A subclass keeps rows: ``_put``, ``_get``, ``_claim``, ``_set``, ``_rows``
    and ``_stored_key``.
    """

    def __init__(self, key: Optional[bytes], ttl: float, park: float = 0.0, lease: float = DEFAULT_LEASE) -> None:
        require(type(self).__name__, "key", key, _OPTIONAL_KEY)
        require(type(self).__name__, "ttl", ttl, v.SECONDS)
        require(type(self).__name__, "park", park, _PARK)
        require(type(self).__name__, "lease", lease, v.SECONDS)
        self._hmac_key = key
        self.ttl = float(ttl)
        #: Seconds a resume holds its claim without renewing it (see the module's "At most once").
        self.lease = float(lease)
        #: Seconds a process holds a run it suspended, so that a resume in the
        #: same process continues it without replay (0: never; it counts against the run's timeout).
        self.park = float(park)

    # -- tokens ----------------------------------------------------------------

    def _key(self) -> bytes:
        if self._hmac_key is None:
            # Read once: a stored key is written once (never replaced), and each seal needs it.
            self._hmac_key = self._stored_key()
        return self._hmac_key

    def token_for(self, sid: str, expires_at: float) -> str:
        """The signed token of suspension ``sid``."""
        body = f"{sid}.{int(expires_at)}"
        return body + "." + _mac(self._key(), body)

    def verify(self, token: Any) -> tuple[str, float]:
        """``(id, expires_at)`` of a token this store signed and that has not expired.

        :raises TokenError: anything else.
        """
        if not isinstance(token, str) or token.count(".") != 2:
            raise TokenError("not an approval token (it must be <id>.<expires>.<mac>, as a suspension gave it)")
        sid, expires, mac = token.split(".")
        if not hmac.compare_digest(mac, _mac(self._key(), f"{sid}.{expires}")):
            raise TokenError("the approval token was not signed by this store's key: it was changed or made up")
        if int(expires) <= _now():
            raise TokenError(f"the approval token expired at {_when(int(expires))}")
        return sid, float(expires)

    # -- records ---------------------------------------------------------------

    def _seal(self, body: str) -> str:
        return _mac(self._key(), body)

    def save(self, record: dict[str, Any]) -> tuple[str, float]:
        """Keep a new suspension's record, sealed with its token; its ``(token, expires_at)``."""
        # Hex: a token is typed into a shell (``nous-sched approvals approve
        # TOKEN``), where one starting with "-" would read as an option.
        sid = secrets.token_hex(12)
        expires_at = float(int(_now() + self.ttl))
        text = json.dumps(record, separators=(",", ":"))
        seals = (self._seal(_record_body(sid, expires_at, text)), self._seal(_pending_body(sid, expires_at)))
        self._put(sid, text, expires_at, *seals)
        return self.token_for(sid, expires_at), expires_at

    def load(self, token: Any) -> dict[str, Any]:
        """The record of a pending token, without claiming it.

        :raises TokenError: the token is bad, expired, unknown or already
            claimed, or its row was changed without the key (tampered).
        """
        sid, expires = self.verify(token)
        row = self._get(sid)
        if row is None:
            raise TokenError("the approval token is unknown to this store (or its record has expired)")
        _refuse_claimed(row)
        _refuse_claimed_here(sid)
        self._check_pending(sid, expires, row)
        return self._opened(sid, expires, row)

    def claim(self, token: Any, first_progress: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        """Claim the token, at most once across every process sharing the store; its record.

        The claim names this process (``claimer``) and writes the resume's
        first progress record (``first_progress``, sealed), in the same atomic step.

        Only a row whose pending state carries its seal is claimed, in one
        atomic step; a row set back to ``pending`` without it is refused as
        tampered, and one this process claimed before is refused here whatever
        the row says.

        :raises TokenError: the token is bad, expired, unknown, tampered with,
            or another resume claimed it first.
        """
        sid, expires = self.verify(token)
        if _claimed_here(sid):
            row = self._get(sid)  # says how the row stands; one that says pending was rolled back
            if row is not None:
                _refuse_claimed(row)
            _refuse_claimed_here(sid)
        by = claimer()
        progress = json.dumps(first_progress or {"tracked": False}, separators=(",", ":"))
        after = {
            "claimed_seal": self._seal(_claimed_body(sid, expires, by)),
            "progress": progress,
            "progress_seal": self._seal(_progress_body(sid, expires, progress)),
        }
        row = self._claim(sid, _now(), by, self._seal(_pending_body(sid, expires)), after)
        if row is None:
            raise TokenError("the approval token is unknown to this store (or its record has expired)")
        if row.get("won") is not True:
            _refuse_claimed(row)
            self._check_pending(sid, expires, row)
            raise TokenError("the approval token could not be claimed")
        _remember_claim(sid, expires)
        opened = self._opened(sid, expires, row)
        opened["claimed_by"] = by
        return opened

    def finish(self, token: str) -> None:
        """Mark a claimed token's resume finished (``done``)."""
        sid, _ = self.verify(token)
        self._set(sid, state="done", state_seal="")

    def finish_held(self, token: str, by: str) -> bool:
        """Mark a claimed token's resume finished (``done``) only while ``by``
        still holds the claim (one atomic step); False when it does not."""
        sid, _ = self.verify(token)
        return self._swap(sid, {"state": "claimed", "claimed_by": by}, {"state": "done", "state_seal": ""})

    def release(self, token: str) -> None:
        """Give a claimed token back (``pending``): only for a resume that ran nothing (a bad option)."""
        sid, expires = self.verify(token)
        self._set(
            sid,
            state="pending",
            state_seal=self._seal(_pending_body(sid, expires)),
            claimed_by="",
            progress="",
            progress_seal="",
        )
        _forget_claim(sid)

    def decide(self, token: Any, seq: int, approved: bool, reason: str = "", grant: Optional[Grant] = None) -> None:
        """Record an operator's decision on pending call ``seq``, for a later resume.

        Atomic in the store: decisions on different calls made at once, from any
        processes, all land, and a decision that loses a race with a resume's
        claim is refused rather than written into a run that has begun. The
        decision is sealed with its token, seq, verdict, reason and ``grant``
        (a :class:`~nous_sched.Grant`: the call and later calls to its tool in
        the resumed run, approved at once; the pending calls it may cover need
        no decision of their own).

        :raises TokenError: the token is bad, expired, unknown, tampered with or already claimed.
        :raises ConfigError: ``seq`` is not one of the suspension's pending calls, or a
            ``grant`` that is not a Grant, or on a call not approved.
        """
        if grant is not None and not isinstance(grant, Grant):
            v.fail("decide", "grant", grant, "None or a nous_sched.Grant")
        if grant is not None and approved is not True:
            v.fail("decide", "grant", grant, "None when the call is not approved (a grant approves)")
        record = self.load(token)
        seqs = [p["seq"] for p in record["pending"]]
        if seq not in seqs:
            v.fail("decide", "seq", seq, f"one of the pending calls {seqs}")
        sid, _ = self.verify(token)
        # One read-modify-write in the store: two operators deciding two calls at
        # once both land, and a decision that loses a race with a resume's claim
        # is refused, never written into a run that has already begun.
        shown = None if grant is None else grant.as_dict()
        mac = self._seal(_decision_body(sid, str(seq), bool(approved), reason, shown))
        fields: dict[str, Any] = {"approved": bool(approved), "reason": reason, "mac": mac}
        if shown is not None:
            fields["grant"] = shown
        decision = json.dumps(fields, separators=(",", ":"))
        row = self._decide(sid, str(seq), decision)
        if row is None:
            raise TokenError("the approval token is unknown to this store (or its record has expired)")
        _refuse_claimed(row)

    def suspensions(self) -> list[dict[str, Any]]:
        """Every unexpired suspension: ``{token, state, expires_at, pending, decisions, claimed_by}``,
        ``state`` one of ``pending``, ``claimed`` (a resume began and did not
        finish: its process may have died), ``done`` and ``tampered`` (a row
        changed without the key: its token is refused, and ``pending`` is
        what the row claims). A ``claimed`` row's ``resume`` says how its
        resume stands: ``{alive (true, false, or null: cannot tell),
        lease_until (epoch seconds, or null), tracked, committed: [seq], in_flight: [{seq, tool, arguments,
        settled}]}`` (``in_flight``: calls started and never committed;
        while ``alive`` is false and one has ``settled`` null, a person must
        settle it); other rows' ``resume`` is null."""
        out = []
        now = _now()
        for sid, row in self._rows():
            if row["expires"] <= now:
                continue
            state, resume = row["state"], None
            try:
                if state == "pending":
                    self._check_pending(sid, row["expires"], row)
                if state == "claimed":
                    resume = _resume_shown(self._claimed_row(sid, row["expires"], row))
                record = self._opened(sid, row["expires"], row)
            except TokenError:
                state, record = "tampered", _unsealed(row)
            out.append(
                {
                    "token": self.token_for(sid, row["expires"]),
                    "state": state,
                    "expires_at": row["expires"],
                    "pending": record.get("pending", []),
                    "decisions": record.get("decisions", {}),
                    "claimed_by": describe(row.get("claimed_by")) if row.get("claimed_by") else "",
                    "description": record.get("description", ""),
                    "resume": resume,
                }
            )
        return out

    # -- a claimed resume's progress --------------------------------------------

    def write_progress(self, token: str, by: str, progress: dict[str, Any]) -> bool:
        """Replace the resume's progress record, sealed, only while ``by`` still
        holds the claim (one atomic step); False when it no longer does."""
        sid, expires = self.verify(token)
        text = json.dumps(progress, separators=(",", ":"))
        seal = self._seal(_progress_body(sid, expires, text))
        return self._swap(sid, {"state": "claimed", "claimed_by": by}, {"progress": text, "progress_seal": seal})

    def claimed(self, token: Any) -> Optional[dict[str, Any]]:
        """A claimed token as the store holds it: ``{record, progress,
        claimed_by, alive}`` (``alive``: ``nous_sched.durable._claimer.claim_alive``),
        only ``{claimed_by, alive, lease_until}`` while its claimer is not
        known dead (``alive``: ``nous_sched.durable._claimer.lease_alive``,
        by its process on this host, by its lease elsewhere);
        None when the token is not claimed.

        :raises TokenError: the token is bad or unknown, or the claim or its progress was tampered with.
        """
        sid, expires = self.verify(token)
        row = self._get(sid)
        if row is None:
            raise TokenError("the approval token is unknown to this store (or its record has expired)")
        if row["state"] != "claimed":
            return None
        by = row.get("claimed_by") or ""
        if claim_alive(by) is True:  # a live claim is never opened for taking over: only who holds it
            return {"alive": True, "claimed_by": by, "lease_until": None}
        found = self._claimed_row(sid, expires, row)  # its lease is read once its seal holds
        if found["alive"] is not False:
            return {"alive": found["alive"], "claimed_by": by, "lease_until": found["lease_until"]}
        return found

    def _claimed_row(self, sid: str, expires: float, row: dict[str, Any]) -> dict[str, Any]:
        by = row.get("claimed_by") or ""
        if not _same(row.get("state_seal"), self._seal(_claimed_body(sid, expires, by))):
            raise TokenError(_TAMPERED.format(what="claimed state"))
        text = row.get("progress") or ""
        if not _same(row.get("progress_seal"), self._seal(_progress_body(sid, expires, text))):
            raise TokenError(_TAMPERED.format(what="resume's progress"))
        try:
            progress = json.loads(text, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            raise TokenError(f"the resume's progress in the store is damaged: {exc}") from None
        if not isinstance(progress, dict):
            progress = {"tracked": False}
        record = self._opened(sid, expires, row)
        until = progress.get("lease")
        alive = lease_alive(by, until, _now())
        until = until if isinstance(until, (int, float)) and not isinstance(until, bool) else None
        return {
            "record": record,
            "progress": progress,
            "claimed_by": by,
            "alive": alive,
            "text": text,
            "lease_until": until,
        }

    def take_over(self, token: str, found: dict[str, Any]) -> str:
        """Claim a token whose claimer died (``found``: :meth:`claimed`'s answer),
        in one atomic step that fails if the claim or its progress moved since;
        this process's claimer name.

        :raises TokenError: another resume took it over first.
        """
        sid, expires = self.verify(token)
        by = claimer()
        expect = {"state": "claimed", "claimed_by": found["claimed_by"], "progress": found["text"]}
        # The new holder's lease starts with the claim, so that no third resume finds it run out.
        text = json.dumps({**found["progress"], "lease": _now() + self.lease}, separators=(",", ":"))
        fields = {
            "claimed_by": by,
            "state_seal": self._seal(_claimed_body(sid, expires, by)),
            "progress": text,
            "progress_seal": self._seal(_progress_body(sid, expires, text)),
        }
        if not self._swap(sid, expect, fields):
            raise TokenError("another resume took over the approval token first: nothing ran here")
        _remember_claim(sid, expires)
        return by

    def settle(self, token: Any, seq: int, ran: bool) -> dict[str, Any]:
        """A person's word on call ``seq`` of a crashed resume, whose fate is unknown
        (started, never committed): ``ran`` (it ran; the program gets an error
        saying its result was lost) or not (a later resume runs it). Sealed in the
        resume's progress; only while the claimer is dead. The settled call.

        :raises TokenError: the token is bad, not claimed, its claimer alive (or on another host), tampered.
        :raises ConfigError: ``seq`` is not a call whose fate is unknown.
        """
        sid, expires = self.verify(token)
        found = self.claimed(token)
        if found is None:
            raise TokenError("the approval token is not held by a resume: there is nothing to settle")
        _refuse_live(found)
        progress = found["progress"]
        started = progress.get("started") if progress.get("tracked") is True else None
        if not isinstance(started, dict) or str(seq) not in started:
            unknown = sorted(int(s) for s in started or {} if s.isdigit())
            v.fail("settle", "seq", seq, f"one of the calls whose fate is unknown {unknown}")
        settled = dict(progress.get("settled") or {})
        settled[str(seq)] = "ran" if ran else "not-ran"
        text = json.dumps({**progress, "settled": settled}, separators=(",", ":"))
        seal = self._seal(_progress_body(sid, expires, text))
        expect = {"state": "claimed", "claimed_by": found["claimed_by"], "progress": found["text"]}
        if not self._swap(sid, expect, {"progress": text, "progress_seal": seal}):
            raise TokenError("the resume's progress changed while settling (another settle or resume): try again")
        call = started[str(seq)]
        return {"seq": seq, "tool": call[0], "arguments": _arguments(call[1]), "settled": settled[str(seq)]}

    # -- the seals -------------------------------------------------------------

    def _check_pending(self, sid: str, expires: float, row: dict[str, Any]) -> None:
        """A row that says ``pending`` must carry the pending state's seal."""
        if row["state"] == "pending" and not _same(row.get("state_seal"), self._seal(_pending_body(sid, expires))):
            raise TokenError(_TAMPERED.format(what="state"))

    def _opened(self, sid: str, expires: float, row: dict[str, Any]) -> dict[str, Any]:
        """The row's record and decisions once their seals hold. :raises TokenError: tampered or damaged."""
        if not _same(row.get("seal"), self._seal(_record_body(sid, expires, row["record"]))):
            raise TokenError(_TAMPERED.format(what="record"))
        record = _record(row)
        for seq, decision in record["decisions"].items():
            if not (
                isinstance(decision, dict)
                and isinstance(decision.get("reason"), str)
                and isinstance(decision.get("approved"), bool)
                and _same(decision.get("mac"), self._seal(_sealed_decision(sid, seq, decision)))
            ):
                raise TokenError(_TAMPERED.format(what=f"decision on call {seq}"))
            del decision["mac"]
        return record

    # -- what a subclass keeps -------------------------------------------------

    def _stored_key(self) -> bytes:
        raise NotImplementedError

    def _put(self, sid: str, record: str, expires: float, seal: str, state_seal: str) -> None:
        raise NotImplementedError

    def _get(self, sid: str) -> Optional[dict[str, Any]]:
        raise NotImplementedError

    def _claim(self, sid: str, now: float, by: str, state_seal: str, after: dict[str, str]) -> Optional[dict[str, Any]]:
        """Atomically: a row that is ``pending``, unexpired and carries
        ``state_seal`` becomes ``claimed`` by ``by`` (``won``), its
        ``state_seal``, ``progress`` and ``progress_seal`` those of ``after``;
        the row as it is after."""
        raise NotImplementedError

    def _swap(self, sid: str, expect: dict[str, str], fields: dict[str, str]) -> bool:
        """Atomically: set ``fields`` when every column in ``expect`` holds its value; whether it did."""
        raise NotImplementedError

    def _set(self, sid: str, **fields: str) -> None:
        raise NotImplementedError

    def _decide(self, sid: str, seq: str, decision: str) -> Optional[dict[str, Any]]:
        """Atomically add ``decision`` (JSON text) under ``seq`` to a *pending*
        row's decisions; the row as it is after (``None`` when there is none)."""
        raise NotImplementedError

    def _rows(self) -> list[tuple[str, dict[str, Any]]]:
        raise NotImplementedError


def _sealed_decision(sid: str, seq: str, decision: dict[str, Any]) -> str:
    """The body a stored decision's seal is over (its grant's too, when it has one)."""
    try:
        return _decision_body(sid, seq, decision["approved"], decision["reason"], decision.get("grant"))
    except (TypeError, ValueError, RecursionError):  # a grant that is not JSON: no seal holds
        return "\x00damaged"


def _same(found: Any, expected: str) -> bool:
    return isinstance(found, str) and hmac.compare_digest(found.encode("ascii", "replace"), expected.encode("ascii"))


def _resume_shown(found: dict[str, Any]) -> dict[str, Any]:
    progress = found["progress"]
    settled = progress.get("settled") or {}
    started = progress.get("started") or {}
    return {
        "alive": found["alive"],
        "lease_until": found["lease_until"],
        "tracked": progress.get("tracked") is True,
        "committed": sorted(int(s) for s in progress.get("committed") or {} if str(s).isdigit()),
        "in_flight": [
            {"seq": int(s), "tool": call[0], "arguments": _arguments(call[1]), "settled": settled.get(s)}
            for s, call in sorted(started.items(), key=lambda item: int(item[0]) if item[0].isdigit() else -1)
        ],
    }


def _refuse_live(found: dict[str, Any]) -> None:
    if found["alive"] is not False:
        until = found.get("lease_until")
        if found["alive"] and until is not None:
            state = f"still running (its lease runs until {_when(until)})"
        elif found["alive"]:
            state = "still running"
        else:
            state = "on another host and holds no lease (written before leases), or cannot be checked from here"
        raise TokenError(
            f"the approval token is held by a resume ({describe(found['claimed_by'])}) that is {state}; "
            "only a dead resume's calls are settled or taken over"
        )


def _arguments(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _refuse_claimed_here(sid: str) -> None:
    if _claimed_here(sid):
        raise TokenError(
            "the approval token was already claimed by this process; its row in the store says otherwise, "
            "so the row was rolled back: nothing ran"
        )


def _unsealed(row: dict[str, Any]) -> dict[str, Any]:
    """What a tampered row claims, for a listing only (never resumed)."""
    try:
        found = json.loads(row["record"])
    except (TypeError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _record(row: dict[str, Any]) -> dict[str, Any]:
    """A row's record and decisions: strict JSON (no NaN or Infinity), data only."""
    try:
        record: dict[str, Any] = json.loads(row["record"], parse_constant=_no_constant)
        record["decisions"] = _decisions(row.get("decisions"))
    except (TypeError, ValueError) as exc:
        raise TokenError(f"the suspension's record in the store is damaged: {exc}") from None
    return record


def _decisions(text: Any) -> dict[str, Any]:
    try:
        found = json.loads(text or "{}", parse_constant=_no_constant)
    except (TypeError, ValueError) as exc:
        raise TokenError(f"the suspension's decisions in the store are damaged: {exc}") from None
    if not isinstance(found, dict):
        raise TokenError("the suspension's decisions in the store are damaged: not an object")
    return found


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _refuse_claimed(row: dict[str, Any]) -> None:
    state = row["state"]
    if state == "done":
        raise TokenError("the approval token was already used: its run was resumed and finished")
    if state == "claimed":
        raise TokenError(
            f"the approval token was already claimed by a resume ({describe(row.get('claimed_by'))}) "
            "that has not finished; once that process has died (on another host: once the lease it renews while "
            "it runs has run out), a resume continues it (calls whose fate is "
            "unknown are settled first: nous-sched approvals settle)"
        )


# -- SQLite ------------------------------------------------------------------------

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS nous_meta (name TEXT PRIMARY KEY, value BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS nous_suspensions (id TEXT PRIMARY KEY, record TEXT NOT NULL, "
    "expires REAL NOT NULL, state TEXT NOT NULL, decisions TEXT NOT NULL DEFAULT '{}', "
    "claimed_by TEXT NOT NULL DEFAULT '', seal TEXT NOT NULL DEFAULT '', state_seal TEXT NOT NULL DEFAULT '', "
    "progress TEXT NOT NULL DEFAULT '', progress_seal TEXT NOT NULL DEFAULT '')",
)
#: Columns a store made before the seals lacks: added empty, so its old rows are refused as tampered.
_SEAL_COLUMNS = ("seal", "state_seal", "progress", "progress_seal")
_COLUMNS = ("record", "expires", "state", "decisions", "claimed_by", *_SEAL_COLUMNS)
_SELECT = "SELECT " + ", ".join(_COLUMNS) + " FROM nous_suspensions WHERE id = ?"


class SqliteApprovalStore(ApprovalStore):
    """An approval store in one SQLite file (WAL mode), shared by any number of
    processes on one machine. Each operation opens its own connection, so a
    store may be used from many threads.

    :param path: the database file (created, with its tables, when missing).
    :param key: the HMAC key for tokens; by default one made at random and kept in the file.
    :param ttl: seconds a suspension waits for its approvals.
    :param park: seconds this process holds a run it suspended, so that a resume
        here continues it without replay (0, the default: always replay).
    :param lease: seconds a resume holds its claim without renewing it (it renews
        every third of it); a claim on another host whose lease ran out may be
        taken over (30 by default; see the module's "At most once").
    """

    def __init__(
        self,
        path: Any,
        *,
        key: Optional[bytes] = None,
        ttl: float = DEFAULT_TTL,
        park: float = 0.0,
        lease: float = DEFAULT_LEASE,
    ) -> None:
        require(
            "SqliteApprovalStore", "path", path, v.Check("a file path", lambda p: isinstance(p, (str, os.PathLike)))
        )
        super().__init__(key, ttl, park, lease)
        self.path = os.fspath(path)
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            for statement in _SCHEMA:
                db.execute(statement)
            _add_seal_columns(db)

    def __repr__(self) -> str:
        return f"SqliteApprovalStore({self.path!r})"

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30.0, isolation_level=None)

    def _stored_key(self) -> bytes:
        with self._connect() as db:
            db.execute(
                "INSERT OR IGNORE INTO nous_meta (name, value) VALUES ('hmac_key', ?)",
                (secrets.token_bytes(_KEY_BYTES),),
            )
            row = db.execute("SELECT value FROM nous_meta WHERE name = 'hmac_key'").fetchone()
        return bytes(row[0])

    def _put(self, sid: str, record: str, expires: float, seal: str, state_seal: str) -> None:
        with self._connect() as db:
            db.execute(
                "INSERT INTO nous_suspensions (id, record, expires, state, seal, state_seal) "
                "VALUES (?, ?, ?, 'pending', ?, ?)",
                (sid, record, expires, seal, state_seal),
            )

    def _get(self, sid: str) -> Optional[dict[str, Any]]:
        with self._connect() as db:
            row = db.execute(_SELECT, (sid,)).fetchone()
        return None if row is None else _row_of(row)

    def _claim(self, sid: str, now: float, by: str, state_seal: str, after: dict[str, str]) -> Optional[dict[str, Any]]:
        db = self._connect()
        try:
            # One writer at a time: the conditional UPDATE is the claim, and its
            # row count says who won.
            db.execute("BEGIN IMMEDIATE")
            won = db.execute(
                "UPDATE nous_suspensions SET state = 'claimed', claimed_by = ?, state_seal = ?, progress = ?, "
                "progress_seal = ? WHERE id = ? AND state = 'pending' AND state_seal = ? AND expires > ?",
                (by, after["claimed_seal"], after["progress"], after["progress_seal"], sid, state_seal, now),
            ).rowcount
            row = db.execute(_SELECT, (sid,)).fetchone()
            db.execute("COMMIT")
        finally:
            db.close()
        if row is None:
            return None
        found = _row_of(row)
        found["won"] = won == 1
        return found

    def _swap(self, sid: str, expect: dict[str, str], fields: dict[str, str]) -> bool:
        assert set(fields) | set(expect) <= set(_COLUMNS), (fields, expect)
        assignments = ", ".join(f"{name} = ?" for name in fields)
        conditions = "".join(f" AND {name} = ?" for name in expect)
        with self._connect() as db:
            changed = db.execute(
                f"UPDATE nous_suspensions SET {assignments} WHERE id = ?{conditions}",
                (*fields.values(), sid, *expect.values()),
            ).rowcount
        return bool(changed == 1)

    def _set(self, sid: str, **fields: str) -> None:
        assert set(fields) <= {"state", "decisions", "claimed_by", "state_seal", "progress", "progress_seal"}, fields
        assignments = ", ".join(f"{name} = ?" for name in fields)
        with self._connect() as db:
            db.execute(f"UPDATE nous_suspensions SET {assignments} WHERE id = ?", (*fields.values(), sid))

    def _decide(self, sid: str, seq: str, decision: str) -> Optional[dict[str, Any]]:
        db = self._connect()
        try:
            # BEGIN IMMEDIATE takes the write lock before the read, so no other
            # decision or claim can come between the read and the write.
            db.execute("BEGIN IMMEDIATE")
            row = db.execute(_SELECT, (sid,)).fetchone()
            if row is not None and row[2] == "pending":
                decisions = _decisions(row[3])
                decisions[seq] = json.loads(decision)
                merged = json.dumps(decisions, separators=(",", ":"))
                db.execute("UPDATE nous_suspensions SET decisions = ? WHERE id = ?", (merged, sid))
                row = (*row[:3], merged, *row[4:])
            db.execute("COMMIT")
        finally:
            db.close()
        return None if row is None else _row_of(row)

    def _rows(self) -> list[tuple[str, dict[str, Any]]]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT id, " + ", ".join(_COLUMNS) + " FROM nous_suspensions ORDER BY expires"
            ).fetchall()
        return [(row[0], _row_of(row[1:])) for row in rows]


def _row_of(values: Any) -> dict[str, Any]:
    """A SQLite row as a dict of columns: text as text, the expiry a number
    (a row written by hand with anything else is treated as expired; the
    token's own expiry is what counts)."""
    row = {
        column: value if isinstance(value, (str, float)) else str(value)
        for column, value in zip(_COLUMNS, values, strict=True)
    }
    if not isinstance(row["expires"], float):
        row["expires"] = float(values[1]) if isinstance(values[1], int) else 0.0
    return row


def _add_seal_columns(db: sqlite3.Connection) -> None:
    """Bring a store made before the seals up to date (its unsealed rows are then refused as tampered)."""
    db.execute("BEGIN IMMEDIATE")  # one process adds them, another finds them
    try:
        have = {row[1] for row in db.execute("PRAGMA table_info(nous_suspensions)")}
        for column in _SEAL_COLUMNS:
            if column not in have:
                db.execute(f"ALTER TABLE nous_suspensions ADD COLUMN {column} TEXT NOT NULL DEFAULT ''")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


# -- Redis -------------------------------------------------------------------------

# Claim: only a pending, unexpired record; the state change and the read are one step.
_CLAIM = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return nil end
local won = 0
local expires = tonumber(redis.call('HGET', KEYS[1], 'expires'))
if state == 'pending' and redis.call('HGET', KEYS[1], 'state_seal') == ARGV[3]
    and expires and expires > tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'state', 'claimed', 'claimed_by', ARGV[2], 'state_seal', ARGV[4],
    'progress', ARGV[5], 'progress_seal', ARGV[6])
  won = 1
end
return {won, redis.call('HGETALL', KEYS[1])}
"""


# Decide: one decision, under its own field (``decision:<seq>``, the JSON text as
# given: never decoded here, so a lone surrogate escape in a reason is kept as
# it is), into a pending record, read and write as one step (a decision racing
# a claim either lands before it or is refused).
_DECIDE = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return nil end
if state == 'pending' then
  redis.call('HSET', KEYS[1], 'decision:' .. ARGV[1], ARGV[2])
end
return redis.call('HGETALL', KEYS[1])
"""
_DECISION_FIELD = "decision:"

# Swap: set fields only when every expected field holds its value (ARGV: n, then n name/value pairs, then the rest).
_SWAP = """
local n = tonumber(ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for i = 0, n - 1 do
  local found = redis.call('HGET', KEYS[1], ARGV[2 + 2 * i])
  if (found or '') ~= ARGV[3 + 2 * i] then return 0 end
end
for i = 2 + 2 * n, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
return 1
"""


class RedisApprovalStore(ApprovalStore):
    """An approval store in Redis, for a fleet of servers (needs ``redis``:
    ``pip install -e '.[redis]'`` from a checkout). Each suspension is one hash that Redis
    drops when it expires.

    :param url: a ``redis://`` URL.
    :param key: the HMAC key for tokens; by default one made at random and kept in Redis (``SET NX``).
    :param ttl: seconds a suspension waits for its approvals.
    :param prefix: the prefix of every key this store writes.
    :param park: seconds this process holds a run it suspended (see :class:`SqliteApprovalStore`).
    :param lease: seconds a resume holds its claim without renewing it (see :class:`SqliteApprovalStore`).
    """

    def __init__(
        self,
        url: Any,
        *,
        key: Optional[bytes] = None,
        ttl: float = DEFAULT_TTL,
        prefix: str = "nous_sched:approval",
        park: float = 0.0,
        lease: float = DEFAULT_LEASE,
    ) -> None:
        require("RedisApprovalStore", "url", url, v.NON_EMPTY_STR)
        require("RedisApprovalStore", "prefix", prefix, v.NON_EMPTY_STR)
        super().__init__(key, ttl, park, lease)
        try:
            import redis  # noqa: F401  (here for the message below)
        except ImportError:
            raise RunCodeError(
                f"RedisApprovalStore needs the redis client; install it with: {install_command('redis')}"
            ) from None
        self.url = url
        self.prefix = prefix
        self._redis = _redis_client.connect(url)  # timeouts: a silent server is an error, not a hang
        self._claim_script = self._redis.register_script(_CLAIM)
        self._decide_script = self._redis.register_script(_DECIDE)
        self._swap_script = self._redis.register_script(_SWAP)

    def __repr__(self) -> str:
        return f"RedisApprovalStore({self.url!r})"

    def _name(self, sid: str) -> str:
        return f"{self.prefix}:s:{sid}"

    def _stored_key(self) -> bytes:
        name = f"{self.prefix}:hmac_key"
        self._redis.set(name, secrets.token_bytes(_KEY_BYTES), nx=True)
        value = self._redis.get(name)
        assert isinstance(value, bytes)
        return value

    def _put(self, sid: str, record: str, expires: float, seal: str, state_seal: str) -> None:
        name = self._name(sid)
        pipe = self._redis.pipeline()
        fields: dict[Any, Any] = {"record": record, "expires": repr(expires), "state": "pending"}
        pipe.hset(name, mapping={**fields, "claimed_by": "", "seal": seal, "state_seal": state_seal})
        pipe.expireat(name, int(expires) + 1)
        pipe.zadd(f"{self.prefix}:index", {sid: expires})
        pipe.execute()

    def _get(self, sid: str) -> Optional[dict[str, Any]]:
        fields = self._redis.hgetall(self._name(sid))
        return _decoded(fields) if fields else None

    def _claim(self, sid: str, now: float, by: str, state_seal: str, after: dict[str, str]) -> Optional[dict[str, Any]]:
        seals = [after["claimed_seal"], after["progress"], after["progress_seal"]]
        values = self._claim_script(keys=[self._name(sid)], args=[repr(now), by, state_seal, *seals])
        if values is None:
            return None
        row = _decoded(_pairs(values[1]))
        row["won"] = int(values[0]) == 1
        return row

    def _swap(self, sid: str, expect: dict[str, str], fields: dict[str, str]) -> bool:
        args: list[str] = [str(len(expect))]
        for name, value in [*expect.items(), *fields.items()]:
            args += [name, value]
        return int(self._swap_script(keys=[self._name(sid)], args=args)) == 1

    def _set(self, sid: str, **fields: str) -> None:
        self._redis.hset(self._name(sid), mapping=dict(fields.items()))

    def _decide(self, sid: str, seq: str, decision: str) -> Optional[dict[str, Any]]:
        values = self._decide_script(keys=[self._name(sid)], args=[seq, decision])
        return None if values is None else _decoded(_pairs(values))

    def _rows(self) -> list[tuple[str, dict[str, Any]]]:
        index = f"{self.prefix}:index"
        self._redis.zremrangebyscore(index, "-inf", _now())
        out = []
        for raw in self._redis.zrange(index, 0, -1):
            sid = raw.decode() if isinstance(raw, bytes) else str(raw)
            row = self._get(sid)
            if row is not None:
                out.append((sid, row))
        return out


def _pairs(flat: list[Any]) -> dict[Any, Any]:
    """HGETALL's reply from a script (a flat list) as a mapping."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _decoded(fields: dict[Any, Any]) -> dict[str, Any]:
    """A Redis hash as a row: its columns, and its ``decision:<seq>`` fields as the decisions' JSON text."""
    text = {_text(name): _text(value) for name, value in fields.items()}
    row: dict[str, Any] = {column: text.get(column, "") for column in _COLUMNS}
    try:
        row["expires"] = float(row["expires"] or 0.0)
    except ValueError:  # a row written by hand: treated as expired (the token's own expiry is what counts)
        row["expires"] = 0.0
    decisions = [
        (name[len(_DECISION_FIELD) :], value) for name, value in text.items() if name.startswith(_DECISION_FIELD)
    ]
    row["decisions"] = "{" + ",".join(f"{json.dumps(seq)}:{value}" for seq, value in sorted(decisions)) + "}"
    return row


def _text(value: Any) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)

"""Delivering a suspended run's result to the MCP client that started it.

With an approval store, a ``run_code`` call whose program needs an approval
the client cannot give suspends: its result's ``suspended`` carries the
``token`` an operator decides on (``nous-sched approvals approve TOKEN SEQ
--store ...``) and a ``claim``, a secret only this client is sent. The
client then **polls** serve-mcp's second tool, ``run_result``, with
``{"token", "claim"}``:

* while a pending call is undecided, the answer is the suspension again,
  with ``waiting``: the seqs still undecided (not an error: poll again);
* once every pending call is decided, the first poll resumes the run in
  serve-mcp (by replay, :func:`nous_sched.resume`) and answers with its result,
  exactly as ``run_code`` would have (``{"logs", "result"}``, ``{"logs",
  "error"}``, or a new suspension with its own token and claim); polls within
  the next two minutes get the same result again, and at most one resume of a
  token ever runs;
* a token resumed by someone else (``nous-sched resume``), expired or unknown,
  is an error result saying so.

Who may read it: the caller must present the claim (compared in constant
time), and, where bearer tokens are configured, be the same authenticated
principal (:func:`.shares.client_keys`); without authorization a stateless
HTTP client's connection changes between polls, so the claim is the proof.
Anything else gets one answer, "no run of yours waits under this token",
whether or not the token exists. The map lives in serve-mcp's memory: a
restarted server forgets it (the operator can still resume by hand).
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from typing import Any, Callable, Hashable, Optional, Sequence

__all__ = ["Deliveries", "Delivery", "NOT_YOURS", "KEEP_RESULT"]

#: The one answer to a poll that is not the owner's (or names no run).
NOT_YOURS = "no run of yours waits under this token (run_result needs the token and claim your run_code result gave)"
#: Seconds a resumed run stays readable by repeated polls after it finished.
KEEP_RESULT = 120.0


class Delivery:
    """One suspension some client owns: what it was told, and the resumed run once started."""

    __slots__ = ("token", "claim", "principal", "suspended", "expires_at", "resumed", "finished_at")

    def __init__(self, token: str, claim: str, principal: Optional[Hashable], suspended: dict[str, Any]) -> None:
        self.token = token
        self.claim = claim
        self.principal = principal
        self.suspended = suspended
        expires = suspended.get("expires_at")
        self.expires_at = float(expires) if isinstance(expires, (int, float)) else time.time()
        self.resumed: Any = None  # the serve-mcp run that resumes it (started at most once)
        self.finished_at: Optional[float] = None  # monotonic, once the resumed run's result is read


def principal_of(keys: Sequence[Hashable]) -> Optional[Hashable]:
    """The authenticated principal among a request's client keys, if any."""
    for key in keys:
        if isinstance(key, tuple) and key and key[0] == "principal":
            return key
    return None


class Deliveries:
    """Every suspension serve-mcp handed out, by token; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_token: dict[str, Delivery] = {}

    def register(self, suspended: dict[str, Any], keys: Sequence[Hashable]) -> dict[str, Any]:
        """Own a new suspension for the client ``keys``; the ``suspended`` it is told (with its ``claim``)."""
        token = str(suspended.get("token", ""))
        told = dict(suspended, claim=secrets.token_urlsafe(24))
        with self._lock:
            self._sweep_locked()
            self._by_token[token] = Delivery(token, told["claim"], principal_of(keys), told)
        return told

    def owned(self, token: Any, claim: Any, keys: Sequence[Hashable]) -> Optional[Delivery]:
        """The suspension under ``token`` when the caller (``claim``, ``keys``) owns it, else ``None``."""
        if not isinstance(token, str) or not isinstance(claim, str):
            return None
        with self._lock:
            delivery = self._by_token.get(token)
        if delivery is None:
            hmac.compare_digest(claim.encode("utf-8", "replace"), b"-" * 32)  # same work either way
            return None
        same_claim = hmac.compare_digest(claim.encode("utf-8", "replace"), delivery.claim.encode())
        if not same_claim or delivery.principal != principal_of(keys):
            return None
        return delivery

    def resume_once(self, delivery: Delivery, start: Callable[[], Any]) -> Any:
        """The run resuming ``delivery``: ``start()``'s, started only by the first caller."""
        with self._lock:
            if delivery.resumed is None:
                delivery.resumed = start()
            return delivery.resumed

    def read(self, delivery: Delivery) -> None:
        """Its result was handed out: keep it :data:`KEEP_RESULT` seconds more for repeated polls."""
        with self._lock:
            if delivery.finished_at is None:
                delivery.finished_at = time.monotonic()

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_token)

    def _sweep_locked(self) -> None:
        now, wall = time.monotonic(), time.time()
        stale = [
            t
            for t, d in self._by_token.items()
            if (d.finished_at is not None and now - d.finished_at > KEEP_RESULT)
            or (d.resumed is None and d.expires_at <= wall)
        ]
        for token in stale:
            del self._by_token[token]

"""An approval handler that waits for a person, who answers from anywhere else.

:class:`ApprovalDesk` is an ``approval_handler``: each call it is asked about
waits, on the thread that runs that call, until :meth:`ApprovalDesk.answer`
is called for it from any other thread (a web page's Approve / Deny, say) or
the run's deadline passes (then it is rejected). :meth:`ApprovalDesk.pending`
lists what waits. The decision is the run's own: it is audited as every
handler's is (an ``approval`` event) and told to the run's event stream
(:mod:`nous_sched.live`). One desk may serve any number of runs at once: the
calls are told apart by their ``call_id``, unique per run and call.

An answer may be a :class:`~nous_sched.Grant` (a page's "approve the next N"
or "approve all matching"): the call is approved and the grant covers the
run's later calls to the tool, which then never wait at the desk. While one
call of a tool waits here, the run's other calls to that tool wait behind it
(``nous_sched.gate.grants``), so a desk shows one question per tool and run.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional, Union

from .dispatch import ApprovalRequest, current_call
from .grants import Grant

__all__ = ["ApprovalDesk"]


class ApprovalDesk:
    """An ``approval_handler`` that waits for :meth:`answer`; see the module docstring."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._waiting: dict[str, ApprovalRequest] = {}
        self._answers: dict[str, Union[bool, Grant]] = {}

    def __call__(self, request: ApprovalRequest) -> Union[bool, Grant]:
        """Wait for the answer to ``request``: ``True`` (or the :class:`~nous_sched.Grant`
        given) once approved, ``False`` once denied or when its run's deadline
        passes first (no deadline: it waits)."""
        info = current_call.get()
        deadline: Optional[float] = getattr(getattr(info, "run_ctx", None), "deadline", None)
        key = request.call_id or f"request-{id(request)}"
        with self._cond:
            self._waiting[key] = request
            self._cond.notify_all()
            try:
                while key not in self._answers:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._cond.wait(remaining)
                return self._answers[key]
            finally:
                self._waiting.pop(key, None)
                self._answers.pop(key, None)

    def pending(self) -> dict[str, ApprovalRequest]:
        """The requests waiting now, by ``call_id``."""
        with self._cond:
            return dict(self._waiting)

    def answer(self, call_id: str, approved: Any) -> bool:
        """Decide the request waiting as ``call_id`` (``approved is True`` approves; a
        :class:`~nous_sched.Grant` approves it and grants later calls; anything else
        denies): True when one was waiting, False when none is (already decided,
        or never asked)."""
        with self._cond:
            if call_id not in self._waiting or call_id in self._answers:
                return False
            self._answers[call_id] = approved if isinstance(approved, Grant) else approved is True
            self._cond.notify_all()
            return True

    def wait_for(self, call_id: str, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until ``call_id`` waits for an answer; whether it does."""
        end = time.monotonic() + timeout
        with self._cond:
            while call_id not in self._waiting:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

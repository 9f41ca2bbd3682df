"""``nous-sched run --ask``: a person at the terminal approves each call that needs it.

The question is :meth:`ApprovalRequest.question <nous_sched.ApprovalRequest.question>`
(:mod:`nous_sched.gate.approval_text`), the same text ``serve-mcp`` asks with,
written to standard error; the answer is one line, ``y`` or ``yes`` to
approve, anything else (end of input too) to refuse. Questions from calls
running side by side are asked one at a time.
"""

from __future__ import annotations

import threading
from typing import Any, TextIO

__all__ = ["TerminalApprover"]


class TerminalApprover:
    """An approval handler that asks on ``err`` and reads each answer from ``answers``."""

    def __init__(self, err: TextIO, answers: TextIO) -> None:
        self._err = err
        self._answers = answers
        self._lock = threading.Lock()  # one question at a time on the terminal

    def __call__(self, request: Any) -> bool:
        with self._lock:
            question = "\n".join("  " + line for line in request.question().split("\n"))
            self._err.write(f"\napproval needed:\n{question}\n  approve? [y/N] ")
            self._err.flush()
            answer = self._answers.readline()
        return answer.strip().lower() in ("y", "yes")

"""``nous-sched run --ask``: a person at the terminal approves each call that needs it.

The question is :meth:`ApprovalRequest.question <nous_sched.ApprovalRequest.question>`
(:mod:`nous_sched.gate.approval_text`), the same text ``serve-mcp`` asks with,
written to standard error; the answer is one line:

* ``y`` or ``yes`` approves this call;
* a number ``N`` approves this call and the run's next calls to the same
  tool, ``N`` in all (a :class:`~nous_sched.Grant`, ``calls=N``);
* ``all`` approves every call to the tool in this run (``Grant()``);
* ``all matching KEY[,KEY...]`` approves the run's calls to the tool whose
  ``KEY`` arguments equal this call's (``Grant(matching=...)``);
* anything else (``n``, end of input, a number that is no count, a key the
  call does not have) refuses.

Questions from calls running side by side are asked one at a time.
"""

from __future__ import annotations

import threading
from typing import Any, TextIO

from ..errors import ConfigError
from ..gate.grants import Grant

__all__ = ["TerminalApprover", "answer"]

PROMPT = "approve? [y/N] (or N: this and the next calls to the tool, N in all; all; all matching KEY[,KEY]) "


def answer(line: str, arguments: Any) -> Any:
    """The approval answer ``line`` says for a call with ``arguments``: True, False or a Grant."""
    said = line.strip().lower()
    if said in ("y", "yes"):
        return True
    if said.isdecimal() and said.isascii():
        try:
            return Grant(calls=int(said), by="terminal")
        except ConfigError:
            return False
    if said == "all":
        return Grant(by="terminal")
    words = line.strip().split(None, 2)
    if len(words) == 3 and [w.lower() for w in words[:2]] == ["all", "matching"]:
        keys = [k.strip() for k in words[2].split(",") if k.strip()]
        if not keys or not isinstance(arguments, dict) or any(k not in arguments for k in keys):
            return False
        try:
            return Grant(matching={k: arguments[k] for k in keys}, by="terminal")
        except ConfigError:
            return False
    return False


class TerminalApprover:
    """An approval handler that asks on ``err`` and reads each answer from ``answers``."""

    def __init__(self, err: TextIO, answers: TextIO) -> None:
        self._err = err
        self._answers = answers
        self._lock = threading.Lock()  # one question at a time on the terminal

    def __call__(self, request: Any) -> Any:
        with self._lock:
            question = "\n".join("  " + line for line in request.question().split("\n"))
            self._err.write(f"\napproval needed:\n{question}\n  {PROMPT}")
            self._err.flush()
            line = self._answers.readline()
        return answer(line, request.arguments)

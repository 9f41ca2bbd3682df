"""What a sub-call produced, as the program will see it.

An :class:`Outcome` is either ``ok`` with a JSON-shaped ``value`` or not, with a
:class:`SubCallError` of exactly two strings. The two strings are all a program
ever learns about a failure: model-authored code is one prompt-injection hop
from the transcript, so the operator's ``logging`` gets the traceback and the
program gets ``{"tool": name, "message": message}``.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import attrs

from ._slots import record
from .errors import ToolError

__all__ = ["Outcome", "SubCallError", "clamp", "quote_name", "MAX_MESSAGE", "TRUNCATION_MARK"]

MAX_MESSAGE = 2000
TRUNCATION_MARK = "… (truncated)"


def clamp(message: str) -> str:
    """``message`` cut to :data:`MAX_MESSAGE` characters plus a marker if longer."""
    if len(message) > MAX_MESSAGE:
        return message[:MAX_MESSAGE] + TRUNCATION_MARK
    return message


def quote_name(name: str) -> str:
    """A tool's name as every message to a program writes it: a JSON string, unambiguous whatever the name."""
    return json.dumps(name, ensure_ascii=False)


@attrs.frozen
class SubCallError:
    """A failed sub-call: the tool's name and a clamped message."""

    tool: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"tool": self.tool, "message": self.message}


@record
class Outcome:
    """The committed result of one sub-call.

    Exactly one of ``value`` (when ``ok``) and ``error`` is meaningful.
    ``text`` is the value's JSON text as a program receives it
    (``nous_sched.crossing.dumps`` of it) when the scheduler made it with
    the snapshot (:meth:`crossed`), else ``None`` (and whoever needs it
    encodes ``value``); it takes no part in equality.
    """

    ok: bool
    value: Any = None
    error: Optional[SubCallError] = None
    text: Optional[str] = attrs.field(default=None, init=False, eq=False, repr=False)
    #: The parts of the tool's result the run's blob store kept (``nous_sched.blobs``),
    #: each in ``value`` as its handle; like ``text``, no part of equality.
    blobs: tuple[Any, ...] = attrs.field(default=(), init=False, eq=False, repr=False)

    @classmethod
    def success(cls, value: Any) -> "Outcome":
        return cls(True, value, None)

    @classmethod
    def crossed(cls, value: Any, text: str) -> "Outcome":
        """A success whose ``value`` is a snapshot and ``text`` its ``crossing.dumps``,
        made together (``crossing.snapshot_text``): the text is not made again."""
        # Every call's answer, on the hot path: the record's own __init__ (_slots.record), then the
        # one field that is not an __init__ argument (only a snapshot's own text).
        made = cls(True, value, None)
        _set_text(made, text)
        return made

    @classmethod
    def held(cls, value: Any, text: str, blobs: tuple[Any, ...]) -> "Outcome":
        """:meth:`crossed`, with the :class:`~nous_sched.Blob` values whose handles ``value`` holds."""
        made = cls.crossed(value, text)
        _set_blobs(made, blobs)
        return made

    @classmethod
    def failure(cls, tool: str, message: str) -> "Outcome":
        return cls(False, None, SubCallError(str(tool), clamp(str(message))))

    def unwrap(self) -> Any:
        """The value, or raise :class:`ToolError` carrying the two strings."""
        if self.ok:
            return self.value
        assert self.error is not None
        raise ToolError(self.error.message, tool=self.error.tool)


# The two slots a constructor does not take, set through their own descriptors (half the
# instructions of object.__setattr__, which looks the descriptor up by name each time).
_set_text = Outcome.__dict__["text"].__set__
_set_blobs = Outcome.__dict__["blobs"].__set__

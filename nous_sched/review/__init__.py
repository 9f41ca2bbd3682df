"""Program review: a program's static summary, and the review a run asks before it starts.

:func:`summarize` (:mod:`nous_sched.review._summary`) reads a program with a
real parser and says what it will call; ``run_code(review=...)``
(:mod:`nous_sched.review._review`) asks a reviewer about the whole program,
its :class:`ReviewRequest`, before anything of the run starts, and fails closed.
"""

from __future__ import annotations

from ._review import ReviewDecision, ReviewRequest
from ._summary import ANY_TOOL, CallCount, Dynamic, ProgramSummary, ToolCallSite, summarize

__all__ = [
    "summarize",
    "ProgramSummary",
    "ToolCallSite",
    "CallCount",
    "Dynamic",
    "ANY_TOOL",
    "ReviewRequest",
    "ReviewDecision",
]

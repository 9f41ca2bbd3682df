"""The scheduler: one lane of tool calls, started in order and committed in order.

:class:`Scheduler` and :class:`Ticket` are the door (``_shell.py``: the
thread shell, its queue and driver; ``_calls.py``: the tickets and what
crosses the queue; ``_running.py``: one call run on a tool thread). Inside: ``lane.py``, the pure
ordering state machine (no threads, clocks or executor); the process's warm
driver threads (``_driver_threads.py``) and tool threads
(``_tool_threads.py``), one set per process, afresh after a fork
(``_per_process.py``).
"""

from ._calls import ABANDONED, AWAIT_TIMEOUT, DID_NOT_COMPLETE, FAILED, GONE, NO_ANSWER, Ticket
from ._shell import DEFAULT_MAX_PARALLEL, DEFAULT_TIMEOUT, Scheduler

__all__ = [
    "ABANDONED",
    "AWAIT_TIMEOUT",
    "DEFAULT_MAX_PARALLEL",
    "DEFAULT_TIMEOUT",
    "DID_NOT_COMPLETE",
    "FAILED",
    "GONE",
    "NO_ANSWER",
    "Scheduler",
    "Ticket",
]

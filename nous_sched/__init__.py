"""nous_sched: Code Mode for synchronous Python.

A model writes one JavaScript program that calls tools; nous_sched runs it in a
QuickJS sandbox and routes every tool call through one :class:`Scheduler`
that decides how the calls interleave and commits them in submission order.
"""

from .dispatch import ApprovalRequest, CallInfo, RunContext, current_call, direct_dispatch
from .errors import ConfigError, RunCodeError, SnapshotError, ToolError
from .events import ContextUpdate, Event, LogEvent, SessionLog, ToolCallEvent
from .outcome import Outcome, SubCallError
from .scheduler import CallRecord, LaneState, Scheduler, Ticket
from .snapshot import snapshot
from .tool import EXCLUSIVE, PARALLEL, Tool, concurrency_mode

__version__ = "0.1.0"

__all__ = [
    "ApprovalRequest",
    "CallInfo",
    "CallRecord",
    "ConfigError",
    "ContextUpdate",
    "EXCLUSIVE",
    "Event",
    "LaneState",
    "LogEvent",
    "Outcome",
    "PARALLEL",
    "RunCodeError",
    "RunContext",
    "Scheduler",
    "SessionLog",
    "SnapshotError",
    "SubCallError",
    "Ticket",
    "Tool",
    "ToolCallEvent",
    "ToolError",
    "concurrency_mode",
    "current_call",
    "direct_dispatch",
    "snapshot",
]

"""nous_sched: Code Mode for synchronous Python.

A model writes one JavaScript program that calls tools; nous_sched runs it in a
QuickJS sandbox and routes every tool call through one :class:`Scheduler`
that decides how the calls interleave and commits them in submission order.
"""

from ._version import __version__ as __version__
from .adapters import anthropic_tool, call_tool, openai_tool
from .agent import MODES, WithContextUpdate, run_code_tool, visible_tools
from .dispatch import ApprovalRequest, CallInfo, RunContext, current_call, direct_dispatch
from .errors import ConfigError, RunCodeError, SnapshotError, ToolError
from .events import ContextUpdate, Event, LogEvent, SessionLog, ToolCallEvent, ToolRefusedEvent
from .function_tool import function_tool
from .integrations import from_langchain, from_llamaindex, from_openai_agents, from_pydantic_ai
from .outcome import Outcome, SubCallError
from .policy import PermissionPolicy
from .records import CallRecord, LaneState
from .result import ERROR_KINDS, RunError, RunResult
from .run_code import run_code
from .runtime import CodeRuntime, Limits, RuntimeOutcome
from .runtime.pool import WorkerPool
from .runtime.quickjs import QuickJSRuntime
from .scheduler import Scheduler, Ticket
from .snapshot import snapshot
from .throttle import Throttle
from .tool import EXCLUSIVE, PARALLEL, Tool, concurrency_mode

__all__ = [
    "anthropic_tool",
    "ApprovalRequest",
    "call_tool",
    "CallInfo",
    "CallRecord",
    "CodeRuntime",
    "concurrency_mode",
    "ConfigError",
    "ContextUpdate",
    "current_call",
    "direct_dispatch",
    "ERROR_KINDS",
    "Event",
    "EXCLUSIVE",
    "from_langchain",
    "from_llamaindex",
    "from_openai_agents",
    "from_pydantic_ai",
    "function_tool",
    "LaneState",
    "Limits",
    "LogEvent",
    "MODES",
    "openai_tool",
    "Outcome",
    "PARALLEL",
    "PermissionPolicy",
    "QuickJSRuntime",
    "run_code",
    "run_code_tool",
    "RunCodeError",
    "RunContext",
    "RunError",
    "RunResult",
    "RuntimeOutcome",
    "Scheduler",
    "SessionLog",
    "snapshot",
    "SnapshotError",
    "SubCallError",
    "Throttle",
    "Ticket",
    "Tool",
    "ToolCallEvent",
    "ToolRefusedEvent",
    "ToolError",
    "visible_tools",
    "WithContextUpdate",
    "WorkerPool",
]

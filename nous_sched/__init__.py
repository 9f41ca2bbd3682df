"""nous_sched: Code Mode for synchronous Python.

A model writes one JavaScript program that calls tools; nous_sched runs it in a
QuickJS sandbox and routes every tool call through one :class:`Scheduler`
that decides how the calls interleave and commits them in submission order.
"""

from . import _tracing
from ._run.entry import run_code
from ._run.options import RunOptions
from ._version import __version__ as __version__
from .agent import MODES, WithContextUpdate, run_code_tool, visible_tools
from .agent.adapters import anthropic_tool, call_tool, openai_tool
from .agent.aio import acall_tool, arun_code
from .blobs import Blob, BlobStore
from .crossing import snapshot
from .durable import DEFER, ApprovalDecision, Suspension, resume
from .durable.approval_store import ApprovalStore, RedisApprovalStore, SqliteApprovalStore, TokenError, UnsettledError
from .durable.postgres_store import PostgresApprovalStore
from .errors import ConfigError, RunCodeError, SnapshotError, ToolError
from .events import (
    ApprovalEvent,
    ContextUpdate,
    Event,
    LogEvent,
    SessionLog,
    ToolCallEvent,
    ToolOutcomeEvent,
    ToolRefusedEvent,
)
from .gate.approval_desk import ApprovalDesk
from .gate.approval_seam import ApprovalStoreSeam
from .gate.dispatch import ApprovalRequest, CallInfo, RunContext, current_call, direct_dispatch
from .gate.grants import Grant
from .gate.policy import PermissionPolicy
from .integrations import from_langchain, from_llamaindex, from_openai_agents, from_pydantic_ai
from .live import Run, RunEvent, resume_run, start_run
from .outcome import Outcome, SubCallError
from .result import ERROR_KINDS, RunError, RunResult
from .result.records import CallRecord, LaneState
from .result.usage import CallUsage, Usage
from .review import CallCount, Dynamic, ProgramSummary, ReviewDecision, ReviewRequest, ToolCallSite, summarize
from .runtime import CodeRuntime, Limits, RuntimeOutcome
from .runtime.pool import WorkerPool
from .runtime.quickjs import QuickJSRuntime
from .scheduler import Scheduler, Ticket
from .state import (
    MemoryStateStore,
    PostgresStateStore,
    RedisStateStore,
    SqliteStateStore,
    State,
    StateStoreError,
    StateStoreSeam,
)
from .throttle import Throttle
from .tooling import (
    EXCLUSIVE,
    PARALLEL,
    Bind,  # issue 40: bound arguments
    Tool,
    concurrency_mode,
    function_tool,
)

#: The decorator, under the name other frameworks use: ``@nous_sched.tool`` is
#: :func:`function_tool`. (No module of that name: ``Tool`` is ``nous_sched.Tool``,
#: or ``nous_sched.tooling.Tool``.)
tool = function_tool


def _otel_tracing() -> _tracing.Tracing:
    # Here, above both: nous_sched.otel imports run_code, so run_code's machinery cannot import it.
    from .otel import AUTO

    return AUTO


_tracing.install(_otel_tracing)

__all__ = [
    "acall_tool",
    "anthropic_tool",
    "ApprovalEvent",
    "ApprovalDecision",
    "ApprovalRequest",
    "ApprovalDesk",
    "ApprovalStore",
    "ApprovalStoreSeam",
    "call_tool",
    "CallInfo",
    "CallUsage",
    "CallRecord",
    "CodeRuntime",
    "DEFER",
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
    "RedisApprovalStore",
    "resume",
    "run_code",
    "arun_code",
    "run_code_tool",
    "Run",
    "RunCodeError",
    "RunContext",
    "RunError",
    "RunOptions",
    "RunEvent",
    "RunResult",
    "RuntimeOutcome",
    "Scheduler",
    "SessionLog",
    "snapshot",
    "start_run",
    "resume_run",
    "SqliteApprovalStore",
    "Suspension",
    "SnapshotError",
    "SubCallError",
    "Throttle",
    "Ticket",
    "TokenError",
    "UnsettledError",
    "Tool",
    "tool",
    "ToolCallEvent",
    "ToolOutcomeEvent",
    "ToolRefusedEvent",
    "ToolError",
    "Usage",
    "visible_tools",
    "WithContextUpdate",
    "WorkerPool",
    "Grant",
    "Blob",
    "BlobStore",
    # state across runs (issue 40)
    "State",
    "StateStoreSeam",
    "StateStoreError",
    "MemoryStateStore",
    "SqliteStateStore",
    "RedisStateStore",
    # issue 42: approvals and state in Postgres
    "PostgresApprovalStore",
    "PostgresStateStore",
    # bound arguments (issue 40)
    "Bind",
    # program review (issue 41)
    "summarize",
    "ProgramSummary",
    "ToolCallSite",
    "CallCount",
    "Dynamic",
    "ReviewRequest",
    "ReviewDecision",
]

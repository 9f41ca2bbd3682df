"""The entry of ``run_code``: a plain run, or a durable one when there is an approval store.

:func:`run_code` makes the run's :class:`~nous_sched.RunOptions` (every
option checked, once) and hands them whole to the machinery
(:mod:`nous_sched._run.runner`: prepare, then execute) or, with an
``approval_store``, to :func:`nous_sched.durable.run_durable`, which drives
the same machinery with its replaying runtime. Only this module imports
``nous_sched.durable`` of the two: the machinery never calls back up here.

See :mod:`nous_sched._run.runner` for what a run promises (results are data,
every sub-call passes the gate, approval per sub-call).
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable, Iterable, Optional

from ..durable import run_durable
from ..durable.approval_store import ApprovalStore
from ..events import SessionLog
from ..gate.dispatch import ApprovalRequest, Dispatch
from ..gate.policy import PermissionPolicy
from ..limits import Limits
from ..result import RunResult
from ..result.records import CallRecord
from ..runtime import Cancel, CodeRuntime
from ..state import State
from ..tooling import Tool
from .options import FIELDS, GIVEN_NOT, RunOptions, build
from .runner import execute, prepare

__all__ = ["run_code"]


def run_code(
    code: Any,
    tools: Iterable[Tool] = (),
    *,
    options: Optional[RunOptions] = None,
    description: Optional[str] = GIVEN_NOT,
    policy: Optional[PermissionPolicy] = GIVEN_NOT,
    approval_handler: Optional[Callable[[ApprovalRequest], Any]] = GIVEN_NOT,
    deps: Any = GIVEN_NOT,
    runtime: Optional[CodeRuntime] = GIVEN_NOT,
    timeout: float = GIVEN_NOT,
    limits: Optional[Limits] = GIVEN_NOT,
    max_parallel: int = GIVEN_NOT,
    executor: Optional[concurrent.futures.Executor] = GIVEN_NOT,
    call_id: Optional[str] = GIVEN_NOT,
    dispatch: Dispatch = GIVEN_NOT,
    session_log: Optional[SessionLog] = GIVEN_NOT,
    observer: Optional[Callable[[CallRecord, str], Any]] = GIVEN_NOT,
    cancel: Optional[Cancel] = GIVEN_NOT,
    output_budget: Optional[int] = GIVEN_NOT,
    approval_store: Optional[ApprovalStore] = GIVEN_NOT,
    state: Optional[State] = GIVEN_NOT,
) -> RunResult:
    """Run ``code`` with ``tools`` bound as ``tools[name](args)`` and return what it produced.

    ``timeout`` is the run's wall-clock deadline (``limits`` overrides it and
    sets memory, stack and output limits). ``runtime`` runs the program: by
    default the process's :class:`~nous_sched.WorkerPool` (a worker process
    killed at the deadline); ``QuickJSRuntime()`` runs it in this process.
    Once the deadline has passed the run is a ``timeout`` that says what the
    program waited for, unless it had already returned: the program is
    handed no answer after it, so a call that gave up *because* of the
    deadline (waiting for a throttle's place or an approval) is never an
    error the program could catch (``nous_sched.runtime.engine.drive``).

    ``cancel``: a :class:`threading.Event` that any thread may set to end the
    run early; it then returns a ``cancelled`` error with the logs so far. The
    worker runtime ends it within about 50 ms whatever the program is doing
    (its worker is killed); the in-process runtime at the next step.
    ``KeyboardInterrupt`` in the calling thread ends the run the same way, then
    propagates. Without ``cancel``, a run started under the asyncio door
    (:func:`~nous_sched.arun_code`, :func:`~nous_sched.acall_tool`) is
    cancelled with the awaiting task. ``max_parallel``, ``executor``,
    ``dispatch``, ``session_log`` and ``observer`` configure the run's
    :class:`~nous_sched.Scheduler`. ``call_id`` prefixes audit event ids
    (``"<call_id>:code:<n>"``; a random ``"run_code-…"`` by default).

    Safe to call from many threads at once: runs share nothing unless you
    pass them the same ``executor`` or ``session_log``. Without an
    ``executor``, tools run on the process's shared tool threads
    (``nous-sched-tool-<k>``: warm, so a run starts no thread for its calls;
    bounded per process, idle ones retire), each run at most ``max_parallel``
    calls at once.

    ``description`` is the sentence the model wrote saying what the program
    does: it is logged, and every :class:`~nous_sched.ApprovalRequest`
    carries it. It is required: a missing (``None``) or blank one is refused
    (a :class:`~nous_sched.RunCodeError`, which is a
    :class:`~nous_sched.ConfigError`).

    ``approval_store`` (a :class:`~nous_sched.SqliteApprovalStore` or
    :class:`~nous_sched.RedisApprovalStore`) makes the run durable: a call
    that needs approval with no handler to answer (or one that returns
    :data:`~nous_sched.DEFER`) suspends the run (``RunResult.suspended``), and
    :func:`~nous_sched.resume` continues it later, anywhere
    (``nous_sched.durable``).

    ``state`` (a :class:`~nous_sched.State`): one scope's state across runs,
    which the program reads and writes as ``await state.get(key)``,
    ``state.set(key, value)``, ``state.delete(key)``, ``state.keys()``
    (``nous_sched.state``); each operation is audited (``state`` events).

    ``output_budget`` (bytes of UTF-8, ``None`` by default: no budget): the
    model-facing answer (:meth:`~nous_sched.RunResult.for_model`) is cut to it
    structurally, saying in place what it left out (``nous_sched.result.budget``;
    a suspended run's answer too, its token always kept);
    ``result.usage`` says what the model got and what was cut.
    :func:`~nous_sched.run_code_tool` sets it to 20,000 by default.

    ``options``: all of these in one :class:`~nous_sched.RunOptions` (checked
    when it was made), instead of keywords; an option given both ways is a
    :class:`~nous_sched.ConfigError` naming it. The defaults are
    :class:`~nous_sched.RunOptions`'s (``timeout`` 30 s, ``max_parallel``
    10, ``dispatch`` :func:`~nous_sched.direct_dispatch`, the rest ``None``).

    Behaves as ``start_run(code, tools, **options).result()``
    (:func:`~nous_sched.start_run`), on the calling thread and with no event stream.

    :raises RunCodeError: nothing ran (``code`` not a string or over
        ``Limits.max_code_bytes``, a missing or blank ``description``, no runtime, or a tool running on ``executor`` called
        this with that same ``executor`` while every one of its threads is
        busy: the run's calls could only wait for a thread until the deadline).
    :raises ConfigError: a bad option, named in the message, before anything starts.
    """
    given = locals()  # (first: only the parameters) each by name, to tell the given ones from the sentinel
    keywords = {name: given[name] for name in FIELDS if given[name] is not GIVEN_NOT}
    if options is not None:
        keywords["options"] = options
    return run(code, tools, build("run_code", keywords))


def run(code: Any, tools: Iterable[Tool], options: RunOptions) -> RunResult:
    """:func:`run_code` with its options made: plain, or durable with ``options.approval_store``."""
    if options.approval_store is not None:
        return run_durable(code, tools, options, options.approval_store)
    return execute(prepare(code, tools, options))

"""Programs on a Celery fleet: ``tasks = register(app, tools="package.module")`` (the ``celery`` extra).

:func:`register` adds two tasks to the caller's Celery app and returns them
as :class:`Tasks`:

* ``tasks.run``: runs a program against the tool set named by ``tools``,
  resolved on the worker by import path (the loader of the command's
  ``--tools``, :mod:`nous_sched.tooling.loading`: the module's ``TOOLS`` or
  ``tools()``); nothing callable crosses the broker.
  ``tasks.run.delay(code=..., description=...).get()`` is the run's
  :func:`result document <result_document>`. Its keyword arguments are
  ``code`` and the options of :func:`~nous_sched.run_code` that are data
  (:data:`DATA_OPTIONS`: ``description``, ``timeout``, ``limits`` as a JSON
  object of :class:`~nous_sched.Limits` fields, ``max_parallel``,
  ``call_id``, ``output_budget``, ``runtime`` as ``"worker"`` or
  ``"in-process"``); the worker makes the run's
  :class:`~nous_sched.RunOptions` from them. Any other key is a
  :class:`~nous_sched.ConfigError` naming it, raised where the task is sent
  (and again on a worker, for a message that did not come through
  :class:`Tasks`).
* ``tasks.resume``: resumes a suspended run by its token
  (``tasks.resume.delay(token=..., decisions={"0": True})``), on any worker:
  the approval store is the one the tool set module names in
  ``APPROVAL_STORE`` (a :class:`~nous_sched.RedisApprovalStore`, say, that
  every worker reaches). The run's ``approval_store`` is that store too, so a
  program that asks for approval suspends (its result's ``status`` is
  ``"suspended"`` and ``suspended.token`` resumes it).

Throttles on the tools (``Throttle(..., redis_url=...)``) and the approval
store are the tool set module's own objects, made on each worker as it
imports the module, so the whole fleet shares them through Redis. Each
Celery prefork child makes its own worker pool on its first run (as every
forked process does: ``nous_sched.scheduler._per_process``).

**Watching and cancelling.** ``tasks.start(code=..., **options)`` sends a
run and returns a :class:`RemoteRun` at once: ``events()`` yields the run's
:class:`~nous_sched.RunEvent` values as :func:`~nous_sched.start_run`'s do
(same kinds, same order, ``gap`` events counting what a slow watcher
missed), read from a Redis stream on the broker's Redis that the worker
writes, bounded to about ``events_maxlen`` entries and kept for
``events_ttl`` seconds; ``result()`` waits for the result document;
``cancel()`` ends the run. ``tasks.cancel(task_id)`` does the same for a
task sent any way: the worker's run watches a cancel key in Redis (one
blocking read a second) and, once it is set, ends with a ``cancelled``
error, its logs and audit kept, in the result as for any other run; a
task not yet started is revoked, and never runs (a worker looks for the
cancel key before it starts a run). Celery's own
``revoke(task_id, terminate=True, signal="SIGUSR1")`` and a task's
``soft_time_limit`` cancel the run the same way (the signal reaches the
prefork child running it); Celery marks a task it revoked so, and its
events still end with the run's logs.

**Failures.** A run's failure is data (``status`` ``"error"``, with the
error's kind and the logs). Options that are not data, unknown or bad, and
a tool set that cannot be loaded are :class:`~nous_sched.ConfigError`
values (the task fails with one). A Celery pool child killed mid-run loses
that run only: Celery marks the task failed (``WorkerLostError``), and the
run's worker processes die with the child (the pool's fork server exits
when its parent does, and its workers with it). A worker killed whole takes
its children with it; Celery records nothing, and :meth:`RemoteRun.result`
says the worker was lost once it stops answering pings. A broker that does not
answer is a :class:`BrokerError` naming it: each request of this module waits
at most :data:`BROKER_TIMEOUT` seconds to connect and for its reply (a read
of events, which waits in Redis by design, a few seconds more).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, Optional

import attrs

from .. import _validators as v
from .._redis_client import connect
from .._run.options import FIELDS, RunOptions, build
from .._text import machine_json, machine_value
from ..errors import ConfigError
from ..gate.approval_seam import ApprovalStoreSeam
from ..limits import Limits
from ..live import Run, RunEvent, resume_run, start_run
from ..result import RunResult
from ..tooling import Tool
from ..tooling.loading import import_tool_module, tools_of
from ._common import require

__all__ = [
    "register",
    "Tasks",
    "RemoteRun",
    "BrokerError",
    "DATA_OPTIONS",
    "options_from_data",
    "result_document",
]

#: The options of :func:`~nous_sched.run_code` a Celery task takes: the ones that are data.
DATA_OPTIONS: tuple[str, ...] = (
    "description",
    "timeout",
    "limits",
    "max_parallel",
    "call_id",
    "output_budget",
    "runtime",
)
_RUNTIMES = ("worker", "in-process")
log = logging.getLogger("nous_sched")
#: Seconds a broker (Redis) has to connect and to answer each request, for this module's own requests.
BROKER_TIMEOUT = 0.5
#: Seconds the worker's cancel watch blocks in Redis at a time (the delay a cancel can take, at most).
CANCEL_WAIT = 1.0


class BrokerError(ConnectionError):
    """The broker's Redis did not answer: the message names it (its URL, without a password)."""


def _shown_url(url: str) -> str:
    """``url`` without its password (an error message must not carry it)."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://…@{rest.rsplit('@', 1)[1]}"


def _broker_error(url: str, exc: BaseException) -> BrokerError:
    return BrokerError(f"the Celery broker's Redis at {_shown_url(url)} did not answer: {exc} (is it running?)")


def options_from_data(data: Any, door: str = "celery run") -> RunOptions:
    """The :class:`~nous_sched.RunOptions` of ``data``, a JSON object of :data:`DATA_OPTIONS`.

    ``limits`` is a JSON object of :class:`~nous_sched.Limits` fields;
    ``runtime`` is ``"worker"`` (the default pool) or ``"in-process"``.

    :raises ConfigError: naming ``door`` and the key: a key that is not one
        of :data:`DATA_OPTIONS` (an option of ``run_code`` that is not data
        is said to be one), or a bad value.
    """
    if not isinstance(data, Mapping):
        v.fail(door, "options", data, "a JSON object of run_code's data options")
    given = dict(data)
    for name in given:
        if name in DATA_OPTIONS:
            continue
        if name in FIELDS:
            raise ConfigError(
                f"{door}: `{name}` is not data and cannot cross the broker; a Celery run takes "
                f"{', '.join(DATA_OPTIONS)} (tools, throttles and the approval store come from the tool set module)"
            )
        v.unknown(door, str(name), DATA_OPTIONS, "a Celery run")
    limits = given.get("limits")
    if limits is not None:
        if not isinstance(limits, Mapping):
            v.fail(door, "limits", limits, "a JSON object of Limits fields")
        accepted = tuple(f.name for f in attrs.fields(Limits))
        for name in limits:
            if name not in accepted:
                v.unknown(door, f"limits.{name}", [f"limits.{a}" for a in accepted], "a Celery run")
        given["limits"] = Limits(**limits)
    if "runtime" in given:
        runtime = given["runtime"]
        if runtime not in _RUNTIMES:
            v.fail(door, "runtime", runtime, '"worker" or "in-process"')
        if runtime == "worker":
            given["runtime"] = None
        else:
            from ..runtime.quickjs import QuickJSRuntime

            given["runtime"] = QuickJSRuntime()
    return build(door, given)


def _decisions(data: Any) -> dict[int, Any]:
    """``{seq: bool or ApprovalDecision}`` from a JSON object (its keys strings of numbers)."""
    from ..durable import ApprovalDecision

    if not isinstance(data, Mapping):
        v.fail("celery resume", "decisions", data, 'a JSON object {"<seq>": true | false | {"approved", "reason"}}')
    out: dict[int, Any] = {}
    for key, value in data.items():
        try:
            seq = int(key)
        except (TypeError, ValueError):
            v.fail("celery resume", "decisions", key, "keys that are call numbers (seq)")
        if isinstance(value, Mapping):
            approved: Any = value.get("approved")  # checked by ApprovalDecision
            out[seq] = ApprovalDecision(approved=approved, reason=value.get("reason", ""))
        else:
            out[seq] = value
    return out


def result_document(result: RunResult, **about: Any) -> dict[str, Any]:
    """What a task returns: ``status`` (``"ok"``, ``"error"`` or ``"suspended"``),
    ``answer`` (what the model reads, :meth:`~nous_sched.RunResult.for_model`),
    ``logs``, ``error`` (``kind``, ``message``) or ``None``, ``suspended`` (its
    token and pending calls) or ``None``, the audit (``events``, ``refused``,
    ``durable``), ``trail``, ``elapsed``, and ``about`` (the worker's name and pid).

    Strict JSON values: each lone surrogate is U+FFFD, a non-finite number ``null``.
    """
    status = "suspended" if result.suspended is not None else "ok" if result.error is None else "error"
    doc = {
        "status": status,
        "answer": result.for_model(),
        "logs": list(result.logs),
        "error": None if result.error is None else result.error.as_dict(),
        "suspended": None if result.suspended is None else result.suspended.as_dict(),
        "events": [{"type": e.type, **e.as_event().data} for e in result.events],
        "refused": [dict(r.as_event().data) for r in result.refused],
        "durable": [{"type": e.type, **e.data} for e in result.audit],
        "trail": [attrs.asdict(r) for r in result.trail],
        "elapsed": result.elapsed,
        **about,
    }
    loaded: dict[str, Any] = json.loads(machine_json(doc, default=str))
    return loaded


# -- the worker's side ---------------------------------------------------------------------------


@attrs.frozen
class _ToolSet:
    tools: list[Tool]
    store: Optional[ApprovalStoreSeam]


_loaded: dict[str, _ToolSet] = {}
_loading = threading.Lock()


def _tool_set(spec: str) -> _ToolSet:
    """The tool set ``spec`` names, loaded once per process."""
    with _loading:
        found = _loaded.get(spec)
        if found is None:
            module = import_tool_module(spec, "celery tools")
            store = getattr(module, "APPROVAL_STORE", None)
            if store is not None and not isinstance(store, ApprovalStoreSeam):
                v.fail(f"celery tools {spec}", "APPROVAL_STORE", store, "a nous_sched approval store, or None")
            found = _loaded[spec] = _ToolSet(tools_of(module, spec, "celery tools"), store)
        return found


class _Publisher:
    """A run's events written to its Redis stream, one pipeline per batch, bounded in length."""

    def __init__(self, client: Any, key: str, maxlen: int, ttl: int) -> None:
        self.client, self.key, self.maxlen, self.ttl = client, key, maxlen, ttl
        self.problem: Optional[BaseException] = None

    def pump(self, run: Run) -> None:
        n = 0
        broken = False
        for batch in run.event_batches():
            if broken:
                continue  # keep consuming (never slow the run), write nothing more
            try:
                pipe = self.client.pipeline(transaction=False)
                for event in batch:
                    pipe.xadd(self.key, {"n": n, "e": event.to_json()}, maxlen=self.maxlen, approximate=True)
                    n += 1
                pipe.expire(self.key, self.ttl)
                pipe.execute()
            except Exception as exc:  # the broker went away: the run goes on, unwatched
                self.problem, broken = exc, True
                log.warning("the events of run %s stopped reaching Redis: %s", self.key, exc)


def _watch_cancel(client: Any, key: str, run: Run) -> None:
    while not run.done():
        try:
            if client.blpop([key], timeout=CANCEL_WAIT) is not None:
                run.cancel()
                return
        except Exception:  # the broker went away: the run goes on; try again later
            time.sleep(CANCEL_WAIT)


def _serve(run: Run, cancel_client: Any, cancel_key: str, publisher: Optional[_Publisher]) -> RunResult:
    """Wait for ``run`` on this (the task's) thread, watching its cancel key and pumping its events.

    An exception raised into this thread while it waits (Celery's soft time
    limit, a revoke's SIGUSR1) cancels the run; its result is still returned.
    """
    watch = (cancel_client, cancel_key, run)
    threads = [threading.Thread(target=_watch_cancel, args=watch, daemon=True, name="nous-sched-celery-cancel")]
    if publisher is not None:
        threads.append(
            threading.Thread(target=publisher.pump, args=(run,), daemon=True, name="nous-sched-celery-events")
        )
    for thread in threads:
        thread.start()
    while True:
        try:
            result = run.result()
            break
        except BaseException:
            if run.done():
                raise  # the run's own problem
            run.cancel()  # interrupted while waiting: end the run, keep its result
    if publisher is not None:
        threads[1].join(10.0)
    return result


# -- the caller's side ---------------------------------------------------------------------------


class RemoteRun:
    """A run sent to the fleet by :meth:`Tasks.start`: watch it, wait for it, or cancel it."""

    def __init__(self, tasks: Tasks, async_result: Any) -> None:
        #: Celery's ``AsyncResult`` of the task.
        self.async_result = async_result
        #: The task's id (its events' and cancel key's name).
        self.task_id: str = async_result.id
        self._tasks = tasks

    def events(self, timeout: Optional[float] = None, poll: float = 1.0) -> Iterator[RunEvent]:
        """The run's events from its first, until ``end``; a ``gap`` event
        (``data``: ``missed``) before events that follow some the stream no
        longer holds. Ends without ``end`` when the task ended without one
        (its worker died: :meth:`result` says so). Each read waits in Redis
        up to ``poll`` seconds.

        :raises TimeoutError: ``timeout`` seconds passed with no event (a
            task no worker has taken, or one whose worker vanished whole).
        :raises BrokerError: the broker's Redis does not answer.
        """
        client = self._tasks.redis(blocking=True)
        key = self._tasks.events_key(self.task_id)
        last, expected = "0-0", 0
        idle_done = False
        heard = time.monotonic()
        while True:
            try:
                reply = client.xread({key: last}, count=1000, block=max(1, int(poll * 1000)))
            except Exception as exc:
                raise _broker_error(self._tasks.redis_url, exc) from None
            entries = reply[0][1] if reply else []
            if not entries:
                if idle_done:
                    return
                if timeout is not None and time.monotonic() - heard > timeout:
                    raise TimeoutError(f"no event of task {self.task_id} within {timeout}s")
                idle_done = self.async_result.ready()  # one more read after the task ended
                continue
            heard = time.monotonic()
            for entry_id, fields in entries:
                last = entry_id
                doc = json.loads(fields[b"e"])
                n = int(fields[b"n"])
                if n > expected:
                    yield RunEvent("gap", None, doc["at"], {"missed": n - expected})
                expected = n + 1
                event = RunEvent(doc["kind"], doc["seq"], doc["at"], doc["data"])
                yield event
                if event.kind == "end":
                    return

    def result(self, timeout: Optional[float] = None, liveness: float = 10.0) -> dict[str, Any]:
        """The task's result document (:func:`result_document`); raises what the task raised.

        While the task is started on a worker (Celery's ``task_track_started``
        says which), that worker is pinged every ``liveness / 4`` seconds; one
        that answers none for ``liveness`` seconds (killed whole: Celery can
        record nothing then) is a ``celery.exceptions.WorkerLostError`` naming it.

        :raises TimeoutError: ``timeout`` seconds passed first.
        """
        from celery.exceptions import TimeoutError as CeleryTimeout
        from celery.exceptions import WorkerLostError

        deadline = None if timeout is None else time.monotonic() + timeout
        every = max(1.0, liveness / 4)
        answered = time.monotonic()
        while True:
            wait = every if deadline is None else max(0.0, min(every, deadline - time.monotonic()))
            try:
                document: dict[str, Any] = self.async_result.get(timeout=wait)
                return document
            except CeleryTimeout:
                pass
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise TimeoutError(f"task {self.task_id} did not end within {timeout}s")
            info = self.async_result.info if self.async_result.state == "STARTED" else None
            host = info.get("hostname") if isinstance(info, dict) else None
            if not host or self._tasks.app.control.ping(destination=[host], timeout=0.5):
                answered = now
            elif now - answered >= liveness:
                raise WorkerLostError(f"worker {host} stopped answering while it ran task {self.task_id}")

    def cancel(self) -> None:
        """End the run: :meth:`Tasks.cancel` of this task."""
        self._tasks.cancel(self.task_id)


class Tasks:
    """The tasks :func:`register` added: :attr:`run`, :attr:`resume`, and the caller's helpers."""

    def __init__(self, app: Any, run: Any, resume: Any, *, redis_url: str, prefix: str) -> None:
        self.app = app
        #: The Celery task running a program: ``run.delay(code=..., description=...)``.
        self.run = run
        #: The Celery task resuming a suspended run: ``resume.delay(token=..., decisions={...})``.
        self.resume = resume
        #: The Redis holding events and cancel keys (the broker's, by default).
        self.redis_url = redis_url
        self.prefix = prefix
        self._clients: dict[tuple[int, bool, str], Any] = {}

    def redis(self, blocking: bool = False, url: Optional[str] = None) -> Any:
        """This process's client of :attr:`redis_url` (or ``url``): each request answered within
        :data:`BROKER_TIMEOUT` seconds, or, ``blocking``, within a few seconds more (for reads that
        wait in Redis)."""
        key = (os.getpid(), blocking, url or self.redis_url)
        client = self._clients.get(key)
        if client is None:
            client = connect(url or self.redis_url, BROKER_TIMEOUT)
            if blocking:  # its reads block in Redis for up to a few seconds, by design
                client.connection_pool.connection_kwargs["socket_timeout"] = BROKER_TIMEOUT + 5.0
            self._clients[key] = client
        return client

    def events_key(self, task_id: str) -> str:
        """The Redis stream of task ``task_id``'s events."""
        return f"{self.prefix}:events:{task_id}"

    def cancel_key(self, task_id: str) -> str:
        """The Redis list whose first element cancels task ``task_id``'s run."""
        return f"{self.prefix}:cancel:{task_id}"

    def start(self, code: Any, *, routing: Optional[Mapping[str, Any]] = None, **options: Any) -> RemoteRun:
        """Send a run of ``code`` with its events published, and return its :class:`RemoteRun` at once.

        ``options`` are :data:`DATA_OPTIONS`; ``routing`` is Celery's
        ``apply_async`` options (``queue``, ``countdown``...).

        :raises ConfigError: an option that is not data, unknown or bad.
        :raises BrokerError: the broker does not answer.
        """
        sent = self.run.apply_async(kwargs={"code": code, "events": True, **options}, **dict(routing or {}))
        return RemoteRun(self, sent)

    def start_resume(
        self, token: str, decisions: Mapping[Any, Any], *, routing: Optional[Mapping[str, Any]] = None, **options: Any
    ) -> RemoteRun:
        """:meth:`start` for a resume: the resumed run's :class:`RemoteRun`."""
        kwargs = {"token": token, "decisions": {str(k): d for k, d in decisions.items()}, "events": True, **options}
        return RemoteRun(self, self.resume.apply_async(kwargs=kwargs, **dict(routing or {})))

    def cancel(self, task_id: str) -> None:
        """End task ``task_id``'s run (a ``cancelled`` error, logs kept), or, not started yet, revoke it.

        :raises BrokerError: the broker does not answer.
        """
        key = self.cancel_key(task_id)
        try:
            pipe = self.redis().pipeline(transaction=False)
            pipe.rpush(key, b"1")
            pipe.expire(key, 3600)
            pipe.execute()
        except Exception as exc:
            raise _broker_error(self.redis_url, exc) from None
        self.app.control.revoke(task_id)


def _celery() -> Any:
    return require("celery", "celery", "nous_sched.integrations.celery")


_RESERVED = ("code", "events", "token", "decisions")


def _checked_base(celery: Any, app: Any, holder: list[Tasks]) -> Any:
    class _Checked(celery.Task):  # type: ignore[misc]
        """Checks a run's options where it is sent, and makes its values strict JSON."""

        def apply_async(self, args: Any = None, kwargs: Any = None, **routing: Any) -> Any:
            if args:
                raise ConfigError(f"{self.name}: pass keyword arguments only (code=..., description=...)")
            given = dict(kwargs or {})
            if "code" in given and not isinstance(given["code"], str):
                v.fail(self.name, "code", given["code"], "a str (the program's text)")
            options_from_data({k: x for k, x in given.items() if k not in _RESERVED}, self.name)
            # Celery's own sending retries a Redis that is down for about 20 s (its result
            # backend's retry policy): one PING first says so at once.
            broker = str(app.conf.broker_url or "")
            if broker.startswith(_REDIS_SCHEMES):
                try:
                    holder[0].redis(url=broker).ping()
                except Exception as exc:
                    raise _broker_error(broker, exc) from None
            try:
                return super().apply_async(kwargs=machine_value(given), **routing)
            except Exception as exc:
                if "kombu" in type(exc).__module__ or isinstance(exc, OSError):
                    raise _broker_error(broker, exc) from None
                raise

    return _Checked


@attrs.frozen
class _Served:
    """What a registration's tasks run with on a worker."""

    tools: str
    prefix: str
    maxlen: int
    ttl: int
    holder: list[Tasks]

    def run(self, task: Any, code: str, events: bool, data: Any) -> dict[str, Any]:
        options = options_from_data(data, f"{self.prefix}.run")
        found = _tool_set(self.tools)
        self.unless_cancelled(task)
        if found.store is not None:
            options = options.evolve(approval_store=found.store)
        return self.finish(task, start_run(code, found.tools, options=options), events)

    def resume(self, task: Any, token: str, decisions: Any, events: bool, data: Any) -> dict[str, Any]:
        options = options_from_data(data, f"{self.prefix}.resume")
        found = _tool_set(self.tools)
        if found.store is None:
            raise ConfigError(f"{self.prefix}.resume: the tool set {self.tools} names no APPROVAL_STORE to resume from")
        chosen = _decisions({} if decisions is None else decisions)
        self.unless_cancelled(task)
        return self.finish(
            task, resume_run(token, chosen, found.tools, approval_store=found.store, options=options), events
        )

    def unless_cancelled(self, task: Any) -> None:
        """Revoke the task, as Celery's own revoke does, when it was cancelled before it started:
        its run never starts (a revoke the worker had not yet heard of when it took the task)."""
        tasks = self.holder[0]
        if tasks.redis().lpop(tasks.cancel_key(str(task.request.id))) is None:
            return
        from celery.exceptions import Ignore

        task.backend.mark_as_revoked(task.request.id, "cancelled before it started", request=task.request)
        raise Ignore()

    def finish(self, task: Any, run: Run, events: bool) -> dict[str, Any]:
        tasks = self.holder[0]
        task_id = str(task.request.id)
        publisher = _Publisher(tasks.redis(), tasks.events_key(task_id), self.maxlen, self.ttl) if events else None
        result = _serve(run, tasks.redis(blocking=True), tasks.cancel_key(task_id), publisher)
        return result_document(result, worker=str(task.request.hostname), pid=os.getpid())


_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def register(
    app: Any,
    tools: str,
    *,
    prefix: str = "nous_sched",
    redis_url: Optional[str] = None,
    events_maxlen: int = 10_000,
    events_ttl: int = 3600,
) -> Tasks:
    """Register ``prefix.run`` and ``prefix.resume`` on Celery ``app``, running programs against ``tools``.

    ``tools`` is the tool set's import path (a dotted module name, or a
    ``.py`` file every worker has), loaded on each worker process on its first
    task. ``redis_url`` is where events and cancel keys live: by default the
    app's broker, which must then be Redis. Events streams hold about
    ``events_maxlen`` entries each and expire ``events_ttl`` seconds after
    their last write.

    :raises ConfigError: a bad argument, no Redis to use, or Celery not installed.
    """
    celery = _celery()
    v.require("register", "tools", tools, v.NON_EMPTY_STR)
    v.require("register", "prefix", prefix, v.NON_EMPTY_STR)
    v.require("register", "events_maxlen", events_maxlen, v.POSITIVE_INT)
    v.require("register", "events_ttl", events_ttl, v.POSITIVE_INT)
    if redis_url is None:
        broker = str(app.conf.broker_url or "")
        if not broker.startswith(_REDIS_SCHEMES):
            v.fail("register", "redis_url", redis_url, "a redis:// URL (the app's broker is not Redis)")
        redis_url = broker
    v.require("register", "redis_url", redis_url, v.NON_EMPTY_STR)
    holder: list[Tasks] = []
    served = _Served(tools, prefix, events_maxlen, events_ttl, holder)
    base = _checked_base(celery, app, holder)

    def _run(self: Any, code: str, events: bool = False, **data: Any) -> dict[str, Any]:
        return served.run(self, code, events, data)

    def _resume(self: Any, token: str, decisions: Any = None, events: bool = False, **data: Any) -> dict[str, Any]:
        return served.resume(self, token, decisions, events, data)

    run_task = app.task(name=f"{prefix}.run", bind=True, base=base)(_run)
    resume_task = app.task(name=f"{prefix}.resume", bind=True, base=base)(_resume)
    holder.append(Tasks(app, run_task, resume_task, redis_url=redis_url, prefix=prefix))
    return holder[0]

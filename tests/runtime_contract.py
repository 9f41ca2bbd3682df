"""The runtime contract: every promise of the code-runtime seam
(:mod:`nous_sched.runtime`), as checks any :class:`~nous_sched.CodeRuntime`
can be run against.

A new runtime's checklist: run each check of :data:`CHECKS` with the runtime,
e.g. ``pytest.mark.parametrize("check", CHECKS)`` as
``tests/test_runtime_contract.py`` does for both built-in runtimes. Each
check drives the runtime only through the seam: ``run(program, host,
limits)`` (and ``begin``) with a :class:`ContractHost`, a
:class:`~nous_sched.runtime.Host` that answers every call on its own thread,
in the order the calls were started (as the library's host commits), and
records everything the runtime asks of it.

What a runtime must do, check by check:

- a program's JSON result comes back as ``result``; its ``console.log``
  lines as ``logs``, in order;
- a program's own failure (a throw, a syntax error, memory, the deadline,
  cancel) is a :class:`~nous_sched.RuntimeOutcome` error of a kind from
  :data:`nous_sched.ERROR_KINDS`, never an exception out of ``run``;
- every tool call goes to the host (``call_json``, the arguments as JSON
  text), in the order the program made them; a failed outcome rejects the
  program's promise with a ``ToolError`` naming the tool;
- ``Promise.all`` fans out: every call of one step is started before any
  is waited for, inside one ``host.batch()``, and each answer reaches the
  program in its place;
- ``host.cancel`` ends the run with ``cancelled``, whether the program
  computes or waits; the deadline (the runtime's, or the host's own
  ``deadline``, whichever is first) with ``timeout``; the memory limit with
  ``abort``;
- one thread drives a run (never the host's): the host's hooks hear it: ``on_logs`` each step's lines,
  ``on_settled`` each answer in order with its JSON text, ``on_main`` the
  program's end once; ``discover`` answers the program's ``sdk`` questions;
- a host that declares only ``call_json`` (the rest :class:`Host`'s
  defaults) is enough;
- ``begin`` returns ``None`` or a started program that ``run(host)`` ends
  with the same outcome as ``run`` (or ``abandon()`` gives back);
- the host is called in the caller's ``contextvars``, whatever thread drives the run;
- runs on many threads at once stay apart;
- a runtime may ask ``when_begun`` (at most once a run, once it has started
  a call); the run and the hooks are the same whatever the host answers;
- a program marked for a durable run (:data:`~nous_sched.runtime.engine.CLOCK_MARK`)
  hands its new clock values to ``host.clock`` and its call sites to
  ``host.sites``, and reads recorded values back.
"""

from __future__ import annotations

import contextvars
import json
import select
import threading
import time
from typing import Any, Callable, Optional

from nous_sched import ERROR_KINDS, CodeRuntime, Limits, Outcome, RuntimeOutcome
from nous_sched.runtime import NO_QUESTIONS, Host, PendingCall
from nous_sched.runtime.engine import CLOCK_MARK

#: Generous for a loaded machine; the deadline checks use their own.
LIMITS = Limits(timeout=30)

Answer = Callable[[str, Any], Outcome]


def echo(name: str, args: Any) -> Outcome:
    """The default answer: the call's own arguments, named."""
    return Outcome.success({"tool": name, "args": args})


class Pending(PendingCall):
    """One call, answered by the host's answering thread; it can say it settled (``on_done``)."""

    def __init__(self, name: str, args: Any) -> None:
        self.name = name
        self.args = args
        self.outcome: Optional[Outcome] = None
        self.then: Optional[Callable[[], None]] = None
        self.event = threading.Event()
        self.lock = threading.Lock()

    def settle(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcome = outcome
            self.event.set()
            then = self.then
        if then is not None:
            then()

    def done(self) -> bool:
        return self.event.is_set()

    def on_done(self, then: Optional[Callable[[], None]]) -> bool:
        with self.lock:
            self.then = then
        return True

    def wait(self, timeout: float) -> Optional[Outcome]:
        return self.outcome if self.event.wait(timeout) else None


class ContractHost(Host):
    """A host that answers each call with ``answer(name, args)`` on its own
    thread, in the order the calls were started, after ``delay`` seconds
    each; ``hold`` names tools it never answers. ``seen`` records, in order,
    what the runtime asked: ``("call", name, args)``, ``("batch", "enter" |
    "exit")``, ``("question", text)``, ``("logs", lines)``, ``("settled",
    name, payload)``, ``("main", state)``, ``("clock", values)``, ``("sites", sites)``."""

    def __init__(
        self,
        names: tuple[str, ...] = ("first", "second", "fail", "hang"),
        answer: Answer = echo,
        delay: float = 0.0,
        hold: frozenset[str] = frozenset({"hang"}),
        cancel: Optional[threading.Event] = None,
    ) -> None:
        self.names = names
        self.cancel = cancel
        self.answer = answer
        self.delay = delay
        self.hold = hold
        self.seen: list[tuple[Any, ...]] = []
        self.threads: set[int] = set()
        self.queue: list[Pending] = []
        self.cond = threading.Condition()
        self.closed = False
        self.answering = threading.Thread(target=self._answer, name="nous-sched-test-contract-host", daemon=True)
        self.answering.start()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify()
        self.answering.join(10)

    def _answer(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.closed:
                    self.cond.wait()
                if self.closed:
                    return
                pending = self.queue.pop(0)
            if pending.name in self.hold:
                continue
            time.sleep(self.delay)
            pending.settle(self.answer(pending.name, pending.args))

    def _seen(self, *event: Any) -> None:
        self.threads.add(threading.get_ident())
        self.seen.append(event)

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        return [e for e in self.seen if e[0] == kind]

    def call_json(self, name: str, text: str) -> PendingCall:
        args = json.loads(text)
        self._seen("call", name, args)
        pending = Pending(name, args)
        with self.cond:
            self.queue.append(pending)
            self.cond.notify()
        return pending

    def batch(self) -> Any:
        host = self

        class _Batch:
            def __enter__(self) -> None:
                host._seen("batch", "enter")

            def __exit__(self, *exc: object) -> None:
                host._seen("batch", "exit")

        return _Batch()

    def discover(self, question: str) -> PendingCall:
        self._seen("question", question)
        pending = Pending("sdk", question)
        pending.settle(Outcome.success({"question": json.loads(question)}))
        return pending

    def on_logs(self, lines: list[str]) -> None:
        self._seen("logs", list(lines))

    def on_settled(self, pending: PendingCall, outcome: Outcome, payload: str) -> None:
        assert isinstance(pending, Pending)
        self._seen("settled", pending.name, payload)

    def on_main(self, state: Any) -> None:
        self._seen("main", state)

    def clock(self, values: list[Any]) -> None:
        self._seen("clock", list(values))

    def sites(self, sites: list[str]) -> None:
        self._seen("sites", list(sites))


class MinimalHost(Host):
    """A host that declares only what :class:`Host` requires: every call answered at once."""

    def __init__(self) -> None:
        self.names = ("first",)
        self.cancel = None

    def call_json(self, name: str, text: str) -> PendingCall:
        pending = Pending(name, json.loads(text))
        pending.settle(echo(name, pending.args))
        return pending


def run(
    rt: CodeRuntime, program: str, limits: Limits = LIMITS, **host_options: Any
) -> tuple[RuntimeOutcome, ContractHost]:
    host = ContractHost(**host_options)
    try:
        outcome = rt.run(program, host, limits)
    finally:
        host.close()
    assert isinstance(outcome, RuntimeOutcome)
    if outcome.error is not None:
        assert outcome.error.kind in ERROR_KINDS
    return outcome, host


def failed(outcome: RuntimeOutcome, kind: str, *words: str) -> None:
    assert outcome.error is not None, outcome
    assert outcome.error.kind == kind, outcome.error
    for word in words:
        assert word in outcome.error.message, outcome.error


CHECKS: list[Callable[[CodeRuntime], None]] = []


def check(fn: Callable[[CodeRuntime], None]) -> Callable[[CodeRuntime], None]:
    CHECKS.append(fn)
    return fn


# -- results, logs, errors ------------------------------------------------------------------


@check
def returns_the_programs_json_value(rt: CodeRuntime) -> None:
    outcome, _ = run(rt, 'return {a: [1, "x", null, true], b: 1.5}')
    assert outcome.error is None
    assert outcome.result == {"a": [1, "x", None, True], "b": 1.5}
    assert outcome.logs == ()


@check
def keeps_console_log_lines_in_order(rt: CodeRuntime) -> None:
    outcome, _ = run(rt, 'console.log("a", 2, {x: 1}); console.log("b"); return null')
    assert outcome.error is None
    assert outcome.logs == ('a 2 {"x":1}', "b")


@check
def a_throw_is_an_exception_kind_with_its_logs(rt: CodeRuntime) -> None:
    outcome, _ = run(rt, 'console.log("before"); throw new Error("boom")')
    failed(outcome, "exception", "boom")
    assert outcome.logs == ("before",)


@check
def a_syntax_error_is_an_exception_kind(rt: CodeRuntime) -> None:
    outcome, host = run(rt, "return (")
    failed(outcome, "exception", "SyntaxError")
    assert host.of("call") == []


# -- tool calls through the host ------------------------------------------------------------


@check
def calls_go_through_the_host_in_the_programs_order(rt: CodeRuntime) -> None:
    program = "const a = await tools.first({n: 1}); const b = await tools.second({n: a.args.n + 1}); return [a, b]"
    outcome, host = run(rt, program, delay=0.01)
    assert outcome.error is None
    assert host.of("call") == [("call", "first", {"n": 1}), ("call", "second", {"n": 2})]
    assert outcome.result == [{"tool": "first", "args": {"n": 1}}, {"tool": "second", "args": {"n": 2}}]


@check
def a_failed_outcome_rejects_with_a_tool_error(rt: CodeRuntime) -> None:
    def answer(name: str, args: Any) -> Outcome:
        return Outcome.failure(name, "refused here") if name == "fail" else echo(name, args)

    program = "try { await tools.fail({}); return 'no'; } catch (e) { return [e.name, e.message, e.tool]; }"
    outcome, _ = run(rt, program, answer=answer)
    assert outcome.error is None
    assert outcome.result == ["ToolError", "refused here", "fail"]


@check
def promise_all_fans_out_in_one_batch_answers_in_place(rt: CodeRuntime) -> None:
    program = "return await Promise.all(Array.from({length: 50}, (_, i) => tools.first({i})))"
    outcome, host = run(rt, program, delay=0.001)
    assert outcome.error is None
    assert outcome.result == [{"tool": "first", "args": {"i": i}} for i in range(50)]
    calls = [e for e in host.seen if e[0] in ("call", "batch")]
    # Every call of the step was started before any was waited for, inside one batch.
    assert calls == [("batch", "enter"), *[("call", "first", {"i": i}) for i in range(50)], ("batch", "exit")]


@check
def every_hook_runs_on_the_one_thread_that_drives_the_run(rt: CodeRuntime) -> None:
    # One thread drives a run (the caller's, or one of the runtime's own, e.g. an
    # in-process engine that needs a bigger stack): never the host's answering thread.
    program = (
        'console.log("x"); await Promise.all([tools.first({}), tools.second({})]); return await sdk.describe("first")'
    )
    outcome, host = run(rt, program, delay=0.01)
    assert outcome.error is None
    assert len(host.threads) == 1
    assert host.answering.ident not in host.threads


@check
def the_host_is_called_in_the_callers_contextvars(rt: CodeRuntime) -> None:
    # Whichever thread drives the run (the caller's, or one of the runtime's own),
    # the host sees what the caller set: the scheduler hands each call a copy of it.
    seen: list[str] = []
    var: contextvars.ContextVar[str] = contextvars.ContextVar("contract", default="unset")

    class Seeing(ContractHost):
        def call_json(self, name: str, text: str) -> PendingCall:
            seen.append(var.get())
            return super().call_json(name, text)

    def caller() -> None:
        var.set("the caller's")
        host = Seeing()
        try:
            assert rt.run("return await tools.first({})", host, LIMITS).error is None
        finally:
            host.close()

    # A thread with a small stack: an in-process engine may move to a thread of its own.
    old = threading.stack_size(256 * 1024)
    try:
        thread = threading.Thread(target=caller, name="nous-sched-test-small-stack")
        thread.start()
    finally:
        threading.stack_size(old)
    thread.join(60)
    assert seen == ["the caller's"]


# -- ending early ---------------------------------------------------------------------------


@check
def cancel_ends_a_run_that_waits_for_a_call(rt: CodeRuntime) -> None:
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    t0 = time.monotonic()
    outcome, host = run(rt, "await tools.hang({}); return 1", cancel=cancel)
    failed(outcome, "cancelled")
    assert time.monotonic() - t0 < 10
    assert host.of("call") == [("call", "hang", {})]


@check
def cancel_ends_a_run_that_computes(rt: CodeRuntime) -> None:
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    t0 = time.monotonic()
    outcome, _ = run(rt, "while (true) {}", cancel=cancel)
    failed(outcome, "cancelled")
    assert time.monotonic() - t0 < 10


@check
def the_deadline_ends_a_run_that_computes(rt: CodeRuntime) -> None:
    t0 = time.monotonic()
    outcome, _ = run(rt, 'console.log("started"); while (true) {}', Limits(timeout=0.5))
    failed(outcome, "timeout", "0.5s")
    assert time.monotonic() - t0 < 10
    assert outcome.logs == ("started",)


@check
def the_deadline_ends_a_run_that_waits_for_a_call(rt: CodeRuntime) -> None:
    t0 = time.monotonic()
    outcome, _ = run(rt, "await tools.hang({}); return 1", Limits(timeout=0.5))
    failed(outcome, "timeout", "0.5s")
    assert time.monotonic() - t0 < 10


@check
def no_answer_taken_past_the_hosts_deadline_reaches_the_program(rt: CodeRuntime) -> None:
    # The host's deadline (Host.deadline) is the run's: a call that failed because it
    # passed (a wait that gave up) must not reach the program as an error it could catch.
    class Late(ContractHost):
        def __init__(self) -> None:
            super().__init__(answer=lambda name, args: Outcome.failure(name, "the run's deadline passed"), delay=0.6)
            self.until = time.monotonic() + 0.3

        @property
        def deadline(self) -> Optional[float]:
            return self.until

    host = Late()
    try:
        outcome = rt.run("try { await tools.first({}); } catch (e) { return 'caught'; }", host, LIMITS)
    finally:
        host.close()
    failed(outcome, "timeout")


@check
def the_memory_limit_aborts_the_run(rt: CodeRuntime) -> None:
    limits = Limits(timeout=30, memory_bytes=32 * 1024 * 1024)
    outcome, _ = run(rt, "const a = []; while (true) a.push(new Array(1e6).fill(1))", limits)
    failed(outcome, "abort", "32 MiB memory limit")


# -- the host's hooks -----------------------------------------------------------------------


@check
def on_logs_hears_each_steps_lines(rt: CodeRuntime) -> None:
    outcome, host = run(rt, 'console.log("x"); await tools.first({}); console.log("y"); console.log("z"); return 1')
    assert outcome.error is None
    assert host.of("logs") == [("logs", ["x"]), ("logs", ["y", "z"])]


@check
def on_settled_hears_each_answer_in_order_with_its_json(rt: CodeRuntime) -> None:
    outcome, host = run(rt, "await tools.first({n: 1}); await Promise.all([tools.second({n: 2}), tools.first({n: 3})])")
    assert outcome.error is None
    settled = [(name, json.loads(payload)) for _, name, payload in host.of("settled")]
    assert settled == [
        ("first", {"tool": "first", "args": {"n": 1}}),
        ("second", {"tool": "second", "args": {"n": 2}}),
        ("first", {"tool": "first", "args": {"n": 3}}),
    ]


class ReadingHost(ContractHost):
    """A :class:`ContractHost` that reads the run's worker for it
    (:meth:`Host.attach_reader`) on a thread of its own; with ``leave_after``
    ``n``, the reader leaves (``gone()``, as a stopped scheduler's would)
    when it has read ``n`` times."""

    def __init__(self, leave_after: int = -1, **options: Any) -> None:
        super().__init__(**options)
        self.leave_after = leave_after
        self.readers: list[threading.Thread] = []
        self.reads = 0

    def attach_reader(self, fd: int, readable: Callable[[], bool], gone: Callable[[], None]) -> bool:
        def read() -> None:
            poll = select.poll()
            poll.register(fd, select.POLLIN)
            while not self.closed:
                if poll.poll(100):
                    if self.reads == self.leave_after:
                        gone()
                        return
                    self.reads += 1
                    if not readable():
                        return

        reader = threading.Thread(target=read, name="nous-sched-test-contract-reader", daemon=True)
        self.readers.append(reader)
        reader.start()
        return True

    def close(self) -> None:
        super().close()
        for reader in self.readers:
            reader.join(10)


def beside_plain(
    rt: CodeRuntime, program: str, host: ContractHost
) -> tuple[RuntimeOutcome, ContractHost, RuntimeOutcome]:
    """``program`` run with a plain :class:`ContractHost` (its outcome and host), then with ``host``
    (closed after; its outcome); both without an error."""
    plain, plain_host = run(rt, program)
    try:
        outcome = rt.run(program, host, LIMITS)
    finally:
        host.close()
    assert plain.error is None and outcome.error is None, (plain.error, outcome.error)
    return plain, plain_host, outcome


@check
def a_host_that_reads_for_the_run_hears_the_same_hooks_in_the_same_order(rt: CodeRuntime) -> None:
    # attach_reader: the host's own thread may read the worker's answers and step
    # them there (a runtime that has no worker never asks); the run, and
    # every hook the host hears, in order, are the same.
    program = (
        'let s = 0; for (let i = 0; i < 5; i++) { console.log("i" + i); s += (await tools.first({i})).args.i; }'
        "const [a, b] = await Promise.all([tools.first({n: 1}), tools.second({n: 2})]);"
        'console.log("end"); return [s, a.args.n, b.args.n, (await sdk.describe("first")) !== undefined];'
    )
    host = ReadingHost()
    plain, plain_host, outcome = beside_plain(rt, program, host)
    assert outcome.result == plain.result == [10, 1, 2, True]
    assert outcome.logs == plain.logs
    assert host.seen == plain_host.seen
    assert all(not reader.is_alive() for reader in host.readers)
    assert not host.readers or host.reads >= 5  # (a runtime that asked: each awaited answer was read there)


class BegunHost(ContractHost):
    """A :class:`ContractHost` that says when the calls started so far have
    begun (:meth:`Host.when_begun`): at once, as a host whose calls begin as
    they are started would; ``asks`` records how many calls had been started at each ask."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.asks: list[int] = []

    def when_begun(self, then: Callable[[], None]) -> bool:
        self.asks.append(len(self.of("call")))
        then()
        return True


@check
def a_host_that_says_when_calls_began_is_asked_at_most_once_after_a_call_and_the_run_is_the_same(
    rt: CodeRuntime,
) -> None:
    # when_begun: a runtime may ask (the worker pool does, to start a spare's
    # replacement after the run's start-up); the run, and every hook the host hears, are the same.
    program = (
        "const [a, b] = await Promise.all([tools.first({n: 1}), tools.second({n: 2})]); return [a.args.n, b.args.n];"
    )
    host = BegunHost()
    plain, plain_host, outcome = beside_plain(rt, program, host)
    assert outcome.result == plain.result == [1, 2]
    assert host.seen == plain_host.seen
    assert len(host.asks) <= 1 and all(n >= 1 for n in host.asks), host.asks


@check
def on_main_hears_the_programs_end_once(rt: CodeRuntime) -> None:
    outcome, host = run(rt, "await tools.first({}); return 7")
    assert outcome.result == 7
    assert [state["state"] for _, state in host.of("main")] == ["fulfilled"]


@check
def discover_answers_the_programs_sdk_questions(rt: CodeRuntime) -> None:
    outcome, host = run(rt, 'return await sdk.describe("first")')
    assert outcome.error is None
    assert outcome.result == {"question": ["describe", ["first"]]}
    assert [json.loads(q) for _, q in host.of("question")] == [["describe", ["first"]]]


@check
def a_host_with_only_call_json_is_enough(rt: CodeRuntime) -> None:
    program = (
        'console.log("x"); const r = await Promise.all([tools.first({n: 1}), tools.first({n: 2})]);'
        'try { await sdk.describe("first"); } catch (e) { return [r, e.message]; }'
    )
    outcome = rt.run(program, MinimalHost(), LIMITS)
    assert outcome.error is None, outcome.error
    assert outcome.result == [[{"tool": "first", "args": {"n": 1}}, {"tool": "first", "args": {"n": 2}}], NO_QUESTIONS]
    assert outcome.logs == ("x",)


# -- begin, threads, durable runs -----------------------------------------------------------


@check
def begin_starts_a_program_that_run_ends_with_its_host(rt: CodeRuntime) -> None:
    program = 'console.log("early"); return await tools.first({n: 1})'
    begun = rt.begin(program, ("first",), LIMITS, None)
    if begun is None:
        return  # the declared default: this runtime starts each program in run()
    host = ContractHost()
    try:
        outcome = begun.run(host)
    finally:
        host.close()
    assert outcome.error is None and outcome.logs == ("early",)
    assert outcome.result == {"tool": "first", "args": {"n": 1}}
    abandoned = rt.begin("while (true) {}", (), LIMITS, None)
    assert abandoned is not None
    abandoned.abandon()
    abandoned.abandon()  # idempotent


@check
def runs_on_many_threads_at_once_stay_apart(rt: CodeRuntime) -> None:
    results: dict[int, RuntimeOutcome] = {}

    def one(i: int) -> None:
        results[i], _ = run(rt, f'console.log("{i}"); const r = await tools.first({{i: {i}}}); return r.args.i * 10')

    threads = [threading.Thread(target=one, args=(i,), name=f"nous-sched-test-runner-{i}") for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert {i: (r.result, r.logs) for i, r in results.items()} == {i: (i * 10, (str(i),)) for i in range(4)}


@check
def a_durable_program_hands_its_clock_and_sites_to_the_host(rt: CodeRuntime) -> None:
    outcome, host = run(rt, CLOCK_MARK + "[]\x00const t = Date.now(); await tools.first({}); return t")
    assert outcome.error is None
    [(_, values)] = host.of("clock")
    assert values == [outcome.result]
    [(_, sites)] = host.of("sites")
    assert len(sites) == 1
    replayed, host = run(rt, CLOCK_MARK + "[5]\x00return Date.now()")
    assert replayed.result == 5
    assert host.of("clock") == []


# -- the CPU budget (Limits.cpu_time) ------------------------------------------------------


@check
def the_cpu_budget_ends_a_run_that_computes(rt: CodeRuntime) -> None:
    # Far from the deadline: the budget, not the wall clock, ends it (and says so).
    t0 = time.monotonic()
    outcome, _ = run(rt, 'console.log("started"); while (true) {}', Limits(timeout=60, cpu_time=0.3))
    failed(outcome, "cpu_time", "0.3s of CPU time")
    assert time.monotonic() - t0 < 30
    assert outcome.logs == ("started",)


@check
def the_cpu_budget_ends_a_chain_of_short_jobs(rt: CodeRuntime) -> None:
    # Each call into the engine starts the binding's slice afresh: the budget must not.
    outcome, _ = run(rt, "for (;;) await null", Limits(timeout=60, cpu_time=0.3))
    failed(outcome, "cpu_time", "0.3s of CPU time")


@check
def the_cpu_budget_counts_every_step(rt: CodeRuntime) -> None:
    # No one step spends the budget; together they do.
    program = "for (;;) { const t = Date.now(); while (Date.now() - t < 20) {} await tools.first({}); }"
    outcome, host = run(rt, program, Limits(timeout=60, cpu_time=0.3))
    failed(outcome, "cpu_time", "0.3s of CPU time")
    assert len(host.of("call")) >= 5


@check
def waiting_for_the_host_costs_no_cpu_time(rt: CodeRuntime) -> None:
    # Three answers of 0.4 s each: 1.2 s of waiting against a 0.2 s budget.
    program = "await tools.first({}); await tools.second({}); await tools.first({}); return 'done'"
    outcome, _ = run(rt, program, Limits(timeout=60, cpu_time=0.2), delay=0.4)
    assert outcome.error is None, outcome.error
    assert outcome.result == "done"

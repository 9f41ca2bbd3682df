"""The engine: one program stepped in a fresh quickjs-ng context, and the loop that drives it.

Shared by both runtimes. This module imports only the standard library and the
C module ``_quickjs`` (not the ``quickjs`` wrapper, which starts a thread when
imported), so a worker process loads it by file path without the
``nous_sched`` package. It has two halves:

* :class:`Engine`, the JavaScript side. A fresh context gets the prelude
  (``prelude.js``), whose value is the private ``bridge`` function
  (:func:`prepare`, which a worker does ahead of the run, while idle); then
  the run's memory, stack and CPU-slice limits, its tool names and log and
  output budgets (the bridge's ``configure``); then the program becomes the
  body of an ``async function`` (so top-level ``await`` and ``return`` work)
  and starts.
  Each step (:meth:`Engine.start`, then one settle per call) runs every
  pending job and answers with the *envelope*: the JSON text the prelude
  drains (new calls, new log lines, the program's state).
  :meth:`Engine.settle_many` makes several settle steps in one call.
* :func:`drive`, the host side. It checks each envelope (nothing from the
  sandbox is trusted), keeps the logs within their byte budget, hands new
  calls to the :class:`Host`, and settles the *oldest* outstanding call next,
  with every call committed in order behind it: one call per step, oldest
  first, is what makes a program observe one deterministic order, and a
  batch is only those steps made back to back. A run ends when the program
  has settled *and* every call it started has committed.

In-process, :func:`drive` calls an :class:`Engine` directly. With worker
processes the :class:`Engine` runs in the worker and :func:`drive` in the host,
each batch of steps one round trip over a pipe (its frame written by the
thread that committed the oldest call, when it can); the envelope text
crosses unchanged.

Nothing crosses between Python and the engine but strings: the binding
truncates ints to 32 bits and strings at NUL, so every value travels as JSON
text. No Python callable is ever exposed to JS (the binding refuses them while
a time limit is set, and a raising one corrupts the context).

The engine's own interrupt is ``set_time_limit``, a slice of *process* CPU
time, re-armed with the run's remaining wall time before each step. Only a
call into the engine that may run the program's code is armed (each arming
costs the binding a read of the process clock): the drain, and a settle whose
result is a primitive, run the prelude's own bounded work unarmed. A context
whose limit tripped is discarded after one bounded attempt to drain the log
lines it still held (the *salvage*).

A run with a CPU budget (``Limits.cpu_time``) counts the CPU its steps use on
the engine's ``cpu_clock`` (the worker's process clock, or the calling
thread's in-process), only inside the steps: nothing is counted while the
program waits for the host. The slice is then the smaller of the wall time
and the budget left, re-armed between the program's jobs and between the
settles of a batch (each call into the engine starts the binding's slice
afresh), and a slice that was the budget's ends the run with ``cpu_time``.
"""

from __future__ import annotations

import collections
import json
import json.encoder
import json.scanner
import math
import os
import re
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Sequence

import _quickjs

try:  # hashlib.blake2b itself, from CPython's own module: hashlib's import loads OpenSSL's library
    from _blake2 import blake2b as _blake2b  # (about 2.5 ms in each fork server, and mapped in every worker)
except ImportError:  # (a build without it)
    from hashlib import blake2b as _blake2b

if TYPE_CHECKING:  # types only: a worker loads this file by path, outside the package
    from . import Cancel, Host, Limits

__all__ = [
    "GC_FIRST",
    "load_gc_threshold",
    "gc_threshold",
    "Engine",
    "Stopped",
    "Finish",
    "drive",
    "prepare",
    "stack_message",
    "memory_message",
    "timeout_message",
    "cpu_message",
    "names_json",
    "names_utf8",
    "names_keyed",
    "NamesText",
]

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "prelude.js"), encoding="utf-8") as _f:
    _PRELUDE = _f.read()
# The rule for values JSON cannot hold: handed to the prelude, compiled only when a value needs it.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "convert.js"), encoding="utf-8") as _f:
    _CONVERTER = _f.read()
del _f

#: Allocations that move the collector's threshold up (see :func:`prepare`).
_HEADROOM = "void (() => { const a = []; for (let i = 0; i < 2000; i++) a.push({}); })()"
_TRUNCATED = "[output truncated at {n} bytes]"
#: What the program's text follows: one line (the prelude's line offset).
_HEADER = "(async function program() {\n"
_TRUNCATED_LINES = "[output truncated at {n} lines]"
#: A program that starts with this, JSON text of recorded clock values and a
#: NUL is a durable run's: the prelude reads Date.now(), new Date(),
#: Math.random() and performance.now() from those values, then records new
#: ones in the envelope (``"clock"``, for the host's ``clock(values)``), with
#: each call's site (``"sites"``, for ``sites(list)``). No
#: ordinary program starts with a NUL (the engine would cut it there).
CLOCK_MARK = "\x00nous-clock\x00"


def _one_shot_encoder(allow_nan: bool) -> Callable[[Any], str]:
    """``json.dumps``, compact and ASCII (as the bridge needs: it escapes lone
    surrogates and NUL), with the C encoder made once rather than per call
    (``JSONEncoder.encode`` builds one each time). No cycle check: what it
    encodes is a snapshot or a two-string error, never cyclic."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return json.JSONEncoder(allow_nan=allow_nan, separators=(",", ":"), check_circular=False).encode
    chunks = make(None, None, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, allow_nan)
    join = "".join

    def encode(value: Any) -> str:
        return join(chunks(value, 0))

    return encode


_encode_value = _one_shot_encoder(allow_nan=False)
_encode = _one_shot_encoder(allow_nan=True)


def _payload(outcome: Any) -> tuple[bool, str]:
    """What the bridge settles a call with: ok, and the value's (or the
    ``{tool, message}`` error's) ASCII JSON, which escapes lone surrogates (the
    binding cannot pass them) and NUL. A value made with its text
    (``Outcome.crossed``: the snapshot's own encode) is not encoded again."""
    if outcome.ok:
        text = outcome.text
        return True, text if text is not None else _encode_value(outcome.value)
    return False, _encode(outcome.error.as_dict())


#: A run's engine collects its cyclic garbage first once it holds this much,
#: or an eighth of its memory limit if that is less; after that, quickjs-ng's
#: own rule goes on as before (the next collection at 1.5 times what it holds).
#: Its first comes at 256 KB: a run that keeps many calls pending (a
#: Promise.all) collected again at every 1.5-fold growth, each collection
#: touching every object (in a fork server's child, copying every page of the
#: context). Where :func:`load_gc_threshold` finds no setter, it stays so.
GC_FIRST = 16 * 1024 * 1024

# (JS_GetGCThreshold, JS_SetGCThreshold, a Context's JSRuntime pointer) of the binding's
# own library, once load_gc_threshold has checked them (None: not loaded, or not here).
_gc_calls: Optional[tuple[Any, Any, Callable[[Any], Any]]] = None
_gc_looked = False  # load_gc_threshold has looked (it looks once)
_GC_RUNTIME_AT = 16  # where a binding Context keeps its JSRuntime pointer (then its JSContext's)


def load_gc_threshold() -> bool:
    """Find quickjs-ng's ``JS_SetGCThreshold`` in the binding's library, once;
    whether a run's first collection can be set (:data:`GC_FIRST`). Only where
    the layout is exactly the one expected: a 64-bit build whose ``Context``
    keeps its runtime and context pointers where ``JS_GetRuntime`` says, and
    whose threshold reads back what was set. A worker calls it before its
    filter (it opens the library); nothing else ever opens it."""
    global _gc_calls, _gc_looked
    if _gc_looked:
        return _gc_calls is not None
    _gc_looked = True
    try:
        import ctypes

        if ctypes.sizeof(ctypes.c_void_p) != 8:
            return False
        lib = ctypes.CDLL(_quickjs.__file__)
        get_runtime, get, set_ = lib.JS_GetRuntime, lib.JS_GetGCThreshold, lib.JS_SetGCThreshold
        get_runtime.argtypes, get_runtime.restype = [ctypes.c_void_p], ctypes.c_void_p
        get.argtypes, get.restype = [ctypes.c_void_p], ctypes.c_size_t
        set_.argtypes, set_.restype = [ctypes.c_void_p, ctypes.c_size_t], None
        at = ctypes.c_void_p.from_address

        def runtime_of(ctx: Any) -> Any:
            return at(id(ctx) + _GC_RUNTIME_AT).value

        ctx = _quickjs.Context()
        rt = runtime_of(ctx)
        js_ctx = at(id(ctx) + _GC_RUNTIME_AT + 8).value
        if not rt or not js_ctx or get_runtime(js_ctx) != rt or not 0 < get(rt) <= GC_FIRST:
            return False
        set_(rt, GC_FIRST - 1)
        if get(rt) != GC_FIRST - 1:
            return False
        del ctx
        _gc_calls = (get, set_, runtime_of)
        return True
    except Exception:  # (no ctypes, no such symbol: the engine's own threshold stays)
        return False


def gc_threshold(ctx: Any) -> Optional[int]:
    """The allocation size at which ``ctx``'s engine collects next (``None``:
    not known here, see :func:`load_gc_threshold`)."""
    if _gc_calls is None:
        return None
    get, _, runtime_of = _gc_calls
    return int(get(runtime_of(ctx)))


def _first_collection(ctx: Any, memory_bytes: int) -> None:
    """Put ``ctx``'s first collection at :data:`GC_FIRST` (or an eighth of
    ``memory_bytes``), never lower than it is."""
    if _gc_calls is None:
        return
    get, set_, runtime_of = _gc_calls
    rt = runtime_of(ctx)
    at = min(GC_FIRST, memory_bytes // 8)
    if get(rt) < at:
        set_(rt, at)


#: Extra memory and CPU time the salvage drain may use after a limit tripped.
_SALVAGE_MEMORY = 16 * 1024 * 1024
_SALVAGE_SECONDS = 0.5
#: The limits the trusted prelude is evaluated under, before the run's own.
_PREPARE_MEMORY = 32 * 1024 * 1024
_PREPARE_SECONDS = 10.0
#: How often a cancellable wait looks at its ``cancel`` event.
CANCEL_POLL = 0.05


class Stopped(Exception):
    """The run ended early: ``kind`` and ``message`` say why.

    ``envelope`` is the last envelope the engine could still drain (so the
    logs it held are kept), or ``None``. ``memory`` is true when the memory
    limit stopped it (a worker that hit it is retired). ``steps``: when it
    stopped part way through a batch of settles, the envelopes of the
    settles before it, in order (their logs are kept too).
    """

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        envelope: Optional[str] = None,
        memory: bool = False,
        steps: Sequence[str] = (),
    ) -> None:
        super().__init__(kind, message)
        self.kind = kind
        self.message = message
        self.envelope = envelope
        self.memory = memory
        self.steps = steps


class _Syntax(Exception):
    def __init__(self, message: str) -> None:
        self.message = message


# -- the JavaScript side -------------------------------------------------------------


#: How many tool sets' names texts :func:`names_json` keeps (each holds its names tuple alive).
NAMES_CACHE = 16
# id of a names tuple -> [that tuple, its text, lazy, the text as UTF-8, its key or None (made
# when first asked for)]: the tuple is held so its id is not reused.
# No lock: each operation on it below is one C call, atomic under the GIL, and a lock held across
# Python steps could be left held by a Ctrl-C landing as its ``with`` block returns (every later run
# then waits for it forever; tests/_interrupt_steps.py found it).
_names_texts: collections.OrderedDict[int, list[Any]] = collections.OrderedDict()


def names_json(names: Sequence[str]) -> tuple[str, bool]:
    """The run's tool names as the prelude's ``configure`` takes them: a JSON
    array with a newline before each element (``[\\n"a",\\n"b"]``: a newline
    is never raw inside a JSON string, so a name's JSON text found after one
    is a whole element), and whether it is written exactly as QuickJS's
    ``JSON.stringify`` would write each name (then the program's ``tools``
    looks a name up in the text itself, and makes no tool it does not read;
    else, a name holding a lone surrogate, the prelude makes every tool at
    once). A tuple's text is kept for the next run of the same tuple (the
    last :data:`NAMES_CACHE`): a tool set's names are made once
    (``nous_sched.gate.toolset``), so its runs pay no per-name cost here."""
    entry = _names_entry(names)
    return entry[1], entry[2]


def names_utf8(names: Sequence[str]) -> tuple[bytes, bool]:
    """:func:`names_json`'s text as UTF-8 (what a run frame carries to a worker), kept alike."""
    entry = _names_entry(names)
    return entry[3], entry[2]


def names_keyed(names: Sequence[str]) -> tuple[bytes, bool, Optional[bytes]]:
    """:func:`names_utf8`'s ``(text, lazy)`` and the text's key: the hex of
    its 128-bit BLAKE2b digest (ASCII), kept alike; ``None`` for names that
    are not a tuple (nothing is kept for them, and a digest per run would
    cost more than the text it saves). Two texts have one key only by a
    collision of the digest: a worker that holds a text under a key holds
    exactly that text (``worker.py``'s names cache)."""
    entry = _names_entry(names)
    if type(names) is not tuple:
        return entry[3], entry[2], None
    key = entry[4]
    if key is None:
        key = entry[4] = names_key(entry[3])
    return entry[3], entry[2], key


def names_key(text: bytes) -> bytes:
    """The key of a names text (see :func:`names_keyed`); ``worker.py`` checks a text it is sent by it."""
    return _blake2b(text, digest_size=16).hexdigest().encode("ascii")


def _names_entry(names: Sequence[str]) -> list[Any]:
    cacheable = type(names) is tuple
    if cacheable:
        hit = _names_texts.get(id(names))
        if hit is not None and hit[0] is names:
            try:
                _names_texts.move_to_end(id(names))
            except KeyError:  # (another thread's store evicted it meanwhile: the text is still right)
                pass
            return hit
    text = _delimited(names, False)
    # Python and QuickJS escape alike but for lone surrogates (Python leaves
    # them raw, which the binding cannot pass either): ASCII then, and eager.
    lazy = _SURROGATE.search(text) is None
    if not lazy:
        text = _delimited(names, True)
    entry = [names, text, lazy, text.encode("utf-8"), None]
    if cacheable:
        _names_texts[id(names)] = entry
        while len(_names_texts) > NAMES_CACHE:
            try:
                _names_texts.popitem(last=False)
            except KeyError:  # (another thread emptied it meanwhile)
                break
    return entry


_SURROGATE = re.compile("[\ud800-\udfff]")


def _delimited(names: Sequence[str], ascii: bool) -> str:
    if not names:
        return "[]"
    dumps = json.dumps
    return "[\n" + ",\n".join(dumps(n, ensure_ascii=ascii) for n in names) + "]"


class NamesText(tuple):  # type: ignore[type-arg]
    """``(text, lazy)`` as :func:`names_json` made them, for an :class:`Engine`'s
    ``names``: the host made them once per tool set and sent them to the worker."""

    __slots__ = ()


def prepare(shared: bool = False) -> tuple[Any, Any]:
    """A fresh context with the prelude evaluated, bound to no run yet: a
    ``(context, bridge)`` pair for :class:`Engine`'s ``prepared``. Use it once.

    ``shared``: the context is a fork server's, of which each child gets a
    copy-on-write copy (a page the child writes is copied for it). Made so,
    it also holds the rule for values JSON cannot hold compiled (about 0.4 ms,
    which a run pays when it first needs it: a call whose arguments' JSON
    holds ``{}``, a result JSON cannot hold), and the engine's collector
    leaves it alone until it holds about 350 KB more than now (a collection
    writes to every object, copying every page of the context in the child
    that runs it; quickjs-ng's first comes at 256 KB, and the prelude alone
    is about 240 KB). A context prepared for one run gets neither: most runs
    never need the rule, and a collection copies nothing there."""
    ctx = _quickjs.Context()
    ctx.set_memory_limit(_PREPARE_MEMORY)
    ctx.set_time_limit(_PREPARE_SECONDS)
    bridge = ctx.eval(_PRELUDE)
    bridge("converter", _CONVERTER)
    if shared:
        bridge("load converter")
        # The collector's next threshold is 1.5 times what the context holds
        # when an allocation crosses the last one: allocate (and drop) enough
        # to cross it twice. Trusted code, no program's: it leaves nothing.
        ctx.eval(_HEADROOM)
    ctx.set_time_limit(-1)
    return ctx, bridge


class Relay(Protocol):
    """A stepper's way to send a settle from the thread that commits the call
    (the worker runtime's: :mod:`nous_sched.runtime.pool`)."""

    def kick(self) -> None:
        """The head call has committed (called on the thread that committed it). Never blocks, never raises."""

    def settled(
        self,
        take: Callable[[Any], list[Any]],
        head: Any,
        advance: Optional["Advance"] = None,
        attach: Optional[Callable[[int, Callable[[], bool], Callable[[], None]], bool]] = None,
    ) -> Optional[list[Any]]:
        """Wait for ``head`` to commit and its batch to be sent; the batch (``[]``: the deadline came first).

        With ``advance`` and ``attach`` (the host's :meth:`~nous_sched.runtime.Host.attach_reader`),
        the relay may let the host's driver read the answers and step them
        with ``advance`` meanwhile: ``None`` then says the answers were read
        and stepped (go on after the read)."""
        ...

    def answers(self, batch: Sequence[Any]) -> Sequence[str]:
        """The envelopes answering ``batch``, which :meth:`settled` sent."""
        ...


#: What ``advance`` answers for an answer it did not step: the run's thread reads it (as ``[text]``).
NOT_STEPPED: Any = object()
#: ``advance(text, batch)``, on the host's driver: step the lone answer
#: ``text`` to ``batch`` if it only starts tool calls; the next head to wait
#: for (stay attached), ``None`` (stepped: the run's thread goes on after the
#: read), or :data:`NOT_STEPPED`.
Advance = Callable[[str, Sequence[Any]], Any]


class Steps(Protocol):
    """What :func:`drive` steps: an :class:`Engine` in this process, or a worker's (``_remote.Remote``)."""

    @property
    def max_payload(self) -> Optional[int]:
        """The longest answer payload one settle may carry (``None``: no bound of the stepper's own)."""
        ...

    @property
    def relay(self) -> Optional[Relay]:
        """The stepper's :class:`Relay`, or ``None``: the thread that drives the run sends every settle."""
        ...

    def start(self) -> str:
        """Start the program; the first envelope."""
        ...

    def settle_many(self, batch: Sequence[Any]) -> Sequence[str]:
        """Settle ``batch`` in order; an envelope per settle."""
        ...


class Engine:
    """One program in one fresh context. Only one thread may use an engine, one
    call at a time (two threads in one context abort the process).

    ``limits`` is anything with the attributes of :class:`nous_sched.Limits`;
    ``deadline`` is a :func:`time.monotonic` instant; ``prepared`` a pair from
    :func:`prepare` (made here when ``None``). ``before_salvage``, when given,
    is called once the program has been stopped and before its logs are
    drained: whatever stops the engine from outside (the worker's deadline
    signal) must be off by then, or it would stop the drain too. Every step raises
    :class:`Stopped` when the engine stops the program (deadline, memory,
    stack, a syntax error, a tampered bridge).
    """

    #: (:class:`Steps`) No bound of its own: the bridge checks each payload.
    max_payload: Optional[int] = None
    #: (:class:`Steps`) None: the thread that drives the run settles each call.
    relay: Optional[Relay] = None
    #: (Looked up by :func:`drive`, not a :class:`Steps` member.) Called once, on the thread that drives the
    #: run, when it first has to wait for a call, with that call's pending call
    #: (which it may wait for: ``wait(seconds)``) and the run's host (which it may
    #: ask when the calls have begun: ``when_begun``); ``None``: nothing to do then.
    idle: Optional[Callable[[Any, Host], None]] = None

    def __init__(
        self,
        program: str,
        names: Sequence[str],
        limits: Any,
        deadline: float,
        prepared: Optional[tuple[Any, Any]] = None,
        before_salvage: Optional[Callable[[], None]] = None,
        cpu_clock: Callable[[], float] = time.thread_time,
        cpu_slice: bool = True,
    ) -> None:
        self.program = program
        self.names = names
        self.limits = limits
        self.deadline = deadline
        self.prepared = prepared
        self.before_salvage = before_salvage
        self.ctx: Any = None
        self.bridge: Any = None
        # The CPU budget (None: none), what the steps before used of it, where this step began.
        self.cpu_time: Optional[float] = getattr(limits, "cpu_time", None)
        self.cpu_clock = cpu_clock
        self.cpu_used = 0.0
        self.cpu_mark = 0.0
        self.by_cpu = False  # the slice armed last is the CPU budget's, not the deadline's
        # Whether the binding's slice carries the budget (else something else
        # stops the engine at it: the in-process watcher, by ``cpu_spent``).
        self.cpu_slice = cpu_slice
        self.stepping = False
        self.slice = 0.0  # the slice the step's first call into the engine was armed with

    def start(self) -> str:
        """Bind the context to this run, start the program, run it to its first
        wait; the envelope."""
        if self.cpu_time is None:
            return self._start()
        self.cpu_mark = self.cpu_clock()
        self.stepping = True
        try:
            return self._start()
        finally:
            self.stepping = False
            self.cpu_used += self.cpu_clock() - self.cpu_mark

    def cpu_spent(self) -> float:
        """The CPU time the program's steps have used so far (any thread may ask; 0 without a budget)."""
        if self.stepping:
            return self.cpu_used + (self.cpu_clock() - self.cpu_mark)
        return self.cpu_used

    def _start(self) -> str:
        limits = self.limits
        prepared, self.prepared = self.prepared, None
        try:
            ctx, bridge = prepared if prepared is not None else prepare()
        except _quickjs.JSException as exc:  # the engine could not even start: no memory
            raise Stopped("abort", "the engine could not start: " + clip(str(exc))) from None
        self.ctx, self.bridge = ctx, bridge
        ctx.set_memory_limit(limits.memory_bytes)
        ctx.set_max_stack_size(limits.stack_bytes)
        _first_collection(ctx, limits.memory_bytes)
        names, lazy = self.names if isinstance(self.names, NamesText) else names_json(self.names)
        budgets = (
            f"[{int(limits.max_log_bytes)},{int(limits.max_output_bytes)},{int(limits.max_args_bytes)},"
            f"{int(limits.max_log_lines)},{int(limits.max_calls)},{int(limits.max_total_args_bytes)},{int(lazy)}]"
        )
        self._arm()
        # (configure also gives the run its own ``performance``, counting from now: see prelude.js.)
        self._guard(bridge, "configure", names, budgets, 1)
        program = self.program
        if program.startswith(CLOCK_MARK):
            # A durable run (nous_sched/durable/_replay.py): its recorded clock values, then the program.
            end = program.index("\x00", len(CLOCK_MARK))
            self._guard(bridge, "clock", program[len(CLOCK_MARK) : end])
            program = program[end + 1 :]
        try:
            # The header's line is taken off every line number by the prelude.
            main = self._guard(ctx.eval, _HEADER + _well_formed(program) + "\n})")
        except _Syntax as exc:
            raise Stopped("exception", exc.message) from None
        # The program runs from here, not from inside the bridge: no frame of the
        # prelude is under its first step, so each call it makes captures one
        # CallSite fewer (the bridge's own, never shown).
        run = self._guard(bridge, "start", main)
        del main
        if run is not None:
            try:
                started = run()
            except _quickjs.JSException as exc:
                self._stopped(bridge, exc)
            del run
            self._guard(bridge, "started", started)
            del started
        self._pump()
        return self._drain()

    def settle(self, call_id: int, ok: bool, payload: str) -> str:
        """Settle call ``call_id`` with ``payload`` (JSON text: the value, or the
        ``{tool, message}`` error), run what that wakes; the envelope. The
        same step as :meth:`settle_many` of that one call makes."""
        if self.cpu_time is not None:
            return self.settle_many(((call_id, None, None, ok, payload),))[0]
        # (A worker's usual frame settles one call: this step without the
        # batch's loop, and :meth:`_pump`'s and :meth:`_drain`'s work written
        # out, as :meth:`_settle_many` writes it: it is on every call's path.)
        bridge = self.bridge
        ctx = self.ctx
        monotonic = time.monotonic
        into = bridge  # what a JSException came from (:meth:`_stopped`)
        try:
            if ok and payload[:1] in _PRIMITIVE_START:
                # Resolving a call with a primitive runs none of the program's code
                # (only an object is asked for a `then`), so the settle needs no
                # slice: the binding then reads no clock for it. The deadline is
                # looked at first, as arming would; the jobs it wakes run armed.
                if self.deadline - monotonic() <= 0:
                    raise self._killed("timeout", timeout_message(self.limits.timeout, "waiting for a tool call"))
                bridge("settle", call_id, ok, payload)
                self._arm()
            else:
                self._arm("waiting for a tool call")
                bridge("settle", call_id, ok, payload)
            into = execute = ctx.execute_pending_job
            deadline = self.deadline
            # A promise chain that never ends is many short jobs: check between them.
            while execute():
                if monotonic() > deadline:
                    raise self._killed("timeout", timeout_message(self.limits.timeout, "running JavaScript"))
            into = bridge
            ctx.set_time_limit(-1)  # (the drain runs the prelude's bounded work only: see _drain)
            text = bridge("drain")
        except _quickjs.JSException as exc:
            self._stopped(into, exc)
        if type(text) is not str:
            # Only the prelude drains; anything else means the program reached the bridge.
            raise Stopped("abort", TAMPERED)
        return text

    def settle_many(self, batch: Sequence[Sequence[Any]]) -> list[str]:
        """Settle each call of ``batch`` in order, each item ``(call_id, _, _,
        ok, payload)`` (a :func:`drive` batch), and after each run every job
        it wakes, then drain: exactly the steps that many :meth:`settle`
        calls would make, so what the program observes does not depend on
        how the settles were batched. The envelope of each, in order. A stop
        part way raises :class:`Stopped` with the envelopes before it as its
        ``steps``."""
        if self.cpu_time is None:
            return self._settle_many(batch)
        self.cpu_mark = self.cpu_clock()
        self.stepping = True
        try:
            return self._settle_many(batch)
        finally:
            self.stepping = False
            self.cpu_used += self.cpu_clock() - self.cpu_mark

    def _settle_many(self, batch: Sequence[Sequence[Any]]) -> list[str]:
        """Per call the settle, the jobs it wakes (:meth:`_pump`'s loop) and the
        drain (:meth:`_drain`'s, unarmed), written out in one loop: a burst's
        last batch (a ``Promise.all``'s, up to :data:`BATCH_CALLS`) is on the
        run's path. Each call into the engine is armed as there: with a CPU
        budget afresh from the budget left; without one from the slice
        :meth:`_arm` set, and a later settle with a primitive unarmed (as
        :meth:`settle` says why; its jobs always armed)."""
        # The binding's CPU slice starts afresh at each call into the engine. No
        # JavaScript ran since the last step: a deadline already past came while the program waited.
        self._arm("waiting for a tool call")
        bridge = self.bridge
        ctx = self.ctx
        execute = ctx.execute_pending_job
        set_time_limit = ctx.set_time_limit
        deadline = self.deadline
        monotonic = time.monotonic
        failure = _quickjs.JSException
        rearm = self._rearm if self.cpu_time is not None else None
        again = rearm if rearm is not None else self._reslice  # (arms a later call of the batch)
        primitive = _PRIMITIVE_START
        texts: list[str] = []
        into = bridge  # what a JSException came from (:meth:`_stopped`)
        try:
            for item in batch:
                unarmed = False
                if texts:  # (the drain took the slice off)
                    if monotonic() > deadline:
                        raise self._killed("timeout", timeout_message(self.limits.timeout, "running JavaScript"))
                    unarmed = rearm is None and item[3] and item[4][:1] in primitive
                    if not unarmed:
                        again()
                try:
                    into = bridge
                    bridge("settle", item[0], item[3], item[4])
                    if unarmed:
                        set_time_limit(self.slice)
                    into = execute
                    # A promise chain that never ends is many short jobs: check between them.
                    while execute():
                        if monotonic() > deadline:
                            raise self._killed("timeout", timeout_message(self.limits.timeout, "running JavaScript"))
                        if rearm is not None:  # (each job's slice starts afresh: the budget left)
                            rearm()
                    into = bridge
                    set_time_limit(-1)  # (the drain runs the prelude's bounded work only: see _drain)
                    text = bridge("drain")
                except failure as exc:
                    self._stopped(into, exc)
                if type(text) is not str:
                    # Only the prelude drains; anything else means the program reached the bridge.
                    raise Stopped("abort", TAMPERED)
                texts.append(text)
        except Stopped as stop:
            stop.steps = texts
            raise
        return texts

    def close(self) -> None:
        """Free the context. Drop the handles before the context: a context is
        freed only once every Object referring into it is gone."""
        self.bridge = None
        self.ctx = None
        self.prepared = None

    # -- stepping ------------------------------------------------------------

    def _arm(self, doing: str = "running JavaScript") -> None:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise self._killed("timeout", timeout_message(self.limits.timeout, doing))
        if self.cpu_time is not None:
            left = self._cpu_left()
            self.by_cpu = self.cpu_slice and left < remaining
            if self.by_cpu:
                remaining = left
        self.slice = remaining
        self.ctx.set_time_limit(remaining)

    def _cpu_left(self) -> float:
        """The CPU budget left; the run stops (``cpu_time``) when none is."""
        assert self.cpu_time is not None
        left = self.cpu_time - self.cpu_used - (self.cpu_clock() - self.cpu_mark)
        if left <= 0:
            raise self._killed("cpu_time", cpu_message(self.cpu_time, "running JavaScript"))
        return left

    def _rearm(self) -> None:
        """Between two calls into the engine of one step: the slice again, from the budget left now."""
        # (Never 0 or less, which would switch the binding's limit off: a deadline
        # that passed since the caller's look trips the next check.)
        remaining = max(self.deadline - time.monotonic(), 1e-6)
        left = self._cpu_left()
        self.by_cpu = self.cpu_slice and left < remaining
        self.ctx.set_time_limit(left if self.by_cpu else remaining)

    def _reslice(self) -> None:
        """The slice :meth:`_arm` set, again (a call after one that ran unarmed)."""
        self.ctx.set_time_limit(self.slice)

    def _pump(self, armed: bool = False) -> None:
        if not armed:
            self._arm()
        execute = self.ctx.execute_pending_job
        deadline = self.deadline
        monotonic = time.monotonic
        rearm = self._rearm if self.cpu_time is not None else None
        try:
            # A promise chain that never ends is many short jobs: check between them.
            while execute():
                if monotonic() > deadline:
                    raise self._killed("timeout", timeout_message(self.limits.timeout, "running JavaScript"))
                if rearm is not None:  # (each job's slice starts afresh: the budget left, not the first slice)
                    rearm()
        except _quickjs.JSException as exc:
            self._stopped(execute, exc)

    def _drain(self) -> str:
        bridge = self.bridge
        # The drain runs only the prelude's own work, bounded by the run's
        # limits (no program code: every value it writes is text already), so
        # it needs no slice: without one the binding reads no clock for it.
        # Every later call into the engine arms the slice again first.
        self.ctx.set_time_limit(-1)
        try:
            text = bridge("drain")
        except _quickjs.JSException as exc:
            self._stopped(bridge, exc)
        if type(text) is not str:
            # Only the prelude drains; anything else means the program reached the bridge.
            raise Stopped("abort", TAMPERED)
        return text

    def _guard(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call into the engine, turning an engine-level stop into :class:`Stopped`."""
        try:
            return fn(*args)
        except _quickjs.JSException as exc:
            self._stopped(fn, exc)

    def _stopped(self, fn: Any, exc: Exception) -> None:
        """Raise what ``exc``, raised by calling ``fn`` in the engine, means for the run."""
        limits = self.limits
        if isinstance(exc, _quickjs.StackOverflow):
            raise self._killed("abort", stack_message(limits.stack_bytes)) from None
        text = str(exc)
        if "interrupted" in text:
            spent = self.by_cpu or (self.cpu_time is not None and self.cpu_spent() >= self.cpu_time)
            if spent and time.monotonic() < self.deadline:
                raise self._killed("cpu_time", cpu_message(limits.cpu_time, "running JavaScript")) from None
            raise self._killed("timeout", timeout_message(limits.timeout, "running JavaScript")) from None
        if "out of memory" in text or text.strip() in ("", "null"):
            raise self._killed("abort", memory_message(limits.memory_bytes), memory=True) from None
        if "stack overflow" in text or "Maximum call stack size exceeded" in text:
            raise self._killed("abort", stack_message(limits.stack_bytes)) from None
        if fn is not self.bridge and fn != self.ctx.execute_pending_job:
            raise _Syntax(clip(text.strip())) from None
        raise self._killed("abort", "the engine stopped the program: " + clip(text.strip())) from None

    def _killed(self, kind: str, message: str, *, memory: bool = False) -> Stopped:
        return Stopped(kind, message, envelope=self._salvage(), memory=memory)

    def _salvage(self) -> Optional[str]:
        # After an interrupt or OOM the context may still answer one drain: try,
        # with a little headroom, so a stopped program keeps what it printed.
        bridge = self.bridge
        if bridge is None:
            return None
        if self.before_salvage is not None:
            self.before_salvage()
        try:
            self.ctx.set_memory_limit(self.limits.memory_bytes + _SALVAGE_MEMORY)
            self.ctx.set_time_limit(_SALVAGE_SECONDS)
            text = bridge("drain")
        except Exception:  # the run's verdict is already made
            return None
        return text if type(text) is str else None


#: The first characters of a JSON text that is not an object or an array
#: (``null``, ``true``, ``false``, a number, a string).
_PRIMITIVE_START = frozenset('ntf-"0123456789')

# A lone surrogate or a NUL, with the backslashes right before it.
_UNFIT = re.compile("(\\\\*)([\x00\ud800-\udfff])")


def _escaped(match: "re.Match[str]") -> str:
    slashes, char = match.groups()
    # After an odd run of backslashes the character was itself escaped: ``u0000``
    # completes that escape (``\\u0000``), the same code unit either way.
    lead = "" if len(slashes) % 2 else "\\"
    return f"{slashes}{lead}u{ord(char):04x}"


def _well_formed(program: str) -> str:
    """The program with each lone surrogate and each NUL written as its escape ``\\uXXXX``.

    The binding takes only UTF-8 without NUL (a C string), which a lone
    surrogate is not and a NUL would cut. In a string, template or regular
    expression literal the escape means the same code unit (a NUL is an
    ordinary character of a program); anywhere else the program was no valid
    JavaScript either, and is now a syntax error like any other (an
    ``exception`` result).
    """
    if "\x00" not in program:
        if program.isascii():
            return program
        try:
            program.encode("utf-8")
        except UnicodeEncodeError:
            pass
        else:
            return program
    return _UNFIT.sub(_escaped, program)


# -- the host side -------------------------------------------------------------------


class Finish:
    """How a run ended: its ``logs`` and either a JSON ``result`` or an
    ``error``, a ``(kind, message)`` pair."""

    __slots__ = ("logs", "result", "error")

    def __init__(self, logs: tuple[str, ...], result: Any = None, error: Optional[tuple[str, str]] = None) -> None:
        self.logs = logs
        self.result = result
        self.error = error


#: A batch of settles (:func:`drive`) takes at most this many calls, and no
#: more once its payloads reach this many characters (the first is always
#: taken, however large): a batch's frame stays small, its answers prompt.
BATCH_CALLS = 256
BATCH_BYTES = 32 * 1024
#: The envelope of a step that changed nothing the host sees: no calls, no
#: logs, nothing dropped, no result. Most steps of a Promise.all are this.
QUIET = '{"calls":[],"logs":[],"dropped":0,"main":null}'


def drive(
    engine: Steps,
    host: Host,
    limits: Limits,
    deadline: float,
    cancel: Optional[Cancel] = None,
) -> Finish:
    """Run a program through ``engine`` (an :class:`Engine`, or anything with
    its ``start``/``settle`` steps), its calls through ``host``, to the end.

    Never raises for the program's own failure. ``cancel`` (an object with
    ``is_set()``, e.g. a :class:`threading.Event`) ends the run with a
    ``cancelled`` error at the next step or while waiting for a call.

    **Settles go in batches.** The oldest outstanding call is settled first;
    once it has committed, every call committed in order behind it (the
    committed prefix, up to :data:`BATCH_CALLS`) goes with it, in one
    ``settle_many`` (one frame to a worker). The engine settles them one at
    a time, running the jobs each wakes before the next, and answers with an
    envelope per settle, which this loop reads in order as separate steps:
    what the program observes, and what the host sees, is the same however
    many were batched. A call joins a batch behind the oldest only if its
    pending call is ``done()`` (``PendingCall.done``: then ``done()`` and
    ``wait(0.0)`` may be called from any thread and do nothing else). A
    stepper with a ``relay`` (the worker runtime's) lets the thread that
    commits the oldest call send its batch itself, when that call can say it
    settled (``PendingCall.on_done``); this thread then only reads the
    answers (see :class:`nous_sched.runtime._remote.Relay`).

    **Nothing is handed to the program once its run is over.** The run's
    deadline is the earlier of ``deadline`` and the host's own ``deadline``
    (``Host.deadline``, ``None`` by default, else a :func:`time.monotonic` instant: a
    ``run_code`` host's is the run's, which its calls' waits give up at,
    while a runtime counts ``deadline`` from its own start, a little
    later). An answer taken at or after it is never settled: the run ends
    there, a ``timeout`` (or, for a program that had already returned,
    what it returned), as if the answer had not come. So a call that
    failed *because* the run's deadline passed (a throttle's or an
    approval's wait that gave up, a tool that bounds its wait by it) never
    reaches the program as an error it could catch and turn into another
    end, however the threads raced (``tests/test_deadline_race.py``).

    **The host's driver may read for this thread.** While this thread waits
    on a relay, a host whose :meth:`~nous_sched.runtime.Host.attach_reader`
    answers True (``run_code``'s: its scheduler's driver) reads the worker's
    answers and steps those that only start tool calls (``_advancer``),
    so a sequential call wakes no thread of the run's; any other answer,
    the deadline, a cancel or an interrupt gives the reader back
    (``nous_sched.runtime._handoffcore``), and this thread goes on.

    The host's hooks (:class:`~nous_sched.runtime.Host`, each with a no-op
    default) watch the run as it goes, on this thread (on the host's driver
    for the steps it reads, in the same order: one thread at a time steps the run):
    ``host.on_main(state)`` gets the program's end as the sandbox reported
    it (the first envelope's ``main`` that has one: untrusted, for the
    run's hints),
    ``host.on_logs(lines)`` gets the log lines each step kept, as the step
    ends (the lines the run's logs hold, budget markers included; not the
    notes the host adds when the run ends), and ``host.on_settled(pending, outcome, payload)``
    gets each call's outcome and its JSON text, in order, just before the
    host reads the step that answer began (the program has it by then).
    A step's calls go to the host inside ``host.batch()``; a question the
    program asks through ``sdk`` goes to ``host.discover``; a durable run's
    clock values and call sites to ``host.clock`` and ``host.sites``.
    """
    book = _LogBook(limits.max_log_bytes, limits.max_log_lines)
    on_logs = host.on_logs
    try:
        return _drive(engine, host, limits, deadline, cancel, book, on_logs)
    except Stopped as stop:
        for text in stop.steps:
            _keep_salvaged(text, book, on_logs)
        if stop.envelope is not None:
            _keep_salvaged(stop.envelope, book, on_logs)
        return Finish(book.lines(), error=(stop.kind, stop.message))


def _keep_salvaged(text: str, book: "_LogBook", on_logs: Any) -> None:
    salvaged = _checked(text)
    if salvaged is not None:
        _keep_logs(salvaged, book, on_logs)


def _drive(
    engine: Steps, host: Host, limits: Any, deadline: float, cancel: Optional[Cancel], book: "_LogBook", on_logs: Any
) -> Finish:
    # (call id, pending call), oldest first: ids grow, so the left end is the oldest.
    outstanding: collections.deque[tuple[int, Any]] = collections.deque()
    steps = _Steps(host, limits, book, on_logs, _submitter(host, outstanding, deadline))
    own = host.deadline
    over = deadline if own is None else min(deadline, own)
    take = _taker(outstanding, engine.max_payload, over)
    settle = engine.settle_many
    relay = engine.relay
    advance = None if relay is None else _advancer(steps, outstanding, cancel, relay)
    attach = host.attach_reader
    # Work the stepper does while its first call runs (the in-process next context; the pool: its next spare).
    idle: Optional[Callable[[Any, Host], None]] = getattr(engine, "idle", None)
    batch: Sequence[Any] = ()
    texts: Sequence[str] = (engine.start(),)
    read = True
    while True:
        if read:
            steps.read(texts, batch)
        read = True
        if cancel is not None and cancel.is_set():
            raise Stopped("cancelled", CANCELLED)
        if not outstanding:
            return _settled_program(steps.state, book, limits)
        batch = take(None)
        relayed = False
        if not batch:
            head = outstanding[0][1]
            if idle is not None and not head.done():
                work, idle = idle, None
                work(head, host)
            if relay is not None and head.on_done(relay.kick):
                # The thread that commits it sends the batch; this one waits for the answers.
                got = relay.settled(take, head, advance, attach)
                if got is None:  # the host's driver read the answers and stepped them
                    read = False
                    continue
                batch = got
                relayed = True
            else:
                outcome = _wait(head, deadline, cancel)
                batch = take(outcome) if outcome is not None else []
            if not batch:
                return _at_deadline(steps.state, book, limits, len(outstanding))
        try:
            texts = relay.answers(batch) if relay is not None and relayed else settle(batch)
        except Stopped as stop:
            steps.answered(batch[: len(stop.steps) + 1])  # (the one it stopped in too, as a lone settle's)
            raise


class _Steps:
    """The host's side of each step, in order: the answer it began with
    (``host.on_settled``), then its envelope: logs kept, new calls handed to
    the host, the program's result noted (``state``) from the first envelope
    that carries it."""

    __slots__ = ("host", "limits", "book", "on_logs", "submit", "on_settled", "on_main", "state")

    def __init__(self, host: Any, limits: Any, book: "_LogBook", on_logs: Any, submit: Any) -> None:
        self.host = host
        self.limits = limits
        self.book = book
        self.on_logs = on_logs
        self.submit = submit
        self.on_settled = host.on_settled
        # The program's end as the sandbox saw it (its result's notes: the run's hints).
        self.on_main = host.on_main
        self.state: Any = None

    def read(self, texts: Sequence[str], batch: Sequence[Any]) -> None:
        """``texts``, the envelopes answering ``batch`` (or the first, ``batch`` empty)."""
        on_settled = self.on_settled if batch else None
        for i, text in enumerate(texts):
            if on_settled is not None:
                item = batch[i]
                on_settled(item[1], item[2], item[4])
            if text == QUIET:
                continue
            self._calls(_step_envelope(text, self.book, self.on_logs, self.host))

    def took(self, text: str, envelope: dict[str, Any], batch: Sequence[Any]) -> None:
        """:meth:`read` of the lone answer ``text`` to ``batch``, already parsed (``envelope``: no durable fields)."""
        item = batch[0]
        self.on_settled(item[1], item[2], item[4])
        if text == QUIET:
            return
        if envelope["logs"] or envelope["dropped"]:
            _keep_logs(envelope, self.book, self.on_logs)
        self._calls(envelope)

    def _calls(self, envelope: dict[str, Any]) -> None:
        unstarted = self.submit(envelope["calls"])
        if self.state is None:
            self.state = envelope["main"]
            if self.state is not None:
                self.on_main(self.state)
        if unstarted:
            _past_deadline(self.state, unstarted, self.book, self.limits)

    def answered(self, batch: Sequence[Any]) -> None:
        """The program received ``batch``'s answers, but the run stopped before its steps were read."""
        for item in batch:
            self.on_settled(item[1], item[2], item[4])


def _advancer(
    steps: _Steps, outstanding: "collections.deque[tuple[int, Any]]", cancel: Optional[Cancel], relay: Relay
) -> Advance:
    """The run's loop from one lone answer to its next wait (:data:`Advance`),
    for the host's driver to run while the run's thread sleeps: only an
    answer that starts tool calls and nothing else (no end, no ``sdk``
    question, no durable fields) is stepped; the rest is the run's thread's."""

    def advance(text: str, batch: Sequence[Any]) -> Any:
        envelope = _checked(text)
        if envelope is None or envelope["main"] is not None or len(envelope) > 4:
            return NOT_STEPPED
        for call in envelope["calls"]:
            if call[1] is None:
                return NOT_STEPPED
        steps.took(text, envelope, batch)
        if (cancel is not None and cancel.is_set()) or not outstanding:
            return None
        head = outstanding[0][1]
        if not head.on_done(relay.kick):
            return None  # it cannot say it settled: the run's thread waits for it
        return head

    return advance


def _taker(
    outstanding: "collections.deque[tuple[int, Any]]", max_payload: Optional[int], over: float = math.inf
) -> Callable[[Any], list[Any]]:
    """``take(first)``: pop the committed prefix of ``outstanding`` as a batch
    of ``(call_id, pending, outcome, ok, payload)`` items, ``payload`` the
    outcome's JSON text; ``first`` is the oldest call's outcome when the
    caller has waited for it (else it is taken only if ``done()``). A payload
    over ``max_payload`` characters only ever goes first (the engine refuses
    it, and that must not cost the calls before it their answers). From the
    run's deadline ``over`` on it takes nothing (``[]``, as when the deadline
    comes first): the program is over, and an answer made then (a wait that
    gave up because of the deadline) must not wake it. Any thread may call
    it while the loop that owns ``outstanding`` waits."""
    popleft = outstanding.popleft
    payload_of = _payload
    monotonic = time.monotonic

    def take(first: Any) -> list[Any]:
        if monotonic() >= over:
            return []
        batch: list[Any] = []
        size = 0
        while outstanding:
            call_id, pending = outstanding[0]
            if first is not None:
                outcome, first = first, None
            else:
                if not pending.done():
                    break
                outcome = pending.wait(0.0)
                if outcome is None:
                    break
            ok, payload = payload_of(outcome)
            if batch and max_payload is not None and len(payload) > max_payload:
                break
            popleft()
            batch.append((call_id, pending, outcome, ok, payload))
            size += len(payload)
            if size >= BATCH_BYTES or len(batch) >= BATCH_CALLS:
                break
        return batch

    _followed(take, outstanding)
    return take


def _followed(take: Any, outstanding: "collections.deque[tuple[int, Any]]") -> None:
    """What a relay reads of ``outstanding`` while the loop that owns it waits
    (``_remote.Relay``: the calls behind a batch in flight join it), set on ``take``."""

    def last() -> Any:
        """The newest outstanding call's pending call, or None (the relay follows it)."""
        return outstanding[-1][1] if outstanding else None

    def undone() -> Any:
        """The oldest outstanding call's pending call not yet ``done()``, or None."""
        for _, pending in outstanding:
            if not pending.done():
                return pending
        return None

    def give_back(batch: list[Any]) -> None:
        """Put a batch just taken back at the head, as it was (a frame that could not go)."""
        outstanding.extendleft([(item[0], item[1]) for item in reversed(batch)])

    take.outstanding = outstanding
    take.last = last
    take.undone = undone
    take.give_back = give_back


def _step_envelope(text: Any, book: "_LogBook", on_logs: Any, host: Any) -> dict[str, Any]:
    """One step's envelope, checked, its log lines kept (and handed to
    ``on_logs``), a durable run's clock values and call sites handed to ``host``."""
    envelope = _checked(text)
    if envelope is None:
        # Only the prelude writes envelopes; a malformed one means the
        # program reached the bridge. Trust nothing more from this context.
        raise Stopped("abort", TAMPERED)
    if envelope["logs"] or envelope["dropped"]:
        _keep_logs(envelope, book, on_logs)
    if len(envelope) > 4:
        _durable(host, envelope)
    return envelope


def _keep_logs(envelope: dict[str, Any], book: "_LogBook", on_logs: Any) -> None:
    before = book.kept()
    book.extend(envelope["logs"], envelope["dropped"])
    if book.kept() > before:
        on_logs(book.since(before))


def _submitter(
    host: Any, outstanding: "collections.deque[tuple[int, Any]]", deadline: float
) -> Callable[[list[Any]], int]:
    """``submit(calls)``: hand one step's new calls to ``host``, oldest first,
    into ``outstanding``, while the run has time; it returns how many the
    deadline left unstarted (the host never sees them).

    A null name is a question about the tools (the program's ``sdk``:
    ``host.discover``). Each call's arguments are JSON text: the host parses
    them under the snapshot rules, one call at a time, so one bad call fails
    alone. A step of more than one call goes inside ``host.batch()``: e.g.
    one message to its scheduler for a Promise.all of 1,000.
    """
    batch = host.batch
    call = host.call_json
    ask = host.discover
    append = outstanding.append
    monotonic = time.monotonic

    def each(calls: list[Any]) -> int:
        for i, (call_id, name, args) in enumerate(calls):
            if monotonic() >= deadline:
                return len(calls) - i
            # Let go of each parsed entry as it is started (the envelope's list is
            # read no more: Engine._calls): a Promise.all's thousand of them, kept
            # to the end of the loop, outlived collections and reached the
            # oldest generation, bringing its full collections on sooner.
            calls[i] = None
            # A null name is a question about the tools (the program's ``sdk``).
            append((call_id, call(name, args) if name is not None else ask(args)))
        return 0

    def submit(calls: list[Any]) -> int:
        if len(calls) > 1:
            with batch():
                return each(calls)
        return each(calls) if calls else 0

    return submit


def _settled_program(state: Any, book: "_LogBook", limits: Any) -> Finish:
    """The end once nothing is outstanding: the program's own, or a wait that nothing will end."""
    if state is not None:
        return _finish(state, book, limits)
    raise Stopped(
        "exception",
        "the program is waiting for a promise that nothing will ever settle: "
        "no tool call is outstanding and no work is queued",
    )


def _at_deadline(state: Any, book: "_LogBook", limits: Any, abandoned: int) -> Finish:
    """The deadline passed while waiting for a call: a settled program ends with
    what it returned (its un-awaited calls abandoned); any other times out."""
    if state is not None:
        book.note(f"[{abandoned} tool call(s) started without await were abandoned at the deadline]")
        return _finish(state, book, limits)
    raise Stopped("timeout", timeout_message(limits.timeout, "waiting for a tool call"))


def _past_deadline(state: Any, unstarted: int, book: "_LogBook", limits: Any) -> None:
    """A step's calls met the deadline: the run ends, with the program's
    result if it has one already."""
    if state is None:
        raise Stopped("timeout", timeout_message(limits.timeout, "starting its tool calls"))
    book.note(f"[{unstarted} tool call(s) were not started: the deadline came first]")


def _wait(pending: Any, deadline: float, cancel: Optional[Cancel]) -> Any:
    """The call's outcome, or ``None`` at the deadline; :class:`Stopped` on cancel."""
    if cancel is None:
        return pending.wait(max(deadline - time.monotonic(), 0.0))
    while True:
        remaining = deadline - time.monotonic()
        outcome = pending.wait(min(max(remaining, 0.0), CANCEL_POLL))
        if outcome is not None:
            return outcome
        if cancel.is_set():
            raise Stopped("cancelled", CANCELLED)
        if remaining <= CANCEL_POLL:
            return None


def _finish(state: dict[str, Any], book: "_LogBook", limits: Any) -> Finish:
    logs = book.lines()
    kind = state["state"]
    if kind == "fulfilled":
        text = state["json"]
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        if size > limits.max_output_bytes:
            return Finish(logs, error=("output_limit", _output_message(size, limits)))
        # Loaded here, never in a worker: the host's rules for what crosses
        # (no Infinity, no integer a double cannot hold, bounded depth).
        from nous_sched.crossing import loads

        try:
            return Finish(logs, result=loads(text))
        except ValueError as exc:  # SnapshotError
            return Finish(logs, error=("invalid_output", clip(f"the program's result cannot cross: {exc}")))
    if kind == "rejected":
        error = state["error"]
        if _is_stack_overflow(error):
            return Finish(logs, error=("abort", stack_message(limits.stack_bytes)))
        if error.startswith("InternalError: out of memory"):
            return Finish(logs, error=("abort", memory_message(limits.memory_bytes)))
        if error == "Uncaught null":
            # QuickJS throws a bare null when it cannot even allocate the
            # out-of-memory error, and by now the memory is freed: nothing
            # tells that apart from a literal `throw null`, so say both.
            detail = " (or it threw a bare null, which QuickJS also raises when it runs out of memory)"
            return Finish(logs, error=("abort", memory_message(limits.memory_bytes, detail)))
        if error == "InternalError: ":
            # An out-of-memory error whose message could not be allocated
            # (rarely, when the limit is hit while the prelude formats a stack).
            detail = " (or it threw an InternalError with no message, which QuickJS raises when it runs out of memory)"
            return Finish(logs, error=("abort", memory_message(limits.memory_bytes, detail)))
        return Finish(logs, error=("exception", clip(error)))
    if kind == "output_limit":
        return Finish(logs, error=("output_limit", _output_message(state["size"], limits)))
    return Finish(logs, error=("invalid_output", clip(str(state["error"]))))


def _output_message(size: int, limits: Any) -> str:
    return f"the program's result is {size} bytes of JSON, over the {limits.max_output_bytes}-byte limit"


class _LogBook:
    """Log lines within a budget; past it, a truncation marker.

    Each line costs its UTF-8 bytes plus one (so empty lines are not free),
    and at most ``max_lines`` lines are kept.
    """

    def __init__(self, max_bytes: int, max_lines: int) -> None:
        self.max_bytes = max_bytes
        self.max_lines = max_lines
        self.used = 0
        self.full = False
        self._lines: list[str] = []
        self._notes: list[str] = []
        self._dropped = 0

    def extend(self, lines: list[str], dropped: int) -> None:
        # `dropped` counts lines the sandbox refused once its own budget was spent.
        self._dropped = dropped
        for line in lines:
            if self.full:
                continue
            if len(self._lines) >= self.max_lines:
                self._lines.append(_TRUNCATED_LINES.format(n=self.max_lines))
                self.full = True
                continue
            data = line.encode("utf-8", "surrogatepass")
            if self.used + len(data) + 1 > self.max_bytes:
                keep = data[: max(self.max_bytes - self.used - 1, 0)].decode("utf-8", "ignore")
                if keep:
                    self._lines.append(keep)
                self._lines.append(_TRUNCATED.format(n=self.max_bytes))
                self.full = True
                continue
            self.used += len(data) + 1
            self._lines.append(line)

    def kept(self) -> int:
        """How many lines the budget has kept so far (markers included, notes not)."""
        return len(self._lines)

    def since(self, start: int) -> list[str]:
        """The kept lines from index ``start`` on."""
        return self._lines[start:]

    def note(self, line: str) -> None:
        """A line from the host itself: always kept, outside the budget."""
        self._notes.append(line)

    def lines(self) -> tuple[str, ...]:
        if self._dropped and not self.full:
            if len(self._lines) >= self.max_lines:
                marker = _TRUNCATED_LINES.format(n=self.max_lines)
            else:
                marker = _TRUNCATED.format(n=self.max_bytes)
            kept: tuple[str, ...] = (*self._lines, marker)
        else:
            kept = tuple(self._lines)
        return (*kept, *self._notes) if self._notes else kept


def _checked(text: Any) -> Optional[dict[str, Any]]:
    """The drained envelope, or ``None`` unless it has exactly the prelude's shape."""
    try:
        text, pieces = _split(text)
        envelope, end = _scan(text, 0)
        if end != len(text):
            return None
        calls, logs, dropped, main = envelope["calls"], envelope["logs"], envelope["dropped"], envelope["main"]
    except (TypeError, ValueError, KeyError, StopIteration):
        return None
    if not (isinstance(calls, list) and isinstance(logs, list) and type(dropped) is int):
        return None
    # Plain loops: all(<generator>) costs a generator per call on the hot path.
    for c in calls:
        if not (
            isinstance(c, list)
            and len(c) == 3
            and type(c[0]) is int
            and (c[1] is None or type(c[1]) is str)
            and (type(c[2]) is str or pieces)
        ):
            return None
    for line in logs:
        if not isinstance(line, str):
            return None
    if main is not None and not (isinstance(main, dict) and main.get("state") in _STATES):
        return None
    if pieces and not _placed(calls, main, pieces):
        return None
    if main is not None and main["state"] == "fulfilled" and type(main.get("json")) is not str:
        return None
    if len(envelope) > 4 and not _durable_fields(envelope):
        return None
    return envelope  # type: ignore[no-any-return]


def _split(text: str) -> tuple[str, list[str]]:
    """The envelope, and the long JSON texts after it, as they are (prelude.js, OUT_OF_LINE)."""
    if _SEP not in text:  # a memchr: most envelopes carry none
        return text, []
    head, *pieces = text.split(_SEP)
    return head, pieces


def _placed(calls: list[Any], main: Any, pieces: list[str]) -> bool:
    """Put each long text in its place (a call's arguments, the result), where
    the envelope holds its index: 0, 1, 2, ... in order, each once. False if not so."""
    # (One plain loop, no list of places: an envelope of a few calls and one
    # long text spent more on making that list than on placing the text.)
    count = len(pieces)
    i = 0
    for c in calls:
        index = c[2]
        if type(index) is str:
            continue
        if type(index) is not int or index != i or i == count:
            return False
        c[2] = pieces[i]
        i += 1
    if main is not None and main["state"] == "fulfilled" and type(main.get("json")) is not str:
        index = main["json"]
        if type(index) is not int or index != i or i == count:
            return False
        main["json"] = pieces[i]
        i += 1
    return i == count


def _durable(host: Any, envelope: dict[str, Any]) -> None:
    """Hand a durable run's new clock values and call sites to its host (one that records them)."""
    if "clock" in envelope:
        host.clock(envelope["clock"])
    if "sites" in envelope:
        host.sites(envelope["sites"])


def _durable_fields(envelope: dict[str, Any]) -> bool:
    """True when a durable run's extra fields have their shape: numbers, and strings."""
    clock, sites = envelope.get("clock", []), envelope.get("sites", [])
    if not (isinstance(clock, list) and isinstance(sites, list)):
        return False
    for value in clock:
        if type(value) not in (int, float):
            return False
    for site in sites:
        if type(site) is not str:
            return False
    return True


_STATES = frozenset({"fulfilled", "rejected", "invalid", "output_limit"})
#: What precedes each long JSON text the prelude sends after the envelope
#: (prelude.js, OUT_OF_LINE): no JSON text holds it unescaped.
_SEP = "\x01"
# The decoder's scanner itself (the C one where there is one), without
# json.loads's layers: an envelope is one JSON value with no whitespace around
# it, so _checked compares the end it reports with the text's length.
_scan: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]

TAMPERED = "the sandbox bridge was tampered with; the run was stopped"
CANCELLED = "the run was cancelled"


def _is_stack_overflow(text: str) -> bool:
    # The engine's own wording, at the start: a ToolError that merely mentions
    # "stack overflow" in its message is the program's exception, not an abort.
    return text.startswith(("RangeError: Maximum call stack size exceeded", "InternalError: stack overflow"))


def stack_message(stack_bytes: int) -> str:
    return f"the program exceeded its {stack_bytes // 1024} KiB stack limit (runaway recursion?) and was stopped"


def memory_message(memory_bytes: int, detail: str = "") -> str:
    mib = memory_bytes / (1024 * 1024)
    return f"the program exceeded its {mib:g} MiB memory limit and was stopped{detail}"


def timeout_message(timeout: float, doing: str) -> str:
    return f"the program exceeded its {timeout:g}s deadline ({doing}) and was stopped"


def cpu_message(cpu_time: float, doing: str) -> str:
    return f"the program used its {cpu_time:g}s of CPU time ({doing}) and was stopped"


def clip(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else text[:limit] + "… (truncated)"

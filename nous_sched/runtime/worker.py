"""The worker process: runs programs for one host, one at a time.

The host (:mod:`nous_sched.runtime.pool`) starts it as::

    python -I -S -B -c BOOT worker.py NAME QUICKJS_PATH LIFELINE_FD

(``procio.BOOT`` loads this file by its path as a module and calls
:func:`main`: a script would be compiled on every start, a module's code is
read from ``__pycache__`` where an install wrote it.)

It imports only the standard library, the C module ``_quickjs`` (by file
path) and ``engine.py`` and ``oslimits.py`` (by file path, beside this file),
never the ``nous_sched`` package. It applies its OS bounds
(:func:`oslimits.apply`), starts its second thread, after which neither of
its two threads can start another task (:func:`oslimits.forbid_tasks`),
prepares its first run's context, says hello (so a worker that has said
hello is ready, and bounded), and serves frames on standard input and
output from one thread whose stack is sized for the largest
``Limits.stack_bytes`` plus a margin, so runaway recursion always stops at the
engine's own stack limit.

Its main thread is the :class:`_Watchdog`. It waits on the *lifeline*, a pipe
the host never writes: when the host dies, it reads end-of-file and the worker
exits at once, whatever the program is doing. And it makes the engine's own
stop fire at the run's *wall-clock* deadline. The binding's only interrupt
counts process CPU time, which a starved worker accrues slower than the clock
runs, so the host's kill would often come first and lose the logs the engine
still held. When a run's deadline passes with no answer, the host sends the
worker ``SIGUSR1``; the watchdog then sets the running call's CPU budget to
zero, in the binding's context struct, and the engine stops at its next
interrupt check (within microseconds, except inside one long builtin call,
which only the host's kill ends). The struct's layout is verified when the
worker starts (:func:`budget_offset`); where it does not match, the signal
does nothing and the engine's CPU-time limit is the soft stop.

Protocol: frames both ways, each a 4-byte big-endian length, then one ASCII
op byte, then the body. Bodies are JSON text, except where noted. Nothing is
ever unpickled.

Host to worker:

* ``R`` run: ``{"program", "names_lazy", "limits": [LIMIT_FIELDS...],
  "remaining": seconds, "memory_cap": bytes or 0, "cpu_limit": seconds or
  null}``; closes any previous run. A first run's ``memory_cap`` sets
  ``RLIMIT_DATA`` for good; ``cpu_limit`` (a run with a CPU budget: the
  budget plus the pool's kill grace) sets ``RLIMIT_CPU`` for good
  (:func:`oslimits.cap_cpu`), so such a worker serves no further run. The
  engine counts the run's CPU on this process's clock, from the program's
  start, inside its steps only (``time.process_time``: the clock of the
  binding's own slice, so the engine stops the program at its budget
  exactly); waiting for the host's next frame costs nothing. A newline
  follows the JSON, then the run's tool names as one JSON array in UTF-8
  (``engine.names_json``: made once per tool set by the host, handed to the
  prelude as it is; ``names_lazy`` says how the prelude may read it). With no
  newline, ``"names_key"`` names a text this worker holds already: the last
  run's (a worker reused), or, at its first run, one its fork server held when
  it forked it (see :func:`_keep_names`); a worker that holds no text of that
  key exits, and the host starts the run again on another worker, sending the
  text. Without either, the JSON's ``"names"`` list. At its first run a
  fork server's child unmaps every text it inherited before anything of the
  run is done: no program ever runs beside another tool set's names.
* ``S`` settle: one or more calls, oldest first, each ``b"<call id> <1|0>
  <n> "`` then the ``n`` bytes of its payload's JSON text (the value, or the
  ``{tool, message}`` error). The worker settles them one at a time, running
  the jobs each wakes before the next (exactly as that many frames of one
  call would), and answers each. A batch may come as several frames, one
  behind the other (the host's relay joins a burst's later calls to the
  frame in flight); a settle frame that finds no run (it stopped in an
  earlier frame of its batch) is read and not answered.
* ``D`` done: free the run's context. No answer. The worker then frees it and
  prepares the next run's context as ``SCHED_BATCH``, after yielding, so this
  work never preempts the host (see :func:`_between_runs`).

Worker to host (exactly one answer to each ``R`` and to each call an ``S``
settles, a batch's answers in one write):

* ``H`` hello, once, when the worker is ready: bounded, and the first run's
  context prepared: ``{"pid", "os_bounds", "prepared"}`` (``prepared``: false
  if that failed; the run then makes its own).
* ``E`` envelope: the prelude's envelope text, unchanged.
* ``X`` stopped: ``{"kind", "message", "memory"}``, a newline, then the
  salvaged envelope text (possibly empty). The run's context is gone; the
  calls of its batch after the one it stopped in get no answer.
* ``F`` fatal: a message (the worker could not start); then it exits.
"""

from __future__ import annotations

import errno
import os
import struct
import sys
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    import mmap

HEADER = struct.Struct(">I")
RUN = b"R"
SETTLE = b"S"
DONE = b"D"
HELLO = b"H"
ENVELOPE = b"E"
STOPPED = b"X"
FATAL = b"F"

#: The order of the limits in a ``R`` frame.
LIMIT_FIELDS = (
    "timeout",
    "memory_bytes",
    "stack_bytes",
    "max_log_bytes",
    "max_output_bytes",
    "max_args_bytes",
    "max_log_lines",
    "max_calls",
    "max_total_args_bytes",
    "cpu_time",
)
#: The largest ``Limits.stack_bytes`` (nous_sched.Limits refuses more).
MAX_STACK_BYTES = 4 * 1024 * 1024
#: The JS thread's stack beyond the engine's limit: the interpreter's own
#: frames below the engine, and C code that overshoots the limit check.
STACK_MARGIN = 2 * 1024 * 1024
JS_STACK = MAX_STACK_BYTES + STACK_MARGIN
#: The exit status of a worker that ran out of memory outside the engine.
EXIT_MEMORY = 3
#: A spawn request's flag: the child boots in the background (see :func:`_boot_policy`).
BACKGROUND = b"background"
#: How often a fork server with children looks for exited ones when no
#: message comes, and for how many looks after its last message (then it
#: sleeps until the next: see :func:`_fork_server`).
REAP_EVERY = 0.5
REAP_LOOKS = 4
#: A fork server's cache of names texts (see :func:`_keep_names`): at most this
#: many tool sets, and this many bytes of their texts in all; a longer text is
#: not kept (its runs carry it in their run frames).
NAMES_ENTRIES = 8
NAMES_BYTES = 16 << 20
#: The shortest names text a host offers a fork server: a shorter one costs its
#: run frame less than an offer costs the server, and must not push out the
#: texts of large tool sets (about 150 tools at 25 bytes a name).
NAMES_OFFER_MIN = 4096
#: A names offer's op (host to fork server): ``N <key> <length>`` and one descriptor.
NAMES = b"N"
#: The most pages a fork server's children write ahead (see :func:`_rehearse`).
WRITE_AHEAD_PAGES = 1024
#: ``madvise``'s ``MADV_POPULATE_READ`` and ``MADV_POPULATE_WRITE`` (Linux
#: 5.14): read- or write-fault a range in one call.
_POPULATE_READ = 22
_POPULATE_WRITE = 23
#: The rehearsal's run (see :func:`_rehearse`): a fan-out's first step, 50
#: calls at once, each with an object for its arguments (the first an empty
#: one, as most one-call steps have). A one-call step writes about the pages
#: its first call writes here; the other 49 add about 40, mostly fresh heap,
#: which each spare then writes ahead too (about 0.16 MiB and 70 us of its
#: boot) so that a fan-out's step does not fault on them.
REHEARSAL = "const r = await Promise.all(Array.from({ length: 50 }, (_, i) => tools.noop(i ? { i } : {}))); return r;"
#: Seconds a fork server gives its rehearsal (it takes about 6 ms) before going on without it.
REHEARSAL_TIMEOUT = 2.0
#: Bytes a fork server takes from its heap and gives back after its trim
#: (see :func:`_trim`): the heap's top then holds them and glibc's top pad
#: (128 KiB), pages it never wrote, where a run's first step puts its new
#: objects (a 50-call fan-out's step about 150 KB).
HEAP_HEADROOM = 64 << 10
#: The largest mapping a rehearsal looks at (its pagemap is read twice).
_REHEARSAL_REGION = 64 << 20
#: The rehearsal's address-space cap (bytes over none in use: see oslimits.cap_memory).
_REHEARSAL_CAP = 1 << 44
#: The rehearsal run's limits (the defaults of ``nous_sched.Limits``, in
#: :data:`LIMIT_FIELDS` order; only which pages a step writes depends on them).
_REHEARSAL_LIMITS = (30.0, 256 << 20, 1 << 20, 1000000, 1000000, 1000000, 10000, 1000, 4000000, None)
#: The test-only payload's file (see :func:`_test_payload`).
PAYLOAD_ENV = "NOUS_SCHED_TEST_PAYLOAD"


def frame(op: bytes, *parts: bytes) -> bytes:
    """One frame whose body is ``parts`` joined (copied once)."""
    return b"".join((HEADER.pack(sum(map(len, parts)) + 1), op, *parts))


def write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    if written < len(data):  # a frame bigger than the pipe's buffer
        view = memoryview(data)[written:]
        while view:
            view = view[os.write(fd, view) :]


#: A frame longer than this is read straight into a buffer of its size (one copy,
#: not one per read and more as the buffer grows): a long program's, or the
#: names of thousands of tools.
_LARGE = 1 << 16


def settle_items(body: bytes) -> list[tuple[int, None, None, bool, str]]:
    """The calls a settle frame's body carries, in order, as the engine's
    ``settle_many`` items: per call ``<id> <1|0> <bytes> `` then that many
    bytes of payload (UTF-8). ``ValueError`` if the body is not that."""
    if len(body) < _LARGE and body.isascii():
        # The usual batch (short ASCII JSON, with no space in it): one decode
        # and one split, not three searches and a decode per call. Each
        # payload is the head of the token after its length, and the rest of
        # that token the next call's id. A payload with a space in it makes
        # its token shorter than its length: that body is read call by call.
        parts = body.decode("ascii").split(" ")
        if len(parts) % 3 == 1:
            items: list[tuple[int, None, None, bool, str]] = []
            append = items.append
            call_id = parts[0]
            for k in range(1, len(parts), 3):
                n = int(parts[k + 1])
                rest = parts[k + 2]
                if not 0 <= n <= len(rest):
                    break
                append((int(call_id), None, None, parts[k] == "1", rest[:n]))
                call_id = rest[n:]
            else:
                if not call_id:
                    return items
    return _settle_items_each(body)


def _settle_items_each(body: bytes) -> list[tuple[int, None, None, bool, str]]:
    """:func:`settle_items`, each call's fields found and its payload decoded on its own."""
    items: list[tuple[int, None, None, bool, str]] = []
    view = memoryview(body)
    at, end = 0, len(body)
    index = body.index
    while at < end:
        first = index(b" ", at)
        second = index(b" ", first + 1)
        third = index(b" ", second + 1)
        start = third + 1
        stop = start + int(body[second + 1 : third])
        if stop > end:
            raise ValueError("a settle frame cut short")
        ok = body[first + 1 : second] == b"1"
        items.append((int(body[at:first]), None, None, ok, str(view[start:stop], "utf-8", "surrogatepass")))
        at = stop
    return items


class _Reader:
    """Frames from a blocking descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()

    def read(self) -> tuple[bytes, bytes]:
        buf = self.buf
        if not buf:
            # The usual case: one read brings exactly one whole frame.
            data = os.read(self.fd, 65536)
            if not data:
                raise EOFError
            if len(data) >= 5 and HEADER.unpack_from(data)[0] == len(data) - 4:
                return data[4:5], data[5:]
            buf += data
        while True:
            if len(buf) >= 4:
                (n,) = HEADER.unpack_from(buf)
                if len(buf) >= 4 + n:
                    op = bytes(buf[4:5])
                    body = bytes(buf[5 : 4 + n])
                    del buf[: 4 + n]
                    return op, body
                if n > _LARGE and len(buf) >= 5:
                    return self._read_large(n)
            data = os.read(self.fd, 65536)
            if not data:
                raise EOFError
            buf += data

    def _read_large(self, n: int) -> tuple[bytes, bytes]:
        # A big payload: read it straight into one buffer of its size, so the
        # worker holds one copy of it, not three.
        body = bytearray(n - 1)
        have = len(self.buf) - 5
        body[:have] = self.buf[5:]
        op = bytes(self.buf[4:5])
        self.buf = bytearray()
        view = memoryview(body)
        while have < len(body):
            got = os.readv(self.fd, [view[have:]])
            if not got:
                raise EOFError
            have += got
        return op, body  # type: ignore[return-value]


#: prctl taking a name, made once by a fork server (see :func:`_name_setter`).
_NAMER: Any = None
#: ``madvise``, declared (made by a fork server, inherited ready by its children).
_MADVISE: Any = None


def _name_setter() -> Any:
    """``prctl`` declared to take a name (bytes) as its second argument."""
    import ctypes

    call = ctypes.CDLL(None).prctl
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    call.restype = ctypes.c_int
    return call


def _set_thread_name(name: str, libc: Any = None) -> None:
    # prctl(PR_SET_NAME): what `top -H` and /proc/<pid>/task/*/comm show (15 bytes).
    # (``libc``: oslimits' own, made once in a fork server; its prctl takes numbers.)
    if _NAMER is not None:  # (in a fork server's child: nothing to make)
        _NAMER(15, name.encode()[:15], 0, 0, 0)
        return
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            if libc is None:
                libc = ctypes.CDLL(None)
            name_buf = ctypes.create_string_buffer(name.encode()[:15])
            libc.prctl(15, ctypes.c_ulong(ctypes.addressof(name_buf)), 0, 0, 0)
        except Exception:
            pass


def _load(name: str, path: str, extension: bool = False) -> Any:
    # (The functions importlib.machinery and importlib.util re-export, from
    # the import system's frozen modules: see procio.BOOT.)
    import _frozen_importlib
    import _frozen_importlib_external

    loader = _frozen_importlib_external.ExtensionFileLoader(name, path) if extension else None
    spec = _frozen_importlib_external.spec_from_file_location(name, path, loader=loader)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name} from {path}")
    module = _frozen_importlib.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class _Watchdog:
    """Stops the engine at the run's wall-clock deadline; exits when the host dies.

    It runs on the main thread, which otherwise blocks reading the lifeline.
    The host sends ``SIGUSR1`` when a run's deadline passes with no answer;
    the handler (on the main thread, while the serving thread is inside the
    engine without the GIL) zeroes the running call's CPU budget. Nothing
    happens per run but two assignments under ``_lock``, which guards
    ``_target`` and is held while the budget is zeroed, so the handler never
    writes into a freed context; a late signal finds its run gone, or a run
    whose deadline is still ahead, and does nothing. A run that stopped
    disarms it before its logs are drained (the engine's ``before_salvage``):
    the host's signal often lands just as the engine stops itself, and would
    otherwise cut the drain short and lose every line the program printed.
    """

    def __init__(self, lifeline: int, offset: Any) -> None:
        import _thread

        self._lifeline = lifeline
        self.offset = offset  # of the running call's CPU budget in the context, or None
        self._lock = _thread.allocate_lock()
        self._target: Any = None  # (engine, deadline)

    def arm(self, engine: Any, deadline: float) -> None:
        with self._lock:
            self._target = (engine, deadline)

    def disarm(self) -> None:
        with self._lock:
            self._target = None

    def _on_deadline(self, signum: int, frame: Any) -> None:
        import signal
        import time

        if self.offset is None:
            return
        with self._lock:
            target = self._target
            if target is None:
                return
            if signum != signal.SIGUSR2 and time.monotonic() < target[1]:
                return
            import ctypes

            ctx = target[0].ctx
            if ctx is not None:
                ctypes.c_int64.from_address(id(ctx) + self.offset).value = 0
            del ctx, target

    def install(self) -> None:
        """On the main thread, before any run: from here on ``SIGUSR1`` is ours."""
        import _signal  # type: ignore[import-not-found]  # (the C module: see _become_worker)

        _signal.signal(_signal.SIGUSR1, self._on_deadline)
        _signal.signal(_signal.SIGUSR2, self._on_deadline)  # cancelled: stop whatever the deadline

    def watch(self) -> None:
        """Serve the deadline signal until the host is gone (end of file)."""
        while True:
            try:
                if not os.read(self._lifeline, 1):
                    os._exit(0)
            except OSError:
                os._exit(0)


def budget_offset(quickjs: Any) -> Any:
    """Where the binding keeps the running call's CPU budget in a context
    (quickjs-ng's ``RuntimeData.interrupt_data.limit``), or ``None`` unless
    the layout is exactly the one expected."""
    import ctypes

    if ctypes.sizeof(ctypes.c_long) != 8 or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    try:
        ctx = quickjs.Context()
        base = id(ctx)

        def i32(offset: int) -> int:
            return ctypes.c_int32.from_address(base + offset).value

        def i64(offset: int) -> int:
            return ctypes.c_int64.from_address(base + offset).value

        # runtime and context pointers, has_time_limit, time_limit, then interrupt_data {start, limit}.
        if not i64(16) or not i64(24) or i32(32) != 0:
            return None
        ctx.set_time_limit(12.5)
        if i32(32) != 1 or i64(40) != 12_500_000:
            return None
        ctx.eval("1")
        if i64(64) != 12_500_000:
            return None
        ctx.set_time_limit(7.25)
        ctx.eval("2")
        if i64(64) != 7_250_000 or i64(40) != 7_250_000:
            return None
        ctx.set_time_limit(-1)
        if i32(32) != 0:
            return None
        return 64
    except Exception:
        return None


def _random_offset(quickjs: Any) -> Any:
    """Where a context keeps ``Math.random``'s state (quickjs-ng's
    ``JSContext.random_state``, a xorshift64* state), as an offset into the
    context struct the binding points to, or ``None`` unless exactly one
    place behaves so and a state written there is the one ``Math.random``
    then draws from. A fork server uses it to give each child's copy of the
    context it prepared a fresh seed (:func:`_reseed`)."""
    import ctypes

    if ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    mask = (1 << 64) - 1

    def step(state: int) -> tuple[int, float]:
        state ^= state >> 12
        state ^= (state << 25) & mask
        state ^= state >> 27
        out = (state * 0x2545F4914F6CDD1D) & mask
        return state, struct.unpack("<d", struct.pack("<Q", 0x3FF << 52 | out >> 12))[0] - 1.0

    try:
        ctx = quickjs.Context()
        base = ctypes.c_void_p.from_address(id(ctx) + 24).value
        if not base:
            return None
        words = range(0, 1024, 8)  # (the struct is larger; the state lies well within)
        before = [ctypes.c_uint64.from_address(base + at).value for at in words]
        drawn = ctx.eval("Math.random()")
        found = [
            at
            for at, old in zip(words, before, strict=True)
            if step(old) == (ctypes.c_uint64.from_address(base + at).value, drawn)
        ]
        if len(found) != 1:
            return None
        for seed in (0x9E3779B97F4A7C15, 12345):
            ctypes.c_uint64.from_address(base + found[0]).value = seed
            if ctx.eval("Math.random()") != step(seed)[1]:
                return None
        return found[0]
    except Exception:
        return None


def _reseed(prepared: Any, at: int) -> None:
    """A fresh ``Math.random`` seed for this process's copy of a context its
    fork server prepared (every child would otherwise draw the same numbers)."""
    import ctypes

    base = ctypes.c_void_p.from_address(id(prepared[0]) + 24).value
    if base:
        ctypes.c_uint64.from_address(base + at).value = int.from_bytes(os.urandom(8), "little") | 1


def _prepare(engine: Any, shared: bool = False) -> Any:
    try:
        return engine.prepare(shared)
    except Exception:  # the run's Engine tries again, and reports what stops it
        return None


def _between_runs(engine: Any, done: Any, prepare: bool) -> Any:
    """Free the finished run's engine ``done`` (or ``None``) and, if ``prepare``,
    the next run's context; that context, or ``None``.

    This is most of a worker's CPU per run (the prelude's compilation alone
    is about 0.6 ms), and none of it is urgent: the next run usually goes to
    another worker. So it must not take the CPU from the host, which is
    finishing the run that just ended. Woken by ``D`` on the host's CPU, the
    thread would preempt the host for the whole preparation; instead it
    yields first and works as ``SCHED_BATCH`` (no preemption on wake-up, the
    same CPU share), then returns to the normal policy, which an unprivileged
    thread may do, so the next run's frames wake it as promptly as ever.
    """
    batch = _SCHED_BATCH is not None and _set_policy(_SCHED_BATCH)
    try:
        os.sched_yield()
        if done is not None:
            done.close()
            del done
        return _prepare(engine) if prepare else None
    finally:
        if batch:
            _set_policy(_SCHED_OTHER)


_SCHED_BATCH = getattr(os, "SCHED_BATCH", None)
_SCHED_OTHER = getattr(os, "SCHED_OTHER", 0)


def _boot_policy() -> Any:
    """The policy a worker booting in the background works at until it is
    ready, or ``None`` where there is none: ``SCHED_BATCH``, so the boot of a
    spare never preempts a run's threads when it wakes (the fork server's
    answer, the host's frames). Not ``SCHED_IDLE``: on a loaded machine an
    idle-policy boot can starve for as long as other work runs, and a run may
    be waiting for that spare. Each thread sets it for its own boot work and
    returns to the normal policy before the worker says hello
    (:func:`_set_policy`; any thread may leave ``SCHED_BATCH``)."""
    return _SCHED_BATCH


def _set_policy(policy: int) -> bool:
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))  # 0: this thread (Linux)
    except (AttributeError, OSError):
        return False
    return True


#: ``(loads, dumps)`` for the worker's own frames, made once per process (see :func:`_json`).
_JSON: Optional[tuple[Any, Any]] = None


def _json() -> tuple[Any, Any]:
    """``(loads, dumps)``: ``json.loads`` of a frame's UTF-8 JSON text and
    ``json.dumps`` of a value, the same text as theirs, made the first time
    they are asked for: the json module's own C scanner and encoder, called
    directly. ``json.loads`` and ``json.dumps`` make or look up more objects
    on each call (the decoder's regular expressions, an encoder per call):
    in a fork server's child, whose pages are the server's until written,
    their first calls cost about 100 copied pages (0.25 ms of CPU) more."""
    global _JSON
    if _JSON is not None:
        return _JSON
    import json.decoder
    import json.encoder
    import json.scanner

    make_encoder = getattr(json.encoder, "c_make_encoder", None)
    if getattr(json.scanner, "c_make_scanner", None) is None or make_encoder is None:  # (no C accelerator)
        _JSON = (json.loads, json.dumps)
        return _JSON
    scan = getattr(json.decoder.JSONDecoder(), "scan_once")  # noqa: B009 - (typeshed does not declare it)
    default = json.encoder.JSONEncoder().default
    encode = make_encoder({}, default, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False, True)

    def loads(data: bytes) -> Any:
        return scan(data.decode("utf-8", "surrogatepass"), 0)[0]

    def dumps(value: Any) -> str:
        return "".join(encode(value, 0))

    _JSON = (loads, dumps)
    return _JSON


#: The class of a run's limits, made once per process (see :func:`_limits_type`).
_LIMITS: Any = None


def _limits_type() -> Any:
    """A named tuple of :data:`LIMIT_FIELDS` (what :class:`Engine` reads),
    made the first time it is asked for: ``namedtuple`` compiles the class's
    source, about 60 us, which a fork server pays once for all its children."""
    global _LIMITS
    if _LIMITS is None:
        import collections

        _LIMITS = collections.namedtuple("Limits", LIMIT_FIELDS)  # type: ignore[misc]
    return _LIMITS


class _Server:
    """The serving thread's state: the running engine, the next run's context."""

    def __init__(
        self, engine: Any, oslimits: Any, watchdog: _Watchdog, fd_out: int, payload: Any, prepared: Any = None
    ) -> None:
        self.engine = engine
        self.oslimits = oslimits
        self.watchdog = watchdog
        self.fd_out = fd_out
        self.payload = payload
        self.Limits = _limits_type()
        self.current: Any = None
        # (key, text) of the last run's names: a reused worker's next run of the same set needs no text.
        self.kept: Optional[tuple[bytes, str]] = None
        # A quiet step's envelope (most of a Promise.all's) and its frame, made once.
        self.quiet = (engine.QUIET, frame(ENVELOPE, engine.QUIET.encode()))
        # The next run's fresh context, its prelude evaluated while this worker
        # waits (the prelude's compilation is most of a run's start-up); a new
        # worker has prepared its first before it said hello.
        self.spare = prepared if prepared is not None else _prepare(engine)

    def settle(self, body: bytes) -> bytes:
        """Settle every call the frame carries, in order, each a step of its
        own (the engine's ``settle_many``); an ``E`` frame for each, joined."""
        if len(body) < _LARGE:
            # The usual frame: one call (its payload is all that follows the third space).
            parts = body.split(b" ", 3)
            if len(parts) == 4 and len(parts[3]) == int(parts[2]):
                text = self.current.settle(int(parts[0]), parts[1] == b"1", parts[3].decode("utf-8", "surrogatepass"))
                if text == self.quiet[0]:
                    return self.quiet[1]
                data = text.encode("utf-8", "surrogatepass")
                return b"".join((HEADER.pack(len(data) + 1), ENVELOPE, data))
        items = settle_items(body)
        del body
        texts = self.current.settle_many(items)
        quiet, quiet_frame = self.quiet
        return b"".join(
            [quiet_frame if text == quiet else frame(ENVELOPE, text.encode("utf-8", "surrogatepass")) for text in texts]
        )

    def run(self, body: bytes) -> bytes:
        import time

        if self.current is not None:
            self.watchdog.disarm()
            self.current.close()
            self.current = None
        # (Compact JSON holds no raw newline: the first one ends it, the names' text follows.)
        end = body.find(b"\n")
        spec = _json()[0](body[:end] if end >= 0 else body)
        names = self._names(spec, body, end)
        if spec["memory_cap"]:
            self.oslimits.cap_memory(spec["memory_cap"])
        if spec.get("cpu_limit"):
            self.oslimits.cap_cpu(spec["cpu_limit"])
        if self.payload is not None:
            spec["program"] = _run_payload(self.payload, spec["program"])
        deadline = time.monotonic() + spec["remaining"]
        self.current = self.engine.Engine(
            spec["program"],
            names,
            self.Limits(*spec["limits"]),
            deadline,
            self.spare,
            before_salvage=self.watchdog.disarm,
            cpu_clock=time.process_time,
        )
        self.spare = None
        self.watchdog.arm(self.current, deadline)
        return frame(ENVELOPE, str(self.current.start()).encode("utf-8", "surrogatepass"))

    def _names(self, spec: dict[str, Any], body: bytes, end: int) -> Any:
        """The run's names (an engine's ``names``): the text after the JSON,
        or the one held under ``names_key``; every inherited text is unmapped
        first (see :func:`_forget_names`). ``ValueError`` if none is held:
        this worker then exits (the host sends the text to another)."""
        key = spec.get("names_key")
        if key is not None:
            key = key.encode("ascii")
        if end >= 0:
            # (Decoded from the frame in place: a long text is copied once, into the str.)
            text = str(memoryview(body)[end + 1 :], "utf-8")
        elif key is None:
            _forget_names()
            return spec["names"]
        elif self.kept is not None and self.kept[0] == key:
            text = self.kept[1]
        else:
            held = _NAMES_HELD.get(key)
            if held is None:
                _forget_names()
                raise ValueError("a run frame named names this worker does not hold")
            with memoryview(held) as view:
                text = str(view, "utf-8")
        _forget_names()
        self.kept = None if key is None else (key, text)
        return self.engine.NamesText((text, spec["names_lazy"]))

    def done(self) -> None:
        done, self.current = self.current, None
        if done is not None:
            self.watchdog.disarm()
        self.spare = _between_runs(self.engine, done, self.spare is None) or self.spare

    def stopped(self, stop: Any) -> bool:
        """Answer ``X`` for a stopped run; whether to prepare the next context."""
        import json

        self.current = None
        self.watchdog.disarm()
        head = json.dumps({"kind": stop.kind, "message": stop.message, "memory": stop.memory})
        tail = stop.envelope or ""
        # The settles of its batch before the stop answered as usual, in the same write.
        done = [frame(ENVELOPE, text.encode("utf-8", "surrogatepass")) for text in stop.steps]
        done.append(frame(STOPPED, (head + "\n" + tail).encode("utf-8", "surrogatepass")))
        write_all(self.fd_out, b"".join(done))
        # After a memory stop the host retires this worker: prepare nothing.
        return self.spare is None and not stop.memory

    def out_of_memory(self) -> None:
        # Outside the engine's own accounting (a huge payload's copies): the
        # OS limit. Say so, and let the host retire this worker.
        self.watchdog.disarm()
        self.current = None
        head = '{"kind": "abort", "message": "the worker process ran out of memory", "memory": true}\n'
        write_all(self.fd_out, frame(STOPPED, head.encode()))


def serve(
    engine: Any,
    oslimits: Any,
    watchdog: _Watchdog,
    fd_in: int,
    fd_out: int,
    payload: Any = None,
    prepared: Any = None,
) -> None:
    """Answer frames until the host closes the pipe. ``prepared``: the first
    run's context, from :func:`_prepare` (made here when ``None``)."""
    server = _Server(engine, oslimits, watchdog, fd_out, payload, prepared)
    reader = _Reader(fd_in)
    steps = {SETTLE: server.settle, RUN: server.run}
    while True:
        try:
            op, body = reader.read()
        except EOFError:
            os._exit(0)
        except MemoryError:  # half a frame read: the stream cannot be trusted any more
            os._exit(EXIT_MEMORY)
        if op == DONE:
            server.done()
            continue
        done = server.current
        if op == SETTLE and done is None:
            # A batch's later frame, written behind one its run stopped in (the
            # host's relay joins a burst's calls to the frame in flight): that
            # run is over, and its host reads no answer to this one.
            continue
        try:
            step = steps.get(op)
            if step is None:
                raise ValueError(f"unknown op {op!r}")
            answer = step(body)
        except engine.Stopped as stop:
            prepare = server.stopped(stop)
        except MemoryError:
            server.out_of_memory()
            continue
        else:
            write_all(fd_out, answer)  # a batch's answers in one write: one wake-up for the host
            continue
        # Out of the except block, whose exception's traceback holds the engine's frames.
        server.spare = _between_runs(engine, done, prepare) or server.spare
        del done


#: The names texts this process holds, key -> a read-only shared mapping of
#: the text, least recently offered first: a fork server's cache (see
#: :func:`_keep_names`), which each child inherits and unmaps at its first run
#: (:func:`_forget_names`).
_NAMES_HELD: dict[bytes, Any] = {}


def _forget_names() -> None:
    """Unmap every names text this process inherited from its fork server."""
    if _NAMES_HELD:
        for held in _NAMES_HELD.values():
            held.close()
        _NAMES_HELD.clear()


def keep_newest(kept: dict[bytes, Any], key: bytes, text: Any) -> list[Any]:
    """A names cache's rule, for a fork server's (:func:`_keep_names`) and for
    the host's record of what it sent one (``procio.ForkServer.names_sent``),
    so the two agree: ``text`` (its length its size) kept under ``key`` as the
    most recent of ``kept`` (least recently offered first), then the least
    recent dropped until at most :data:`NAMES_ENTRIES` texts of
    :data:`NAMES_BYTES` bytes in all remain; the texts dropped. A text longer
    than :data:`NAMES_BYTES` is not kept, and drops nothing."""
    if len(text) > NAMES_BYTES:
        return []
    kept.pop(key, None)
    kept[key] = text
    dropped: list[Any] = []
    total = sum(map(len, kept.values()))
    while len(kept) > NAMES_ENTRIES or total > NAMES_BYTES:
        gone = kept.pop(next(iter(kept)))
        total -= len(gone)
        dropped.append(gone)
    return dropped


def _keep_names(msg: bytes, fd: int, key_of: Any) -> None:
    """A fork server's names offer (``N <key> <length>`` and a memfd holding
    the text): keep a copy of the text in memory of its own (an anonymous
    mapping, no descriptor, which no one else can write), so every
    child forked from now on holds it and its run frame needs only the key.
    Kept only if ``key_of`` (the engine's ``names_key``) of the copy is the
    key; at most :data:`NAMES_ENTRIES` texts and :data:`NAMES_BYTES` bytes,
    the least recently offered dropped first. The descriptor is closed."""
    import mmap

    held = None
    try:
        parts = msg.split()
        if len(parts) != 3:
            return
        key, size = parts[1], int(parts[2])
        if key in _NAMES_HELD:
            _NAMES_HELD[key] = _NAMES_HELD.pop(key)  # (offered again: the most recent)
            return
        if not 0 < size <= NAMES_BYTES or os.fstat(fd).st_size != size:
            return
        # (Private: written here, each child gets the pages' entries at its fork,
        # so reading its copy takes no page fault; a shared mapping's would.)
        held = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
        with memoryview(held) as view:
            at = 0
            while at < size:
                got = os.preadv(fd, [view[at:]], at)
                if not got:
                    raise ValueError("a names offer cut short")
                at += got
        if key_of(held) != key:
            return
        kept, held = held, None
        for dropped in keep_newest(_NAMES_HELD, key, kept):
            dropped.close()
    except (ValueError, OSError, MemoryError):
        pass
    finally:
        if held is not None:
            held.close()
        os.close(fd)


def _run_payload(payload: Any, program: str) -> str:
    """The tests' compromised-engine stand-in (see :func:`_test_payload`): run
    it, native calls and all, inside the run, after every bound applies; the
    program becomes its report. Only a program marked ``/*payload*/`` runs it."""
    import json

    if "/*payload*/" not in program:
        return program
    scope: dict[str, Any] = {"report": {}, "program": program}
    try:
        exec(payload, scope)
    except BaseException as exc:  # the payload's own failure is its report
        scope["report"]["payload_error"] = repr(exc)
    return "return " + json.dumps(scope["report"]) + ";"


def _load_all(quickjs_path: str) -> tuple[Any, Any, Any]:
    """The engine's modules, and everything serve() imports, before the OS
    bounds forbid opening files; a ``F`` frame and exit if that fails."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        quickjs = _load("_quickjs", quickjs_path, extension=True)
        engine = _load("nous_sched_engine", os.path.join(here, "engine.py"))
        oslimits = _load("nous_sched_oslimits", os.path.join(here, "oslimits.py"))
        import collections  # noqa: F401
        import ctypes  # noqa: F401
        import json  # noqa: F401
        import resource  # noqa: F401
        import select  # noqa: F401
        import signal  # noqa: F401
        import struct  # noqa: F401
        import time  # noqa: F401

        _import_without_fork_hook("threading")
    except BaseException as exc:
        write_all(1, frame(FATAL, f"the worker could not load the engine: {exc!r}".encode("utf-8", "replace")))
        os._exit(1)
    return quickjs, engine, oslimits


def _import_without_fork_hook(name: str) -> None:
    """Import ``name`` (for what a run may import later, when the bounds
    forbid opening its file) without the hook it registers with
    ``os.register_at_fork``. ``threading``'s would run in every child of a
    fork server, and cost each about 0.4 ms of CPU, most of it faults that
    copy the pages of the module's objects it touches, to set right a state
    that is right already: a fork server has one thread and starts none
    through ``threading``, its children start theirs with ``_thread`` (the
    task bound refuses any further one) and end with ``os._exit``."""
    if name in sys.modules or not hasattr(os, "register_at_fork"):
        __import__(name)
        return
    register = os.register_at_fork
    os.register_at_fork = lambda **hooks: None
    try:
        __import__(name)
    finally:
        os.register_at_fork = register


def _test_payload() -> Any:
    """The compromised-engine stand-in of the project's tests, or ``None``.

    Read from the file named by ``NOUS_SCHED_TEST_PAYLOAD`` in the worker's
    environment, which the host passes on only from its own environment (no
    program can set it), and compiled before the bounds apply; run once
    they do, as native code would run inside a compromised engine."""
    path = os.environ.pop(PAYLOAD_ENV, None)
    if not path:
        return None
    with open(path, encoding="utf-8") as fh:
        return compile(fh.read(), path, "exec")


def _become_worker(
    name: str,
    lifeline: int,
    modules: tuple[Any, Any, Any],
    options: dict[str, Any],
    offset: Any = False,
    prepared: Any = None,
) -> None:
    """Bound this process and serve frames on standard input and output; never
    returns. ``prepared``: the first run's context, its prelude evaluated by
    the fork server (and reseeded here); made here when ``None``."""
    import _signal
    import _thread

    # (The signal module's C half, not signal.py: its wrappers convert every
    # number to an enum member, and in a fork server's child the first such
    # conversion costs about 40 copied pages, 0.1 ms of CPU.)
    quickjs, engine, oslimits = modules
    # A spare's boot works at the lowest priority; every thread is back to
    # the normal policy before the worker says hello.
    boot = _boot_policy() if options.get("background") else None
    if boot is not None:
        _set_policy(boot)
    # The terminal's Ctrl-C is the host's to handle: it kills this worker if it must.
    # (A fork server's child inherits the server's SIG_IGN.)
    if _signal.getsignal(_signal.SIGINT) != _signal.SIG_IGN:
        _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    libc = oslimits.c_library() if sys.platform.startswith("linux") else None
    _set_thread_name(name.replace("nous-sched-worker-", "nous-worker-"), libc)
    # (A fork server read it once for all its children.)
    payload = options["payload"] if "payload" in options else _test_payload()
    if prepared is not None:
        _reseed(prepared, options["seed_at"])
    # (A fork server verified the layout once for all its children.)
    watchdog = _Watchdog(lifeline, budget_offset(quickjs) if offset is False else offset)
    engine.load_gc_threshold()  # (before the filter: it opens the binding's library; a fork server's child has it)
    own_session = os.getsid(0) == os.getpid()  # (before the filter, which refuses getsid)
    autogroup = options["autogroup"] if "autogroup" in options else _autogroup()
    bounds = oslimits.apply(
        uid=options.get("uid", oslimits.UNPRIVILEGED),
        gid=options.get("gid", oslimits.UNPRIVILEGED),
        namespaces=options.get("namespaces", True),
        root=options.get("root"),
        parent=options.get("parent"),
    )
    bounds["wall_clock_stop"] = watchdog.offset is not None
    bounds["own_session"] = own_session
    bounds["autogroup"] = autogroup
    tasks = options.get("task_bound", True)
    # Released once the main thread can make no more tasks: no program runs before.
    main_bound = _thread.allocate_lock()
    main_bound.acquire()

    def run() -> None:
        own = oslimits.forbid_tasks() if tasks else False
        _set_thread_name("nous-js-" + name.rsplit("-", 1)[-1], libc)
        # The deadline signal is for the main thread: only there does it
        # interrupt the blocking read that lets its handler run.
        _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGUSR1, _signal.SIGUSR2})
        main_bound.acquire()
        bounds["task_bound"] = own and bounds.pop("main_task_bound", False)
        try:
            # The first run's context first: a worker that has said hello is
            # ready, and a pool hands out only ready spares (so a run never
            # waits for the prelude's compilation).
            first = prepared
            if boot is not None:
                _set_policy(boot)
            # (A fork server's context: no collection here, which would copy
            # every page of it; it has room enough for a run without one.)
            if first is None:
                first = _prepare(engine)
            elif boot is not None:
                # A spare, booting off any run's path: the copies its run's first step would make.
                _write_ahead(options.get("write_ahead", ()))
            if boot is not None:
                _set_policy(_SCHED_OTHER)
            hello = {"pid": os.getpid(), "os_bounds": bounds, "prepared": first is not None}
            # This thread writes every frame, the hello included: one writer.
            write_all(1, frame(HELLO, _json()[1](hello).encode()))
            serve(engine, oslimits, watchdog, 0, 1, payload, first)
        finally:
            os._exit(0)

    watchdog.install()
    if boot is not None:
        _set_policy(_SCHED_OTHER)
    # The JS thread, named by run() itself (prctl). A bare thread, not a
    # threading.Thread: in a fresh fork server child, the Thread object's
    # bookkeeping and start handshake cost 0.3 ms of CPU (about 70 page
    # faults) more than the thread does; nothing here joins or lists it.
    _thread.stack_size(JS_STACK)
    _thread.start_new_thread(run, ())
    bounds["main_task_bound"] = oslimits.forbid_tasks() if tasks else False
    main_bound.release()
    try:
        watchdog.watch()
    finally:
        os._exit(0)


def _fork_server(sock_fd: int, modules: tuple[Any, Any, Any], options: dict[str, Any]) -> None:
    """Fork a fresh worker for each request on the host's socket; never returns.

    Single-threaded (so forking it is safe), it has loaded the engine and
    prepared one context (the prelude evaluated) but never run a program:
    each child starts from this state, binds itself and gives its copy of
    that context a fresh ``Math.random`` seed (:func:`_random_offset`; where
    the seed cannot be found, each child prepares its own context instead).
    What every child's bounds would build alike it builds once
    (:func:`oslimits.prepare`: the seccomp filter, the bounding set). A
    request flagged :data:`BACKGROUND` (a spare) is forked as
    ``SCHED_BATCH``, so the child is born with it (see :func:`_boot_policy`);
    once the server has learned which pages a run's first step writes
    (:func:`_rehearse`, after its first fork), such a child writes them
    while it boots. Requests: a datagram with the worker's name and three
    descriptors (its standard input, output, lifeline); the answer ``P <pid>
    <keys> <request>`` carries a pidfd of the child, so the host signals
    exactly that process, and the keys of the names texts the child holds
    (``-``: none; see below). Each
    child's exit is reported as ``W <pid> <status>`` (dropped if the host is
    not reading) when the next message comes, not as each exits (a wake-up
    per child, and the copy of every page it touches while its siblings
    share them); for :data:`REAP_LOOKS` times :data:`REAP_EVERY` seconds
    after a message, also every :data:`REAP_EVERY` seconds, then never until
    the next message (an idle server sleeps). Any other message (the host's
    ``?``: when it waits for a status, when its spares thread has reaped the
    discarded workers and ends) only reaps. End of file on the socket: reap,
    then exit. A names offer (``N <key> <length>``, one descriptor) is kept
    for the children forked after it (:func:`_keep_names`). Before its first
    fork the server gives its heap's free memory back (:func:`_trim`).
    """
    # No PR_SET_PDEATHSIG here: it fires when the *thread* that started this
    # process ends, and any of the host's threads may start it. The host's
    # death closes the socket; this process then exits, and its children,
    # whose parent is this single thread, get their death signal.
    import _signal  # (see _become_worker)
    import _socket  # (socket.py's class adds nothing used here; its import, with selectors, ~1.5 ms of the boot)
    import gc
    import select

    offset, seed_at, prepared = _prepare_server(modules)
    if options.get("namespaces", True):
        # One network (IPC, UTS) namespace for all this server's children: the
        # largest step of a child's start, made once (see oslimits: shared namespaces).
        modules[2].share_namespaces()
    server = os.getpid()
    options = {**options, "autogroup": _autogroup()}  # (read once for every child)
    # A spare is forked at the boot's policy and born with it (the fork's own
    # work, the copy of this process's page tables, included): see _boot_policy.
    boot = _boot_policy()
    sock = _socket.socket(fileno=sock_fd)
    # Each child's options, made here once: the test payload read and
    # compiled (see _test_payload), the JSON codec made (see _json).
    options.update(offset=offset, parent=server, seed_at=seed_at, payload=_test_payload())
    by_spare = {flag: {**options, "background": flag} for flag in (False, True)}
    _json()
    _limits_type()
    # Everything loaded so far is shared with every child: keep the collector
    # from touching it (a touched page is a copied page in each child).
    gc.collect()
    gc.freeze()
    gc.enable()  # (off since procio.BOOT: see main)
    _trim()
    # Exited children wait as zombies until the next message reaps them (an
    # inherited SIG_IGN would reap them unseen, their statuses lost).
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    # The pages a run's first step writes, learned once (about 5 ms) after
    # the first child is forked, so that child's boot does not wait for it.
    rehearse = prepared is not None
    sock.send(b"R")
    recvmsg = sock.recvmsg
    live = 0  # children forked and not reaped yet
    looks = 0  # looks left before sleeping until the next message
    while True:
        if live and looks and not select.select([sock_fd], [], [], REAP_EVERY)[0]:
            looks -= 1
            live -= _reap(sock)
            continue
        try:
            msg, fds = _request(recvmsg)
        except OSError:
            msg, fds = b"", []
        looks = REAP_LOOKS
        live -= _reap(sock)
        if not msg:
            os._exit(0)
        if msg[:1] == NAMES and len(fds) == 1:
            _keep_names(msg, fds[0], modules[1].names_key)
            continue
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            continue
        name, *flags = msg.split() or [b"?"]
        spare = BACKGROUND in flags
        background = spare and boot is not None and _set_policy(boot)
        pid = os.fork()
        if pid == 0:
            # (Whatever a child does here copies the pages it writes: the
            # options were made before the fork.)
            _child(name.decode("ascii", "replace"), fds, (sock_fd,), modules, by_spare[spare], prepared)
        live += 1
        if background:
            _set_policy(_SCHED_OTHER)
        _spawned(sock, pid, fds, msg)
        if rehearse:
            rehearse = False
            write_ahead = _rehearse(modules, prepared, offset, sock_fd)
            by_spare = {flag: {**each, "write_ahead": write_ahead} for flag, each in by_spare.items()}
            gc.freeze()  # (the new options too: a child's collection never walks them, so never copies them)


#: ``socket``'s constants a fork server's loop uses (Linux's values, the
#: only system with fork servers): read there as module globals, not looked
#: up in ``socket`` (whose import and attributes each loop would touch: a
#: page written in the server after a fork is a page copied).
_SOL_SOCKET, _SCM_RIGHTS, _MSG_DONTWAIT = 1, 1, 0x40
#: ``socket.CMSG_LEN(3 * 4)``: room for a request's three descriptors.
_REQUEST_ANCILLARY = 28


def _request(recvmsg: Any) -> tuple[bytes, list[int]]:
    """(The fork server.) The next message on its socket and the descriptors
    it carries (at most 3): ``socket.recv_fds`` in fewer objects."""
    msg, ancdata, _, _ = recvmsg(256, _REQUEST_ANCILLARY)
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == _SOL_SOCKET and kind == _SCM_RIGHTS:
            fds += memoryview(data[: len(data) - len(data) % 4]).cast("i").tolist()
    return msg, fds


def _spawned(sock: Any, pid: int, fds: list[int], msg: bytes) -> None:
    """(The fork server.) Child ``pid`` is forked for request ``msg``: close the
    server's copies of its descriptors and answer ``P <pid> <keys> <request>``
    with a pidfd of it."""
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    try:
        # (With the names texts it holds: so does the child.)
        held = b",".join(_NAMES_HELD) or b"-"
        sock.sendmsg([b"P %d %s %s" % (pid, held, msg)], [(_SOL_SOCKET, _SCM_RIGHTS, pidfd.to_bytes(4, sys.byteorder))])
    finally:
        os.close(pidfd)


def _trim() -> None:
    """Give the heap's free memory back to the system (glibc's
    ``malloc_trim``): a child's large allocation (a large names text's str
    and JS copies, a long frame's buffer) then gets fresh zeroed pages, not
    free pages this server once wrote, which the child would copy. Then
    leave room at the heap's top (:data:`HEAP_HEADROOM`), pages never
    written: a child's step puts its new objects there, inside this
    server's mappings, where the rehearsal names them and each spare
    faults them in ahead (past the heap's end they would be a mapping of
    the child's own, which no write-ahead reaches). Called before the
    rehearsal's fork, so the rehearsal and every later child find one heap."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.malloc_trim(0)
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = (ctypes.c_void_p,)
        # (Below the allocator's mmap threshold: the heap grows by it, and the top pad.)
        libc.free(libc.malloc(HEAP_HEADROOM))
    except (OSError, AttributeError):
        pass


def _autogroup() -> bool:
    """Whether the kernel groups tasks by session for the CPU (``sched_autogroup``)."""
    try:
        fd = os.open("/proc/sys/kernel/sched_autogroup_enabled", os.O_RDONLY)
        try:
            return os.read(fd, 8).strip() == b"1"
        finally:
            os.close(fd)
    except OSError:
        return False


def _prepare_server(modules: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
    """What a fork server makes once for all its children, before the first
    fork: the budget's offset, the random state's offset, and the first
    run's context ``(offset, seed_at, prepared)``; and what the children
    inherit ready (:func:`oslimits.prepare`, the thread namer, Ctrl-C
    ignored: the host's to handle)."""
    import mmap  # noqa: F401
    import signal

    offset = budget_offset(modules[0])
    modules[1].load_gc_threshold()  # (opens the binding's library: its children cannot)
    # The first run's context of every child, prepared once here (the
    # prelude's compilation is the largest part of a worker's start): each
    # child gets a copy-on-write copy and gives it a fresh Math.random seed.
    # Only where that seed can be found; otherwise each child makes its own.
    # No program ever runs in this process or in this context here.
    seed_at = _random_offset(modules[0])
    # Shared: with the converter compiled (a run whose call's arguments hold
    # {} would compile it, about 0.4 ms) and room for a run without the
    # collector (which would copy every page of it in the child).
    prepared = _prepare(modules[1], shared=True) if seed_at is not None else None
    modules[2].prepare()  # (what every child's bounds would otherwise build alike)
    global _NAMER
    if sys.platform.startswith("linux"):
        try:
            _NAMER = _name_setter()
        except (OSError, AttributeError):
            pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    global _MADVISE
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            madvise = ctypes.CDLL(None, use_errno=True).madvise
            madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            madvise.restype = ctypes.c_int
            _MADVISE = madvise
        except (OSError, AttributeError):
            pass
    return offset, seed_at, prepared


def _rehearse(
    modules: tuple[Any, Any, Any], prepared: Any, offset: Any, close: int = -1
) -> tuple[tuple[int, int, int], ...]:
    """The pages of this fork server's memory that a run's first step writes
    or maps, as ``(start, length, advice)`` ranges, learned once, for each child to write
    ahead while it boots (:func:`_write_ahead`); ``()`` where they cannot
    be learned.

    Each child shares this process's pages until it writes one, which then
    costs a fault and a copy: in a fresh worker, about 130 faults in the
    first step of its run (the context's objects, the allocator's lists,
    the interpreter's state), about 0.25 ms of that step's wall time; a
    50-call fan-out's step about 50 more, each a fresh page at the heap's
    top for its new objects (room :func:`_trim` left). Which
    pages those are depends on this process's layout, the same in every
    child, far more than on the program. So a throwaway child of this
    process runs :data:`REHEARSAL` in its copy of the prepared context, as a
    worker's serving loop would (a run frame and a settle frame), and
    reports the pages it then held a copy of, and the file pages (code) it
    then had mapped, that it did not before (``/proc/self/pagemap``); then
    it exits.
    It is never a worker: no run sees it, and no program runs in this
    process or in its context. The answer is checked (page-aligned, inside
    this process's private mappings, at most
    :data:`WRITE_AHEAD_PAGES`). ``close``: a descriptor the child closes first."""
    import array

    if not sys.platform.startswith("linux") or _MADVISE is None:
        return ()
    try:
        regions = _private_regions()
        r, w = os.pipe()
    except OSError:
        return ()
    try:
        pid = os.fork()
    except OSError:  # (out of processes or memory: the children fault as before)
        os.close(r)
        os.close(w)
        return ()
    if pid == 0:
        try:
            os.close(r)
            if close >= 0:
                os.close(close)  # (the host's socket: this child never answers it)
            _rehearsal(modules, prepared, offset, regions, w)
        finally:
            os._exit(0)
    os.close(w)
    data = []
    try:
        while True:
            part = os.read(r, 1 << 16)
            if not part:
                break
            data.append(part)
    except OSError:
        data = []
    finally:
        os.close(r)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    found = b"".join(data)
    pages = array.array("Q")
    pages.frombytes(found[: len(found) - len(found) % pages.itemsize])
    return _ranges(pages, regions)


def _rehearsal(
    modules: tuple[Any, Any, Any], prepared: Any, offset: Any, regions: list[tuple[int, int, int]], out: int
) -> None:
    """In :func:`_rehearse`'s child: what a worker's boot does to this
    process's memory (its watchdog, its hello, a second thread with the JS
    stack), then, on that thread, the pages a run frame and a settle frame
    write, written to ``out``; then exit."""
    import _thread
    import array
    import json
    import mmap

    engine = modules[1]
    watchdog = _Watchdog(-1, offset)
    hello = _json()[1]({"pid": os.getpid(), "os_bounds": {}, "prepared": True}).encode()
    frame(HELLO, hello)
    names, lazy = engine.names_utf8(("noop",))
    spec = {
        "program": REHEARSAL,
        "names_lazy": lazy,
        "limits": list(_REHEARSAL_LIMITS),
        "remaining": 30.0,
        # (Capped as a run is, so the cap's pages are learned too; so high,
        # above this process's address space, that nothing it maps is refused.)
        "memory_cap": _REHEARSAL_CAP,
        "cpu_limit": None,
    }
    body = json.dumps(spec).encode() + b"\n" + names
    page = os.sysconf("SC_PAGE_SIZE")
    size = sum(end - start for start, end, _ in regions) // page * 8
    # (Both snapshots' buffers made first, what they allocate not the step's;
    # and off the heap, which then holds what a worker's holds as its step
    # begins: the step's new objects land on the pages a worker's would.)
    before, after = mmap.mmap(-1, size), mmap.mmap(-1, size)
    fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    done = _thread.allocate_lock()
    done.acquire()

    def step() -> None:
        try:
            server = _Server(engine, modules[2], watchdog, -1, None, prepared)
            _pagemap(fd, regions, before, page)
            server.run(body)
            server.settle(b"1 1 1 1")
            _pagemap(fd, regions, after, page)
            written = array.array("Q")
            at = 0
            for start, end, advice in regions:
                # Each entry's top byte (little-endian: every 8th from the 7th), 1 where it counts.
                n, table = (end - start) // page, _COPIED if advice == _POPULATE_WRITE else _PRESENT
                was = bytes(before[at * 8 + 7 : (at + n) * 8 : 8]).translate(table)
                now = bytes(after[at * 8 + 7 : (at + n) * 8 : 8]).translate(table)
                i = now.find(1)
                while i >= 0:
                    if not was[i]:
                        written.append(start + i * page)
                    i = now.find(1, i + 1)
                at += n
            write_all(out, written.tobytes())
        finally:
            done.release()

    _thread.stack_size(JS_STACK)
    _thread.start_new_thread(step, ())
    # (Bounded: the server's boot waits for this child's end.)
    done.acquire(timeout=REHEARSAL_TIMEOUT)


def _pagemap(fd: int, regions: list[tuple[int, int, int]], into: mmap.mmap, page: int) -> None:
    """``regions``' pagemap entries, read into ``into`` (allocating nothing)."""
    view = memoryview(into)
    at = 0
    for start, end, _ in regions:
        n = (end - start) // page * 8
        os.preadv(fd, [view[at : at + n]], start // page * 8)
        at += n


def _ranges(pages: Any, regions: list[tuple[int, int, int]]) -> tuple[tuple[int, int, int], ...]:
    """``pages`` (ascending addresses) as ``(start, length, advice)`` ranges,
    each within one of ``regions`` and with its advice; a gap of one page
    is filled too (a page costs less than a call); ``()`` if any is not a
    page of ``regions`` or there are more than :data:`WRITE_AHEAD_PAGES`."""
    import bisect

    page = os.sysconf("SC_PAGE_SIZE")
    if len(pages) > WRITE_AHEAD_PAGES:
        return ()
    starts = [lo for lo, _, _ in regions]  # (ascending, as /proc/self/maps lists them)
    out: list[list[int]] = []
    last = -1  # the region of the last range
    for at in pages:
        region = bisect.bisect_right(starts, at) - 1
        if at % page or region < 0 or at >= regions[region][1]:
            return ()
        if out and region == last and out[-1][0] + out[-1][1] <= at <= out[-1][0] + out[-1][1] + page:
            out[-1][1] = at + page - out[-1][0]
        else:
            out.append([at, page, regions[region][2]])
        last = region
    return tuple((at, n, advice) for at, n, advice in out)


def _private_regions() -> list[tuple[int, int, int]]:
    """This process's private mappings that a child may fault ahead,
    ``(start, end, advice)``: the writable ones (their pages are copied on
    write: :data:`_POPULATE_WRITE`) and the read-only ones of a file, the
    code among them (a fork copies none of their page tables, so each
    child faults them in again: :data:`_POPULATE_READ`); none larger than
    :data:`_REHEARSAL_REGION`."""
    regions = []
    with open("/proc/self/maps", "rb") as fh:
        for line in fh:
            parts = line.split()
            perms = parts[1]
            if perms[3:4] != b"p" or perms[:1] != b"r":
                continue
            if perms[1:2] == b"w":
                advice = _POPULATE_WRITE
            elif len(parts) > 5 and parts[5].startswith(b"/"):
                advice = _POPULATE_READ
            else:
                continue
            start, end = (int(at, 16) for at in parts[0].split(b"-"))
            if end - start <= _REHEARSAL_REGION:
                regions.append((start, end, advice))
    return regions


#: A pagemap entry's top byte to 1 if it has bits 63 (present) and 56 (mapped by this process alone), else 0.
_COPIED = bytes(int(b & 0x81 == 0x81) for b in range(256))
#: A pagemap entry's top byte to 1 if it has bit 63 (present), else 0.
_PRESENT = bytes(int(b & 0x80 == 0x80) for b in range(256))


def _write_ahead(ranges: Any) -> None:
    """Fault ``ranges`` (:func:`_rehearse`) in this child of a fork server,
    while it boots: the copies its run's first step would otherwise make,
    and the code it would map, on that step's path. Nothing is changed:
    a written page gets this process's own copy of the same bytes. Best
    effort (before Linux 5.14 the kernel refuses, and the run takes those
    faults as before)."""
    if _MADVISE is None:
        return
    import ctypes

    for start, length, advice in ranges:
        # (A range this process has unmapped since: the next. An old kernel: none.)
        if _MADVISE(start, length, advice) != 0 and ctypes.get_errno() == errno.EINVAL:
            return


def _reap(sock: Any) -> int:
    """Reap every exited child, reporting each (``W``); how many."""
    reaped = 0
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped += 1
        try:
            sock.send(b"W %d %d" % (pid, os.waitstatus_to_exitcode(status)), _MSG_DONTWAIT)
        except OSError:
            pass


def _child(
    name: str, fds: list[int], close: tuple[int, ...], modules: Any, options: dict[str, Any], prepared: Any = None
) -> None:
    for fd in close:
        os.close(fd)
    os.dup2(fds[0], 0)
    os.dup2(fds[1], 1)
    os.dup2(fds[2], 3)
    os.closerange(4, 1 << 16)
    # A session of its own (so a process group of its own, killed as a group):
    # where the kernel groups tasks by session (autogroup), this worker gets
    # one share of the CPU, whatever it runs (see oslimits: the task bound).
    if options.get("own_session", True):
        os.setsid()
    else:
        os.setpgid(0, 0)
    try:
        _become_worker(name, 3, modules, options, options["offset"], prepared)
    finally:
        os._exit(1)


def main(argv: list[str]) -> None:
    """A fork server or a spawned worker. The collector is off from
    ``procio.BOOT`` until the boot's imports are done (they make objects by
    the thousand and no garbage worth a collection, which would run about 20
    times); a fork server turns it on once it has frozen what its children share."""
    import gc
    import json

    if argv[1] == "--fork-server":
        modules = _load_all(argv[2])
        _fork_server(0, modules, json.loads(argv[3]))
    name, quickjs_path, lifeline = argv[1], argv[2], int(argv[3])
    options = json.loads(argv[4]) if len(argv) > 4 else {}
    modules = _load_all(quickjs_path)
    gc.enable()
    _become_worker(name, lifeline, modules, options)


if __name__ == "__main__":
    main(sys.argv)

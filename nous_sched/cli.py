"""The ``nous-sched`` command: run a JavaScript program against a module of tools.

Usage::

    nous-sched run PROGRAM.js --tools MODULE [--max-parallel N] [--timeout S]
                              [--trace FILE] [--json] [--progress | --no-progress]
    python -m nous_sched run ...

``MODULE`` is a dotted module name (imported with the current directory on
``sys.path``) or a path to a ``.py`` file. It must define ``TOOLS``, an
iterable of :class:`nous_sched.Tool`, or a function ``tools()`` returning one.
``PROGRAM.js`` may be ``-`` to read the program from standard input.

Output (standard output): the result as pretty JSON, or the error's kind and
message; then the program's log lines; then the trail of sub-calls as a
timeline, one row per call. ``--json`` prints one JSON object instead:
``{"result" | "error", "logs", "trail", "events"}``. ``--trace FILE`` also
writes the trail as a Chrome trace (:mod:`nous_sched.trace`).

Exit status: 0 when the program ran and returned a value, 1 when it failed
(the error kind is printed), 2 for a usage or configuration error (a message
on standard error, no traceback), 130 when interrupted, 141 when standard
output was closed early (``| head``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, TextIO

import attrs

from .errors import ConfigError
from .result import RunResult
from .tool import Tool

__all__ = ["main", "load_tools", "format_trail", "UsageError"]

PROG = "nous-sched"
BAR_WIDTH = 40
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 0, 1, 2, 130, 141


class UsageError(Exception):
    """A usage or configuration problem: printed as ``nous-sched: <message>``, exit status 2."""


# -- loading the tools ----------------------------------------------------


def _looks_like_path(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec or "/" in spec or (os.altsep is not None and os.altsep in spec)


def _where(exc: BaseException) -> str:
    """`` (file:line)`` of the innermost frame of ``exc``, or ``""``."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {last.filename}:{last.lineno})"


def _import_path(spec: str) -> Any:
    path = Path(spec)
    if not path.exists():
        raise UsageError(f"--tools {spec}: no such file")
    if not path.is_file():
        raise UsageError(f"--tools {spec}: not a file (pass a .py file or a dotted module name)")
    path = path.resolve()
    name = "_nous_sched_tools_" + "".join(c if c.isalnum() else "_" for c in path.stem)
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise UsageError(f"--tools {spec}: cannot load it as a Python module (is it a .py file?)")
    module = importlib.util.module_from_spec(module_spec)
    # Registered (dataclasses and pickling look modules up by name); siblings
    # of the file are importable while it loads, as with `python file.py`.
    sys.modules[name] = module
    folder = str(path.parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise UsageError(f"--tools {spec}: syntax error at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:
        sys.modules.pop(name, None)
        raise UsageError(f"--tools {spec}: importing it raised {type(exc).__name__}: {exc}{_where(exc)}") from None
    finally:
        if added:
            try:
                sys.path.remove(folder)
            except ValueError:
                pass
    return module


def _import_dotted(spec: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)  # like `python -m`: modules in the current directory are importable
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (spec == exc.name or spec.startswith(exc.name + ".")):
            raise UsageError(
                f"--tools {spec}: no module named {exc.name!r} (pass a dotted module name importable "
                "from the current directory, or a path to a .py file)"
            ) from None
        raise UsageError(f"--tools {spec}: importing it raised ModuleNotFoundError: {exc}{_where(exc)}") from None
    except SyntaxError as exc:
        raise UsageError(f"--tools {spec}: syntax error in {exc.filename} at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:
        raise UsageError(f"--tools {spec}: importing it raised {type(exc).__name__}: {exc}{_where(exc)}") from None


def load_tools(spec: str) -> list[Tool]:
    """The tools of module ``spec`` (a dotted name or a ``.py`` path): its ``TOOLS``, or what ``tools()`` returns.

    :raises UsageError: the module cannot be imported, defines neither, or
        they are not an iterable of :class:`~nous_sched.Tool` with distinct names.
    """
    if not spec:
        raise UsageError("--tools: expected a dotted module name or a path to a .py file")
    module = _import_path(spec) if _looks_like_path(spec) else _import_dotted(spec)
    if hasattr(module, "TOOLS"):
        source, found = "TOOLS", module.TOOLS
    elif callable(getattr(module, "tools", None)):
        source = "tools()"
        try:
            found = module.tools()
        except Exception as exc:
            raise UsageError(f"--tools {spec}: tools() raised {type(exc).__name__}: {exc}{_where(exc)}") from None
    else:
        raise UsageError(
            f"--tools {spec}: the module defines neither TOOLS nor tools(); "
            "add `TOOLS = [nous_sched.Tool(...), ...]` (or a function `tools()` returning such a list)"
        )
    if isinstance(found, (str, bytes, dict)) or not isinstance(found, Iterable):
        raise UsageError(f"--tools {spec}: {source} must be an iterable of nous_sched.Tool, got {type(found).__name__}")
    tools = list(found)
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, Tool):
            raise UsageError(f"--tools {spec}: {source}[{i}] is a {type(tool).__name__}, not a nous_sched.Tool")
        if tool.name in seen:
            raise UsageError(f"--tools {spec}: {source} has two tools named {tool.name!r}; names must be distinct")
        seen.add(tool.name)
    return tools


def _read_program(spec: str, stdin: TextIO) -> str:
    if spec == "-":
        try:
            return stdin.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read the program from standard input: {exc}") from None
    try:
        return Path(spec).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"program {spec}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"program {spec}: is a directory, not a .js file") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"program {spec}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise UsageError(f"program {spec}: cannot read it: {exc.strerror or exc}") from None


# -- progress ---------------------------------------------------------------


class Progress:
    """Live ``calls started N / committed M`` on a stream, fed by the scheduler's observer.

    :meth:`observe` runs on the scheduler's driver thread, so it only bumps
    counters: it never writes, locks or waits. A separate daemon thread
    (``nous-sched-progress``) redraws at most every ``interval`` seconds, and
    only when a count changed. On a terminal the line is redrawn in place and
    erased at the end; elsewhere each change is a new line, and a final line is
    always written.
    """

    def __init__(self, stream: TextIO, *, interval: float = 0.1, tty: Optional[bool] = None) -> None:
        self.stream = stream
        self.interval = interval
        self.tty = _isatty(stream) if tty is None else tty
        self.started = 0
        self.committed = 0
        self.failed = 0
        self._stop = threading.Event()
        self._shown: Optional[tuple] = None
        self._thread = threading.Thread(target=self._loop, name="nous-sched-progress", daemon=True)

    def observe(self, record: Any, phase: str) -> None:
        # Driver thread: integer bumps only (each counter has this one writer).
        if phase == "start":
            self.started += 1
        elif phase == "commit":
            self.committed += 1
            if record.ok is False:
                self.failed += 1

    def __enter__(self) -> "Progress":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(1.0)
        self._draw(final=True)

    def text(self) -> str:
        line = f"calls started {self.started} / committed {self.committed}"
        return line + (f" ({self.failed} failed)" if self.failed else "")

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._draw(final=False)

    def _draw(self, *, final: bool) -> None:
        state = (self.started, self.committed, self.failed)
        try:
            if self.tty:
                if final:
                    self.stream.write("\r\033[K")
                elif state != self._shown:
                    self.stream.write("\r\033[K" + self.text())
            elif state != self._shown or (final and self._shown is None):
                self.stream.write(self.text() + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream must not break the run
        self._shown = state


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False


# -- output -----------------------------------------------------------------


def _ms(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def format_trail(trail: Sequence[Any], *, width: int = BAR_WIDTH, span: Optional[float] = None) -> list[str]:
    """The trail as a text timeline: a header, one row per call in ``seq`` order, a legend.

    Each row shows seq, tool, mode, start/finish/commit in ms since the
    scheduler started, ok or error, and a bar of ``width`` columns scaled to
    ``span`` (default: the last instant in the trail): ``#`` while the call
    ran, ``.`` while it waited for earlier calls to commit, ``?`` for a call
    abandoned when the run stopped.
    """
    records = sorted(trail, key=lambda r: r.seq)
    if not records:
        return ["(no tool calls)"]
    latest = max(v for r in records for v in (r.started, r.finished, r.committed) if v is not None)
    span = max(latest, span or 0.0) or 1e-9
    tool_w = max(4, *(len(r.tool) for r in records))
    tool_w = min(tool_w, 24)

    # Column i covers [i, i + 1) * span / width; a call fills every column its interval overlaps.
    def first(t: float) -> int:
        return min(width - 1, max(0, int(math.floor(t / span * width))))

    def last(t: float) -> int:
        return min(width - 1, max(0, int(math.ceil(t / span * width)) - 1))

    header = f"{'seq':>4}  {'tool':<{tool_w}}  {'mode':<9}  {'start':>8}  {'finish':>8}  {'commit':>8}  {'':<5}  timeline (ms)"
    lines = [header]
    for r in records:
        bar = [" "] * width
        s = first(r.started)
        if r.finished is None:
            for i in range(s, width):
                bar[i] = "?"
        else:
            f = max(last(r.finished), s)
            for i in range(s, f + 1):
                bar[i] = "#"
            if r.committed is not None:
                for i in range(f + 1, last(r.committed) + 1):
                    bar[i] = "."
        status = "ok" if r.ok else ("error" if r.ok is False else "-")
        tool = r.tool if len(r.tool) <= tool_w else r.tool[: tool_w - 1] + "…"
        lines.append(
            f"{r.seq:>4}  {tool:<{tool_w}}  {r.mode:<9}  {_ms(r.started):>8}  {_ms(r.finished):>8}  "
            f"{_ms(r.committed):>8}  {status:<5}  |{''.join(bar)}|"
        )
    lines.append(f"{'':>4}  {'':<{tool_w}}  {'':<9}  {'':>8}  {'':>8}  {'':>8}  {'':<5}  0{_ms(span).rjust(width + 1)}")
    lines.append("# running   . finished, waiting for earlier calls to commit   ? abandoned at stop")
    return lines


def _peak_parallel(trail: Sequence[Any]) -> int:
    points = []
    for r in trail:
        end = r.finished if r.finished is not None else math.inf
        points.append((r.started, 1))
        points.append((end, -1))
    peak = current = 0
    for _, delta in sorted(points, key=lambda p: (p[0], p[1])):
        current += delta
        peak = max(peak, current)
    return peak


def _human(result: RunResult, out: TextIO) -> None:
    if result.error is None:
        out.write("result:\n")
        out.write(_indent(json.dumps(result.result, indent=2, ensure_ascii=False)) + "\n")
    else:
        out.write(f"error ({result.error.kind}):\n")
        out.write(_indent(result.error.message) + "\n")
    out.write(f"\nlogs ({len(result.logs)}):\n")
    for line in result.logs:
        out.write(_indent(line) + "\n")
    trail = result.trail
    failed = sum(1 for r in trail if r.ok is False)
    summary = f"\ntrail ({len(trail)} calls"
    if trail:
        summary += f", peak {_peak_parallel(trail)} running at once"
    if failed:
        summary += f", {failed} failed"
    summary += f"; run took {result.elapsed * 1000:.1f} ms):\n"
    out.write(summary)
    for line in format_trail(trail):
        out.write("  " + line + "\n")


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.split("\n"))


def result_json(result: RunResult) -> dict[str, Any]:
    """The ``--json`` document: ``result`` or ``error``, then ``logs``, ``trail``, ``events``."""
    doc: dict[str, Any] = {}
    if result.error is None:
        doc["result"] = result.result
    else:
        doc["error"] = result.error.as_dict()
    doc["logs"] = list(result.logs)
    doc["trail"] = [attrs.asdict(r) for r in result.trail]
    doc["events"] = [attrs.asdict(e) for e in result.events]
    return doc


# -- the command ------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own usage errors: exit 2, no traceback
        self.print_usage(sys.stderr)
        raise UsageError(message)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Run a model-written JavaScript program whose every tool call goes through one nous_sched Scheduler.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    run = sub.add_parser(
        "run",
        help="run PROGRAM.js against the tools of MODULE",
        description="Run PROGRAM.js in QuickJS with the tools of MODULE bound as `tools.<name>(args)`. "
        "Exit status: 0 success, 1 the program failed, 2 usage or configuration error.",
    )
    run.add_argument("program", metavar="PROGRAM.js", help="the program to run, or - to read it from standard input")
    run.add_argument(
        "--tools",
        required=True,
        metavar="MODULE",
        help="dotted module name or path to a .py file defining TOOLS (an iterable of nous_sched.Tool) or tools()",
    )
    run.add_argument(
        "--max-parallel",
        type=_positive_int,
        default=10,
        metavar="N",
        help="most tool calls running at once (default 10)",
    )
    run.add_argument(
        "--timeout",
        type=_positive_float,
        default=30.0,
        metavar="S",
        help="the run's wall-clock deadline in seconds (default 30)",
    )
    run.add_argument(
        "--trace", metavar="FILE", help="also write the trail as Chrome trace-event JSON (Perfetto, chrome://tracing)"
    )
    run.add_argument("--json", action="store_true", help="print one JSON object: result|error, logs, trail, events")
    run.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show live call counts on standard error (default: when standard error is a terminal)",
    )
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; return the exit status (never raises SystemExit for usage errors)."""
    stdout, stderr = sys.stdout, sys.stderr
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help / --version
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_USAGE)
        return _run(args, stdout, stderr)
    except UsageError as exc:
        stderr.write(f"{PROG}: {exc}\n")
        stderr.flush()
        return EXIT_USAGE
    except KeyboardInterrupt:
        stderr.write(f"\n{PROG}: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `nous-sched run ... | head`: the reader left; say nothing more
        try:
            sys.stdout = open(os.devnull, "w")  # so the interpreter's final flush does not complain
        except OSError:
            pass
        return EXIT_BROKEN_PIPE


def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .run_code import run_code  # lazily: `--help` works without the runtime

    tools = load_tools(args.tools)
    program = _read_program(args.program, sys.stdin)
    if args.trace:
        folder = Path(args.trace).resolve().parent
        if not folder.is_dir():
            raise UsageError(f"--trace {args.trace}: folder {folder} does not exist")
    show_progress = _isatty(err) if args.progress is None else args.progress
    progress = Progress(err) if show_progress else None
    try:
        if progress is None:
            result = run_code(program, tools, max_parallel=args.max_parallel, timeout=args.timeout)
        else:
            with progress:
                result = run_code(
                    program, tools, max_parallel=args.max_parallel, timeout=args.timeout, observer=progress.observe
                )
    except ConfigError as exc:  # RunCodeError included: nothing ran
        raise UsageError(str(exc)) from None

    if args.json:
        out.write(json.dumps(result_json(result), indent=2, ensure_ascii=False) + "\n")
    else:
        _human(result, out)
    out.flush()

    if args.trace:
        from .trace import write_chrome_trace

        try:
            write_chrome_trace(result, args.trace, name=Path(args.program).name if args.program != "-" else "run_code")
        except OSError as exc:
            raise UsageError(f"--trace {args.trace}: cannot write it: {exc.strerror or exc}") from None
        if not args.json:
            out.write(f"\ntrace written to {args.trace} (open it in https://ui.perfetto.dev or chrome://tracing)\n")
    return EXIT_OK if result.error is None else EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

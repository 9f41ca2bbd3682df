"""The ``nous-sched`` entry point: arguments, exit status, and one run."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, Optional, Sequence, TextIO, TypeVar, cast

from .. import _validators as v
from .._version import __version__
from ..errors import ConfigError
from ..runtime import Cancel
from . import durable as cli_durable
from .loading import UsageError, load_tools, read_program
from .progress import Progress, isatty
from .render import human, inert, json_text, result_json

__all__ = ["main", "build_parser", "PROG"]

PROG = "nous-sched"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 0, 1, 2, 130, 141
T = TypeVar("T")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own usage errors: exit 2, no traceback
        self.print_usage(sys.stderr)
        raise UsageError(message)


def _option(parse: Callable[[str], Any], check: v.Check) -> Callable[[str], Any]:
    """An argparse ``type`` that parses a flag and checks it as the library checks the option."""

    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            value = None
        if value is None or not check.accepts(value):
            raise argparse.ArgumentTypeError(f"expected {check.expected}, got {text!r}")
        return value

    return convert


_positive_int = _option(int, v.POSITIVE_INT)
_seconds = _option(float, v.SECONDS)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Run a model-written JavaScript program whose every tool call goes through one nous_sched Scheduler.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    run = sub.add_parser(
        "run",
        help="run PROGRAM.js against the tools of MODULE",
        description="Run PROGRAM.js in QuickJS with the tools of MODULE bound as `tools.<name>(args)`. "
        "Exit status: 0 success, 1 the program failed, 2 usage or configuration error, "
        "130 interrupted (Ctrl-C: the first cancels the run and prints its logs, a second stops at once).",
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
        type=_seconds,
        default=30.0,
        metavar="S",
        help="the run's wall-clock deadline in seconds (default 30)",
    )
    run.add_argument(
        "--cpu-time",
        type=_seconds,
        default=None,
        metavar="S",
        help="the CPU time the program's JavaScript may use, in seconds, waits not counted (default: no budget "
        "but the deadline); past it the run fails with cpu_time",
    )
    run.add_argument(
        "--trace", metavar="FILE", help="also write the trail as Chrome trace-event JSON (Perfetto, chrome://tracing)"
    )
    run.add_argument(
        "--runtime",
        choices=("worker", "in-process"),
        default="worker",
        help="where the JavaScript runs: 'worker', a worker process killed at the deadline (the default), "
        "or 'in-process', in this process (trusted code, lowest latency)",
    )
    run.add_argument(
        "--ask",
        action="store_true",
        help="ask on the terminal before each call that needs approval (answers read from standard input, "
        "or the terminal when the program comes from standard input); without it such calls are refused",
    )
    run.add_argument(
        "--json", action="store_true", help="print one JSON object: result|error, logs, trail, events, refused"
    )
    run.add_argument(
        "--events",
        action="store_true",
        help="print the run's live events (call, commit, log, approval, end) on standard output as JSON lines, "
        "as they happen; with --json, the result object follows as one last line",
    )
    run.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show live call counts on standard error (default: when standard error is a terminal)",
    )
    run.add_argument(
        "--approval-store",
        metavar="FILE",
        help="make the run durable: a call that needs approval suspends it (exit status 3), its token and pending "
        "calls printed for `nous-sched resume`; FILE is a SQLite file, a redis:// or a postgresql:// URL",
    )
    run.add_argument(
        "--state",
        metavar="SCOPE",
        help="the program's state across runs (state.get/set/delete/keys) is scope SCOPE of --state-store",
    )
    run.add_argument(
        "--state-store",
        metavar="STORE",
        help="where --state keeps its scope: a SQLite file, a redis:// or postgresql:// URL (default: memory, gone when the "
        "command ends)",
    )
    cli_durable.add_parsers(sub)
    from . import serve_mcp  # imports neither the MCP SDK nor the runtime

    serve_mcp.add_parser(sub, positive_int=_positive_int, seconds=_seconds)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; return the exit status (never raises SystemExit for usage errors)."""
    stdout, stderr = sys.stdout, sys.stderr
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help / --version
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_USAGE)
        if args.command == "serve-mcp":
            from . import serve_mcp

            return serve_mcp.run(args, stderr)
        if args.command in ("resume", "approvals"):
            return cli_durable.run(args, stdout, stderr)
        return _run(args, stdout, stderr)
    except UsageError as exc:
        stderr.write(f"{PROG}: {inert(str(exc))}\n")
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
    from .._run.entry import run as run_with  # lazily: `--help` works without the runtime

    tools = load_tools(args.tools)
    program = read_program(args.program, sys.stdin)
    if args.trace:
        folder = Path(args.trace).resolve().parent
        if not folder.is_dir():
            raise UsageError(f"--trace {args.trace}: folder {folder} does not exist")
    show_progress = isatty(err) if args.progress is None else args.progress
    progress = Progress(err) if show_progress else None
    try:
        with _ctrl_c_cancels() as cancel:
            options = _run_options(args, err, cancel, None if progress is None else progress.observe)
            with progress if progress is not None else contextlib.nullcontext():
                if args.events:
                    result = _off_main(lambda: _run_with_events(program, tools, out, options))
                else:
                    result = _off_main(lambda: run_with(program, tools, options))
    except ConfigError as exc:  # RunCodeError included: nothing ran
        raise UsageError(str(exc)) from None

    if result.suspended is not None:
        return cli_durable.show_suspended(result, out, args.json)
    _print_result(args, result, out)

    if args.trace:
        from ..trace import write_chrome_trace

        try:
            write_chrome_trace(result, args.trace, name=Path(args.program).name if args.program != "-" else "run_code")
        except OSError as exc:
            raise UsageError(f"--trace {args.trace}: cannot write it: {exc.strerror or exc}") from None
        if not args.json:
            out.write(f"\ntrace written to {args.trace} (open it in https://ui.perfetto.dev or chrome://tracing)\n")
    if result.error is not None and result.error.kind == "cancelled":
        return EXIT_INTERRUPTED
    return EXIT_OK if result.error is None else EXIT_FAILED


def _terminal_approver(program: str, err: TextIO) -> Any:
    from .ask import TerminalApprover

    if program != "-":
        return TerminalApprover(err, sys.stdin)
    try:
        return TerminalApprover(err, open("/dev/tty", encoding="utf-8"))  # noqa: SIM115 - lives for the run
    except OSError:
        raise UsageError("--ask: the program came from standard input and there is no terminal to ask") from None


def _print_result(args: argparse.Namespace, result: Any, out: TextIO) -> None:
    """The result as the flags ask: human text, one JSON object, or (after
    ``--events``' lines) nothing or the object as one last line."""
    if args.events:
        if args.json:
            out.write(json_text(result_json(result)) + "\n")
    elif args.json:
        out.write(json_text(result_json(result), indent=2) + "\n")
    else:
        human(result, out)
    out.flush()


def _run_with_events(program: str, tools: Any, out: TextIO, options: Any) -> Any:
    """The run, its events written to ``out`` as JSON lines as they come."""
    from ..live import start_run

    run = start_run(program, tools, options=options)
    for event in run.events():
        out.write(event.to_json() + "\n")
        out.flush()
    return run.result()


def _off_main(run: Callable[[], T]) -> T:
    """``run()`` on a thread of its own (``nous-sched-cli-run``) while this, the
    main thread, waits: Python runs signal handlers only on the main thread,
    between bytecodes, so a program running JavaScript on it (the in-process
    runtime) would hold off Ctrl-C until it stopped. A second Ctrl-C raises
    ``KeyboardInterrupt`` here at once; the run's thread, already cancelled by
    the first, is a daemon and ends with the process."""
    box: list[Any] = []

    def target() -> None:
        try:
            box.append((True, run()))
        except BaseException as exc:  # handed to the main thread
            box.append((False, exc))

    thread = threading.Thread(target=target, name="nous-sched-cli-run", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.1)  # a bounded join: the main thread returns to the interpreter, which runs handlers
    ok, value = box[0]
    if not ok:
        raise value
    return cast(T, value)


def _run_options(args: argparse.Namespace, err: TextIO, cancel: Optional[Cancel], observer: Any) -> Any:
    """``run_code``'s :class:`~nous_sched.RunOptions` from the command line: the
    runtime, limits, the description, an approval prompt or an approval store,
    Ctrl-C's ``cancel`` and the progress line's ``observer``.

    :raises ConfigError: a bad value, named as ``run_code`` names it.
    """
    from .._run.options import build
    from . import serve_mcp

    options = {
        "max_parallel": args.max_parallel,
        **serve_mcp.run_limits(args),
        "runtime": cli_durable.runtime_named(args.runtime),
        # run_code requires a description (the audit's and approval's); the program's file name is one.
        "description": Path(args.program).name if args.program != "-" else "program from standard input",
        "cancel": cancel,
        "observer": observer,
        "approval_handler": _terminal_approver(args.program, err) if args.ask else None,
        "approval_store": cli_durable.open_store(args.approval_store) if args.approval_store else None,
    }
    options.update(cli_durable.state_option(args))
    return build("run_code", options)


@contextlib.contextmanager
def _ctrl_c_cancels() -> Iterator[Optional[threading.Event]]:
    """While the run runs, the first Ctrl-C cancels it (its logs and a
    ``cancelled`` error are still printed); a second one interrupts."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    cancel = threading.Event()

    def on_sigint(signum: int, frame: Any) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield cancel
    finally:
        signal.signal(signal.SIGINT, previous)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

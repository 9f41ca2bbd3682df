"""The ``nous-sched`` command: run a JavaScript program against a module of tools.

Usage::

    nous-sched run PROGRAM.js --tools MODULE [--max-parallel N] [--timeout S] [--cpu-time S]
                              [--runtime worker|in-process] [--trace FILE] [--json]
                              [--progress | --no-progress]
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

The program runs in a worker process that is killed at the deadline
(``--runtime worker``, the default), or in this process (``--runtime
in-process``). The first Ctrl-C cancels the run: what it logged so far is
printed, with a ``cancelled`` error; a second one interrupts at once.

Exit status: 0 when the program ran and returned a value, 1 when it failed
(the error kind is printed: exception, timeout, abort, invalid_output,
output_limit, cpu_time), 2 for a usage or configuration error (a message on standard
error, no traceback), 130 when cancelled or interrupted, 141 when standard
output was closed early (``| head``).
"""

from .loading import UsageError, load_tools
from .main import EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, PROG, build_parser, main
from .progress import Progress
from .render import format_trail, result_json

__all__ = [
    "main",
    "build_parser",
    "load_tools",
    "format_trail",
    "result_json",
    "Progress",
    "UsageError",
    "PROG",
    "EXIT_OK",
    "EXIT_FAILED",
    "EXIT_USAGE",
    "EXIT_INTERRUPTED",
    "EXIT_BROKEN_PIPE",
]

"""Loading what the command runs: the tools module and the program text.

Every failure is a :class:`UsageError` whose message names the argument and
what to fix; no traceback reaches the operator.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from ..tooling import Tool, loading

__all__ = ["UsageError", "load_tools", "read_program"]


class UsageError(Exception):
    """A usage or configuration problem: printed as ``nous-sched: <message>``, exit status 2."""


def load_tools(spec: str) -> list[Tool]:
    """The tools of module ``spec`` (a dotted name or a ``.py`` path): its ``TOOLS``, or what ``tools()`` returns
    (the one loader, :func:`nous_sched.tooling.loading.load_tools`).

    :raises UsageError: the module cannot be imported, defines neither, or
        they are not an iterable of :class:`~nous_sched.Tool` with distinct names.
    """
    try:
        return loading.load_tools(spec, "--tools")
    except loading.ToolSetError as exc:
        raise UsageError(str(exc)) from None


def read_program(spec: str, stdin: TextIO) -> str:
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

"""Exception types that cross the library's edge.

Only two kinds of failure are raised at a caller:

* :class:`ConfigError` - a caller passed something that cannot work (a bad
  option, a bad argument). The message names the option and what to fix.
* :class:`ToolError` - raised *by tools* (or by :meth:`Outcome.unwrap`) to fail
  one sub-call with a message meant for the program. Only ``tool`` and
  ``message`` ever reach a program: never the class, a traceback or a cause.

Everything that happens while a program runs is data, not an exception: see
:class:`~nous_sched.Outcome` and :class:`~nous_sched.RunResult`.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A misconfiguration: the message names the bad option and what it needs."""


class SnapshotError(ConfigError):
    """A value cannot be represented as JSON; the message gives its path."""


class ToolError(Exception):
    """Fail a sub-call with ``message``; the program sees ``{tool, message}``.

    Raise it from a tool to choose the message a program reads. Any other
    exception a tool raises also becomes a two-string error (its ``str``), but
    a ``ToolError`` says that the message was written for the program.
    """

    def __init__(self, message: str, tool: str | None = None) -> None:
        super().__init__(message)
        self.message = str(message)
        self.tool = tool

    def __str__(self) -> str:
        return self.message


class RunCodeError(ConfigError):
    """``run_code`` could not start the program at all: nothing ran."""

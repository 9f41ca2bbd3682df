"""Private: the checks of the options several entry points share, each written once.

``run_code``'s options are checked here, by :func:`check_run_options`, before
a run takes a worker, starts a thread or builds a scheduler: ``run_code``
calls it first thing, and ``run_code_tool`` and ``visible_tools`` (which pass
the same options on) call it when they are built. Every refusal is the one
:class:`~nous_sched.ConfigError` shape of :mod:`nous_sched._validators`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import _validators as v
from .events import SessionLog
from .gate.policy import PermissionPolicy
from .limits import Limits

__all__ = [
    "LIMITS",
    "OPTIONAL_LIMITS",
    "OPTIONAL_POLICY",
    "OPTIONAL_SESSION_LOG",
    "CANCEL",
    "RUN_OPTION_CHECKS",
    "check_run_options",
]

LIMITS = v.instance_of(Limits, "a nous_sched.Limits")
OPTIONAL_LIMITS = v.optional(LIMITS)
OPTIONAL_POLICY = v.optional(v.instance_of(PermissionPolicy, "a nous_sched.PermissionPolicy"))
OPTIONAL_SESSION_LOG = v.optional(v.instance_of(SessionLog, "a nous_sched.SessionLog"))
#: ``cancel=``: anything with ``is_set()`` (a ``threading.Event``; see :class:`nous_sched.runtime.Cancel`).
CANCEL = v.optional(v.Check("a threading.Event", lambda e: callable(getattr(e, "is_set", None))))

#: Each run_code option a caller sets, and its check. (``code``, ``tools``,
#: ``description`` and ``runtime`` have their own, in ``run_code`` itself.)
RUN_OPTION_CHECKS: dict[str, v.Check] = {
    "timeout": v.SECONDS,
    "limits": OPTIONAL_LIMITS,
    "policy": OPTIONAL_POLICY,
    "approval_handler": v.OPTIONAL_CALLABLE,
    "max_parallel": v.POSITIVE_INT,
    "executor": v.EXECUTOR,
    "call_id": v.OPTIONAL_STR,
    "dispatch": v.DISPATCH,
    "session_log": OPTIONAL_SESSION_LOG,
    "observer": v.OPTIONAL_CALLABLE,
    "cancel": CANCEL,
}


def check_run_options(owner: str, options: Mapping[str, Any]) -> None:
    """Raise :class:`~nous_sched.ConfigError` for the first of ``options`` that ``run_code`` would refuse.

    Only the options in :data:`RUN_OPTION_CHECKS` are looked at; ``timeout``
    only when no ``limits`` is given (``limits`` carries its own timeout and
    overrides it). Takes nothing, starts nothing.
    """
    for name, check in RUN_OPTION_CHECKS.items():
        if name not in options or (name == "timeout" and options.get("limits") is not None):
            continue
        v.require(owner, name, options[name], check)

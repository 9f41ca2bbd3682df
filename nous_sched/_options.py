"""Private: the checks of the options several entry points share, each written once.

:class:`~nous_sched.RunOptions` (:mod:`nous_sched._run.options`), the
:class:`~nous_sched.Scheduler` and ``call_tool`` check their options with
these. Every refusal is the one :class:`~nous_sched.ConfigError` shape of
:mod:`nous_sched._validators`.
"""

from __future__ import annotations

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
]

LIMITS = v.instance_of(Limits, "a nous_sched.Limits")
OPTIONAL_LIMITS = v.optional(LIMITS)
OPTIONAL_POLICY = v.optional(v.instance_of(PermissionPolicy, "a nous_sched.PermissionPolicy"))
OPTIONAL_SESSION_LOG = v.optional(v.instance_of(SessionLog, "a nous_sched.SessionLog"))
#: ``cancel=``: anything with ``is_set()`` (a ``threading.Event``; see :class:`nous_sched.runtime.Cancel`).
CANCEL = v.optional(v.Check("a threading.Event", lambda e: callable(getattr(e, "is_set", None))))

"""Throttles: limits shared across runs, waited for on the tool thread.

:class:`Throttle` is the door (``_throttle.py``); :class:`Hold`, one call's
claim on its throttles, is what :meth:`Throttle.hold` returns and what the
scheduler waits on and cancels for each throttled call. Inside: ``_arbiter.py``,
the pure FIFO with all-or-none grants and rate windows; ``_redis_throttle.py``,
leases and windows in Redis, shared across processes.
"""

from ._throttle import DEADLINE_PASSED, STOPPED, Hold, Throttle, throttle_names

__all__ = ["DEADLINE_PASSED", "STOPPED", "Hold", "Throttle", "throttle_names"]

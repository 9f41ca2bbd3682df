"""Throttles: limits shared across runs, waited for on the tool thread.

:class:`Throttle` is the door (``_throttle.py``). Inside: ``_arbiter.py``,
the pure FIFO with all-or-none grants and rate windows; ``_redis_throttle.py``,
leases and windows in Redis, shared across processes.
"""

from ._throttle import DEADLINE_PASSED, STOPPED, Throttle, throttle_names

__all__ = ["DEADLINE_PASSED", "STOPPED", "Throttle", "throttle_names"]

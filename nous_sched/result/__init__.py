"""What a run returns: :class:`RunResult`, :class:`RunError` and :data:`ERROR_KINDS`.

``_result.py`` is the door's; inside: ``usage.py`` (the ledger of where a
run's characters went), ``budget.py`` (the model-facing answer cut to N bytes,
structurally), ``records.py`` (CallRecord, LaneState: the trail), ``_hints.py``
(a run's hint) and ``_explain.py`` (each run error told with what to change).
"""

from ._result import ERROR_KINDS, RunError, RunResult

__all__ = ["ERROR_KINDS", "RunError", "RunResult"]

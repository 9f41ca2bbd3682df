"""The one gate every call passes, and what it asks: policy, schema, approval.

:class:`Gate` (``_gate.py``): run over, policy, budgets, the snapshot rules,
the schema, the refusal's audit. Inside: ``policy.py`` (PermissionPolicy),
``schema.py`` (a call's arguments against its tool's JSON Schema; ``_linear.py``:
the keywords rewritten to run in linear time), ``dispatch.py`` (RunContext,
CallInfo, current_call, approve, direct_dispatch: the gate's last step,
approval, then the tool; ``needs_approval``, the one approval rule),
``_admitted.py`` (the one way to run an admitted call: the scheduler's and
``call_tool``'s), ``approval_text.py`` (the question a person reads),
``approval_desk.py`` (an approval answered from another thread) and
``approval_seam.py`` (ApprovalStoreSeam: what ``approval_store=`` takes).
"""

from ._gate import BUDGET_SPENT, MAX_NAME_CHARS, NAME_TOO_LONG, REFUSAL_REASONS, Admitted, Gate, callers_rule

__all__ = ["Admitted", "BUDGET_SPENT", "Gate", "MAX_NAME_CHARS", "NAME_TOO_LONG", "REFUSAL_REASONS", "callers_rule"]

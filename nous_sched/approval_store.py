"""The approval stores' import path before they moved into :mod:`nous_sched.durable`.

Everything here is :mod:`nous_sched.durable.approval_store`'s (the stores,
their tokens and the threat model are described there);
``from nous_sched.approval_store import SqliteApprovalStore`` keeps working.
"""

from .durable.approval_store import (
    DEFAULT_TTL,
    ApprovalStore,
    RedisApprovalStore,
    SqliteApprovalStore,
    TokenError,
    UnsettledError,
)

__all__ = ["ApprovalStore", "SqliteApprovalStore", "RedisApprovalStore", "TokenError", "UnsettledError", "DEFAULT_TTL"]

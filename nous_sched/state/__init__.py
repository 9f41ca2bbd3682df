"""State across runs: one scope's JSON values by key, read and written by programs.

``run_code(..., state=State("conversation-42"))`` gives the program a
``state`` object: ``await state.get(key)`` (``null`` when absent),
``await state.set(key, value)``, ``await state.delete(key)`` and
``await state.keys()`` (``[{key, size}]``). Values are JSON, each write a
snapshot under the crossing rules, bounded by ``Limits.state_value_bytes``,
``state_keys`` and ``state_bytes``.

**Two runs of one scope at once.** Versioned writes that fail on conflict:
a run's ``set`` or ``delete`` of a key it read fails (a ``ToolError`` whose
message starts with ``conflict:``) when another run wrote that key since;
the program reads it again and retries. A write of a key the run never read
is unconditional. Every write is atomic in every store
(:class:`~nous_sched.StateStoreSeam`).

Stores: :class:`~nous_sched.MemoryStateStore` (the default, one per process, shared by
every ``State`` without a store), :class:`~nous_sched.SqliteStateStore`,
:class:`~nous_sched.RedisStateStore`; a new store implements :class:`~nous_sched.StateStoreSeam`
and passes ``tests/state_contract.py``.
"""

from ._memory import SHARED as SHARED_MEMORY
from ._memory import MemoryStateStore
from ._postgres import PostgresStateStore
from ._redis import RedisStateStore
from ._seam import Entry, KeyInfo, StateConflict, StateFull, StateStoreError, StateStoreSeam
from ._sqlite import SqliteStateStore
from ._state import MAX_KEY_CHARS, OPS, State, StateAnswer, StateSession, key_problem, open_state_store
from ._text import sdk_notes

__all__ = [
    "State",
    "StateStoreSeam",
    "MemoryStateStore",
    "SqliteStateStore",
    "RedisStateStore",
    "PostgresStateStore",
    "Entry",
    "KeyInfo",
    "StateConflict",
    "StateFull",
    "StateStoreError",
    "StateAnswer",
    "StateSession",
    "MAX_KEY_CHARS",
    "OPS",
    "key_problem",
    "sdk_notes",
    "open_state_store",
    "SHARED_MEMORY",
]

"""What the SDK text says about a run's state: that it exists, how to use it, and what it holds."""

from __future__ import annotations

from typing import Optional, Union

from ..crossing import dumps
from ._state import State

__all__ = ["sdk_notes", "MAX_LISTED_CHARS"]

#: The most characters the list of keys takes in the SDK text (the rest: ``state.keys()``).
MAX_LISTED_CHARS = 1_500
_KEY_CHARS = 60

_API = (
    "\n// State across programs{scope}: JSON values by key that later programs read too.\n"
    "//   await state.get(key)         // the value, or null when absent\n"
    "//   await state.set(key, value)  // write (JSON, bounded); if another run changed a key this program\n"
    '//                                // read since, it throws ToolError "conflict: ..." (read again, retry)\n'
    "//   await state.delete(key)\n"
    "//   await state.keys()           // [{{ key, size }}], size in bytes of JSON\n"
)
_LINE = (
    "\n// `state` keeps JSON values across programs: await state.get(key) / set(key, value) / delete(key) / keys().\n"
)


def _shown(key: str) -> str:
    text = dumps(key)  # ASCII: any character a key holds is an escape here
    return text if len(text) <= _KEY_CHARS else text[: _KEY_CHARS - 2] + '…"'


def _held(state: State, room: int) -> str:
    infos = state.keys()
    if not infos:
        return "// It holds nothing yet.\n"
    total = sum(i.size for i in infos)
    head = f"// It holds {len(infos)} key(s), {total:,} bytes, as this was written:"
    lines, used = [], len(head)
    for n, info in enumerate(infos):
        part = f" {_shown(info.key)} ({info.size:,})"
        more = f" and {len(infos) - n} more (state.keys())"
        if used + len(part) + len(more) + 1 > room:
            lines.append(more if n else " see state.keys()")
            break
        lines.append(part)
        used += len(part)
    return head + ",".join(lines) + "\n"


def sdk_notes(state: Union[State, str, None], budget: Optional[int]) -> list[str]:
    """The state's notes for the SDK text, longest first (each shorter one fits where the one
    before it does not): the API with the keys held, the API alone, one line; ``[""]`` for no state.
    ``state`` may be words saying whose scope each run gets (serve-mcp: no keys are listed).

    The store is read once, here: a store that cannot answer leaves the keys out."""
    if state is None:
        return [""]
    if isinstance(state, str):
        return [_API.format(scope=f" ({state[:80]})"), _LINE, ""]
    api = _API.format(scope=f" (scope {_shown(state.scope)})")
    room = MAX_LISTED_CHARS if budget is None else min(MAX_LISTED_CHARS, max(budget // 8, 200))
    try:
        held = _held(state, room)
    except Exception:  # a store down while the description is made: the program can still ask state.keys()
        held = ""
    return [api + held, api, _LINE, ""]

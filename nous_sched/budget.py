"""The model-facing output budget: a run's answer cut to N characters, structurally, never silently.

What goes back to the model after a run (``{"logs", "result"}`` or
``{"logs", "error"}``) is JSON text, and the model pays for every character
of it. :func:`fit` cuts that answer so its text (``json.dumps(...,
ensure_ascii=False)``, as the adapters write it) is at most ``budget``
characters and is still valid JSON, and says in place what it left out:

* an **array** keeps its first items and ends with the string
  ``"… 4,990 more items"``;
* an **object** keeps its first keys and ends with the key ``"…"`` whose value
  is ``"3 more keys"``;
* a **string** keeps a head and ends with ``"… [12,345 more characters]"``;
* the **logs** keep their first and last lines, with ``"… [N lines omitted]"``
  between them (a long line is cut as a string);
* an **error** keeps its kind; its message is cut as a string.

A value too small to cut further (a number, ``true``) that no longer fits is
left out with its container's count. Nothing is cut when the answer fits.
"""

from __future__ import annotations

import json
from typing import Any, Optional

__all__ = ["fit", "size", "DEFAULT_OUTPUT_BUDGET", "MIN_OUTPUT_BUDGET", "MORE_KEYS"]

#: ``run_code_tool``'s default budget, in characters (about 5,000 tokens).
DEFAULT_OUTPUT_BUDGET = 20_000
#: The smallest budget accepted: room for the answer's frame and its markers.
MIN_OUTPUT_BUDGET = 200
#: The key an object's marker is written under.
MORE_KEYS = "…"
# Room a container keeps for the marker it may have to add.
_MARKER_ROOM = 40


class _NoFit:
    """What a value that cannot be made to fit becomes: its parent counts it as left out."""


_NO_FIT = _NoFit()


def size(value: Any) -> int:
    """The characters of ``value``'s JSON text as the model reads it."""
    return len(json.dumps(value, ensure_ascii=False))


def _more_characters(left: int) -> str:
    return f"… [{left:,} more characters]"


def _more_items(left: int) -> str:
    return f"… {left:,} more items"


def _more_keys(left: int) -> str:
    return f"{left:,} more keys"


def _lines_omitted(left: int) -> str:
    return f"… [{left:,} lines omitted]"


def fit(answer: dict[str, Any], budget: int) -> dict[str, Any]:
    """``answer`` (``{"logs", "result"}`` or ``{"logs", "error": {kind, message}}``)
    cut so that :func:`size` of it is at most ``budget`` (at least
    :data:`MIN_OUTPUT_BUDGET`); ``answer`` itself when it fits."""
    if size(answer) <= budget:
        return answer
    logs = list(answer.get("logs", ()))
    main_key = "error" if "error" in answer else "result"
    main = answer.get(main_key)
    frame = size({"logs": [], main_key: None})
    room = budget - frame
    logs_size, main_size = size(logs), size(main)
    # Whichever part fits in half the room keeps all it needs; the other gets the rest.
    if logs_size <= room // 2:
        logs_room, main_room = logs_size, room - logs_size + 4  # + "null"
    elif main_size <= room // 2:
        logs_room, main_room = room - main_size + 4, main_size
    else:
        logs_room, main_room = room // 2, room - room // 2 + 4
    fitted = {"logs": fit_logs(logs, logs_room), main_key: _fit_main(main_key, main, main_room)}
    if size(fitted) <= budget:
        return fitted
    return _last_resort(logs, main_key, main)  # not reached while the budgets above add up


def _fit_main(key: str, value: Any, room: int) -> Any:
    if key == "error" and isinstance(value, dict) and isinstance(value.get("message"), str):
        frame = size({**value, "message": ""}) - 2
        message = fit_value(value["message"], max(room - frame, 0))
        if not isinstance(message, _NoFit):
            return {**value, "message": message}
    fitted = fit_value(value, room)
    if isinstance(fitted, _NoFit):
        return _more_characters(size(value))
    return fitted


def _last_resort(logs: list[Any], key: str, value: Any) -> dict[str, Any]:
    return {"logs": [_lines_omitted(len(logs))] if logs else [], key: _more_characters(size(value))}


def fit_value(value: Any, room: int) -> Any:
    """``value`` cut to at most ``room`` characters of JSON, or a marker-free
    sentinel when not even a cut form fits (the caller counts it as left out)."""
    if size(value) <= room:
        return value
    if isinstance(value, str):
        return _fit_str(value, room)
    if isinstance(value, list):
        return _fit_list(value, room)
    if isinstance(value, dict):
        return _fit_dict(value, room)
    return _NO_FIT


def _fit_str(text: str, room: int) -> Any:
    """The longest head of ``text`` that, with its marker, fits ``room``."""
    low, high = 0, min(len(text) - 1, room)
    best: Optional[str] = None
    while low <= high:
        keep = (low + high) // 2
        candidate = text[:keep] + _more_characters(len(text) - keep)
        if size(candidate) <= room:
            best, low = candidate, keep + 1
        else:
            high = keep - 1
    return _NO_FIT if best is None else best


def _fit_list(items: list[Any], room: int) -> Any:
    kept: list[Any] = []
    used = 2  # []
    for item in items:
        sep = 2 if kept else 0
        reserve = len(_more_items(len(items))) + 4
        fitted = fit_value(item, room - used - sep - reserve)
        if isinstance(fitted, _NoFit):
            break
        kept.append(fitted)
        used += sep + size(fitted)
    if len(kept) < len(items):
        kept.append(_more_items(len(items) - len(kept)))
    return kept if size(kept) <= room else _NO_FIT


def _fit_dict(obj: dict[str, Any], room: int) -> Any:
    kept: dict[str, Any] = {}
    used = 2  # {}
    marker_key = _marker_key(obj)
    for key, item in obj.items():
        sep = 2 if kept else 0
        head = size(key) + 2
        reserve = size(marker_key) + len(_more_keys(len(obj))) + 8
        fitted = fit_value(item, room - used - sep - head - reserve)
        if isinstance(fitted, _NoFit):
            break
        kept[key] = fitted
        used += sep + head + size(fitted)
    if len(kept) < len(obj):
        kept[marker_key] = _more_keys(len(obj) - len(kept))
    return kept if size(kept) <= room else _NO_FIT


def _marker_key(obj: dict[str, Any]) -> str:
    key = MORE_KEYS
    while key in obj:  # an object that already has the key "…": one that it does not have
        key += "…"
    return key


def fit_logs(lines: list[Any], room: int) -> list[Any]:
    """The log lines within ``room`` characters: the first and last lines, with
    ``"… [N lines omitted]"`` between them; a line too long for its half is cut."""
    if size(lines) <= room:
        return lines
    reserve = len(_lines_omitted(len(lines))) + 6
    half = max((room - 2 - reserve) // 2, 0)
    head = _take(lines, half)
    tail = _take(lines[len(head) :][::-1], half)[::-1]
    omitted = len(lines) - len(head) - len(tail)
    kept = [*head, _lines_omitted(omitted), *tail] if omitted else [*head, *tail]
    if size(kept) <= room:
        return kept
    return [_lines_omitted(len(lines))] if size([_lines_omitted(len(lines))]) <= room else []


def _take(lines: list[Any], room: int) -> list[Any]:
    """Lines from the front of ``lines`` within ``room`` characters (separators
    counted); the first that does not fit is cut to the room left, if it can be."""
    taken: list[Any] = []
    used = 0
    for line in lines:
        sep = 2 if taken else 0
        line_size = size(line)
        if used + sep + line_size <= room:
            taken.append(line)
            used += sep + line_size
            continue
        cut = fit_value(line, room - used - sep)
        if not isinstance(cut, _NoFit):
            taken.append(cut)
        break
    return taken

"""The model-facing output budget: a run's answer cut to N bytes, structurally, never silently.

What goes back to the model after a run (``{"logs", "result"}``,
``{"logs", "error"}`` or ``{"logs", "suspended"}``) is JSON text, and the
model pays for all of it. :func:`fit` cuts that answer so its text
(``json.dumps(..., ensure_ascii=False)``, as the adapters write it) is at
most ``budget`` **bytes of UTF-8** and is still valid JSON, and says in place
what it left out.

Why bytes: a model's tokenizer reads text as UTF-8 bytes and no token is
shorter than one byte, so N bytes bound the tokens of any text, whatever its
script. A code point does not: one astral character (an emoji, a CJK
extension character) is 4 bytes, and a 20,000-character budget let through
80,000 bytes of them. A lone surrogate, which no UTF-8 text can hold, is
counted as the 6 bytes of its ``\\udXXX`` escape, the most any output path
writes for it (ASCII text is as many bytes as characters). The markers below count what they left out in characters
(code points) of the value, or in items, keys and lines.

* an **array** keeps its first items and ends with the string
  ``"… 4,990 more items"``;
* an **object** keeps its first keys and ends with the key ``"…"`` whose value
  is ``"3 more keys"``;
* a **string** keeps a head and ends with ``"… [12,345 more characters]"``;
* the **logs** keep their first and last lines, with ``"… [N lines omitted]"``
  between them (a long line is cut as a string);
* an **error** keeps its kind; its message is cut as a string;
* a **suspension** (a durable run waiting for approval, :mod:`nous_sched.durable`)
  always keeps its ``token`` and ``expires_at`` whole; each pending call
  keeps its ``seq`` and ``tool`` and gets an equal share of the rest, its
  ``arguments`` (then ``description``, ``site``, ``committed``) cut as an
  object; when not even that fits every call, the first ones are kept and
  the list ends with ``"… N more items"``. It is never dropped, and never
  turned into an error.

A value too small to cut further (a number, ``true``) that no longer fits is
left out with its container's count. Nothing is cut when the answer fits.
"""

from __future__ import annotations

import json
from typing import Any, Optional

__all__ = ["fit", "size", "utf8_size", "DEFAULT_OUTPUT_BUDGET", "MIN_OUTPUT_BUDGET", "MORE_KEYS"]

#: ``run_code_tool``'s default budget, in bytes of UTF-8 (at most 20,000 tokens; about 5,000 of English).
DEFAULT_OUTPUT_BUDGET = 20_000
#: The smallest budget accepted, in bytes: room for the answer's frame and its
#: markers, and for a suspension's token with the count of its pending calls.
MIN_OUTPUT_BUDGET = 256
#: The key an object's marker is written under.
MORE_KEYS = "…"
# Room a container keeps for the marker it may have to add.
_MARKER_ROOM = 40


class _NoFit:
    """What a value that cannot be made to fit becomes: its parent counts it as left out."""


_NO_FIT = _NoFit()


def size(value: Any) -> int:
    """The bytes of ``value``'s JSON text as the model reads it: the UTF-8 of
    ``json.dumps(value, ensure_ascii=False)``, a lone surrogate counted as
    its 6-byte escape."""
    return utf8_size(json.dumps(value, ensure_ascii=False))


def utf8_size(text: str) -> int:
    """The UTF-8 bytes of ``text``, a lone surrogate counted as its 6-byte ``\\udXXX`` escape."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "backslashreplace"))


def _more_characters(left: int) -> str:
    return f"… [{left:,} more characters]"


def _more_items(left: int) -> str:
    return f"… {left:,} more items"


def _more_keys(left: int) -> str:
    return f"{left:,} more keys"


def _lines_omitted(left: int) -> str:
    return f"… [{left:,} lines omitted]"


def fit(answer: dict[str, Any], budget: int) -> dict[str, Any]:
    """``answer`` (``{"logs", "result"}``, ``{"logs", "error": {kind, message}}``
    or ``{"logs", "suspended": {token, expires_at, pending}}``)
    cut so that :func:`size` of it is at most ``budget`` bytes (at least
    :data:`MIN_OUTPUT_BUDGET`); ``answer`` itself when it fits."""
    if size(answer) <= budget:
        return answer
    logs = list(answer.get("logs", ()))
    main_key = next((key for key in ("error", "suspended") if key in answer), "result")
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
    if main_key == "suspended" and isinstance(main, dict):  # the suspension's token is kept, whatever the logs
        floor = size(_bare_suspension(main))
        if main_room < floor:
            logs_room, main_room = max(logs_room - (floor - main_room), 0), floor
    fitted = {"logs": fit_logs(logs, logs_room), main_key: _fit_main(main_key, main, main_room)}
    if size(fitted) <= budget:
        return fitted
    return _last_resort(logs, main_key, main)  # not reached while the budgets above add up


def _fit_main(key: str, value: Any, room: int) -> Any:
    if key == "suspended" and isinstance(value, dict):
        return _fit_suspension(value, room)
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
    main = _bare_suspension(value) if isinstance(value, dict) and key == "suspended" else _more_characters(size(value))
    return {"logs": [_lines_omitted(len(logs))] if logs else [], key: main}


# -- a suspension: its token always, then each pending call's seq and tool, then their arguments --------


def _bare_suspension(suspension: dict[str, Any]) -> dict[str, Any]:
    """The least a suspension is cut to: its token and expiry, and how many calls are pending."""
    pending = suspension.get("pending") or []
    head = {key: item for key, item in suspension.items() if key != "pending"}
    return {**head, "pending": [_more_items(len(pending))] if pending else []}


def _fit_suspension(suspension: dict[str, Any], room: int) -> dict[str, Any]:
    pending = list(suspension.get("pending") or [])
    head = {key: item for key, item in suspension.items() if key != "pending"}
    pending_room = room - size({**head, "pending": []}) + 2
    fitted = _fit_pending(pending, pending_room)
    return _bare_suspension(suspension) if isinstance(fitted, _NoFit) else {**head, "pending": fitted}


def _fit_pending(requests: list[Any], room: int) -> Any:
    """Every pending call with an equal share of ``room``, else the first ones
    that fit, the list ending with how many more are pending."""
    if size(requests) <= room:
        return requests
    share = (room - 2 - 2 * (len(requests) - 1)) // len(requests)
    shared: list[Any] = []
    for request in requests:
        fitted = _fit_request(request, share)
        if isinstance(fitted, _NoFit):
            break
        shared.append(fitted)
    if len(shared) == len(requests) and size(shared) <= room:
        return shared
    kept: list[Any] = []
    used, reserve = 2, size(_more_items(len(requests))) + 2
    for request in requests:
        sep = 2 if kept else 0
        fitted = _fit_request(request, room - used - sep - reserve)
        if isinstance(fitted, _NoFit):
            break
        kept.append(fitted)
        used += sep + size(fitted)
    kept.append(_more_items(len(requests) - len(kept)))
    return kept if size(kept) <= room else _NO_FIT


def _fit_request(request: Any, room: int) -> Any:
    """A pending call within ``room``: its seq and tool whole, then its arguments
    cut (or, when none of them fits, their size said in their place), then the
    rest cut as an object; the sentinel when not even its seq and tool fit."""
    if size(request) <= room:
        return request
    if not isinstance(request, dict):
        return _NO_FIT
    head = {key: request[key] for key in ("seq", "tool") if key in request}
    if "arguments" in request:
        arguments = request["arguments"]
        arguments_room = room - size(head) - size({"arguments": None}) + 4 - _MARKER_ROOM
        cut = fit_value(arguments, arguments_room)
        head["arguments"] = _more_characters(size(arguments)) if isinstance(cut, _NoFit) else cut
    rest = {key: item for key, item in request.items() if key not in head}
    rest_cut = fit_value(rest, room - size(head)) if rest else {}
    if isinstance(rest_cut, _NoFit):
        rest_cut = {MORE_KEYS: _more_keys(len(rest))}
    fitted = {**head, **rest_cut}
    return fitted if size(fitted) <= room else _NO_FIT


def fit_value(value: Any, room: int) -> Any:
    """``value`` cut to at most ``room`` bytes of JSON, or a marker-free
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
        reserve = size(_more_items(len(items))) + 2
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
        reserve = size(marker_key) + size(_more_keys(len(obj))) + 6
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
    """The log lines within ``room`` bytes: the first and last lines, with
    ``"… [N lines omitted]"`` between them; a line too long for its half is cut."""
    if size(lines) <= room:
        return lines
    reserve = size(_lines_omitted(len(lines))) + 4
    half = max((room - 2 - reserve) // 2, 0)
    head = _take(lines, half)
    tail = _take(lines[len(head) :][::-1], half)[::-1]
    omitted = len(lines) - len(head) - len(tail)
    kept = [*head, _lines_omitted(omitted), *tail] if omitted else [*head, *tail]
    if size(kept) <= room:
        return kept
    return [_lines_omitted(len(lines))] if size([_lines_omitted(len(lines))]) <= room else []


def _take(lines: list[Any], room: int) -> list[Any]:
    """Lines from the front of ``lines`` within ``room`` bytes (separators
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

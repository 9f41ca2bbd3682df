"""Blob handles: a large tool result stays on the host, the program gets a handle.

Within a run, a tool's result whose JSON text (as it would cross into the
program: :func:`nous_sched.crossing.dumps`) is over ``Limits.blob_bytes``
does not cross whole. The largest parts of it that must stay behind (a long
string, a big array or object, or the whole result) are kept in the run's
:class:`BlobStore`, and each is replaced, in what the program receives, by
its *handle*, a small JSON object::

    {"$blob": "blob-<32 hex digits>", "kind": "text", "size": 10485762,
     "length": 10485760, "preview": "the first 80 characters…"}

``kind`` is ``"text"`` for a string, ``"json"`` for any other value;
``size`` the UTF-8 bytes of the value's JSON text (as the audit counts a
result); ``length`` what :meth:`BlobStore.read` slices: the string's
characters (code points) for ``"text"``, the characters of the value's JSON
text for ``"json"``; ``preview`` the first :data:`PREVIEW_CHARS` of those.
A part is kept open (its small members cross, its big ones become handles)
when that brings it within the limit; else it is held whole. What crosses
is then within ``Limits.blob_bytes`` (plus, at most, one handle).

What a program can do with a handle:

* **pass it** as an argument, anywhere inside a call's arguments: the gate
  puts the exact value back (:meth:`BlobStore.substitute`) before the tool's
  schema is checked, so the schema checks, and the tool gets, the value
  itself; the audit, the approval question's record and live events keep the
  arguments as the program wrote them (the handle). An object with a
  ``"$blob"`` key whose id is not one of the run's is refused (the call never
  reaches the tool): ids are random (128 bits), so another run's handle, or
  one made up, is never found;
* **read it** in slices, ``await blobs.read(handle, start, length)``: at
  most ``Limits.blob_bytes`` characters a read (:meth:`BlobStore.read`);
* **return or log it**: it is a small JSON object, so every output (the
  result, logs, the audit, live events, MCP) shows the handle, never the value.

Handles live as long as the run, or as long as a state scope
(``nous_sched.State``) they were stored in. The glue, for the run's
``state.set``: :func:`keep_in_scope` writes each blob whose handle a value
holds into the scope (key ``"$blob:<id>"``, beside the value's own key), and a
run of that scope makes its store with ``parent=scope_lookup(state)``, so it
finds those ids too; a run of another scope (or none) does not.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from typing import Any, Callable, Optional, Union

import attrs

from .crossing import dumps, loads
from .outcome import Outcome, quote_name

__all__ = [
    "keep_in_scope",
    "handle_ids",
    "scope_lookup",
    "SCOPE_PREFIX",
    "Blob",
    "BlobStore",
    "KEY",
    "PREVIEW_CHARS",
    "READ_LABEL",
    "READ_QUESTION",
    "NO_BLOBS",
    "is_handle",
]

#: The key that marks a handle, its value the blob's id.
KEY = "$blob"
#: How many characters of a blob its handle shows.
PREVIEW_CHARS = 80
#: The name a read's refusal carries (the program's ``blobs.read``).
READ_LABEL = "blobs.read"
#: The question the prelude's ``blobs.read`` asks the host (``[READ_QUESTION, [handle, start, length]]``).
READ_QUESTION = "read_blob"
#: A read's refusal in a run that keeps no blobs.
NO_BLOBS = "this run keeps no blobs (Limits.blob_bytes is None), so it has no handle to read"
_PREFIX = "blob-"
_ID = re.compile(r"^blob-[0-9a-f]{32}$")
_MARK = '"' + KEY + '"'
_SHOWN_ID = 80
#: How deep a result is looked into for parts to hold (deeper, the part is held whole): each
#: level looked into encodes its members once, so this bounds the work to that many encodings.
_OPEN_DEPTH = 16
_MORE = "…"

NOT_FOUND = (
    "blob handle {id} is not one of this run's: a handle lives as long as the run that made it "
    "(or the state scope it was stored in); a handle from another run, or made up, is refused"
)


def is_handle(value: Any) -> bool:
    """Whether ``value`` is shaped as a handle: an object whose ``"$blob"`` is a string."""
    return isinstance(value, dict) and isinstance(value.get(KEY), str)


@attrs.frozen
class Blob:
    """One held value: its ``id``, the exact ``value`` (a snapshot: JSON-shaped,
    never changed), ``kind``, ``size``, ``length`` and ``preview`` as its
    handle shows them (see the module docstring)."""

    id: str
    value: Any = attrs.field(repr=False)
    kind: str
    size: int
    length: int
    preview: str

    def handle(self) -> dict[str, Any]:
        """The handle the program gets in the value's place."""
        return {KEY: self.id, "kind": self.kind, "size": self.size, "length": self.length, "preview": self.preview}

    def readable(self) -> str:
        """What :meth:`BlobStore.read` slices: the string, or the value's JSON text."""
        return self.value if isinstance(self.value, str) else dumps(self.value)


def _new_id() -> str:
    return _PREFIX + secrets.token_hex(16)


def _utf8(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _draft(value: Any, text: str, id: Optional[str] = None) -> Blob:
    """A blob of ``value`` (``text``, its crossing JSON), not yet in any store."""
    if isinstance(value, str):
        readable, kind = value, "text"
    else:
        readable, kind = text, "json"
    preview = readable[:PREVIEW_CHARS] + (_MORE if len(readable) > PREVIEW_CHARS else "")
    # The size the audit counts: the JSON text's UTF-8, nothing escaped (ASCII text as it is).
    size = len(text) if "\\u" not in text else _utf8(_unescaped(value))
    return Blob(_new_id() if id is None else id, value, kind, size, len(readable), preview)


def _unescaped(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class _Plan:
    """What :meth:`BlobStore.hold` does with one part: keep it, open it (its members' plans), or hold it."""

    __slots__ = ("size", "was", "members", "blob")

    def __init__(self, size: int, members: Any = None, blob: Optional[Blob] = None) -> None:
        self.size = size  # of what crosses for this part
        self.was = size  # of the part's own text
        self.members = members
        self.blob = blob


def _no_store() -> None:
    """What a pickled :class:`BlobStore` becomes: none (see ``BlobStore.__reduce__``)."""
    return None


class BlobStore:
    """One run's held values, by id; thread-safe (tool threads add, the run's thread reads).

    :param limit: ``Limits.blob_bytes``: a result whose JSON text is over it
        is held (in part or whole), and a read returns at most this many characters.
    :param parent: asked for an id this store does not hold (a state scope's
        blobs), ``parent(id) -> Blob | None``; ``None``: the run's own only.
    """

    def __init__(self, limit: int, parent: Optional[Callable[[str], Optional[Blob]]] = None) -> None:
        self.limit = limit
        self._parent = parent
        self._lock = threading.Lock()
        self._blobs: dict[str, Blob] = {}  # guarded by _lock (writers); readers take a dict get
        # A "json" blob's text, made on its first read and kept for the next slices (the run's thread only).
        self._texts: dict[str, str] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled with a call for an executor that serializes it (Dask, a process pool): the
        # held values must stay in the run's own process, so there the call holds nothing and
        # its result crosses whole (within the run's other limits).
        return (_no_store, ())

    # -- holding ----------------------------------------------------------------------------

    def hold(self, value: Any, text: str) -> tuple[Any, str, tuple[Blob, ...]]:
        """``value`` (a snapshot, ``text`` its ``nous_sched.crossing.dumps``) as the program gets it:
        ``(value, text, blobs made)``, the same three when it is within the limit."""
        if len(text) <= self.limit:
            return value, text, ()
        plan = self._plan(value, text)
        made: list[Blob] = []
        held = _apply(value, plan, made)
        with self._lock:
            for blob in made:
                self._blobs[blob.id] = blob
        return held, dumps(held), tuple(made)

    def _plan(self, value: Any, text: str, depth: int = 0) -> _Plan:
        size = len(text)
        if size <= self.limit:
            return _Plan(size)
        if depth < _OPEN_DEPTH and isinstance(value, (dict, list)) and value:
            # Each member's text is made once, here; only a member over the limit is planned further.
            opened = size
            members: Any
            if isinstance(value, dict):
                members = {}
                for key, member in value.items():
                    members[key] = plan = self._member(member, depth)
                    opened += plan.size - plan.was
            else:
                members = []
                for member in value:
                    members.append(plan := self._member(member, depth))
                    opened += plan.size - plan.was
            if opened <= self.limit:
                return _Plan(opened, members)
        blob = _draft(value, text)
        return _Plan(len(dumps(blob.handle())), None, blob)

    def _member(self, value: Any, depth: int) -> _Plan:
        text = dumps(value)
        plan = self._plan(value, text, depth + 1)
        plan.was = len(text)
        return plan

    def add(self, blob: Blob) -> None:
        """Hold ``blob`` under its own id (a state scope's blob)."""
        with self._lock:
            self._blobs[blob.id] = blob

    def adopt(self, id: str, value: Any) -> None:
        """Hold ``value`` (JSON-shaped, as a ledger keeps it) under ``id``, as the run that
        made it did (a durable run's replay); an ``id`` that is not a blob's is ignored."""
        if isinstance(id, str) and _ID.match(id):
            self.add(_draft(value, dumps(value), id))

    # -- finding ----------------------------------------------------------------------------

    def blob(self, id: Any) -> Optional[Blob]:
        """The blob ``id`` names (this run's, or its parent's), or ``None``."""
        if not isinstance(id, str) or not _ID.match(id):
            return None
        found = self._blobs.get(id)
        if found is None and self._parent is not None:
            found = self._parent(id)
            if found is not None:  # read from the scope once: the next slices are the run's
                self.add(found)
        return found

    def blobs(self) -> tuple[Blob, ...]:
        """Every blob this run holds, oldest first."""
        with self._lock:
            return tuple(self._blobs.values())

    def substitute(self, args: dict[str, Any], text: Optional[str] = None) -> Union[dict[str, Any], str]:
        """``args`` with every handle in them replaced by a copy of its value, or
        the refusal's message (a handle this run does not hold). ``text``, the JSON
        the arguments were parsed from, when known: without the key in it there is
        nothing to walk."""
        if text is not None and _MARK not in text:
            return args
        try:
            return _replace(args, self, 0)  # type: ignore[no-any-return]
        except _Unknown as exc:
            return NOT_FOUND.format(id=_shown(exc.args[0]))

    # -- reading ----------------------------------------------------------------------------

    def read(self, args: Any) -> Outcome:
        """The answer to ``blobs.read(handle, start, length)`` (``args``, the JSON
        array the prelude sends): a string, the characters ``[start, start +
        length)`` of the blob, at most ``limit`` of them (``length`` defaults
        to that, and more is cut to it), empty past its end. Never raises."""
        if not isinstance(args, list) or not args:
            return Outcome.failure(READ_LABEL, "expects a blob handle, e.g. blobs.read(handle, 0, 1000)")
        handle = args[0]
        id = handle.get(KEY) if isinstance(handle, dict) else handle
        if not isinstance(id, str):
            return Outcome.failure(READ_LABEL, 'expects a blob handle (an object with "$blob") or its id')
        start = args[1] if len(args) > 1 else 0
        length = args[2] if len(args) > 2 else self.limit
        for option, n in (("start", start), ("length", length)):
            if not (isinstance(n, int) and not isinstance(n, bool) and n >= 0):
                return Outcome.failure(READ_LABEL, f"`{option}` must be an integer of at least 0")
        blob = self.blob(id)
        if blob is None:
            return Outcome.failure(READ_LABEL, NOT_FOUND.format(id=_shown(id)))
        readable = self._texts.get(blob.id)
        if readable is None:
            readable = blob.readable()
            if blob.kind == "json":
                self._texts[blob.id] = readable
        return Outcome.success(readable[start : start + min(length, self.limit)])


class _Unknown(Exception):
    pass


def _shown(id: str) -> str:
    return quote_name(id if len(id) <= _SHOWN_ID else id[:_SHOWN_ID] + _MORE)


def _apply(value: Any, plan: _Plan, made: list[Blob]) -> Any:
    if plan.blob is not None:
        made.append(plan.blob)
        return plan.blob.handle()
    if plan.members is None:
        return value
    if isinstance(value, dict):
        return {k: _apply(v, plan.members[k], made) for k, v in value.items()}
    return [_apply(v, p, made) for v, p in zip(value, plan.members, strict=True)]


def _replace(value: Any, store: BlobStore, depth: int) -> Any:
    if isinstance(value, dict):
        if isinstance(value.get(KEY), str):
            blob = store.blob(value[KEY])
            if blob is None:
                raise _Unknown(str(value[KEY]))
            return _copy(blob.value)
        return {k: _replace(v, store, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v, store, depth + 1) for v in value]
    return value


def _copy(value: Any) -> Any:
    """A copy the tool may change without changing the blob (strings and numbers are immutable)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


# -- the state glue: a handle stored in a scope keeps its blob there ----------------------

#: The key prefix under which a state scope keeps a blob a program stored a handle to.
SCOPE_PREFIX = "$blob:"


def handle_ids(value: Any, depth: int = 0) -> list[str]:
    """The ids of every handle inside ``value``, in order, each once."""
    found: dict[str, None] = {}
    _ids(value, found, depth)
    return list(found)


def _ids(value: Any, found: dict[str, None], depth: int) -> None:
    if isinstance(value, dict):
        if isinstance(value.get(KEY), str):
            found[value[KEY]] = None
            return
        for member in value.values():
            _ids(member, found, depth + 1)
    elif isinstance(value, list):
        for member in value:
            _ids(member, found, depth + 1)


def keep_in_scope(blobs: BlobStore, state: Any, value: Any, limits: Any) -> Optional[tuple[str, str]]:
    """Before ``state.set(key, value)`` in a run: write every blob whose handle
    ``value`` holds into ``state``'s scope (a :class:`~nous_sched.State`), key
    ``SCOPE_PREFIX + id``, bounded by ``limits``' ``state_*`` fields. ``None``
    when done, else why not, ``(error, message)``: ``"invalid"`` (a handle the
    run does not hold) or ``"limit"`` (a blob too big for the scope); then the
    caller writes nothing."""
    from .state import StateFull  # the glue only: blobs need no state otherwise

    for id in handle_ids(value):
        blob = blobs.blob(id)
        if blob is None:
            return "invalid", NOT_FOUND.format(id=_shown(id))
        text = dumps(blob.value)
        if len(text) > limits.state_value_bytes:
            return "limit", (
                f"the blob {_shown(id)} is {len(text)} bytes of JSON, over the limit of "
                f"{limits.state_value_bytes} for one state value (Limits.state_value_bytes): nothing was written"
            )
        try:
            state.store.write(
                state.scope, SCOPE_PREFIX + id, text, max_keys=limits.state_keys, max_bytes=limits.state_bytes
            )
        except StateFull as exc:
            return "limit", f"the scope has no room for the blob {_shown(id)} ({exc}): nothing was written"
    return None


def scope_lookup(state: Any) -> Callable[[str], Optional[Blob]]:
    """``parent=`` for a run's :class:`BlobStore` whose run has ``state``: the blobs its scope keeps."""

    def find(id: str) -> Optional[Blob]:
        entry = state.store.read(state.scope, SCOPE_PREFIX + id)
        if entry is None:
            return None
        return _draft(loads(entry.text), entry.text, id)

    return find

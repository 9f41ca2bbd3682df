"""Private: the one way a hot-path record is made and the one way it is read.

The scheduler's driver makes a few frozen records per tool call
(``ToolCallEvent``, ``ToolOutcomeEvent``, ``Event``, ``CallInfo``,
``Outcome``), and attrs' generated ``__init__`` (a frozen class's
``__setattr__`` per field, a converter call even for a value that is already
converted) costs about half again as much as setting the slots. A class
declared with :func:`record` is ``attrs.frozen`` in every other respect
(fields, equality, hash, repr, ``attrs.fields``, ``attrs.evolve``, pickling);
only its ``__init__`` is written here, once, at import: it takes the same
arguments attrs' would, runs each field's converter unless the value's type
is one the field declares ready (``metadata={"ready": types}``: the
converter would return it as it is), and sets each slot directly
(``tests/test_hot_path.py`` compares it with attrs' own).

A field may be *held* in a cheaper form and built on first read
(``metadata={"later": (form, build)}``): while the slot holds a value of
type ``form``, reading the attribute builds ``build(held)`` once, whichever
thread reads first, and keeps it in the slot. A ``tuple`` form names its
``mark`` too (``metadata={"mark": mark}``): the constructor takes a tuple
whose first item is ``mark`` as held, and converts any other. A reader cannot tell: every
read, ``==``, ``repr`` and pickle see the built value. :func:`held` is the one
reader that sees the slot as it is (to tell whether a value was built yet).

So each such class is made one way (its constructor) and read one way (its
attributes); the speed lives here, not in the values.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import attrs

if TYPE_CHECKING:  # what tells mypy a record is an attrs class (its __init__, its fields)
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**kwargs: Any) -> Callable[[T], T]:
        return lambda decorated: decorated


T = TypeVar("T")

__all__ = ["record", "held", "READY", "LATER", "MARK"]

#: ``attrs.field(metadata=...)`` keys :func:`record` reads.
READY = "ready"
LATER = "later"
MARK = "mark"

_FIRST_READ = threading.RLock()  # reentrant: one field's build may read another's
_REQUIRED: Any = attrs.NOTHING
_HELD: dict[tuple[type, str], Callable[[Any], Any]] = {}


@dataclass_transform(frozen_default=True, field_specifiers=(attrs.field,))
def record(cls: type[T]) -> type[T]:
    """``cls`` as ``attrs.frozen`` makes it, with the ``__init__`` and readers described above.

    Every field default must be a plain value (no factory); a field with
    ``init=False`` is set to its default.
    """
    made: Any = attrs.frozen(cls, init=False)
    fields = attrs.fields(made)
    slots = {f.name: made.__dict__[f.name] for f in fields}  # the member descriptors attrs made
    made.__init__ = _init(made, fields, slots)
    for f in fields:
        if LATER in f.metadata:
            form, build = f.metadata[LATER]
            _HELD[made, f.name] = slots[f.name].__get__
            setattr(made, f.name, _reader(made, f.name, slots[f.name], form, build))
    return made  # type: ignore[no-any-return]


def held(obj: Any, name: str) -> Any:
    """The value of ``obj``'s field ``name`` as its slot holds it (a ``later`` field
    may still hold its cheaper form): only for telling whether it was built."""
    try:
        return _HELD[type(obj), name](obj)
    except KeyError:  # a subclass of the record: its slot is the record's
        return next(_HELD[c, name] for c in type(obj).__mro__ if (c, name) in _HELD)(obj)


def _init(cls: type, fields: Any, slots: dict[str, Any]) -> Callable[..., None]:
    """The ``__init__``: written out, one store per slot, as attrs and ``namedtuple``
    write theirs (a loop over the fields costs as much as the ``__init__`` it replaces).
    The text is made from this package's own field names, never from input."""
    scope: dict[str, Any] = {"type_of": type}  # a field may be named `type`
    params, body = [], []
    for i, f in enumerate(fields):
        scope[f"set{i}"] = slots[f.name].__set__
        if f.kw_only:
            raise TypeError(f"{cls.__name__}.{f.name}: a record's fields are positional")
        value = arg = f.alias or f.name
        if not f.init:
            scope[f"default{i}"] = _plain_default(cls, f)
            value = f"default{i}"
        else:
            if f.default is _REQUIRED:
                params.append(arg)
            else:
                scope[f"default{i}"] = _plain_default(cls, f)
                params.append(f"{arg}=default{i}")
            if f.converter is not None:
                scope[f"convert{i}"] = f.converter
                ready, mark = f.metadata.get(READY), f.metadata.get(MARK)
                if ready and mark is not None:  # a tuple form: held when its first item is the mark
                    scope[f"ready{i}"], scope[f"form{i}"], scope[f"mark{i}"] = (
                        frozenset(ready),
                        f.metadata[LATER][0],
                        mark,
                    )
                    body.append(
                        f"    if type_of({arg}) not in ready{i} and not"
                        f" (type_of({arg}) is form{i} and {arg} and {arg}[0] is mark{i}): {arg} = convert{i}({arg})"
                    )
                elif ready:
                    scope[f"ready{i}"] = frozenset(ready)
                    body.append(f"    if type_of({arg}) not in ready{i}: {arg} = convert{i}({arg})")
                else:
                    body.append(f"    {arg} = convert{i}({arg})")
        body.append(f"    set{i}(self, {value})")
    text = "\n".join([f"def __init__(self, {', '.join(params)}):", *body])
    exec(text, scope)  # noqa: S102 - the text above, from attribute names in this package
    init: Callable[..., None] = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


def _plain_default(cls: type, f: Any) -> Any:
    if isinstance(f.default, attrs.Factory):  # type: ignore[arg-type]
        raise TypeError(f"{cls.__name__}.{f.name}: a record's defaults are plain values")
    return f.default


def _reader(cls: type, name: str, slot: Any, form: type, build: Callable[[Any], Any]) -> property:
    get, put = slot.__get__, slot.__set__

    def read(self: Any) -> Any:
        value = get(self)
        if type(value) is form:
            with _FIRST_READ:  # two first readers get one value
                value = get(self)
                if type(value) is form:
                    value = build(value)
                    put(self, value)
        return value

    # The setter is the slot's own: pickling's __setstate__ sets fields through it;
    # the frozen class's __setattr__ still refuses everyone else.
    return property(read, put, doc=f"``{name}`` (built on first read when held as {form.__name__}).")

"""Private: a frozen attrs instance made with its slots set directly.

The scheduler's driver makes a few records per tool call, and attrs'
generated ``__init__`` (keyword binding, converters, the frozen class's
``__setattr__``) costs about half again as much as setting the slots. A
maker skips only that: it takes every field, in the order it was given the
names, already converted, and makes the instance ``cls(...)`` would
(``tests/test_hot_path.py`` compares them).
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

T = TypeVar("T")


def maker(cls: type[T], *names: str) -> Callable[..., T]:
    """``make(*values)``: a new ``cls`` whose slots ``names`` hold ``values``, no ``__init__`` run.

    The function is written out, one store per slot, as attrs and
    ``namedtuple`` write theirs: a loop over the slots costs as much as the
    ``__init__`` it replaces. ``names`` come from the code, never from input.
    """
    scope: dict[str, Any] = {"new": object.__new__, "cls": cls}
    params = [f"v{i}" for i in range(len(names))]
    lines = [f"def make({', '.join(params)}):", "    made = new(cls)"]
    for i, name in enumerate(names):
        scope[f"set{i}"] = cls.__dict__[name].__set__
        lines.append(f"    set{i}(made, v{i})")
    lines.append("    return made")
    exec("\n".join(lines), scope)  # noqa: S102 - the text above, from attribute names in this package
    make: Callable[..., T] = scope["make"]
    make.__qualname__ = f"make_{cls.__name__}"
    return make

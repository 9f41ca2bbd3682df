"""The manual's lists that come from the code, so they cannot drift from it.

Two directives:

``.. nous-generated:: WHAT``
    renders a list read from the code at build time: ``cli`` (the help of
    ``nous-sched`` and of each of its commands, from its argparse parser;
    ``cli COMMAND`` that command's alone),
    ``run-options`` (``run_code``'s options and their defaults, from its
    signature), ``error-kinds`` (:data:`nous_sched.ERROR_KINDS`), ``events``
    (the event vocabulary, ``nous_sched.events.VOCABULARY``) and ``api``
    (an autodoc entry for every name in ``nous_sched.__all__``).

``.. nous-checked:: WHAT``
    renders its content (prose the manual writes by hand: what each thread is
    for, what each error kind means) and checks it names exactly what the
    code has: ``threads`` (every thread, process or folder name the library
    gives, found in its source), ``error-kinds``, ``live-kinds`` (a run's live
    events) or ``limits`` (the fields of :class:`nous_sched.Limits`, each the
    first cell of a table row). A list item documents the literal it starts with. A name missing on either
    side is a warning, which ``sphinx-build -W`` makes an error.

``threads_in_code`` and ``names_in`` are also what ``tests/test_docs.py``
uses, so the test and the build agree on what "the code's list" is.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import pathlib
import re
from collections.abc import Iterable
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList
from sphinx.util import logging

logger = logging.getLogger(__name__)

PACKAGE = pathlib.Path(__file__).resolve().parent.parent.parent / "nous_sched"

# A thread, process or folder name the library gives: a string literal starting
# "nous-", up to where a number or id follows ("-{n}", '-"' + ...), or its end.
_NAME_LITERAL = re.compile(r"""["'](nous-[a-z]+(?:-[a-z]+)*)-?(?=["'{])""")
# Names in the code that are not threads, processes or folders.
_NOT_A_THREAD = {"nous-sched"}  # the command's own name (PROG, serve-mcp's server name)
# In the manual: ``nous-sched-tool-<k>``, ``nous-sched-progress``, ``nous-js-<n>``.
_NAME_IN_TEXT = re.compile(r"``(nous-[a-z]+(?:-[a-z]+)*)(?:-<[a-z]+>)?``")


def threads_in_code(package: pathlib.Path = PACKAGE) -> set[str]:
    """Every thread, process and folder name prefix that the library's source gives."""
    found: set[str] = set()
    for path in sorted(package.rglob("*.py")):
        found.update(_NAME_LITERAL.findall(path.read_text(encoding="utf-8")))
    return found - _NOT_A_THREAD


def names_in(text: str) -> set[str]:
    """The ``nous-...`` names a piece of the manual documents."""
    return set(_NAME_IN_TEXT.findall(text)) - _NOT_A_THREAD


def error_kinds() -> tuple[str, ...]:
    import nous_sched

    return tuple(nous_sched.ERROR_KINDS)


def live_kinds() -> tuple[str, ...]:
    """The kinds of a run's live events (:data:`nous_sched.live.EVENT_KINDS`)."""
    live = importlib.import_module("nous_sched.live")
    return tuple(live.EVENT_KINDS)


def event_vocabulary() -> list[dict[str, Any]]:
    """Every kind of thing that happens to a call or a run (``nous_sched.events.VOCABULARY``), as rows."""
    events = importlib.import_module("nous_sched.events")
    fields = ("name", "scope", "audit", "live", "meaning")
    return [{field: getattr(kind, field) for field in fields} for kind in events.VOCABULARY]


def kinds_in(text: str) -> list[str]:
    """The error kinds a list documents: the literal each item starts with."""
    return re.findall(r"^\s*\*\s+``([a-z_]+)``", text, re.M)


def limit_fields() -> tuple[str, ...]:
    """The fields of :class:`nous_sched.Limits`."""
    import attrs

    import nous_sched

    return tuple(field.name for field in attrs.fields(nous_sched.Limits))


def build_parser() -> argparse.ArgumentParser:
    """``nous-sched``'s parser, wherever the command's module lives."""
    cli = importlib.import_module("nous_sched.cli")
    build = getattr(cli, "build_parser", None)
    if build is None:
        build = importlib.import_module("nous_sched.cli.main").build_parser
    parser: argparse.ArgumentParser = build()
    return parser


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterable[tuple[tuple[str, ...], Any]]:
    yield path, parser
    # argparse lists a parser's subcommands nowhere public: the two private reads below.
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def cli_help() -> list[tuple[str, str]]:
    """(command, its ``--help`` text) for ``nous-sched`` and every command under it."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: one width for every build
    try:
        out = []
        for path, parser in _commands(build_parser()):
            out.append((" ".join(("nous-sched", *path)), parser.format_help()))
        return out
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved


def run_options() -> list[tuple[str, str]]:
    """(option, default) for each option of a run: ``RunOptions``' fields where the package has
    that class, and ``run_code``'s keyword options besides."""
    import nous_sched

    out: list[tuple[str, str]] = []
    options_class = getattr(nous_sched, "RunOptions", None)
    if options_class is not None:
        out += _fields(options_class)
    for name, parameter in inspect.signature(nous_sched.run_code).parameters.items():
        if any(name == known for known, _ in out):
            continue
        if parameter.kind is not inspect.Parameter.KEYWORD_ONLY:
            continue
        default = "required" if parameter.default is inspect.Parameter.empty else _spell(parameter.default)
        out.append((name, default))
    return out


def _fields(cls: type) -> list[tuple[str, str]]:
    import dataclasses

    import attrs

    if attrs.has(cls):
        pairs = [(f.name, f.default) for f in attrs.fields(cls)]
    elif dataclasses.is_dataclass(cls):
        pairs = [(f.name, f.default) for f in dataclasses.fields(cls)]
    else:
        parameters = inspect.signature(cls).parameters.values()
        pairs = [(p.name, p.default) for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD]
    missing = (attrs.NOTHING, dataclasses.MISSING, inspect.Parameter.empty)
    return [(name, "required" if any(d is m for m in missing) else _spell(d)) for name, d in pairs]


def _spell(value: Any) -> str:
    if isinstance(value, attrs_factory_type()):
        return "a new " + getattr(value.factory, "__name__", "value")
    if inspect.isfunction(value) or inspect.isclass(value):
        return f"{value.__module__}.{value.__qualname__}".replace("nous_sched.", "", 1)
    return repr(value)


def attrs_factory_type() -> type:
    import attrs

    return type(attrs.Factory(list))


def public_names() -> list[tuple[str, str]]:
    """(name, autodoc directive) for every name in ``nous_sched.__all__``, in its order."""
    import nous_sched

    out = []
    for name in nous_sched.__all__:
        value = getattr(nous_sched, name)
        if inspect.isclass(value):
            kind = "exception" if issubclass(value, BaseException) else "class"
        elif inspect.isfunction(value) or inspect.isbuiltin(value):
            kind = "function"
        elif callable(value) and not isinstance(value, (str, tuple, frozenset)):
            kind = "function"
        else:
            kind = "data"
        out.append((name, kind))
    return out


class Generated(Directive):
    required_arguments = 1
    optional_arguments = 1  # ``cli COMMAND``: that one command's help alone
    has_content = False

    def run(self) -> list[nodes.Node]:
        what = self.arguments[0]
        lines: list[str] = []
        if what == "cli" and len(self.arguments) == 2:
            helps = dict(cli_help())
            command = f"nous-sched {self.arguments[1]}"
            if command not in helps:
                raise self.error(f"nous-generated cli: no command {command!r}")
            lines += [".. code-block:: text", ""]
            lines += ["   " + line if line else "" for line in helps[command].rstrip("\n").split("\n")]
        elif what == "cli":
            for command, text in cli_help():
                lines += [f"``{command}``", "~" * (len(command) + 4), "", ".. code-block:: text", ""]
                lines += ["   " + line if line else "" for line in text.rstrip("\n").split("\n")]
                lines.append("")
        elif what == "run-options":
            lines += [".. list-table::", "   :header-rows: 1", "", "   * - option", "     - default"]
            for name, default in run_options():
                lines += [f"   * - ``{name}``", f"     - ``{default}``"]
        elif what == "error-kinds":
            lines += [f"* ``{kind}``" for kind in error_kinds()]
        elif what == "events":
            lines += [".. list-table::", "   :header-rows: 1", ""]
            lines += ["   * - kind", "     - of a", "     - audit record", "     - live event", "     - what happened"]
            for kind in event_vocabulary():
                lines += [f"   * - ``{kind['name']}``", f"     - {kind['scope']}"]
                lines += [f"     - ``{cell}``" if cell else "     - (none)" for cell in (kind["audit"], kind["live"])]
                lines.append(f"     - {kind['meaning']}")
        elif what == "api":
            for name, kind in public_names():
                auto = {"exception": "autoexception", "class": "autoclass"}.get(kind, f"auto{kind}")
                lines += [f".. {auto}:: nous_sched.{name}", ""]
        else:
            raise self.error(f"nous-generated: no list named {what!r}")
        return self._parse(lines)

    def _parse(self, lines: list[str]) -> list[nodes.Node]:
        container = nodes.section()
        container.document = self.state.document
        source = f"<nous-generated {self.arguments[0]}>"
        self.state.nested_parse(StringList(lines, source=source), self.content_offset, container, match_titles=True)
        return list(container.children)


class Checked(Directive):
    required_arguments = 1
    has_content = True

    def run(self) -> list[nodes.Node]:
        what = self.arguments[0]
        text = "\n".join(self.content)
        if what == "threads":
            documented, in_code = names_in(text), threads_in_code()
        elif what == "error-kinds":
            documented, in_code = set(kinds_in(text)), set(error_kinds())
        elif what == "live-kinds":
            documented, in_code = set(kinds_in(text)), set(live_kinds())
        elif what == "limits":
            documented, in_code = set(re.findall(r"^``([a-z_]+)``\s", text, re.M)), set(limit_fields())
        else:
            raise self.error(f"nous-checked: no list named {what!r}")
        where = (self.state.document.settings.env.docname, self.lineno)
        for name in sorted(in_code - documented):
            logger.warning(
                f"nous-checked {what}: the code has {name!r}, the manual does not say what it is", location=where
            )
        for name in sorted(documented - in_code):
            logger.warning(
                f"nous-checked {what}: the manual names {name!r}, which the code no longer has", location=where
            )
        container = nodes.container()
        self.state.nested_parse(self.content, self.content_offset, container)
        return list(container.children)


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("nous-generated", Generated)
    app.add_directive("nous-checked", Checked)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

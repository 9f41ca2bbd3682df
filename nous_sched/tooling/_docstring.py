"""Split a docstring into the tool's description and its parameters' descriptions.

Three conventions are read, as Python users write them:

* Google: an ``Args:`` (or ``Arguments:``, ``Parameters:``, ``Params:``,
  ``Keyword Args:``, ``Keyword Arguments:``, ``Other Parameters:``) section of
  ``name (type): text`` or ``name: text`` entries, continued on deeper-indented
  lines;
* NumPy: a ``Parameters`` (or ``Other Parameters``) heading underlined with
  dashes, then ``name : type`` lines with the text indented below;
* Sphinx: ``:param name: text`` or ``:param type name: text`` fields
  (``:arg``, ``:argument``, ``:key``, ``:keyword`` too), continued on
  indented lines; ``:type name:`` fields are dropped with them.

The description is the docstring with those parameter parts removed (what
remains, ``Returns``/``Raises``/examples included, tells the model how to use
the tool). Pure functions: no imports of the documented code, never raises.
"""

from __future__ import annotations

import inspect
import re
from typing import Optional

_GOOGLE_HEADERS = re.compile(
    r"^(\s*)(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Other Parameters)\s*:\s*$"
)
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}([A-Za-z_][\w]*)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")
_NUMPY_HEADERS = {"Parameters", "Other Parameters"}
_NUMPY_RULE = re.compile(r"^\s*-{3,}\s*$")
_NUMPY_ENTRY = re.compile(r"^\*{0,2}([A-Za-z_][\w]*)\s*(?::.*)?$")
_SPHINX_PARAM = re.compile(
    r"^(\s*):(param|parameter|arg|argument|key|keyword)\s+(?:[^:]*\s)?\*{0,2}([A-Za-z_]\w*)\s*:\s*(.*)$"
)
_SPHINX_TYPE = re.compile(r"^(\s*):type\s+\*{0,2}[A-Za-z_]\w*\s*:.*$")


def parse(docstring: Optional[str]) -> tuple[str, dict[str, str]]:
    """``(description, {parameter name: its description})`` from ``docstring``.

    Descriptions are unwrapped onto one line each; the description keeps its
    paragraphs. Unrecognised text stays in the description.
    """
    if not isinstance(docstring, str) or not docstring.strip():
        return "", {}
    lines = inspect.cleandoc(docstring).splitlines()
    params: dict[str, str] = {}
    kept: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if (header := _GOOGLE_HEADERS.match(line)) is not None:
            i = _google_section(lines, i + 1, len(header.group(1)), params)
        elif line.strip() in _NUMPY_HEADERS and i + 1 < len(lines) and _NUMPY_RULE.match(lines[i + 1]):
            i = _numpy_section(lines, i + 2, _indent(line), params)
        elif (field := _SPHINX_PARAM.match(line)) is not None:
            i = _continued(lines, i + 1, len(field.group(1)), [field.group(4)], params, field.group(3))
        elif _SPHINX_TYPE.match(line):
            i = _skip_continuation(lines, i + 1, _indent(line))
        else:
            kept.append(line)
            i += 1
    description = re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip()
    return description, params


def _google_section(lines: list[str], i: int, header_indent: int, params: dict[str, str]) -> int:
    entry_indent: Optional[int] = None
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        indent = _indent(line)
        if indent <= header_indent:
            break
        if entry_indent is None:
            entry_indent = indent
        match = _GOOGLE_ENTRY.match(line.strip()) if indent == entry_indent else None
        if match is None:
            i += 1  # text that is not an entry: part of the section, dropped with it
            continue
        i = _continued(lines, i + 1, entry_indent, [match.group(3)], params, match.group(1))
    return i


def _numpy_section(lines: list[str], i: int, header_indent: int, params: dict[str, str]) -> int:
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if _indent(line) < header_indent or (i + 1 < len(lines) and _NUMPY_RULE.match(lines[i + 1])):
            break  # the next section
        if _indent(line) > header_indent:
            i += 1
            continue
        match = _NUMPY_ENTRY.match(line.strip())
        if match is None:
            break
        i = _continued(lines, i + 1, header_indent, [], params, match.group(1))
    return i


def _continued(lines: list[str], i: int, indent: int, text: list[str], params: dict[str, str], name: str) -> int:
    """Collect the lines indented deeper than ``indent`` into ``params[name]``; return the next line's index."""
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > indent):
        if lines[i].strip() == "" and (i + 1 >= len(lines) or _indent(lines[i + 1]) <= indent):
            break
        text.append(lines[i].strip())
        i += 1
    description = " ".join(part for part in text if part).strip()
    if description and name not in params:
        params[name] = description
    return i


def _skip_continuation(lines: list[str], i: int, indent: int) -> int:
    while i < len(lines) and lines[i].strip() and _indent(lines[i]) > indent:
        i += 1
    return i


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())

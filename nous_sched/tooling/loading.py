"""Loading a tool set by import path: a dotted module name or a ``.py`` file, and its tools.

The one loader of a named tool set: the command's ``--tools``
(:mod:`nous_sched.cli.loading`) and :mod:`nous_sched.integrations.celery` (a
Celery worker resolves the tool set a task names) both use it. Every failure
is a :class:`ToolSetError` (a :class:`~nous_sched.ConfigError`) whose message
starts with ``label`` (what named the module: ``--tools`` for the command)
and the spec, and says what to fix; no traceback reaches the caller.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Iterable

from ..errors import ConfigError
from ._tool import Tool

__all__ = ["ToolSetError", "import_tool_module", "tools_of", "load_tools"]


class ToolSetError(ConfigError):
    """A tool set that cannot be loaded: the message names the spec and what to fix."""


def _looks_like_path(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec or "/" in spec or (os.altsep is not None and os.altsep in spec)


def _where(exc: BaseException) -> str:
    """`` (file:line)`` of the innermost frame of ``exc``, or ``""``."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {last.filename}:{last.lineno})"


def _import_path(spec: str, label: str) -> Any:
    path = Path(spec)
    if not path.exists():
        raise ToolSetError(f"{label} {spec}: no such file")
    if not path.is_file():
        raise ToolSetError(f"{label} {spec}: not a file (pass a .py file or a dotted module name)")
    path = path.resolve()
    name = "_nous_sched_tools_" + "".join(c if c.isalnum() else "_" for c in path.stem)
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ToolSetError(f"{label} {spec}: cannot load it as a Python module (is it a .py file?)")
    module = importlib.util.module_from_spec(module_spec)
    # Registered (dataclasses and pickling look modules up by name); siblings
    # of the file are importable while it loads, as with `python file.py`.
    sys.modules[name] = module
    folder = str(path.parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise ToolSetError(f"{label} {spec}: syntax error at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:
        sys.modules.pop(name, None)
        raise ToolSetError(f"{label} {spec}: importing it raised {type(exc).__name__}: {exc}{_where(exc)}") from None
    finally:
        if added:
            try:
                sys.path.remove(folder)
            except ValueError:
                pass
    return module


def _import_dotted(spec: str, label: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)  # like `python -m`: modules in the current directory are importable
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (spec == exc.name or spec.startswith(exc.name + ".")):
            raise ToolSetError(
                f"{label} {spec}: no module named {exc.name!r} (pass a dotted module name importable "
                "from the current directory, or a path to a .py file)"
            ) from None
        raise ToolSetError(f"{label} {spec}: importing it raised ModuleNotFoundError: {exc}{_where(exc)}") from None
    except SyntaxError as exc:
        raise ToolSetError(f"{label} {spec}: syntax error in {exc.filename} at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:
        raise ToolSetError(f"{label} {spec}: importing it raised {type(exc).__name__}: {exc}{_where(exc)}") from None


def import_tool_module(spec: str, label: str = "--tools") -> Any:
    """The module ``spec`` names: a ``.py`` path (executed again at each call) or a dotted name (imported once).

    :raises ToolSetError: it cannot be imported (the message says why, and where).
    """
    if not spec or not isinstance(spec, str):
        raise ToolSetError(f"{label}: expected a dotted module name or a path to a .py file")
    return _import_path(spec, label) if _looks_like_path(spec) else _import_dotted(spec, label)


def tools_of(module: Any, spec: str, label: str = "--tools") -> list[Tool]:
    """The tools of ``module`` (named ``spec``): its ``TOOLS``, or what ``tools()`` returns.

    :raises ToolSetError: it defines neither, or they are not an iterable of
        :class:`~nous_sched.Tool` with distinct names.
    """
    if hasattr(module, "TOOLS"):
        source, found = "TOOLS", module.TOOLS
    elif callable(getattr(module, "tools", None)):
        source = "tools()"
        try:
            found = module.tools()
        except Exception as exc:
            raise ToolSetError(f"{label} {spec}: tools() raised {type(exc).__name__}: {exc}{_where(exc)}") from None
    else:
        raise ToolSetError(
            f"{label} {spec}: the module defines neither TOOLS nor tools(); "
            "add `TOOLS = [nous_sched.Tool(...), ...]` (or a function `tools()` returning such a list)"
        )
    if isinstance(found, (str, bytes, dict)) or not isinstance(found, Iterable):
        raise ToolSetError(
            f"{label} {spec}: {source} must be an iterable of nous_sched.Tool, got {type(found).__name__}"
        )
    tools = list(found)
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, Tool):
            raise ToolSetError(f"{label} {spec}: {source}[{i}] is a {type(tool).__name__}, not a nous_sched.Tool")
        if tool.name in seen:
            raise ToolSetError(f"{label} {spec}: {source} has two tools named {tool.name!r}; names must be distinct")
        seen.add(tool.name)
    return tools


def load_tools(spec: str, label: str = "--tools") -> list[Tool]:
    """The tools of module ``spec`` (a dotted name or a ``.py`` path): its ``TOOLS``, or what ``tools()`` returns.

    :raises ToolSetError: the module cannot be imported, defines neither, or
        they are not an iterable of :class:`~nous_sched.Tool` with distinct names.
    """
    return tools_of(import_tool_module(spec, label), spec, label)

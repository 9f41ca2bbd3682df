"""Loading what the command runs: the tools module and the program text.

Every failure is a :class:`UsageError` whose message names the argument and
what to fix; no traceback reaches the operator.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Iterable, TextIO

from ..tooling import Tool

__all__ = ["UsageError", "load_tools", "load_callable", "read_program"]


class UsageError(Exception):
    """A usage or configuration problem: printed as ``nous-sched: <message>``, exit status 2."""


def _looks_like_path(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec or "/" in spec or (os.altsep is not None and os.altsep in spec)


def _where(exc: BaseException) -> str:
    """`` (file:line)`` of the innermost frame of ``exc``, or ``""``."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {last.filename}:{last.lineno})"


def _import_path(spec: str, flag: str = "--tools") -> Any:
    path = Path(spec)
    if not path.exists():
        raise UsageError(f"{flag} {spec}: no such file")
    if not path.is_file():
        raise UsageError(f"{flag} {spec}: not a file (pass a .py file or a dotted module name)")
    path = path.resolve()
    name = "_nous_sched_tools_" + "".join(c if c.isalnum() else "_" for c in path.stem)
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise UsageError(f"{flag} {spec}: cannot load it as a Python module (is it a .py file?)")
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
        raise UsageError(f"{flag} {spec}: syntax error at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:
        sys.modules.pop(name, None)
        raise UsageError(f"{flag} {spec}: importing it raised {type(exc).__name__}: {exc}{_where(exc)}") from None
    finally:
        if added:
            try:
                sys.path.remove(folder)
            except ValueError:
                pass
    return module


def _import_dotted(spec: str, flag: str = "--tools") -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)  # like `python -m`: modules in the current directory are importable
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (spec == exc.name or spec.startswith(exc.name + ".")):
            raise UsageError(
                f"{flag} {spec}: no module named {exc.name!r} (pass a dotted module name importable "
                "from the current directory, or a path to a .py file)"
            ) from None
        raise UsageError(f"{flag} {spec}: importing it raised ModuleNotFoundError: {exc}{_where(exc)}") from None
    except SyntaxError as exc:
        raise UsageError(f"{flag} {spec}: syntax error in {exc.filename} at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:
        raise UsageError(f"{flag} {spec}: importing it raised {type(exc).__name__}: {exc}{_where(exc)}") from None


def load_tools(spec: str) -> list[Tool]:
    """The tools of module ``spec`` (a dotted name or a ``.py`` path): its ``TOOLS``, or what ``tools()`` returns.

    :raises UsageError: the module cannot be imported, defines neither, or
        they are not an iterable of :class:`~nous_sched.Tool` with distinct names.
    """
    if not spec:
        raise UsageError("--tools: expected a dotted module name or a path to a .py file")
    module = _import_path(spec) if _looks_like_path(spec) else _import_dotted(spec)
    if hasattr(module, "TOOLS"):
        source, found = "TOOLS", module.TOOLS
    elif callable(getattr(module, "tools", None)):
        source = "tools()"
        try:
            found = module.tools()
        except Exception as exc:
            raise UsageError(f"--tools {spec}: tools() raised {type(exc).__name__}: {exc}{_where(exc)}") from None
    else:
        raise UsageError(
            f"--tools {spec}: the module defines neither TOOLS nor tools(); "
            "add `TOOLS = [nous_sched.Tool(...), ...]` (or a function `tools()` returning such a list)"
        )
    if isinstance(found, (str, bytes, dict)) or not isinstance(found, Iterable):
        raise UsageError(f"--tools {spec}: {source} must be an iterable of nous_sched.Tool, got {type(found).__name__}")
    tools = list(found)
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, Tool):
            raise UsageError(f"--tools {spec}: {source}[{i}] is a {type(tool).__name__}, not a nous_sched.Tool")
        if tool.name in seen:
            raise UsageError(f"--tools {spec}: {source} has two tools named {tool.name!r}; names must be distinct")
        seen.add(tool.name)
    return tools


def load_callable(spec: str, flag: str) -> Any:
    """The callable ``spec`` names, ``MODULE:NAME`` (a dotted module name or a
    ``.py`` path, then an attribute of it), for ``flag`` (its name in messages).

    :raises UsageError: no ``:NAME``, the module cannot be imported, or it has
        no such attribute, or the attribute is not callable.
    """
    module_spec, _, name = spec.rpartition(":")
    if not module_spec or not name.isidentifier():
        raise UsageError(
            f"{flag} {spec}: expected MODULE:CALLABLE (a dotted module name or a .py file, a colon, a name)"
        )
    module = _import_path(module_spec, flag) if _looks_like_path(module_spec) else _import_dotted(module_spec, flag)
    found = getattr(module, name, None)
    if found is None:
        raise UsageError(f"{flag} {spec}: the module has no {name!r}")
    if not callable(found):
        raise UsageError(f"{flag} {spec}: {name!r} is a {type(found).__name__}, not a callable")
    return found


def read_program(spec: str, stdin: TextIO) -> str:
    if spec == "-":
        try:
            return stdin.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read the program from standard input: {exc}") from None
    try:
        return Path(spec).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"program {spec}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"program {spec}: is a directory, not a .js file") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"program {spec}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise UsageError(f"program {spec}: cannot read it: {exc.strerror or exc}") from None

"""Example tools with real behaviour, for the programs in this folder.

Run it from the repository root with a program of this folder (the README's main job)::

    nous-sched run examples/fanout.js --tools examples/tools.py

or from Python: ``TOOLS`` is a ready list, and :func:`make_tools` builds a fresh
set with its own database (tests use that, so runs never share notes).

===============  ============  =================================================
tool             mode          what it does
===============  ============  =================================================
``search_files`` parallel      case-insensitive line search over ``data/*.txt``
``read_file``    parallel      read one text file under ``data/``
``word_count``   parallel      count the words, lines and characters of a text
``lookup_city``  parallel      look a city up in an SQLite table built from
                               ``data/cities.csv`` (with a small simulated
                               network latency, so fan-out shows in the trail)
``list_notes``   parallel      read every note from the SQLite notes table
``add_note``     exclusive     insert a note (no ``concurrency_safe``
                               predicate: writes run alone, in order)
===============  ============  =================================================

The data folder and the latency are parameters of :func:`make_tools`; the
environment variable ``NOUS_SCHED_EXAMPLE_LATENCY`` (seconds) sets the default
latency of ``lookup_city`` (0.02 unless set).
"""

from __future__ import annotations

import csv
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Optional, Union

from nous_sched import Tool, ToolError

__all__ = ["DATA_DIR", "TOOLS", "make_tools"]

#: The folder the file tools read and the city table is built from.
DATA_DIR = Path(__file__).resolve().parent / "data"

_MAX_READ_BYTES = 64 * 1024


def _default_latency() -> float:
    try:
        return max(0.0, float(os.environ.get("NOUS_SCHED_EXAMPLE_LATENCY", "0.02")))
    except ValueError:
        return 0.02


def _safe(_args: dict) -> bool:
    return True


def _string(args: dict, key: str, tool: str, *, required: bool = True, default: Optional[str] = None) -> str:
    value = args.get(key, default)
    if value is None and not required:
        return default or ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise ToolError(f"`{key}` must be a non-empty string", tool)
    return value


class _Store:
    """One SQLite connection shared by the tool threads, behind a lock.

    The cities table is loaded from ``cities.csv`` once; notes live in the same
    database (in memory unless ``path`` names a file).
    """

    def __init__(self, data_dir: Path, path: str) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False)
        with self._lock, self._db:
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS cities "
                "(name TEXT PRIMARY KEY COLLATE NOCASE, country TEXT, population INTEGER, lat REAL, lon REAL)"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT, text TEXT)"
            )
            csv_path = data_dir / "cities.csv"
            if csv_path.exists():
                with open(csv_path, newline="", encoding="utf-8") as fh:
                    rows = [
                        (r["name"], r["country"], int(r["population"]), float(r["lat"]), float(r["lon"]))
                        for r in csv.DictReader(fh)
                    ]
                self._db.executemany("INSERT OR REPLACE INTO cities VALUES (?, ?, ?, ?, ?)", rows)

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def write(self, sql: str, params: tuple = ()) -> int:
        with self._lock, self._db:
            return self._db.execute(sql, params).lastrowid


def make_tools(
    data_dir: Union[str, os.PathLike, None] = None,
    *,
    notes_db: str = ":memory:",
    latency: Optional[float] = None,
) -> list[Tool]:
    """A fresh set of the example tools over ``data_dir`` (default :data:`DATA_DIR`).

    ``notes_db`` is the SQLite database for cities and notes (a fresh
    in-memory one by default). ``latency`` is the simulated round trip of
    ``lookup_city`` in seconds.
    """
    root = Path(data_dir if data_dir is not None else DATA_DIR).resolve()
    delay = _default_latency() if latency is None else float(latency)
    store = _Store(root, notes_db)

    def search_files(args: dict) -> dict:
        query = _string(args, "query", "search_files")
        pattern = _string(args, "glob", "search_files", required=False, default="*.txt") or "*.txt"
        limit = args.get("max_results", 20)
        if type(limit) is not int or limit < 1:
            raise ToolError("`max_results` must be a positive integer", "search_files")
        needle = query.casefold()
        matches = []
        try:
            found = sorted(p for p in root.glob(pattern) if p.is_file() and p.resolve().is_relative_to(root))
        except (ValueError, NotImplementedError) as exc:
            raise ToolError(f"bad glob {pattern!r}: {exc}", "search_files") from None
        for path in found:
            text = path.read_text(encoding="utf-8", errors="replace")
            for number, line in enumerate(text.splitlines(), 1):
                if needle in line.casefold():
                    matches.append({"file": path.relative_to(root).as_posix(), "line": number, "text": line})
        return {"query": query, "matches": matches[:limit], "truncated": len(matches) > limit}

    def read_file(args: dict) -> dict:
        name = _string(args, "path", "read_file")
        path = (root / name).resolve()
        if not path.is_relative_to(root):
            raise ToolError(f"{name!r} is outside the data folder", "read_file")
        if not path.is_file():
            raise ToolError(f"no file {name!r} in the data folder", "read_file")
        data = path.read_bytes()[:_MAX_READ_BYTES]
        return {"path": path.relative_to(root).as_posix(), "text": data.decode("utf-8", errors="replace")}

    def word_count(args: dict) -> dict:
        text = args.get("text")
        if not isinstance(text, str):
            raise ToolError("`text` must be a string", "word_count")
        return {"words": len(text.split()), "lines": len(text.splitlines()), "chars": len(text)}

    def lookup_city(args: dict) -> dict:
        name = _string(args, "name", "lookup_city")
        if delay:
            time.sleep(delay)  # stands in for a remote lookup's round trip
        rows = store.query("SELECT name, country, population, lat, lon FROM cities WHERE name = ?", (name.strip(),))
        if not rows:
            known = ", ".join(r[0] for r in store.query("SELECT name FROM cities ORDER BY name"))
            raise ToolError(f"no city named {name!r}; known cities: {known}", "lookup_city")
        city, country, population, lat, lon = rows[0]
        return {"name": city, "country": country, "population": population, "lat": lat, "lon": lon}

    def list_notes(args: dict) -> list:
        rows = store.query("SELECT id, title, text FROM notes ORDER BY id")
        return [{"id": i, "title": title, "text": text} for i, title, text in rows]

    def add_note(args: dict) -> dict:
        title = _string(args, "title", "add_note")
        text = args.get("text", "")
        if not isinstance(text, str):
            raise ToolError("`text` must be a string", "add_note")
        note_id = store.write("INSERT INTO notes (title, text) VALUES (?, ?)", (title, text))
        return {"id": note_id, "title": title}

    return [
        Tool(
            name="search_files",
            function=search_files,
            description="Search the text files of the data folder for lines containing `query` (case-insensitive).",
            parameters={
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "Text to look for."},
                    "glob": {"type": "string", "description": "Which files to search (default *.txt)."},
                    "max_results": {"type": "integer", "minimum": 1, "description": "Default 20."},
                },
                "required": ["query"],
                "additionalProperties": False,
            },
            category="read",
            concurrency_safe=_safe,
        ),
        Tool(
            name="read_file",
            function=read_file,
            description="Read one text file from the data folder; returns {path, text}.",
            parameters={
                "type": "object",
                "properties": {"path": {"type": "string", "description": "Path relative to the data folder."}},
                "required": ["path"],
                "additionalProperties": False,
            },
            category="read",
            concurrency_safe=_safe,
        ),
        Tool(
            name="word_count",
            function=word_count,
            description="Count the words, lines and characters of `text`.",
            parameters={
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
                "additionalProperties": False,
            },
            category="read",
            concurrency_safe=_safe,
        ),
        Tool(
            name="lookup_city",
            function=lookup_city,
            description="Look a city up by name; returns {name, country, population, lat, lon}.",
            parameters={
                "type": "object",
                "properties": {"name": {"type": "string", "description": "City name, case-insensitive."}},
                "required": ["name"],
                "additionalProperties": False,
            },
            category="read",
            concurrency_safe=_safe,
        ),
        Tool(
            name="list_notes",
            function=list_notes,
            description="Every saved note, oldest first, as [{id, title, text}].",
            parameters={"type": "object", "properties": {}, "additionalProperties": False},
            category="read",
            concurrency_safe=_safe,
        ),
        Tool(
            name="add_note",
            function=add_note,
            description="Save a note; returns {id, title}.",
            parameters={
                "type": "object",
                "properties": {"title": {"type": "string"}, "text": {"type": "string"}},
                "required": ["title"],
                "additionalProperties": False,
            },
            category="write",
            # No concurrency_safe predicate: every write is exclusive.
        ),
    ]


#: The example tools, ready to hand to ``run_code`` or ``nous-sched run --tools``.
TOOLS = make_tools()

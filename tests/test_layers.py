"""The import graph of nous_sched against ARCHITECTURE.rst's layer map.

Every import of every module is read with ``ast`` (those inside functions and
under ``if TYPE_CHECKING:`` too, since a deferred import is still a
dependency), and two rules are checked: no module imports, however
indirectly, one that imports it back (no cycles), and no module imports from
a layer above its own. The layers are read from the map in ARCHITECTURE.rst
itself, so the document and this test cannot drift: every module must be
named there, and everything named there must exist.

The checker is tried on small synthetic graphs first, so it is known to fail
on a cycle and on an upward import.
"""

from __future__ import annotations

import ast
import pathlib
import re
import textwrap
from collections.abc import Iterable, Mapping

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = "nous_sched"

#: The loops still allowed, each as the import that closes it: none. (The last,
#: run_code -> durable -> run_code, went when run_code.py was split into the
#: entry, _run/entry.py, and the machinery, _run/runner.py, which durable imports.)
KNOWN_LOOPS: frozenset[tuple[str, str]] = frozenset()

#: The package's own ``__init__.py`` sits above every layer: it re-exports the
#: public API (and, in a function, loads nous_sched.otel for the tracing seam).
#: Nothing may import it back (``from . import __version__`` would).
TOP = "(package)"


# --- Reading ------------------------------------------------------------------


def module_files(root: pathlib.Path, package: str) -> dict[str, pathlib.Path]:
    """Every module of ``package`` under ``root``, by dotted name."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_package(name: str, files: Mapping[str, pathlib.Path]) -> bool:
    return files[name].name == "__init__.py"


def imports_of(name: str, files: Mapping[str, pathlib.Path]) -> set[str]:
    """The modules of the package that module ``name`` imports, wherever the import statement is.

    ``from .m import x`` is an import of ``m`` (and of ``m.x`` when that is a
    module); importing ``a.b.c`` also runs ``a`` and ``a.b``, so those count
    too, except the packages that hold ``name`` itself (being inside them, it
    never makes them run).
    """
    package = name if _is_package(name, files) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(files[name].read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in files else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    named = {target for target in found if target in files}
    for target in list(named):
        parts = target.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if not (name == parent or name.startswith(parent + ".")):
                named.add(parent)
    named.discard(name)
    return named


def import_graph(root: pathlib.Path, package: str) -> dict[str, set[str]]:
    files = module_files(root, package)
    return {name: imports_of(name, files) for name in files}


# --- The layer map ------------------------------------------------------------


def layer_map(text: str) -> list[tuple[str, list[str]]]:
    """The layers of ARCHITECTURE.rst's map, top first, each with the entries it names.

    The map is the first ``code-block:: text`` under "Layers": a layer's name
    starts in column 3, an entry (``name.py`` or ``name/``) in column 18, and
    a description follows; a line with nothing in column 18 continues the
    description above it.
    """
    section = re.split(r"^Layers\n-+\n", text, maxsplit=1, flags=re.MULTILINE)[1]
    block = section.split(".. code-block:: text\n", 1)[1]
    layers: list[tuple[str, list[str]]] = []
    for line in block.split("\n")[1:]:
        if line and not line.startswith("   "):
            break  # the block ends at the first unindented line
        if line[3:4].strip():
            layers.append((line[3:18].strip(), []))
        entry = line[18:].split(" ", 1)[0] if line[18:19].strip() else ""
        if entry:
            layers[-1][1].append(entry.rstrip(","))
    return layers


def layer_of(layers: list[tuple[str, list[str]]], package: str) -> dict[str, str]:
    """Each map entry (``x.py``, ``x/``) as the module or package it names, to its layer."""
    by_entry = {}
    for layer, entries in layers:
        for entry in entries:
            dotted = f"{package}." + entry.removesuffix("/").removesuffix(".py").replace("/", ".")
            by_entry[dotted] = layer
    return by_entry


def assign(modules: Iterable[str], by_entry: Mapping[str, str], package: str) -> dict[str, str]:
    """Each module's layer: its own entry's, or the entry of the package holding it."""
    layer = {}
    for name in modules:
        if name == package:
            layer[name] = TOP
            continue
        parts = name.split(".")
        owners = [".".join(parts[:i]) for i in range(len(parts), 1, -1) if ".".join(parts[:i]) in by_entry]
        if owners:
            layer[name] = by_entry[owners[0]]
    return layer


# --- The checks ---------------------------------------------------------------


def cycles(graph: Mapping[str, Iterable[str]], allowed: Iterable[tuple[str, str]] = ()) -> list[list[str]]:
    """The import cycles of ``graph`` (each a sorted list of modules), ignoring the ``allowed`` edges."""
    skip = set(allowed)
    edges = {a: sorted(b for b in bs if b in graph and (a, b) not in skip) for a, bs in graph.items()}
    # Tarjan's strongly connected components, iteratively: a cycle is a component of
    # more than one module, or a module that imports itself.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(edges[node]):
                work.append((node, i + 1))
                nxt = edges[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    found.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(found)


def upward(graph: Mapping[str, Iterable[str]], layer: Mapping[str, str], order: list[str]) -> list[str]:
    """Every import from a layer to one above it, as ``"a (layer) -> b (layer)"``."""
    rank = {name: i for i, name in enumerate([TOP, *order])}
    found = []
    for a in sorted(graph):
        for b in sorted(graph[a]):
            if b in layer and rank[layer[b]] < rank[layer[a]]:
                found.append(f"{a} ({layer[a]}) -> {b} ({layer[b]})")
    return found


# --- The checker can fail -------------------------------------------------------


def test_the_checker_finds_a_cycle_and_an_upward_import():
    graph = {"p.low": {"p.high"}, "p.high": {"p.mid"}, "p.mid": {"p.high"}, "p.leaf": set()}
    layer = {"p.high": "top", "p.mid": "top", "p.low": "bottom", "p.leaf": "bottom"}
    assert cycles(graph) == [["p.high", "p.mid"]]
    assert cycles(graph, allowed={("p.mid", "p.high")}) == []
    assert cycles({"p.self": {"p.self"}}) == [["p.self"]]
    assert upward(graph, layer, ["top", "bottom"]) == ["p.low (bottom) -> p.high (top)"]
    assert upward(graph, layer, ["bottom", "top"]) == []  # the same imports, the layers the other way up
    # The package's own __init__ is above every layer: importing it back is upward.
    assert upward({"p.low": {"p"}}, {"p": TOP, "p.low": "bottom"}, ["bottom"]) == ["p.low (bottom) -> p ((package))"]


def test_the_reader_sees_deferred_type_checking_and_relative_imports(tmp_path):
    pkg = tmp_path / "fake"
    (pkg / "inner").mkdir(parents=True)
    files = {
        "__init__.py": "from .a import thing\n",
        "a.py": textwrap.dedent(
            """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from .b import B
            def later():
                from .inner import c
                import fake.d
            thing = 1
            """
        ),
        "b.py": "from . import a\n",
        "d.py": "",
        "inner/__init__.py": "",
        "inner/c.py": "from ..a import thing\nfrom .. import a as alias\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(tmp_path, "fake")
    assert graph["fake.a"] == {"fake.b", "fake.inner", "fake.inner.c", "fake.d"}
    assert graph["fake.b"] == {"fake.a"}
    assert graph["fake.inner.c"] == {"fake.a"}  # its own package is not an import of it
    assert graph["fake"] == {"fake.a"}
    assert cycles(graph) == [["fake.a", "fake.b", "fake.inner.c"]]


def test_the_map_parser_reads_layers_entries_and_continuations():
    text = textwrap.dedent(
        """\
        Layers
        ------

        .. code-block:: text

           upper          cli/             the command,
                                           more words: not_an_entry.py
                          aio.py           the asyncio door
           lower          errors.py        errors

        After.
        """
    )
    assert layer_map(text) == [("upper", ["cli/", "aio.py"]), ("lower", ["errors.py"])]
    by_entry = layer_of(layer_map(text), "p")
    assert assign(["p", "p.cli", "p.cli.main", "p.aio", "p.errors", "p.stray"], by_entry, "p") == {
        "p": TOP,
        "p.cli": "upper",
        "p.cli.main": "upper",
        "p.aio": "upper",
        "p.errors": "lower",
    }


# --- nous_sched ---------------------------------------------------------------


@pytest.fixture(scope="module")
def architecture():
    layers = layer_map((ROOT / "ARCHITECTURE.rst").read_text(encoding="utf-8"))
    graph = import_graph(ROOT, PACKAGE)
    layer = assign(graph, layer_of(layers, PACKAGE), PACKAGE)
    return layers, graph, layer


def test_every_module_is_on_the_map_and_everything_on_it_exists(architecture):
    layers, graph, layer = architecture
    assert [name for name, _ in layers] == [
        "command",
        "apart",
        "agent-facing",
        "run_code",
        "runtimes",
        "lane",
        "values",
    ]
    assert sorted(set(graph) - set(layer)) == [], "modules ARCHITECTURE.rst's layer map does not place"
    named = [entry for _, entries in layers for entry in entries]
    assert len(named) == len(set(named)), "an entry is on the map twice"
    missing = [entry for entry in named if not (ROOT / PACKAGE / entry).exists()]
    assert missing == [], "the layer map names files that do not exist"


def test_no_import_cycles(architecture):
    _, graph, _ = architecture
    assert cycles(graph, KNOWN_LOOPS) == []
    for a, b in KNOWN_LOOPS:  # an allowed loop that is gone must leave the list
        assert b in graph[a] and cycles({a: graph[a], b: graph[b]}) != [], f"{a} -> {b} no longer loops"


def test_no_import_from_a_lower_layer_to_a_higher_one(architecture):
    layers, graph, layer = architecture
    assert upward(graph, layer, [name for name, _ in layers]) == []

"""No module of the library reads another package's private names (issue 35).

ruff's SLF001 is on for ``nous_sched/`` (pyproject.toml) and the library is
clean under it. A read it is told to let pass (``# noqa: SLF001``) must be
of a name defined inside the reader's own package (for a top-level module,
the module itself), or a third party's private that has no public way,
listed here with why. So a read across packages fails here even with a noqa.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = os.path.join(ROOT, "nous_sched")

#: Third parties' privates the library must read, and why.
THIRD_PARTY = {
    "_resolver": "jsonschema: a validator's resolver, the one way to follow a $ref (gate/_linear.py)",
    "_get_executable_command": "the MCP SDK's stdio_client steps, run with a bounded reader (mcp/stdio.py)",
    "_create_platform_compatible_process": "the MCP SDK's stdio_client steps (mcp/stdio.py)",
    "_drain_stdout": "the MCP SDK's stdio_client steps (mcp/stdio.py)",
    "_stop_server_process": "the MCP SDK's stdio_client steps (mcp/stdio.py)",
}


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "SLF001", "--output-format", "json", *args, LIBRARY],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def _package_files(path: str) -> list[str]:
    """The files of ``path``'s own package: its folder under nous_sched/, or itself at the top."""
    folder = os.path.dirname(path)
    if os.path.samefile(folder, LIBRARY):
        return [path]
    while not os.path.samefile(os.path.dirname(folder), LIBRARY):
        folder = os.path.dirname(folder)
    return [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs if f.endswith(".py")]


def _defines(files: list[str], name: str) -> bool:
    pattern = re.compile(
        rf"(def|class)\s+{re.escape(name)}\b|\b{re.escape(name)}\s*(:[^=\n]*)?=[^=]|\b{re.escape(name)}\s*:|[\"']{re.escape(name)}[\"']"
    )
    return any(pattern.search(open(f, encoding="utf-8").read()) for f in files)


def test_the_library_is_clean_under_slf001() -> None:
    done = _ruff()
    assert json.loads(done.stdout or "[]") == [], done.stdout


def test_every_private_read_let_pass_is_of_its_own_package_or_a_listed_third_party() -> None:
    done = _ruff("--ignore-noqa")
    reads = json.loads(done.stdout)
    assert reads, "the noqa'd reads are seen (a check that sees none checks nothing)"
    strays = []
    for read in reads:
        name = re.search(r"`([^`]+)`", read["message"]).group(1)  # type: ignore[union-attr]
        if name in THIRD_PARTY:
            continue
        if not _defines(_package_files(read["filename"]), name):
            strays.append(f"{os.path.relpath(read['filename'], ROOT)}:{read['location']['row']} reads {name}")
    assert strays == []


def test_a_read_across_packages_is_caught_even_with_a_noqa() -> None:
    # The check above is not vacuous: the scheduler's private, read from the runtime package, is a stray.
    files = _package_files(os.path.join(LIBRARY, "runtime", "pool.py"))
    assert not _defines(files, "_records_lock")
    assert _defines(_package_files(os.path.join(LIBRARY, "scheduler", "_calls.py")), "_records_lock")

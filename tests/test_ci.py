"""The project's own promises about how it is built and checked.

(That ``.ci/run`` runs the README's test command and then the checks is
``test_docs.py::test_readme_test_command_is_what_ci_runs``.)
"""

from __future__ import annotations

import configparser
import pathlib
import re

import nous_sched

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_test_extra_installs_the_checkers():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    test_extra = config["options.extras_require"]["test"]
    assert re.search(r"^ruff\b", test_extra, re.M) and re.search(r"^mypy\b", test_extra, re.M)


def test_mypy_is_strict_on_the_library():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text[text.index("[tool.mypy]\n") :].split("\n[", 1)[0]  # up to the next table
    assert re.search(r'^files = \["nous_sched"\]$', section, re.M) and re.search(r"^strict = true$", section, re.M)


def test_one_source_for_the_version():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    assert config["metadata"]["version"] == "attr: nous_sched._version.__version__"
    assert nous_sched.__version__ == nous_sched._version.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", nous_sched.__version__)


def test_the_package_says_it_is_typed():
    assert (ROOT / "nous_sched" / "py.typed").is_file()
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    assert "py.typed" in config["options.package_data"]["nous_sched"]


def test_every_library_function_is_at_most_complexity_12():
    # ruff's C901 in the project config, which .ci/run's `ruff check .` applies.
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    select = re.search(r"^select = \[(.*)\]$", text, re.M)
    assert select and '"C90"' in select.group(1)
    section = text[text.index("[tool.ruff.lint.mccabe]\n") :].split("\n[", 1)[0]
    assert re.search(r"^max-complexity = 12$", section, re.M)
    ignores = text[text.index("[tool.ruff.lint.per-file-ignores]\n") :].split("\n[", 1)[0]
    assert not re.search(r"^\"nous_sched", ignores, re.M), "the bound holds for the whole library"


def test_the_version_is_the_release_the_changelog_cut_last():
    text = (ROOT / "CHANGELOG.rst").read_text(encoding="utf-8")
    released = re.findall(r"^\[?(\d+\.\d+\.\d+)\]? - \d{4}-\d{2}-\d{2}$", text, re.M)
    assert released and released[0] == nous_sched.__version__


def test_ci_builds_the_wheel_installs_it_outside_the_checkout_and_runs_the_main_job():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci.index("bash .ci/wheel-check") == ci.index("pip install -e '.[test]' && python -m pytest") + 1
    script = (ROOT / ".ci" / "wheel-check").read_text(encoding="utf-8")
    steps = [
        "set -euo pipefail",
        "work=$(mktemp -d)\ntrap 'rm -rf \"$work\"' EXIT",  # a temporary folder, removed however it ends
        'python -m build --outdir "$work/dist" .',
        'python -m twine check --strict "${wheels[0]}" "${sdists[0]}"',
        "unset PYTHONPATH PYTHONHOME",
        'python -m venv "$work/venv"',
        '"$work/venv/bin/python" -m pip install --quiet "${wheels[0]}"',
        'cd "$work/job"',
        "assert venv in where.parents and checkout not in where.parents",
        '"$work/venv/bin/nous-sched" run examples/fanout.js --tools examples/tools.py',
    ]
    at = [script.find(step) for step in steps]
    assert -1 not in at and at == sorted(at), dict(zip(steps, at))
    # The README's main job, the command the wheel's venv runs.
    assert "nous-sched run examples/fanout.js --tools examples/tools.py" in (ROOT / "README.rst").read_text()


def test_the_release_tools_come_from_the_projects_extras():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    for extra in ("test", "release"):
        section = config["options.extras_require"][extra]
        assert re.search(r"^build\b", section, re.M) and re.search(r"^twine\b", section, re.M), extra


KINDS = ["Breaking changes", "Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"]


def _changelog_sections() -> list[tuple[str, list[str]]]:
    """(release heading, its subsection headings) in order, from CHANGELOG.rst's underlines."""
    lines = (ROOT / "CHANGELOG.rst").read_text(encoding="utf-8").splitlines()
    releases: list[tuple[str, list[str]]] = []
    for title, underline in zip(lines, lines[1:]):
        if title and underline == "-" * len(title):
            releases.append((title, []))
        elif title and underline == "~" * len(title):
            releases[-1][1].append(title)
    return releases


def test_the_changelog_keeps_one_section_per_kind_under_each_release():
    releases = _changelog_sections()
    assert releases[0] == ("Unreleased", []), "an empty Unreleased on top, for the next entries"
    dated = [re.fullmatch(r"(\d+)\.(\d+)\.(\d+) - (\d{4}-\d{2}-\d{2})", title) for title, _ in releases[1:]]
    assert all(dated), [title for title, _ in releases[1:]]
    versions = [tuple(int(p) for p in m.groups()[:3]) for m in dated if m]
    dates = [m.group(4) for m in dated if m]
    assert versions == sorted(versions, reverse=True) and dates == sorted(dates, reverse=True)
    for title, kinds in releases:
        assert kinds == [k for k in KINDS if k in kinds], (title, kinds)  # each kind once, in order
    text = (ROOT / "CHANGELOG.rst").read_text(encoding="utf-8")
    assert "**Breaking**" not in text and "New default:" not in text, "breaking changes are marked one way"

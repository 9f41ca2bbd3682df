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

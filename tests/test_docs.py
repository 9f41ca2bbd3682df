"""The README and the manual (docs/): every code block runs, the commands are CI's, the lists are the code's.

Every ``.. code-block:: python`` of README.rst and of the manual's pages runs
here as a reader would paste it (the ones that need an extra get it from the
``test`` extra, which CI installs). The manual's build itself (``sphinx-build
-W``, as ``.ci/run`` runs it) is ``test_the_manual_builds_without_a_warning``;
the lists it checks against the code at build time (threads, error kinds,
limits) are also checked here, through the same functions.
"""

from __future__ import annotations

import configparser
import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.rst"
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
import nous_docs  # noqa: E402

# docs/django.rst is the Django guide (the release engineer's): its code is the
# project under examples/ that tests/test_django_*.py run.
NOT_RUN_HERE = {DOCS / "django.rst"}
PAGES = sorted(p for p in DOCS.rglob("*.rst") if p not in NOT_RUN_HERE)


def blocks(path: Path, language: str) -> list[str]:
    """The bodies of ``path``'s ``.. code-block:: <language>`` directives, dedented (at any indentation)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() == f".. code-block:: {language}":
            indent = len(lines[i]) - len(lines[i].lstrip()) + 1
            i += 1
            body = []
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                body.append(lines[i])
                i += 1
            found.append(textwrap.dedent("\n".join(body)).strip("\n") + "\n")
        else:
            i += 1
    return found


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


PYTHON_BLOCKS = [(path, block) for path in [README, *PAGES] for block in blocks(path, "python")]


def test_the_blocks_are_found():
    assert len(blocks(README, "python")) == 1
    by_page = {_name(p) for p, _ in PYTHON_BLOCKS}
    assert {"docs/quickstart.rst", "docs/tools.rst", "docs/throttles.rst", "docs/runtimes.rst"} <= by_page
    assert any("Scheduler(" in b for _, b in PYTHON_BLOCKS)
    # An indented block (inside a list item) is found whole.
    assert any(b.startswith("import threading\n\nfrom nous_sched import run_code") for _, b in PYTHON_BLOCKS)


@pytest.mark.parametrize(
    "path, block",
    [(p, b) for p, b in PYTHON_BLOCKS if "django" not in b],
    ids=lambda v: _name(v) if isinstance(v, Path) else v.strip().splitlines()[-1][:40],
)
def test_every_python_block_runs(path, block, capsys):
    exec(compile(block, str(path), "exec"), {"__name__": "docs_example"})


class _JsonResponse:
    def __init__(self, data, status=200):
        self.data = data
        self.status_code = status


def test_the_django_view_block(monkeypatch):
    (block,) = [b for _, b in PYTHON_BLOCKS if "django" in b]
    http = types.ModuleType("django.http")
    http.JsonResponse = _JsonResponse
    decorators = types.ModuleType("django.views.decorators.http")
    decorators.require_POST = lambda view: view
    for name, module in {
        "django": types.ModuleType("django"),
        "django.http": http,
        "django.views": types.ModuleType("django.views"),
        "django.views.decorators": types.ModuleType("django.views.decorators"),
        "django.views.decorators.http": decorators,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    namespace: dict = {"__name__": "docs_django"}
    exec(compile(block, "docs/deployment.rst", "exec"), namespace)
    view = namespace["run_program"]

    def post(body):
        return view(types.SimpleNamespace(method="POST", body=json.dumps(body).encode()))

    ok = post(
        {
            "code": "const [a, b] = await Promise.all([tools.get_order({id: 'A1'}), tools.get_order({id: 'B2'})]);"
            " return a.total + b.total",
            "description": "Sum two orders",
        }
    )
    assert (ok.status_code, ok.data) == (200, {"logs": [], "result": 42})
    failed = post({"code": "return (await tools.get_order({id: 'ZZ'})).total", "description": "A missing order"})
    assert failed.status_code == 200 and failed.data["error"]["kind"] == "exception"
    nothing = post({"description": "no code"})
    assert nothing.status_code == 400 and "code" in nothing.data["error"]


# -- the commands ------------------------------------------------------------------------------

MAIN_JOB = "pip install -e . && nous-sched run examples/fanout.js --tools examples/tools.py"
TEST_COMMAND = "pip install -e '.[test]' && python -m pytest"
DOCS_BUILD = "pip install -e '.[docs]' && python -m sphinx -W --keep-going -b html docs \"$(mktemp -d)\""


def _console_commands(path: Path) -> list[str]:
    return [line.strip() for b in blocks(path, "console") for line in b.splitlines() if line.strip()]


def test_readme_commands():
    # The README's two commands, unchanged: the main job and the tests.
    assert _console_commands(README) == [MAIN_JOB, TEST_COMMAND]


def test_the_manuals_commands_are_the_readmes_or_an_examples():
    # The example's command is run as typed by tests/test_mcp_example.py.
    commands = {c for page in PAGES for c in _console_commands(page)}
    assert commands == {MAIN_JOB, TEST_COMMAND, "pip install -e '.[mcp]' && python examples/mcp_fanout.py"}


def test_the_main_job_runs_as_typed():
    # Its second half, as a user types it from the repository root (the first is the install).
    command = shlex.split(MAIN_JOB.split(" && ", 1)[1])
    script = shutil.which(command[0])
    assert script, "the nous-sched command is installed by `pip install -e .`"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([script, *command[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"largest": "Shanghai"' in done.stdout and "largest: Shanghai, China" in done.stdout


def test_the_serve_mcp_host_configuration_is_a_command_serve_mcp_accepts():
    (block,) = blocks(DOCS / "serve-mcp.rst", "json")
    (server,) = json.loads(block)["mcpServers"].values()
    assert server["command"] == "nous-sched"
    args = nous_docs.build_parser().parse_args(server["args"])
    assert (args.command, args.trust, args.audit_log) == ("serve-mcp", ["files"], "/var/log/code-mode.jsonl")


def test_readme_test_command_is_what_ci_runs():
    assert TEST_COMMAND in README.read_text(encoding="utf-8")
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in ci if line and not line.startswith(("#", "set ", "cd "))]
    # The system packages, the README's test command, verbatim, the checks configured in
    # pyproject.toml, then the manual's build, where a warning (a broken reference) is an error.
    # (The release branch's wheel check, once merged, runs right after the tests.)
    wheel_check = ["bash .ci/wheel-check"] if (ROOT / ".ci" / "wheel-check").exists() else []
    assert commands == [
        "bash .ci/system-deps",
        TEST_COMMAND,
        *wheel_check,
        "python -m ruff check .",
        "python -m ruff format --check .",
        "python -m mypy",
        DOCS_BUILD,
    ]
    assert "set -euo pipefail" in ci, "a failing step fails CI"


def test_the_manual_builds_without_a_warning(tmp_path):
    # What .ci/run's last line runs (the docs extra is in the test extra too).
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    api = (tmp_path / "reference" / "api.html").read_text(encoding="utf-8")
    import nous_sched

    for name in nous_sched.__all__:
        assert f'id="nous_sched.{name}"' in api, name


# -- the lists that come from the code ---------------------------------------------------------


def test_the_threads_page_names_every_thread_in_the_code():
    in_code = nous_docs.threads_in_code()
    # The finder finds what it should: names given in f-strings, constants and the worker's own.
    assert {"nous-sched-driver", "nous-sched-idle-driver", "nous-sched-tool", "nous-js", "nous-worker"} <= in_code
    assert "nous-sched" not in in_code
    page = (DOCS / "runtimes.rst").read_text(encoding="utf-8")
    listed = page[page.index(".. nous-checked:: threads") : page.index("No host thread is created per run")]
    assert nous_docs.names_in(listed) == in_code


def test_the_checker_finds_a_name_the_manual_does_not_give(tmp_path):
    (tmp_path / "m.py").write_text(
        'import threading\nthreading.Thread(name=f"nous-sched-new-{n}")\nPROG = "nous-sched"\n'
    )
    assert nous_docs.threads_in_code(tmp_path) == {"nous-sched-new"}
    assert nous_docs.names_in("* ``nous-sched-new-<n>``: ... the ``nous-sched`` command") == {"nous-sched-new"}


def test_the_error_kinds_page_names_every_kind():
    from nous_sched import ERROR_KINDS

    page = (DOCS / "reference" / "errors.rst").read_text(encoding="utf-8")
    assert nous_docs.kinds_in(page) == list(ERROR_KINDS)


def test_the_live_events_page_names_every_kind():
    page = (DOCS / "live.rst").read_text(encoding="utf-8")
    assert set(nous_docs.kinds_in(page)) == set(nous_docs.live_kinds())


def test_the_events_table_is_the_vocabulary():
    from nous_sched import events

    rows = nous_docs.event_vocabulary()
    assert [row["name"] for row in rows] == [kind.name for kind in events.VOCABULARY]
    assert set(events.AUDIT_TYPES) <= {row["audit"] for row in rows}
    assert all(row["meaning"] for row in rows)


def test_the_limits_table_names_every_field():
    page = (DOCS / "reference" / "limits.rst").read_text(encoding="utf-8")
    table = page[page.index(".. nous-checked:: limits") : page.index("A call past")]
    assert set(re.findall(r"^\s+``([a-z_]+)``\s", table, re.M)) == set(nous_docs.limit_fields())


def test_the_cli_help_covers_every_command():
    commands = [c for c, _ in nous_docs.cli_help()]
    assert commands[:2] == ["nous-sched", "nous-sched run"] and "nous-sched serve-mcp" in commands
    assert "--approval-store FILE" in dict(nous_docs.cli_help())["nous-sched run"]


def test_the_run_options_are_run_codes():
    options = dict(nous_docs.run_options())
    assert options["timeout"] == "30.0" and options["max_parallel"] == "10" and "description" in options


def test_the_run_options_are_a_run_options_class_fields_where_there_is_one(monkeypatch):
    import attrs

    import nous_sched

    @attrs.frozen
    class RunOptions:
        timeout: float = 30.0
        tags: list = attrs.Factory(list)
        name: str = attrs.field(kw_only=True)

    monkeypatch.setattr(nous_sched, "RunOptions", RunOptions, raising=False)
    options = nous_docs.run_options()
    assert options[:3] == [("timeout", "30.0"), ("tags", "a new list"), ("name", "required")]
    assert [name for name, _ in options].count("timeout") == 1  # run_code's own, not twice


# -- the README ---------------------------------------------------------------------------------


def _extras_in_setup_cfg() -> set[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    return set(config["options.extras_require"])


def test_the_readmes_extras_table_is_setup_cfgs():
    text = README.read_text(encoding="utf-8")
    table = text[text.index(".. extras-table-start") : text.index(".. extras-table-end")]
    named = re.findall(r"^``([a-z-]+)``\s", table, re.M)
    assert len(named) == len(set(named))
    assert set(named) == _extras_in_setup_cfg()
    assert {"all", "web"} <= set(named)


def test_readme_is_short_and_links_into_the_manual():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    for target in re.findall(r"<(docs/[a-z/_-]+\.rst)>`_", text):
        assert (ROOT / target).is_file(), target
    pages = {str(p.relative_to(ROOT)) for p in DOCS.glob("*.rst")} - {"docs/index.rst", "docs/architecture.rst"}
    linked = set(re.findall(r"<(docs/[a-z/_-]+\.rst)>`_", text))
    assert pages - {"docs/django.rst", "docs/benchmarks.rst"} <= linked


def test_the_manual_says_what_it_promises():
    text = "\n".join(p.read_text(encoding="utf-8") for p in PAGES)
    for needle in ("examples/flask_app.py", "benchmarks/README.rst", "nous-sched-driver-", "nous-sched-tool-"):
        assert needle in text, needle
    from nous_sched import ERROR_KINDS

    for kind in ERROR_KINDS:
        assert f"``{kind}``" in text


# OpenTelemetry attribute names the manual quotes, not Python names.
NOT_PYTHON_NAMES = {"nous_sched.throttled"}


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attribute in parts[cut:]:
                value = getattr(value, attribute)
        except AttributeError:
            return False
        return True
    return False


def test_every_module_name_and_path_the_manual_gives_exists():
    text = "\n".join(p.read_text(encoding="utf-8") for p in [README, *PAGES])
    text = re.sub(r"\s+", " ", text)  # a name the text wraps is one name
    names = set(re.findall(r"``(nous_sched(?:\.[A-Za-z_][A-Za-z0-9_]*)+)``", text)) - NOT_PYTHON_NAMES
    assert len(names) > 15
    missing = sorted(name for name in names if not _resolves(name))
    assert not missing, f"the manual names what the code no longer has: {missing}"
    paths = set(re.findall(r"``((?:nous_sched|examples|benchmarks|tests|docs|scripts)/[\w./-]*\w)``", text))
    assert paths, "the manual names files"
    gone = sorted(path for path in paths if "*" not in path and not (ROOT / path).exists())
    assert not gone, f"the manual names files that do not exist: {gone}"


def _run_all() -> types.ModuleType:
    """benchmarks/run_all.py as a module (it puts benchmarks/ on sys.path for its ``_common``)."""
    spec = importlib.util.spec_from_file_location("bench_run_all", ROOT / "benchmarks" / "run_all.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def test_run_alls_summary_block_reads_back_as_printed():
    run_all = _run_all()
    printed = run_all.format_summary(
        {}, reps="5", when="2026-12-07 01:00 UTC", commit="0123abc (dirty)", machine="python 3.11, 2 cores"
    )
    assert run_all.summary_shape(printed) == (
        [line.name for line in run_all.SUMMARY],
        "2026-12-07 01:00 UTC",
        "0123abc (dirty)",
    )
    # A renamed row, a block without its date, and a text without a block are told apart.
    renamed = printed.replace(run_all.SUMMARY[0].name, "sequential awaits, renamed".ljust(len(run_all.SUMMARY[0].name)))
    assert run_all.summary_shape(renamed)[0][0] == "sequential awaits, renamed"
    with pytest.raises(ValueError, match="no date or no commit"):
        run_all.summary_shape(printed.replace("2026-12-07 01:00 UTC", "today"))
    with pytest.raises(ValueError, match="no summary block"):
        run_all.summary_shape("no block here")


@pytest.mark.parametrize("path", [README, ROOT / "benchmarks" / "README.rst"], ids=_name)
def test_the_benchmark_summary_is_what_run_all_prints(path):
    """The summary block pasted into the README has the rows ``run_all.py
    --summary --peers`` prints, a date and a commit: the two cannot drift apart."""
    run_all = _run_all()
    try:
        names, date, commit = run_all.summary_shape(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        pytest.fail(f"{_name(path)}: {exc}; paste the output of `{run_all.SUMMARY_COMMAND}`")
    assert names == [line.name for line in run_all.SUMMARY]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC", date)
    assert re.fullmatch(r"[0-9a-f]{7,40}( \(dirty\))?", commit)

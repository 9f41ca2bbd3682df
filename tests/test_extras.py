"""The extras: one per capability, each described, and every error that names one names the
command that installs it for how the library was installed (``nous_sched/_extras.py``)."""

from __future__ import annotations

import configparser
import datetime
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import nous_sched
from nous_sched import ConfigError, RunCodeError
from nous_sched._extras import CONTRIBUTOR_EXTRAS, EXTRAS, USER_EXTRAS, checkout_of, command_for, install_command

ROOT = Path(__file__).resolve().parent.parent


def declared_extras() -> dict[str, list[str]]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    section = config["options.extras_require"]
    return {
        name: [line.strip() for line in section[name].splitlines() if line.strip() and not line.startswith("#")]
        for name in section
    }


def _name(requirement: str) -> str:
    return re.split(r"[<>=~!\[;]", requirement, maxsplit=1)[0].strip().lower()


# -- the table ---------------------------------------------------------------------------------


def test_every_declared_extra_is_in_the_table_and_every_users_extra_is_declared():
    declared = set(declared_extras())
    assert declared <= set(EXTRAS), f"extras with no description in nous_sched/_extras.py: {declared - set(EXTRAS)}"
    assert set(USER_EXTRAS) <= declared
    assert {"test", "release", "bench", "peer"} <= declared
    assert not set(USER_EXTRAS) & set(CONTRIBUTOR_EXTRAS)
    assert all(description.strip() for description in EXTRAS.values())


def test_all_is_every_users_extra_and_no_contributors_tooling():
    extras = declared_extras()
    wanted = {_name(r) for name in USER_EXTRAS if name != "all" for r in extras[name]}
    assert {_name(r) for r in extras["all"]} == wanted
    assert not {"pytest", "ruff", "mypy", "build", "twine", "pyinstrument"} & {_name(r) for r in extras["all"]}
    # The same version bounds as the extra each requirement comes from.
    bounds = {_name(r): r for name in USER_EXTRAS if name != "all" for r in extras[name]}
    assert sorted(extras["all"]) == sorted(bounds.values())


def test_web_brings_flask_and_django_and_release_brings_build_and_twine():
    extras = declared_extras()
    assert {_name(r) for r in extras["web"]} == {"flask", "django"}
    assert {_name(r) for r in extras["release"]} == {"build", "twine"}
    # CI's one install (the test extra) has the release tools too (.ci/wheel-check uses them).
    assert {"build", "twine"} <= {_name(r) for r in extras["test"]}


def test_each_description_names_the_packages_its_extra_installs():
    extras = declared_extras()
    for name, description in EXTRAS.items():
        if name not in extras or name in ("all", "test"):
            continue
        for requirement in extras[name]:
            assert f"``{_name(requirement)}``" in description, (name, requirement)


# -- the command, for each way of installing ---------------------------------------------------


def test_from_this_checkout_the_command_is_an_editable_install_of_it():
    assert checkout_of(Path(nous_sched.__file__).resolve().parent) == ROOT
    assert install_command("mcp") == f"pip install -e '{ROOT}[mcp]'"


@pytest.mark.parametrize(
    ("checkout", "direct_url", "command"),
    [
        (Path("/src/nous sched"), None, "pip install -e '/src/nous sched[redis]'"),
        (None, None, "pip install 'nous_sched[redis]'"),
        (None, "{not json", "pip install 'nous_sched[redis]'"),
        (None, json.dumps({"url": "https://example.org/nous_sched.whl", "archive_info": {}}), None),
    ],
)
def test_the_command_for_each_installation(checkout, direct_url, command):
    assert command_for("redis", checkout, direct_url) == (command or "pip install 'nous_sched[redis]'")


def test_installed_from_a_file_the_command_names_the_file_while_it_exists(tmp_path):
    wheel = tmp_path / "nous_sched-0.2.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    url = json.dumps({"url": wheel.as_uri(), "archive_info": {}})
    assert command_for("otel", None, url) == f"pip install '{wheel}[otel]'"
    editable = json.dumps({"url": tmp_path.as_uri(), "dir_info": {"editable": True}})
    assert command_for("otel", None, editable) == f"pip install -e '{tmp_path}[otel]'"
    folder = json.dumps({"url": tmp_path.as_uri(), "dir_info": {}})
    assert command_for("otel", None, folder) == f"pip install '{tmp_path}[otel]'"
    wheel.unlink()
    assert command_for("otel", None, url) == "pip install 'nous_sched[otel]'"


def test_an_installed_copy_is_not_taken_for_a_checkout(tmp_path):
    (tmp_path / "nous_sched").mkdir()
    assert checkout_of(tmp_path / "nous_sched") is None
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = something_else\n")
    assert checkout_of(tmp_path / "nous_sched") is None
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = nous_sched\n")
    assert checkout_of(tmp_path / "nous_sched") == tmp_path


def test_the_command_is_one_shell_word_after_pip_install():
    for extra in USER_EXTRAS:
        words = shlex.split(install_command(extra))
        assert words[:2] == ["pip", "install"] and words[-1].endswith(f"[{extra}]")


# -- each error that names an extra -------------------------------------------------------------


def _hide(monkeypatch, *packages: str) -> None:
    """As if ``packages`` were not installed."""
    for name in list(sys.modules):
        if name in packages or name.split(".")[0] in packages:
            monkeypatch.delitem(sys.modules, name)
    for package in packages:
        monkeypatch.setitem(sys.modules, package, None)


def _reimport(monkeypatch, module: str) -> None:
    monkeypatch.delitem(sys.modules, module, raising=False)
    parent, _, child = module.rpartition(".")
    monkeypatch.delattr(sys.modules[parent], child, raising=False)
    importlib.import_module(module)


def test_otel_names_its_command(monkeypatch):
    _hide(monkeypatch, "opentelemetry")
    with pytest.raises(ImportError) as raised:
        _reimport(monkeypatch, "nous_sched.otel")
    assert str(raised.value).endswith(f"install it with: {install_command('otel')}")


def test_agui_names_its_command(monkeypatch):
    _hide(monkeypatch, "ag_ui")
    with pytest.raises(ImportError) as raised:
        _reimport(monkeypatch, "nous_sched.agui")
    assert str(raised.value).endswith(f"install it with: {install_command('agui')}")


def test_redis_throttle_and_store_name_their_command(monkeypatch):
    from nous_sched import RedisApprovalStore, Throttle

    _hide(monkeypatch, "redis")
    with pytest.raises(RunCodeError) as raised:
        RedisApprovalStore("redis://127.0.0.1:1/0")
    assert str(raised.value).endswith(f"install it with: {install_command('redis')}")
    throttle = Throttle("nous-sched-test-extras", max_running=1, redis_url="redis://127.0.0.1:1/0")
    with pytest.raises(ImportError) as raised:
        with throttle.hold(timeout=5):
            pass
    assert str(raised.value).endswith(f"install it with: {install_command('redis')}")


def test_mcp_names_its_command(monkeypatch):
    import nous_sched.mcp

    assert nous_sched.mcp.INSTALL_HINT.endswith(f"install it with: {install_command('mcp')}")
    _hide(monkeypatch, "mcp")
    with pytest.raises(ImportError, match=re.escape(install_command("mcp"))):
        nous_sched.mcp.require_sdk()


def test_pydantic_names_its_command(monkeypatch):
    from nous_sched import function_tool

    _hide(monkeypatch, "pydantic")

    def rich(when: datetime.date) -> None:
        pass

    with pytest.raises(ConfigError, match=re.escape(install_command("pydantic"))):
        function_tool(rich)


@pytest.mark.parametrize(
    ("adapter", "package", "extra"),
    [
        ("from_langchain", "langchain_core", "langchain"),
        ("from_openai_agents", "agents", "openai-agents"),
        ("from_pydantic_ai", "pydantic_ai", "pydantic-ai"),
        ("from_llamaindex", "llama_index", "llamaindex"),
    ],
)
def test_each_framework_names_its_command(monkeypatch, adapter, package, extra):
    from nous_sched import integrations

    _hide(monkeypatch, package)
    with pytest.raises(ConfigError) as raised:
        getattr(integrations, adapter)(object())
    assert str(raised.value).endswith(f"install it with: {install_command(extra)}")


def test_the_serve_mcp_help_names_the_command():
    done = subprocess.run(
        [sys.executable, "-m", "nous_sched", "serve-mcp", "--help"],
        env={**os.environ, "COLUMNS": "10000"},  # argparse wraps at hyphens, and a checkout's path may have some
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert install_command("mcp") in " ".join(done.stdout.split())

"""The optional extras, what each brings, and the pip command that adds one to this installation.

:data:`EXTRAS` is the table a user reads (the README's and the manual's
table of extras match it, and it matches ``setup.cfg``: both checked by
``tests/test_extras.py``). Every error that names an extra names it through
:func:`install_command`, so the command it prints is one that works for how
the library was installed:

* imported from a source checkout (``pip install -e .``, or the checkout on
  ``sys.path``): ``pip install -e '/path/to/checkout[mcp]'``;
* installed from a wheel or sdist file that is still where it was installed
  from: ``pip install '/path/to/nous_sched-0.2.0-py3-none-any.whl[mcp]'``;
* otherwise (installed from a package index): ``pip install 'nous_sched[mcp]'``.
"""

from __future__ import annotations

import json
import pathlib
import shlex
import urllib.parse
from typing import Optional

__all__ = ["EXTRAS", "USER_EXTRAS", "install_command"]

#: Every extra a user might install, and what it brings. ``all`` is all of
#: them; the contributors' extras (``test``, ``docs``, ``release``, ``bench``,
#: ``peer``) are listed in ``CONTRIBUTOR_EXTRAS``.
USER_EXTRAS: dict[str, str] = {
    "pydantic": "``pydantic``: ``function_tool`` parameters of any type pydantic makes a JSON Schema of",
    "langchain": "``langchain-core``, ``langchain``: ``nous_sched.integrations`` for LangChain tools and agents",
    "openai-agents": "``openai-agents``: ``nous_sched.integrations`` for the OpenAI Agents SDK",
    "pydantic-ai": "``pydantic-ai-slim``: ``nous_sched.integrations`` for Pydantic AI",
    "llamaindex": "``llama-index-core``: ``nous_sched.integrations`` for LlamaIndex tools",
    "mcp": "``mcp``: ``nous_sched.mcp`` (MCP servers' tools in a program) and ``nous-sched serve-mcp``",
    "redis": "``redis``: ``Throttle(redis_url=...)`` and ``RedisApprovalStore``, shared across machines",
    "otel": "``opentelemetry-api``, ``opentelemetry-sdk``: ``nous_sched.otel``, a span per run and per call",
    "agui": "``ag-ui-protocol``: ``nous_sched.agui``, a run's live events in the AG-UI protocol",
    "speed": "``orjson``: the same answers, large payloads checked and copied faster",
    "dask": "``distributed``: a Dask cluster's executor as ``executor=``",
    "celery": "``celery`` (Redis transport): ``nous_sched.integrations.celery``, programs on a Celery fleet",
    "web": "``flask``, ``django``: the web examples (``examples/flask_*.py``, ``examples/django_*``)",
    "postgres": "``psycopg``: ``PostgresApprovalStore``, approvals kept in a Postgres database",
    "all": "every extra above",
}

#: The extras for working on the library itself, not for using it.
CONTRIBUTOR_EXTRAS: dict[str, str] = {
    "test": "everything the tests and ``.ci/run`` need: ``pytest``, ``ruff``, ``mypy``, every optional package",
    "docs": "``sphinx``, ``furo`` (its theme): the manual in ``docs/``",
    "release": "``build``, ``twine``: ``python -m build`` and ``twine check`` (``.ci/wheel-check``)",
    "bench": (
        "``pyinstrument``, ``pydantic-monty``, ``gunicorn``, ``httpx``: profiles of the benchmarks, a peer they"
        " compare with, and the Flask example served by gunicorn under load"
    ),
    "peer": "``langchain-quickjs``: the peer library ``benchmarks/bench_peer.py`` compares with",
}

#: Both tables: every extra ``setup.cfg`` declares.
EXTRAS: dict[str, str] = {**USER_EXTRAS, **CONTRIBUTOR_EXTRAS}

_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent


def install_command(extra: str) -> str:
    """The shell command that adds ``extra`` to the nous_sched this process imported.

    Always ``pip install`` followed by one shell-quoted argument ending in
    ``[extra]`` (``-e`` first for a checkout): see the module's docstring for
    which one.
    """
    return command_for(extra, checkout_of(_PACKAGE_DIR), _direct_url())


def checkout_of(package_dir: pathlib.Path) -> Optional[pathlib.Path]:
    """The source checkout ``package_dir`` is in, or ``None`` when it is an installed copy."""
    root = package_dir.parent
    try:
        config = (root / "setup.cfg").read_text(encoding="utf-8")
    except OSError:
        return None
    return root if "name = nous_sched" in config else None


def command_for(extra: str, checkout: Optional[pathlib.Path], direct_url: Optional[str]) -> str:
    """:func:`install_command`'s answer, from where the package is and its ``direct_url.json`` (PEP 610)."""
    if checkout is not None:
        return f"pip install -e {shlex.quote(f'{checkout}[{extra}]')}"
    source = _local_source(direct_url)
    if source is not None:
        path, editable = source
        return f"pip install {'-e ' if editable else ''}{shlex.quote(f'{path}[{extra}]')}"
    return f"pip install {shlex.quote(f'nous_sched[{extra}]')}"


def _local_source(direct_url: Optional[str]) -> Optional[tuple[pathlib.Path, bool]]:
    """The local file or folder the package was installed from, if it still exists, and whether editably."""
    try:
        data = json.loads(direct_url or "null")
        url, editable = data["url"], data.get("dir_info", {}).get("editable") is True
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if not isinstance(url, str) or urllib.parse.urlsplit(url).scheme != "file":
        return None
    path = pathlib.Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
    return (path, editable) if path.exists() else None


def _direct_url() -> Optional[str]:
    from importlib import metadata  # here: only an error message pays for it

    try:
        return metadata.distribution("nous_sched").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None

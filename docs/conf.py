"""Sphinx configuration of the nous_sched manual.

Build it as CI does (``.ci/run``): ``python -m sphinx -W --keep-going -b html
docs build/docs``. ``-W`` makes every warning an error, so a broken reference,
a public name without documentation or a generated list that drifted from the
code fails the build.
"""

from __future__ import annotations

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
# The checkout's nous_sched, not an installed copy, and the manual's own extension.
sys.path[:0] = [str(HERE.parent), str(HERE / "_ext")]

import nous_sched  # noqa: E402

project = "nous_sched"
author = "the nous_sched authors"
copyright = "the nous_sched authors"
release = nous_sched.__version__
version = release

extensions = ["sphinx.ext.autodoc", "nous_docs"]
root_doc = "index"
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = f"nous_sched {release}"
# The pages are reStructuredText with ``literal`` markup for code names, as the README was.
default_role = "literal"
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True}
# Every cross-reference must resolve: a docstring's role names a documented
# public name (``~nous_sched.Tool``), or is plain ``literal`` text.
nitpicky = True
nitpick_ignore = [
    # The standard library and attrs: no intersphinx, CI builds without network.
    ("py:class", "collections.abc.Mapping"),
    ("py:class", "threading.Event"),
    ("py:func", "attrs.evolve"),
    # Internal types that public signatures name (the runtime protocol between
    # the scheduler and a CodeRuntime, a live run's stream, a throttle's hold):
    # not in ``nous_sched.__all__``, so the manual has no entry to point at.
    ("py:class", "nous_sched.live.EventStream"),
    ("py:class", "nous_sched.runtime.Begun"),
    ("py:class", "nous_sched.runtime.Cancel"),
    ("py:class", "nous_sched.runtime.Host"),
    ("py:class", "nous_sched.runtime._remote.Begun"),
    ("py:class", "nous_sched.runtime.pool.DomainRuntime"),
    ("py:class", "nous_sched.throttle._throttle.Hold"),
    # What a state store's reads answer (nous_sched.state, the store seam's own types).
    ("py:class", "nous_sched.state._seam.Entry"),
    ("py:class", "nous_sched.state._seam.KeyInfo"),
]

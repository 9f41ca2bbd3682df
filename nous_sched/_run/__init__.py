"""Private: one ``run_code`` run, in three modules, each importing only the ones below it.

* :mod:`.entry`: :func:`nous_sched.run_code`, the entry: the run's
  :class:`~nous_sched.RunOptions` made, then the run plain or durable (the one
  module that imports :mod:`nous_sched.durable`);
* :mod:`.runner`: the machinery (prepare, then execute) and the host
  bindings, which :mod:`nous_sched.durable` drives with its replaying runtime;
* :mod:`.options`: :class:`~nous_sched.RunOptions`, every option of a run,
  checked once, as it is made.

This ``__init__`` imports none of them: importing the machinery never runs the entry.
"""

"""The doors an agent's code uses: Code Mode as one tool, a Tool in a model's format, asyncio.

:func:`run_code_tool`, :func:`visible_tools`, :class:`WithContextUpdate` and
:data:`MODES` (``_run_code_tool.py``: Code Mode as one tool a model calls);
``adapters.py``: a Tool in OpenAI (chat, responses) and Anthropic formats,
and :func:`~nous_sched.call_tool`, a model's direct call; ``aio.py``:
:func:`~nous_sched.arun_code` and :func:`~nous_sched.acall_tool`, the asyncio
door (a thread per call; cancelling the task sets the run's cancel).
"""

from ._run_code_tool import MODES, RUN_CODE_DESCRIPTION, RUN_CODE_NAME, WithContextUpdate, run_code_tool, visible_tools

__all__ = ["MODES", "RUN_CODE_DESCRIPTION", "RUN_CODE_NAME", "WithContextUpdate", "run_code_tool", "visible_tools"]

"""Adapters in: tools written for other frameworks, as :class:`~nous_sched.Tool` values.

One module per framework, each importing its framework only when called (the
framework is an optional extra, named in the :class:`~nous_sched.ConfigError`
raised when it is missing):

=====================================  ======================================  ==================
function                               adapts                                  extra
=====================================  ======================================  ==================
:func:`~.langchain.from_langchain`     a LangChain ``BaseTool``                ``langchain``
:func:`~.openai_agents.from_openai_agents`  an OpenAI Agents SDK ``FunctionTool``   ``openai-agents``
:func:`~.pydantic_ai.from_pydantic_ai` a pydantic-ai ``Tool``                  ``pydantic-ai``
:func:`~.llamaindex.from_llamaindex`   a LlamaIndex ``FunctionTool``/tool      ``llamaindex``
=====================================  ======================================  ==================

Every adapter takes the same overrides: ``name``, ``concurrency_safe`` (a
predicate, ``True`` for always, ``False`` for never; ``None``, the default,
takes what the framework's own flags say) and ``requires_approval`` (``None``
takes the framework's flag). The framework's flags map onto ours where it has
them: pydantic-ai's ``sequential`` means exclusive and its other tools run
side by side, as pydantic-ai runs them; pydantic-ai's ``requires_approval``
and the Agents SDK's ``needs_approval`` mean approval (a per-call approval
callable means every call asks); output schemas become ``returns``. Async
tools run to completion on the tool's own thread. Features that only the
framework's own runner can honour (the Agents SDK's guardrails, pydantic-ai's
``prepare`` and run context) are refused when the tool is adapted rather than
silently skipped.

Code Mode switches (the agent's own tools reached from one ``run_code``
tool, each call with the agent run's context; one line each):
:class:`~.pydantic_ai.CodeModeToolset` and :class:`~.pydantic_ai.CodeMode`
(pydantic-ai), :class:`~.langchain.CodeModeMiddleware` (LangChain
``create_agent``), :func:`~.openai_agents.code_mode` (OpenAI Agents SDK).

Programs on a Celery fleet: ``nous_sched.integrations.celery`` (the ``celery``
extra; imported by name, never here): ``register(app, tools=...)``.

Adapters out (:mod:`.handoff`): :func:`to_langchain`, :func:`to_openai_agents`
and :func:`to_pydantic_ai` hand any :class:`~nous_sched.Tool`,
``run_code_tool(...)`` included, to that framework, async-native.
"""

from .handoff import to_langchain, to_openai_agents, to_pydantic_ai
from .langchain import from_langchain
from .llamaindex import from_llamaindex
from .openai_agents import from_openai_agents
from .pydantic_ai import from_pydantic_ai

__all__ = [
    "from_langchain",
    "from_llamaindex",
    "from_openai_agents",
    "from_pydantic_ai",
    "to_langchain",
    "to_openai_agents",
    "to_pydantic_ai",
]

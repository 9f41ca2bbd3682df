"""The tools the hostile-value matrix (``test_hostile_matrix.py``) runs programs against.

``echo`` answers with the value it was given and hostile characters of its
own (a tool's result is a value that leaves the library too); ``gated`` does
the same but needs approval, so the value reaches the approval question, the
approval store and ``approvals list``. Loaded by path, as ``nous-sched run
--tools`` and ``serve-mcp --tools`` load a module.
"""

from nous_sched import Tool

#: What each tool adds to its answer: a lone surrogate, NUL, ESC, a bidi override, a tag character, U+061C.
TOOL_SIDE = "tool:\ud800\x00\x1b[31m\u202e\U000e0041\u061c"


def _echo(args):
    return {"v": args.get("v"), "tool": TOOL_SIDE}


TOOLS = [
    Tool("echo", _echo, description="Answers with its argument `v`.", concurrency_safe=lambda args: True),
    Tool("gated", _echo, description="Answers with its argument `v`, once approved.", requires_approval=True),
]

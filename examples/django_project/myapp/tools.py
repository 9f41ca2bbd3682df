# myapp/tools.py
from django.db import close_old_connections

from nous_sched import PermissionPolicy, Tool, current_call, direct_dispatch


def django_dispatch(tool, args, run_ctx):
    """Run one tool call the way Django runs a request: stale DB connections closed around it."""
    close_old_connections()
    try:
        return direct_dispatch(tool, args, run_ctx)
    finally:
        close_old_connections()


def _whoami(args):
    return {"user_id": current_call.get().run_ctx.deps["user_id"]}


def _count_users(args):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.count()


POPULATIONS = {"Paris": 2102650, "Lagos": 15388000, "Lima": 9943800, "Osaka": 2752412}


def _population(args):
    return {"city": args["city"], "population": POPULATIONS.get(args["city"])}


def _write(args):
    # A side effect a person approves on the live page first (POLICY, below).
    return {"wrote": args["text"]}


TOOLS = [
    Tool("whoami", _whoami, description="The id of the user this run is for.", concurrency_safe=lambda args: True),
    Tool("count_users", _count_users, description="How many users there are.", concurrency_safe=lambda args: True),
    Tool(
        "population",
        _population,
        description="The population of a city.",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        concurrency_safe=lambda args: True,
    ),
    Tool("write", _write, description="Write a note.", parameters={"type": "object"}),
]

# Which calls wait for a person's yes on the live page.
POLICY = PermissionPolicy(require_approval={"write"})

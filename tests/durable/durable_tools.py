"""Tools for the durable-approval tests: each call appends one line to the file
named by ``NOUS_DURABLE_COUNT``, so a test counts how often each tool ran,
across every process that shares the file."""

import json
import os
import time

from nous_sched import Tool


def hold(where):
    """Say ``where`` in the file ``NOUS_DURABLE_MARK`` names, then wait to be killed (SIGKILL, by the test),
    or to be let go on (the file ``<mark>.go`` appears: a stalled process that carries on)."""
    mark = os.environ["NOUS_DURABLE_MARK"]
    with open(mark, "w", encoding="utf-8") as f:
        f.write(where)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if os.path.exists(mark + ".go"):
            return
        time.sleep(0.02)
    os._exit(99)  # never reached in a test: it kills or lets go of this process first


def _held(name, args, when):
    """``NOUS_DURABLE_HOLD`` is ``[tool, args, "before"|"after"]``: hold that call before or after its effect."""
    spec = os.environ.get("NOUS_DURABLE_HOLD")
    if spec and json.loads(spec) == [name, args, when]:
        hold(f"{when} effect of {name}")


def _ran(name, args):
    _held(name, args, "before")
    with open(os.environ["NOUS_DURABLE_COUNT"], "a", encoding="utf-8") as f:
        f.write(json.dumps([name, args], sort_keys=True) + "\n")
    _held(name, args, "after")


def _read(args):
    _ran("read", args)
    return {"read": args.get("i")}


def _pay(args):
    _ran("pay", args)
    return {"paid": args.get("amount")}


def _crash(args):
    _ran("crash", args)
    os._exit(17)  # the resuming process dies mid-run


_OBJECT = {"type": "object"}
TOOLS = [
    Tool("read", _read, description="Read item i.", parameters=_OBJECT),
    Tool("pay", _pay, description="Pay an amount.", parameters=_OBJECT, requires_approval=True),
    Tool("crash", _crash, description="Kill the process.", parameters=_OBJECT),
]


def ran(path):
    """The calls recorded in ``path``: a list of [name, args]."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]

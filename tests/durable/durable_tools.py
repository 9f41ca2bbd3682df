"""Tools for the durable-approval tests: each call appends one line to the file
named by ``NOUS_DURABLE_COUNT``, so a test counts how often each tool ran,
across every process that shares the file."""

import json
import os

from nous_sched import Tool


def _ran(name, args):
    with open(os.environ["NOUS_DURABLE_COUNT"], "a", encoding="utf-8") as f:
        f.write(json.dumps([name, args], sort_keys=True) + "\n")


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

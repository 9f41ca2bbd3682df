"""The tool set the Celery tests' workers load by import path (``tests/celery_app.py``).

Its throttle and approval store live in the Redis named by
``NOUS_SCHED_CELERY_REDIS``, so every worker of the fleet shares them; each
call of ``shared`` counts itself in Redis, to show the throttle's limit held
across the fleet.
"""

from __future__ import annotations

import os
import time

import redis

from nous_sched import RedisApprovalStore, Throttle, Tool

URL = os.environ["NOUS_SCHED_CELERY_REDIS"]
LIMIT = 2
THROTTLE = Throttle("celery-shared", max_running=LIMIT, redis_url=URL)
APPROVAL_STORE = RedisApprovalStore(URL, key=b"celery-tests-key-0123456789")
_redis = redis.Redis.from_url(URL)


def _safe(args: dict) -> bool:
    return True


def _echo(args: dict) -> dict:
    return {"v": args.get("v"), "pid": os.getpid()}


def _shared(args: dict) -> dict:
    now = _redis.incr("test:running")
    _redis.rpush("test:seen", now)
    try:
        time.sleep(float(args.get("seconds", 0.2)))
    finally:
        _redis.decr("test:running")
    return {"n": now, "pid": os.getpid()}


def _wait(args: dict) -> dict:
    time.sleep(float(args.get("seconds", 0.1)))
    return {"slept": args.get("seconds")}


TOOLS = [
    Tool("echo", _echo, concurrency_safe=_safe),
    Tool("shared", _shared, concurrency_safe=_safe, throttles=[THROTTLE]),
    Tool("wait", _wait, concurrency_safe=_safe),
    Tool("pay", _echo, concurrency_safe=_safe, requires_approval=True),
]

"""A Celery app whose workers run programs against this folder's tools (``nous_sched.integrations.celery``).

Start Redis, then a worker in this folder (``tools`` below is ``examples/tools.py``, imported
by each worker), then send a program from anywhere that reaches the broker::

    cd examples
    export REDIS_URL=redis://localhost:6379/0
    celery -A celery_tasks worker --concurrency 2
    python celery_tasks.py fanout.js     # in another shell: its live events, then the answer
"""

from __future__ import annotations

import json
import os
import sys

from celery import Celery

from nous_sched.integrations import celery as nous_celery

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")

app = Celery("nous_sched_example", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(worker_prefetch_multiplier=1, task_track_started=True)
# Every worker resolves the tool set by this import path; nothing callable crosses the broker.
tasks = nous_celery.register(app, tools="tools")


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as fh:
        program = fh.read()
    run = tasks.start(program, description=f"the example program {argv[1]}", timeout=30)
    for event in run.events():  # read from Redis as the worker writes them
        print(event.to_json())
    doc = run.result(timeout=60)
    print(json.dumps(doc["answer"]))  # what the model would read
    return 0 if doc["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The Celery app the fleet tests' workers run (``celery -A celery_app worker``): broker and results in
the Redis named by ``NOUS_SCHED_CELERY_REDIS``, the tool set ``celery_tools`` (or ``NOUS_SCHED_CELERY_TOOLS``)."""

from __future__ import annotations

import os

from celery import Celery

from nous_sched.integrations import celery as nous_celery

URL = os.environ["NOUS_SCHED_CELERY_REDIS"]
app = Celery("nous_sched_tests", broker=URL, backend=URL)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    task_track_started=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
tasks = nous_celery.register(app, tools=os.environ.get("NOUS_SCHED_CELERY_TOOLS", "celery_tools"))
# A second prefix with tiny event streams (test_a_watcher_that_falls_behind_is_told_by_a_gap), and a
# tool set that cannot be loaded (its tasks fail with a ConfigError naming it).
small = nous_celery.register(app, tools="celery_tools", prefix="nous_sched_small", events_maxlen=1)
broken = nous_celery.register(app, tools="no_such_tools_module", prefix="broken")

"""Programs on a real Celery fleet (``nous_sched.integrations.celery``): a Redis broker and two
``celery worker`` subprocesses (``w1``: prefork, ``w2``: solo, each on its own queue), started by the
module's fixture; a third worker, started and killed by the test that kills it."""

from __future__ import annotations

import gc
import os
import re
import signal
import time

import celery_fleet
import pytest
from celery.exceptions import TaskRevokedError, WorkerLostError
from redis_server import redis_process

from nous_sched import ConfigError
from nous_sched.integrations import celery as nous_celery

WAIT = 90
FAN_OUT = """
const got = await Promise.all([1, 2, 3, 4, 5].map((v) => tools.echo({v})));
console.log("fanned out " + got.length);
return got.map((g) => g.v);
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    folder = tmp_path_factory.mktemp("celery")
    with redis_process() as server:
        os.environ["NOUS_SCHED_CELERY_REDIS"] = server.url
        import celery_app

        with celery_fleet.fleet(server.url, folder) as made:
            made.start("w1", "prefork")
            made.start("w2", "solo")
            made.wait_ready(celery_app.app, ["w1", "w2"])
            made.app = celery_app.app
            made.tasks = celery_app.tasks
            made.redis = server
            yield made
            # Celery's AsyncResult unsubscribes when collected; one whose task raised is held by
            # the backend's cache (the exception's frames refer to it): forgotten, it goes now,
            # while Redis still answers, not later in another test.
            from celery.result import AsyncResult

            for thing in gc.get_objects():
                if isinstance(thing, AsyncResult):
                    thing.forget()
            gc.collect()


def _on(worker: str) -> dict:
    return {"queue": worker}


def test_a_fan_out_program_runs_on_the_fleet(fleet):
    tasks = fleet.tasks
    sent = [tasks.run.apply_async(kwargs={"code": FAN_OUT, "description": "fan out"}, queue=w) for w in ("w1", "w2")]
    docs = [s.get(timeout=WAIT) for s in sent]
    for doc, worker in zip(docs, ("w1", "w2")):
        assert doc["status"] == "ok", doc
        assert doc["answer"] == {"logs": ["fanned out 5"], "result": [1, 2, 3, 4, 5]}
        assert doc["worker"] == fleet.workers[worker].node
        assert [e["type"] for e in doc["events"]].count("tool_call") == 5
        assert len(doc["trail"]) == 5 and doc["error"] is None and doc["suspended"] is None
    # tasks.run.delay(...).get(), the documented form, on whichever worker takes it.
    assert tasks.run.delay(code="return 6 * 7", description="the answer").get(timeout=WAIT)["answer"]["result"] == 42


def test_the_data_options_reach_the_run(fleet):
    doc = fleet.tasks.run.delay(
        code='console.log("x".repeat(5000)); return "y".repeat(5000)',
        description="big",
        limits={"timeout": 20, "max_calls": 3},
        max_parallel=2,
        output_budget=2000,
        call_id="celery-test",
        runtime="in-process",
    ).get(timeout=WAIT)
    assert doc["status"] == "ok"
    assert len(str(doc["answer"])) < 2600 and doc["logs"] == ["x" * 5000]


def test_a_failing_program_is_data(fleet):
    doc = fleet.tasks.run.delay(code='console.log("before"); throw new Error("boom")', description="fails").get(
        timeout=WAIT
    )
    assert doc["status"] == "error" and doc["error"]["kind"] == "exception" and "boom" in doc["error"]["message"]
    assert doc["logs"] == ["before"] and doc["answer"]["error"]["kind"] == "exception"


@pytest.mark.parametrize(
    "options, named",
    [
        ({"bogus": 1}, "`bogus` is not an option of a Celery run"),
        ({"timout": 1}, "did you mean `timeout`"),
        ({"approval_handler": "x"}, "`approval_handler` is not data"),
        ({"limits": {"max_callz": 1}}, "`limits.max_callz`"),
        ({"limits": 5}, "limits"),
        ({"runtime": "gpu"}, "runtime"),
        ({"max_parallel": 0}, "max_parallel"),
    ],
)
def test_options_that_are_not_data_are_refused_where_the_task_is_sent(fleet, options, named):
    with pytest.raises(ConfigError, match="nous_sched.run") as caught:
        fleet.tasks.run.delay(code="return 1", description="refused", **options)
    assert named in str(caught.value)
    with pytest.raises(ConfigError, match="code"):
        fleet.tasks.run.delay(code=b"return 1", description="bytes")


def test_a_message_sent_around_the_check_is_refused_on_the_worker(fleet):
    sent = fleet.app.send_task("nous_sched.run", kwargs={"code": "return 1", "description": "x", "bogus": 1})
    with pytest.raises(ConfigError, match="`bogus` is not an option of a Celery run"):
        sent.get(timeout=WAIT)


def test_a_tool_set_that_cannot_be_loaded_is_a_config_error_naming_it(fleet):
    with pytest.raises(ConfigError, match="celery tools no_such_tools_module: no module named"):
        fleet.app.tasks["broken.run"].delay(code="return 1", description="x").get(timeout=WAIT)


def test_a_run_suspends_on_one_worker_and_is_resumed_on_the_other(fleet):
    tasks = fleet.tasks
    program = 'const r = await tools.pay({v: 7}); console.log("paid"); return r.v;'
    first = tasks.run.apply_async(kwargs={"code": program, "description": "pay"}, queue="w1").get(timeout=WAIT)
    assert first["status"] == "suspended" and first["worker"] == fleet.workers["w1"].node
    token = first["suspended"]["token"]
    assert first["answer"]["suspended"]["token"] == token
    assert [p["tool"] for p in first["suspended"]["pending"]] == ["pay"]
    resumed = tasks.start_resume(token, {0: True}, routing=_on("w2"))
    kinds = [e.kind for e in resumed.events()]
    assert kinds[-1] == "end" and "commit" in kinds and "log" in kinds
    doc = resumed.result(timeout=WAIT)
    assert doc["status"] == "ok" and doc["worker"] == fleet.workers["w2"].node
    assert doc["answer"]["result"] == 7 and doc["logs"] == ["paid"]
    assert "resumed" in [e["type"] for e in doc["durable"]]
    # The token is spent: a second resume, on the first worker, is refused.
    again = tasks.resume.apply_async(kwargs={"token": token, "decisions": {"0": True}}, queue="w1")
    with pytest.raises(Exception, match="token"):
        again.get(timeout=WAIT)


def test_a_throttle_shared_by_the_fleet_never_exceeds_its_limit(fleet):
    import redis

    client = redis.Redis.from_url(fleet.redis.url)
    client.delete("test:seen", "test:running")
    program = "return await Promise.all([1, 2, 3, 4].map(() => tools.shared({seconds: 0.3})));"
    sent = [
        fleet.tasks.run.apply_async(kwargs={"code": program, "description": "throttled"}, queue=w) for w in ("w1", "w2")
    ]
    docs = [s.get(timeout=WAIT) for s in sent]
    assert all(d["status"] == "ok" for d in docs), docs
    seen = [int(x) for x in client.lrange("test:seen", 0, -1)]
    assert len(seen) == 8
    assert max(seen) <= 2  # celery_tools.LIMIT, across both workers
    assert {d["worker"] for d in docs} == {fleet.workers["w1"].node, fleet.workers["w2"].node}


def test_a_started_run_streams_its_events_through_redis(fleet):
    program = 'console.log("one"); const a = await tools.echo({v: 1}); console.log("two"); return a.v;'
    remote = fleet.tasks.start(program, description="watched", routing=_on("w2"))
    events = list(remote.events())
    kinds = [e.kind for e in events]
    assert kinds[0] == "log" and kinds[-1] == "end" and "call" in kinds and "commit" in kinds
    assert events[-1].data["ok"] is True and events[-1].data["answer"]["result"] == 1
    assert remote.result(timeout=WAIT)["answer"]["result"] == 1
    # A second watcher, late, reads the same events from the first.
    assert [e.kind for e in remote.events()] == kinds


def test_a_watcher_that_falls_behind_is_told_by_a_gap(fleet):
    import celery_app

    # celery_app.small: a stream of about one entry (Redis trims whole nodes, so it may hold a few
    # more): the events before those it holds are counted as missed.
    tasks = celery_app.small
    program = 'for (let i = 0; i < 400; i++) console.log("line " + i); return 1;'
    remote = tasks.start(program, description="many lines", routing=_on("w2"))
    remote.result(timeout=WAIT)
    events = list(remote.events())
    assert events[0].kind == "gap" and events[0].data["missed"] > 0
    assert events[-1].kind == "end"
    assert events[0].data["missed"] + len(events) - 1 == 401  # 400 lines and the end


def test_a_cancelled_run_stops_within_the_cancel_bound_with_its_logs(fleet):
    program = 'console.log("before"); await tools.wait({seconds: 60}); console.log("after"); return 1;'
    remote = fleet.tasks.start(program, description="cancel me", routing=_on("w1"))
    for event in remote.events():
        if event.kind == "call":
            break
    asked = time.monotonic()
    remote.cancel()
    doc = remote.result(timeout=WAIT)
    took = time.monotonic() - asked
    assert doc["status"] == "error" and doc["error"]["kind"] == "cancelled"
    assert doc["logs"] == ["before"]
    assert [e["type"] for e in doc["events"]][:1] == ["tool_call"]
    assert took < 15, took  # the cancel watch's second, the worker's 50 ms, and the broker's round trips
    end = [e for e in remote.events() if e.kind == "end"][0]
    assert end.data["error"]["kind"] == "cancelled" and end.data["logs"] == 1


def test_celery_s_soft_time_limit_and_revoke_with_sigusr1_cancel_the_run(fleet):
    program = 'console.log("before"); await tools.wait({seconds: 60}); return 1;'
    sent = fleet.tasks.run.apply_async(
        kwargs={"code": program, "description": "soft limit"}, queue="w1", soft_time_limit=2
    )
    doc = sent.get(timeout=WAIT)
    assert doc["status"] == "error" and doc["error"]["kind"] == "cancelled" and doc["logs"] == ["before"]

    remote = fleet.tasks.start(program, description="revoked", routing=_on("w1"))
    for event in remote.events():
        if event.kind == "call":
            break
    fleet.app.control.revoke(remote.task_id, terminate=True, signal="SIGUSR1")
    end = [e for e in remote.events() if e.kind == "end"][0]
    assert end.data["error"]["kind"] == "cancelled"


def test_a_cancelled_task_not_yet_started_never_runs(fleet):
    blocker = fleet.tasks.run.apply_async(
        kwargs={"code": "await tools.wait({seconds: 3}); return 1", "description": "busy"}, queue="w2"
    )
    queued = fleet.tasks.start('await tools.echo({v: "ran"}); return 1', description="never", routing=_on("w2"))
    fleet.tasks.cancel(queued.task_id)
    assert blocker.get(timeout=WAIT)["status"] == "ok"
    with pytest.raises(TaskRevokedError):
        queued.result(timeout=WAIT)


def test_a_sigkilled_celery_worker_leaves_no_worker_process_behind(fleet):
    w3 = fleet.start("w3", "prefork")
    fleet.wait_ready(fleet.app, ["w3"])
    program = 'console.log("started"); await tools.wait({seconds: 60}); return 1;'

    def running() -> tuple[nous_celery.RemoteRun, set[int]]:
        remote = fleet.tasks.start(program, description="killed", routing=_on("w3"))
        for event in remote.events():
            if event.kind == "call":
                break
        found = celery_fleet.ours(celery_fleet.descendants(w3.proc.pid))
        assert found, "the run's worker processes are below the celery worker"
        return remote, found

    def gone(pids: set[int]) -> None:
        deadline = time.monotonic() + 30
        while celery_fleet.alive(pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not celery_fleet.alive(pids), celery_fleet.alive(pids)

    # The pool child running the task: the task fails, saying its worker was lost; its pool dies with it.
    remote, found = running()
    child = [p for p in celery_fleet.descendants(w3.proc.pid) if p not in found and os.getppid() != p]
    child = [p for p in child if any(q in celery_fleet.descendants(p) for q in found)]
    assert len(child) == 1
    # The pool child made its own worker pool (a fork server below it), not the main process.
    main_children = {p for p in celery_fleet.descendants(w3.proc.pid) if _parent(p) == w3.proc.pid}
    assert not (found & main_children) and child[0] in main_children
    os.kill(child[0], signal.SIGKILL)
    with pytest.raises(WorkerLostError):
        remote.result(timeout=WAIT)
    gone(found)

    # The celery worker's main process: everything below it goes, and the watcher's result says
    # the worker was lost (Celery itself records nothing: the task stays STARTED).
    remote, found = running()
    below = celery_fleet.descendants(w3.proc.pid)
    w3.proc.send_signal(signal.SIGKILL)
    w3.proc.wait()
    gone(below)
    with pytest.raises(WorkerLostError, match=f"worker {w3.node} stopped answering"):
        remote.result(timeout=WAIT, liveness=2.0)
    # The rest of the fleet is unharmed.
    assert fleet.tasks.run.delay(code="return 1", description="after").get(timeout=WAIT)["answer"]["result"] == 1


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def test_a_broker_that_is_down_is_named_fast(tmp_path):
    from celery import Celery

    with redis_process() as server:
        url = server.url
    app = Celery("down", broker=url, backend=url)
    app.conf.broker_connection_retry = False
    tasks = nous_celery.register(app, tools="celery_tools", prefix="down")
    began = time.monotonic()
    with pytest.raises(nous_celery.BrokerError, match=f"broker's Redis at {url}"):
        tasks.run.delay(code="return 1", description="nowhere")
    with pytest.raises(nous_celery.BrokerError, match=f"broker's Redis at {url}"):
        list(nous_celery.RemoteRun(tasks, app.AsyncResult("no-such-task")).events())
    with pytest.raises(nous_celery.BrokerError, match=f"broker's Redis at {url}"):
        tasks.cancel("no-such-task")
    assert time.monotonic() - began < 5  # refused connections: each a fraction of a second


def test_register_refuses_bad_arguments():
    from celery import Celery

    app = Celery("x", broker="amqp://localhost//")
    with pytest.raises(ConfigError, match="redis_url"):
        nous_celery.register(app, tools="celery_tools")
    with pytest.raises(ConfigError, match="tools"):
        nous_celery.register(app, tools="", redis_url="redis://localhost")
    with pytest.raises(ConfigError, match="events_maxlen"):
        nous_celery.register(app, tools="t", redis_url="redis://localhost", events_maxlen=0)


def test_the_manuals_example_app_runs_a_program_on_its_worker(tmp_path):
    import json
    import subprocess
    import sys

    from celery import Celery

    examples = celery_fleet.ROOT / "examples"
    with redis_process() as server, celery_fleet.fleet(server.url, tmp_path, app="celery_tasks", cwd=examples) as made:
        made.start("example", "solo")
        made.wait_ready(Celery("ping", broker=server.url), ["example"])
        done = subprocess.run(
            [sys.executable, "celery_tasks.py", "fanout.js"],
            cwd=examples,
            env=made.env,
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert json.loads(lines[-2])["kind"] == "end"
    answer = json.loads(lines[-1])
    assert answer["logs"][0].startswith("looked up 12 cities in ")


def test_a_task_cancelled_before_a_worker_takes_it_is_revoked_by_the_worker(fleet):
    # The cancel key is there before the task is sent (as when Celery's revoke had not reached the
    # worker): the worker revokes it, and its program never starts.
    import uuid

    import redis

    client = redis.Redis.from_url(fleet.redis.url)
    client.delete("test:seen")
    task_id = str(uuid.uuid4())
    fleet.tasks.redis().rpush(fleet.tasks.cancel_key(task_id), b"1")
    sent = fleet.tasks.run.apply_async(
        kwargs={"code": "return await tools.shared({seconds: 0})", "description": "never"}, task_id=task_id, queue="w1"
    )
    with pytest.raises(TaskRevokedError):
        sent.get(timeout=WAIT)
    assert client.llen("test:seen") == 0


def test_a_watcher_of_a_task_no_worker_takes_times_out(fleet):
    remote = nous_celery.RemoteRun(fleet.tasks, fleet.app.AsyncResult("a-task-nobody-sent"))
    began = time.monotonic()
    with pytest.raises(TimeoutError, match="a-task-nobody-sent"):
        list(remote.events(timeout=1.0, poll=0.2))
    assert time.monotonic() - began < 30


def test_without_celery_register_names_the_extra_that_installs_it(monkeypatch):
    import sys

    from celery import Celery

    from nous_sched._extras import install_command

    app = Celery("x", broker="redis://localhost")
    monkeypatch.setitem(sys.modules, "celery", None)
    with pytest.raises(ConfigError, match=re.escape(install_command("celery"))):
        nous_celery.register(app, tools="celery_tools")


def test_a_broker_that_is_silent_is_named_within_its_timeouts():
    from celery import Celery

    with redis_process() as server:
        app = Celery("silent", broker=server.url, backend=server.url)
        tasks = nous_celery.register(app, tools="celery_tools", prefix="silent")
        server.signal(signal.SIGSTOP)  # sockets open, nothing answers
        try:
            began = time.monotonic()
            with pytest.raises(nous_celery.BrokerError, match=f"broker's Redis at {server.url}"):
                tasks.run.delay(code="return 1", description="nowhere")
            with pytest.raises(nous_celery.BrokerError, match=f"broker's Redis at {server.url}"):
                tasks.cancel("no-such-task")
            with pytest.raises(nous_celery.BrokerError, match=f"broker's Redis at {server.url}"):
                list(nous_celery.RemoteRun(tasks, app.AsyncResult("no-such-task")).events())
            assert time.monotonic() - began < 30  # 0.5 s, 0.5 s and 5.5 s by the timeouts
        finally:
            server.signal(signal.SIGCONT)

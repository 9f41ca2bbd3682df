import threading

import pytest

from nous_sched import Scheduler


@pytest.fixture
def make_scheduler():
    """``make_scheduler(**options)``: a Scheduler (timeout 30 s unless given), stopped at teardown."""
    made = []

    def make(**options):
        options.setdefault("timeout", 30)
        scheduler = Scheduler(**options)
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        scheduler.stop(timeout=10)


@pytest.fixture
def make_event(make_scheduler):
    """``make_event()``: a threading.Event that is set at teardown, before any scheduler is stopped.

    Tools and predicates block on these, so no test leaves a thread waiting.
    """
    events = []

    def make():
        event = threading.Event()
        events.append(event)
        return event

    yield make
    for event in events:
        event.set()


@pytest.fixture(params=["worker", "in_process"])
def runtime(request, monkeypatch):
    """The test runs once per runtime, each made the default of ``run_code``:
    ``worker``, the process's default :class:`~nous_sched.WorkerPool` (shared
    by the whole session, so it stays warm), and ``in_process``, a
    :class:`~nous_sched.QuickJSRuntime`."""
    from nous_sched.runtime import pool as pool_module
    from nous_sched.runtime.quickjs import QuickJSRuntime

    chosen = pool_module.default_pool() if request.param == "worker" else QuickJSRuntime()
    monkeypatch.setattr(pool_module, "default_pool", lambda: chosen)
    return chosen


@pytest.fixture(scope="session")
def redis_url():
    """The URL of a real Redis server (``tests/redis_server.py``), one for the whole session."""
    from redis_server import redis_server

    with redis_server() as url:
        yield url


@pytest.fixture(scope="session")
def postgres_server():
    """A real Postgres server (``tests/postgres_server.py``), a throwaway cluster for the whole session."""
    from postgres_server import postgres_process

    with postgres_process() as server:
        yield server


@pytest.fixture
def postgres_dsn(postgres_server):
    """The DSN of a fresh, empty database on the session's Postgres server."""
    return postgres_server.new_database()


@pytest.fixture
def make_set():
    """``make_set(**options)``: a private ``DriverThreads`` (a scheduler's warm
    driver threads), retired (and its threads joined) at teardown."""
    from nous_sched.scheduler._driver_threads import DriverThreads

    made: list = []

    def make(**options):
        threads = DriverThreads(**options)
        threads._went_idle = threading.Semaphore(0)
        made.append(threads)
        return threads

    yield make
    for threads in made:
        for thread in threads.retire_idle():
            thread.join(10.0)
            assert not thread.is_alive(), f"{thread.name} outlived its set's retirement"

"""Run a coroutine to completion from synchronous code, on the calling thread.

Tools run on executor threads, which have no event loop; an ``async def``
tool (from the decorator or a framework adapter) gets a fresh loop there for
the length of its call. The loop's default executor runs
``run_in_executor``/``asyncio.to_thread`` work inline on the same thread, so a
sync function that a framework wraps in ``to_thread`` costs no extra thread
and still sees the call's context variables (:data:`~nous_sched.current_call`).

If the calling thread is already running an event loop (a tool called
directly from async code), the coroutine runs on a named helper thread
instead, since a thread can run only one loop at a time.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import itertools
import threading
from typing import TYPE_CHECKING, Any, Callable, Coroutine

if TYPE_CHECKING:
    import asyncio

__all__ = ["run_coroutine"]

_helper_ids = itertools.count(1)


class _InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs each submitted call immediately, on the submitting thread; it never starts a thread.

    A ``ThreadPoolExecutor`` only because asyncio accepts nothing else as a
    loop's default executor.
    """

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting coroutine, as a thread pool would
            future.set_exception(exc)
        return future


def run_coroutine(make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Return what the coroutine ``make()`` returns, or raise what it raises.

    ``make`` is called on the thread that runs the loop, so the coroutine is
    created where it will be awaited.
    """
    import asyncio  # here: a host without async tools never pays for asyncio's import or teardown

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run_here(make)
    return _run_on_helper(make)


def _run_here(make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    import asyncio

    loop = asyncio.new_event_loop()
    try:
        loop.set_default_executor(_InlineExecutor())
        return loop.run_until_complete(make())
    finally:
        try:
            _cancel_leftovers(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    # What asyncio.run does: tasks the coroutine started and left running are
    # cancelled and awaited, so none outlives the call.
    import asyncio

    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def _run_on_helper(make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    outcome: dict[str, Any] = {}
    context = contextvars.copy_context()

    def work() -> None:
        try:
            outcome["value"] = context.run(_run_here, make)
        except BaseException as exc:  # re-raised on the caller's thread below
            outcome["error"] = exc

    helper = threading.Thread(target=work, name=f"nous-sched-async-{next(_helper_ids)}", daemon=True)
    helper.start()
    helper.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]

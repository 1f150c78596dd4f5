"""Running a blocking call (an engine's close) off the event loop's thread: on a thread of
its own, not the loop's default executor, which an application may have filled or shut."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, Optional


def _settle(fut: "asyncio.Future[None]", exc: Optional[BaseException]) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)


async def run_off_loop(name: str, fn: Callable[..., Any], *args: Any) -> None:
    """Runs ``fn(*args)`` on a new thread and waits for it without blocking the loop; its
    exception is raised here. Cancelling the wait does not stop ``fn``: it runs to its end."""
    loop = asyncio.get_running_loop()
    fut: "asyncio.Future[None]" = loop.create_future()

    def run() -> None:
        err: Optional[BaseException] = None
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            err = e
        try:
            loop.call_soon_threadsafe(_settle, fut, err)
        except RuntimeError:
            pass  # the loop closed meanwhile: nobody waits any more

    threading.Thread(target=run, name=name, daemon=True).start()
    await fut

"""The periodic duties of discovery on the event loop, and how they reach the file system.

The worker's heartbeat and the frontend's file watcher are :class:`PeriodicTask`s; every
file-system call they make goes through :func:`run_off_loop` (a slow volume must not stall the
event loop that serves requests). :func:`notify` is how both watchers (file and etcd) call the
frontend's ``on_add`` / ``on_remove``: an exception in one is logged and the watcher goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from dynamo.runtime.discovery.interface import (
    RecordCallback,
)
from dynamo.runtime.discovery.record import (
    ModelRecord,
)

T = TypeVar("T")

logger = logging.getLogger(__name__)


async def run_off_loop(function: Callable[..., T], *args) -> T:
    """``function(*args)`` in a worker thread, so the event loop keeps serving meanwhile.

    A thread cannot be interrupted, so a cancellation waits for the call to return before it
    propagates: when ``stop()`` of a periodic task returns, nothing it started is still writing
    (the worker removes its record right after stopping its heartbeat; a rename landing after
    that would put the record back).
    """
    call = asyncio.ensure_future(asyncio.to_thread(function, *args))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        while not call.done():
            try:
                await asyncio.wait([call])
            except asyncio.CancelledError:  # a second cancel: still wait, still re-raise
                pass
        raise


class PeriodicTask:
    """Runs ``step`` every ``interval_s`` seconds on the running loop, until :meth:`stop`.

    The one shape of the worker's heartbeat and the frontend's watcher. A step that raises is
    logged with its traceback (once per distinct error while it repeats, then one INFO when a
    step succeeds again) and the next step runs on schedule: a periodic duty that dies silently
    leaves a process that looks healthy and does nothing.
    """

    def __init__(
        self,
        name: str,
        interval_s: float,
        step: Callable[[], Awaitable[None]],
        *,
        delay_first: bool = False,
    ) -> None:
        self.name = name
        self.interval_s = interval_s
        self.step = step
        self.delay_first = delay_first
        self.failures = 0  # steps that raised since the last one that did not
        self._last_error: str | None = None
        self._task: asyncio.Task | None = None

    async def run(self) -> None:
        if self.delay_first:
            await asyncio.sleep(self.interval_s)
        while True:
            try:
                await self.step()
            except Exception as exc:  # noqa: BLE001 - see the class docstring
                self._failed(exc)
            else:
                if self.failures:
                    logger.info(
                        "%s: running again after %d failed step(s)", self.name, self.failures
                    )
                self.failures = 0
                self._last_error = None
            await asyncio.sleep(self.interval_s)

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        error = f"{type(exc).__name__}: {exc}"
        if error != self._last_error:
            self._last_error = error
            logger.error(
                "%s: step failed (%s); retrying every %g s",
                self.name,
                error,
                self.interval_s,
                exc_info=exc,
            )

    def start(self) -> asyncio.Task:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name=self.name)
        return self._task

    async def stop(self) -> None:
        """Cancel the task and wait until it has ended; idempotent."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        # wait() rather than `await task`: a CancelledError here is then ours, never the task's,
        # and stopping never raises what the task raised (shutdown must go on).
        await asyncio.wait([task])
        if not task.cancelled() and task.exception() is not None:
            logger.error("%s ended with an error", self.name, exc_info=task.exception())


async def notify(callback: RecordCallback, record: ModelRecord) -> None:
    """``callback(record)``, awaited if it is a coroutine; an exception is logged, not raised:
    one bad model must not blind the frontend to the rest."""
    try:
        result = callback(record)
        if asyncio.iscoroutine(result):
            await result
    except Exception:
        logger.exception("Discovery callback failed for %s (%s)", record.model, record.endpoint)

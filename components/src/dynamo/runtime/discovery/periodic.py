"""The periodic duties of discovery on the event loop, and how they reach the file system.

The worker's heartbeat and the frontend's file watcher are :class:`PeriodicTask`s; every
file-system call they make goes through :func:`run_off_loop` (a slow volume must not stall the
event loop that serves requests). :func:`notify` is how both watchers (file and etcd) call the
frontend's ``on_add`` / ``on_remove``: an exception in one is logged and the watcher goes on.

A file-system call can hang for good (a hard-mounted NFS server gone, a FUSE daemon stopped).
A thread cannot be interrupted, so such a call is left behind rather than waited for: it runs in
a daemon thread (which neither shutdown nor the interpreter's exit waits for), a periodic task
whose step is stuck says so (:attr:`PeriodicTask.stuck_for_s`, which the file watcher turns
into its ``degraded`` state), and :meth:`PeriodicTask.stop` returns within
:data:`STOP_BOUND_S` whatever the thread does.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from dynamo.runtime.discovery.interface import (
    RecordCallback,
)
from dynamo.runtime.discovery.record import (
    ModelRecord,
)
from dynamo.runtime.log_budget import CauseBudgets
from dynamo.runtime.peer_text import escape

T = TypeVar("T")

# How long stopping a periodic task waits for a step in a file-system call to return.
STOP_BOUND_S = 5.0

logger = logging.getLogger(__name__)
# A callback's failure, per callback and exception type, a minute: whatever a record makes fail,
# it fails at every poll that brings it (and records are a peer's to multiply).
_callback_failures = CauseBudgets(logger, logging.ERROR, lines=1, interval_s=60.0)


async def run_off_loop(function: Callable[..., T], *args: object) -> T:
    """``function(*args)`` in a daemon thread, so the event loop keeps serving meanwhile.

    A cancellation waits for the call to return before it propagates, so that when a task's
    step has been cancelled, nothing it started is still writing (the worker removes its record
    right after stopping its heartbeat; a rename landing after that would put the record back).
    :meth:`PeriodicTask.stop` bounds that wait, and a second cancellation ends it: a call stuck
    for good is left to its thread.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]  # T when there is no error

    def call() -> None:
        try:
            result, error = function(*args), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task, whatever it is
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            pass  # the loop is closed: nobody waits for this any more

    # A daemon thread per call (a few a second at most): unlike the default executor's, a thread
    # stuck in the kernel holds up neither asyncio.run()'s shutdown nor the interpreter's exit.
    threading.Thread(target=call, name=f"off-loop-{getattr(function, '__name__', 'call')}",
                     daemon=True).start()  # fmt: skip
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        # Wait for the call to return; a second cancellation (the loop shutting down after a
        # bounded stop gave up on it) stops waiting: the thread is left to finish on its own.
        await asyncio.wait([done])
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
        self._step_started: float | None = None  # time.monotonic() while a step runs

    async def run(self) -> None:
        if self.delay_first:
            await asyncio.sleep(self.interval_s)
        while True:
            self._step_started = time.monotonic()
            try:
                await self.step()
            except Exception as exc:  # noqa: BLE001 - see the class docstring
                self._step_started = None
                self._failed(exc)
            else:
                self._step_started = None
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

    @property
    def stuck_for_s(self) -> float:
        """How long the step running now has been running (0 between steps)."""
        started = self._step_started
        return 0.0 if started is None else time.monotonic() - started

    def start(self) -> asyncio.Task:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name=self.name)
        return self._task

    async def stop(self) -> None:
        """Cancel the task and wait until it has ended, at most :data:`STOP_BOUND_S`;
        idempotent."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        # wait() rather than `await task`: a CancelledError here is then ours, never the task's,
        # and stopping never raises what the task raised (shutdown must go on).
        await asyncio.wait([task], timeout=STOP_BOUND_S)
        if not task.done():
            logger.warning(
                "%s did not stop within %g s: a file-system call has been stuck for %.0f s; "
                "it is left to its thread and shutdown goes on",
                self.name,
                STOP_BOUND_S,
                self.stuck_for_s,
            )
            return
        if not task.cancelled() and task.exception() is not None:
            logger.error("%s ended with an error", self.name, exc_info=task.exception())


class PeriodicDuty:
    """Something that runs as a :class:`PeriodicTask` (``self._periodic``): the worker's
    heartbeat, the file watcher. Running, starting and stopping are the task's."""

    _periodic: PeriodicTask

    async def run(self) -> None:
        await self._periodic.run()

    def start(self) -> asyncio.Task:
        return self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()


async def notify(callback: RecordCallback, record: ModelRecord) -> None:
    """``callback(record)``, awaited if it is a coroutine; an exception is logged, not raised:
    one bad model must not blind the frontend to the rest."""
    try:
        result = callback(record)
        if asyncio.iscoroutine(result):
            await result
    except Exception as exc:  # noqa: BLE001 - one bad model must not blind the watcher
        _callback_failures.emit(
            (getattr(callback, "__name__", "callback"), type(exc).__name__),
            "Discovery callback failed for %s (%s)",
            escape(record.model),
            escape(record.endpoint),
            exc_info=exc,
        )

"""One deadline for a listener's drain, and a proper ending for every request it cuts short.

aiohttp's own drain (``AppRunner(shutdown_timeout=T)``) waits up to T for running handlers and
then up to T again after cancelling them, and a stream it cancels ends with a broken chunked
body. So the frontend exited ~61 s after SIGTERM with a 30 s drain, past Kubernetes' grace
period. Here the drain is ours:

1. the listener is closed first (the caller stops its sites);
2. :meth:`RequestDrain.wait` waits for the requests in flight until the one deadline;
3. the requests still running then are cancelled, and each gets an ending: a streaming response
   that started gets its program's final bytes (the frontend: an SSE error event in the OpenAI
   shape and ``data: [DONE]``; the worker's request plane: an in-band error line), then a proper
   end of body; a request whose response had not started is answered 503 instead;
4. only then does the caller clean up the runner, which finds nothing left to wait for.

Writing the ending is bounded by :data:`END_BOUND_S` (a client that reads nothing cannot hold
the exit), so the process exits within the deadline plus a few seconds.

The hooks: :meth:`RequestDrain.install` adds the middleware to the app, and a streaming handler
calls :func:`mark_stream` right after ``response.prepare()``, so the drain knows which response
to end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

logger = logging.getLogger(__name__)

# How long a cut request may take to write its ending (and unwind) after the deadline.
END_BOUND_S = 2.0
_STREAM_KEY = (
    web.RequestKey("dynamo_request_drain_stream", web.StreamResponse)
    if hasattr(web, "RequestKey")  # aiohttp 3.13+; a plain string before
    else "dynamo_request_drain_stream"
)

EndStream = Callable[[web.StreamResponse], Awaitable[None]]
Refuse = Callable[[], web.StreamResponse]


def mark_stream(request: web.Request, response: web.StreamResponse) -> None:
    """Call right after ``response.prepare(request)``: a drain that cuts this request short
    ends this response with the program's final bytes instead of answering 503."""
    request[_STREAM_KEY] = response


def _uncancel(task: asyncio.Task) -> None:
    uncancel = getattr(task, "uncancel", None)  # 3.11+: the cancellation is handled here
    if uncancel is not None:
        uncancel()


class RequestDrain:
    """Tracks an app's requests; at the deadline, cuts the rest short with a proper ending."""

    def __init__(self, *, what: str, end_stream: EndStream, refuse: Refuse) -> None:
        self.what = what
        self._end_stream = end_stream
        self._refuse = refuse
        self._tasks: set[asyncio.Task] = set()
        self._cut: set[asyncio.Task] = set()
        self.deadline: float | None = None  # loop.time() at which requests are cut short

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def install(self, app: web.Application) -> None:
        """Add the middleware (outermost, so a cut request's ending skips no other one)."""

        @web.middleware
        async def drain_middleware(request: web.Request, handler):
            task = asyncio.current_task()
            assert task is not None
            self._tasks.add(task)
            try:
                return await handler(request)
            except asyncio.CancelledError:
                if task not in self._cut:
                    raise  # the client hung up (or aiohttp's own shutdown): not ours to answer
                _uncancel(task)
                return await self._ending(request)
            finally:
                self._tasks.discard(task)

        app.middlewares.insert(0, drain_middleware)

    def start(self, timeout_s: float) -> None:
        """Set the one deadline, ``timeout_s`` from now (a second call keeps the first)."""
        if self.deadline is None:
            self.deadline = asyncio.get_running_loop().time() + max(0.0, timeout_s)

    async def wait(self) -> tuple[int, int]:
        """Wait for the requests in flight until the deadline, then cut the rest short.

        Returns ``(finished, cut)``. Requests that arrive meanwhile (on a connection that was
        already open) are waited for too, under the same deadline.
        """
        loop = asyncio.get_running_loop()
        self.start(0.0)  # never started: nothing admitted is waited for
        assert self.deadline is not None
        finished = 0
        while True:
            pending = set(self._tasks)
            remaining = self.deadline - loop.time()
            if not pending or remaining <= 0:
                break
            done, _ = await asyncio.wait(pending, timeout=remaining)
            finished += len(done)
        if pending:
            self._cut.update(pending)
            for task in pending:
                task.cancel()
            # Each writes its ending within END_BOUND_S; one that still hangs is left to the
            # runner's cleanup, which aborts its connection.
            await asyncio.wait(pending, timeout=END_BOUND_S + 0.5)
        return finished, len(pending)

    async def _ending(self, request: web.Request) -> web.StreamResponse:
        response = request.get(_STREAM_KEY)
        if response is None or not response.prepared:
            return self._refuse()
        try:
            await asyncio.wait_for(self._end_stream(response), END_BOUND_S)
        except (asyncio.TimeoutError, ConnectionError, RuntimeError) as exc:
            # A client that reads nothing, or is gone, or a response already ended.
            logger.debug("%s: could not end a stream cut short by the drain: %r", self.what, exc)
        return response

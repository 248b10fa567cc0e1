"""A hostile worker: a small aiohttp server on 127.0.0.1 whose ``POST /generate`` answers exactly
what a test says (any status, headers and bytes, a stream that never ends, silence), and whose
``GET /health`` answers 200 unless told otherwise. It counts what it was asked and whether the
frontend hung up, so a test can check that the frontend stopped reading.

An answer is an async callable taking the :class:`aiohttp.web.Request` and the
:class:`HostileWorker` (for its counters) and returning the response it wrote; :func:`raw`,
:func:`endless` and :func:`silent` make the usual ones.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping

from aiohttp import web
from aiohttp.test_utils import TestServer

Answer = Callable[[web.Request, "HostileWorker"], Awaitable[web.StreamResponse]]


class HostileWorker:
    """The server's endpoint and counters (see the module docstring)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.endpoint = ""
        self.requests = 0  # POST /generate received
        self.health_probes = 0  # GET /health received
        self.hung_up = 0  # answers cut short by the frontend closing the connection
        self.bytes_sent = 0  # what answers wrote, as far as the socket took it
        self.health_status = 200
        # GET /health's answer when set (else JSON with health_status).
        self.health_answer: Answer | None = None
        self.cookies: list[str] = []  # the Cookie headers of every request received

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        self.cookies += request.headers.getall("Cookie", [])
        try:
            return await self.answer(request, self)
        except (ConnectionResetError, asyncio.CancelledError):
            self.hung_up += 1
            raise

    async def _health(self, request: web.Request) -> web.Response:
        self.health_probes += 1
        self.cookies += request.headers.getall("Cookie", [])
        if self.health_answer is not None:
            return await self.health_answer(request, self)  # type: ignore[return-value]
        return web.json_response({"status": "ok"}, status=self.health_status)

    async def write(self, response: web.StreamResponse, data: bytes) -> None:
        await response.write(data)
        self.bytes_sent += len(data)


@contextlib.asynccontextmanager
async def hostile_worker(answer: Answer, *, host: str = "127.0.0.1"):
    """A :class:`HostileWorker` serving ``answer`` on 127.0.0.1 (an ephemeral port); its
    endpoint names the address as ``host`` (``localhost``: a host name, as a record may)."""
    worker = HostileWorker(answer)
    app = web.Application()
    app.router.add_post("/generate", worker._generate)
    app.router.add_get("/health", worker._health)
    # handler_cancellation: an answer that waits (``hold``) ends when the frontend hangs up.
    async with TestServer(app, host="127.0.0.1", handler_cancellation=True) as server:
        worker.endpoint = f"http://{host}:{server.port}"
        yield worker


def raw(
    parts: Iterable[bytes],
    *,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
    hold: bool = False,
) -> Answer:
    """Answer ``status`` with ``headers`` and the bytes of ``parts`` as sent (chunked), then end
    the answer, or (``hold``) keep the connection open, silent, until the frontend hangs up."""
    chunks = list(parts)

    async def answer(request: web.Request, worker: HostileWorker) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(
            status=status, headers={"Content-Type": "application/x-ndjson", **(headers or {})}
        )
        await response.prepare(request)
        for chunk in chunks:
            await worker.write(response, chunk)
        if hold:
            await asyncio.Event().wait()  # until the frontend closes (the handler is cancelled)
        await response.write_eof()
        return response

    return answer


def endless(first: Iterable[bytes], item: bytes) -> Answer:
    """Send ``first``, then ``item`` over and over until the frontend hangs up (a worker that
    ignores every limit of the request)."""
    opening = list(first)

    async def answer(request: web.Request, worker: HostileWorker) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        for chunk in opening:
            await worker.write(response, chunk)
        while True:
            await worker.write(response, item)
            await asyncio.sleep(0)

    return answer


def silent() -> Answer:
    """Accept the request and never answer (a worker stuck before its first item)."""
    return raw([], hold=True)

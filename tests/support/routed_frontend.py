"""The frontend's real service, registry and router in front of hostile workers, and dead
instances to route past (issue 19's and 29's worker tests): what
tests/unit/test_frontend_worker_answers.py and test_frontend_dead_instances.py share."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket

from aiohttp.test_utils import TestClient

from dynamo.frontend.processors.chat_processor import build_chat_processor
from dynamo.frontend.routing.model_registry import ModelRegistry
from dynamo.frontend.routing.worker_router import WorkerRouter, create_worker_session
from dynamo.frontend.serving.http_service import FrontendService
from tests.support.answers import sse_events
from tests.support.frontend_fakes import MODEL, FrontendTestServer, record

DEADLINE_S = 60.0
LINE_LIMIT = 4096  # "no log line over a few KB"


@contextlib.asynccontextmanager
async def frontend(card, *endpoints: str, clock=None, others=()):
    """The real service serving ``card`` through ``endpoints`` (one instance each, repeats
    allowed), and each ``(card, endpoint)`` of ``others``, its router on ``clock``:
    ``(client, router)``."""
    registry = ModelRegistry(build_chat_processor)
    for model_card, endpoint in [(card, endpoint) for endpoint in endpoints] + list(others):
        registry.add_instance(record(model_card, endpoint, model_card.served_model_name))
    await registry.wait_idle()
    session = create_worker_session()
    router = WorkerRouter(session, **({"clock": clock} if clock else {}))
    try:
        app = FrontendService(registry, router).build_app()
        async with TestClient(FrontendTestServer(app, host="127.0.0.1")) as client:
            yield client, router
    finally:
        await router.aclose()
        await session.close()
        await registry.aclose()


# Bound, never listening: connections are refused (kept bound so no one else gets the port).
_DEAD_PORTS: list[socket.socket] = []


def dead_endpoint() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _DEAD_PORTS.append(sock)
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


@contextlib.contextmanager
def dead_endpoints(count: int):
    """``count`` endpoints at distinct addresses whose connections are refused (bound, never
    listening), released when the block ends."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sockets.append(sock)
            sock.bind(("127.0.0.1", 0))
        yield [f"http://127.0.0.1:{sock.getsockname()[1]}" for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def run(scenario):
    return asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S))


def chat(*, stream: bool = False, max_tokens: int = 8, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream,
            "max_tokens": max_tokens, **extra}  # fmt: skip


def line(item: object) -> bytes:
    return json.dumps(item).encode() + b"\n"


async def answer_of(client, body: dict):
    """(status, JSON body or the stream's events) of one request."""
    response = await client.post("/v1/chat/completions", json=body)
    if body.get("stream") and response.status == 200:
        return response.status, await sse_events(response)
    return response.status, await response.json()


def frontend_lines(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("dynamo.") and r.levelno >= logging.INFO
    ]


class HangingConnections:
    """What a :func:`hanging_endpoint` was asked: connections accepted, and the most open at
    once (a connection is open until the client closes it)."""

    def __init__(self) -> None:
        self.accepted = 0
        self.open = 0
        self.most_open = 0


@contextlib.asynccontextmanager
async def hanging_endpoint(seen: HangingConnections | None = None):
    """A real socket on 127.0.0.1 that accepts every connection and never answers (what a dead
    pod's address often does): ``(endpoint, HangingConnections)`` (``seen``, when given: one
    count for several of them)."""
    seen = seen or HangingConnections()
    writers: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        seen.accepted += 1
        seen.open += 1
        seen.most_open = max(seen.most_open, seen.open)
        try:
            while await reader.read(65536):  # read what the client sends, answer nothing
                pass
        except ConnectionError:
            pass
        finally:
            seen.open -= 1

    server = await asyncio.start_server(hold, "127.0.0.1", 0, backlog=1024)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", seen
    finally:
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def hanging_endpoints(count: int):
    """``count`` :func:`hanging_endpoint` at distinct addresses, counted together:
    ``(endpoints, HangingConnections)``."""
    seen = HangingConnections()
    async with contextlib.AsyncExitStack() as stack:
        endpoints = [
            (await stack.enter_async_context(hanging_endpoint(seen)))[0] for _ in range(count)
        ]
        yield endpoints, seen

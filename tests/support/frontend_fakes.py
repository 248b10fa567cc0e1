"""An in-process frontend (the real HTTP service, registry and tiny-model processor) in front of
request-plane servers speaking wire format v2. Its answers are read with tests/support/answers.py.

The worker side here is a small v2 echo engine written for these tests: it answers
``POST /generate`` with ``{"request_id", "model", "token_ids", "sampling"}`` by streaming ids
back as NDJSON, honouring ``max_tokens``, ``stop_token_ids`` and ``ignore_eos`` like the mock
engine and vLLM, and recording every body it got, so a test can check exactly what the
frontend sent. The tokenizer, template, HTTP service and request-plane client are the real ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.web_runner import BaseRunner

from dynamo.frontend.processors.chat_processor import build_chat_processor
from dynamo.frontend.routing.model_registry import ModelRegistry
from dynamo.frontend.routing.worker_router import WorkerRouter, create_worker_session
from dynamo.frontend.serving.http_service import FrontendService
from dynamo.frontend.serving.http_surface import http_runner
from dynamo.runtime.discovery import ModelRecord
from dynamo.runtime.model_card import ModelCard
from dynamo.runtime.request_plane import BadGenerateRequest
from dynamo.runtime.sampling import SamplingOptions
from dynamo.vllm.request_plane_server import add_request_plane_routes

MODEL = "tiny"


def echo_logprobs(token_id: int, alternatives: int) -> list[list[float]]:
    """The echo engine's logprobs of one token: the token at -0.25, then ``alternatives``
    others (the ids after it) at -1, -2, ..."""
    return [[token_id, -0.25]] + [[token_id + 1 + i, -1.0 - i] for i in range(alternatives)]


class EchoEngine:
    """Streams ``output`` (default: the prompt's ids, over and over) ``chunk`` ids per item."""

    def __init__(
        self, *, output: Sequence[int] | None = None, chunk: int = 1, token_ms: float = 0.0
    ) -> None:
        self.output = None if output is None else list(output)
        self.chunk = chunk
        self.token_s = token_ms / 1000.0
        self.bodies: list[dict] = []
        self.requests_started = 0
        self.requests_finished = 0
        self.requests_aborted = 0

    async def generate(self, body: dict) -> AsyncGenerator[dict, None]:
        assert set(body) == {"request_id", "model", "token_ids", "sampling"}, body
        sampling = SamplingOptions.model_validate(body["sampling"])
        self.bodies.append(body)
        self.requests_started += 1
        prompt = body["token_ids"]
        source = self.output if self.output is not None else prompt
        produced: list[int] = []
        finish = "length"
        try:
            while len(produced) < sampling.max_tokens and finish == "length":
                step: list[int] = []
                while len(step) < self.chunk and len(produced) < sampling.max_tokens:
                    token = source[len(produced) % len(source)]
                    produced.append(token)
                    step.append(token)
                    if token in sampling.stop_token_ids and not sampling.ignore_eos:
                        finish = "stop"  # EOS: returned (and counted), as vLLM does
                        break
                if self.token_s:
                    await asyncio.sleep(self.token_s)  # the engine's simulated compute
                item: dict[str, Any] = {"token_ids": step}
                if sampling.logprobs is not None:
                    item["logprobs"] = [echo_logprobs(t, sampling.logprobs) for t in step]
                if sampling.prompt_logprobs is not None and len(produced) == len(step):
                    k = sampling.prompt_logprobs  # the first item's: null for the first id
                    item["prompt_logprobs"] = [None] + [echo_logprobs(t, k) for t in prompt[1:]]
                    item["prompt_ranks"] = [None] + [1] * (len(prompt) - 1)  # -0.25: the top
                yield item
        except (GeneratorExit, asyncio.CancelledError):
            self.requests_aborted += 1
            raise
        self.requests_finished += 1
        yield {
            "finish_reason": finish,
            "prompt_tokens": len(prompt),
            "completion_tokens": len(produced),
        }


@contextlib.asynccontextmanager
async def request_plane_server(generate: Callable[[dict], AsyncGenerator[dict, None]]):
    """``POST /generate`` streaming NDJSON from ``generate`` (errors in-band, as the worker)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        async with contextlib.aclosing(generate(body)) as stream:
            try:
                async for item in stream:
                    await response.write(json.dumps(item).encode() + b"\n")
            except (asyncio.CancelledError, ConnectionResetError):
                raise
            except Exception as exc:  # noqa: BLE001 - in-band, as the real worker does
                await response.write(json.dumps({"error": str(exc)}).encode() + b"\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/generate", handle)
    async with TestServer(app, host="127.0.0.1") as server:
        yield f"http://127.0.0.1:{server.port}"


@contextlib.asynccontextmanager
async def echo_worker(**engine_args):
    engine = EchoEngine(**engine_args)
    async with request_plane_server(engine.generate) as endpoint:
        yield engine, endpoint


def record(card: ModelCard | None, endpoint: str, model: str = MODEL) -> ModelRecord:
    return ModelRecord(model=model, endpoint=endpoint, card=card)


class FrontendTestServer(TestServer):
    """aiohttp's test server behind the frontend's own listener (its bounds, its error shapes,
    no request decompression), as the process runs it."""

    async def _make_runner(self, **kwargs: Any) -> BaseRunner:
        return http_runner(self.app, **kwargs)


@contextlib.asynccontextmanager
async def frontend(
    card: ModelCard,
    *endpoints: str,
    pool=None,
    registry=None,
    request_metrics=None,
    strict_request_fields=False,
    template_sandbox=None,
):
    """The real service with ``card``'s model served by ``endpoints`` (processor built);
    ``request_metrics``: the service's dynamo_frontend_* metrics, for a test to read;
    ``template_sandbox``: where templates render (None: on the service's threads). The client's
    ``service`` is the FrontendService."""
    registry = registry or ModelRegistry(build_chat_processor)
    for endpoint in endpoints:
        registry.add_instance(record(card, endpoint, card.served_model_name))
    await registry.wait_idle()
    session = create_worker_session()
    try:
        service = FrontendService(
            registry,
            WorkerRouter(session),
            pool,
            request_metrics,
            strict_request_fields=strict_request_fields,
            template_sandbox=template_sandbox,
        )
        async with TestClient(FrontendTestServer(service.build_app(), host="127.0.0.1")) as client:
            client.service = service  # type: ignore[attr-defined]
            yield client
    finally:
        await session.close()
        await registry.aclose()


@contextlib.asynccontextmanager
async def refusing_worker(field: str, message: str):
    """The worker's real request-plane routes in front of an engine that refuses every prompt
    before its first item, as vLLM's own checks do (BadGenerateRequest naming ``field``)."""
    calls = []

    async def generate(request):
        calls.append(request)
        raise BadGenerateRequest(message, field=field)
        yield  # pragma: no cover - an async generator that refuses before its first item

    app = web.Application()
    add_request_plane_routes(app, generate, lambda: True, served_model_name=MODEL)
    async with TestServer(app, host="127.0.0.1") as server:
        yield f"http://127.0.0.1:{server.port}", calls

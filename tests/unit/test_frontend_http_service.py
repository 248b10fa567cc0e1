"""The frontend's HTTP service on aiohttp's test client, routing to real request-plane servers.

Workers are the real request plane (``add_request_plane_routes``) around B's real mock engine;
only the mid-stream crash uses a hand-written generator, since a crash cannot be asked of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from dynamo.common import lifecycle
from dynamo.frontend.chat_processor import build_chat_processor
from dynamo.frontend.chat_template import ChatMessage
from dynamo.frontend.http_service import FrontendService
from dynamo.frontend.model_registry import ModelRegistry
from dynamo.frontend.worker_router import WorkerRouter, create_worker_session
from dynamo.runtime.discovery import ModelRecord
from dynamo.runtime.request_plane import add_request_plane_routes
from dynamo.runtime.sampling import SamplingOptions
from dynamo.vllm.mock_engine import MockEngine, mock_completion
from dynamo.vllm.mock_model import load_mock_model
from tests.integration.harness import tiny_tokenizer_dir

MODEL = "unit-model"
HELLO = [{"role": "user", "content": "héllo"}]


def expected_content(messages: list[dict], max_tokens: int) -> str:
    processor = build_chat_processor(MODEL)
    prompt = processor.render([ChatMessage(m["role"], m["content"]) for m in messages])
    token_ids, _ = mock_completion(
        mock_model(), processor.encode(prompt), SamplingOptions(max_tokens=max_tokens)
    )
    return processor.tokenizer.decode(token_ids)


def mock_model():
    return load_mock_model(tiny_tokenizer_dir(), served_model_name=MODEL)


@contextlib.asynccontextmanager
async def request_plane_server(generate, served_model_name: str = MODEL):
    app = web.Application()
    add_request_plane_routes(app, generate, lambda: True, served_model_name=served_model_name)
    async with TestServer(app, host="127.0.0.1") as server:
        yield f"http://127.0.0.1:{server.port}"


@contextlib.asynccontextmanager
async def mock_worker(token_ms: float = 0.0):
    engine = MockEngine(mock_model(), token_ms=token_ms)
    await engine.start()
    async with request_plane_server(engine.generate) as endpoint:
        yield engine, endpoint


def dead_endpoint() -> str:
    """A loopback port nobody listens on (bound, then closed): connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@contextlib.asynccontextmanager
async def frontend(*endpoints: str, model: str = MODEL):
    registry = ModelRegistry(build_chat_processor)
    for endpoint in endpoints:
        registry.add_instance(ModelRecord(model=model, endpoint=endpoint))
    session = create_worker_session()
    try:
        app = FrontendService(registry, WorkerRouter(session)).build_app()
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            yield client
    finally:
        await session.close()


def chat(max_tokens: int = 12, stream: bool = False, **extra) -> dict:
    return {"model": MODEL, "messages": HELLO, "max_tokens": max_tokens, "stream": stream, **extra}


async def sse_events(response) -> list:
    events = []
    async for line in response.content:
        line = line.decode().strip()
        if not line:
            continue
        assert line.startswith("data: ")
        payload = line[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def assert_openai_error(body: dict, *, param=None) -> dict:
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


BAD_BODIES = [
    (b"{not json", None),
    (b"\xff\xfe", None),
    (b"[1, 2]", None),
    (json.dumps({"messages": HELLO}).encode(), "model"),
    (json.dumps({"model": "", "messages": HELLO}).encode(), "model"),
    (json.dumps({"model": MODEL}).encode(), "messages"),
    (json.dumps({"model": MODEL, "messages": []}).encode(), "messages"),
    (json.dumps({"model": MODEL, "messages": "hi"}).encode(), "messages"),
    (json.dumps({"model": MODEL, "messages": ["hi"]}).encode(), "messages[0]"),
    (json.dumps({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}).encode(),
     "messages[0].role"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": 5}]}).encode(),
     "messages[0].content"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image"}]}]})
     .encode(), "messages[0].content"),
    (json.dumps(chat(max_tokens=0)).encode(), "max_tokens"),
    (json.dumps(chat(max_tokens=-3)).encode(), "max_tokens"),
    (json.dumps(chat(max_tokens="5")).encode(), "max_tokens"),
    (json.dumps(chat(max_tokens=1.5)).encode(), "max_tokens"),
    (json.dumps(chat(max_tokens=True)).encode(), "max_tokens"),
    (json.dumps(chat(max_completion_tokens=10**9)).encode(), "max_completion_tokens"),
    (json.dumps(chat(stream="yes")).encode(), "stream"),
    (json.dumps(chat(n=2)).encode(), "n"),
    (json.dumps(chat(stream_options={"include_usage": "y"})).encode(), "stream_options"),
]  # fmt: skip


@pytest.mark.parametrize("raw, param", BAD_BODIES)
def test_bad_requests_are_400_in_the_openai_shape_and_reach_no_worker(raw, param):
    async def scenario():
        async with mock_worker() as (engine, endpoint), frontend(endpoint) as client:
            response = await client.post("/v1/chat/completions", data=raw)
            return response.status, await response.json(), engine.requests_started

    status, body, worker_requests = asyncio.run(scenario())
    assert status == 400
    error = assert_openai_error(body, param=param)
    assert error["type"] == "invalid_request_error"
    assert worker_requests == 0


def test_unknown_model_is_404_model_not_found():
    async def scenario():
        async with mock_worker() as (_, endpoint), frontend(endpoint) as client:
            response = await client.post("/v1/chat/completions", json=chat(model="nope"))
            return response.status, await response.json()

    status, body = asyncio.run(scenario())
    assert status == 404
    assert assert_openai_error(body, param="model")["code"] == "model_not_found"


def test_chat_completion_returns_the_engines_tokens():
    async def scenario():
        async with mock_worker() as (_, endpoint), frontend(endpoint) as client:
            response = await client.post("/v1/chat/completions", json=chat(max_tokens=40))
            return response.status, await response.json()

    status, body = asyncio.run(scenario())
    assert status == 200
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    assert body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": expected_content(HELLO, 40)}
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 40
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 40


def test_streaming_sends_chunks_then_done():
    async def scenario():
        async with mock_worker() as (_, endpoint), frontend(endpoint) as client:
            response = await client.post(
                "/v1/chat/completions",
                json=chat(max_tokens=30, stream=True, stream_options={"include_usage": True}),
            )
            return response.status, response.headers["Content-Type"], await sse_events(response)

    status, content_type, events = asyncio.run(scenario())
    assert status == 200 and content_type.startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == expected_content(HELLO, 30)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 30


def test_dead_worker_is_503_fast_in_both_modes():
    async def scenario():
        async with frontend(dead_endpoint()) as client:
            whole = await client.post("/v1/chat/completions", json=chat())
            streamed = await client.post("/v1/chat/completions", json=chat(stream=True))
            return [(r.status, await r.json()) for r in (whole, streamed)]

    for status, body in asyncio.run(scenario()):
        assert status == 503
        error = assert_openai_error(body)
        assert error["code"] == "worker_unavailable" and "reachable" in error["message"]


def test_a_dead_instance_fails_over_to_a_live_one():
    async def scenario():
        async with mock_worker() as (engine, endpoint):
            async with frontend(dead_endpoint(), endpoint) as client:
                statuses = []
                for _ in range(4):  # round-robin puts the dead one first every other time
                    response = await client.post("/v1/chat/completions", json=chat())
                    statuses.append(response.status)
                return statuses, engine.requests_finished

    statuses, finished = asyncio.run(scenario())
    assert statuses == [200] * 4 and finished == 4


async def crashing_engine(request: dict):
    yield {"token_ids": [ord("o"), ord("k")]}
    raise RuntimeError("engine crashed")


def test_worker_failing_mid_stream_ends_the_stream_with_an_error_event():
    async def scenario():
        async with request_plane_server(crashing_engine) as endpoint, frontend(endpoint) as client:
            streamed = await client.post("/v1/chat/completions", json=chat(stream=True))
            events = await sse_events(streamed)
            whole = await client.post("/v1/chat/completions", json=chat())
            return streamed.status, events, whole.status, await whole.json()

    stream_status, events, whole_status, whole_body = asyncio.run(scenario())
    assert stream_status == 200  # headers went out before the crash
    assert events[-1] == "[DONE]"
    assert events[1]["choices"][0]["delta"]["content"] == "ok"
    error = assert_openai_error(events[-2])
    assert error["code"] == "worker_unavailable" and "engine crashed" in error["message"]
    assert whole_status == 503 and "engine crashed" in whole_body["error"]["message"]


def test_client_disconnect_mid_stream_aborts_the_request_in_the_worker():
    async def scenario():
        async with mock_worker(token_ms=5.0) as (engine, endpoint), frontend(endpoint) as client:
            response = await client.post(
                "/v1/chat/completions", json=chat(max_tokens=10_000, stream=True)
            )
            await response.content.readline()  # the stream has started
            response.close()  # the client hangs up

            async def aborted():
                while engine.requests_aborted == 0:
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(aborted(), 30)
            return engine.requests_aborted, engine.requests_finished

    assert asyncio.run(scenario()) == (1, 0)


def test_models_health_and_aiohttp_errors_in_openai_shape():
    async def scenario():
        async with mock_worker() as (_, endpoint), frontend(endpoint) as client:
            models = await (await client.get("/v1/models")).json()
            starting = await client.get("/health")
            lifecycle.mark_serving("test")
            serving = await client.get("/health")
            wrong_method = await client.get("/v1/chat/completions")
            unknown = await client.get("/v2/nothing")
            lifecycle.mark_draining("test")
            draining = await client.post("/v1/chat/completions", json=chat())
            return (
                models,
                starting.status,
                (serving.status, await serving.json()),
                (wrong_method.status, await wrong_method.json()),
                (unknown.status, await unknown.json()),
                (draining.status, await draining.json()),
            )

    models, starting, serving, wrong_method, unknown, draining = asyncio.run(scenario())
    assert models["object"] == "list"
    assert [(m["id"], m["object"]) for m in models["data"]] == [(MODEL, "model")]
    assert starting == 503
    assert serving == (200, {"status": "ready", "phase": "serving", "models": 1})
    assert wrong_method[0] == 405 and assert_openai_error(wrong_method[1])
    assert unknown[0] == 404 and assert_openai_error(unknown[1])["code"] == "not_found"
    assert draining[0] == 503 and assert_openai_error(draining[1])["code"] == "draining"


def _frontend_lines(caplog) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name.startswith("dynamo.frontend") and r.levelno >= logging.INFO
    ]


def test_each_failed_request_logs_one_warning_naming_every_instance_tried(caplog):
    caplog.set_level(logging.INFO)
    dead = [dead_endpoint(), dead_endpoint()]

    async def scenario():
        async with frontend(*dead) as client:
            caplog.clear()  # the set-up's lines (model added) are not the requests'
            for stream in (False, True, False):
                response = await client.post("/v1/chat/completions", json=chat(stream=stream))
                assert response.status == 503

    asyncio.run(scenario())
    lines = _frontend_lines(caplog)
    assert len(lines) == 3, [r.getMessage() for r in lines]  # one per request, no more
    for line in lines:
        assert line.levelno == logging.WARNING
        message = line.getMessage()
        assert "POST /v1/chat/completions -> 503 worker_unavailable" in message
        assert all(endpoint in message for endpoint in dead)  # the log names both instances


def test_a_worker_failing_mid_request_logs_one_line(caplog):
    caplog.set_level(logging.INFO)

    async def scenario():
        async with request_plane_server(crashing_engine) as endpoint, frontend(endpoint) as client:
            caplog.clear()
            whole = await client.post("/v1/chat/completions", json=chat())
            streamed = await client.post("/v1/chat/completions", json=chat(stream=True))
            await sse_events(streamed)
            return whole.status

    assert asyncio.run(scenario()) == 503
    lines = [r.getMessage() for r in _frontend_lines(caplog)]
    assert len(lines) == 2, lines  # the whole one (middleware), the streamed one (in-band)
    assert sum("-> 503 worker_unavailable" in line for line in lines) == 1
    assert sum("failed mid-stream" in line for line in lines) == 1


def test_a_failover_that_succeeds_logs_the_dead_instance_once(caplog):
    caplog.set_level(logging.INFO)
    dead = dead_endpoint()

    async def scenario():
        async with mock_worker() as (_, endpoint), frontend(dead, endpoint) as client:
            # Round-robin starts at the dead instance for the first request, not the second.
            return [(await client.post("/v1/chat/completions", json=chat())).status
                    for _ in range(2)]  # fmt: skip

    assert asyncio.run(scenario()) == [200, 200]
    lines = [r for r in _frontend_lines(caplog) if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and dead in lines[0].getMessage()
    assert "failed over after 1 unavailable instance(s)" in lines[0].getMessage()

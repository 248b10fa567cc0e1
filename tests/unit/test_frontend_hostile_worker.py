"""A hostile or unlucky worker on the request plane (a small aiohttp server on 127.0.0.1) in front
of the real frontend behind its real listener (FrontendTestServer): what a red-team review of the
request path found (docs/security.md, "Request-plane answers")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from dynamo.frontend.processors.hf_processor import ModelFilesError
from dynamo.frontend.routing import worker_router
from tests.support import wait_until_async
from tests.support.frontend_fakes import MODEL, echo_worker, frontend
from tests.support.tiny_model import tiny_card

HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture
def card(tiny_tokenizer_dir):
    return tiny_card(tiny_tokenizer_dir, MODEL)


def run(scenario):
    return asyncio.run(scenario())


@contextlib.asynccontextmanager
async def hostile_worker(generate, health=None):
    async def default_health(request):
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health or default_health)
    async with TestServer(app, host="127.0.0.1") as server:
        yield f"http://127.0.0.1:{server.port}"


# --- 1. a deadline a worker can extend for as long as it likes --------------------------------


def _dribbling(byte: bytes, *, status: int = 200, headers=None, last: bytes = b""):
    """A worker answering ``status``, then ``byte`` every 0.2 s for 8 s (never an item, never
    silent on the socket), then ``last``."""

    async def answer(request):
        await request.read()
        response = web.StreamResponse(
            status=status, headers=headers or {"Content-Type": "application/x-ndjson"}
        )
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            for _ in range(40):
                await response.write(byte)
                await asyncio.sleep(0.2)  # the dribble itself: what is under test
            await response.write(last)
        return response

    return answer


# Blank lines, then a finish line; a line that never ends; a 500 whose 4 KiB error body comes a
# byte at a time.
_blank_lines = _dribbling(
    b"\n", last=b'{"finish_reason":"stop","prompt_tokens":1,"completion_tokens":0}\n'
)
_long_line_dribble = _dribbling(b" ")
_error_body_dribble = _dribbling(b"x", status=500, headers={"Content-Length": "4096"})


@pytest.mark.parametrize("answer", [_blank_lines, _long_line_dribble, _error_body_dribble])
def test_a_worker_that_dribbles_bytes_gets_a_503_within_the_item_deadline(
    card, monkeypatch, answer
):
    """Every read of an answer is bounded in time (docs/security.md): an item must come within
    WORKER_READ_TIMEOUT_S, whatever else the worker sends meanwhile (bytes that are no item,
    answered health probes). Scaled down (1 s, probes after 0.3 s), a worker sending a byte
    every 0.2 s for 8 s and never an item costs the client ~1 s and a 503."""
    monkeypatch.setattr(worker_router, "WORKER_READ_TIMEOUT_S", 1.0)
    monkeypatch.setattr(worker_router, "PROBE_AFTER_S", 0.3)
    monkeypatch.setattr(worker_router, "PROBE_TIMEOUT_S", 0.3)

    async def scenario():
        async with hostile_worker(answer) as endpoint, frontend(card, endpoint) as client:
            started = time.monotonic()
            response = await client.post(
                "/v1/chat/completions", json={"model": MODEL, "messages": HELLO, "max_tokens": 4}
            )
            await response.read()
            return response.status, time.monotonic() - started

    status, elapsed = run(scenario)
    assert elapsed < 4.0, f"answered {status} after {elapsed:.1f} s of no item from the worker"
    assert status == 503


# --- 2. a 400 error body nested deeply: a 500 and a traceback per request ----------------------


async def _deeply_nested_400(request):
    await request.read()
    return web.Response(status=400, body=b"[" * 4000, content_type="application/json")


def test_a_deeply_nested_400_body_is_a_503_not_a_500_with_a_traceback(card, caplog):
    """A 400's body is decoded to find the field a worker refused; 4000 '[' are too deep for the
    JSON decoder (RecursionError), which must be a worker failure (503, failover), not a 500
    with a traceback per request."""

    async def scenario():
        async with (
            hostile_worker(_deeply_nested_400) as endpoint,
            frontend(card, endpoint) as client,
        ):
            statuses = []
            for _ in range(3):
                response = await client.post(
                    "/v1/chat/completions",
                    json={"model": MODEL, "messages": HELLO, "max_tokens": 4},
                )
                await response.read()
                statuses.append(response.status)
            return statuses

    with caplog.at_level(logging.INFO):
        statuses = run(scenario)
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert statuses == [503, 503, 503], statuses
    assert not tracebacks, [r.getMessage() for r in tracebacks]


# --- 3. a stop string ends a completion before min_tokens are out -------------------------------


def test_a_stop_string_does_not_end_the_completion_before_min_tokens(card):
    """vLLM matches stop strings only in text generated once min_tokens are out (v1's
    detokenizer, vllm PR 22014: min_tokens=5, stop="e" -> " is Lee, and I'm a stud"); the
    frontend, authoritative for stop strings, must not cut a completion shorter."""
    from dynamo.frontend.processors.chat_processor import build_chat_processor

    processor = build_chat_processor(card)
    ids = processor.tokenizer.encode(
        "hello world hello world hello world", add_special_tokens=False
    )

    async def scenario():
        async with (
            echo_worker(output=ids) as (engine, endpoint),
            frontend(card, endpoint) as client,
        ):
            response = await client.post(
                "/v1/completions",
                json={
                    "model": MODEL, "prompt": "hi", "max_tokens": len(ids), "min_tokens": len(ids),
                    "stop": ["world"], "ignore_eos": True,
                },
            )  # fmt: skip
            return response.status, await response.json()

    status, body = run(scenario)
    assert status == 200, body
    assert body["usage"]["completion_tokens"] >= len(ids), body


# --- 4. concurrent failures of one hiccup bench an instance for 30 s, not 1 s -------------------


def test_one_hiccup_under_concurrency_benches_an_instance_for_one_second(card):
    """An instance is benched for 1 s, doubling at each *new* failure (docs/security.md): six
    requests in flight when a worker hiccups are one failure, not six (which benched a model's
    only instance for 30 s). The 1.5 s wait is the bench's own time passing, not a sync."""
    failures_left = {"n": 6}
    arrived = asyncio.Event()
    seen = {"n": 0}

    async def hiccup(request):
        await request.read()
        if failures_left["n"] > 0:
            failures_left["n"] -= 1
            seen["n"] += 1
            if seen["n"] == 6:
                arrived.set()
            await arrived.wait()  # the six are in flight together
            return web.json_response({"error": "engine restarting"}, status=500)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        await response.write(b'{"token_ids":[5]}\n')
        await response.write(
            b'{"finish_reason":"length","prompt_tokens":1,"completion_tokens":1}\n'
        )
        return response

    body = {"model": MODEL, "messages": HELLO, "max_tokens": 1}

    async def scenario():
        async with hostile_worker(hiccup) as endpoint, frontend(card, endpoint) as client:

            async def one():
                response = await client.post("/v1/chat/completions", json=body)
                await response.read()
                return response.status

            burst = await asyncio.gather(*(one() for _ in range(6)))
            await asyncio.sleep(1.5)  # the 1 s bench is over; the worker answers again
            return burst, await one()

    burst, after = run(scenario)
    assert burst == [503] * 6
    assert after == 200, f"still {after} 1.5 s after a single hiccup"


# --- what a client is told, and what a flood of clients costs the log ------------------------


class _BrokenPool:
    """A preprocess pool whose worker cannot load the tokenizer, worded as hf_processor words it."""

    healthy = True
    state = "ready"
    workers = 2

    async def encode(self, card, prompt, *, add_special_tokens):
        raise ModelFilesError(
            "cannot load /srv/models/tiny/tokenizer.json: Exception: expected value at line 1 "
            "column 1"
        )


def test_a_preprocess_failure_names_no_host_path_or_library_text(card, caplog):
    """A client is told the preprocessing is unavailable (503), no more: the path on this host
    and the tokenizers library's words are the log's (docs/security.md)."""

    async def scenario():
        async with frontend(card, "http://127.0.0.1:9", pool=_BrokenPool()) as client:
            response = await client.post(
                "/v1/chat/completions", json={"model": MODEL, "messages": HELLO, "max_tokens": 4}
            )
            return response.status, await response.json()

    with caplog.at_level(logging.WARNING):
        status, body = run(scenario)
    assert status == 503 and body["error"]["code"] == "preprocess_unavailable", body
    message = body["error"]["message"]
    assert "/srv/models" not in message and "expected value" not in message, message
    assert any("/srv/models/tiny/tokenizer.json" in r.getMessage() for r in caplog.records)


def test_clients_hanging_up_mid_stream_cannot_flood_the_log(card, caplog):
    """One INFO line per cause per interval, however many clients hang up mid-stream (a flood
    of bad clients cannot flood the log)."""
    hangups = 20

    async def scenario():
        async with (
            echo_worker(token_ms=20) as (engine, endpoint),
            frontend(card, endpoint) as client,
        ):
            for _ in range(hangups):
                response = await client.post(
                    "/v1/chat/completions",
                    json={"model": MODEL, "messages": HELLO, "max_tokens": 200, "stream": True,
                          "ignore_eos": True},
                )  # fmt: skip
                await response.content.readline()
                response.close()  # hang up
            # Each hang-up reaches the worker as an abort once the frontend has noticed it.
            await wait_until_async(
                lambda: engine.requests_aborted >= hangups,
                deadline_s=30,
                what="every hang-up to abort its request",
            )

    with caplog.at_level(logging.INFO, logger="dynamo"):
        run(scenario)
    lines = [r.getMessage() for r in caplog.records if "mid-stream" in r.getMessage()]
    assert 1 <= len(lines) <= 2, f"{len(lines)} lines, e.g. {lines[:2]}"

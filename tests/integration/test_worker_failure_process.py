"""Through the real processes (issue 19, items 3 and 8): a known model whose worker was SIGKILLed
or SIGSTOPped is a generic OpenAI-shaped 503 within a bounded time, never a 404 or a hang; a
hostile worker (a small aiohttp server on 127.0.0.1, registered by a record file this test
writes) cannot forge a frontend log line, write a NUL into it, or reach the client with its
words or its address.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from dynamo.runtime.discovery import ModelRecord
from dynamo.runtime.discovery.file_store import DiscoveryStore
from tests.support import wait_until
from tests.support.answers import assert_openai_error, sse_events
from tests.support.hostile_worker import HostileWorker, hostile_worker, raw
from tests.support.processes import listening_url, start_frontend, start_worker
from tests.support.tiny_model import tiny_card, tiny_tokenizer_dir

pytestmark = pytest.mark.integration

MODEL = "victim"
# What a stopped worker may cost a request: the silence before the health probe (5 s), the
# probe's own deadline (5 s), and a generous margin for a loaded machine.
STOPPED_BOUND_S = 30.0
# A refused connection is a 503 at once; the margin is the machine's load.
DEAD_BOUND_S = 10.0
INTERNALS = ("127.0.0.1", "http://", "ssl:default", "Connect", "Errno", "Traceback")


def _models(url: str) -> str:
    async def get() -> str:
        async with aiohttp.ClientSession() as session, session.get(url + "/v1/models") as r:
            return await r.text()

    return asyncio.run(get())


async def _ask(url: str, *, stream: bool, model: str = MODEL) -> tuple[int, object, float]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "stream": stream}  # fmt: skip
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            if stream and response.status == 200:
                answer: object = await sse_events(response)
            else:
                answer = await response.json()
            return response.status, answer, time.monotonic() - started


def _assert_generic_503(status: int, body, elapsed: float, bound: float) -> None:
    assert status == 503, body
    error = assert_openai_error(body)
    assert error["code"] == "worker_unavailable" and f"`{MODEL}`" in error["message"]
    for internal in INTERNALS:
        assert internal not in error["message"], error
    assert elapsed < bound, elapsed


@pytest.fixture
def pair(tmp_path):
    discovery = tmp_path / "discovery"
    worker = start_worker("worker", tmp_path, discovery, MODEL)
    frontend = start_frontend("frontend", tmp_path, discovery)
    try:
        worker.wait_for_log("Worker serving model")
        url = listening_url(frontend)
        wait_until(lambda: f'"{MODEL}"' in _models(url), deadline_s=60, what="model listed")
        yield worker, frontend, url
    finally:
        worker.signal(signal.SIGCONT)
        frontend.stop()
        worker.stop()


def test_a_sigkilled_worker_is_a_generic_503_at_once_not_a_404(pair):
    worker, frontend, url = pair
    status, _, _ = asyncio.run(_ask(url, stream=False))
    assert status == 200
    worker.signal(signal.SIGKILL)
    worker.wait_exit()

    async def both():
        return [await _ask(url, stream=s) for s in (False, True, False)]

    for status, body, elapsed in asyncio.run(both()):
        _assert_generic_503(status, body, elapsed, DEAD_BOUND_S)
    assert "\x00" not in frontend.log() and "Traceback" not in frontend.log()


def test_a_sigstopped_worker_is_a_generic_503_within_the_probe_deadlines(pair):
    worker, frontend, url = pair
    worker.signal(signal.SIGSTOP)

    async def both():
        return await asyncio.gather(_ask(url, stream=False), _ask(url, stream=True))

    for status, body, elapsed in asyncio.run(both()):
        _assert_generic_503(status, body, elapsed, STOPPED_BOUND_S)
    log = frontend.log()
    assert "health probe unanswered" in log and "Traceback" not in log
    worker.signal(signal.SIGCONT)
    # Back: served again once its bench is over (1 s).
    wait_until(
        lambda: asyncio.run(_ask(url, stream=False))[0] == 200, deadline_s=60, what="recovery"
    )


# --- a hostile worker, registered by a record file ---------------------------------------------

FORGED = "WARNING dynamo.frontend.serving.http_service: forged line"


def _register(discovery: Path, endpoint: str) -> None:
    card = tiny_card(tiny_tokenizer_dir(), MODEL)
    DiscoveryStore(discovery).register(ModelRecord(model=MODEL, endpoint=endpoint, card=card))


async def _mid_stream_forger(request: web.Request, worker: HostileWorker) -> web.StreamResponse:
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    await worker.write(response, b'{"token_ids": [5]}\n')
    await worker.write(response, json.dumps({"error": f"boom\n{FORGED}\x00\x1b[2J"}).encode())
    await response.write_eof()
    return response


@pytest.mark.parametrize(
    "kind",
    ["error body", "error line mid-stream", "garbage stream"],
)
def test_a_hostile_workers_words_are_escaped_in_the_log_and_never_reach_the_client(tmp_path, kind):
    answer = {
        "error body": raw([f"down\r\n{FORGED}\x00 \x1b[31m".encode() + b"x" * 10_000], status=500),
        "error line mid-stream": _mid_stream_forger,
        "garbage stream": raw([f"\n{FORGED}\x00\n".encode()]),
    }[kind]
    discovery = tmp_path / "discovery"

    async def scenario():
        async with hostile_worker(answer) as worker:
            _register(discovery, worker.endpoint)
            frontend = start_frontend("frontend", tmp_path, discovery)
            try:
                url = await asyncio.to_thread(listening_url, frontend)
                await asyncio.to_thread(
                    lambda: wait_until(
                        lambda: f'"{MODEL}"' in _models(url), deadline_s=60, what="model listed"
                    )
                )
                answers = [await _ask(url, stream=s) for s in (False, True)]
            finally:
                await asyncio.to_thread(frontend.stop)
            return answers, frontend.log_bytes()

    answers, log = asyncio.run(scenario())
    for status, body, _ in answers:
        if status == 200:  # streamed: the failure came after the first item
            body = body[-2]
        else:
            assert status in (502, 503), body
        error = assert_openai_error(body)
        assert "forged" not in error["message"] and "boom" not in error["message"]
        for internal in INTERNALS:
            assert internal not in error["message"], error
    assert b"\x00" not in log and b"\x1b" not in log
    lines = log.decode().splitlines()
    assert not any(line.startswith(FORGED) or line.startswith("x" * 100) for line in lines)
    assert any("forged line" in line for line in lines)  # logged, escaped, on a line of its own
    assert max(map(len, lines)) < 4096

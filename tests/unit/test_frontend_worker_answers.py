"""What a hostile worker can make the frontend do (issue 19, items 4, 6, 8): the real HTTP
service, registry, router and tiny-model processor in front of hostile aiohttp servers on
127.0.0.1 (tests/support/hostile_worker.py).

* A bad stream item is a 502 ``bad_worker_response`` (not streaming, or before the first item) or
  an OpenAI error event then ``[DONE]`` (mid-stream); never a 500, never worker text.
* The request's own limits are the frontend's: ``max_tokens``, a stop token once ``min_tokens``
  are out, a stop string, whatever the worker keeps sending; the frontend hangs up on it.
* Routing: a failed instance is benched (1 s doubling to 30 s, forgiven at its first success,
  on a fake clock), a request tries at most three instances, and thousands of dead instances
  cost a bounded number of attempts and log lines per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from dynamo.frontend.processors.chat_processor import build_chat_processor
from dynamo.frontend.routing import worker_router
from dynamo.frontend.routing.model_registry import ModelRegistry
from dynamo.frontend.routing.worker_router import WorkerRouter, create_worker_session
from dynamo.frontend.serving.http_service import FrontendService
from tests.support import wait_until_async
from tests.support.answers import assert_openai_error, sse_events, streamed_text
from tests.support.clock import FakeClock
from tests.support.frontend_fakes import MODEL, FrontendTestServer, record
from tests.support.hostile_worker import HostileWorker, endless, hostile_worker, raw
from tests.support.tiny_model import tiny_card

DEADLINE_S = 60.0
LINE_LIMIT = 4096  # "no log line over a few KB"


@pytest.fixture
def processor(tiny_tokenizer_dir):
    """The tiny model's processor; its card is the one the frontend serves."""
    return build_chat_processor(tiny_card(tiny_tokenizer_dir, MODEL))


@pytest.fixture
def card(processor):
    return processor.card


@contextlib.asynccontextmanager
async def frontend(card, *endpoints: str, clock=None):
    """The real service serving ``card`` through ``endpoints`` (one instance each, repeats
    allowed), its router on ``clock``: ``(client, router)``."""
    registry = ModelRegistry(build_chat_processor)
    for endpoint in endpoints:
        registry.add_instance(record(card, endpoint, card.served_model_name))
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


# --- a bad stream item -------------------------------------------------------------------------

BAD = {
    "id beyond the vocabulary": line({"token_ids": [10**6]}),
    "finish_reason a number": line(
        {"finish_reason": 1, "prompt_tokens": 1, "completion_tokens": 1}
    ),
    "finish_reason unknown": line(
        {"finish_reason": "eos", "prompt_tokens": 1, "completion_tokens": 1}
    ),
    "negative count": line({"finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": -5}),
    "float id": line({"token_ids": [3.0]}),
    "not json": b"<html>502 Bad Gateway</html>\n",
    "oversized line": b'{"token_ids": [' + b"1, " * 24_000 + b"1]}\n",  # 72 KB
    "deep nesting": b"[" * 50_000 + b"\n",
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_first_item_is_a_502_in_the_openai_shape(card, caplog, kind, stream):
    async def scenario():
        async with (
            hostile_worker(raw([BAD[kind]])) as worker,
            frontend(card, worker.endpoint) as (
                client,
                _,
            ),
        ):
            return await answer_of(client, chat(stream=stream))

    status, body = run(scenario)
    assert status == 502, body
    error = assert_openai_error(body)
    assert error["code"] == "bad_worker_response" and error["type"] == "server_error"
    assert "127.0.0.1" not in error["message"] and "token_ids" not in error["message"]
    lines = frontend_lines(caplog)
    assert all(len(text) < LINE_LIMIT and "\n" not in text for text in lines)
    assert not any(r.levelno >= logging.ERROR for r in caplog.records)


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_item_mid_stream_is_an_error_event_then_done(card, processor, kind):
    good = line({"token_ids": processor.encode_chat("ok")})

    async def scenario():
        async with hostile_worker(raw([good, BAD[kind]])) as worker:
            async with frontend(card, worker.endpoint) as (client, _):
                # max_tokens 100: a stream budget (89 KiB) the oversized line fits in
                streamed = await answer_of(client, chat(stream=True, max_tokens=100))
                whole = await answer_of(client, chat(max_tokens=100))
                return streamed, whole

    (stream_status, events), (whole_status, whole) = run(scenario)
    assert stream_status == 200  # the headers went with the first item
    assert streamed_text(events) == "ok" and events[-1] == "[DONE]"
    error = assert_openai_error(events[-2])
    assert error["code"] == "bad_worker_response"
    assert whole_status == 502 and assert_openai_error(whole)["code"] == "bad_worker_response"


def test_what_follows_the_finish_line_is_never_read(card, processor):
    # The finish line ends the completion: the client has its whole answer and the frontend
    # hangs up, whatever the worker sends after it (the request plane's client would call it a
    # protocol error, were it asked for another item).
    ids = processor.encode_chat("ok")
    finish = line({"finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": len(ids)})
    lines = [line({"token_ids": ids}), finish, b"garbage \x00\n", b"\xff" * 10_000]

    async def scenario():
        async with hostile_worker(raw(lines, hold=True)) as worker:
            async with frontend(card, worker.endpoint) as (client, _):
                answers = [await answer_of(client, chat(stream=s)) for s in (False, True)]
                await wait_until_async(lambda: worker.hung_up == 2, deadline_s=DEADLINE_S)
                return answers

    (whole_status, whole), (stream_status, events) = run(scenario)
    assert whole_status == 200 and whole["choices"][0]["message"]["content"] == "ok"
    assert stream_status == 200 and streamed_text(events) == "ok" and events[-1] == "[DONE]"


# --- the request's limits are the frontend's ---------------------------------------------------


@pytest.mark.parametrize("per_item", [1, 7, 100])
@pytest.mark.parametrize("max_tokens", [1, 5, 33])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_max_tokens_is_enforced_against_a_worker_that_never_stops(
    card, processor, per_item, max_tokens, stream
):
    word = processor.encode_chat(" word")[:1]
    item = line({"token_ids": word * per_item})

    async def scenario():
        async with hostile_worker(endless([], item)) as worker:
            async with frontend(card, worker.endpoint) as (client, _):
                body = chat(stream=stream, max_tokens=max_tokens, ignore_eos=True)
                if stream:
                    body["stream_options"] = {"include_usage": True}
                answer = await answer_of(client, body)
                await wait_until_async(lambda: worker.hung_up == 1, deadline_s=DEADLINE_S)
                return answer

    status, answer = run(scenario)
    assert status == 200
    if stream:
        text = streamed_text(answer)
        finish = [e["choices"][0]["finish_reason"] for e in answer if isinstance(e, dict)
                  and e.get("choices") and e["choices"][0].get("finish_reason")]  # fmt: skip
        usage = [e for e in answer if isinstance(e, dict) and e.get("usage")][-1]["usage"]
    else:
        text = answer["choices"][0]["message"]["content"]
        finish = [answer["choices"][0]["finish_reason"]]
        usage = answer["usage"]
    assert text == processor.tokenizer.decode(word * max_tokens)
    assert finish == ["length"]
    assert usage["completion_tokens"] == max_tokens


def test_the_workers_counts_are_not_trusted(card, processor):
    ids = processor.encode_chat(" a b c")
    lie = line({"finish_reason": "length", "prompt_tokens": 2**31 - 1,
                "completion_tokens": 2**31 - 1})  # fmt: skip

    async def scenario():
        async with hostile_worker(raw([line({"token_ids": ids}), lie])) as worker:
            async with frontend(card, worker.endpoint) as (client, _):
                return await answer_of(client, chat(max_tokens=10))

    status, body = run(scenario)
    assert status == 200
    assert body["usage"]["completion_tokens"] == len(ids)
    assert body["usage"]["prompt_tokens"] < 100
    assert body["choices"][0]["finish_reason"] == "length"  # the worker's reason is kept


def test_a_stop_token_ends_the_completion_once_min_tokens_are_out(card, processor):
    eos = card.eos_token_ids[0]

    async def scenario():
        async with hostile_worker(endless([], line({"token_ids": [eos]}))) as worker:
            async with frontend(card, worker.endpoint) as (client, _):
                answer = await answer_of(client, chat(max_tokens=50, min_tokens=3))
                await wait_until_async(lambda: worker.hung_up == 1, deadline_s=DEADLINE_S)
                return answer

    status, body = run(scenario)
    assert status == 200
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 3


def test_a_stop_string_ends_the_completion_whatever_the_worker_sends(card, processor):
    ids = processor.encode_chat(" one two STOP three")

    async def scenario():
        async with hostile_worker(endless([], line({"token_ids": ids}))) as worker:
            async with frontend(card, worker.endpoint) as (client, _):
                answer = await answer_of(client, chat(max_tokens=200, stop=["STOP"]))
                await wait_until_async(lambda: worker.hung_up == 1, deadline_s=DEADLINE_S)
                return answer

    status, body = run(scenario)
    assert status == 200 and body["choices"][0]["finish_reason"] == "stop"
    assert body["choices"][0]["message"]["content"] == " one two "


# --- routing: failure memory, bounded attempts, bounded log ------------------------------------


def toggled(worker_ids: list[int]):
    """An answer that streams a one-token completion while ``up[0]``, else answers 503."""
    up = [False]

    async def answer(request: web.Request, worker: HostileWorker) -> web.StreamResponse:
        await request.read()
        if not up[0]:
            return web.json_response({"error": "down"}, status=503)
        return await raw(
            [line({"token_ids": worker_ids}),
             line({"finish_reason": "length", "prompt_tokens": 1, "completion_tokens": 1})]
        )(request, worker)  # fmt: skip

    return answer, up


def test_a_failed_instance_is_benched_doubling_and_forgiven_at_its_first_success(
    card, processor, caplog
):
    caplog.set_level(logging.INFO)
    clock = FakeClock()
    answer, up = toggled(processor.encode_chat(" x"))

    async def scenario():
        async with hostile_worker(answer) as worker:
            async with frontend(card, worker.endpoint, clock=clock) as (client, _):

                async def attempt(advance: float) -> tuple[int, int]:
                    clock.advance(advance)
                    before = worker.requests
                    status, _ = await answer_of(client, chat(max_tokens=1))
                    return status, worker.requests - before

                plan = [
                    (0, None),  # fails: benched for 1 s
                    (0.5, None),  # benched: 503 without trying
                    (0.6, None),  # tried, fails: 2 s
                    (1.9, None),  # benched
                    (0.2, None),  # tried, fails: 4 s
                    (3.9, None),  # benched
                    (0.2, None),  # tried, fails: 8 s
                    (8.1, None),  # tried, fails: 16 s
                    (16.1, None),  # tried, fails: 30 s (not 32)
                    (29.9, None),  # benched
                    (0.2, None),  # tried, fails: 30 s again, the most
                    (29.9, None),  # benched
                    (0.2, True),  # tried, succeeds: forgiven
                    (0, False),  # fails: benched for 1 s, not 30
                    (0.5, None),  # benched
                    (0.6, None),  # tried after 1 s
                ]
                steps = []
                for advance, state in plan:
                    if state is not None:
                        up[0] = state
                    steps.append(await attempt(advance))
                return steps

    tried = [1, 0, 1, 0, 1, 0, 1, 1, 1, 0, 1, 0, 1, 1, 0, 1]
    assert [n for _, n in run(scenario)] == tried
    lines = frontend_lines(caplog)
    assert sum("answers again" in text for text in lines) == 1
    assert sum("not routed to for 1 s" in text for text in lines) == 2


def test_a_known_model_with_every_instance_benched_is_503_at_once(card):
    async def scenario():
        answer = raw([b'{"error": "down"}'], status=500)
        async with hostile_worker(answer) as worker:
            async with frontend(card, *[worker.endpoint] * 3, clock=FakeClock()) as (client, _):
                first = await answer_of(client, chat())
                tried = worker.requests
                second = await answer_of(client, chat(stream=True))
                return first, tried, second, worker.requests

    (s1, b1), tried, (s2, b2), total = run(scenario)
    assert tried == 3 and total == 3  # three instances tried, then none
    for status, body in ((s1, b1), (s2, b2)):
        assert status == 503
        error = assert_openai_error(body)
        assert error["code"] == "worker_unavailable"
        for internal in ("127.0.0.1", "http://", "ssl:default", "down"):
            assert internal not in error["message"]


@pytest.mark.parametrize("live", [True, False], ids=["one live", "all dead"])
@pytest.mark.parametrize("dead_answer", ["503", "refused", "garbage"])
def test_thousands_of_dead_instances_cost_a_bounded_number_of_attempts_and_lines(
    card, processor, caplog, dead_answer, live
):
    caplog.set_level(logging.INFO)
    instances = 3000
    requests = 25
    finish = line({"finish_reason": "length", "prompt_tokens": 1, "completion_tokens": 1})
    live_answer = raw([line({"token_ids": processor.encode_chat(" y")}), finish])
    dead = {
        "503": raw([b'{"error": "' + b"\n\x00x" * 2000 + b'"}'], status=503),
        "refused": None,
        "garbage": raw([b"\x00\nWARNING forged line " * 1000]),
    }[dead_answer]

    async def scenario():
        async with contextlib.AsyncExitStack() as stack:
            live_worker = await stack.enter_async_context(hostile_worker(live_answer))
            if dead is None:
                dead_url, dead_worker = dead_endpoint(), None
            else:
                dead_worker = await stack.enter_async_context(hostile_worker(dead))
                dead_url = dead_worker.endpoint
            # The live instance first: the first request finds it (round-robin starts there).
            endpoints = [live_worker.endpoint] * live + [dead_url] * instances
            client, _ = await stack.enter_async_context(frontend(card, *endpoints))
            caplog.clear()
            statuses = [(await answer_of(client, chat(max_tokens=1)))[0] for _ in range(requests)]
            return statuses, live_worker.requests, dead_worker and dead_worker.requests

    statuses, live_requests, dead_requests = run(scenario)
    if live:
        # Once the live instance served, a request pays at most one dead instance (the one
        # whose turn it is) before the one that served last.
        assert statuses == [200] * requests and live_requests == requests
        bound = requests - 1
    else:
        assert set(statuses) == {502 if dead_answer == "garbage" else 503}, statuses
        bound = 3 * requests  # at most three instances a request
    if dead_requests is not None:
        assert dead_requests == bound, dead_requests
    lines = frontend_lines(caplog)
    # One line per cause per 10 s: an instance benched, a request failed (and aiohttp's
    # access log is not the frontend's).
    assert len(lines) <= 3, lines
    assert all(len(text) < LINE_LIMIT for text in lines), max(map(len, lines))
    assert all(text.isprintable() for text in lines)


@contextlib.asynccontextmanager
async def hanging_endpoint():
    """A real socket on 127.0.0.1 that accepts every connection and never answers (what a dead
    pod's address often does): ``(endpoint, connections accepted so far)``."""
    accepted: list[asyncio.StreamWriter] = []
    closing = asyncio.Event()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        await closing.wait()

    server = await asyncio.start_server(hold, "127.0.0.1", 0, backlog=1024)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", accepted
    finally:
        closing.set()
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    "dead_answer, instances",
    [
        ("refused", {"refused": 3000}),
        ("draining", {"draining": 3000}),
        ("hanging", {"hanging": 300}),
        ("hanging and refused", {"hanging": 1000, "refused": 2000}),
    ],
)
def test_one_live_instance_behind_thousands_of_dead_records_takes_every_request(
    card, processor, caplog, dead_answer, instances
):
    """Issue 29: a live instance the frontend never routed to, listed after thousands of dead
    records, serves every request from the first one on (the old router tried three per request
    in turn and answered 503 until rotation reached it), also when the dead accept connections
    and never answer (each of their probes costs its whole deadline); the work stays bounded:
    per request, at most one dead instance tried (the one whose turn it is), and each dead
    instance probed at most once."""
    caplog.set_level(logging.INFO)
    requests = 10
    finish = line({"finish_reason": "length", "prompt_tokens": 1, "completion_tokens": 1})
    live_answer = raw([line({"token_ids": processor.encode_chat(" y")}), finish])

    async def scenario():
        async with contextlib.AsyncExitStack() as stack:
            live_worker = await stack.enter_async_context(hostile_worker(live_answer))
            endpoints: list[str] = []
            dead_worker, accepted = None, []
            for kind, count in instances.items():
                if kind == "refused":
                    url = dead_endpoint()
                elif kind == "hanging":
                    url, accepted = await stack.enter_async_context(hanging_endpoint())
                else:  # alive but draining: its health is 503, its generate refused
                    dead_worker = await stack.enter_async_context(
                        hostile_worker(raw([b'{"error": "draining"}'], status=503))
                    )
                    dead_worker.health_status = 503
                    url = dead_worker.endpoint
                endpoints += [url] * count
            # The live instance last: round-robin starts at the first dead one.
            endpoints.append(live_worker.endpoint)
            client, _ = await stack.enter_async_context(frontend(card, *endpoints))
            caplog.clear()
            statuses = [(await answer_of(client, chat(max_tokens=1)))[0] for _ in range(requests)]
            return statuses, live_worker.requests, dead_worker, len(accepted)

    statuses, live_requests, dead_worker, hanging_connections = run(scenario)
    assert statuses == [200] * requests and live_requests == requests
    total = sum(instances.values())
    if dead_worker is not None:
        assert dead_worker.requests <= requests, dead_worker.requests
        assert dead_worker.health_probes <= total, dead_worker.health_probes
    if "hanging" in instances:
        # Each hanging instance probed at most once by the sweep, and each request's first
        # attempt at most one generate and one probe.
        assert hanging_connections <= instances["hanging"] + 2 * requests, hanging_connections
    lines = frontend_lines(caplog)
    assert len(lines) <= 3, lines


def test_the_routers_memory_is_bounded(card, monkeypatch):
    monkeypatch.setattr(worker_router, "MAX_REMEMBERED", 50)
    answer = raw([b"{}"], status=500)

    async def scenario():
        async with hostile_worker(answer) as worker:
            async with frontend(card, *[worker.endpoint] * 300) as (client, router):
                for _ in range(40):
                    await answer_of(client, chat())
                return len(router._benched), worker.requests

    remembered, tried = run(scenario)
    assert tried == 120 and remembered == 50

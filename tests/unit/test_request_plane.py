"""The request plane on a real aiohttp server on 127.0.0.1, with the real client.

Each test runs its own event loop with ``asyncio.run``; waits are events with deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from dynamo.runtime import request_plane
from dynamo.runtime.request_plane import (
    GENERATE_PATH,
    BadGenerateRequest,
    GenerateRequest,
    RequestRefused,
    WorkerUnavailable,
    _refusal,
    generate,
    validate_generate_request,
)
from dynamo.runtime.sampling import SamplingOptions
from dynamo.vllm.request_plane_server import add_request_plane_routes

DEADLINE_S = 30.0


MODEL = "served-name"


async def echo_engine(request: GenerateRequest) -> AsyncIterator[dict]:
    """Echo each prompt token back, one per step, up to max_tokens."""
    emitted = 0
    max_tokens = request.sampling.max_tokens
    for token in request.token_ids[:max_tokens]:
        await asyncio.sleep(0)
        emitted += 1
        yield {"token_ids": [token]}
    yield {
        "finish_reason": "length" if emitted == max_tokens else "stop",
        "prompt_tokens": len(request.token_ids),
        "completion_tokens": emitted,
    }


@contextlib.asynccontextmanager
async def serving(app: web.Application):
    """``app`` on a loopback test server, with a client session: ``(session, base URL)``."""
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            yield session, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


def worker(handler, is_healthy: Callable[[], bool] = lambda: True):
    app = web.Application()
    add_request_plane_routes(app, handler, is_healthy, served_model_name=MODEL)
    return serving(app)


def raw_worker(body_lines: list[bytes]):
    """A worker that answers /generate with exactly these bytes (to test the client)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        for line in body_lines:
            await response.write(line)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post(GENERATE_PATH, handle)
    return serving(app)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE_S))


def as_dict(item) -> dict:
    """A stream item as the JSON line the worker wrote (defaults left out)."""
    return item.model_dump(mode="json", exclude_defaults=True)


async def collect(session, endpoint, request, **kwargs) -> list[dict]:
    return [as_dict(item) async for item in generate(session, endpoint, request, **kwargs)]


REQUEST = {
    "request_id": "r1",
    "model": MODEL,
    "token_ids": [5, 6, 7],
    "sampling": {"max_tokens": 2},
}


def answer_from(server, request=REQUEST) -> list[dict]:
    """The items ``server`` (``worker(engine)`` or ``raw_worker(lines)``) streams back for
    ``request``."""

    async def scenario():
        async with server as (session, endpoint):
            return await collect(session, endpoint, request)

    return run(scenario())


# --- the happy path -----------------------------------------------------------------------------


def test_generate_streams_every_item_then_the_finish():
    assert answer_from(worker(echo_engine)) == [
        {"token_ids": [5]},
        {"token_ids": [6]},
        {"finish_reason": "length", "prompt_tokens": 3, "completion_tokens": 2},
    ]


def test_items_reach_the_client_before_the_stream_ends():
    # The engine produces its second token only after the client has seen the first: a client
    # (or server) that buffered the whole response would deadlock here and hit the deadline.
    async def scenario():
        first_seen = asyncio.Event()

        async def lockstep(request: GenerateRequest) -> AsyncIterator[dict]:
            yield {"token_ids": [1]}
            await asyncio.wait_for(first_seen.wait(), DEADLINE_S / 2)
            yield {"token_ids": [2]}
            yield {"finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": 2}

        items = []
        async with worker(lockstep) as (session, endpoint):
            async for item in generate(session, endpoint, REQUEST):
                items.append(as_dict(item))
                first_seen.set()
        return items

    assert [i.get("token_ids") for i in run(scenario())] == [[1], [2], None]


def test_the_handler_gets_the_validated_request():
    seen: list[GenerateRequest] = []

    async def recording(request: GenerateRequest) -> AsyncIterator[dict]:
        seen.append(request)
        yield {"finish_reason": "stop", "prompt_tokens": 0, "completion_tokens": 0}

    sampling = {"max_tokens": 9, "temperature": 0.5, "seed": 7, "stop": ["\n\n"], "top_k": -1}
    request = GenerateRequest(
        request_id="r2", model=MODEL, token_ids=[1, 2], sampling=SamplingOptions(**sampling)
    )

    async def scenario():
        async with worker(recording) as (session, endpoint):
            await collect(session, endpoint, request)  # the model, sent as its JSON

    run(scenario())
    assert seen == [request]
    assert seen[0].sampling.stop == ("\n\n",) and seen[0].sampling.temperature == 0.5


def test_health_is_200_while_healthy_and_503_while_draining():
    healthy = [True]

    async def scenario():
        async with worker(echo_engine, lambda: healthy[0]) as (session, endpoint):
            async with session.get(endpoint + request_plane.HEALTH_PATH) as response:
                first = (response.status, await response.json())
            healthy[0] = False
            async with session.get(endpoint + request_plane.HEALTH_PATH) as response:
                second = (response.status, await response.json())
            return first, second

    assert run(scenario()) == ((200, {"status": "ok"}), (503, {"status": "draining"}))


# --- errors -------------------------------------------------------------------------------------

NOT_JSON_BODIES = [
    pytest.param(b"{not json", id="not-json"),
    pytest.param(b"", id="empty"),
    pytest.param(b"\xff\xfe", id="not-utf8"),
    pytest.param(b"[1, 2]", id="array"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, id="nested-too-deeply"),
    pytest.param(b'{"request_id": ' + b"9" * 5000 + b"}", id="integer-over-the-digit-limit"),
]


def _with(field: str, value) -> dict:
    """REQUEST with one field (``sampling.x`` for a sampling field) set, or removed (...)."""
    body = json.loads(json.dumps(REQUEST))
    target, name = (body["sampling"], field[9:]) if field.startswith("sampling.") else (body, field)
    if value is ...:
        target.pop(name, None)
    else:
        target[name] = value
    return body


# Every field of the v2 body, and every SamplingOptions field, with values it must refuse; the
# 400 names the field (for a list item, the list: "token_ids.1", "sampling.stop.0").
BAD_FIELDS = [
    ("request_id", ...), ("request_id", 7), ("request_id", None),
    ("model", ...), ("model", ""), ("model", 5),
    ("token_ids", ...), ("token_ids", "abc"), ("token_ids", []), ("token_ids", [1, "2"]),
    ("token_ids", [True]), ("token_ids", [-1]), ("token_ids", [1.5]),
    ("sampling", ...), ("sampling", None), ("sampling", [1]),
    ("max_tokens", ""),  # an unknown top-level field (the v1 body): refused, not ignored
    ("sampling.max_tokens", ...), ("sampling.max_tokens", 0), ("sampling.max_tokens", 1.5),
    ("sampling.max_tokens", True), ("sampling.max_tokens", "5"),
    ("sampling.min_tokens", -1), ("sampling.min_tokens", 0.5), ("sampling.min_tokens", False),
    ("sampling.min_tokens", 3),  # more than max_tokens (2): vLLM refuses it too
    ("sampling.temperature", -0.1), ("sampling.temperature", "0.5"),
    ("sampling.temperature", True), ("sampling.temperature", 1e400),
    ("sampling.top_p", 0), ("sampling.top_p", 1.01), ("sampling.top_p", "1"),
    ("sampling.top_k", -2), ("sampling.top_k", 2.5), ("sampling.top_k", "3"),
    ("sampling.min_p", -0.1), ("sampling.min_p", 1.5), ("sampling.min_p", False),
    ("sampling.seed", 1.5), ("sampling.seed", "7"), ("sampling.seed", True),
    ("sampling.presence_penalty", 2.5), ("sampling.presence_penalty", -2.5),
    ("sampling.presence_penalty", "0"),
    ("sampling.frequency_penalty", 2.01), ("sampling.frequency_penalty", -3),
    ("sampling.frequency_penalty", True),
    ("sampling.repetition_penalty", 0), ("sampling.repetition_penalty", -1),
    ("sampling.repetition_penalty", "1.1"),
    ("sampling.stop", "\n"), ("sampling.stop", [""]), ("sampling.stop", [5]),
    ("sampling.stop", None),
    ("sampling.stop_token_ids", [-1]), ("sampling.stop_token_ids", ["1"]),
    ("sampling.stop_token_ids", 5),
    ("sampling.ignore_eos", "yes"), ("sampling.ignore_eos", 1), ("sampling.ignore_eos", None),
    ("sampling.logit_bias", {"5": 1.0}), ("sampling.logit_bias", [[5, 101.0]]),
    ("sampling.logit_bias", [[-1, 1.0]]), ("sampling.logit_bias", [[5, "1"]]),
    ("sampling.logit_bias", [[5, 1.0]] * 1025),
    ("sampling.allowed_token_ids", [-1]), ("sampling.allowed_token_ids", ["1"]),
    ("sampling.allowed_token_ids", [1] * 1025),
    ("sampling.bad_words", [""]), ("sampling.bad_words", [5]), ("sampling.bad_words", ["a"] * 65),
    ("sampling.logprobs", -1), ("sampling.logprobs", 21), ("sampling.logprobs", True),
    ("sampling.logprobs", "2"),
    ("sampling.prompt_logprobs", -1), ("sampling.prompt_logprobs", 21),
    ("sampling.prompt_logprobs", False),
    ("sampling.structured_outputs", {}),
    ("sampling.structured_outputs", {"regex": "a", "choice": ["b"]}),
    ("sampling.structured_outputs", {"regex": "a" * (64 * 1024 + 1)}),
    ("sampling.structured_outputs", {"json_object": False}),
    ("sampling.structured_outputs", {"choice": []}),
    ("sampling.structured_outputs", {"structural_tag": "x", "regex": "a"}),
    ("sampling.reasoning_ended", "yes"), ("sampling.reasoning_ended", 1),
    ("sampling.best_of", 2),  # not a sampling option of the wire format
]  # fmt: skip


def _post(body: bytes | dict, engine=None):
    called: list = []

    async def recording(request) -> AsyncIterator[dict]:
        called.append(request)
        yield {"finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": 0}

    async def scenario():
        async with worker(engine or recording) as (session, endpoint):
            kwargs = {"json": body} if isinstance(body, dict) else {"data": body}
            async with session.post(
                endpoint + GENERATE_PATH, headers={"Content-Type": "application/json"}, **kwargs
            ) as response:
                return response.status, await response.json()

    status, answer = run(scenario())
    return status, answer, called


@pytest.mark.parametrize("body", NOT_JSON_BODIES)
def test_a_body_that_is_not_a_json_object_is_a_400_and_never_reaches_the_engine(body):
    status, answer, called = _post(body)
    assert status == 400
    assert isinstance(answer["error"], str) and answer["error"]
    assert called == []


@pytest.mark.parametrize(
    "field, value", [pytest.param(f, v, id=f"{f}={v!r}") for f, v in BAD_FIELDS]
)
def test_a_bad_field_is_a_400_naming_it_and_never_reaches_the_engine(field, value):
    status, answer, called = _post(_with(field, value))
    assert status == 400, answer
    assert answer["field"].split(".")[: len(field.split("."))] == field.split("."), answer
    assert answer["error"].startswith(answer["field"] + ": "), answer
    assert called == []


def test_every_sampling_option_is_covered_by_the_bad_value_table():
    covered = {f[9:] for f, _ in BAD_FIELDS if f.startswith("sampling.")}
    assert set(SamplingOptions.model_fields) <= covered


def test_a_request_for_another_model_is_a_400_naming_the_served_one():
    status, answer, called = _post(_with("model", "someone-else"))
    assert status == 400
    assert answer["field"] == "model"
    assert "'someone-else'" in answer["error"] and repr(MODEL) in answer["error"]
    assert called == []


def test_an_engine_refusing_the_prompt_before_its_first_item_is_a_400():
    async def refusing(request) -> AsyncIterator[dict]:
        raise BadGenerateRequest("the prompt is too long", field="token_ids")
        yield {}  # an async generator  # pragma: no cover

    status, answer, _ = _post(REQUEST, engine=refusing)
    assert (status, answer) == (400, {"error": "the prompt is too long", "field": "token_ids"})


def test_the_client_turns_a_400_about_the_request_into_request_refused():
    """A 400 naming a request field (the prompt, a sampling field) is the client's: another
    instance would refuse it too, so it is not WorkerUnavailable (which fails over)."""

    with pytest.raises(RequestRefused) as refused:
        answer_from(worker(echo_engine), _with("sampling.max_tokens", 0))
    assert refused.value.field == "sampling.max_tokens"
    assert "greater than or equal to 1" in str(refused.value)


@pytest.mark.parametrize("model", ["someone-else", None])
def test_the_client_turns_any_other_400_into_worker_unavailable(model):
    """A 400 naming the model (or nothing: a body the worker could not read) means the two ends
    disagree: the worker's side, so the caller may try another instance."""

    async def scenario():
        async with worker(echo_engine) as (session, endpoint):
            body = _with("model", model) if model else b"{not json"
            if isinstance(body, bytes):
                async with session.post(endpoint + GENERATE_PATH, data=body) as response:
                    text = await response.text()
                assert response.status == 400, text
                assert _refusal(response.status, text) is None
                return
            await collect(session, endpoint, body)

    if model is None:
        run(scenario())
    else:
        with pytest.raises(WorkerUnavailable, match="400"):
            run(scenario())


def test_a_draining_worker_answers_503_and_the_client_raises():
    called: list[GenerateRequest] = []

    async def engine(request: GenerateRequest) -> AsyncIterator[dict]:
        called.append(request)
        yield {"finish_reason": "stop"}

    async def scenario():
        async with worker(engine, lambda: False) as (session, endpoint):
            async with session.post(endpoint + GENERATE_PATH, json=REQUEST) as response:
                status = response.status
            with pytest.raises(WorkerUnavailable, match="503"):
                await collect(session, endpoint, REQUEST)
            return status

    assert run(scenario()) == 503
    assert called == []


def test_a_closed_port_is_worker_unavailable():
    async def scenario():
        # Bound but not listening for the whole test: a port closed before the connect could be
        # taken meanwhile by another process on a shared CI machine.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            async with aiohttp.ClientSession() as session:
                await collect(session, f"http://127.0.0.1:{sock.getsockname()[1]}", REQUEST)

    with pytest.raises(WorkerUnavailable, match="unreachable"):
        run(scenario())


def test_a_stream_that_ends_without_finish_reason_is_worker_unavailable():
    received: list[dict] = []

    async def unfinished(request: GenerateRequest) -> AsyncIterator[dict]:
        yield {"token_ids": [1]}
        yield {"token_ids": [2]}

    async def scenario():
        async with worker(unfinished) as (session, endpoint):
            async for item in generate(session, endpoint, REQUEST):
                received.append(as_dict(item))

    with pytest.raises(WorkerUnavailable, match="before finishing"):
        run(scenario())
    assert received == [{"token_ids": [1]}, {"token_ids": [2]}]


def test_an_engine_failure_mid_stream_is_reported_in_band():
    async def failing(request: GenerateRequest) -> AsyncIterator[dict]:
        yield {"token_ids": [1]}
        raise RuntimeError("engine died")

    with pytest.raises(WorkerUnavailable, match="engine died"):
        answer_from(worker(failing))


def test_a_connection_dropped_mid_stream_is_worker_unavailable():
    async def dropping(request: GenerateRequest) -> AsyncIterator[dict]:
        yield {"token_ids": [1]}
        raise ConnectionResetError("peer gone")  # the handler lets this through and aborts

    with pytest.raises(WorkerUnavailable):
        answer_from(worker(dropping))


@pytest.mark.parametrize(
    "lines",
    [
        pytest.param([b'{"token_ids": [1]}\n', b"not json\n"], id="not-json"),
        pytest.param([b'{"token_ids": [1]}\n', b"42\n"], id="number"),
        pytest.param([b'{"token_ids": [1]}\n', b'["finish_reason"]\n'], id="array"),
        pytest.param([b'{"token_ids": [1]}\n', b'{"finish_re'], id="cut-mid-line"),
    ],
)
def test_a_garbled_stream_is_worker_unavailable(lines):
    with pytest.raises(WorkerUnavailable):
        answer_from(raw_worker(lines))


def test_blank_lines_are_skipped():
    finish = {"finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": 1}
    lines = [b"\n", b'{"token_ids": [1]}\n', b"\n", json.dumps(finish).encode() + b"\n"]

    assert answer_from(raw_worker(lines)) == [{"token_ids": [1]}, finish]


def test_closing_the_client_stream_aborts_the_request_in_the_worker():
    async def scenario():
        aborted = asyncio.Event()

        async def endless(request: GenerateRequest) -> AsyncIterator[dict]:
            try:
                n = 0
                while True:
                    n += 1
                    yield {"token_ids": [n]}
                    await asyncio.sleep(0.001)
            finally:
                aborted.set()

        async with worker(endless) as (session, endpoint):
            stream = generate(session, endpoint, REQUEST)
            first = as_dict(await stream.__anext__())
            await stream.aclose()  # the frontend's client went away
            await asyncio.wait_for(aborted.wait(), DEADLINE_S / 2)
        return first

    assert run(scenario()) == {"token_ids": [1]}


def test_an_engine_failure_before_the_first_item_is_reported_in_band():
    async def failing(request: GenerateRequest) -> AsyncIterator[dict]:
        raise RuntimeError("engine died at once")
        yield {}  # an async generator  # pragma: no cover

    with pytest.raises(WorkerUnavailable, match="engine died at once"):
        answer_from(worker(failing))


# --- validation as a function (shared by both ends) --------------------------------------------


def test_validate_generate_request_returns_the_model_with_sampling_defaults():
    request = validate_generate_request(REQUEST)
    assert request == GenerateRequest(
        request_id="r1", model=MODEL, token_ids=[5, 6, 7], sampling=SamplingOptions(max_tokens=2)
    )
    assert request.sampling.temperature is None and request.sampling.ignore_eos is False
    assert request.model_dump(mode="json")["sampling"]["stop"] == []


def test_validate_generate_request_names_the_first_bad_field():
    with pytest.raises(BadGenerateRequest) as excinfo:
        validate_generate_request(_with("sampling.top_p", 2))
    assert excinfo.value.field == "sampling.top_p"
    assert str(excinfo.value).startswith("sampling.top_p: ")


def test_a_body_aiohttp_cannot_read_is_a_400_not_a_500():
    async def never(request) -> AsyncIterator[dict]:
        raise AssertionError("reached the engine")
        yield {}

    async def scenario():
        async with worker(never) as (session, endpoint):
            async with session.post(
                endpoint + GENERATE_PATH,
                data=b"this is not gzip",
                headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
            ) as response:
                return response.status, await response.json()

    status, answer = run(scenario())
    assert status == 400
    assert answer["error"].startswith("body could not be read: "), answer

"""The frontend's public HTTP surface, byte by byte (issue 19, item 10): what a request body may
be is decided from its head (declared size, content coding, ``Expect``) before any of it is read
or invited; every answer is in the OpenAI error shape, aiohttp's own included; every number of a
request is strictly a JSON number of its type.

The frontend here is the real service behind its real listener (tests/support/frontend_fakes.py)
in front of an echo worker; raw sockets send what no well-behaved client would.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from pydantic import BaseModel

from dynamo.common.http_server import FRONTEND_MAX_BODY_BYTES
from dynamo.frontend.openai import protocol as oai
from tests.support.answers import assert_openai_error
from tests.support.bad_requests import MALFORMED_HEADS
from tests.support.frontend_fakes import MODEL, echo_worker, frontend
from tests.support.tiny_model import tiny_card

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 2}


@pytest.fixture
def card(tiny_tokenizer_dir):
    return tiny_card(tiny_tokenizer_dir, MODEL)


async def _exchange(port: int, data: bytes, *, deadline_s: float = 10.0) -> bytes:
    """Send ``data`` on a new connection; what the server answers: any interim ``1xx`` heads,
    then the final head and its body (by its Content-Length)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    answer = b""
    try:
        while True:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), deadline_s)
            answer += head
            if not head.startswith(b"HTTP/1.1 1"):
                break
        length = _headers(head).get("content-length", "0")
        answer += await asyncio.wait_for(reader.readexactly(int(length)), deadline_s)
    finally:
        writer.close()
    return answer


def _headers(head: bytes) -> dict[str, str]:
    lines = head.decode().strip().split("\r\n")[1:]
    return {k.lower(): v for k, v in (line.split(": ", 1) for line in lines)}


def _response(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), _headers(head + b"\r\n\r\n"), json.loads(body)


def _scenario(card, exchange):
    """Run ``exchange(port)`` against a frontend with an echo worker; (its result, requests the
    worker started)."""

    async def scenario():
        async with echo_worker() as (engine, endpoint), frontend(card, endpoint) as client:
            result = await exchange(client.server.port)
            return result, engine.requests_started

    return asyncio.run(scenario())


def _post(path: str, headers: str, body: bytes = b"") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n").encode() + body


# -- numbers ---------------------------------------------------------------------------------


def _numeric_fields(model: type[BaseModel]) -> dict[str, str]:
    """Every field of the request model whose JSON type is a number: name -> integer/number."""
    fields = {}
    for name, spec in model.model_json_schema()["properties"].items():
        types = {branch.get("type") for branch in spec.get("anyOf", [spec])}
        if types & {"integer", "number"}:
            fields[name] = "integer" if "integer" in types else "number"
    return fields


CHAT_NUMBERS = _numeric_fields(oai.ChatCompletionRequest)
COMPLETION_NUMBERS = _numeric_fields(oai.CompletionRequest)


def test_the_numeric_fields_are_found_from_the_request_models():
    # The table below is derived, so a number added to the models is covered without an edit.
    assert {"n", "max_tokens", "temperature", "seed", "top_k", "min_tokens"} <= set(CHAT_NUMBERS)
    assert "max_completion_tokens" in CHAT_NUMBERS and "max_tokens" in COMPLETION_NUMBERS
    assert CHAT_NUMBERS["n"] == "integer" and CHAT_NUMBERS["temperature"] == "number"


def _not_numbers(kind: str) -> list:
    wrong = [True, False, "1", [1], {"value": 1}]
    return wrong + ([1.0, 2.0] if kind == "integer" else [])


@pytest.mark.parametrize(
    "path, base, name, value",
    [("/v1/chat/completions", CHAT, name, value)
     for name, kind in CHAT_NUMBERS.items() for value in _not_numbers(kind)]
    + [("/v1/completions", COMPLETION, name, value)
       for name, kind in COMPLETION_NUMBERS.items() for value in _not_numbers(kind)],
)  # fmt: skip
def test_every_numeric_field_refuses_booleans_strings_and_floats_for_integers_by_name(
    card, path, base, name, value
):
    body = json.dumps({**base, name: value}).encode()

    async def exchange(port):
        raw = await _exchange(
            port, _post(path, f"Content-Length: {len(body)}\r\nConnection: close\r\n", body)
        )
        return _response(raw)

    (status, _, answer), started = _scenario(card, exchange)
    assert status == 400, answer
    assert assert_openai_error(answer, param=name)["type"] == "invalid_request_error"
    assert started == 0


def test_n_is_one_given_as_the_integer_one_or_left_out(card):
    async def exchange(port):
        answers = []
        for extra in ({"n": 1}, {}, {"n": None}):
            body = json.dumps({**CHAT, **extra}).encode()
            raw = await _exchange(
                port,
                _post(
                    "/v1/chat/completions",
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n",
                    body,
                ),
            )
            answers.append(_response(raw)[0])
        return answers

    statuses, started = _scenario(card, exchange)
    assert statuses == [200, 200, 200] and started == 3


# -- content coding --------------------------------------------------------------------------

ENCODINGS = ["gzip", "x-gzip", "deflate", "br", "zstd", "compress", "foo", "gzip, br", "GZIP"]


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_content_coding_is_415_in_the_openai_shape_and_nothing_is_inflated(card, encoding, path):
    import gzip

    # A real gzip bomb when the coding claims gzip: 1 MiB of zeros in ~1 KiB.
    body = gzip.compress(b"0" * FRONTEND_MAX_BODY_BYTES) if "gzip" in encoding.lower() else b"{}"

    async def exchange(port):
        raw = await _exchange(
            port,
            _post(path, f"Content-Encoding: {encoding}\r\nContent-Length: {len(body)}\r\n", body),
        )
        return _response(raw)

    (status, headers, answer), started = _scenario(card, exchange)
    assert status == 415, answer
    assert headers["content-type"].startswith("application/json")
    error = assert_openai_error(answer)
    assert error["code"] == "unsupported_content_encoding" and "Please install" not in str(answer)
    assert started == 0


def test_identity_is_no_coding(card):
    body = json.dumps(CHAT).encode()

    async def exchange(port):
        headers = f"Content-Encoding: identity\r\nContent-Length: {len(body)}\r\n"
        return _response(await _exchange(port, _post("/v1/chat/completions", headers, body)))

    (status, _, answer), started = _scenario(card, exchange)
    assert status == 200, answer
    assert started == 1


# -- declared size and Expect ----------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("length", [FRONTEND_MAX_BODY_BYTES + 1, 10**12, 2**63 - 1])
def test_expect_100_continue_with_a_body_over_the_limit_is_413_without_a_100(card, path, length):
    async def exchange(port):
        began = time.monotonic()
        raw = await _exchange(
            port, _post(path, f"Expect: 100-continue\r\nContent-Length: {length}\r\n")
        )
        return raw, time.monotonic() - began

    (raw, took), started = _scenario(card, exchange)
    assert b"100 Continue" not in raw
    status, _, answer = _response(raw)
    assert status == 413 and assert_openai_error(answer)["code"] == "request_too_large"
    assert took < 5.0  # answered from the head, not after waiting for a body
    assert started == 0


def test_a_declared_body_over_the_limit_is_413_at_once_without_expect(card):
    async def exchange(port):
        began = time.monotonic()
        raw = await _exchange(
            port, _post("/v1/chat/completions", f"Content-Length: {10**10}\r\n", b"{")
        )
        return raw, time.monotonic() - began

    (raw, took), started = _scenario(card, exchange)
    status, _, answer = _response(raw)
    assert status == 413 and assert_openai_error(answer)["code"] == "request_too_large"
    assert took < 5.0  # not the 20 s body deadline
    assert started == 0


@pytest.mark.parametrize("expect", ["foo", "100-continue-please", "200-ok"])
def test_an_unknown_expectation_is_417_in_the_openai_shape(card, expect):
    async def exchange(port):
        return await _exchange(
            port, _post("/v1/chat/completions", f"Expect: {expect}\r\nContent-Length: 2\r\n")
        )

    raw, started = _scenario(card, exchange)
    assert b"100 Continue" not in raw
    status, _, answer = _response(raw)
    assert status == 417 and assert_openai_error(answer)["code"] == "expectation_failed"
    assert started == 0


def test_expect_100_continue_with_a_compressed_body_is_415_without_a_100(card):
    async def exchange(port):
        headers = "Expect: 100-continue\r\nContent-Encoding: gzip\r\nContent-Length: 20\r\n"
        return await _exchange(port, _post("/v1/chat/completions", headers))

    raw, started = _scenario(card, exchange)
    assert b"100 Continue" not in raw
    assert _response(raw)[0] == 415 and started == 0


def test_expect_100_continue_within_the_limit_gets_its_100_then_the_answer(card):
    body = json.dumps(CHAT).encode()

    async def exchange(port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            _post(
                "/v1/chat/completions",
                f"Expect: 100-continue\r\nContent-Length: {len(body)}\r\nConnection: close\r\n",
            )
        )
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        writer.write(body)
        rest = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return interim, rest

    (interim, rest), started = _scenario(card, exchange)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert _response(rest)[0] == 200 and started == 1


# -- aiohttp's own answers -------------------------------------------------------------------

MALFORMED = [
    *MALFORMED_HEADS,
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2"
    b"\r\n\r\n{}",
    b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX: \x1b[31mred\r\n\r\n",
]


@pytest.mark.parametrize("raw", MALFORMED)
def test_a_request_aiohttp_cannot_parse_is_answered_in_the_openai_shape(card, raw, caplog):
    async def exchange(port):
        return await _exchange(port, raw)

    answer, started = _scenario(card, exchange)
    status, headers, body = _response(answer)
    assert 400 <= status < 500
    assert headers["content-type"].startswith("application/json"), answer
    error = assert_openai_error(body)
    assert error["type"] == "invalid_request_error"
    assert "\x00" not in error["message"] and "\x1b" not in error["message"]
    assert started == 0
    assert not [r for r in caplog.records if r.exc_info], "a traceback in the log"
    for record in caplog.records:
        assert "\x00" not in record.getMessage() and "\x1b" not in record.getMessage()


def test_a_broken_chunked_body_is_400_in_the_openai_shape(card):
    async def exchange(port):
        head = "Transfer-Encoding: chunked\r\nConnection: close\r\n"
        return await _exchange(port, _post("/v1/chat/completions", head, b"zz\r\n{}\r\n"))

    raw, started = _scenario(card, exchange)
    status, _, body = _response(raw)
    assert status == 400 and assert_openai_error(body)
    assert started == 0

"""HTTP/1.1 on the wire (issue 37, item 9), with raw sockets on loopback against the listeners
as the launchers run them (dynamo.common.http_server.GuardedRunner):

* a transfer coding other than chunked (``Transfer-Encoding: gzip, chunked``) is a 501 (RFC
  9112, 6.1), in the OpenAI shape on the frontend's port, ``{"error": ...}`` on the worker's
  request plane, the body unread and the connection closed; aiohttp read such a body as plain;
* a request marked ``Connection: close`` (or an HTTP/1.0 one) is answered, and what follows it
  on the connection is never read (RFC 9112, 9.6), in one packet or several; aiohttp answered
  400 in its place when the next request came in the same packet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random

import pytest
from aiohttp import web

from dynamo.common.http_server import GuardedRunner
from dynamo.common.request_framing import RequestFraming
from dynamo.frontend.serving.http_surface import openai_errors, protocol_error_body

DEADLINE_S = 10.0


class Served:
    def __init__(self) -> None:
        self.requests: list[tuple[str, bytes]] = []


@contextlib.asynccontextmanager
async def listener(*, frontend: bool):
    """A GuardedRunner on 127.0.0.1 whose routes record each request they serve: the
    frontend's shapes (``frontend``) or the request plane's."""
    served = Served()

    async def record(request: web.Request) -> web.Response:
        body = await request.read()
        served.requests.append((request.path, body))
        return web.json_response({"path": request.path, "bytes": len(body)})

    app = web.Application(middlewares=[openai_errors()] if frontend else [])
    app.router.add_route("*", "/{tail:.*}", record)
    runner = GuardedRunner(
        app, what="test listener", error_body=protocol_error_body if frontend else None
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1], served
    finally:
        await runner.cleanup()


async def exchange(port: int, *packets: bytes) -> bytes:
    """Send each packet (its own write: on loopback, mostly its own read on the server's side),
    then read until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for packet in packets:
            writer.write(packet)
            await writer.drain()
        return await asyncio.wait_for(reader.read(), DEADLINE_S)  # until EOF: it must close
    finally:
        writer.close()


def answers(raw: bytes) -> list[tuple[int, dict]]:
    """Each HTTP answer in ``raw``: (status, JSON body)."""
    found = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = next(int(v) for k, _, v in (ln.partition(b":") for ln in lines[1:])
                      if k.strip().lower() == b"content-length")  # fmt: skip
        try:
            found.append((status, json.loads(rest[:length])))
        except ValueError:  # aiohttp's own plain-text answer (the request plane's 400)
            found.append((status, {"text": rest[:length].decode(errors="replace")}))
        raw = rest[length:]
    return found


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 3 * DEADLINE_S))


# --- transfer codings --------------------------------------------------------------------------


def _chunked_post(coding: str) -> bytes:
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: {coding}\r\n\r\n"
        "5\r\nhello\r\n0\r\n\r\n"
    ).encode()


@pytest.mark.parametrize("frontend", [True, False], ids=["frontend", "request plane"])
@pytest.mark.parametrize(
    "coding, named",
    [
        ("gzip, chunked", "gzip"),
        ("GZip , chunked", "gzip"),
        ("deflate;q=1, chunked", "deflate"),
        ("identity, chunked", "identity"),
        ("x-\u00e9vil, chunked", None),
    ],
)
def test_a_transfer_coding_the_server_does_not_decode_is_a_501(frontend, coding, named):
    async def scenario():
        async with listener(frontend=frontend) as (port, served):
            raw = await exchange(port, _chunked_post(coding).replace(b"\xc3\xa9", b"\xe9"))
            return answers(raw), served.requests

    [(status, body)], requests = run(scenario())
    assert status == 501 and requests == []
    message = body["error"]["message"] if frontend else body["error"]
    assert "Transfer-Encoding" in message and "only chunked" in message
    if named:
        assert f"Transfer-Encoding {named} " in message
    if frontend:
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["code"] == "unsupported_transfer_encoding"


@pytest.mark.parametrize("frontend", [True, False], ids=["frontend", "request plane"])
def test_chunked_alone_is_read_and_a_final_coding_other_than_chunked_stays_a_400(frontend):
    """RFC 9112, 6.3: a request whose last coding is not chunked has no knowable length: 400."""

    async def scenario():
        async with listener(frontend=frontend) as (port, served):
            closing = _chunked_post("chunked").replace(b"1.1\r\n", b"1.1\r\nConnection: close\r\n")
            chunked = await exchange(port, closing)
            last_not_chunked = await exchange(port, _chunked_post("chunked, gzip"))
            return answers(chunked), answers(last_not_chunked), served.requests

    chunked, last_not_chunked, requests = run(scenario())
    assert chunked == [(200, {"path": "/v1/chat/completions", "bytes": 5})]
    assert [status for status, _ in last_not_chunked] == [400]
    assert requests == [("/v1/chat/completions", b"hello")]


# --- what follows a request marked close -------------------------------------------------------

GET = b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n"
NEXT = b"GET /second HTTP/1.1\r\nHost: a\r\n\r\n"
CLOSE_CASES = {
    "GET, close": b"GET /first HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    "close among tokens": b"GET /first HTTP/1.1\r\nHost: a\r\nconnection: TE, Close\r\n\r\n",
    "HTTP/1.0": b"GET /first HTTP/1.0\r\nHost: a\r\n\r\n",
    "POST with a body, close": (
        b"POST /first HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello"
    ),
    "chunked POST, close": (
        b"POST /first HTTP/1.1\r\nHost: a\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n"
        b"\r\n5\r\nhello\r\n0\r\n\r\n"
    ),
    "after blank lines": b"\r\n\r\nGET /first HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
}


@pytest.mark.parametrize("frontend", [True, False], ids=["frontend", "request plane"])
@pytest.mark.parametrize("split", ["one packet", "byte by byte"])
@pytest.mark.parametrize("case", sorted(CLOSE_CASES))
def test_what_follows_a_request_marked_close_is_never_read(frontend, split, case):
    """The request's last byte comes with what follows it: the server cannot answer before
    (writing more after its answer and close would be the client's reset, not the server's)."""
    first = CLOSE_CASES[case]
    rest = NEXT + b"garbage that is no request\r\n\r\n"
    if split == "one packet":
        packets = [first + rest]
    else:
        packets = [first[i : i + 1] for i in range(len(first) - 1)] + [first[-1:] + rest]

    async def scenario():
        async with listener(frontend=frontend) as (port, served):
            return answers(await exchange(port, *packets)), served.requests

    found, requests = run(scenario())
    assert [status for status, _ in found] == [200], found
    assert [path for path, _ in requests] == ["/first"]
    if b"hello" in first:
        assert requests[0][1] == b"hello"


def test_kept_alive_requests_before_the_one_marked_close_are_all_answered():
    stream = GET + GET.replace(b"first", b"again") + CLOSE_CASES["GET, close"].replace(
        b"first", b"last"
    ) + NEXT  # fmt: skip

    async def scenario():
        async with listener(frontend=True) as (port, served):
            return answers(await exchange(port, stream)), served.requests

    found, requests = run(scenario())
    assert [status for status, _ in found] == [200, 200, 200]
    assert [path for path, _ in requests] == ["/first", "/again", "/last"]


# --- the framing itself ------------------------------------------------------------------------


def _hand_on(framing: RequestFraming, packets: list[bytes]) -> bytes:
    return b"".join(piece for packet in packets for piece in framing.split(packet))


@pytest.mark.parametrize("case", sorted(CLOSE_CASES))
def test_the_framing_hands_on_exactly_the_request_marked_close_however_it_is_cut(case):
    first = CLOSE_CASES[case]
    stream = GET + first + NEXT + b"more"
    rng = random.Random(37)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(0, 12)))
        packets = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        assert _hand_on(RequestFraming(), packets) == GET + first, cuts


def test_the_framing_follows_chunked_bodies_and_hands_on_what_it_cannot_follow():
    chunked = (
        b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"A;ext=1\r\n0123456789\r\n3\r\n\r\n\r\n\r\n0\r\nX-Trailer: 1\r\n\r\n"
    )
    last = CLOSE_CASES["GET, close"]
    assert _hand_on(RequestFraming(), [chunked + last + NEXT]) == chunked + last
    # What it cannot follow goes on as it comes: the parser judges it, as before.
    upgrade = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    bad_size = b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n"
    for stream in (upgrade + b"frames", bad_size + NEXT):
        assert _hand_on(RequestFraming(), [stream]) == stream

"""The listeners' bounds on what a client sends (dynamo.common.http_server.RequestDeadlines):
every request head, first or later, and every request body, with raw sockets on loopback.

The bounds are made small here on the runner's own deadline object (the real ones are 20 s; the
integration tests use those): the times asserted are the bound plus a margin for a loaded
machine, never a sleep standing in for a condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import pytest
from aiohttp import web

from dynamo.common.http_server import GuardedRunner, RequestBodyTimeout
from dynamo.frontend.openai.request_body import read_json_body
from dynamo.frontend.serving.http_surface import openai_errors
from dynamo.vllm.request_plane_server import add_request_plane_routes

HEAD_S = 0.6
BODY_S = 0.6
MARGIN_S = 2.0
TRICKLE_EVERY_S = 0.1  # one byte per tick: the body never completes within the bound


async def _echo(request: web.Request) -> web.Response:
    return web.json_response({"got": await read_json_body(request)})


async def _slow_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    for _ in range(int(3 * HEAD_S / 0.1)):  # outlives the head bound: a pipelined head waits
        await response.write(b"x")
        await asyncio.sleep(0.1)  # the stream's pacing, not synchronisation
    await response.write_eof()
    return response


def _trickle(writer: asyncio.StreamWriter, data: bytes) -> asyncio.Future:
    """Start writing ``data`` one byte per TRICKLE_EVERY_S, as a slow client does (the caller
    cancels it once it has what it waits for)."""

    async def trickle():
        for byte in data:
            writer.write(bytes([byte]))
            await asyncio.sleep(TRICKLE_EVERY_S)  # the slow client's pace

    return asyncio.ensure_future(trickle())


@contextlib.asynccontextmanager
async def _serving(app: web.Application | None = None):
    """``app`` (by default :func:`_frontend_like_app`) behind a GuardedRunner with the small
    deadlines, on a loopback port: ``(runner, port)``, cleaned up on exit."""
    runner = GuardedRunner(app or _frontend_like_app(), what="test service")
    await runner.setup()
    try:
        runner.deadlines.head_timeout_s = HEAD_S
        runner.deadlines.body_timeout_s = BODY_S
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield runner, runner.addresses[0][1]
    finally:
        await runner.cleanup()


def _frontend_like_app() -> web.Application:
    app = web.Application(middlewares=[openai_errors()])
    app.router.add_post("/echo", _echo)
    app.router.add_get("/slow", _slow_stream)
    app.router.add_get("/ok", _ok)
    return app


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.split(": ", 1) for line in lines[1:] if line)
    body = await reader.readexactly(int(headers.get("Content-Length", 0)))
    return status, headers, body


async def _closed(reader: asyncio.StreamReader, deadline_s: float) -> float:
    """Seconds until the server closes the connection (EOF or reset)."""
    began = time.monotonic()
    try:
        while await asyncio.wait_for(reader.read(65536), deadline_s):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - began


def _post_head(length: int) -> bytes:
    return (
        f"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def test_a_trickled_body_gets_408_in_the_openai_shape_and_the_connection_closes(caplog):
    caplog.set_level(logging.INFO, logger="dynamo.common.http_server")

    async def scenario():
        async with _serving() as (runner, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            body = json.dumps({"prompt": "x" * 200}).encode()
            writer.write(_post_head(len(body)))
            began = time.monotonic()

            trickler = _trickle(writer, body)
            try:
                status, headers, answer = await asyncio.wait_for(_read_response(reader), 10)
                took = time.monotonic() - began
                closed_after = await _closed(reader, 10)
            finally:
                trickler.cancel()
                writer.close()
            return status, json.loads(answer), took, closed_after, runner.deadlines

    status, answer, took, closed_after, deadlines = asyncio.run(scenario())
    assert status == 408
    error = answer["error"]
    assert error["code"] == "request_timeout" and error["type"] == "invalid_request_error"
    assert f"did not arrive within {BODY_S:g} s" in error["message"]
    assert BODY_S - 0.1 <= took < BODY_S + MARGIN_S, took
    assert closed_after < MARGIN_S
    assert deadlines.timed_out_bodies == 1
    lines = [r.getMessage() for r in caplog.records if "Request body to the" in r.getMessage()]
    assert lines == [
        f"Request body to the test service from 127.0.0.1 not complete within {BODY_S:g} s: "
        "answered 408 and closed"
    ]
    assert not any(r.exc_info for r in caplog.records), "a traceback in the log"


def test_a_body_that_arrives_in_time_is_read_and_the_connection_kept():
    async def scenario():
        async with _serving() as (runner, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            answers = []
            for number in range(3):  # three requests on one kept-alive connection
                body = json.dumps({"n": number}).encode()
                writer.write(_post_head(len(body)))
                writer.write(body[:3])
                await writer.drain()
                writer.write(body[3:])
                answers.append(await asyncio.wait_for(_read_response(reader), 10))
            writer.close()
            return answers

    answers = asyncio.run(scenario())
    assert [(status, json.loads(body)["got"]) for status, _, body in answers] == [
        (200, {"n": 0}), (200, {"n": 1}), (200, {"n": 2})
    ]  # fmt: skip


def test_a_later_head_sent_slowly_is_closed_but_an_idle_kept_alive_connection_is_not(caplog):
    caplog.set_level(logging.INFO, logger="dynamo.common.http_server")

    async def scenario():
        async with _serving() as (runner, port):
            slow_r, slow_w = await asyncio.open_connection("127.0.0.1", port)
            idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)
            for writer in (slow_w, idle_w):
                writer.write(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
            for reader in (slow_r, idle_r):
                assert (await asyncio.wait_for(_read_response(reader), 10))[0] == 200
            # Idle for longer than the head bound before the second head starts: the bound
            # runs from its first byte, not from the previous response.
            idle_wait = asyncio.ensure_future(idle_r.read(1))
            done, _ = await asyncio.wait([idle_wait], timeout=HEAD_S * 2)
            assert not done, "an idle kept-alive connection was closed by the head bound"

            trickler = _trickle(slow_w, b"GET /ok HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"y" * 100)
            try:
                took = await _closed(slow_r, 10)
            finally:
                trickler.cancel()
            # The idle one still serves.
            idle_w.write(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
            first = await asyncio.wait_for(idle_wait, 10)
            rest = await asyncio.wait_for(idle_r.readuntil(b"\r\n\r\n"), 10)
            for writer in (slow_w, idle_w):
                writer.close()
            return took, first + rest, runner.deadlines.closed

    took, idle_answer, closed = asyncio.run(scenario())
    assert HEAD_S - 0.1 <= took < HEAD_S + MARGIN_S, took
    assert idle_answer.startswith(b"HTTP/1.1 200")
    assert closed == 1
    assert any(
        f"no complete request head within {HEAD_S:g} s" in r.getMessage() for r in caplog.records
    )


def test_a_pipelined_head_waiting_behind_a_long_stream_is_not_cut():
    async def scenario():
        async with _serving() as (runner, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            # The second head is sent once the first response streams; it waits, complete,
            # while the first streams for 3x the head bound.
            writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            writer.write(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
            stream = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 30)
            second = await asyncio.wait_for(_read_response(reader), 10)
            writer.close()
            return head, stream, second

    head, stream, second = asyncio.run(scenario())
    assert head.startswith(b"HTTP/1.1 200")
    assert stream.count(b"x") == int(3 * HEAD_S / 0.1)
    assert second[0] == 200


def test_the_request_plane_answers_a_trickled_body_408():
    async def generate(request):
        yield {"finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": 0}

    async def scenario():
        app = web.Application()
        add_request_plane_routes(app, generate, lambda: True, served_model_name="m")
        async with _serving(app) as (runner, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            status, _, body = await asyncio.wait_for(_read_response(reader), 10)
            closed_after = await _closed(reader, 10)
            writer.close()
            return status, json.loads(body), closed_after

    status, body, closed_after = asyncio.run(scenario())
    assert status == 408
    assert f"did not arrive within {BODY_S:g} s" in body["error"]
    assert closed_after < MARGIN_S


def test_the_body_timeout_is_a_timeout_to_aiohttp():
    # aiohttp's lingering read of an unread body catches asyncio.TimeoutError: no traceback.
    assert issubclass(RequestBodyTimeout, asyncio.TimeoutError)
    with pytest.raises(asyncio.TimeoutError):
        raise RequestBodyTimeout("x")


def test_a_client_gone_while_aiohttp_writes_is_no_traceback(caplog):
    from dynamo.common.http_server import ProtocolLogger

    caplog.set_level(logging.DEBUG)
    ProtocolLogger("test service").exception(
        "Error handling request from %s", "127.0.0.1",
        exc_info=ConnectionResetError("Cannot write to closing transport"),
    )  # fmt: skip
    assert not any(r.levelno >= logging.WARNING or r.exc_info for r in caplog.records)
    assert any("went away" in r.getMessage() for r in caplog.records)


DRIBBLED_HEAD = b"GET /ok HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"y" * 100


@pytest.mark.parametrize(
    "leading, dribble",
    [
        (b"\r\n\r\n", DRIBBLED_HEAD),  # a blank line that looks like a head's end
        (b"\r\n\r\n\r\n\r\n", DRIBBLED_HEAD),
        (b"\n\n", DRIBBLED_HEAD),
        (b"\r\n", b"\r\n" * 100),  # blank lines only, forever
        (b"", b"\r\n\r\n" + DRIBBLED_HEAD),  # the blank lines dribbled too
    ],
)
@pytest.mark.parametrize("kept_alive", [False, True])
def test_leading_blank_lines_do_not_stop_the_head_clock(leading, dribble, kept_alive):
    async def scenario():
        async with _serving() as (runner, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            if kept_alive:  # a later request: its clock starts at its first byte
                writer.write(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
                assert (await asyncio.wait_for(_read_response(reader), 10))[0] == 200
            writer.write(leading)
            began = time.monotonic()

            trickler = _trickle(writer, dribble)
            try:
                await _closed(reader, 10)
            finally:
                trickler.cancel()
                writer.close()
            return time.monotonic() - began, runner.deadlines.closed

    took, closed = asyncio.run(scenario())
    assert took < HEAD_S + MARGIN_S, took
    assert closed == 1


def test_a_request_after_blank_lines_is_served():
    async def scenario():
        async with _serving() as (runner, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"\r\n\r\n\r\nGET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await asyncio.wait_for(_read_response(reader), 10)
            writer.close()
            return answer[0]

    assert asyncio.run(scenario()) == 200

"""Through the real processes: the drain's one deadline and its endings, malformed HTTP, slow
request heads, and a long prompt through the request plane (issue 14).

Streams longer than the drain come from the mock engine's slow token time (--mock-token-ms),
never from a sleep in the test.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import socket
import threading
import time
import urllib.parse

import pytest

from tests.support import wait_until
from tests.support.bad_requests import MALFORMED_HEADS
from tests.support.processes import listening_url, start_frontend, start_worker

pytestmark = pytest.mark.integration

MODEL = "drain-model"
DRAIN_S = 2.0
# What the process may take after the deadline: the endings (2 s bound), closing the rest, exit.
AFTER_DEADLINE_S = 6.0
WORKER_PLANE_LINE = r"Request plane listening on (http://[^\s]+)"


def _chat(
    url: str, *, stream: bool, max_tokens: int, content: str = "hi"
) -> http.client.HTTPResponse:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=60)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
        "ignore_eos": True,
    }  # fmt: skip: the echoed prompt's EOS must not end the stream
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})  # fmt: skip
    return conn.getresponse()


@pytest.fixture
def pair(tmp_path):
    discovery = tmp_path / "discovery"
    worker = start_worker(
        "worker", tmp_path, discovery, MODEL, "--mock-token-ms", "200",
        "--drain-timeout", str(DRAIN_S), "--mock-max-model-len", "2000000",
    )  # fmt: skip
    frontend = start_frontend("frontend", tmp_path, discovery, "--dyn-drain-timeout", str(DRAIN_S))
    try:
        worker.wait_for_log("Worker serving model")
        url = listening_url(frontend)
        wait_until(lambda: f'"{MODEL}"' in _get(url, "/v1/models"), deadline_s=30, what="model")
        yield worker, frontend, url
    finally:
        frontend.stop()
        worker.stop()


def _long_plane_request(worker) -> http.client.HTTPResponse:
    """1000 tokens (EOS ignored) asked of the worker's request plane directly: the streaming
    response, answered 200."""
    plane = urllib.parse.urlsplit(listening_url(worker, WORKER_PLANE_LINE))
    conn = http.client.HTTPConnection(plane.netloc, timeout=60)
    body = {"request_id": "r1", "model": MODEL, "token_ids": [1, 2],
            "sampling": {"max_tokens": 1000, "ignore_eos": True}}  # fmt: skip
    conn.request("POST", "/generate", json.dumps(body))
    response = conn.getresponse()
    assert response.status == 200
    return response


def _get(url: str, path: str) -> str:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=10)
    conn.request("GET", path)
    return conn.getresponse().read().decode()


def _read_stream_in_thread(response, events: list, done: threading.Event) -> threading.Thread:
    def read():
        try:
            for line in response:  # http.client undoes the chunked framing; a broken body raises
                line = line.decode().strip()
                if line.startswith("data: "):
                    events.append(line[6:])
            events.append("<eof>")
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion
            events.append(f"<broken: {exc!r}>")
        finally:
            done.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_the_frontend_drain_keeps_one_deadline_and_ends_cut_streams_with_an_error_and_done(pair):
    worker, frontend, url = pair
    response = _chat(url, stream=True, max_tokens=1000)  # 200 s of tokens: longer than the drain
    assert response.status == 200
    events: list[str] = []
    done = threading.Event()
    _read_stream_in_thread(response, events, done)
    wait_until(lambda: len(events) >= 2, deadline_s=30, what="the first tokens")
    began = time.monotonic()
    frontend.signal()
    assert frontend.wait_exit(DRAIN_S + AFTER_DEADLINE_S + 5) == 0
    took = time.monotonic() - began
    assert took < DRAIN_S + AFTER_DEADLINE_S, f"exit {took:.1f} s after SIGTERM:\n{frontend.log()}"
    assert took >= DRAIN_S - 0.5, "the stream was cut before its deadline"
    assert done.wait(10)
    assert events[-1] == "<eof>", events[-3:]
    assert events[-2] == "[DONE]", events[-3:]
    error = json.loads(events[-3])["error"]
    assert error["code"] == "draining" and error["type"] == "service_unavailable_error", error
    assert "Drain done: 0 request(s) finished, 1 cut short at the deadline" in frontend.log()
    assert "Traceback" not in frontend.log()


def test_the_worker_drain_ends_cut_streams_with_an_in_band_error_line(pair):
    worker, frontend, url = pair
    response = _long_plane_request(worker)
    lines: list[str] = []
    first = response.readline()
    lines.append(first.decode())
    began = time.monotonic()
    worker.signal()
    rest = response.read().decode()  # a broken chunked body would raise IncompleteRead
    lines.extend(line for line in rest.splitlines() if line.strip())
    assert worker.wait_exit(DRAIN_S + AFTER_DEADLINE_S + 5) == 0
    took = time.monotonic() - began
    assert took < DRAIN_S + AFTER_DEADLINE_S, f"exit {took:.1f} s after SIGTERM:\n{worker.log()}"
    assert "cut short" in json.loads(lines[-1])["error"], lines[-2:]
    assert "Traceback" not in worker.log()


BAD_HEADS = [
    *MALFORMED_HEADS,
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGARBAGE AGAIN\r\n\r\n",
]


def test_malformed_http_gets_400_and_no_traceback_in_either_log(pair):
    worker, frontend, url = pair
    plane = listening_url(worker, WORKER_PLANE_LINE)
    for base in (url, plane):
        parts = urllib.parse.urlsplit(base)
        for head in BAD_HEADS:
            with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
                sock.sendall(head)
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(65536):
                    pass
    frontend.wait_for_log("Malformed HTTP request to the HTTP service from")
    worker.wait_for_log("Malformed HTTP request to the request plane from")
    assert "Traceback" not in frontend.log() and "Traceback" not in worker.log()
    assert "Error handling request" not in frontend.log() + worker.log()


async def _closed_after(reader) -> float:
    began = time.monotonic()
    try:
        while await asyncio.wait_for(reader.read(65536), 60):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - began


async def _trickle(writer, data: bytes) -> None:
    for byte in data:
        writer.write(bytes([byte]))
        await asyncio.sleep(1.0)  # the slow client's pace: one byte a second


async def _unfinished_first_head(host, port) -> float:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never the blank line
    try:
        return await _closed_after(reader)
    finally:
        writer.close()


def _content_length(head: bytes) -> int:
    match = re.search(rb"Content-Length: (\d+)", head)
    assert match is not None, head
    return int(match.group(1))


async def _slow_later_head(host, port) -> float:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    length = _content_length(head)
    await reader.readexactly(length)
    trickler = asyncio.ensure_future(_trickle(writer, b"GET /health HTTP/1.1\r\nHost: x" * 4))
    try:
        return await _closed_after(reader)
    finally:
        trickler.cancel()
        writer.close()


async def _slow_body(host, port, path: str) -> tuple[float, int, dict]:
    reader, writer = await asyncio.open_connection(host, port)
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 100}]})
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    began = time.monotonic()
    trickler = asyncio.ensure_future(_trickle(writer, body.encode()))
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
        took = time.monotonic() - began
        length = _content_length(head)
        answer = json.loads(await reader.readexactly(length))
        await _closed_after(reader)
        return took, int(head.split()[1]), answer
    finally:
        trickler.cancel()
        writer.close()


def test_slow_heads_and_bodies_are_cut_at_their_bounds_on_both_listeners(pair):
    """The real 20 s bounds, all at once: a first head never finished, a later head trickled on
    a kept-alive connection, and a body trickled to the frontend and to the request plane."""
    from dynamo.common.http_server import BODY_TIMEOUT_S, HEADER_TIMEOUT_S

    worker, frontend, url = pair
    front = urllib.parse.urlsplit(url)
    plane = urllib.parse.urlsplit(listening_url(worker, WORKER_PLANE_LINE))

    async def scenario():
        return await asyncio.gather(
            _unfinished_first_head(front.hostname, front.port),
            _slow_later_head(front.hostname, front.port),
            _slow_later_head(plane.hostname, plane.port),
            _slow_body(front.hostname, front.port, "/v1/chat/completions"),
            _slow_body(plane.hostname, plane.port, "/generate"),
        )

    first_head, later_head, plane_later_head, front_body, plane_body = asyncio.run(scenario())
    for took in (first_head, later_head, plane_later_head):
        assert HEADER_TIMEOUT_S - 1 <= took < HEADER_TIMEOUT_S + 5, took
    took, status, answer = front_body
    assert BODY_TIMEOUT_S - 1 <= took < BODY_TIMEOUT_S + 5, took
    assert status == 408 and answer["error"]["code"] == "request_timeout", answer
    took, status, answer = plane_body
    assert BODY_TIMEOUT_S - 1 <= took < BODY_TIMEOUT_S + 5, took
    assert status == 408 and "did not arrive within" in answer["error"], answer
    frontend.wait_for_log("HTTP service from 127.0.0.1: no complete request head within 20 s")
    frontend.wait_for_log("Request body to the HTTP service from 127.0.0.1 not complete within")
    worker.wait_for_log("request plane from 127.0.0.1: no complete request head within 20 s")
    worker.wait_for_log("Request body to the request plane from 127.0.0.1 not complete within")
    # One line per kind: the two frontend head cuts share one (rate-limited) line.
    assert frontend.count("no complete request head within") == 1
    assert "Traceback" not in frontend.log() + worker.log()


def test_a_long_prompt_the_frontend_accepts_reaches_the_worker(pair):
    worker, frontend, url = pair
    # ~900 kB of one-character words: the frontend's 1 MiB limit takes it; its token ids on the
    # request plane are several times larger.
    response = _chat(url, stream=False, max_tokens=1, content="a " * 450_000)
    body = response.read().decode()
    assert response.status == 200, body[:500]


def test_a_rank_that_dies_ends_the_worker_with_exit_1_and_one_error_line(tmp_path):
    import os
    import re
    import signal

    worker = start_worker(
        "ranks", tmp_path, tmp_path / "discovery", MODEL, "--tensor-parallel-size", "2",
        "--self-benchmark-points", "10000000", "--fpm-gc-policy", "freeze",
        "--mock-heap-objects", "0",
    )  # fmt: skip
    try:
        pids = worker.wait_for_log(r"Started 2 rank process\(es\) \[(\d+), (\d+)\]")
        worker.wait_for_log("GC policy started")
        os.kill(int(pids.group(2)), signal.SIGKILL)
        assert worker.wait_exit(60) == 1
        log = worker.log()
        assert len(re.findall(r"ERROR", log)) == 1, log
        assert "rank(s) 1" in log and "was killed by signal SIGKILL (9)" in log, log
        assert "Traceback" not in log, log
        assert "Stopping the GC policy failed" not in log, log
        assert "left unfrozen (no serving freeze follows)" in log, log
    finally:
        worker.stop()


def test_a_rank_that_dies_while_serving_ends_the_worker_at_once(tmp_path):
    """SIGKILL of a rank while streams are in flight: exit 1 within a bound, one ERROR line naming
    the rank, its pid and the signal, both streams (the frontend's SSE and the request plane's
    NDJSON) ended with an error, the record gone, no traceback."""
    import os
    import signal

    discovery = tmp_path / "discovery"
    worker = start_worker(
        "ranks", tmp_path, discovery, MODEL, "--tensor-parallel-size", "2",
        "--mock-token-ms", "200", "--mock-max-model-len", "100000",
    )  # fmt: skip
    frontend = start_frontend("frontend", tmp_path, discovery)
    try:
        pids = worker.wait_for_log(r"Started 2 rank process\(es\) \[(\d+), (\d+)\]")
        worker.wait_for_log("Worker serving model")
        assert len(list(discovery.glob("*.json"))) == 1
        url = listening_url(frontend)
        wait_until(lambda: f'"{MODEL}"' in _get(url, "/v1/models"), deadline_s=30, what="model")
        sse = _chat(url, stream=True, max_tokens=1000)  # 200 s of tokens
        assert sse.status == 200
        events: list[str] = []
        sse_done = threading.Event()
        _read_stream_in_thread(sse, events, sse_done)
        ndjson = _long_plane_request(worker)
        ndjson.readline()
        wait_until(lambda: len(events) >= 2, deadline_s=30, what="the first SSE tokens")

        killed = int(pids.group(2))
        began = time.monotonic()
        os.kill(killed, signal.SIGKILL)
        rest = ndjson.read().decode()  # a broken chunked body would raise IncompleteRead
        assert worker.wait_exit(20) == 1
        took = time.monotonic() - began
        log = worker.log()
        assert took < 10, f"exit {took:.1f} s after the rank died:\n{log}"

        errors = [line for line in log.splitlines() if " ERROR " in line or "ERROR" in line]
        assert len(errors) == 1, log
        assert f"rank 1 (pid {killed}) was killed by signal SIGKILL (9) while serving" in errors[0]
        assert "Traceback" not in log, log
        last = json.loads(rest.splitlines()[-1])
        assert "the engine died" in last["error"] and "rank 1" in last["error"], rest[-300:]
        # The record went first, then the engine (the other rank reaped) and the GC state.
        assert not list(discovery.glob("*.json"))
        assert log.index("ERROR") < log.index("Model unregistered") < log.index("Engine shut down")
        assert "Worker stopped after its engine died (exit 1)" in log
        assert not _alive(int(pids.group(1))), "the other rank outlived the worker"

        assert sse_done.wait(20)
        assert events[-2:] == ["[DONE]", "<eof>"], events[-3:]
        error = json.loads(events[-3])["error"]
        # The client is told the worker failed, no more: the engine's words (and the worker's
        # address) are the log's, not the client's.
        assert error["type"] == "service_unavailable_error", error
        assert error["message"] == "the model's worker failed during the request", error
    finally:
        frontend.stop()
        worker.stop()


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers signal 0 until its parent reaps it; the rank's parent is gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][:1] != "Z"
    except FileNotFoundError:
        return False

"""What a worker's answer can cost the request plane's client (issue 19, items 3 and 4): an error
answer read up to a small limit and never inflated, a stream read line by line within its
budget, every item validated. The worker is a hostile aiohttp server on 127.0.0.1
(tests/support/hostile_worker.py); the client is the frontend's own session.

Memory is measured two ways with generous margins: tracemalloc's peak (every Python allocation,
the inflated chunks aiohttp would make among them) and the process's peak RSS.
"""

from __future__ import annotations

import asyncio
import functools
import json
import resource
import tracemalloc
import zlib

import pytest

from dynamo.frontend.routing.worker_router import create_worker_session
from dynamo.runtime import request_plane
from dynamo.runtime.request_plane import (
    ERROR_BODY_LIMIT,
    MAX_LINE_BYTES,
    STREAM_BASE_BYTES,
    RequestRefused,
    WorkerProtocolError,
    WorkerUnavailable,
    generate,
)
from tests.support.hostile_worker import endless, hostile_worker, raw

DEADLINE_S = 30.0
MAX_TOKEN_ID = 100
REQUEST = {"request_id": "r1", "model": "m", "token_ids": [5, 6], "sampling": {"max_tokens": 4}}
# What the bomb inflates to: far more than any bound, so inflating it would show.
BOMB_BYTES = 256 * 1024 * 1024
# Generous margins: the client's own allocations for one answer are a few hundred KB.
PYTHON_PEAK_LIMIT = 16 * 1024 * 1024
RSS_GROWTH_LIMIT_KB = 96 * 1024


@functools.cache
def bomb(wbits: int = 31) -> bytes:
    """:data:`BOMB_BYTES` of ``{"error": "000..."`` compressed (gzip: wbits 31, zlib: 15)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    out = [packer.compress(b'{"error": "')]
    zeros = b"0" * (1024 * 1024)
    out.extend(packer.compress(zeros) for _ in range(BOMB_BYTES // len(zeros)))
    out.append(packer.compress(b'", "field": "token_ids"}\n'))
    out.append(packer.flush())
    return b"".join(out)


async def _ask(endpoint: str, request: dict = REQUEST) -> list:
    session = create_worker_session()
    try:
        return [
            item async for item in generate(session, endpoint, request, max_token_id=MAX_TOKEN_ID)
        ]
    finally:
        await session.close()


def ask(answer, request: dict = REQUEST):
    """The items the client reads from a worker answering ``answer``, or the exception it
    raised; with the worker's counters and the client's Python allocation peak."""

    async def scenario():
        async with hostile_worker(answer) as worker:
            tracemalloc.start()
            try:
                try:
                    result = await _ask(worker.endpoint, request)
                except Exception as exc:  # noqa: BLE001 - the test looks at which one
                    result = exc
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            return result, worker, peak

    return asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S))


def _rss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# --- an error answer ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "encoding", "wbits"),
    [
        (500, "gzip", 31),
        (400, "gzip", 31),  # a refusal inside the bomb is never read: not the client's 400
        (503, "deflate", 15),
        (500, "GZip", 31),
        (500, " gzip ", 31),
        (502, "x-gzip", 31),
        (500, "gzip, identity", 31),
    ],
)
def test_an_encoded_error_answer_is_never_inflated(status, encoding, wbits):
    rss_before = _rss_kb()
    result, worker, peak = ask(
        raw([bomb(wbits)], status=status, headers={"Content-Encoding": encoding})
    )
    assert type(result) is WorkerUnavailable, result
    assert f"worker answered {status}: " in str(result)
    assert "000" not in str(result)  # nothing of the inflated body
    assert peak < PYTHON_PEAK_LIMIT, peak
    assert _rss_kb() - rss_before < RSS_GROWTH_LIMIT_KB


def test_a_compressed_body_that_does_not_say_so_is_read_as_bytes_up_to_the_limit():
    result, _, peak = ask(raw([bomb()], status=500))
    assert type(result) is WorkerUnavailable
    message = str(result)
    assert "\x00" not in message and "\n" not in message and "\x1f" not in message
    assert len(message) < 1000  # the escaped, truncated start of at most 4 KiB of bytes
    assert peak < PYTHON_PEAK_LIMIT


@pytest.mark.parametrize("status", [400, 404, 500, 503])
def test_an_oversized_error_body_is_cut_at_the_limit_without_waiting_for_its_end(status):
    # 8 MiB of refusal-looking JSON, then the connection held open: the client stops at its
    # limit, so it neither reads the rest nor waits for an end that never comes.
    padding = json.dumps({"error": "x" * (8 * 1024 * 1024), "field": "token_ids"}).encode()
    result, _, peak = ask(raw([padding], status=status, hold=True))
    assert type(result) is WorkerUnavailable, result  # cut JSON is no refusal
    message = str(result)
    assert message.startswith(f"worker answered {status}: ") and "more)" in message
    assert len(message) < 1000
    assert peak < PYTHON_PEAK_LIMIT


def test_an_error_body_just_within_the_limit_is_a_refusal():
    body = json.dumps({"error": "too long", "field": "token_ids", "pad": "p" * 3000}).encode()
    assert len(body) <= ERROR_BODY_LIMIT
    result, _, _ = ask(raw([body], status=400))
    assert isinstance(result, RequestRefused) and result.field == "token_ids"


@pytest.mark.parametrize(
    "text",
    [
        "bad\x00byte",
        "line one\nWARNING dynamo.frontend forged line",
        "\r\x1b[2Jrepaint",
        "\u2028separator",
        "\ud800 lone surrogate",
    ],
)
def test_worker_text_in_an_error_is_escaped(text):
    body = text.encode("utf-8", errors="surrogatepass")
    result, _, _ = ask(raw([body], status=500))
    message = str(result)
    assert type(result) is WorkerUnavailable
    assert all(ch.isprintable() for ch in message), repr(message)


@pytest.mark.parametrize("field", ["model", "card", "../x", "token_ids.1e3", "sampling.__class__"])
def test_a_refusal_naming_no_request_field_is_the_workers_fault(field):
    result, _, _ = ask(raw([json.dumps({"error": "no", "field": field}).encode()], status=400))
    assert type(result) is WorkerUnavailable


# --- the stream --------------------------------------------------------------------------------


def _line(item: object) -> bytes:
    return json.dumps(item).encode() + b"\n"


GOOD = _line({"token_ids": [7]})
FINISH = _line({"finish_reason": "length", "prompt_tokens": 2, "completion_tokens": 1})

BAD_ITEMS: dict[str, bytes] = {
    "id beyond the vocabulary": _line({"token_ids": [MAX_TOKEN_ID + 1]}),
    "huge id": _line({"token_ids": [2**70]}),
    "negative id": _line({"token_ids": [-1]}),
    "float id": _line({"token_ids": [1.0]}),
    "bool id": _line({"token_ids": [True]}),
    "string id": _line({"token_ids": ["5"]}),
    "null id": _line({"token_ids": [None]}),
    "no ids": _line({"token_ids": []}),
    "ids not a list": _line({"token_ids": "abc"}),
    "ids an object": _line({"token_ids": {"0": 1}}),
    "nothing": _line({}),
    "finish_reason int": _line({"finish_reason": 5, "prompt_tokens": 2, "completion_tokens": 1}),
    "finish_reason unknown": _line(
        {"finish_reason": "abort", "prompt_tokens": 2, "completion_tokens": 1}
    ),
    "finish_reason upper case": _line(
        {"finish_reason": "STOP", "prompt_tokens": 2, "completion_tokens": 1}
    ),
    "finish_reason null": _line(
        {"finish_reason": None, "prompt_tokens": 2, "completion_tokens": 1}
    ),
    "finish_reason list": _line(
        {"finish_reason": ["stop"], "prompt_tokens": 2, "completion_tokens": 1}
    ),
    "negative count": _line({"finish_reason": "stop", "prompt_tokens": -1, "completion_tokens": 1}),
    "float count": _line({"finish_reason": "stop", "prompt_tokens": 2, "completion_tokens": 1.5}),
    "bool count": _line({"finish_reason": "stop", "prompt_tokens": True, "completion_tokens": 1}),
    "string count": _line({"finish_reason": "stop", "prompt_tokens": "2", "completion_tokens": 1}),
    "count over 2**31": _line(
        {"finish_reason": "stop", "prompt_tokens": 2, "completion_tokens": 2**31}
    ),
    "count missing": _line({"finish_reason": "stop", "prompt_tokens": 2}),
    "finish with an id beyond the vocabulary": _line(
        {"finish_reason": "stop", "prompt_tokens": 2, "completion_tokens": 1, "token_ids": [999]}
    ),
    "error not a string": _line({"error": {"nested": 1}}),
    "not json": b"garbage\n",
    "invalid utf-8": b"\xff\xfe\xfd\n",
    "deep nesting": b"[" * 50_000 + b"\n",
    "a list": b"[1, 2]\n",
    "a string": b'"token_ids"\n',
    "null": b"null\n",
    "NaN id": b'{"token_ids": [NaN]}\n',
    "line over the bound": b'{"token_ids": [1' + b", 1" * MAX_LINE_BYTES + b"]}\n",
    "line over the bound, never ended": b'{"token_ids": [1' + b", 1" * MAX_LINE_BYTES,
}


@pytest.mark.parametrize("where", ["first", "after a good item"])
@pytest.mark.parametrize("kind", sorted(BAD_ITEMS))
def test_every_bad_item_is_a_protocol_error(kind, where):
    lines = [BAD_ITEMS[kind]] if where == "first" else [GOOD, BAD_ITEMS[kind]]
    result, _, _ = ask(raw(lines))
    if kind == "error not a string":
        assert type(result) is WorkerProtocolError, result
    assert isinstance(result, WorkerProtocolError), (kind, result)
    assert all(ch.isprintable() for ch in str(result))
    assert len(str(result)) < 2000


@pytest.mark.parametrize(
    ("kind", "lines"),
    [
        ("garbage after the finish line", [GOOD, FINISH, b"garbage\n"]),
        ("a step after the finish line", [FINISH, GOOD]),
        ("two finish lines", [FINISH, FINISH]),
        ("an error after the finish line", [FINISH, _line({"error": "late"})]),
    ],
)
def test_nothing_may_follow_the_finish_line(kind, lines):
    result, _, _ = ask(raw(lines))
    assert isinstance(result, WorkerProtocolError), (kind, result)
    assert "after its finish line" in str(result)


def test_blank_lines_after_the_finish_line_are_allowed():
    result, _, _ = ask(raw([GOOD, FINISH, b"\n\r\n  \n"]))
    assert [type(item).__name__ for item in result] == ["TokenStep", "Finish"]


@pytest.mark.parametrize("max_tokens", [1, 4, 64])
def test_a_stream_over_its_byte_budget_is_a_protocol_error(max_tokens):
    # Valid small items without end: the budget (64 KiB + 256 B per allowed token) ends it.
    request = {**REQUEST, "sampling": {"max_tokens": max_tokens}}
    result, worker, peak = ask(endless([], GOOD), request)
    assert isinstance(result, WorkerProtocolError)
    assert "budget" in str(result)
    budget = STREAM_BASE_BYTES + request_plane.STREAM_BYTES_PER_TOKEN * max_tokens
    # What the client took is within its budget (the rest sits in socket buffers at most).
    assert peak < PYTHON_PEAK_LIMIT and budget < 2 * 1024 * 1024


def test_no_stream_is_read_past_the_absolute_bound_whatever_max_tokens_allows(monkeypatch):
    """Issue 37: max_tokens 2^31 made a budget of ~512 GiB; MAX_STREAM_BYTES ends any stream
    (made 512 KiB here, so the test reads that much, not 256 MiB)."""
    monkeypatch.setattr(request_plane, "MAX_STREAM_BYTES", 512 * 1024)
    request = {**REQUEST, "sampling": {"max_tokens": 2**31 - 1}}
    result, worker, _ = ask(endless([], GOOD * 100), request)
    assert isinstance(result, WorkerProtocolError) and "budget" in str(result), result
    assert worker.hung_up == 1


def test_a_compressed_stream_is_not_inflated():
    rss_before = _rss_kb()
    result, _, peak = ask(raw([bomb()], headers={"Content-Encoding": "gzip"}))
    assert isinstance(result, WorkerProtocolError), result
    assert peak < PYTHON_PEAK_LIMIT
    assert _rss_kb() - rss_before < RSS_GROWTH_LIMIT_KB


def test_a_worker_error_line_is_unavailable_not_protocol_and_escaped():
    result, _, _ = ask(raw([GOOD, _line({"error": "boom\n\x00forged"})]))
    assert type(result) is WorkerUnavailable
    assert str(result) == "worker failed: boom\\n\\x00forged"

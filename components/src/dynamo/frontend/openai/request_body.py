"""Reading a request body: one JSON value, or the client's 400 (408 when it does not arrive).

Python's JSON decoder is more lenient than JSON, and aiohttp's body read can fail in ways that are
the client's fault; each becomes an OpenAI-shaped error naming the problem, never a 500.

What a body may be is decided from the head, before a byte of it is read, and before a client
that asked (``Expect: 100-continue``) is told to send it (:func:`expect_handler`): its declared
length within the limit (else 413), no content coding (else 415: the listener does not
decompress, so a compressed body can cost no more than its own bytes).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import hdrs, web

from dynamo.common.http_server import RequestBodyTimeout, is_malformed_http
from dynamo.runtime import peer_text

from . import protocol as oai

# What a request body may say in Content-Encoding: nothing, or that it is not encoded.
IDENTITY = ("", "identity")


def body_refusal(request: web.BaseRequest) -> oai.ApiError | None:
    """Why the body this head announces is refused before it is read, or None."""
    encoding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
    if encoding not in IDENTITY:
        return oai.ApiError(
            415,
            f"Content-Encoding {peer_text.escape(encoding, 40)!r} is not supported: send the "
            "body unencoded",
            type="invalid_request_error",
            code="unsupported_content_encoding",
        )
    length, limit = request.content_length, request.client_max_size
    if length is not None and length > limit:
        return oai.ApiError(
            413,
            f"request body of {length} bytes is over the limit of {limit} bytes",
            type="invalid_request_error",
            code="request_too_large",
        )
    return None


async def expect_handler(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue``: the ``100 Continue`` only for a body that will be read (a
    refusal is answered instead, and the body never comes); any other expectation is a 417."""
    expect = request.headers.get(hdrs.EXPECT, "").strip().lower()
    error: oai.ApiError | None
    if expect != "100-continue":
        error = oai.ApiError(
            417,
            f"Expect {peer_text.escape(expect, 40)!r} is not supported (only 100-continue)",
            type="invalid_request_error",
            code="expectation_failed",
        )
    else:
        error = body_refusal(request)
    if error is not None:
        response = web.json_response(error.body(), status=error.status)
        response.force_close()  # the body, if the client sends it anyway, is never read
        return response
    if request.version >= (1, 1):
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # as aiohttp's own handler: the answer has not begun
    return None


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


async def read_json_body(request: web.Request) -> Any:
    """The decoded body; a 400 naming the problem for anything the decoder cannot take.

    Python's decoder is lenient where JSON is not (``NaN``, ``Infinity``), fails with a
    RecursionError on deep nesting, and decodes ``"\\ud800"`` to a lone surrogate that no
    tokenizer (and no UTF-8 encoder) accepts: each is the client's error, not a 500. A body
    that does not arrive within the listener's bound is a 408.
    """
    refused = body_refusal(request)
    if refused is not None:
        raise refused
    try:
        raw = await request.read()
    except RequestBodyTimeout as exc:  # the listener's body deadline (logged there, once)
        raise oai.ApiError(
            408, f"{exc}: send the whole body at once", type="invalid_request_error",
            code="request_timeout",
        ) from None  # fmt: skip
    except Exception as exc:
        if not is_malformed_http(exc):
            raise
        # A body aiohttp cannot read: a broken chunked body, a Content-Encoding it cannot undo.
        raise oai.invalid_request(
            f"request body could not be read: {_payload_problem(exc)}", code="invalid_body"
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise oai.invalid_request(
            f"request body is not valid UTF-8 (byte {raw[exc.start]:#04x} at {exc.start})",
            code="invalid_json",
        ) from None
    try:
        body = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise oai.invalid_request(
            "request body is nested too deeply to decode", code="invalid_json"
        ) from None
    except ValueError as exc:  # JSONDecodeError, a number over the int digit limit
        raise oai.invalid_request(
            f"request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise oai.invalid_request(
            "request body contains text that is not valid Unicode (a lone surrogate "
            f"{exc.object[exc.start : exc.end]!r}, escaped as \\ud800-\\udfff without its pair)",
            code="invalid_text",
        ) from None
    except RecursionError:
        raise oai.invalid_request(
            "request body is nested too deeply to decode", code="invalid_json"
        ) from None
    return body


def _payload_problem(exc: BaseException) -> str:
    cause = exc.__cause__ or exc
    return " ".join(str(getattr(cause, "message", None) or cause).split()) or type(cause).__name__

"""Reading a request body: one JSON value, or the client's 400 (408 when it does not arrive).

Python's JSON decoder is more lenient than JSON, and aiohttp's body read can fail in ways that are
the client's fault; each becomes an OpenAI-shaped error naming the problem, never a 500.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from dynamo.common.http_server import RequestBodyTimeout, is_malformed_http

from . import openai_protocol as oai


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


async def read_json_body(request: web.Request) -> Any:
    """The decoded body; a 400 naming the problem for anything the decoder cannot take.

    Python's decoder is lenient where JSON is not (``NaN``, ``Infinity``), fails with a
    RecursionError on deep nesting, and decodes ``"\\ud800"`` to a lone surrogate that no
    tokenizer (and no UTF-8 encoder) accepts: each is the client's error, not a 500. A body
    that does not arrive within the listener's bound is a 408.
    """
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

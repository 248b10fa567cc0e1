"""How the frontend ends a request its drain cuts short (see dynamo.common.request_drain).

A stream that started gets a final SSE error event in the OpenAI error shape (code
``draining``), then ``data: [DONE]`` and a proper end of the chunked body, so a client reads a
complete stream that says why it ended. A request whose response had not started gets the same
error as a 503.
"""

from __future__ import annotations

import json

from aiohttp import web

from dynamo.common.request_drain import RequestDrain
from dynamo.frontend.openai import protocol as oai

CUT_SHORT_MESSAGE = (
    "the frontend is shutting down: the request was cut short at the end of its drain"
)


def _error() -> oai.ApiError:
    return oai.service_unavailable(CUT_SHORT_MESSAGE, code="draining")


async def end_cut_stream(response: web.StreamResponse) -> None:
    for data in (json.dumps(_error().body(), separators=(",", ":")), "[DONE]"):
        await response.write(f"data: {data}\n\n".encode())
    await response.write_eof()


def refuse_cut_request() -> web.Response:
    error = _error()
    return web.json_response(error.body(), status=error.status)


def frontend_drain() -> RequestDrain:
    return RequestDrain(what="HTTP service", end_stream=end_cut_stream, refuse=refuse_cut_request)

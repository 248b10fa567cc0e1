"""The request plane from frontend to worker: HTTP on loopback, streamed as NDJSON.

Wire format (one place, used by both ends):

* ``POST <endpoint>/generate`` with a JSON body
  ``{"request_id": str, "token_ids": [int, ...], "max_tokens": int}``;
* the response is ``application/x-ndjson``: one ``{"token_ids": [int, ...]}`` line per step,
  then one final ``{"finish_reason": "stop" | "length", "prompt_tokens": int,
  "completion_tokens": int}`` line. A failure after the stream started is sent as a final
  ``{"error": str}`` line; a bad request before it started is an HTTP 400.
* ``GET <endpoint>/health`` answers 200 while the worker serves, 503 while it drains.

Closing the connection aborts the request in the worker (the handler's generator is cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, AsyncIterator, Callable

import aiohttp
from aiohttp import web

from dynamo.common.request_drain import mark_stream

logger = logging.getLogger(__name__)

GENERATE_PATH = "/generate"
HEALTH_PATH = "/health"

GenerateHandler = Callable[[dict], AsyncIterator[dict]]


class WorkerUnavailable(Exception):
    """The worker could not be reached, or went away before the stream finished."""


class BadGenerateRequest(ValueError):
    pass


def validate_generate_request(body: Any) -> dict:
    if not isinstance(body, dict):
        raise BadGenerateRequest("body must be a JSON object")
    token_ids = body.get("token_ids")
    if not isinstance(token_ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in token_ids
    ):
        raise BadGenerateRequest("token_ids must be a list of integers")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadGenerateRequest("max_tokens must be a positive integer")
    request_id = body.get("request_id", "")
    if not isinstance(request_id, str):
        raise BadGenerateRequest("request_id must be a string")
    return {"request_id": request_id, "token_ids": token_ids, "max_tokens": max_tokens}


def add_request_plane_routes(
    app: web.Application,
    generate: GenerateHandler,
    is_healthy: Callable[[], bool],
) -> None:
    """Mount the worker side of the request plane on an aiohttp app."""

    async def handle_generate(request: web.Request) -> web.StreamResponse:
        try:
            body = validate_generate_request(await request.json())
        except ValueError as exc:  # bad JSON, bad UTF-8 (UnicodeDecodeError), bad fields
            return web.json_response({"error": str(exc)}, status=400)
        if not is_healthy():
            return web.json_response({"error": "worker is draining"}, status=503)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        mark_stream(request, response)  # a drain that cuts it short ends it with an error line
        try:
            # aclosing: an abort closes the engine's stream now, not when the GC finds it.
            async with contextlib.aclosing(generate(body)) as stream:
                async for item in stream:
                    await response.write(json.dumps(item).encode() + b"\n")
        except asyncio.CancelledError:
            raise  # the caller hung up and aiohttp cancelled the handler: the stream is closed
        except ConnectionResetError:
            # The caller hung up between two writes: the request is aborted (stream closed
            # above). An expected event, not a server error worth a traceback.
            logger.info("Request %s aborted: the caller closed the connection", body["request_id"])
            return response
        except Exception as exc:  # noqa: BLE001 - reported to the caller in-band
            logger.exception("generate failed for request %s", body["request_id"])
            await response.write(json.dumps({"error": str(exc)}).encode() + b"\n")
        await response.write_eof()
        return response

    async def handle_health(request: web.Request) -> web.Response:
        healthy = is_healthy()
        return web.json_response(
            {"status": "ok" if healthy else "draining"}, status=200 if healthy else 503
        )

    app.router.add_post(GENERATE_PATH, handle_generate)
    app.router.add_get(HEALTH_PATH, handle_health)


def _parse_line(line: bytes) -> dict:
    """One NDJSON item; anything else means the stream is not ours to trust."""
    try:
        item = json.loads(line)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError, a line cut short
        raise WorkerUnavailable(f"worker sent a malformed line: {line[:200]!r}") from None
    if not isinstance(item, dict):
        # e.g. ["finish_reason"] would otherwise pass the `in` tests below
        raise WorkerUnavailable(f"worker sent a line that is not an object: {line[:200]!r}")
    return item


async def generate(
    session: aiohttp.ClientSession, endpoint: str, request: dict
) -> AsyncIterator[dict]:
    """Stream one request's items from a worker. Raises :class:`WorkerUnavailable`."""
    url = endpoint.rstrip("/") + GENERATE_PATH
    try:
        async with session.post(url, json=request) as response:
            if response.status != 200:
                text = await response.text()
                raise WorkerUnavailable(f"worker answered {response.status}: {text[:200]}")
            finished = False
            async for line in response.content:
                if not line.strip():
                    continue
                item = _parse_line(line)
                if "error" in item:
                    raise WorkerUnavailable(f"worker failed: {item['error']}")
                if "finish_reason" in item:
                    finished = True
                yield item
            if not finished:
                raise WorkerUnavailable("worker closed the stream before finishing")
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as exc:
        raise WorkerUnavailable(f"worker at {endpoint} unreachable: {exc}") from exc



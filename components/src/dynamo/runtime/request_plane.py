"""The request plane from frontend to worker: HTTP on loopback, streamed as NDJSON.

Wire format v2 (one place, used by both ends):

* ``POST <endpoint>/generate`` with a JSON body (:class:`GenerateRequest`)::

      {"request_id": str, "model": str, "token_ids": [int, ...],
       "sampling": {SamplingOptions as JSON}}

  ``model`` is the served name the frontend routed on; ``token_ids`` is the prompt in the model's
  own vocabulary (the frontend applied the model's chat template and tokenizer, named by the
  worker's model card); ``sampling`` is :class:`dynamo.runtime.sampling.SamplingOptions`.
  The worker validates the body again (it does not trust its peer): a bad field is an HTTP 400
  ``{"error": str, "field": "sampling.temperature"}`` naming it, and so is a ``model`` that is not
  the name this worker serves, and a prompt its engine refuses (longer than the context, an id
  outside the vocabulary).
* the response is ``application/x-ndjson``: one ``{"token_ids": [int, ...]}`` line per step
  (every generated token, EOS and stop tokens included: the frontend detokenizes, hides special
  tokens and is authoritative for stop strings), then one final ``{"finish_reason": "stop" |
  "length", "prompt_tokens": int, "completion_tokens": int}`` line. ``stop``: the engine ended on
  an EOS or stop token id, or on a stop string it matched itself; ``length``: ``max_tokens`` or
  the model's context length was reached. A failure after the stream started is sent as a final
  ``{"error": str}`` line.
* ``GET <endpoint>/health`` answers 200 while the worker serves, 503 while it drains.

Closing the connection aborts the request in the worker (the handler's generator is cancelled):
that is how the frontend ends a completion at a stop string it matched.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from dynamo.common.http_server import RequestBodyTimeout, is_malformed_http
from dynamo.common.request_drain import mark_stream
from dynamo.runtime.sampling import SamplingOptions

logger = logging.getLogger(__name__)

GENERATE_PATH = "/generate"
HEALTH_PATH = "/health"


class GenerateRequest(BaseModel):
    """The body of ``POST /generate``, validated on both ends."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    request_id: StrictStr
    # The served name the frontend routed on; the worker refuses any other.
    model: Annotated[StrictStr, Field(min_length=1)]
    token_ids: Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]
    sampling: SamplingOptions


GenerateHandler = Callable[[GenerateRequest], AsyncIterator[dict]]


class WorkerUnavailable(Exception):
    """The worker could not be reached, or went away before the stream finished."""


class RequestRefused(Exception):
    """The worker refused the request itself (a 400 naming ``token_ids...`` or ``sampling...``):
    its engine checks the prompt or a sampling field more strictly than the frontend did.
    Another instance of the model would refuse it too, so it is the client's 400, not a reason
    to fail over. ``field`` is the request-plane field the worker named."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


# Fields whose refusal is about the request, not the worker (see RequestRefused).
CLIENT_FIELDS = ("token_ids", "sampling")


class BadGenerateRequest(ValueError):
    """A request the worker refuses with a 400; ``field`` names the offending field, if one."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class StreamFailed(Exception):
    """A stream the engine cannot finish, for a cause logged once where it was noticed (the
    engine died): sent as the in-band error line, without a traceback per request."""


def validate_generate_request(body: Any) -> GenerateRequest:
    """The body as a :class:`GenerateRequest`; raises :class:`BadGenerateRequest` naming the
    first bad field (``sampling.top_p``, ``token_ids.3``, ...)."""
    if not isinstance(body, dict):
        raise BadGenerateRequest("body must be a JSON object")
    try:
        return GenerateRequest.model_validate(body)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        field = ".".join(str(part) for part in error["loc"])
        raise BadGenerateRequest(f"{field}: {error['msg']}", field=field) from None


async def _read_json(request: web.Request) -> Any:
    """The decoded body; :class:`BadGenerateRequest` for anything that is not one JSON value
    (bad JSON or UTF-8, nesting deeper than the decoder's recursion limit, a body aiohttp cannot
    read: a broken chunked body, a Content-Encoding it cannot undo)."""
    try:
        raw = await request.read()
    except RequestBodyTimeout:
        raise
    except Exception as exc:
        if not is_malformed_http(exc):
            raise
        cause = exc.__cause__ or exc
        raise BadGenerateRequest(f"body could not be read: {cause}") from None
    try:
        return json.loads(raw)
    except RecursionError:
        raise BadGenerateRequest("body is nested too deeply to decode") from None
    except ValueError as exc:  # bad JSON, bad UTF-8 (UnicodeDecodeError), huge integers
        raise BadGenerateRequest(f"body is not valid JSON: {exc}") from None


def _bad_request(exc: BadGenerateRequest) -> web.Response:
    body = {"error": str(exc)}
    if exc.field is not None:
        body["field"] = exc.field
    return web.json_response(body, status=400)


def add_request_plane_routes(
    app: web.Application,
    generate: GenerateHandler,
    is_healthy: Callable[[], bool],
    *,
    served_model_name: str | Callable[[], str],
) -> None:
    """Mount the worker side of the request plane on an aiohttp app.

    ``served_model_name`` is the name this worker serves (or a callable returning it, for a
    name known only once the engine has started); a request for any other model is a 400.
    ``generate`` may raise :class:`BadGenerateRequest` before its first item (a prompt the
    engine refuses): that is a 400 too, since nothing was streamed yet.
    """

    def served_name() -> str:
        return served_model_name() if callable(served_model_name) else served_model_name

    async def handle_generate(request: web.Request) -> web.StreamResponse:
        try:
            body = validate_generate_request(await _read_json(request))
        except BadGenerateRequest as exc:
            return _bad_request(exc)
        except RequestBodyTimeout as exc:  # the listener's body deadline (logged there, once)
            return web.json_response({"error": str(exc)}, status=408)
        if not is_healthy():
            return web.json_response({"error": "worker is draining"}, status=503)
        if body.model != served_name():
            return _bad_request(
                BadGenerateRequest(
                    f"model {body.model!r} is not served here (this worker serves "
                    f"{served_name()!r})",
                    field="model",
                )
            )
        # aclosing: an abort closes the engine's stream now, not when the GC finds it.
        async with contextlib.aclosing(generate(body)) as stream:
            first: dict | None = None
            failure: Exception | None = None
            try:
                # The first item before the response starts: a prompt the engine refuses is a
                # 400, not a 200 with an error line.
                first = await stream.__anext__()
            except BadGenerateRequest as exc:
                return _bad_request(exc)
            except StopAsyncIteration:
                pass
            except Exception as exc:  # noqa: BLE001 - reported to the caller in-band, below
                failure = exc
            response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
            await response.prepare(request)
            mark_stream(request, response)  # a drain that cuts it short ends it with an error line
            try:
                if failure is not None:
                    raise failure
                if first is not None:
                    await response.write(json.dumps(first).encode() + b"\n")
                    async for item in stream:
                        await response.write(json.dumps(item).encode() + b"\n")
            except asyncio.CancelledError:
                raise  # the caller hung up and aiohttp cancelled the handler: stream closed
            except StreamFailed as exc:
                await response.write(json.dumps({"error": str(exc)}).encode() + b"\n")
            except ConnectionResetError:
                # The caller hung up between two writes: the request is aborted (the stream is
                # closed on leaving this block). An expected event, not a server error worth a
                # traceback.
                logger.info("Request %s aborted: the caller closed the connection", body.request_id)
                return response
            except Exception as exc:  # reported to the caller in-band
                logger.exception("generate failed for request %s", body.request_id)
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


def _refusal(status: int, text: str) -> RequestRefused | None:
    """A worker's 400 that names a request field (see :class:`RequestRefused`), else None: a
    400 naming ``model`` or no field means the two ends disagree, which is the worker's side."""
    if status != 400:
        return None
    try:
        body = json.loads(text)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    field, error = body.get("field"), body.get("error")
    if not isinstance(field, str) or not isinstance(error, str):
        return None
    if field.split(".", 1)[0] not in CLIENT_FIELDS:
        return None
    return RequestRefused(error, field)


async def generate(
    session: aiohttp.ClientSession, endpoint: str, request: GenerateRequest | dict
) -> AsyncIterator[dict]:
    """Stream one request's items from a worker. Raises :class:`WorkerUnavailable`, or
    :class:`RequestRefused` before the first item for a 400 about the request itself.

    ``request`` is a :class:`GenerateRequest` (or its JSON form as a dict).
    """
    url = endpoint.rstrip("/") + GENERATE_PATH
    if isinstance(request, GenerateRequest):
        request = request.model_dump(mode="json")
    try:
        async with session.post(url, json=request) as response:
            if response.status != 200:
                text = await response.text()
                refused = _refusal(response.status, text)
                if refused is not None:
                    raise refused
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

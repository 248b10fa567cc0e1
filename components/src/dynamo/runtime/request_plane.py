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
import json
import logging
from collections.abc import AsyncGenerator
from typing import Annotated, Any

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

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
) -> AsyncGenerator[dict, None]:
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

"""The frontend's side of the request plane: one request streamed from a worker, read as a peer's
words.

The wire format is :mod:`dynamo.runtime.request_plane`'s. The worker is a peer
(docs/security.md), so :func:`generate` reads what it answers as a peer's words: an error
answer up to :data:`ERROR_BODY_LIMIT` bytes, never decompressed (the session's
``auto_decompress`` is off); a stream line by line, each at most :data:`MAX_LINE_BYTES`, the
whole stream within a byte budget that grows with ``max_tokens``; every line validated as an
item (:func:`~dynamo.runtime.request_plane.parse_item`), its token ids within the model's
vocabulary. A worker that breaks any of it is a :class:`WorkerProtocolError`. Every fragment of
a worker's text an exception carries is escaped (:func:`dynamo.runtime.peer_text.escape`):
exceptions are for log lines, never for a client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator

import aiohttp

from dynamo.runtime import peer_text
from dynamo.runtime.request_plane import (
    GENERATE_PATH,
    WITHDRAWN_FIELD,
    Finish,
    GenerateRequest,
    PromptLogprobs,
    RequestRefused,
    StreamItem,
    WorkerProtocolError,
    WorkerUnavailable,
    WorkerWithdrawn,
    parse_item,
)
from dynamo.runtime.sampling import SamplingOptions

# How much of a worker's error answer (a non-200 status) is read: enough for a refusal naming its
# field, never a body a worker chose to make large (or to compress).
ERROR_BODY_LIMIT = 4096
# The longest line of a stream. An engine step is a few ids (~10 bytes each); a line this long is
# a worker that does not speak the wire format.
MAX_LINE_BYTES = 64 * 1024
# What a whole stream may take: a base, plus this much per token the request allows (an item of
# one id is ~25 bytes; the budget is ten times that), so a worker can make the frontend read at
# most about 64 KiB + 256 B x max_tokens for one request, whatever it sends.
STREAM_BASE_BYTES = 64 * 1024
STREAM_BYTES_PER_TOKEN = 256
# With logprobs, each token carries up to k + 1 [id, logprob] pairs (~30 bytes each): the budget
# grows by this much per pair, so asking for 20 alternatives allows ~1.6 KiB per token.
STREAM_BYTES_PER_LOGPROB = 64


def _json_object(text: str) -> dict:
    """The JSON object ``text`` holds, or an empty one (not JSON, not an object)."""
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, deep nesting
        return {}
    return body if isinstance(body, dict) else {}


def _refusal(status: int, text: str) -> RequestRefused | None:
    """A worker's 400 that names a request field (see :class:`RequestRefused`), else None: a
    400 naming ``model`` or no field means the two ends disagree, which is the worker's side."""
    if status != 400:
        return None
    body = _json_object(text)
    field, error = body.get("field"), body.get("error")
    if not isinstance(field, str) or not isinstance(error, str):
        return None
    if not _is_client_field(field):
        return None
    return RequestRefused(peer_text.escape(error), field)


def _is_client_field(field: str) -> bool:
    """Whether ``field`` is a request field as the wire format names them (``token_ids``,
    ``token_ids.<index>``, ``sampling`` or ``sampling.<a SamplingOptions field>``): the field
    a refusal names becomes the ``param`` of the client's 400, so nothing else gets through."""
    head, _, rest = field.partition(".")
    if head == "token_ids":
        return not rest or (rest.isascii() and rest.isdigit() and len(rest) <= 12)
    if head == "sampling":
        return not rest or rest in SamplingOptions.model_fields
    return False


async def generate(
    session: aiohttp.ClientSession,
    endpoint: str,
    request: GenerateRequest | dict,
    *,
    max_token_id: int | None = None,
) -> AsyncGenerator[StreamItem, None]:
    """Stream one request's items from a worker, each validated (:func:`parse_item`, with the
    model's largest id ``max_token_id``). Raises :class:`WorkerUnavailable` (its subclass
    :class:`WorkerProtocolError` for an answer that breaks the wire format), or
    :class:`RequestRefused` before the first item for a 400 about the request itself.

    ``request`` is a :class:`GenerateRequest` (or its JSON form as a dict). The session must
    not decompress (``auto_decompress=False``: see the module docstring).
    """
    url = endpoint.rstrip("/") + GENERATE_PATH
    if isinstance(request, GenerateRequest):
        request = request.model_dump(mode="json")
    logprobs = request["sampling"].get("logprobs")
    per_token = STREAM_BYTES_PER_TOKEN
    if logprobs is not None:
        per_token += STREAM_BYTES_PER_LOGPROB * (int(logprobs) + 1)
    budget = STREAM_BASE_BYTES + per_token * int(request["sampling"]["max_tokens"])
    line_limit = MAX_LINE_BYTES
    prompt: PromptLogprobs | None = None
    if request["sampling"].get("prompt_logprobs") is not None:
        alternatives = int(request["sampling"]["prompt_logprobs"])
        prompt = PromptLogprobs(token_ids=tuple(request["token_ids"]), alternatives=alternatives)
        extra = (STREAM_BYTES_PER_LOGPROB * (alternatives + 1) + 16) * len(prompt.token_ids)
        budget += extra
        line_limit += extra  # they all come on the first line
    try:
        async with session.post(url, json=request) as response:
            if response.status != 200:
                raise await _failure(response)
            finished = False
            async for line in _lines(response.content, budget, line_limit):
                if finished:
                    raise WorkerProtocolError("worker sent a line after its finish line")
                item = parse_item(line, max_token_id, logprobs, prompt)
                prompt = None  # the first item's only
                finished = isinstance(item, Finish)
                yield item
            if not finished:
                raise WorkerUnavailable("worker closed the stream before finishing")
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as exc:
        raise WorkerUnavailable(
            f"worker at {peer_text.escape(endpoint)} unreachable: "
            f"{peer_text.escape(str(exc) or type(exc).__name__)}"
        ) from exc


async def _failure(response: aiohttp.ClientResponse) -> Exception:
    """What a non-200 answer means: :class:`RequestRefused` (a 400 naming a request field) or
    :class:`WorkerUnavailable`. At most :data:`ERROR_BODY_LIMIT` bytes of it are read; a body
    the worker says is encoded is not read at all (it would have to be inflated)."""
    body = b""
    if response.headers.get("Content-Encoding", "identity").strip().lower() == "identity":
        while len(body) < ERROR_BODY_LIMIT:
            chunk = await response.content.read(ERROR_BODY_LIMIT - len(body))
            if not chunk:
                break
            body += chunk
    text = body.decode("utf-8", errors="replace")
    refused = _refusal(response.status, text)
    if refused is not None:
        return refused
    if response.status == 503 and _json_object(text).get(WITHDRAWN_FIELD) is True:
        return WorkerWithdrawn("withdrawn for a GC maintenance")
    return WorkerUnavailable(f"worker answered {response.status}: {peer_text.escape(text)}")


async def _lines(
    content: aiohttp.StreamReader, budget: int, line_limit: int = MAX_LINE_BYTES
) -> AsyncIterator[bytes]:
    """The non-blank lines of a stream, each at most ``line_limit`` bytes, all of them
    within ``budget`` bytes; raises :class:`WorkerProtocolError` past either bound."""
    pending = bytearray()
    searched = 0  # pending[:searched] has no newline: each byte is searched once (a line
    # trickled in small chunks would otherwise be searched whole at each: quadratic)
    async for chunk in content.iter_any():
        budget -= len(chunk)
        if budget < 0:
            raise WorkerProtocolError(
                "worker sent more than the stream's budget of bytes for its max_tokens"
            )
        pending += chunk
        while (end := pending.find(b"\n", searched)) >= 0:
            if end > line_limit:
                break
            line = bytes(pending[:end])
            del pending[: end + 1]
            searched = 0
            if line.strip():
                yield line
        else:
            searched = len(pending)
        if len(pending) > line_limit and pending.find(b"\n", 0, line_limit + 1) < 0:
            raise WorkerProtocolError(f"worker sent a line over {line_limit} bytes")
    if pending.strip():
        yield bytes(pending)  # the last line, without its newline

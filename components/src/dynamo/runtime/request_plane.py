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
  ``{"error": str}`` line. When the request asked for ``sampling.logprobs`` (k), every item
  with ids carries ``"logprobs"``: per id, ``[[id, logprob], ...]``, the sampled id first, then
  at most k alternatives (vLLM's order), each logprob finite, at most 0, -inf sent as -9999.0
  (an addition of v2: an older worker is never asked for it, see ``ADDED_FIELDS``). With
  ``sampling.prompt_logprobs`` (k), the first item carries ``"prompt_logprobs"``: one entry per
  prompt id, null for the first (it has no context), then ``[[id, logprob], ...]`` with the
  prompt's own id first and at most k alternatives, and ``"prompt_ranks"``: the rank of each
  prompt id among the vocabulary's (null for the first; the alternatives are ranks 1..k, the
  prompt's own id left out of them when it is one). Each line
  is one of the item models below (:class:`TokenStep`, :class:`Finish`, :class:`StreamError`).
* ``GET <endpoint>/health`` answers 200 while the worker serves, 503 while it drains (and while
  it is withdrawn for a GC maintenance). A withdrawn worker answers ``POST /generate`` with 503
  ``{"error": str, "withdrawn": true}``: :class:`WorkerWithdrawn`, "another instance, now".

Closing the connection aborts the request in the worker (the handler's generator is cancelled):
that is how the frontend ends a completion at a stop string it matched.

The worker is a peer (docs/security.md), so the client (:func:`generate`) reads what
it answers as a peer's words: an error answer up to :data:`ERROR_BODY_LIMIT` bytes, never
decompressed (the session's ``auto_decompress`` is off); a stream line by line, each at most
:data:`MAX_LINE_BYTES`, the whole stream within a byte budget that grows with ``max_tokens``
up to :data:`MAX_STREAM_BYTES`; every line validated as an item, its token ids within the
model's vocabulary. A worker that breaks any of it is a :class:`WorkerProtocolError`. Every
fragment of a worker's text an exception carries is escaped
(:func:`dynamo.runtime.peer_text.escape`): exceptions are for log lines, never for a client.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any, Literal

import aiohttp
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from dynamo.runtime import peer_text
from dynamo.runtime.sampling import MAX_LOGPROBS, SamplingOptions
from dynamo.runtime.stream_logprobs import (
    PromptLogprobs,
    logprobs_problem,
    prompt_logprobs_problem,
)

logger = logging.getLogger(__name__)

GENERATE_PATH = "/generate"
HEALTH_PATH = "/health"
WITHDRAWN_FIELD = "withdrawn"
WITHDRAWN_MESSAGE = "worker withdrawn for GC maintenance: send the request to another instance"


class GenerateRequest(BaseModel):
    """The body of ``POST /generate``, validated on both ends."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The frontend's completion id (and choice index): a short, plain name, safe in a log line.
    request_id: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]
    # The served name the frontend routed on; the worker refuses any other.
    model: Annotated[StrictStr, Field(min_length=1)]
    token_ids: Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]
    sampling: SamplingOptions


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
# Whatever max_tokens and the card say, no stream (nor its first line) is read past this: what
# one request may cost the frontend in bytes read and parsed from a worker (at ~100 MB/s of
# parsing, seconds of CPU). vLLM streams a token a line (~25 bytes): a whole 10M-token context
# fits, or ~400k tokens with 20 logprobs each.
MAX_STREAM_BYTES = 256 * 1024**2
# The bound of every count a worker reports (a 32-bit count: no context is longer).
MAX_COUNT = 2**31 - 1

TokenId = Annotated[StrictInt, Field(ge=0)]
Count = Annotated[StrictInt, Field(ge=0, le=MAX_COUNT)]
# vLLM's floor for -inf; JSON's NaN and Infinity are refused (allow_inf_nan is off).
Logprob = Annotated[StrictFloat, Field(ge=-9999.0, le=0.0, allow_inf_nan=False)]
# One generated token's log probabilities: the sampled id's, then the alternatives'.
LogprobPosition = Annotated[
    tuple[tuple[TokenId, Logprob], ...], Field(min_length=1, max_length=MAX_LOGPROBS + 1)
]
Logprobs = tuple[LogprobPosition, ...] | None


class TokenStep(BaseModel):
    """One engine step: the ids it generated (EOS and stop tokens included)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    token_ids: Annotated[tuple[TokenId, ...], Field(min_length=1)]
    logprobs: Logprobs = None
    # The first item's, when asked for: one per prompt id, None for the first.
    prompt_logprobs: tuple[LogprobPosition | None, ...] | None = None
    # With them: each prompt id's rank in the vocabulary (vLLM's Logprob.rank), None for the first.
    prompt_ranks: tuple[Annotated[StrictInt, Field(ge=1, le=MAX_COUNT)] | None, ...] | None = None


class Finish(BaseModel):
    """The last item of a stream that finished: why, and the worker's counts. A worker may put
    the last step's ids on this line too."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    finish_reason: Literal["stop", "length"]
    prompt_tokens: Count
    completion_tokens: Count
    token_ids: tuple[TokenId, ...] = ()
    logprobs: Logprobs = None


class StreamError(BaseModel):
    """The last item of a stream the worker could not finish."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    error: StrictStr


StreamItem = TokenStep | Finish


class WorkerUnavailable(Exception):
    """The worker could not be reached, or went away before the stream finished. Its message
    is for the log (escaped); a client is told no more than that the worker failed."""


class WorkerWithdrawn(WorkerUnavailable):
    """The worker is withdrawn for a GC maintenance: alive, not failing; another instance of the
    model takes the request now (it is neither benched nor a client's error)."""


class WorkerProtocolError(WorkerUnavailable):
    """The worker answered something that is not the wire format (a malformed or oversized
    line, an invalid item, an id outside the vocabulary, a stream over its budget)."""


class RequestRefused(Exception):
    """The worker refused the request itself (a 400 naming ``token_ids...`` or ``sampling...``):
    its engine checks the prompt or a sampling field more strictly than the frontend did.
    Another instance of the model would refuse it too, so it is the client's 400, not a reason
    to fail over. ``field`` is the request-plane field the worker named."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


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


def parse_item(
    line: bytes,
    max_token_id: int | None = None,
    logprobs: int | None = None,
    prompt: PromptLogprobs | None = None,
) -> StreamItem:
    """One NDJSON line of a stream as its item; raises :class:`WorkerProtocolError` for
    anything that is not one (and :class:`WorkerUnavailable` for the worker's own error line).
    ``max_token_id``: the largest id the model has (None: not checked); ``logprobs``: the
    alternatives per token the request asked for (None: it asked for no logprobs); ``prompt``:
    the prompt logprobs this item must carry (the first item's, when asked for), else None."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, deep nesting
        raise WorkerProtocolError(
            f"worker sent a malformed line: {peer_text.escape(line)}"
        ) from None
    if not isinstance(data, dict):
        raise WorkerProtocolError(
            f"worker sent a line that is not an object: {peer_text.escape(line)}"
        )
    try:
        if "error" in data:
            failure = StreamError.model_validate(data)
            raise WorkerUnavailable(f"worker failed: {peer_text.escape(failure.error)}")
        item: StreamItem = (
            Finish.model_validate(data)
            if "finish_reason" in data
            else TokenStep.model_validate(data)
        )
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in error["loc"])
        raise WorkerProtocolError(
            f"worker sent an invalid item ({where}: {error['msg']}): {peer_text.escape(line)}"
        ) from None
    if max_token_id is not None:
        for token_id in item.token_ids:
            if token_id > max_token_id:
                raise WorkerProtocolError(
                    f"worker sent token id {token_id}, outside the model's vocabulary (largest "
                    f"id {max_token_id})"
                )
    problem = logprobs_problem(item, max_token_id, logprobs) or prompt_logprobs_problem(
        item, max_token_id, prompt
    )
    if problem is not None:
        raise WorkerProtocolError(problem)
    return item


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
    budget, line_limit = min(budget, MAX_STREAM_BYTES), min(line_limit, MAX_STREAM_BYTES)
    try:
        # A redirect is a peer's answer, never followed: it would re-send the prompt anywhere.
        async with session.post(url, json=request, allow_redirects=False) as response:
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
    the worker says is encoded is not read at all (it would have to be inflated). A redirect
    (never followed) is not the wire format: :class:`WorkerProtocolError`, its body unread."""
    if 300 <= response.status < 400:
        return WorkerProtocolError(
            f"worker answered {response.status}, a redirect (not followed) to "
            f"{peer_text.escape(response.headers.get('Location', ''))}"
        )
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

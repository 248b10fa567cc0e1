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

The frontend's side, which reads a worker's answer as a peer's words (bounded, validated,
escaped), is :mod:`dynamo.runtime.request_plane_client`; :func:`parse_item` here is the check of
one stream line that both it and the tests use.
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any, Literal

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

logger = logging.getLogger(__name__)

GENERATE_PATH = "/generate"
HEALTH_PATH = "/health"
WITHDRAWN_FIELD = "withdrawn"
WITHDRAWN_MESSAGE = "worker withdrawn for GC maintenance: send the request to another instance"


class GenerateRequest(BaseModel):
    """The body of ``POST /generate``, validated on both ends."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    request_id: StrictStr
    # The served name the frontend routed on; the worker refuses any other.
    model: Annotated[StrictStr, Field(min_length=1)]
    token_ids: Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]
    sampling: SamplingOptions


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
    _check_logprobs(item, max_token_id, logprobs)
    _check_prompt_logprobs(item, max_token_id, prompt)
    return item


class PromptLogprobs(BaseModel):
    """What the first item's ``prompt_logprobs`` must be: for these ``token_ids``, with at most
    ``alternatives`` each."""

    model_config = ConfigDict(frozen=True)

    token_ids: tuple[int, ...]
    alternatives: int


def _check_prompt_logprobs(
    item: StreamItem, max_token_id: int | None, asked: PromptLogprobs | None
) -> None:
    positions = getattr(item, "prompt_logprobs", None)
    ranks = getattr(item, "prompt_ranks", None)
    if asked is None:
        if positions is not None or ranks is not None:
            raise WorkerProtocolError("worker sent prompt logprobs where none belong")
        return
    if positions is None or len(positions) != len(asked.token_ids):
        raise WorkerProtocolError("worker sent no prompt logprobs, or not one per prompt id")
    if positions[0] is not None:
        raise WorkerProtocolError("worker sent prompt logprobs for the first prompt id")
    for token_id, position in zip(asked.token_ids[1:], positions[1:], strict=True):
        if position is None:
            raise WorkerProtocolError("worker sent a null prompt logprob after the first")
        _check_position(token_id, position, asked.alternatives, max_token_id)
    if ranks is None or [r is None for r in ranks] != [p is None for p in positions]:
        raise WorkerProtocolError("worker sent no prompt ranks, or not one per prompt logprob")


def _check_logprobs(item: StreamItem, max_token_id: int | None, asked: int | None) -> None:
    """An item's logprobs are what the request asked for: one position per id, the sampled id
    first, at most ``asked`` alternatives, every id in the vocabulary."""
    positions = item.logprobs
    if positions is None:
        if asked is not None and item.token_ids:
            raise WorkerProtocolError("worker sent token ids without the logprobs asked for")
        return
    if asked is None:
        raise WorkerProtocolError("worker sent logprobs the request did not ask for")
    if len(positions) != len(item.token_ids):
        raise WorkerProtocolError(
            f"worker sent {len(positions)} logprob position(s) for {len(item.token_ids)} id(s)"
        )
    for token_id, position in zip(item.token_ids, positions, strict=True):
        _check_position(token_id, position, asked, max_token_id)


def _check_position(
    token_id: int, position: LogprobPosition, asked: int, max_token_id: int | None
) -> None:
    if position[0][0] != token_id:
        raise WorkerProtocolError(
            f"worker sent logprobs whose first id {position[0][0]} is not the sampled id {token_id}"
        )
    if len(position) > asked + 1:
        raise WorkerProtocolError(
            f"worker sent {len(position) - 1} logprob alternatives, more than the {asked} asked for"
        )
    ids = [alternative for alternative, _ in position]
    if max_token_id is not None and max(ids) > max_token_id:
        raise WorkerProtocolError(
            f"worker sent a logprob for token id {max(ids)}, outside the model's vocabulary "
            f"(largest id {max_token_id})"
        )
    # vLLM's alternatives are its top k, best first, each id once: the frontend ranks them by
    # their order, so any other order or a repeated id would be a quietly wrong answer.
    ranked = [logprob for _, logprob in position[1:]]
    if len(set(ids)) != len(ids) or ranked != sorted(ranked, reverse=True):
        raise WorkerProtocolError("worker sent logprob alternatives repeated or out of rank order")

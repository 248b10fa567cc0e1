"""Log probabilities in OpenAI's shapes, as vLLM's OpenAI server builds them.

The worker sends, with every generated token, the log probabilities of the sampled token and of
up to ``k`` alternatives (``sampling.logprobs``; the request plane validates them: finite or
vLLM's -9999.0 floor, ids in the vocabulary, at most ``k + 1`` per token, the sampled token
first, as vLLM's sampler orders them). Here they become

* chat: ``logprobs.content[{token, logprob, bytes, top_logprobs[{token, logprob, bytes}]}]``,
  the first ``top_logprobs`` entries of each position (vLLM's ``_get_top_logprobs``);
* completions: ``logprobs{tokens, token_logprobs, top_logprobs, text_offset}``, each position's
  first ``logprobs + 1`` entries keyed by their text (vLLM's ``_create_completion_logprobs``),
  ``text_offset`` counting on from one chunk to the next.

Token strings are vLLM's ``decoded_token`` (:mod:`.token_strings`: each id alone, special tokens
shown, SentencePiece leading spaces restored, a split UTF-8 character completed from the
sequence's preceding ids), or ``token_id:<id>`` with ``return_tokens_as_token_ids``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Protocol

from pydantic import BaseModel, Field, StrictBool, StrictInt, model_validator

from dynamo.runtime.request_plane import LogprobPosition
from dynamo.runtime.sampling import MAX_LOGPROBS

from .fields import FieldRefused
from .token_strings import MAX_CONTEXT, TokenStrings


class Detokenizing(Protocol):
    """What the formatter needs of a model's processor (a ChatProcessor)."""

    def token_strings(self) -> TokenStrings: ...


# vLLM's floor for -inf (JSON has no infinity); the request plane already floors what it carries.
LOGPROB_FLOOR = -9999.0


def exceeded(count: int) -> str | None:
    """vLLM's refusal of more alternatives than ``--max-logprobs`` (its default, 20), or None."""
    if count > MAX_LOGPROBS:
        return (
            f"Requested sample logprobs of {count}, which is greater than max allowed: "
            f"{MAX_LOGPROBS}"
        )
    return None


LogprobsCount = Annotated[StrictInt, Field(ge=0)]
# One token's logprobs: its id, and its position (None: the prompt's first token has none).
Position = tuple[int, LogprobPosition | None]


class _LogprobsFields(BaseModel):
    """The logprobs fields of a request (mixed into each endpoint's request model)."""

    # Logprobs' tokens as "token_id:<id>" instead of their text, as in vLLM.
    return_tokens_as_token_ids: StrictBool | None = None
    # The prompt's logprobs with this many alternatives (vLLM's, -1: the whole vocabulary).
    prompt_logprobs: StrictInt | None = None
    LOGPROBS_PARAM: ClassVar[str] = "logprobs"

    def logprobs_asked(self) -> int | None:
        """The alternatives per token to ask the engine for (vLLM's SamplingParams.logprobs),
        None for no logprobs."""
        raise NotImplementedError

    def prompt_logprobs_asked(self) -> int | None:
        """The same for the prompt's tokens (vLLM's SamplingParams.prompt_logprobs)."""
        return self.prompt_logprobs

    @model_validator(mode="after")
    def _logprobs_bounded(self) -> Any:
        message = exceeded(self.logprobs_asked() or 0)
        if message is not None:  # vLLM's words, after the field's name
            param = self.LOGPROBS_PARAM
            raise FieldRefused(param, f"`{param}`: {message}", "invalid_value")
        return self

    @model_validator(mode="after")
    def _prompt_logprobs_bounded(self) -> Any:
        """vLLM's rules for ``prompt_logprobs``, in its words."""
        asked = self.prompt_logprobs
        if asked is None:
            return self
        message = None
        if getattr(self, "stream", None) and (asked > 0 or asked == -1):
            message = "`prompt_logprobs` are not available when `stream=True`."
        elif asked < -1:
            message = "`prompt_logprobs` must be a positive value or -1."
        elif asked == -1:  # the vocabulary, always over the bound (vLLM's default)
            message = (
                "`prompt_logprobs`: Requested prompt logprobs of the whole vocabulary (-1), "
                f"which is greater than max allowed: {MAX_LOGPROBS}"
            )
        elif asked > MAX_LOGPROBS:
            message = (
                f"`prompt_logprobs`: Requested prompt logprobs of {asked}, which is greater "
                f"than max allowed: {MAX_LOGPROBS}"
            )
        if message is not None:
            raise FieldRefused("prompt_logprobs", message, "invalid_value")
        return self


class ChatLogprobs(_LogprobsFields):
    logprobs: StrictBool | None = None
    top_logprobs: LogprobsCount | None = None
    LOGPROBS_PARAM: ClassVar[str] = "top_logprobs"

    def logprobs_asked(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> Any:
        if self.top_logprobs and not self.logprobs:  # vLLM's rule, in its words
            raise FieldRefused(
                "top_logprobs",
                "when using `top_logprobs`, `logprobs` must be set to true.",
                "invalid_value",
            )
        return self


class CompletionLogprobs(_LogprobsFields):
    logprobs: LogprobsCount | None = None

    def logprobs_asked(self) -> int | None:
        return self.logprobs

    def prompt_logprobs_asked(self) -> int | None:
        # vLLM: echo with logprobs puts the prompt's logprobs first, with as many alternatives
        # unless prompt_logprobs says how many.
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        return self.logprobs if getattr(self, "echo", None) else None


class LogprobsFormatter:
    """One choice's logprobs in its endpoint's shape (see the module docstring). The first
    ``prompt_positions`` positions it is given are the echoed prompt's (the first of them
    None), the rest the generated tokens': each has its own context for token strings."""

    def __init__(
        self, processor: Detokenizing, top: int, *, chat: bool, as_token_ids: bool = False
    ) -> None:
        self._strings = processor.token_strings()
        self._top = top
        self._chat = chat
        self._as_token_ids = as_token_ids
        self._offset = 0  # completions: the text_offset of the next token
        self.prompt_positions = 0
        self._formatted = 0
        self._contexts: tuple[list[int], list[int]] = ([], [])  # the prompt's, the generated

    def _strings_of(self, token_id: int, position: LogprobPosition | None) -> dict[int, str]:
        """The strings of a position's ids (vLLM's, :mod:`.token_strings`), in its context."""
        prompt = self._formatted < self.prompt_positions
        self._formatted += 1
        if self._as_token_ids:
            ids = [token_id] + [i for i, _ in position or ()]
            return {i: f"token_id:{i}" for i in ids}
        if position is None:  # the prompt's first: decoded alone (vLLM's completions server)
            return {token_id: self._strings.decode([token_id])}
        context = self._contexts[0 if prompt else 1]
        texts = {i: self._strings.token(i, context) for i, _ in position}
        context.append(token_id)
        del context[:-MAX_CONTEXT]
        return texts

    @staticmethod
    def _entry(text: str, logprob: float) -> dict[str, Any]:
        return {
            "token": text,
            "logprob": max(logprob, LOGPROB_FLOOR),
            "bytes": list(text.encode("utf-8", errors="replace")),
        }

    def format(self, positions: Sequence[Position]) -> dict[str, Any] | None:
        """The choice's ``logprobs`` for these tokens' positions; None for none."""
        if not positions:
            return None
        return self.chat(positions) if self._chat else self.completion(positions)

    def chat(self, positions: Sequence[Position]) -> dict[str, Any]:
        content = []
        for token_id, position in positions:
            assert position is not None, "a generated token's position always has logprobs"
            texts = self._strings_of(token_id, position)
            sampled_id, sampled = position[0]
            entry = self._entry(texts[sampled_id], sampled)
            entry["top_logprobs"] = [self._entry(texts[i], lp) for i, lp in position[: self._top]]
            content.append(entry)
        return {"content": content}

    def completion(self, positions: Sequence[Position]) -> dict[str, Any]:
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top_logprobs: list[dict[str, float] | None] = []
        text_offset: list[int] = []
        for token_id, position in positions:
            texts = self._strings_of(token_id, position)
            text = texts[token_id]
            tokens.append(text)
            if position is None:  # the prompt's first token: no context, no logprob (vLLM)
                token_logprobs.append(None)
                top_logprobs.append(None)
            else:
                token_logprobs.append(max(position[0][1], LOGPROB_FLOOR))
                top = position[: self._top + 1]
                top_logprobs.append({texts[i]: max(lp, LOGPROB_FLOOR) for i, lp in top})
            text_offset.append(self._offset)
            self._offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top_logprobs,
            "text_offset": text_offset,
        }


def formatter(request: Any, processor: Detokenizing, *, chat: bool) -> LogprobsFormatter | None:
    """The request's formatter, or None when it asked for no logprobs."""
    top = request.logprobs_asked()
    if top is None:
        return None
    as_ids = request.return_tokens_as_token_ids is True
    return LogprobsFormatter(processor, top, chat=chat, as_token_ids=as_ids)


def prompt_logprobs(
    processor: Detokenizing, positions: Sequence[Any], ranks: Sequence[int | None]
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs``: per prompt token, None for the first, then ``{token_id:
    {logprob, rank, decoded_token}}``, the prompt's own id first with its rank, the alternatives
    ranked 1..k without the prompt's own rank (vLLM's dictionary merges the two)."""
    strings = processor.token_strings()
    context: list[int] = []  # the prompt's ids so far (vLLM's context for a split character)
    result: list[dict[str, dict[str, Any]] | None] = []
    for position, rank in zip(positions, ranks, strict=True):  # validated: one per prompt id
        if position is None:
            result.append(None)
            continue
        alternatives = (r for r in itertools.count(1) if r != rank)
        entries: dict[str, dict[str, Any]] = {}
        for index, (alternative, logprob) in enumerate(position):
            entries[str(alternative)] = {
                "logprob": max(logprob, LOGPROB_FLOOR),
                "rank": rank if index == 0 else next(alternatives),
                "decoded_token": strings.token(alternative, context),
            }
        result.append(entries)
        context.append(position[0][0])
        del context[:-MAX_CONTEXT]
    return result


def attach(body: dict[str, Any], logprobs: dict[str, Any] | None) -> dict[str, Any]:
    """``body``'s (one) choice with ``logprobs`` set, when there are some."""
    if logprobs is not None:
        body["choices"][0]["logprobs"] = logprobs
    return body

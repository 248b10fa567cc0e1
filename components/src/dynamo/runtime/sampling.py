"""Sampling options as they travel over the request plane, validated on both ends.

The frontend turns an OpenAI request's sampling fields into one :class:`SamplingOptions`
(after it has checked them and named the offending field in its 400); the worker validates the
same model again (it must not trust its peer) and hands it to its engine: vLLM maps it onto
``SamplingParams``, the mock engine honours ``max_tokens``, ``stop``, ``stop_token_ids`` and
``ignore_eos``. The ranges are vLLM's own (``SamplingParams._verify_args``), so a request the
frontend accepts is one vLLM accepts.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_serializer,
)

# Strict: a JSON number (an integer is fine), never a string or a boolean ("0.5" and true are
# what a buggy peer sends; accepting them would hide the bug).
# The ranges of each field, named once: the frontend's OpenAI request models use the same types.
Penalty = Annotated[StrictFloat, Field(ge=-2.0, le=2.0)]
Temperature = Annotated[StrictFloat, Field(ge=0.0)]
TopP = Annotated[StrictFloat, Field(gt=0.0, le=1.0)]
TopK = Annotated[StrictInt, Field(ge=-1)]  # vLLM: 0 or -1 disables top-k
MinP = Annotated[StrictFloat, Field(ge=0.0, le=1.0)]
RepetitionPenalty = Annotated[StrictFloat, Field(gt=0.0)]
# vLLM's seed range (a C long).
Seed = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]
TokenCount = Annotated[StrictInt, Field(ge=1)]
MinTokens = Annotated[StrictInt, Field(ge=0)]
StopText = Annotated[StrictStr, Field(min_length=1)]
TokenId = Annotated[StrictInt, Field(ge=0)]
# vLLM clamps a logit bias to this range (SamplingParams.from_optional); so does the frontend.
LogitBias = Annotated[StrictFloat, Field(ge=-100.0, le=100.0)]
MAX_LOGIT_BIAS_TOKENS = 1024
MAX_ALLOWED_TOKEN_IDS = 1024
MAX_BAD_WORDS = 64
# The most alternatives a request may ask for per token: vLLM's default --max-logprobs (a
# worker whose vLLM allows fewer refuses more, naming sampling.logprobs).
MAX_LOGPROBS = 20
LogprobCount = Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)]
# Fields added to the wire format after its first release: sent only when set (not empty, not
# None), so a worker that predates them still takes every request that does not use them.
ADDED_FIELDS = ("logit_bias", "allowed_token_ids", "bad_words", "logprobs", "prompt_logprobs")


class SamplerFields(BaseModel):
    """The sampler's settings that a client's request and the request plane carry alike, with
    vLLM's types and ranges; None leaves the model's default (its generation config)."""

    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None

    def sampler_settings(self) -> dict[str, Any]:
        """These fields' values, by name (to build another model that has them)."""
        return {name: getattr(self, name) for name in SamplerFields.model_fields}


class SamplingOptions(SamplerFields):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # Already capped by the frontend so that prompt + completion fits the model's context.
    max_tokens: TokenCount
    min_tokens: MinTokens = 0
    # Stop strings, matched on the detokenized text. The frontend is authoritative (it hides
    # them from the output and ends the stream); engines that can match them too stop sooner.
    stop: tuple[StopText, ...] = ()
    # Token ids that end the completion with finish_reason "stop" (the card's EOS ids, unless
    # ignore_eos) and are not part of the returned text.
    stop_token_ids: tuple[TokenId, ...] = ()
    ignore_eos: StrictBool = False
    # (token id, bias) pairs added to the logits before sampling, as vLLM's logit_bias.
    logit_bias: Annotated[
        tuple[tuple[TokenId, LogitBias], ...], Field(max_length=MAX_LOGIT_BIAS_TOKENS)
    ] = ()
    # The only ids the sampler may pick (empty: any), as vLLM's allowed_token_ids.
    allowed_token_ids: Annotated[tuple[TokenId, ...], Field(max_length=MAX_ALLOWED_TOKEN_IDS)] = ()
    # Words the sampler must not produce, as vLLM's bad_words.
    bad_words: Annotated[tuple[StopText, ...], Field(max_length=MAX_BAD_WORDS)] = ()
    # Log probabilities of each generated token and of this many alternatives (vLLM's
    # SamplingParams.logprobs; 0: the sampled token's only); None: none are returned.
    logprobs: LogprobCount | None = None
    # The same for each prompt token (vLLM's SamplingParams.prompt_logprobs: a completion's
    # echo with logprobs); None: none are returned.
    prompt_logprobs: LogprobCount | None = None

    @model_serializer(mode="wrap")
    def _without_unset_additions(self, handler: Any) -> Any:
        data = handler(self)
        for name in ADDED_FIELDS:  # see ADDED_FIELDS
            if not is_set(getattr(self, name)):
                data.pop(name, None)
        return data

    @field_validator("min_tokens")
    @classmethod
    def _min_tokens_fit_max_tokens(cls, value: int, info: ValidationInfo) -> int:
        # vLLM refuses min_tokens > max_tokens too; named here, on the field, on both ends.
        max_tokens = info.data.get("max_tokens")
        if max_tokens is not None and value > max_tokens:
            raise ValueError(f"must be at most max_tokens ({max_tokens})")
        return value


def is_set(value: Any) -> bool:
    """Whether an added field's value asks for something (see :data:`ADDED_FIELDS`): ``0``
    logprobs does (the sampled token's), an empty tuple or None does not."""
    return value is not None and value != ()

"""Sampling options as they travel over the request plane, validated on both ends.

The frontend turns an OpenAI request's sampling fields into one :class:`SamplingOptions`
(after it has checked them and named the offending field in its 400); the worker validates the
same model again (it must not trust its peer) and hands it to its engine: vLLM maps it onto
``SamplingParams``, the mock engine honours ``max_tokens``, ``stop``, ``stop_token_ids`` and
``ignore_eos``. The ranges are vLLM's own (``SamplingParams._verify_args``), so a request the
frontend accepts is one vLLM accepts.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
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
    model_validator,
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
ADDED_FIELDS = (
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "structured_outputs",
    "logprobs",
    "prompt_logprobs",
    "reasoning_ended",
)
# A schema, regex or grammar is text the worker's engine compiles: each is bounded (in UTF-8
# bytes, as it travels), and so are a choice's options (docs/security.md).
MAX_STRUCTURED_TEXT_BYTES = 64 * 1024
MAX_CHOICES = 1024
# StructuredOutputs' constraints: exactly one is set (vLLM's StructuredOutputsParams rule).
CONSTRAINTS = ("json_schema", "regex", "choice", "grammar", "json_object", "structural_tag")


def _utf8_size(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))  # JSON allows lone surrogates


def _bounded_text(value: str) -> str:
    size = _utf8_size(value)
    if size > MAX_STRUCTURED_TEXT_BYTES:
        raise ValueError(f"is {size} bytes, over the limit of {MAX_STRUCTURED_TEXT_BYTES}")
    return value


StructuredText = Annotated[StrictStr, Field(min_length=1), AfterValidator(_bounded_text)]


class StructuredOutputs(BaseModel):
    """vLLM's ``StructuredOutputsParams`` as the request plane carries it: one constraint the
    engine compiles into a grammar. ``json_schema`` is vLLM's ``json`` (the schema's text: a
    name pydantic's BaseModel keeps for itself); ``structural_tag`` is vLLM's too (xgrammar's
    structural tag as JSON text, the client's or a forced tool call's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    json_schema: StructuredText | None = None
    regex: StructuredText | None = None
    choice: Annotated[tuple[StructuredText, ...], Field(min_length=1, max_length=MAX_CHOICES)] | (
        None
    ) = None
    grammar: StructuredText | None = None
    json_object: Literal[True] | None = None
    structural_tag: StructuredText | None = None
    disable_any_whitespace: StrictBool = False
    disable_additional_properties: StrictBool = False
    whitespace_pattern: StructuredText | None = None

    @model_serializer(mode="wrap")
    def _without_an_unset_tag(self, handler: Any) -> Any:
        # structural_tag is newer than the rest: sent only when set, so that a worker from
        # before it (extra="forbid") still takes the other constraints.
        data = handler(self)
        if self.structural_tag is None:
            data.pop("structural_tag", None)
        return data

    @model_validator(mode="after")
    def _one_constraint(self) -> StructuredOutputs:
        chosen = [name for name in CONSTRAINTS if getattr(self, name) is not None]
        if len(chosen) != 1:
            # vLLM's names (json is this model's json_schema): the client's error shows them.
            raise ValueError(
                "exactly one constraint of json, regex, choice, grammar, json_object, "
                "structural_tag must be set"
            )
        if self.choice is not None and sum(map(_utf8_size, self.choice)) > (
            MAX_STRUCTURED_TEXT_BYTES
        ):
            raise ValueError(f"choice is over the limit of {MAX_STRUCTURED_TEXT_BYTES} bytes")
        return self


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
    # The output forced into a shape (vLLM's structured outputs); None: free text.
    structured_outputs: StructuredOutputs | None = None
    # Log probabilities of each generated token and of this many alternatives (vLLM's
    # SamplingParams.logprobs; 0: the sampled token's only); None: none are returned.
    logprobs: LogprobCount | None = None
    # The same for each prompt token (vLLM's SamplingParams.prompt_logprobs: a completion's
    # echo with logprobs); None: none are returned.
    prompt_logprobs: LogprobCount | None = None
    # Where structured_outputs' grammar starts, as vLLM's generate() takes it (its OpenAI server
    # decides it per request, with the chat template's variables): True, from the first token;
    # False, once the output has ended its reasoning; None, the engine decides from the prompt
    # with its own reasoning parser. Read only with structured_outputs, by an engine that has a
    # reasoning parser (the worker's --dyn-reasoning-parser).
    reasoning_ended: StrictBool | None = None

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

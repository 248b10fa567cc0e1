"""A request's sampling options as vLLM's ``SamplingParams``, the way ``vllm serve`` makes them."""

from __future__ import annotations

from typing import Any

from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

from dynamo.runtime.sampling import SamplingOptions, StructuredOutputs

# SamplingOptions fields that fall back on the model's generation config when a request leaves
# them unset (vLLM's ModelConfig.get_diff_sampling_param, as its OpenAI server applies them).
MODEL_DEFAULT_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)


def sampling_params(options: SamplingOptions, model_defaults: dict[str, Any]) -> SamplingParams:
    """vLLM's ``SamplingParams`` for one request (DELTA output: each step's new tokens)."""
    chosen: dict[str, Any] = {}
    for name in MODEL_DEFAULT_FIELDS:
        value = getattr(options, name)
        if value is None:
            value = model_defaults.get(name)
        if value is not None:
            chosen[name] = value
    return SamplingParams(
        max_tokens=options.max_tokens,
        min_tokens=options.min_tokens,
        seed=options.seed,
        stop=list(options.stop),
        stop_token_ids=list(options.stop_token_ids),
        ignore_eos=options.ignore_eos,
        logit_bias=dict(options.logit_bias) or None,
        allowed_token_ids=list(options.allowed_token_ids) or None,
        bad_words=list(options.bad_words) or None,
        logprobs=options.logprobs,
        prompt_logprobs=options.prompt_logprobs,
        structured_outputs=structured_outputs_params(options.structured_outputs),
        output_kind=RequestOutputKind.DELTA,
        **chosen,
    )


def structured_outputs_params(wire: StructuredOutputs | None) -> StructuredOutputsParams | None:
    """vLLM's ``StructuredOutputsParams`` for the request plane's constraint (its
    ``json_schema`` is vLLM's ``json``, the schema's text, which vLLM's backends take)."""
    if wire is None:
        return None
    return StructuredOutputsParams(
        json=wire.json_schema,
        regex=wire.regex,
        choice=list(wire.choice) if wire.choice is not None else None,
        grammar=wire.grammar,
        json_object=wire.json_object,
        structural_tag=wire.structural_tag,
        disable_any_whitespace=wire.disable_any_whitespace,
        disable_additional_properties=wire.disable_additional_properties,
        whitespace_pattern=wire.whitespace_pattern,
    )


def wire_logprobs(positions: Any) -> list[list[list[float]] | None]:
    """vLLM's logprobs of one output's new tokens, or of its prompt (one ``{id: Logprob}`` per
    token, the sampled or prompt id first; a prompt's first is None) as the request plane
    carries them: ``[[id, logprob], ...]`` per token, -inf floored to -9999.0 as vLLM's OpenAI
    server floors it (JSON has no infinity)."""
    return [
        None
        if position is None
        else [[token_id, max(entry.logprob, -9999.0)] for token_id, entry in position.items()]
        for position in positions
    ]


def wire_ranks(positions: Any) -> list[int | None]:
    """The rank of each prompt id (the first entry of each of vLLM's prompt positions), as the
    request plane carries them next to the prompt's logprobs."""
    return [
        None if position is None else next(iter(position.values())).rank for position in positions
    ]


def generate_kwargs(options: SamplingOptions) -> dict[str, Any]:
    """What ``AsyncLLM.generate`` takes beside the ``SamplingParams``: ``reasoning_ended``,
    which tells its structured outputs whether the grammar waits for the reasoning to end
    (vLLM's OpenAI server passes it the same way), when the request has a grammar and the
    frontend decided it; else nothing (the engine decides from the prompt)."""
    if options.structured_outputs is None or options.reasoning_ended is None:
        return {}
    return {"reasoning_ended": options.reasoning_ended}

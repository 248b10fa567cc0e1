"""A request's sampling options as vLLM's ``SamplingParams``, the way ``vllm serve`` makes them."""

from __future__ import annotations

from typing import Any

from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind

from dynamo.runtime.sampling import SamplingOptions

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
        output_kind=RequestOutputKind.DELTA,
        **chosen,
    )

"""The model card of a started vLLM engine: what the worker registers, read from what vLLM
resolved (the served name, the tokenizer directory, ``max_model_len``, the EOS ids of the
tokenizer and of the generation config), so the frontend tokenizes and stops as vLLM would.

Imported with :mod:`dynamo.vllm.vllm_engine` (``--engine vllm`` only).
"""

from __future__ import annotations

import os
from typing import Any

from dynamo.runtime.model_card import ModelCard
from dynamo.vllm.engine import EngineInitFailed


def one_line(exc: BaseException) -> str:
    """An exception's message on one log line (pydantic's and vLLM's span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def resolve_tokenizer_dir(tokenizer: str, revision: str | None) -> str:
    """The local directory of vLLM's resolved tokenizer (a directory already, or a Hugging Face
    id vLLM has downloaded into the hub cache)."""
    if os.path.isdir(tokenizer):
        return os.path.abspath(tokenizer)
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(tokenizer, revision=revision, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any hub error means: no local copy
        raise EngineInitFailed(
            f"the tokenizer {tokenizer!r} has no local directory the frontend could read "
            f"({one_line(exc)}); pass a model directory as --model (or vLLM's --tokenizer)"
        ) from None


def read_model_card(
    engine: Any, *, served_model_name: str, chat_template: str | None, max_token_id: int
) -> ModelCard:
    """The card of ``engine`` (a started ``AsyncLLM``)."""
    model_config = engine.model_config
    tokenizer = engine.tokenizer
    eos_ids: list[int] = []
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        eos_ids.append(tokenizer.eos_token_id)
    generation_eos = model_config.try_get_generation_config().get("eos_token_id")
    if isinstance(generation_eos, int):
        generation_eos = [generation_eos]
    eos_ids += [i for i in generation_eos or () if isinstance(i, int)]
    tokenizer_dir = resolve_tokenizer_dir(
        model_config.tokenizer, getattr(model_config, "tokenizer_revision", None)
    )
    model_path = model_config.model
    if os.path.isdir(model_path):
        model_path = os.path.abspath(model_path)
    return ModelCard.model_construct(  # judged at registration: record_refusal, exit 2
        served_model_name=served_model_name,
        model_path=model_path,
        tokenizer_path=tokenizer_dir,
        context_length=model_config.max_model_len,
        eos_token_ids=tuple(dict.fromkeys(i for i in eos_ids if i >= 0)),
        chat_template_path=os.path.abspath(chat_template) if chat_template else None,
        max_token_id=max_token_id,
    )

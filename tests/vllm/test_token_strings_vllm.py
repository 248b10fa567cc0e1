"""The frontend's logprob token strings (dynamo.frontend.openai.token_strings) are vLLM's: for every
id of a text (and with the sequence before it as context) the string vLLM's own functions give
(``convert_ids_list_to_tokens``, then ``LogprobsProcessor._verify_tokens``), with the tiny
model's tokenizer as vLLM loads it and with a SentencePiece-style (Metaspace) one."""

from __future__ import annotations

import pytest

from tests.support.metaspace_tokenizer import metaspace_tokenizer

pytestmark = [pytest.mark.vllm]

TEXTS = ["snow ❄ ice", "the north é and 雪", " the  snow", "ice\n\nthe"]


def vllm_strings(tokenizer, ids: list[int]) -> list[str]:
    """vLLM's decoded_token of each id of a generated sequence (its context: the ids before)."""
    from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens
    from vllm.v1.engine.logprobs import LogprobsProcessor

    processor = LogprobsProcessor(
        tokenizer=tokenizer, logprobs=[], prompt_logprobs=None, cumulative_logprob=0.0,
        num_logprobs=0, num_prompt_logprobs=None,
    )  # fmt: skip
    strings = []
    for index, token_id in enumerate(ids):
        decoded = convert_ids_list_to_tokens(tokenizer, [token_id])
        context = ids[max(0, index - 4) : index]
        strings.extend(processor._verify_tokens(decoded, [token_id], context))
    return strings


def ours(backend, ids: list[int]) -> list[str]:
    from dynamo.frontend.openai.token_strings import TokenStrings

    strings = TokenStrings(backend)
    return [strings.token(token_id, ids[:index]) for index, token_id in enumerate(ids)]


def test_the_tiny_models_token_strings_are_vllms(tiny_model):
    from vllm.tokenizers import get_tokenizer

    tokenizer = get_tokenizer(tiny_model)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ours(tokenizer.backend_tokenizer, ids) == vllm_strings(tokenizer, ids), text


def test_a_sentencepiece_tokenizers_strings_are_vllms():
    from transformers import PreTrainedTokenizerFast

    backend = metaspace_tokenizer()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    for text in TEXTS[::2]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        expected = vllm_strings(tokenizer, ids)
        assert ours(backend, ids) == expected, text
        assert any(s.startswith(" ") for s in expected)  # leading spaces restored

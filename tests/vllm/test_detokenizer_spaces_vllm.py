"""``spaces_between_special_tokens`` false (with ``skip_special_tokens`` false) decodes as vLLM's
own ``FastIncrementalDetokenizer`` does: the frontend's stream detokenizer against vLLM's, id
by id, on a tokenizer whose decoder puts spaces between tokens (WordPiece's) and on the tiny
model's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from dynamo.frontend.processors.hf_processor import HfTokenizer, StreamDetokenizer

pytestmark = pytest.mark.vllm


def spaced_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, "[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.add_special_tokens([AddedToken("<a>", special=True), AddedToken("<b>", special=True)])
    return tokenizer


def vllms(tokenizer: Tokenizer, ids: list[int], spaces: bool) -> str:
    from vllm import SamplingParams
    from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer

    params = SamplingParams(skip_special_tokens=False, spaces_between_special_tokens=spaces)
    request = SimpleNamespace(sampling_params=params, prompt_token_ids=[], request_id="r")
    detokenizer = FastIncrementalDetokenizer(SimpleNamespace(_tokenizer=tokenizer), request)
    return "".join(detokenizer.decode_next(token_id) for token_id in ids)


def ours(tokenizer: Tokenizer, ids: list[int], spaces: bool) -> str:
    detokenizer = StreamDetokenizer(
        tokenizer, skip_special_tokens=False, spaces_between_special_tokens=spaces
    )
    return "".join(detokenizer.add([token_id]) for token_id in ids) + detokenizer.finish()


@pytest.mark.parametrize("spaces", [True, False])
def test_added_tokens_in_a_row_decode_as_vllms(tiny_model, spaces):
    spaced = spaced_tokenizer()
    ids = spaced.encode("hello <a><b> world <b> <a>").ids
    assert ours(spaced, ids, spaces) == vllms(spaced, ids, spaces)
    assert ("<a><b>" in ours(spaced, ids, spaces)) is not spaces
    tiny = HfTokenizer(tiny_model)._tokenizer
    ids = [0, 1, 2, *tiny.encode("snow and ice", add_special_tokens=False).ids, 1, 2]
    assert ours(tiny, ids, spaces) == vllms(tiny, ids, spaces)

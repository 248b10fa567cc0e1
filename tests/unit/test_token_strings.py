"""Logprobs' token strings as vLLM builds them (dynamo.frontend.openai.token_strings), with real
tokenizers: the tiny model's byte-level BPE (a multi-byte character split across tokens) and a
SentencePiece-style one (a Metaspace pre-tokenizer, whose decoder strips a lone token's
leading space) trained here with ``tokenizers``; then through the frontend, where the echo
engine's logprobs carry a split character. tests/vllm/test_token_strings_vllm.py checks the
same strings against vLLM's own functions."""

from __future__ import annotations

import asyncio

import pytest
from tokenizers import Tokenizer

from dynamo.frontend.openai.token_strings import TokenStrings
from tests.support.frontend_fakes import MODEL, echo_worker, frontend
from tests.support.metaspace_tokenizer import metaspace_tokenizer
from tests.support.tiny_model import tiny_card

SNOW = "snow ❄ ice"  # ❄ is three bytes, each its own token in the tiny vocabulary
# vLLM's strings of its ids: a byte that does not finish its character is "", the last one
# carries the character.
STRINGS = ["s", "n", "ow", " ", "", "", "❄", " i", "c", "e"]


@pytest.fixture
def tiny(tiny_tokenizer_dir):
    return Tokenizer.from_file(str(tiny_tokenizer_dir / "tokenizer.json"))


def test_a_split_character_is_completed_by_its_last_byte_from_the_sequences_context(tiny):
    strings = TokenStrings(tiny)
    ids = tiny.encode(SNOW, add_special_tokens=False).ids
    assert [strings.alone(i) for i in ids].count("\ufffd") == 3  # what decoding alone gives
    texts = [strings.token(token_id, ids[:index]) for index, token_id in enumerate(ids)]
    assert texts == STRINGS
    assert "".join(texts) == SNOW


def test_a_split_character_without_context_is_empty_as_vllm_gives_it(tiny):
    strings = TokenStrings(tiny)
    first, second, third = tiny.encode("❄", add_special_tokens=False).ids
    assert strings.token(third, []) == ""  # the first generated token: no context at all
    assert strings.token(third, [second]) == ""  # not enough context to finish it
    assert strings.token(third, [first, second]) == "❄"


def test_a_sentencepiece_tokens_leading_space_is_restored():
    tokenizer = metaspace_tokenizer()
    strings = TokenStrings(tokenizer)
    the = tokenizer.token_to_id("▁the")
    assert the is not None and tokenizer.decode([the]) == "the"  # the decoder strips it
    assert strings.alone(the) == strings.token(the, [the]) == " the"
    plain = tokenizer.token_to_id("h")
    assert plain is not None and strings.alone(plain) == "h"


def test_a_byte_level_tokens_own_space_is_kept_and_nothing_added(tiny):
    strings = TokenStrings(tiny)
    (space_s, *_) = tiny.encode(" snow", add_special_tokens=False).ids
    assert strings.alone(space_s) == " s"


def test_the_frontends_logprobs_carry_vllms_strings(tiny_tokenizer_dir, tiny):
    ids = tiny.encode(SNOW, add_special_tokens=False).ids
    card = tiny_card(tiny_tokenizer_dir, MODEL)

    async def scenario():
        async with (
            echo_worker(output=ids) as (_, endpoint),
            frontend(card, endpoint) as client,
        ):
            chat = await client.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": len(ids), "ignore_eos": True, "logprobs": True},
            )  # fmt: skip
            completion = await client.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": SNOW, "max_tokens": 1, "ignore_eos": True,
                      "logprobs": 0, "echo": True, "prompt_logprobs": 0},
            )  # fmt: skip
            return await chat.json(), await completion.json()

    chat, completion = asyncio.run(scenario())
    content = chat["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == STRINGS
    assert content[4]["bytes"] == [] and content[6]["bytes"] == list("❄".encode())
    choice = completion["choices"][0]
    # The echoed prompt's: its first id decoded alone, then in the prompt's context.
    assert choice["logprobs"]["tokens"][: len(ids)] == STRINGS
    prompt = choice["prompt_logprobs"]
    decoded = [p[str(i)]["decoded_token"] for i, p in zip(ids[1:], prompt[1:], strict=True)]
    assert decoded == STRINGS[1:]

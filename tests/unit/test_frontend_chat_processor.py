"""The frontend's built-in tokenizer, chat template and chat engine factory."""

from __future__ import annotations

import gc

import pytest

from dynamo.frontend.chat_processor import build_chat_processor
from dynamo.frontend.chat_template import ChatMessage, ChatTemplate
from dynamo.frontend.tokenizer import (
    BYTE_TOKENS,
    DEFAULT_MERGED_TOKENS,
    SPECIAL_TOKENS,
    UNKNOWN_TOKEN_TEXT,
    ByteTokenizer,
    build_tokenizer_tables,
)


@pytest.fixture(scope="module")
def tokenizer():
    return ByteTokenizer()


@pytest.mark.parametrize(
    "text",
    ["", "hello", "naïve café", "日本語のテキスト", "emoji 🧊 and \x00 control", "a\nb\tc"],
)
def test_encode_is_utf8_bytes_and_decode_round_trips(tokenizer, text):
    ids = tokenizer.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


def test_special_tokens_encode_to_one_id_each_and_round_trip(tokenizer):
    text = "<|im_start|>user\nhi<|im_end|>\n"
    ids = tokenizer.encode(text)
    assert ids[0] == tokenizer.tables.special_ids["<|im_start|>"] >= BYTE_TOKENS
    assert ids.count(tokenizer.tables.special_ids["<|im_end|>"]) == 1
    assert len(ids) == 1 + len(b"user\nhi") + 1 + 1
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi\n"


def test_ids_outside_the_byte_range_decode_through_the_tables(tokenizer):
    tables = tokenizer.tables
    merged = tables.tokens[BYTE_TOKENS + len(SPECIAL_TOKENS)]
    assert len(merged.raw) >= 2 and not merged.special
    assert tokenizer.decode([merged.id]) == merged.raw.decode("utf-8")
    assert tokenizer.decode([tables.vocab_size, -1, 10**9]) == UNKNOWN_TOKEN_TEXT * 3


def test_incremental_detokenizer_holds_back_a_split_character(tokenizer):
    ids = tokenizer.encode("a🧊b")
    detokenizer = tokenizer.detokenizer()
    pieces = [detokenizer.add([token_id]) for token_id in ids]
    assert pieces == ["a", "", "", "", "🧊", "b"]
    assert detokenizer.finish() == ""


def test_incomplete_character_at_the_end_becomes_a_replacement(tokenizer):
    detokenizer = tokenizer.detokenizer()
    assert detokenizer.add(list("é".encode("utf-8"))[:1]) == ""
    assert detokenizer.finish() == "\ufffd"


def test_tables_are_consistent_and_sized_by_merged_tokens():
    tables = build_tokenizer_tables(merged_tokens=10)
    assert tables.vocab_size == BYTE_TOKENS + len(SPECIAL_TOKENS) + 10
    assert len(tables.vocab) == tables.vocab_size  # every printable form is unique
    for token in tables.tokens:
        assert tables.tokens[tables.vocab[token.text]] is token
    assert build_tokenizer_tables().vocab_size == (
        BYTE_TOKENS + len(SPECIAL_TOKENS) + DEFAULT_MERGED_TOKENS
    )
    with pytest.raises(ValueError):
        build_tokenizer_tables(merged_tokens=-1)


def test_chat_template_renders_chatml_with_a_generation_prompt():
    messages = [ChatMessage("system", "be brief"), ChatMessage("user", "hi")]
    assert ChatTemplate().render(messages) == (
        "<|im_start|>system\nbe brief<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert ChatTemplate().render(messages, add_generation_prompt=False).endswith("<|im_end|>\n")
    with pytest.raises(ValueError, match="role"):
        ChatTemplate().render([ChatMessage("wizard", "x")])


def test_default_system_prompt_only_when_none_given():
    template = ChatTemplate(default_system_prompt="sys")
    assert template.render([ChatMessage("user", "u")]).startswith("<|im_start|>system\nsys")
    rendered = template.render([ChatMessage("system", "mine"), ChatMessage("user", "u")])
    assert rendered.count("<|im_start|>system") == 1 and "mine" in rendered


def test_chat_engine_factory_builds_a_tracked_long_lived_heap_per_model():
    first = build_chat_processor("model-a")
    second = build_chat_processor("model-b", merged_tokens=100)
    assert first.model == "model-a" and second.tokenizer.vocab_size < first.tokenizer.vocab_size
    assert first.tokenizer.tables is not second.tokenizer.tables  # one heap per model
    tokens = first.tokenizer.tables.tokens
    # Tracked containers are what a full collection walks: the heap a frontend grows.
    assert all(gc.is_tracked(token) for token in tokens[:: len(tokens) // 16])
    prompt = first.render([ChatMessage("user", "héllo")])
    assert first.tokenizer.decode(first.encode(prompt)) == prompt

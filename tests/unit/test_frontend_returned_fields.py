"""``return_token_ids`` and ``return_prompt_text`` where vLLM 0.32 puts them: the prompt's ids
(chat: the body's ``prompt_token_ids``; completions: each choice's) and text (chat's
``prompt_text``) on each choice's first body (whole, or its first chunk), and each choice's
generated ids (``token_ids``, the stop token's too) whole and chunk by chunk. The worker is
test_frontend_choices' seeded engine: choice ``i`` generates 10 + i, 11 + i, ..."""

from __future__ import annotations

import pytest

from dynamo.frontend.processors.chat_processor import build_chat_processor
from tests.support.tiny_model import tiny_card
from tests.unit.test_frontend_choices import HELLO, MODEL, TOKENS, chat, completion


@pytest.fixture
def card(tiny_tokenizer_dir):
    return tiny_card(tiny_tokenizer_dir, MODEL)


def generated(index: int, count: int = TOKENS) -> list[int]:
    return [10 + index + i for i in range(count)]


def by_choice(events: list) -> dict[int, list[tuple[dict, dict]]]:
    """Each choice's chunks, (chunk, its choice), in order."""
    found: dict[int, list[tuple[dict, dict]]] = {}
    for event in events:
        if isinstance(event, dict) and event.get("choices"):
            choice = event["choices"][0]
            found.setdefault(choice["index"], []).append((event, choice))
    return found


def test_a_chats_prompt_ids_and_text_are_the_bodys_and_each_choice_has_its_ids(card):
    processor = build_chat_processor(card)
    prompt = processor.render(HELLO)
    status, body, _ = chat(card, n=2, seed=0, return_token_ids=True, return_prompt_text=True)
    assert status == 200, body
    assert body["prompt_token_ids"] == processor.encode_chat(prompt)
    assert body["prompt_text"] == prompt
    for index, choice in enumerate(body["choices"]):
        assert choice["token_ids"] == generated(index)
        assert "prompt_token_ids" not in choice
    _, plain, _ = chat(card, n=2, seed=0)
    assert not {"prompt_token_ids", "prompt_text"} & plain.keys()
    assert all("token_ids" not in choice for choice in plain["choices"])


def test_a_streamed_chat_has_them_on_each_choices_first_chunk_and_ids_chunk_by_chunk(card):
    processor = build_chat_processor(card)
    prompt = processor.render(HELLO)
    fields = {"return_token_ids": True, "return_prompt_text": True}
    status, events, _ = chat(card, stream=True, n=2, seed=0, **fields)
    assert status == 200, events
    for index, chunks in by_choice(events).items():
        (first, opening), rest = chunks[0], chunks[1:]
        assert opening["delta"]["role"] == "assistant"
        assert first["prompt_token_ids"] == processor.encode_chat(prompt)
        assert first["prompt_text"] == prompt
        assert not any("prompt_token_ids" in chunk for chunk, _ in rest)
        assert [i for _, choice in rest for i in choice["token_ids"]] == generated(index)


def test_the_stop_token_is_in_the_ids_as_vllm_reports_it(card):
    _, body, _ = chat(card, stop_token_ids=[11], ignore_eos=False, return_token_ids=True)
    assert body["choices"][0]["token_ids"] == [10, 11]
    assert body["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_a_completions_prompt_ids_are_each_choices(card, stream):
    prompt_ids = build_chat_processor(card).encode_completion("hello")
    status, answer, _ = completion(card, stream, n=2, seed=0, return_token_ids=True)
    assert status == 200, answer
    if not stream:
        assert "prompt_token_ids" not in answer
        for index, choice in enumerate(answer["choices"]):
            assert choice["prompt_token_ids"] == prompt_ids
            assert choice["token_ids"] == generated(index)
        return
    for index, chunks in by_choice(answer).items():
        choices = [choice for _, choice in chunks]
        assert choices[0]["prompt_token_ids"] == prompt_ids
        assert not any("prompt_token_ids" in choice for choice in choices[1:])
        assert [i for choice in choices for i in choice["token_ids"]] == generated(index)


def test_return_prompt_text_is_unknown_to_completions_as_to_vllm(card):
    status, body, _ = completion(card, return_prompt_text=True)
    assert status == 200 and "prompt_text" not in body
    assert all("prompt_text" not in choice for choice in body["choices"])


CONTINUED = [*HELLO, {"role": "assistant", "content": "Snow is"}]


@pytest.mark.parametrize(
    "messages, fields, echoed",
    [
        (CONTINUED, {}, "Snow is"),  # the answer continues the assistant's message
        (HELLO, {"add_generation_prompt": False}, "hello"),  # it continues the user's
        (HELLO, {}, ""),  # a new assistant message: nothing to echo
        (CONTINUED, {"echo": False}, ""),
    ],
)
def test_a_chats_echo_puts_the_last_messages_content_first_as_vllm(card, messages, fields, echoed):
    fields = {"echo": True, **fields, "messages": messages, "n": 2, "seed": 0}
    _, plain, _ = chat(card, **{**fields, "echo": False})
    status, whole, _ = chat(card, **fields)
    assert status == 200, whole
    for index, choice in enumerate(whole["choices"]):
        assert (
            choice["message"]["content"] == echoed + plain["choices"][index]["message"]["content"]
        )
    _, events, _ = chat(card, stream=True, **fields)
    for index, chunks in by_choice(events).items():
        deltas = [choice["delta"] for _, choice in chunks]
        # vLLM's role: the last message's without a generation prompt, else the assistant's.
        role = messages[-1]["role"] if fields.get("add_generation_prompt") is False else "assistant"
        assert deltas[0] == {"role": role, "content": ""}
        if echoed:  # its own chunk, right after the role's
            assert deltas[1] == {"content": echoed}
        text = "".join(delta.get("content") or "" for delta in deltas)
        assert text == whole["choices"][index]["message"]["content"]


@pytest.mark.parametrize(
    "spaces, text", [(True, "hello <a> <b> world"), (False, "hello <a><b> world")]
)
def test_spaces_between_special_tokens_false_joins_added_tokens_in_a_row(spaces, text):
    """vLLM's rule (its FastIncrementalDetokenizer; compared with it in the vllm suite): an
    added token right after another is its bare content, on a decoder that spaces tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from dynamo.frontend.processors.hf_processor import StreamDetokenizer

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, "[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.add_special_tokens([AddedToken("<a>", special=True), AddedToken("<b>", special=True)])
    ids = tokenizer.encode("hello <a><b> world").ids
    detokenizer = StreamDetokenizer(
        tokenizer, skip_special_tokens=False, spaces_between_special_tokens=spaces
    )
    assert "".join(detokenizer.add([i]) for i in ids) + detokenizer.finish() == text
    skipping = StreamDetokenizer(tokenizer, spaces_between_special_tokens=spaces)
    assert "".join(skipping.add([i]) for i in ids) == "hello world"  # skipped: no effect

"""The streaming vLLM parser cuts each piece at the tokenizer's added tokens: a model card's
tokenizer is a peer's file, and may add thousands of them. The cut costs a piece its length,
not its length times the added tokens. vLLM's parsers themselves are
tests/vllm/test_vllm_streaming_parser.py; here the tokenizer is the tiny model's real one
(``tokenizers``), with the two methods of transformers' tokenizers the parser calls."""

from __future__ import annotations

import random
import string
import time
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer

from dynamo.frontend.parsing.vllm_output_parser import VllmStreamingParser, _markers


class AddedVocabTokenizer:
    """``tokenizers.Tokenizer`` as transformers' fast tokenizers expose it to vLLM's parsers."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer

    def get_added_vocab(self) -> dict[str, int]:
        decoder = self._tokenizer.get_added_tokens_decoder()
        return {token.content: id_ for id_, token in decoder.items()}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids


class RecordingParser:
    """A vLLM parser that records what ``parse_delta`` is given."""

    def __init__(self) -> None:
        self.deltas: list[tuple[str, list[int]]] = []

    def parse_delta(self, text: str, ids: list[int], *_: Any, finished: bool) -> None:
        self.deltas.append((text, ids))


def tokenizer_with(tiny_tokenizer_dir, added: list[str]) -> AddedVocabTokenizer:
    tokenizer = Tokenizer.from_file(str(tiny_tokenizer_dir / "tokenizer.json"))
    tokenizer.add_tokens([AddedToken(text, special=False, normalized=False) for text in added])
    return AddedVocabTokenizer(tokenizer)


def feed(tokenizer: AddedVocabTokenizer, text: str) -> list[tuple[str, list[int]]]:
    parser = RecordingParser()
    VllmStreamingParser(parser, None, tokenizer, _markers(tokenizer)).feed(text)
    return parser.deltas


def test_a_piece_is_cut_at_the_added_tokens_each_a_delta_of_its_own(tiny_tokenizer_dir):
    tokenizer = tokenizer_with(tiny_tokenizer_dir, ["<think>", "</think>", "<tool_call>"])
    deltas = feed(tokenizer, "a<think>b c</think><tool_call>{}")
    assert [text for text, _ in deltas] == ["a", "<think>", "b c", "</think>", "<tool_call>", "{}"]
    for text, ids in deltas:
        assert ids == tokenizer.encode(text, add_special_tokens=False)
    assert feed(tokenizer, "plain text") == [
        ("plain text", tokenizer.encode("plain text", add_special_tokens=False))
    ]
    assert feed(tokenizer, "") == []


def timed_feed(tokenizer: AddedVocabTokenizer, text: str) -> tuple[float, list[str]]:
    """The feed's cost in this process's CPU time: the wall clock also counts the time the
    scheduler gives other processes (a parallel test worker, a loaded CI machine), which
    differed between the two feeds compared and failed the comparison with no change here."""
    feed(tokenizer, "warm up")
    started = time.process_time()
    deltas = feed(tokenizer, text)
    return time.process_time() - started, [part for part, _ in deltas]


def test_thousands_of_added_tokens_cost_a_piece_its_length_only(tiny_tokenizer_dir):
    """40000 added tokens (a peer's tokenizer.json may hold them) and a piece of 64 KiB (a
    stream line's bound) cost what one added token does (the tokenizer's encoding): a pattern
    of every token took ten times as long, seconds a piece, on the event loop."""
    rng = random.Random(0)
    added = sorted({"".join(rng.choices(string.ascii_letters, k=8)) for _ in range(40000)})
    piece = "x " * 32768 + added[7] + " y"
    few, parts = timed_feed(tokenizer_with(tiny_tokenizer_dir, [added[7]]), piece)
    assert parts == ["x " * 32768, added[7], " y"]
    many, parts = timed_feed(tokenizer_with(tiny_tokenizer_dir, added), piece)
    assert parts == ["x " * 32768, added[7], " y"]
    assert many < 3 * few + 0.1, f"{many:.2f} s for one piece, {few:.2f} s with one added token"


@pytest.mark.parametrize("text", ["<t><t><t>", "<t>" * 5000 + "z"])
def test_a_piece_made_of_added_tokens_is_one_delta_each(tiny_tokenizer_dir, text):
    tokenizer = tokenizer_with(tiny_tokenizer_dir, ["<t>"])
    deltas = feed(tokenizer, text)
    assert "".join(part for part, _ in deltas) == text
    assert all(part == "<t>" for part, _ in deltas[: text.count("<t>")])

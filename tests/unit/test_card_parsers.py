"""The parser names a worker publishes in its model card: a peer's words, held to a name's
shape by the card's schema; a processor that parses nothing says it serves the model without
them (tests/sglang/test_frontend_parsed_output.py has the sglang processor's side)."""

from __future__ import annotations

import logging
import uuid

import pytest
from pydantic import ValidationError

from dynamo.frontend.processors.chat_processor import build_chat_processor
from dynamo.runtime.model_card import ModelCard
from tests.support.tiny_model import tiny_card


@pytest.mark.parametrize("name", ["qwen25", "deepseek-r1", "deepseek_r1", "llama3_json", "v3.1"])
def test_a_parser_name_passes_the_cards_schema(tiny_tokenizer_dir, name):
    card = tiny_card(tiny_tokenizer_dir, tool_call_parser=name, reasoning_parser=name)
    assert ModelCard.model_validate(card.model_dump()).tool_call_parser == name


@pytest.mark.parametrize("name", ["", "a b", "-x", "x\n", "é", "x" * 65, 7])
def test_anything_else_is_refused_by_the_cards_schema(tiny_tokenizer_dir, name):
    fields = tiny_card(tiny_tokenizer_dir).model_dump()
    with pytest.raises(ValidationError):
        ModelCard.model_validate({**fields, "tool_call_parser": name})
    with pytest.raises(ValidationError):
        ModelCard.model_validate({**fields, "reasoning_parser": name})


def test_a_processor_without_parsers_serves_the_model_and_says_so(tiny_tokenizer_dir, caplog):
    # A model name of its own: the WARNING is budgeted per model and name, process-wide.
    model = f"model-{uuid.uuid4().hex[:8]}\x1b[31m"
    card = tiny_card(tiny_tokenizer_dir, model, tool_call_parser="hermes", reasoning_parser="qwen3")
    with caplog.at_level(logging.WARNING, logger="dynamo.frontend.processors.card_parsers"):
        processor = build_chat_processor(card, "hf")
    assert processor.output_parser() is None
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "dynamo.frontend.processors.card_parsers"
    ]
    assert any("tool-call parser hermes" in line and "hf" in line for line in lines), lines
    assert any("reasoning parser qwen3" in line for line in lines), lines
    assert all("\x1b" not in line for line in lines)  # the peer's text, escaped

"""Fixtures the unit tests share (a module's own fixture of the same name wins over these)."""

from __future__ import annotations

import pytest

from dynamo.frontend.processors.chat_processor import build_chat_processor
from tests.support.frontend_fakes import MODEL
from tests.support.tiny_model import tiny_card


@pytest.fixture
def processor(tiny_tokenizer_dir):
    """The tiny model's processor; its card is the one the frontend serves."""
    return build_chat_processor(tiny_card(tiny_tokenizer_dir, MODEL))


@pytest.fixture
def card(processor):
    return processor.card

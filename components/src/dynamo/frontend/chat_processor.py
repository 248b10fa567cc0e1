"""Per-model chat processor (template + tokenizer) and the chat engine factory that builds it.

The model registry calls :func:`build_chat_processor` once per newly discovered model, while the
frontend serves. Whatever it allocates is long-lived heap grown *after* the start-up freeze, so
it must never freeze or collect: the serving-phase guard would refuse a freeze here anyway, and
nothing in this module asks for one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Sequence

from .chat_template import ChatMessage, ChatTemplate
from .tokenizer import (
    DEFAULT_MERGED_TOKENS,
    ByteTokenizer,
    IncrementalDetokenizer,
    build_tokenizer_tables,
)

logger = logging.getLogger(__name__)


@dataclass
class ChatProcessor:
    model: str
    template: ChatTemplate
    tokenizer: ByteTokenizer

    def render(self, messages: Sequence[ChatMessage]) -> str:
        return self.template.render(messages)

    def encode(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt)

    def detokenizer(self) -> IncrementalDetokenizer:
        return self.tokenizer.detokenizer()


def build_chat_processor(
    model: str, *, merged_tokens: int = DEFAULT_MERGED_TOKENS
) -> ChatProcessor:
    """The chat engine factory: build one model's processor (its tables are its heap)."""
    started = time.perf_counter()
    processor = ChatProcessor(
        model=model,
        template=ChatTemplate(),
        tokenizer=ByteTokenizer(build_tokenizer_tables(merged_tokens)),
    )
    logger.info(
        "Chat processor built: model=%s vocab=%d took_ms=%.1f",
        model,
        processor.tokenizer.vocab_size,
        (time.perf_counter() - started) * 1000.0,
    )
    return processor

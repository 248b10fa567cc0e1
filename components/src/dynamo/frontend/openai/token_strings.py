"""Logprobs' token strings as vLLM builds them, so a client gets the strings vLLM would give it.

vLLM (0.32) decodes each id of a logprob position alone, special tokens shown
(``vllm/tokenizers/detokenizer_utils.py``: ``convert_ids_list_to_tokens``), then:

* **leading spaces**: with a SentencePiece-style ``Metaspace`` pre-tokenizer, the decoder strips
  the space a lone token starts with (``▁the`` decodes as ``the``); vLLM puts back as many
  spaces as the raw vocabulary piece starts with markers, less those the text still has
  (``get_leading_space_marker``, ``_restore_leading_spaces``);
* **partial UTF-8**: a string ending in U+FFFD (a byte of a multi-byte character split across
  tokens) is decoded again after 1, then 2, ... up to 4 of the sequence's preceding ids (the
  generated ones for a generated token, the prompt's for a prompt token: vLLM's context
  never mixes them nor counts the prompt's first id), the first decode that no longer ends in
  U+FFFD giving the text this token completes, less the text of the context ids that were
  whole characters already; none: ``""`` (``vllm/v1/engine/logprobs.py``:
  ``LogprobsProcessor._verify_tokens`` and ``_correct_decoded_token``).

The prompt's first id, which has no logprobs, is decoded alone without either step, as
vLLM's completions server decodes it (``_create_completion_logprobs``). Decoding is the
tokenizer's Rust backend (``tokenizers``), which every processor's tokenizer has.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

REPLACEMENT = "\ufffd"
# vLLM's reach back for a split character: 4 bytes is the longest UTF-8 sequence.
MAX_CONTEXT = 4
_CACHED = 4096  # lone ids' strings kept per model


def leading_space_marker(backend: Any) -> str | None:
    """The ``Metaspace`` replacement of the tokenizer's pre-tokenizer (alone or in a
    sequence), or None: vLLM's ``get_leading_space_marker``."""
    try:
        config = json.loads(backend.to_str())
    except Exception:  # noqa: BLE001 - as vLLM: an unreadable config has no marker
        return None
    pre = config.get("pre_tokenizer") or {}
    if pre.get("type") == "Metaspace":
        return str(pre.get("replacement", "▁"))
    if pre.get("type") == "Sequence":
        for sub in pre.get("pretokenizers", []):
            if sub.get("type") == "Metaspace":
                return str(sub.get("replacement", "▁"))
    return None


def restore_leading_spaces(raw: str, text: str, marker: str) -> str:
    """vLLM's ``_restore_leading_spaces``: the spaces ``decode`` stripped from ``raw``."""
    markers = len(raw) - len(raw.lstrip(marker))
    if markers == 0:
        return text
    missing = markers - (len(text) - len(text.lstrip(" ")))
    return " " * missing + text if missing > 0 else text


class TokenStrings:
    """One model's logprob token strings (see the module docstring)."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._marker = leading_space_marker(backend)
        self._alone: dict[int, str] = {}

    def decode(self, ids: Sequence[int]) -> str:
        """``ids`` decoded together, special tokens shown (vLLM's ``tokenizer.decode``)."""
        return str(self._backend.decode(list(ids), skip_special_tokens=False))

    def alone(self, token_id: int) -> str:
        """``token_id`` decoded alone, its leading spaces restored."""
        text = self._alone.get(token_id)
        if text is None:
            text = self.decode([token_id])
            raw = self._backend.id_to_token(token_id) if self._marker else None
            if raw is not None and self._marker is not None:
                text = restore_leading_spaces(raw, text, self._marker)
            if len(self._alone) < _CACHED:
                self._alone[token_id] = text
        return text

    def token(self, token_id: int, context: Sequence[int]) -> str:
        """The string of ``token_id`` at a position after the sequence's ids ``context``."""
        text = self.alone(token_id)
        if not text.endswith(REPLACEMENT):
            return text
        return self._corrected(token_id, list(context[-MAX_CONTEXT:]))

    def _corrected(self, token_id: int, context: list[int]) -> str:
        """vLLM's ``_correct_decoded_token``."""
        for count in range(1, len(context) + 1):
            before = context[-count:]
            whole = self.decode([*before, token_id])
            if whole.endswith(REPLACEMENT):
                continue
            # Context ids that were themselves a split character's bytes gave "" when they
            # came: their text is this token's.
            clean_end = len(before)
            for j in range(len(before) - 1, -1, -1):
                if self.decode([before[j]]).endswith(REPLACEMENT):
                    clean_end = j
                else:
                    break
            prefix = self.decode(before[:clean_end]) if clean_end > 0 else ""
            if whole.startswith(prefix):
                return whole[len(prefix) :]
            common = 0  # a normalising tokenizer: after the longest common prefix
            for a, b in zip(prefix, whole, strict=False):
                if a != b:
                    break
                common += 1
            return whole[common:]
        return ""


class SlowBackend:
    """A slow (Python) transformers tokenizer (the sglang processor may have one) with the
    ``tokenizers`` calls token strings make; it has no pre-tokenizer config (no leading-space
    marker, as vLLM finds none)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def id_to_token(self, token_id: int) -> str | None:
        return self._tokenizer.convert_ids_to_tokens(token_id)

    def to_str(self) -> str:
        return "{}"

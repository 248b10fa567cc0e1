"""The model behind the mock engine: a Hugging Face tokenizer directory, loaded with ``tokenizers``.

``python -m dynamo.vllm --engine mock --model DIR`` serves DIR's vocabulary: the mock engine
echoes and counts in it, and the worker's model card points the frontend at DIR's own tokenizer
and chat template, so the frontend runs the code path of a real model. DIR needs a
``tokenizer.json``; the tiny model's tokenizer (``scripts/make_tiny_model.py --tokenizer-only``)
or any model's downloaded tokenizer files do.

What the card says, read from DIR the way vLLM and ``transformers`` read a model directory:

* context length: ``--mock-max-model-len`` when given, else ``config.json``'s
  ``max_position_embeddings`` (or ``n_positions`` / ``max_seq_len`` / ``seq_length``), else
  ``tokenizer_config.json``'s ``model_max_length`` (ignored when it is Hugging Face's "unset"
  sentinel, ~1e30). A directory with none of them needs the option;
* EOS ids: the tokenizer's ``eos_token`` (``tokenizer_config.json``), then
  ``generation_config.json``'s ``eos_token_id`` (an id or a list), without duplicates.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from dynamo.runtime.model_card import ModelCard
from dynamo.runtime.tokenizer_config import token_text

TOKENIZER_FILE = "tokenizer.json"
# config.json keys that hold the context length, as vLLM's max-length lookup reads them.
CONTEXT_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
# transformers' "no limit known" value of model_max_length is int(1e30); anything this large is
# not a context length.
UNSET_MODEL_MAX_LENGTH = 10**12


class BadModelDirectory(ValueError):
    """The directory cannot serve as the mock engine's model (the message says why)."""


@dataclass(frozen=True)
class MockModel:
    """A loaded tokenizer directory: the card to publish and the vocabulary to count in."""

    tokenizer: Tokenizer
    card: ModelCard
    vocab_size: int
    # Ids of the tokenizer's special tokens (BOS, EOS, pad, ...): never counted.
    special_ids: frozenset[int]
    # The ids the mock counts through after its echo: every non-special id, in order.
    ordinary_ids: tuple[int, ...]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise BadModelDirectory(f"{path} is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise BadModelDirectory(f"{path} is not a JSON object")
    return data


def _ids(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def read_context_length(directory: Path) -> int | None:
    config = _read_json(directory / "config.json")
    for key in CONTEXT_LENGTH_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    value = _read_json(directory / "tokenizer_config.json").get("model_max_length")
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and 0 < value < UNSET_MODEL_MAX_LENGTH
    ):
        return value
    return None


def read_eos_token_ids(directory: Path, tokenizer: Tokenizer) -> tuple[int, ...]:
    eos_ids: list[int] = []
    eos_text = token_text(_read_json(directory / "tokenizer_config.json").get("eos_token"))
    if eos_text is not None:
        eos_id = tokenizer.token_to_id(eos_text)
        if eos_id is not None:
            eos_ids.append(eos_id)
    eos_ids += _ids(_read_json(directory / "generation_config.json").get("eos_token_id"))
    return tuple(dict.fromkeys(i for i in eos_ids if i >= 0))


def load_mock_model(
    model_dir: str,
    *,
    served_model_name: str | None = None,
    max_model_len: int | None = None,
    chat_template: str | None = None,
) -> MockModel:
    """Load DIR's tokenizer and build the card; raises :class:`BadModelDirectory`."""
    directory = Path(model_dir).expanduser()
    if not directory.is_dir():
        raise BadModelDirectory(f"{model_dir!r} is not a directory")
    tokenizer_file = directory / TOKENIZER_FILE
    if not tokenizer_file.is_file():
        raise BadModelDirectory(
            f"{model_dir!r} has no {TOKENIZER_FILE} (the mock engine needs a Hugging Face "
            "tokenizer directory, e.g. scripts/make_tiny_model.py --tokenizer-only)"
        )
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises its own Exception type
        raise BadModelDirectory(f"{tokenizer_file} cannot be loaded ({exc})") from None
    context_length = max_model_len or read_context_length(directory)
    if context_length is None:
        raise BadModelDirectory(
            f"{model_dir!r} declares no context length (config.json max_position_embeddings or "
            "tokenizer_config.json model_max_length): set --mock-max-model-len / "
            "DYN_VLLM_MOCK_MAX_MODEL_LEN"
        )
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    special_ids = frozenset(
        token_id
        for token_id, token in tokenizer.get_added_tokens_decoder().items()
        if token.special
    )
    ordinary_ids = tuple(i for i in range(vocab_size) if i not in special_ids)
    if not ordinary_ids:
        raise BadModelDirectory(f"{tokenizer_file} has no ordinary (non-special) token")
    resolved = str(directory.resolve())
    # Built unchecked: a value a frontend would refuse (a config's context over the card's
    # bound) is the registration check's to report, exit 2 naming it (startup_checks).
    card = ModelCard.model_construct(
        served_model_name=served_model_name or model_dir,
        model_path=resolved,
        tokenizer_path=resolved,
        context_length=context_length,
        eos_token_ids=read_eos_token_ids(directory, tokenizer),
        chat_template_path=os.path.abspath(chat_template) if chat_template else None,
        max_token_id=max(tokenizer.get_vocab(with_added_tokens=True).values()),
    )
    return MockModel(
        tokenizer=tokenizer,
        card=card,
        vocab_size=vocab_size,
        special_ids=special_ids,
        ordinary_ids=ordinary_ids,
    )

"""What a model directory's ``tokenizer_config.json`` says, read alike by the frontend (its chat
processors) and the worker (the mock engine's model)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict
    (``{"content": ...}``); None for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None

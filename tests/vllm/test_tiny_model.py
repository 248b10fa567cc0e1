"""scripts/make_tiny_model.py: offline, deterministic, reused from its cache directory."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vllm.conftest import MAKE_TINY_MODEL, OFFLINE_ENV

pytestmark = pytest.mark.vllm  # needs torch, transformers and tokenizers (the vLLM venv)


def _make(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(MAKE_TINY_MODEL), "--out", str(out), *extra],
        env={**os.environ, **OFFLINE_ENV},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )


def _digests(directory: Path) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
    }


def test_two_builds_are_byte_identical_and_a_second_run_reuses(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    assert _make(first).stdout.strip() == str(first)
    _make(second)
    assert _digests(first) == _digests(second)
    assert "model.safetensors" in _digests(first)

    again = _make(first)
    assert "reusing" in again.stderr
    assert _make(first, "--force").stderr.count("built") == 1


def test_the_model_has_the_shape_vllm_cpu_needs(tiny_model):
    config = json.loads((Path(tiny_model) / "config.json").read_text())
    assert config["hidden_size"] == 64
    assert config["num_hidden_layers"] == 2
    assert config["num_attention_heads"] == 2
    assert config["head_dim"] >= 32  # vLLM's CPU attention needs 32 or more
    assert 500 <= config["vocab_size"] <= 1100


def test_the_tokenizer_round_trips_text_and_has_a_chat_template(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    text = "Hello, GC pauses! 0123 \u00e9\u00e8"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|assistant|>\n")
    assert "<|user|>\nHi" in prompt

"""The worker's CPU KV cache default on the installed vLLM: set from the model's own config when
the operator gives no size, said in one INFO line, and never over what the operator gave."""

from __future__ import annotations

import logging

import pytest

from dynamo.vllm import backend_args
from dynamo.vllm.cpu_kv_cache import KV_SPACE_ENV, apply_cpu_default

pytestmark = pytest.mark.vllm

TINY_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 2  # K and V, 2 layers, 2 KV heads, head_dim 32, bf16


def engine_args(tiny_model: str, *rest: str):
    from dynamo.vllm import vllm_args

    config = backend_args.parse_args(["--engine", "vllm", "--model", tiny_model, *rest], env={})
    return vllm_args.engine_args_from_config(config)


def test_without_a_size_the_cache_fits_the_model_and_one_info_line_says_so(tiny_model, caplog):
    args = engine_args(tiny_model)
    with caplog.at_level(logging.INFO, logger="dynamo.vllm.cpu_kv_cache"):
        size = apply_cpu_default(args, env={})
    assert size == args.kv_cache_memory_bytes == 64 * 1024**2  # the floor, for 512 tokens
    (line,) = [r.getMessage() for r in caplog.records if r.name == "dynamo.vllm.cpu_kv_cache"]
    assert line.startswith("KV cache on CPU: 64 MiB (67108864 bytes), room for 256 sequences of")
    assert f"512 tokens (max_model_len) at {TINY_BYTES_PER_TOKEN} bytes a token" in line


def test_a_smaller_max_model_len_is_what_the_size_is_for(tiny_model, caplog):
    args = engine_args(tiny_model, "--max-model-len", "128")
    with caplog.at_level(logging.INFO, logger="dynamo.vllm.cpu_kv_cache"):
        apply_cpu_default(args, env={})
    assert "of 128 tokens (max_model_len)" in caplog.text


@pytest.mark.parametrize(
    ("rest", "env"),
    [(("--kv-cache-memory-bytes", "32M"), {}), ((), {KV_SPACE_ENV: "1"})],
    ids=["flag", "env"],
)
def test_a_size_the_operator_gives_is_left_alone(tiny_model, rest, env, caplog):
    args = engine_args(tiny_model, *rest)
    before = args.kv_cache_memory_bytes
    assert apply_cpu_default(args, env=env) is None
    assert args.kv_cache_memory_bytes == before
    assert "KV cache on CPU" not in caplog.text


def test_a_model_vllm_cannot_read_is_left_to_engine_init(tmp_path):
    args = engine_args(str(tmp_path / "no-model-here"))
    assert apply_cpu_default(args, env={}) is None and args.kv_cache_memory_bytes is None

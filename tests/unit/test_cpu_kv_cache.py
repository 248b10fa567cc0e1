"""The CPU KV cache size the worker picks when the operator gives none (issue 21, item 2); its
use on the real vLLM is tests/vllm/test_cpu_kv_cache_vllm.py."""

from __future__ import annotations

import pytest

from dynamo.vllm.cpu_kv_cache import (
    CEILING_BYTES,
    FLOOR_BYTES,
    FULL_SEQUENCES,
    kv_cache_bytes,
)

MiB = 1024**2


@pytest.mark.parametrize(
    ("per_token", "max_model_len", "expected"),
    [
        (512, 512, FLOOR_BYTES),  # the tiny model: 1 MiB for 4 sequences, the floor wins
        (114_688, 4096, FULL_SEQUENCES * 114_688 * 4096),  # Qwen3-0.6B at 4096: 1.75 GiB
        (57_344, 32_768, CEILING_BYTES),  # 7 GiB for four: capped
        (1024**2, 8192, 8 * 1024**3),  # one sequence over the cap: one sequence, or no start
    ],
    ids=["floor", "four-sequences", "ceiling", "one-sequence-over-the-ceiling"],
)
def test_the_size_is_four_full_sequences_within_floor_and_ceiling(
    per_token, max_model_len, expected
):
    assert kv_cache_bytes(per_token, max_model_len) == expected
    assert kv_cache_bytes(per_token, max_model_len) >= per_token * max_model_len


def test_the_bounds_are_the_documented_ones():
    assert (FLOOR_BYTES, CEILING_BYTES, FULL_SEQUENCES) == (64 * MiB, 4096 * MiB, 4)

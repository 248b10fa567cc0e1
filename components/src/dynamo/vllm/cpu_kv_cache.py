"""A KV cache size for vLLM on a machine without a GPU, when the operator gives none.

Without ``--kv-cache-memory-bytes`` (or vLLM's legacy ``VLLM_CPU_KVCACHE_SPACE``, in GiB), vLLM's
CPU worker reserves ``--gpu-memory-utilization`` (0.9) of the NUMA node's *total* memory for
itself and refuses to start when less than that is free (on a shared machine it usually is);
when it does start, the cache is tens of GiB and start-up takes over a minute. So on CPU the
worker sizes the cache from the model instead: room for :data:`FULL_SEQUENCES` sequences of
``max_model_len`` tokens (vLLM's own ``ModelConfig``: the model's context length unless
``--max-model-len`` says otherwise), at the bytes a token's keys and values take in every
layer, kept between :data:`FLOOR_BYTES` and :data:`CEILING_BYTES` and never below one full
sequence (vLLM refuses a cache that cannot hold one). It says so in one INFO line. Anything
the operator gives wins; on a GPU nothing changes.

Importing this module imports nothing of vLLM; :func:`apply_cpu_default` does, and is called
only for ``--engine vllm``, after vLLM is imported.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)

FULL_SEQUENCES = 4
FLOOR_BYTES = 64 * 1024**2
CEILING_BYTES = 4 * 1024**3
KV_BYTES_FLAG = "--kv-cache-memory-bytes"
KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"


def kv_cache_bytes(bytes_per_token: int, max_model_len: int) -> int:
    """:data:`FULL_SEQUENCES` sequences of ``max_model_len`` tokens, within the floor and the
    ceiling, and never less than one full sequence."""
    one_sequence = bytes_per_token * max_model_len
    budget = min(max(one_sequence * FULL_SEQUENCES, FLOOR_BYTES), CEILING_BYTES)
    return max(budget, one_sequence)


def bytes_per_token(model_config: Any, kv_cache_dtype: str) -> int:
    """Keys and values of one token in every layer (all heads: with tensor parallelism each
    rank needs less, so this is an upper bound)."""
    from vllm.config import ParallelConfig

    parallel = ParallelConfig()
    heads = model_config.get_num_kv_heads(parallel)
    layers = model_config.get_num_layers(parallel)
    itemsize = 1 if kv_cache_dtype.startswith("fp8") else model_config.dtype.itemsize
    return 2 * layers * heads * model_config.get_head_size() * itemsize


def apply_cpu_default(engine_args: Any, env: Mapping[str, str] | None = None) -> int | None:
    """Set ``engine_args.kv_cache_memory_bytes`` on a CPU-only vLLM when neither it nor
    ``VLLM_CPU_KVCACHE_SPACE`` is given; the size chosen, or None (nothing changed).

    A model vLLM cannot read yet is left alone: engine init reports it as it would have.
    """
    from vllm.platforms import current_platform

    env = os.environ if env is None else env
    if not current_platform.is_cpu() or engine_args.kv_cache_memory_bytes is not None:
        return None
    if env.get(KV_SPACE_ENV, "") != "":
        return None
    if _utilization_chosen(engine_args):
        return None  # the user sized the cache by --gpu-memory-utilization: vLLM's rule applies
    try:
        model_config = engine_args.create_model_config()
        per_token = bytes_per_token(model_config, str(engine_args.kv_cache_dtype or "auto"))
    except Exception as exc:  # noqa: BLE001 - vLLM's engine init says what is wrong, later
        logger.debug("No CPU KV cache default: vLLM cannot read the model yet (%s)", exc)
        return None
    max_model_len = model_config.max_model_len
    size = kv_cache_bytes(per_token, max_model_len)
    engine_args.kv_cache_memory_bytes = size
    logger.info(
        "KV cache on CPU: %s (%d bytes), room for %d sequences of %d tokens (max_model_len) at "
        "%d bytes a token, as neither %s nor %s was given; pass %s to choose",
        _human(size),
        size,
        size // (per_token * max_model_len),
        max_model_len,
        per_token,
        KV_BYTES_FLAG,
        KV_SPACE_ENV,
        KV_BYTES_FLAG,
    )
    return size


def _utilization_chosen(engine_args: Any) -> bool:
    """Whether ``--gpu-memory-utilization`` was given a value other than vLLM's default (on CPU
    it is the share of the node's memory vLLM reserves for the KV cache)."""
    defaults = {f.name: f.default for f in dataclasses.fields(type(engine_args))}
    default = defaults.get("gpu_memory_utilization", dataclasses.MISSING)
    chosen = getattr(engine_args, "gpu_memory_utilization", default)
    return default is not dataclasses.MISSING and chosen != default


def _human(size: int) -> str:
    if size >= 1024**3:
        return f"{size / 1024**3:.1f} GiB"
    return f"{size / 1024**2:.0f} MiB"

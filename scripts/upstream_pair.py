"""Upstream ai-dynamo's frontend and its workers on one machine: what they need to find each
other on loopback, the model directory the mocker serves, and the mocker's and the vLLM
worker's command lines.

Shared by scripts/ab_upstream.py and tests/upstream (run with the upstream environment's Python,
scripts/setup_upstream_env.sh). One machine, no etcd, no NATS: file discovery under a directory
of the caller's (``DYN_FILE_KV``), the TCP request plane, every host pinned to 127.0.0.1 (without
that upstream binds and advertises the machine's other address), the hub offline. The model is
the tiny tokenizer (scripts/make_tiny_model.py --tokenizer-only) with a small Llama
``config.json``, which is what upstream's mocker needs to serve it.
"""

from __future__ import annotations

import json
from pathlib import Path

import make_tiny_model
from bench_common import VLLM_ARGS

MODEL = "tiny"
# Upstream's frontend logs this once its HTTP service is about to accept.
HTTP_STARTED = r"Starting HTTP\(S\) service"


def loopback_env(kv_dir: Path) -> dict[str, str]:
    """The env of every upstream process of one pair: file discovery in ``kv_dir``, loopback."""
    return {
        "DYN_FILE_KV": str(kv_dir),
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1",
        "HF_HUB_OFFLINE": "1",
        "DYN_SDK_DISABLE_ANSI_LOGGING": "1",  # plain log lines, for the callers' patterns
        "NO_COLOR": "1",
    }


def tiny_model_dir(out: Path) -> Path:
    """The tiny tokenizer and a Llama ``config.json`` of the tiny model's recipe in ``out``."""
    make_tiny_model.build(out, tokenizer_only=True)
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    ids = {**tokenizer["model"]["vocab"]}
    ids.update({token["content"]: token["id"] for token in tokenizer.get("added_tokens", [])})
    recipe = make_tiny_model.RECIPE
    shape = (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
    )
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": max(ids.values()) + 1,
        **{key: recipe[key] for key in shape},
        "bos_token_id": ids[make_tiny_model.BOS],
        "eos_token_id": ids[make_tiny_model.EOS],
        "pad_token_id": ids[make_tiny_model.PAD],
        "torch_dtype": recipe["dtype"],
        "tie_word_embeddings": False,
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def mocker_args(model_dir: Path, speedup_ratio: float) -> list[str]:
    """``python -m dynamo.mocker``'s arguments serving :data:`MODEL` from ``model_dir``."""
    return [
        "--model-path",
        str(model_dir),
        "--model-name",
        MODEL,
        "--discovery-backend",
        "file",
        "--speedup-ratio",
        f"{speedup_ratio:g}",
    ]


def vllm_worker_args(model_dir: Path | str) -> list[str]:
    """``python -m dynamo.vllm``'s arguments (and so ``python -m dynamo_gc.vllm``'s) serving
    :data:`MODEL` from the tiny model (scripts/make_tiny_model.py, the full model: weights
    included) on vLLM's CPU engine, with the benchmarks' small engine footprint."""
    return [
        "--model",
        str(model_dir),
        "--served-model-name",
        MODEL,
        "--discovery-backend",
        "file",
        "--request-plane",
        "tcp",
        *VLLM_ARGS,
    ]


def main(argv: list[str] | None = None) -> None:
    """``python scripts/upstream_pair.py model DIR``: write the tiny model's directory (what
    upstream's mocker serves as :data:`MODEL`) into DIR and print it (docs/ai-dynamo.md)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("what", choices=["model"])
    parser.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    print(tiny_model_dir(args.dir))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Build a tiny random-weight Llama and its tokenizer, offline and deterministically.

No weights can be downloaded here, yet vLLM needs a real Hugging Face model directory. This
script makes one from nothing: a byte-level BPE tokenizer (about 1k tokens) trained with
``tokenizers`` on a text built into this file, a simple chat template, and a 2-layer Llama with
seeded random weights, saved with ``save_pretrained``. The model talks nonsense; it exists so the
real engine, with its real heap, can start and stream tokens in tests and benchmarks.

    python scripts/make_tiny_model.py [--out DIR] [--force]
    python scripts/make_tiny_model.py --tokenizer-only [--out DIR] [--force]

Prints the model directory on stdout. A second run reuses the directory when its recipe stamp
matches (``--force`` rebuilds). The full model needs torch, transformers and tokenizers (the vLLM
venv has them: scripts/setup_vllm_env.sh). ``--tokenizer-only`` writes just the tokenizer files
(``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``) with ``tokenizers``
alone, in a second, from the default ``.venv-3.X``: the directory the mock engine
(``python -m dynamo.vllm --engine mock --model DIR``) and the frontend use. Both modes write the
same tokenizer files, so the mock counts in exactly the tiny model's vocabulary.

Shape notes: hidden 64 with 2 heads gives head dim 32, the smallest vLLM's CPU attention
supports; bfloat16 because vLLM's CPU platform runs in bfloat16 by default (it would downcast a
float32 checkpoint, with one warning per weight).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

logger = logging.getLogger("make_tiny_model")

CACHE_HOME = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
DEFAULT_OUT = CACHE_HOME / "dynamo-gc" / "tiny-llama"
DEFAULT_TOKENIZER_OUT = CACHE_HOME / "dynamo-gc" / "tiny-llama-tokenizer"
STAMP_NAME = ".tiny-model-recipe.json"
SEED = 20240601

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, PAD]

# Changing anything here changes the stamp, so cached copies are rebuilt.
RECIPE = {
    "recipe_version": 2,
    "vocab_size_target": 1024,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 512,
    "dtype": "bfloat16",
    "seed": SEED,
}

# A plain template: role markers the tokenizer knows as ordinary text. The frontend renders it
# (from chat_template.jinja) as transformers' apply_chat_template would.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# The training text: English prose plus code-like lines, so merges cover words, spaces,
# punctuation and digits. Built in so the tokenizer is the same on every machine.
CORPUS = """\
A Python serving process holds a large number of long-lived objects after start-up: imports,
tokenizer tables, parser registries and configuration. The garbage collector's full collection
walks every tracked object while holding the global interpreter lock, so its pause grows with
that heap. Freezing the heap at the right moment moves the static objects into the permanent
generation, which no later collection walks. The whole art is when: only where nothing is being
served, never while requests wait.
The frontend accepts a chat completion request, applies a chat template, turns the text into
token ids and sends them to a worker. The worker runs the model one step at a time and streams
the new tokens back. When the client goes away, the request is aborted and its cache blocks are
freed for the next one. The user asks a question and the assistant answers it.
Beautiful is better than ugly. Explicit is better than implicit. Simple is better than complex.
Complex is better than complicated. Flat is better than nested. Sparse is better than dense.
Readability counts. Special cases aren't special enough to break the rules. Although
practicality beats purity. Errors should never pass silently. Unless explicitly silenced.
In the face of ambiguity, refuse the temptation to guess. There should be one-- and preferably
only one --obvious way to do it. Now is better than never. Although never is often better than
right now. If the implementation is hard to explain, it's a bad idea. If the implementation is
easy to explain, it may be a good idea. Namespaces are one honking great idea -- let's do more.
def forward(self, batch_size: int, seq_len: int) -> None:
    for step in range(10):
        tokens = [i % 256 for i in range(seq_len)]
        result = {"request_id": str(step), "token_ids": tokens, "max_tokens": 16}
        print(json.dumps(result), file=sys.stderr)
The quick brown fox jumps over the lazy dog. 0123456789 + - * / = < > ( ) [ ] { } , . ; : ! ?
Hello! How are you today? I am fine, thank you. What is the weather like? It is sunny and warm.
Please summarise the following text in one sentence. Translate this into French. Write a poem
about the sea, the wind, the mountains and the rivers that run from them into the valleys below.
"""


def recipe_digest(*, tokenizer_only: bool = False) -> str:
    payload = json.dumps(
        {
            "recipe": RECIPE,
            "template": CHAT_TEMPLATE,
            "corpus": CORPUS,
            "special": SPECIAL_TOKENS,
            "tokenizer_only": tokenizer_only,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def is_built(out: Path, *, tokenizer_only: bool = False) -> bool:
    try:
        stamp = json.loads((out / STAMP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return stamp.get("digest") == recipe_digest(tokenizer_only=tokenizer_only)


def train_tokenizer():
    """The tiny byte-level BPE tokenizer, with ``tokenizers`` alone (no transformers)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=RECIPE["vocab_size_target"],
        min_frequency=1,
        show_progress=False,
        special_tokens=SPECIAL_TOKENS,
        # Every byte is in the vocabulary, so any text encodes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # Several copies of the corpus, so pair counts are large enough to order merges stably.
    tokenizer.train_from_iterator([CORPUS] * 8, trainer=trainer)
    return tokenizer


def write_tokenizer_files(tokenizer, out: Path) -> None:
    """tokenizer.json, tokenizer_config.json and chat_template.jinja, as Hugging Face lays them
    out (transformers' AutoTokenizer and vLLM load them; the frontend reads them directly)."""
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": RECIPE["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")


def build_model(tokenizer):
    # Set before transformers is imported (here, not when this module is imported: the tests
    # import it for the recipe): nothing may reach a hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=RECIPE["hidden_size"],
        intermediate_size=RECIPE["intermediate_size"],
        num_hidden_layers=RECIPE["num_hidden_layers"],
        num_attention_heads=RECIPE["num_attention_heads"],
        num_key_value_heads=RECIPE["num_key_value_heads"],
        head_dim=RECIPE["head_dim"],
        max_position_embeddings=RECIPE["max_position_embeddings"],
        bos_token_id=tokenizer.token_to_id(BOS),
        eos_token_id=tokenizer.token_to_id(EOS),
        pad_token_id=tokenizer.token_to_id(PAD),
        tie_word_embeddings=False,
        dtype=RECIPE["dtype"],
    )
    torch.manual_seed(RECIPE["seed"])
    model = LlamaForCausalLM(config).to(getattr(torch, RECIPE["dtype"]))
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    return model


def build(out: Path, *, force: bool = False, tokenizer_only: bool = False) -> Path:
    """Build the model (or only its tokenizer) into ``out`` unless a copy of this recipe is
    already there."""
    out = out.expanduser().resolve()
    if not force and is_built(out, tokenizer_only=tokenizer_only):
        logger.info("reusing %s", out)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time (parallel test workers, a benchmark beside the tests): a second one
    # waits, then reuses what the first built instead of replacing it under its readers.
    with _build_lock(out):
        if not force and is_built(out, tokenizer_only=tokenizer_only):
            logger.info("reusing %s (built meanwhile)", out)
            return out
        _build_into(out, tokenizer_only=tokenizer_only)
    return out


@contextlib.contextmanager
def _build_lock(out: Path):
    with open(out.parent / f".{out.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _build_into(out: Path, *, tokenizer_only: bool) -> None:
    # Build beside the target and swap it in, so a reader never sees a half-written directory.
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        staging.chmod(0o755)  # mkdtemp's 0700 would outlive the rename
        tokenizer = train_tokenizer()
        if not tokenizer_only:
            build_model(tokenizer).save_pretrained(staging)
        write_tokenizer_files(tokenizer, staging)
        stamp = {"digest": recipe_digest(tokenizer_only=tokenizer_only), "recipe": RECIPE}
        (staging / STAMP_NAME).write_text(
            json.dumps({**stamp, "tokenizer_only": tokenizer_only}, sort_keys=True, indent=1),
            encoding="utf-8",
        )
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    what = "tokenizer" if tokenizer_only else "model"
    logger.info("built %s %s (vocab %d)", what, out, tokenizer.get_vocab_size())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"model directory (default: {DEFAULT_OUT}; with --tokenizer-only "
        f"{DEFAULT_TOKENIZER_OUT})",
    )
    parser.add_argument(
        "--tokenizer-only",
        action="store_true",
        help="only the tokenizer files (needs tokenizers, no torch or transformers)",
    )
    parser.add_argument(
        "--force", action="store_true", help="rebuild even if the directory is current"
    )
    args = parser.parse_args(argv)
    out = args.out or (DEFAULT_TOKENIZER_OUT if args.tokenizer_only else DEFAULT_OUT)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    print(build(out, force=args.force, tokenizer_only=args.tokenizer_only))
    return 0


if __name__ == "__main__":
    sys.exit(main())

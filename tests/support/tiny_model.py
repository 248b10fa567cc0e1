"""The tiny model's tokenizer: the mock worker's ``--model`` and the frontend's tokenizer in tests.

One recipe, ``scripts/make_tiny_model.py --tokenizer-only`` (``tokenizers`` alone, no torch):
built once per machine into its cache (``DYNAMO_TINY_TOKENIZER_DIR`` overrides where), the very
directory the benchmarks and ``./dev.sh icebox`` use, so the mock counts in the tiny model's
vocabulary. Tests that change the files work on a copy (:func:`build_tiny_tokenizer`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import make_tiny_model  # scripts/ is on sys.path (pyproject.toml: pytest's pythonpath)

from dynamo.runtime.model_card import ModelCard

BOS = make_tiny_model.BOS
EOS = make_tiny_model.EOS

_built: str | None = None


def tiny_tokenizer_dir() -> str:
    """The cached tokenizer directory (built on first use). Never write into it.

    The cache only saves a second of training: where it cannot be used (a home directory that is
    read-only, a file system without file locks), this process builds a private copy in a
    temporary directory instead, with a warning, rather than failing every test that needs it.
    """
    global _built
    if _built is None:
        out = os.environ.get("DYNAMO_TINY_TOKENIZER_DIR") or make_tiny_model.DEFAULT_TOKENIZER_OUT
        try:
            _built = str(make_tiny_model.build(Path(out), tokenizer_only=True))
        except OSError as exc:
            private_root = tempfile.mkdtemp(prefix="dynamo-tiny-tokenizer-")
            atexit.register(shutil.rmtree, private_root, ignore_errors=True)
            private = Path(private_root) / "tokenizer"
            warnings.warn(
                f"the tiny tokenizer's cache {out} cannot be used ({exc}); built a private copy "
                f"in {private}",
                stacklevel=2,
            )
            _built = str(make_tiny_model.build(private, tokenizer_only=True))
    return _built


def build_tiny_tokenizer(out: Path, *, chat_template: bool = True) -> Path:
    """A copy of the tokenizer files in ``out`` (``chat_template=False``: without the model's
    ``chat_template.jinja``), for a test that changes or removes them."""
    shutil.copytree(tiny_tokenizer_dir(), out, ignore=shutil.ignore_patterns(".*"))
    if not chat_template:
        (out / "chat_template.jinja").unlink()
    return out


def mock_worker_env() -> dict[str, str]:
    """The env that makes ``python -m dynamo.vllm`` the mock engine on the tiny tokenizer."""
    return {"DYN_VLLM_ENGINE": "mock", "DYN_VLLM_MODEL": tiny_tokenizer_dir()}


def tiny_card(tokenizer_dir: Path | str, name: str = "tiny", **overrides) -> ModelCard:
    """A model card for the tokenizer in ``tokenizer_dir``, served as ``name``."""
    from tokenizers import Tokenizer

    eos = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json")).token_to_id(EOS)
    fields: dict[str, Any] = dict(
        served_model_name=name,
        model_path=str(tokenizer_dir),
        tokenizer_path=str(tokenizer_dir),
        context_length=make_tiny_model.RECIPE["max_position_embeddings"],
        eos_token_ids=(eos,),
    )
    fields.update(overrides)
    return ModelCard(**fields)

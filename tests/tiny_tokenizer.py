"""The tiny model's tokenizer files, built offline with ``tokenizers`` alone (no torch).

The same recipe as ``scripts/make_tiny_model.py`` (its corpus, special tokens, vocabulary size
and chat template, imported from the script), written as a model directory holds them:
``tokenizer.json``, ``tokenizer_config.json`` (BOS/EOS) and ``chat_template.jinja``. Tests of
the frontend's processor use it where the vLLM venv (which builds the whole model) is absent.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from dynamo.runtime.model_card import ModelCard

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "make_tiny_model", REPO / "scripts" / "make_tiny_model.py"
)
make_tiny_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_tiny_model)

BOS = make_tiny_model.BOS
EOS = make_tiny_model.EOS


def build_tiny_tokenizer(out: Path, *, chat_template: bool = True) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    recipe = make_tiny_model
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.RECIPE["vocab_size_target"],
        min_frequency=1,
        show_progress=False,
        special_tokens=recipe.SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator([recipe.CORPUS] * 8, trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": make_tiny_model.PAD,
        "model_max_length": recipe.RECIPE["max_position_embeddings"],
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    if chat_template:
        (out / "chat_template.jinja").write_text(recipe.CHAT_TEMPLATE, encoding="utf-8")
    return out


def tiny_card(tokenizer_dir: Path | str, name: str = "tiny", **overrides) -> ModelCard:
    from tokenizers import Tokenizer

    eos = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json")).token_to_id(EOS)
    fields = dict(
        served_model_name=name,
        model_path=str(tokenizer_dir),
        tokenizer_path=str(tokenizer_dir),
        context_length=make_tiny_model.RECIPE["max_position_embeddings"],
        eos_token_ids=(eos,),
    )
    fields.update(overrides)
    return ModelCard(**fields)

"""A SentencePiece-style tokenizer for token-string tests (tests/unit/test_token_strings.py,
tests/vllm/test_token_strings_vllm.py): real, trained with ``tokenizers`` alone."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


def metaspace_tokenizer() -> Tokenizer:
    """A SentencePiece-style BPE (Metaspace pre-tokenizer and decoder, as Mistral's and T5's
    tokenizer.json have), trained on a few words."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>"], show_progress=False)
    tokenizer.train_from_iterator(["the snow and the ice in the north"] * 8, trainer=trainer)
    return tokenizer

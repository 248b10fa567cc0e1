"""A built-in byte-level tokenizer: UTF-8 bytes are token ids 0..255.

It stands in for a model's real tokenizer, so it is built like one: a vocabulary dict (printable
token text -> id), a reverse table (id -> token), special tokens, and a block of merged
multi-byte tokens that the decoder knows. Encoding is purely byte-level (plus special tokens);
the merged tokens only matter when an engine emits their ids.

Building the tables allocates a few thousand tracked objects per tokenizer. That is the point:
the frontend builds one per discovered model, which is the long-lived heap a real frontend grows
after start-up (and after its freeze). ``merged_tokens`` sets the size.
"""

from __future__ import annotations

import codecs
import itertools
import re
from dataclasses import dataclass

BYTE_TOKENS = 256
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Merged tokens per tokenizer. Each adds one tracked Token object (plus its vocab entry), so the
# default gives a per-model table of ~2.3k tracked objects: small next to a real tokenizer, big
# enough to be a real heap and to show that building it never triggers a freeze.
DEFAULT_MERGED_TOKENS = 2048
# What an id no table knows decodes to (the Unicode replacement character, as real detokenizers).
UNKNOWN_TOKEN_TEXT = "\ufffd"

# Letters in rough English frequency order, to build merged tokens that look like real ones.
_MERGE_ALPHABET = "etaoinshrdlcumwfgypbvkjxqz"


@dataclass(frozen=True, slots=True)
class Token:
    id: int
    text: str  # printable form: byte-level alphabet for bytes, the literal for specials
    raw: bytes  # what the token decodes to (empty for special tokens)
    special: bool = False


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, so every token has a readable vocab key."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    mapping = {byte: chr(byte) for byte in printable}
    shift = 0
    for byte in range(BYTE_TOKENS):
        if byte not in mapping:
            mapping[byte] = chr(256 + shift)
            shift += 1
    return mapping


def _merged_pieces(count: int):
    """Deterministic multi-byte pieces: 'e', 'et', ' the'-like words, with and without a space."""
    lengths = itertools.count(2)
    produced = 0
    while produced < count:
        length = next(lengths)
        for letters in itertools.product(_MERGE_ALPHABET[: max(4, 12 - length)], repeat=length):
            for prefix in ("", " "):
                if produced == count:
                    return
                yield prefix + "".join(letters)
                produced += 1


@dataclass
class TokenizerTables:
    vocab: dict[str, int]
    tokens: list[Token]  # the reverse table: tokens[id]
    special_ids: dict[str, int]

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)


def build_tokenizer_tables(merged_tokens: int = DEFAULT_MERGED_TOKENS) -> TokenizerTables:
    if merged_tokens < 0:
        raise ValueError("merged_tokens must be >= 0")
    byte_chars = bytes_to_unicode()
    tokens = [Token(byte, byte_chars[byte], bytes([byte])) for byte in range(BYTE_TOKENS)]
    special_ids = {}
    for text in SPECIAL_TOKENS:
        special_ids[text] = len(tokens)
        tokens.append(Token(len(tokens), text, b"", special=True))
    for piece in _merged_pieces(merged_tokens):
        raw = piece.encode("utf-8")
        text = "".join(byte_chars[b] for b in raw)
        tokens.append(Token(len(tokens), text, raw))
    vocab = {token.text: token.id for token in tokens}
    return TokenizerTables(vocab=vocab, tokens=tokens, special_ids=special_ids)


class ByteTokenizer:
    """Text -> ids (UTF-8 bytes, special tokens kept whole) and ids -> text."""

    def __init__(self, tables: TokenizerTables | None = None) -> None:
        self.tables = tables if tables is not None else build_tokenizer_tables()
        self._special_pattern = re.compile(
            "(" + "|".join(re.escape(s) for s in self.tables.special_ids) + ")"
        )

    @property
    def vocab_size(self) -> int:
        return self.tables.vocab_size

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        # re.split with a capturing group alternates plain text and special-token literals.
        for index, part in enumerate(self._special_pattern.split(text)):
            if index % 2:
                ids.append(self.tables.special_ids[part])
            elif part:
                ids.extend(part.encode("utf-8"))  # byte value == token id
        return ids

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        detokenizer = self.detokenizer(skip_special_tokens=skip_special_tokens)
        return detokenizer.add(ids) + detokenizer.finish()

    def detokenizer(self, *, skip_special_tokens: bool = False) -> "IncrementalDetokenizer":
        return IncrementalDetokenizer(self.tables, skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    """Decode a token stream piece by piece.

    A multi-byte UTF-8 character can be split across tokens (and so across streamed chunks);
    the incremental decoder holds the partial bytes back instead of emitting replacement
    characters mid-character.
    """

    def __init__(self, tables: TokenizerTables, *, skip_special_tokens: bool = False) -> None:
        self._tokens = tables.tokens
        self._skip_special = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, ids: list[int]) -> str:
        out: list[str] = []
        pending = bytearray()
        for token_id in ids:
            token = self._tokens[token_id] if 0 <= token_id < len(self._tokens) else None
            if token is not None and not token.special:
                pending += token.raw
                continue
            # A special or unknown token ends the byte run: flush what it completed first.
            if pending:
                out.append(self._utf8.decode(bytes(pending)))
                pending.clear()
            if token is None:
                out.append(self._utf8.decode(b"", final=True) + UNKNOWN_TOKEN_TEXT)
            elif not self._skip_special:
                out.append(self._utf8.decode(b"", final=True) + token.text)
        if pending:
            out.append(self._utf8.decode(bytes(pending)))
        return "".join(out)

    def finish(self) -> str:
        """What is left at the end of the stream (an incomplete character becomes U+FFFD)."""
        return self._utf8.decode(b"", final=True)

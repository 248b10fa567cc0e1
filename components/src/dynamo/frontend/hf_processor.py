"""The ``hf`` chat processor's parts: the model's own tokenizer and chat template, no torch.

* :class:`HfTokenizer` loads ``tokenizer.json`` with Hugging Face ``tokenizers`` (the Rust
  tokenizer every fast Hugging Face tokenizer wraps) and decodes a stream of ids with its
  ``DecodeStream``, so a character split over several tokens (a multi-byte UTF-8 sequence, a
  byte-fallback run) comes out whole once it is complete, never as U+FFFD halves.
* :class:`HfChatTemplate` renders the model's Jinja chat template the way ``transformers``'
  ``apply_chat_template`` does (``transformers/utils/chat_template_utils.py``): an
  ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, the
  ``loopcontrols`` extension, a ``tojson`` filter that does not escape HTML, the
  ``raise_exception`` and ``strftime_now`` globals, and the tokenizer's special tokens
  (``bos_token``, ``eos_token``, ...) as variables beside ``messages`` and
  ``add_generation_prompt``.

Where the template comes from, first found wins: the model card's ``chat_template_path`` (vLLM's
``--chat-template``), ``chat_template.jinja`` in the tokenizer directory (where ``transformers``
5 saves it), then ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of named
templates of which ``default`` is used, as ``transformers`` does).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from dynamo.runtime.tokenizer_config import token_text

from .model_files import (
    MAX_CONFIG_BYTES,
    MAX_TEMPLATE_BYTES,
    MAX_TOKENIZER_BYTES,
    ModelFiles,
    ModelFilesError,
    as_files,
)

__all__ = ["ModelFilesError"]  # re-exported: where the processors have always raised it from

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
# The special-token attributes transformers passes to every template
# (its SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class ChatTemplateError(ValueError):
    """The template rejected the conversation (its ``raise_exception``) or failed to render."""


@contextmanager
def rendering_errors() -> Iterator[None]:
    """What a chat template raises while it renders, as the client's :class:`ChatTemplateError`:
    its own ``raise_exception``, or a template that assumes a message shape the request does not
    have (every processor renders through this, whichever library runs the template)."""
    try:
        yield
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(str(exc)) from None
    except (TypeError, ValueError, LookupError, AttributeError) as exc:
        raise ChatTemplateError(f"{type(exc).__name__}: {exc}") from None


def read_tokenizer_config(tokenizer_dir: str | Path | ModelFiles) -> dict:
    """``tokenizer_config.json`` of the directory, or ``{}`` when the model has none."""
    files = as_files(tokenizer_dir)
    path = files.file(TOKENIZER_CONFIG_FILE)
    if path is None:
        return {}
    try:
        data = json.loads(files.read_text(path, MAX_CONFIG_BYTES))
    except (ValueError, RecursionError) as exc:
        raise ModelFilesError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ModelFilesError(f"{path} is not a JSON object")
    return data


def special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
    """The template variables ``bos_token``, ``eos_token``, ... that the config defines."""
    found = {}
    for name in SPECIAL_TOKEN_NAMES:
        text = token_text(config.get(name))
        if text is not None:
            found[name] = text
    return found


def find_chat_template(
    tokenizer_dir: str | Path | ModelFiles,
    config: Mapping[str, Any],
    override_path: str | None = None,
) -> str | None:
    """The model's chat template source (see the module docstring for the order), or None.
    Files are read through :class:`~.model_files.ModelFiles` (confined, bounded)."""
    files = as_files(tokenizer_dir)
    path = files.template(override_path) if override_path is not None else None
    if path is None:
        path = files.file(CHAT_TEMPLATE_FILE)
    if path is not None:
        return files.read_text(path, MAX_TEMPLATE_BYTES)
    template = config.get("chat_template")
    if isinstance(template, str):
        return template
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {
            t.get("name"): t.get("template")
            for t in template
            if isinstance(t, Mapping) and isinstance(t.get("template"), str)
        }
        return named.get("default")
    return None


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson escapes <, >, & for HTML; chat templates need the text as it is.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def chat_template_environment() -> ImmutableSandboxedEnvironment:
    """The Jinja environment transformers renders chat templates in (see the module docstring).

    transformers' ``{% generation %}`` tag (assistant-token masks for training) is not
    supported: a template that uses it fails to compile with a clear message.
    """
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class HfChatTemplate:
    def __init__(self, source: str, variables: Mapping[str, str]) -> None:
        try:
            self._template = chat_template_environment().from_string(source)
        except jinja2.exceptions.TemplateError as exc:
            raise ModelFilesError(f"the chat template does not compile: {exc}") from None
        self._variables = dict(variables)

    def render(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True
    ) -> str:
        with rendering_errors():
            return self._template.render(
                messages=list(messages),
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self._variables,
            )


class HfTokenizer:
    """``tokenizer.json`` through ``tokenizers``: encode, and one decoder stream per request."""

    def __init__(self, tokenizer_dir: str | Path | ModelFiles) -> None:
        files = as_files(tokenizer_dir)
        path = files.file(TOKENIZER_FILE)
        if path is None:
            raise ModelFilesError(
                f"{files.directory / TOKENIZER_FILE} does not exist (the processor needs "
                "tokenizer.json)"
            )
        # Read here (confined, regular, bounded), parsed from memory: nothing is reopened.
        text = files.read_text(path, MAX_TOKENIZER_BYTES)
        try:
            self._tokenizer = Tokenizer.from_str(text)
        except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception
            raise ModelFilesError(f"cannot load {path}: {exc}") from None
        # The largest id a prompt may hold, as vLLM computes it (added tokens included; ids
        # need not be contiguous). Read once: the vocabulary dict is built for it and dropped.
        self.max_token_id = max(self._tokenizer.get_vocab(with_added_tokens=True).values())

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        # encode_batch, not encode: the same ids, but it releases the GIL while it works, so
        # the event loop keeps running while a preprocessing thread tokenises a long prompt
        # (encode holds it for the whole prompt: seconds for a megabyte).
        return self._tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: Iterable[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)

    def detokenizer(self) -> StreamDetokenizer:
        return StreamDetokenizer(self._tokenizer)


class StreamDetokenizer:
    """Incremental decoding of one completion; special tokens (EOS, ...) are not shown.

    ``add`` returns the text the new ids complete; a partial character stays inside the
    ``DecodeStream`` until the id that completes it arrives. An id the vocabulary does not know
    (a worker bug) is dropped rather than failing the whole stream.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=True)
        self._vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self._held: list[int] = []  # ids since the last text: an incomplete character

    def add(self, ids: Iterable[int]) -> str:
        pieces = []
        for token_id in ids:
            if not 0 <= token_id < self._vocab_size:
                continue
            text = self._stream.step(self._tokenizer, token_id)
            if text is None:
                self._held.append(token_id)
            else:
                self._held.clear()
                pieces.append(text)
        return "".join(pieces)

    def finish(self) -> str:
        """The end of the stream: a character left incomplete decodes as a full decode would
        (U+FFFD), so the streamed text equals ``decode`` of every id."""
        held, self._held = self._held, []
        return self._tokenizer.decode(held, skip_special_tokens=True) if held else ""

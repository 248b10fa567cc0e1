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
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from dynamo.runtime.chat_template import TemplateValueTooLarge, chat_template_environment
from dynamo.runtime.template_files import MAX_TEMPLATE_BYTES
from dynamo.runtime.tokenizer_config import token_text

from .model_files import (
    MAX_CONFIG_BYTES,
    MAX_TOKENIZER_BYTES,
    ModelFiles,
    ModelFilesError,
    as_files,
)
from .native_calls import native_call

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
    """The template rejected the conversation: its ``raise_exception``, or a request the
    library refuses to render (``continue_final_message`` with no text to continue). The
    client's 400, as vLLM answers it."""


class ChatTemplateFailed(Exception):
    """The template failed: it raised anything but its ``raise_exception`` (a division by zero,
    an attribute a message does not have, what the sandbox forbids), or rendered text that is
    no prompt (a lone surrogate). The model's fault, not the request's: a 502
    (docs/security.md). ``str()`` is the error's type and text, the template's to choose."""


@dataclass(frozen=True)
class RenderOptions:
    """What a chat request adds to its messages when the template renders them, as
    transformers' ``apply_chat_template`` takes them (every processor renders with these)."""

    add_generation_prompt: bool = True
    # The request's chat_template_kwargs (names that would bypass a field are refused before).
    variables: Mapping[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None  # OpenAI's shape, as the client sent them
    documents: list[dict[str, str]] | None = None  # for a RAG template, as vLLM passes them
    # End the prompt inside the final message (transformers' apply_chat_template argument, not
    # a template variable).
    continue_final_message: bool = False

    def template_kwargs(self) -> dict[str, Any]:
        return {
            **self.variables,
            "add_generation_prompt": self.add_generation_prompt,
            "tools": self.tools or None,
            "documents": self.documents or None,
        }


PLAIN = RenderOptions()


@contextmanager
def rendering_errors() -> Iterator[None]:
    """What a chat template raises while it renders, sorted by whose fault it is (every
    processor renders through this, whichever library runs the template):

    * the template's own ``raise_exception`` (a bare ``jinja2.TemplateError``, in transformers'
      environment as in ours; Jinja itself raises only its subclasses), and a ``ValueError`` the
      library raised outside the template (transformers' checks of ``continue_final_message``):
      :class:`ChatTemplateError`, the client's 400;
    * a bound of the frontend's (:class:`TemplateValueTooLarge`) and ``MemoryError``: as they are;
    * anything else: :class:`ChatTemplateFailed`, the model's fault.
    """
    try:
        yield
    except (TemplateValueTooLarge, MemoryError, ChatTemplateError, ChatTemplateFailed):
        raise
    except Exception as exc:  # noqa: BLE001 - sorted below, every kind answered
        if type(exc) is jinja2.exceptions.TemplateError:
            raise ChatTemplateError(str(exc)) from None
        if isinstance(exc, ValueError) and not _raised_in_template(exc):
            raise ChatTemplateError(str(exc)) from None
        raise ChatTemplateFailed(f"{type(exc).__name__}: {exc}") from None


def _raised_in_template(exc: BaseException) -> bool:
    """Whether the template's code was running when ``exc`` was raised (Jinja names the
    frames of a template compiled from a string ``<template>``)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            return True
        tb = tb.tb_next
    return False


def check_rendered(text: str) -> str:
    """``text``, a rendered prompt, if it is text a tokenizer takes; else ChatTemplateFailed. A
    lone surrogate (``{{ '\\ud800' }}``, ``'%c' % 56320``) is no Unicode text: the tokenizer
    raises TypeError on it. Clients cannot send one (the request body refuses it), so one in a
    prompt is the template's."""
    if not text.isascii():
        found = _SURROGATE.search(text)
        if found is not None:
            raise ChatTemplateFailed(
                f"the rendered prompt is not valid Unicode: a lone surrogate "
                f"(U+{ord(found.group()):04X}) at character {found.start()}"
            )
    return text


_SURROGATE = re.compile("[\ud800-\udfff]")


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


class HfChatTemplate:
    """A model's template. ``compiled=False``: not compiled here (a peer's template compiles
    and renders in the template render processes, :mod:`.template_sandbox`, which compiled it
    once already to check it); it compiles at its first render in this process, if any."""

    def __init__(self, source: str, variables: Mapping[str, Any], *, compiled: bool = True) -> None:
        self._variables = dict(variables)
        self._source = source
        self._compiled: jinja2.Template | None = None
        if compiled:
            self._compile()

    def _compile(self) -> jinja2.Template:
        if self._compiled is None:
            try:
                self._compiled = chat_template_environment().from_string(self._source)
            except jinja2.exceptions.TemplateError as exc:
                raise ModelFilesError(f"the chat template does not compile: {exc}") from None
        return self._compiled

    @property
    def source(self) -> str:
        return self._source

    @property
    def variables(self) -> dict[str, Any]:
        """The model's own template variables (its special tokens)."""
        return self._variables

    def render(self, messages: Sequence[Mapping[str, Any]], options: RenderOptions = PLAIN) -> str:
        messages = list(messages)
        if options.continue_final_message:
            return self._continued(messages, options)
        with rendering_errors():
            # The request's variables after the model's (bos_token, ...), as transformers
            # passes apply_chat_template's kwargs.
            return self._compile().render(
                messages=messages, **{**self._variables, **options.template_kwargs()}
            )

    def _continued(self, messages: list[Mapping[str, Any]], options: RenderOptions) -> str:
        """transformers' ``continue_final_message``: the final message's content (its last text
        part, when it comes in parts) rendered with a tag after it, the prompt cut at the tag
        (and its trimmed spacing)."""
        content = messages[-1].get("content") if messages else None
        if content is None or "content" not in self._source:
            raise ChatTemplateError("continue_final_message: the final message has no content")
        final, tagged_content = _tag_final_text(content)
        tagged = [*messages[:-1], {**messages[-1], "content": tagged_content}]
        plain = RenderOptions(
            options.add_generation_prompt, options.variables, options.tools, options.documents
        )
        rendered = self.render(tagged, plain)
        if final.strip() not in rendered or _CONTINUE_TAG.strip() not in rendered:
            raise ChatTemplateError(
                "continue_final_message is set but the final message does not appear in the "
                "chat after applying the chat template"
            )
        at = rendered.rindex(_CONTINUE_TAG.strip())
        if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
            return rendered[:at]
        return rendered[:at].rstrip()


_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' own


def _tag_final_text(content: Any) -> tuple[str, Any]:
    """The text ``continue_final_message`` continues, and the content with the tag after it:
    a string, or the last part that has text (transformers' rule)."""
    if isinstance(content, str):
        return content, content + _CONTINUE_TAG
    if isinstance(content, (list, tuple)):
        parts = [dict(part) if isinstance(part, Mapping) else part for part in content]
        for part in reversed(parts):
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                final = part["text"]
                part["text"] = final + _CONTINUE_TAG
                return final, parts
    raise ChatTemplateError(
        "continue_final_message is set but we could not find any text to continue in the "
        "final message"
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
            # Both hold the GIL for long on a big tokenizer: in turn (native_calls).
            self._tokenizer = native_call(Tokenizer.from_str, text)
        except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception
            raise ModelFilesError(f"cannot load {path}: {exc}") from None
        # The largest id a prompt may hold, as vLLM computes it (added tokens included; ids
        # need not be contiguous). Read once: the vocabulary dict is built for it and dropped.
        vocab = native_call(self._tokenizer.get_vocab, with_added_tokens=True)
        self.max_token_id = max(vocab.values())

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        # encode_batch, not encode: the same ids, but it releases the GIL while it works, so
        # the event loop keeps running while a preprocessing thread tokenises a long prompt
        # (encode holds it for the whole prompt: seconds for a megabyte).
        return self._tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: Iterable[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)

    def detokenizer(self, **flags: bool) -> StreamDetokenizer:
        """One completion's decoder (``flags``: :class:`StreamDetokenizer`'s, the request's)."""
        return StreamDetokenizer(self._tokenizer, **flags)

    @property
    def backend(self) -> Tokenizer:
        return self._tokenizer


class StreamDetokenizer:
    """Incremental decoding of one completion; special tokens (EOS, ...) are not shown unless
    ``skip_special_tokens`` is false (the request's field, as vLLM's detokenizer takes it).

    ``add`` returns the text the new ids complete; a partial character stays inside the
    ``DecodeStream`` until the id that completes it arrives, and one the stream ends on is never
    shown: vLLM's detokenizer (the same ``DecodeStream``) drops it, so the text and a partial
    id's logprob token string are vLLM's (a partial character in the middle, which the next id
    cannot complete, shows as U+FFFD in both). An id the vocabulary does not know (a worker
    bug) is dropped rather than failing the whole stream.

    With ``skip_special_tokens`` and ``spaces_between_special_tokens`` both false, an added
    token right after another is its bare content, without the space the decoder would put
    between them: vLLM's ``FastIncrementalDetokenizer`` does exactly this.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        # The added tokens' contents by id when no space goes between them, else None.
        self._added: dict[int, str] | None = None
        self._last_added = False
        if not (skip_special_tokens or spaces_between_special_tokens):
            decoder = tokenizer.get_added_tokens_decoder()
            self._added = {i: token.content for i, token in decoder.items()} or None

    def add(self, ids: Iterable[int]) -> str:
        pieces = []
        for token_id in ids:
            if not 0 <= token_id < self._vocab_size:
                continue
            text = self._stream.step(self._tokenizer, token_id)
            if self._added is not None:
                added = self._added.get(token_id)
                if added is not None and self._last_added:
                    text = added  # vLLM: the raw token, without the space before it
                self._last_added = added is not None
            if text is not None:
                pieces.append(text)
        return "".join(pieces)

    def finish(self) -> str:
        """The end of the stream: a character left incomplete is dropped, as vLLM drops it."""
        return ""

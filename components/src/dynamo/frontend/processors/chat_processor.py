"""Per-model chat processor (the model's tokenizer + chat template) and the factory that builds it.

``--dyn-chat-processor`` picks the implementation:

* ``hf`` (default): ``tokenizers`` and ``jinja2`` (see :mod:`.hf_processor`); a small heap, no
  torch, no transformers.
* ``vllm``: vLLM's own tokenizer loader (``vllm.tokenizers.get_tokenizer``, a transformers
  tokenizer) and transformers' ``apply_chat_template``, as ``vllm serve`` preprocesses. Its
  import heap (~0.5M objects) is what the frontend's start-up freeze is for, so
  :func:`import_processor_libraries` imports it at start-up, before the freeze.
* ``sglang``: SGLang's tokenizer loader, template utilities and output parsers, as upstream
  Dynamo's SGLang processor uses them (see :mod:`.sglang_processor`); a heap of the same size,
  imported at start-up the same way.

The model registry calls :func:`build_chat_processor` once per newly discovered model, in a
thread, while the frontend serves. Whatever it allocates is heap grown *after* the start-up
freeze, so it must never freeze or collect: the serving-phase guard would refuse a freeze here
anyway, and nothing in this module asks for one.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from dynamo.runtime import peer_text
from dynamo.runtime.log_budget import CauseBudgets
from dynamo.runtime.model_card import ModelCard, out_of_vocabulary
from dynamo.runtime.template_files import MAX_TEMPLATE_BYTES

if TYPE_CHECKING:
    from dynamo.frontend.openai.protocol import ChatCompletionRequest

from dynamo.frontend.openai.token_strings import TokenStrings
from dynamo.frontend.parsing import vllm_output_parser
from dynamo.frontend.parsing.output_parser import OutputParserFactory, no_output_parser

from . import card_parsers, sglang_processor
from .hf_processor import (
    PLAIN,
    ChatTemplateError,
    HfChatTemplate,
    HfTokenizer,
    ModelFilesError,
    RenderOptions,
    StreamDetokenizer,
    check_rendered,
    find_chat_template,
    read_tokenizer_config,
    rendering_errors,
    special_tokens,
)
from .library_templates import TemplateCheck, TemplateForms, template_forms, transformers_variables
from .model_files import ModelFiles

logger = logging.getLogger(__name__)
_built_lines = CauseBudgets(logger, logging.INFO, lines=64, interval_s=10.0)  # per record's model

CHAT_PROCESSORS = ("hf", "vllm", "sglang")
DEFAULT_CHAT_PROCESSOR = "hf"
# The response field of a parsed reasoning, as each processor's engine names it: vLLM 0.32's
# server answers ``reasoning`` (it reads ``reasoning_content`` only as a deprecated input),
# SGLang's answers ``reasoning_content``, and so does upstream Dynamo's frontend by default
# (its --reasoning-field-name), which ``hf`` stands in for.
REASONING_FIELDS = {"hf": "reasoning_content", "vllm": "reasoning", "sglang": "reasoning_content"}
# What --dyn-chat-processor vllm imports at start-up (before the freeze): the tokenizer loader
# and the chat rendering and OpenAI protocol modules a vLLM frontend holds.
VLLM_MODULES = (
    "vllm.tokenizers",
    "vllm.renderers.hf",
    "vllm.entrypoints.openai.chat_completion.protocol",
)

__all__ = [
    "CHAT_PROCESSORS",
    "ChatProcessor",
    "ChatTemplateError",
    "ModelFilesError",
    "NoChatTemplate",
    "OutOfVocabulary",
    "build_chat_processor",
    "build_tokenizer",
    "import_processor_libraries",
]


class OutOfVocabulary(ValueError):
    """A prompt of token ids holds an id the model's vocabulary does not have (the client's 400)."""


class NoChatTemplate(ValueError):
    """The model has no chat template: /v1/chat/completions cannot serve it (completions can)."""


class Detokenizer(Protocol):
    def add(self, ids: Sequence[int]) -> str: ...

    def finish(self) -> str: ...


class Tokenizer(Protocol):
    max_token_id: int  # the largest id of the vocabulary (added tokens included)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def detokenizer(
        self, *, skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True
    ) -> Detokenizer: ...

    @property
    def backend(self) -> Any:
        """The ``tokenizers`` (Rust) tokenizer underneath (logprobs' token strings)."""
        ...


class Template(Protocol):
    def render(
        self, messages: Sequence[Mapping[str, Any]], options: RenderOptions = ...
    ) -> str: ...


# What the template render processes render for one chat: the template (its bounded form),
# the messages as the template takes them, the options.
BoundedRender = tuple[HfChatTemplate, Sequence[Mapping[str, Any]], RenderOptions]


class ChatProcessor:
    """One model's preprocessing: render a chat, encode a prompt, decode a completion."""

    def __init__(
        self,
        card: ModelCard,
        kind: str,
        tokenizer: Tokenizer,
        template: Template | None,
        output_parsers: OutputParserFactory | None = None,
        *,
        parses_tool_calls: bool = False,
    ) -> None:
        self.card = card
        self.kind = kind
        self.tokenizer = tokenizer
        self.template = template
        # One request's tool-call / reasoning parser (output_parser(tools, tool_choice,
        # messages, stream)), or None when this processor, or the request, has nothing to
        # parse: only the processors that parse tool calls and reasoning have a factory.
        self.output_parser: OutputParserFactory = output_parsers or no_output_parser
        # Whether that parser turns tool calls in the output into tool_calls (tool_choice auto).
        self.parses_tool_calls = parses_tool_calls
        self.reasoning_field = REASONING_FIELDS.get(kind, "reasoning_content")
        # A whole answer's message in vLLM's shape (its tool calls without an index, a forced
        # call's content "" rather than null), as vLLM's server builds it.
        self.answers_as_vllm = kind == "vllm"
        self._token_strings: TokenStrings | None = None

    @property
    def model(self) -> str:
        return self.card.served_model_name

    def render(self, messages: Sequence[Mapping[str, Any]], options: RenderOptions = PLAIN) -> str:
        """The chat prompt; raises NoChatTemplate, ChatTemplateError or ChatTemplateFailed."""
        if self.template is None:
            raise NoChatTemplate(
                f"the model `{self.model}` has no chat template, so it cannot serve chat "
                "completions (use /v1/completions, or give the worker a template with "
                "vLLM's --chat-template)"
            )
        return self.template.render(messages, options)

    def render_chat(self, chat: ChatCompletionRequest) -> str:
        """The prompt of a chat request, with its ``add_generation_prompt``,
        ``chat_template_kwargs`` and ``reasoning_effort``. A template that joins content parts
        its own way (SGLang's) takes the messages as sent; the others take them joined. A
        prompt that is no text is ChatTemplateFailed too (:func:`.hf_processor.check_rendered`)."""
        return check_rendered(self.render(*self.render_inputs(chat)))

    def render_inputs(
        self, chat: ChatCompletionRequest
    ) -> tuple[Sequence[Mapping[str, Any]], RenderOptions]:
        """What :meth:`render_chat` renders: the messages and the options."""
        if getattr(self.template, "takes_content_parts", False):
            messages = chat.messages_as_sent()
        else:
            messages = chat.template_messages()
        options = RenderOptions(
            add_generation_prompt=chat.add_generation_prompt is not False,
            variables=chat.template_variables(),
            tools=chat.template_tools(),
            documents=chat.documents,
            continue_final_message=chat.continue_final_message is True,
        )
        return messages, options

    def bounded_render_inputs(self, chat: ChatCompletionRequest) -> BoundedRender | None:
        """What the template render processes render for this chat (:mod:`.template_sandbox`),
        or None when the template has no bounded form (it was built without the processes'
        compile check, and renders on a thread). Raises ChatTemplateError."""
        forms: TemplateForms | None
        if isinstance(self.template, HfChatTemplate):
            forms = TemplateForms.single(self.template)
        else:
            forms = getattr(self.template, "forms", None)
        if forms is None:
            return None
        messages, options = self.render_inputs(chat)
        prepare = getattr(self.template, "prepare_messages", None)
        if prepare is not None:  # SGLang's normalising of content parts, before any render
            messages = prepare(messages)
        return forms.for_request(options), messages, options

    def encode_chat(self, prompt: str) -> list[int]:
        # The template already wrote BOS and the like: transformers' apply_chat_template
        # encodes with add_special_tokens=False, so does vLLM.
        return self.tokenizer.encode(prompt, add_special_tokens=False)

    def encode_completion(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt, add_special_tokens=True)

    @property
    def max_token_id(self) -> int:
        """The largest id of the model's vocabulary, as its worker's engine bounds it (the
        card's ``max_token_id``; from an older worker, the tokenizer's): the bound of a prompt
        of ids, and of every id a worker streams back."""
        limit = self.card.max_token_id
        return self.tokenizer.max_token_id if limit is None else limit

    def check_token_ids(self, ids: Sequence[int]) -> None:
        """A prompt given as token ids must be in the model's vocabulary (:attr:`max_token_id`);
        raises OutOfVocabulary, with vLLM's words, naming the first id that is not."""
        found = out_of_vocabulary(ids, self.max_token_id)
        if found is not None:
            raise OutOfVocabulary(found[1])

    def detokenizer(
        self, *, skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True
    ) -> Detokenizer:
        return self.tokenizer.detokenizer(
            skip_special_tokens=skip_special_tokens,
            spaces_between_special_tokens=spaces_between_special_tokens,
        )

    def token_strings(self) -> TokenStrings:
        """Logprobs' token strings as vLLM builds them
        (:mod:`dynamo.frontend.openai.token_strings`)."""
        if self._token_strings is None:
            self._token_strings = TokenStrings(self.tokenizer.backend)
        return self._token_strings


def import_processor_libraries(kind: str) -> str:
    """Import what ``kind`` needs, at start-up (before the freeze); a short description.

    Raises ImportError (with what is missing) when ``vllm`` is asked for and not installed.
    """
    if kind == "vllm":
        for name in VLLM_MODULES:
            importlib.import_module(name)
        vllm = importlib.import_module("vllm")
        return f"vLLM {getattr(vllm, '__version__', '?')}"
    if kind == "sglang":
        return sglang_processor.import_sglang()
    return "tokenizers + jinja2"


# -- hf -------------------------------------------------------------------------------------


def _build_hf(
    card: ModelCard, files: ModelFiles, template_check: TemplateCheck | None = None
) -> tuple[Tokenizer, Template | None]:
    tokenizer = HfTokenizer(files)
    config = read_tokenizer_config(files)
    source = find_chat_template(files, config, card.chat_template_path)
    if source is None:
        return tokenizer, None
    variables = special_tokens(config)
    if template_check is None:
        return tokenizer, HfChatTemplate(source, variables)  # compiled here: unbounded
    template_check(source, variables)
    return tokenizer, HfChatTemplate(source, variables, compiled=False)


# -- vllm ------------------------------------------------------------------------------------


class _VllmTokenizer:
    """vLLM's tokenizer (a transformers tokenizer), decoded incrementally like vLLM's own fast
    incremental detokenizer: a ``DecodeStream`` over its Rust backend."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ModelFilesError(
                "vLLM loaded a slow (Python) tokenizer for this model; the frontend needs a "
                "fast one (tokenizer.json)"
            )
        self._backend = backend
        # vLLM's cached tokenizer carries it; a bare transformers tokenizer does not.
        max_token_id = getattr(tokenizer, "max_token_id", None)
        if max_token_id is None:
            max_token_id = max(tokenizer.get_vocab().values())
        self.max_token_id = int(max_token_id)

    @property
    def vllm_tokenizer(self) -> Any:
        """vLLM's own tokenizer object (its output parsers take it)."""
        return self._tokenizer

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)

    def detokenizer(self, **flags: bool) -> Detokenizer:
        return StreamDetokenizer(self._backend, **flags)

    @property
    def backend(self) -> Any:
        return self._backend


class _VllmTemplate:
    """transformers' ``apply_chat_template`` of vLLM's tokenizer, as ``vllm serve`` renders;
    ``forms``: the same template in the render processes (None: built without them)."""

    def __init__(self, tokenizer: Any, source: str, forms: TemplateForms | None = None) -> None:
        self._tokenizer = tokenizer
        self._source = source
        self.forms = forms

    def render(self, messages: Sequence[Mapping[str, Any]], options: RenderOptions = PLAIN) -> str:
        with rendering_errors():
            return self._tokenizer.apply_chat_template(
                list(messages),
                chat_template=self._source,
                tokenize=False,
                continue_final_message=options.continue_final_message,
                **options.template_kwargs(),
            )


def _build_vllm(
    card: ModelCard, files: ModelFiles, template_check: TemplateCheck | None = None
) -> tuple[Tokenizer, Template | None]:
    from vllm.tokenizers import get_tokenizer  # imported at start-up; this is a lookup

    try:
        tokenizer = get_tokenizer(card.tokenizer_path)
    except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, ...
        raise ModelFilesError(
            f"vLLM cannot load the tokenizer in {card.tokenizer_path}: {exc}"
        ) from None
    config = read_tokenizer_config(files)
    source = find_chat_template(files, config, card.chat_template_path)
    if source is None:
        source = getattr(tokenizer, "chat_template", None)
    if source is None:
        return _VllmTokenizer(tokenizer), None
    forms = None
    if template_check is not None:  # compiled in a render process, bounded, before it serves
        forms = template_forms(source, transformers_variables(tokenizer), template_check)
    return _VllmTokenizer(tokenizer), _VllmTemplate(tokenizer, source, forms)


_BUILDERS = {"hf": _build_hf, "vllm": _build_vllm}


def model_files(card: ModelCard, model_dirs: Sequence[str] = ()) -> ModelFiles:
    """What ``card`` may make the frontend read (:mod:`.model_files`), checked before any
    library is pointed at it: its tokenizer directory (within ``model_dirs``, the operator's
    ``--dyn-model-dirs``, when given), the library files in it, its chat template."""
    files = ModelFiles(card.tokenizer_path, model_dirs)
    files.check_library_files()
    if card.chat_template_path is not None:
        files.read(files.template(card.chat_template_path), MAX_TEMPLATE_BYTES, content=False)
    return files


def build_tokenizer(
    card: ModelCard, kind: str = DEFAULT_CHAT_PROCESSOR, model_dirs: Sequence[str] = ()
) -> Tokenizer:
    """Only the tokenizer (what a preprocess worker process needs)."""
    files = model_files(card, model_dirs)
    if kind == "vllm":
        return _build_vllm(card, files)[0]
    if kind == "sglang":
        return sglang_processor.SglangTokenizer(sglang_processor.load_tokenizer(card))
    return HfTokenizer(files)


def build_chat_processor(
    card: ModelCard,
    kind: str = DEFAULT_CHAT_PROCESSOR,
    sglang: sglang_processor.SglangSettings | None = None,
    model_dirs: Sequence[str] = (),
    template_check: TemplateCheck | None = None,
) -> ChatProcessor:
    """The chat engine factory: one model's processor. Raises ModelFilesError (also for a card
    naming files it may not: :func:`model_files`). ``sglang``: the frontend's parser options
    (and, for ``kind="sglang"``, its --chat-template), for the processors that parse output
    (``sglang``, ``vllm``); ``model_dirs``: the operator's ``--dyn-model-dirs``;
    ``template_check``: where a template is compiled to check it, in the render processes
    where it will render (None: it compiles and renders here, on a thread)."""
    started = time.perf_counter()
    files = model_files(card, model_dirs)
    tokenizer: Tokenizer
    template: Template | None
    parsers = None
    parses_tool_calls = False
    if kind == "sglang":
        # The frontend's parser names, else the card's (the worker's) that SGLang has.
        settings = card_parsers.sglang_settings(card, sglang or sglang_processor.SglangSettings())
        model = sglang_processor.build_sglang(card, settings, template_check)
        tokenizer, template, parsers = model.tokenizer, model.template, model.output_parsers
        parses_tool_calls = parsers is not None and bool(settings.tool_call_parser)
    elif kind == "vllm":
        tokenizer, template = _build_vllm(card, files, template_check)
        # The frontend's parser names, else the card's (the worker's) that vLLM has.
        settings = card_parsers.vllm_settings(card, sglang or sglang_processor.SglangSettings())
        assert isinstance(tokenizer, _VllmTokenizer)
        parsers = vllm_output_parser.vllm_output_parsers(
            card.served_model_name,
            tokenizer.vllm_tokenizer,
            settings.tool_call_parser,
            settings.reasoning_parser,
        )
        parses_tool_calls = parsers is not None and parsers.parses_tool_calls
    else:
        card_parsers.warn_unparsed(card, kind)
        if kind == "hf":
            tokenizer, template = _build_hf(card, files, template_check)
        else:
            tokenizer, template = _BUILDERS[kind](card, files)
    processor = ChatProcessor(
        card, kind, tokenizer, template, parsers, parses_tool_calls=parses_tool_calls
    )
    _built_lines.emit(
        "built",
        "Chat processor built: model=%s processor=%s tokenizer=%s chat_template=%s took_ms=%.1f",
        peer_text.escape(card.served_model_name),
        kind,
        peer_text.escape(card.tokenizer_path, 300),
        "yes" if template is not None else "none",
        (time.perf_counter() - started) * 1000.0,
    )
    return processor

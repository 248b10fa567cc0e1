"""``--dyn-chat-processor sglang``: SGLang's own preprocessing, as upstream Dynamo's SGLang
processor (ai-dynamo 1.6.1, ``frontend/sglang_processor.py``, ``sglang_prepost.py``) does it.

SGLang is installed by ``scripts/setup_sglang_env.sh`` (its own venv). This module imports
without it: SGLang's modules are imported once, at start-up, by :func:`import_sglang` (before the
process's freeze: the frontend's, or each preprocess worker's in its pool initializer), and the
functions below only look them up.

What we rely on in SGLang 0.5.23 (checked against the installed package and upstream's use):

* ``sglang.srt.utils.hf_transformers_utils.get_tokenizer(path, trust_remote_code=False)``: a
  transformers tokenizer (``TokenizersBackend`` on transformers 5), patched by SGLang; its
  ``chat_template`` is what transformers found in the directory (``chat_template.jinja`` or
  ``tokenizer_config.json``).
* ``tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)`` is how
  upstream renders and tokenizes. On transformers 5 that is the rendered text encoded with
  ``add_special_tokens=False`` (``tokenization_utils_base.apply_chat_template``), so the
  processor renders with ``tokenize=False`` and encodes that way: the same ids, with the prompt
  text in between for the frontend's pool (which tokenizes in another process).
* ``parser.jinja_template_utils.detect_jinja_template_content_format(template)`` ->
  ``"string"`` or ``"openai"`` (run once per template, as SGLang's template manager does), and
  ``process_content_for_template_format(message, format, image_data, video_data, audio_data,
  modalities)``: a message's content parts joined with ``" "`` for a string template, kept as a
  list of typed parts for an ``openai`` one.
* ``parser.conversation.chat_template_exists(name)``: SGLang's built-in template names, which
  upstream refuses as ``--chat-template`` (a ``.jinja`` file is required).
* ``function_call.function_call_parser.FunctionCallParser(tools, tool_call_parser, tokenizer=)``
  with ``parse_stream_chunk`` / ``parse_stream_end`` / ``parse_non_stream`` / ``has_tool_call``;
  its registry ``FunctionCallParser.ToolCallParserEnum`` (name -> detector class) is the list of
  ``--tool-call-parser`` names. ``function_call.json_array_parser.JsonArrayParser()`` for
  ``tool_choice`` ``required`` or a named function (``parse_streaming_increment(text, tools)``,
  ``finish(tools)``). Tools are ``entrypoints.openai.protocol.Tool`` objects.
* ``parser.reasoning_parser.ReasoningParser(model_type, stream_reasoning, force_reasoning,
  tokenizer=, tool_call_parser_active=)`` with ``parse_stream_chunk`` / ``parse_stream_end``;
  its registry ``ReasoningParser.DetectorMap`` is the list of ``--reasoning-parser`` names.
  ``parser.template_detection.detect_reasoning_pattern(template)`` is the template's own
  "reasoning is on" flag (SGLang's ``TemplateManager.force_reasoning``).

Detokenizing is upstream's: ``tokenizer.decode`` of the ids since the last emitted piece, with
that piece's ids as context, holding back a piece that ends in U+FFFD (a character split over
tokens) until the next id completes it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamo.frontend.openai.token_strings import SlowBackend
from dynamo.frontend.parsing.output_parser import OutputParserFactory
from dynamo.runtime.model_card import ModelCard

from .hf_processor import PLAIN, ModelFilesError, RenderOptions, rendering_errors
from .library_templates import TemplateCheck, TemplateForms, template_forms, transformers_variables
from .sglang_parsers import SglangOutputParsers

# What --dyn-chat-processor sglang imports at start-up, before the freeze (keep in step with
# the packages of scripts/setup_sglang_env.sh).
SGLANG_MODULES = (
    "sglang.srt.utils.hf_transformers_utils",
    "sglang.srt.parser.jinja_template_utils",
    "sglang.srt.parser.conversation",
    "sglang.srt.parser.template_detection",
    "sglang.srt.function_call.function_call_parser",
    "sglang.srt.function_call.json_array_parser",
    "sglang.srt.function_call.utils",
    "sglang.srt.parser.reasoning_parser",
    "dynamo.frontend.parsing.sglang_output_parser",
)
SETUP_COMMAND = "scripts/setup_sglang_env.sh"
# A template that iterates over content parts (SGLang's detector calls it "openai") and a
# message with parts: the warm-up runs SGLang's template code paths once before the freeze.
_WARM_UP_TEMPLATE = (
    "{% for message in messages %}{% for part in message['content'] %}{{ part['text'] }}"
    "{% endfor %}{% endfor %}"
)
_WARM_UP_MESSAGE = {"role": "user", "content": [{"type": "text", "text": "warm"}]}


@dataclass(frozen=True)
class SglangSettings:
    """The frontend's sglang options: parser names, and the text of ``--chat-template``."""

    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    chat_template: str | None = None


def import_sglang() -> str:
    """Import SGLang's frontend modules and run their code paths once; ``SGLang <version>``.

    Raises ImportError when SGLang (or a package its modules import) is missing.
    """
    for name in SGLANG_MODULES:
        importlib.import_module(name)
    warm_up()
    sglang = importlib.import_module("sglang")
    return f"SGLang {getattr(sglang, '__version__', '?')}"


def warm_up() -> None:
    """Run what every request runs (content-format detection, content normalisation, both
    content formats), so the caches and lazy imports behind them land before the freeze."""
    from sglang.srt.parser.jinja_template_utils import (
        detect_jinja_template_content_format,
        process_content_for_template_format,
    )

    for template in (_WARM_UP_TEMPLATE, "{{ messages[0]['content'] }}"):
        content_format = detect_jinja_template_content_format(template)
        process_content_for_template_format(dict(_WARM_UP_MESSAGE), content_format, [], [], [], [])


# -- names and the --chat-template file ----------------------------------------------------


def tool_call_parser_names() -> list[str]:
    from sglang.srt.function_call.function_call_parser import FunctionCallParser

    return sorted(FunctionCallParser.ToolCallParserEnum)


def reasoning_parser_names() -> list[str]:
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    return sorted(ReasoningParser.DetectorMap)


def tool_call_parser_problem(name: str) -> str | None:
    """Why SGLang has no usable tool-call parser ``name``, or None (it built one)."""
    from sglang.srt.entrypoints.openai.protocol import Function, Tool
    from sglang.srt.function_call.function_call_parser import FunctionCallParser

    names = tool_call_parser_names()
    if name not in names:
        return f"SGLang has no tool-call parser {name!r}; its parsers are: {', '.join(names)}"
    probe = [Tool(type="function", function=Function(name="probe", parameters={}))]
    try:  # some parsers need settings of SGLang's server (response_template: its template)
        FunctionCallParser(tools=probe, tool_call_parser=name)
    except (ValueError, TypeError, KeyError) as exc:
        return f"SGLang's tool-call parser {name!r} cannot be used here: {exc}"
    return None


def reasoning_parser_problem(name: str) -> str | None:
    """Why SGLang has no usable reasoning parser ``name``, or None (it built one)."""
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    names = reasoning_parser_names()
    if name not in names:
        return f"SGLang has no reasoning parser {name!r}; its parsers are: {', '.join(names)}"
    try:
        ReasoningParser(model_type=name, stream_reasoning=True)
    except (ValueError, TypeError, KeyError) as exc:
        return f"SGLang's reasoning parser {name!r} cannot be used here: {exc}"
    return None


def read_chat_template(path: str) -> str:
    """The text of a ``--chat-template`` file, by upstream's rules; ValueError says why not."""
    from sglang.srt.parser.conversation import chat_template_exists

    if chat_template_exists(path):
        raise ValueError(
            f"{path!r} is one of SGLang's built-in chat template names, which this frontend "
            "does not take (as upstream Dynamo's SGLang processor): give a .jinja file"
        )
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"chat template {str(file)!r} is not a file")
    if file.suffix != ".jinja":
        raise ValueError(f"chat template {str(file)!r} is not a .jinja file")
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read chat template {str(file)!r}: {exc}") from None


# -- one model's tokenizer, template and detokenizer ---------------------------------------


def load_tokenizer(card: ModelCard) -> Any:
    """SGLang's tokenizer for the model (raises ModelFilesError)."""
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    try:
        return get_tokenizer(card.tokenizer_path)
    except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, ...
        raise ModelFilesError(
            f"SGLang cannot load the tokenizer in {card.tokenizer_path}: {exc}"
        ) from None


class SglangTokenizer:
    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.max_token_id = int(max(tokenizer.get_vocab().values()))

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)

    def detokenizer(
        self, *, skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True
    ) -> SglangDetokenizer:
        return SglangDetokenizer(
            self._tokenizer, self.max_token_id, skip_special_tokens, spaces_between_special_tokens
        )

    @property
    def backend(self) -> Any:
        backend = getattr(self._tokenizer, "backend_tokenizer", None)  # a fast tokenizer's
        return SlowBackend(self._tokenizer) if backend is None else backend


class SglangDetokenizer:
    """One completion, decoded as upstream decodes it (see the module docstring). An id the
    vocabulary does not have (a worker bug) is dropped, as the other processors do."""

    def __init__(
        self,
        tokenizer: Any,
        max_token_id: int,
        skip_special_tokens: bool,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._max_token_id = max_token_id
        self._skip_special_tokens = skip_special_tokens
        self._spaces = spaces_between_special_tokens  # passed to decode, as SGLang's manager
        self._context: list[int] = []  # the ids of the last piece emitted
        self._pending: list[int] = []  # ids not emitted yet

    def add(self, ids: Iterable[int]) -> str:
        self._pending.extend(i for i in ids if 0 <= i <= self._max_token_id)
        return self._emit(final=False)

    def finish(self) -> str:
        return self._emit(final=True)

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return self._tokenizer.decode(
            ids,
            skip_special_tokens=self._skip_special_tokens,
            spaces_between_special_tokens=self._spaces,
        )

    def _emit(self, *, final: bool) -> str:
        if not self._pending:
            return ""
        before = self._decode(self._context)
        piece = self._decode(self._context + self._pending)[len(before) :]
        if not final and (not piece or piece.endswith("\ufffd")):
            return ""
        self._context, self._pending = self._pending, []
        return piece


class SglangTemplate:
    """The model's chat template, rendered by the SGLang tokenizer after SGLang has normalised
    each message's content for it (:attr:`takes_content_parts`: the messages come as the
    client sent them, content parts not yet joined). ``forms``: the same template(s) in the
    frontend's render processes (:mod:`.library_templates`; None: built without them)."""

    takes_content_parts = True

    def __init__(
        self, tokenizer: Any, source: str | None, forms: TemplateForms | None = None
    ) -> None:
        from sglang.srt.parser.jinja_template_utils import detect_jinja_template_content_format

        self._tokenizer = tokenizer
        self._source = source  # None: the tokenizer's own (a dict of named ones included)
        self.text = source if source is not None else _template_text(tokenizer.chat_template)
        self._content_format = detect_jinja_template_content_format(self.text)
        self.forms = forms

    def prepare_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The messages with their content as this template takes it, as SGLang prepares them."""
        from sglang.srt.parser.jinja_template_utils import process_content_for_template_format

        form = self._content_format
        return [
            process_content_for_template_format(dict(m), form, [], [], [], []) for m in messages
        ]

    def render(self, messages: Sequence[Mapping[str, Any]], options: RenderOptions = PLAIN) -> str:
        normalised = self.prepare_messages(messages)
        with rendering_errors():
            return self._tokenizer.apply_chat_template(
                normalised,
                chat_template=self._source,
                tokenize=False,
                continue_final_message=options.continue_final_message,
                **options.template_kwargs(),
            )


def _template_text(template: Any) -> str:
    if isinstance(template, Mapping):  # named templates: transformers renders "default"
        template = template.get("default")
    return template if isinstance(template, str) else ""


def _model_template(card: ModelCard, settings: SglangSettings) -> str | None:
    """The frontend's --chat-template, else the worker's (the card's), else the model's own
    (None: what SGLang's tokenizer loaded)."""
    if settings.chat_template is not None:
        return settings.chat_template
    if card.chat_template_path is not None:
        try:
            return Path(card.chat_template_path).read_text(encoding="utf-8")
        except (OSError, ValueError) as exc:
            raise ModelFilesError(f"cannot read {card.chat_template_path}: {exc}") from None
    return None


# -- the builder the chat engine factory calls ----------------------------------------------


@dataclass
class SglangModel:
    tokenizer: SglangTokenizer
    template: SglangTemplate | None
    output_parsers: OutputParserFactory | None


def build_sglang(
    card: ModelCard, settings: SglangSettings, template_check: TemplateCheck | None = None
) -> SglangModel:
    """One model's SGLang state (raises ModelFilesError), in the registry's thread while the
    frontend serves: it allocates, never freezes. ``template_check``: compiles the template in
    the render processes, which then render it (None: the tokenizer renders it)."""
    tokenizer = load_tokenizer(card)
    source = _model_template(card, settings)
    has_template = source is not None or bool(_template_text(tokenizer.chat_template))
    template, forms = None, None
    if has_template and template_check is not None:  # compiled bounded before SGLang parses it
        own = source if source is not None else tokenizer.chat_template
        forms = template_forms(own, transformers_variables(tokenizer), template_check)
    if has_template:
        template = SglangTemplate(tokenizer, source, forms)
    parsers = None
    if settings.tool_call_parser or settings.reasoning_parser:
        parsers = SglangOutputParsers(
            tokenizer,
            template.text if template is not None else "",
            settings.tool_call_parser,
            settings.reasoning_parser,
        )
    return SglangModel(SglangTokenizer(tokenizer), template, parsers)

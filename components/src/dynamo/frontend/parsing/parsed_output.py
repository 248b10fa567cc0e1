"""A chat completion's output through its
:class:`~dynamo.frontend.parsing.output_parser.OutputParser`: ``content``, the reasoning and
``tool_calls`` in OpenAI's chat shapes; the reasoning's field is named as the processor's engine
names it (``reasoning`` with ``vllm``, ``reasoning_content`` with ``sglang`` and ``hf``:
:data:`~dynamo.frontend.processors.chat_processor.REASONING_FIELDS`).

The response path (:mod:`dynamo.frontend.serving.http_service`) builds one :class:`ParsedOutput` per
chat choice whose request has a parser (the model's processor parses output: ``--dyn-chat-processor
vllm`` or ``sglang`` with a tool-call or reasoning parser; or ``tool_choice`` forces calls) and
feeds it the completion's text as it is decoded. Streaming, each piece becomes a chunk with what
the parser let through: content and reasoning as they come, and tool calls either as deltas
(vLLM's parsers: a call's id and name first, then pieces of its arguments) or whole at the end
(SGLang's parsers and :mod:`.forced_tool_calls`: a call's arguments are complete JSON only
once the model has finished it); the end adds one chunk with what the parser held back. Not
streaming, the whole text is fed at once and the message carries all three. A completion that
ends (``stop``) with tool calls reports ``finish_reason`` ``tool_calls``, as OpenAI, vLLM and
SGLang do.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from dynamo.frontend.openai import protocol as oai
from dynamo.frontend.openai.responses import ChatResponder
from dynamo.frontend.openai.structured_output import from_vllm
from dynamo.frontend.openai.tools import NamedToolChoice
from dynamo.runtime import peer_text
from dynamo.runtime.log_budget import CauseBudgets
from dynamo.runtime.sampling import StructuredOutputs

from .forced_tool_calls import forced_tool_calls
from .output_parser import (
    FirstCallOnly,
    OutputParser,
    ParsedDelta,
    ParserRequest,
    WithoutReasoning,
)

# The request's fields, besides tools and messages, that vLLM's parsers read off the request.
PARSER_FIELDS = ("chat_template_kwargs", "reasoning_effort", "include_reasoning",
                 "parallel_tool_calls")  # fmt: skip


def output_parser(
    processor_factory: Any, chat: oai.ChatCompletionRequest, prompt_ids: Sequence[int] = ()
) -> OutputParser | None:
    """The request's parser, or None (nothing to parse); its first call only with
    ``parallel_tool_calls`` false, as vLLM filters them; no reasoning with ``include_reasoning``
    false, as vLLM drops it. The parser is given what vLLM gives its own: the template's
    variables as the prompt was rendered with them, the prompt's ids, the request's fields."""
    parser = _output_parser(processor_factory, chat, prompt_ids)
    if parser is not None and chat.parallel_tool_calls is False:
        parser = FirstCallOnly(parser)
    if parser is not None and chat.include_reasoning is False:
        parser = WithoutReasoning(parser)
    return parser


def _tool_choice(chat: oai.ChatCompletionRequest) -> Any:
    """The request's ``tool_choice`` in OpenAI's shape (unset: auto)."""
    choice = chat.tool_choice
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.model_dump()


def parser_request(chat: oai.ChatCompletionRequest, prompt_ids: Sequence[int] = ()) -> Any:
    """The request as a parser factory is called with it: (args, keywords)."""
    args = (chat.template_tools(), _tool_choice(chat), chat.template_messages(), bool(chat.stream))
    keywords = {
        "variables": chat.template_variables(),
        "prompt_ids": prompt_ids,
        "fields": {
            name: value
            for name in PARSER_FIELDS
            if (value := getattr(chat, name, None)) is not None
        },
    }
    return args, keywords


def adjust_for_parsers(processor_factory: Any, chat: oai.ChatCompletionRequest) -> None:
    """Changes the request as the processor's engine server changes it for its parsers before
    sampling it (the factory's ``adjusted``): a forced call's constraint becomes the one the
    library forces (vLLM's tool parser: hermes' ``<tool_call>`` structural tag with free JSON
    arguments, not the JSON schema of the tools; SGLang's: a JSON array of calls, for a named
    function too); with ``tool_choice`` auto, the constraint the library puts on the calls the
    model may write (vLLM's: at most one with ``parallel_tool_calls`` false; a client's own
    constraint joined with the calls when xgrammar can, else kept alone, as vLLM does); and
    ``skip_special_tokens`` what a reasoning parser asks for. Raises FieldRefused for a
    constraint over the bounds (the client's 400 naming the field it came from)."""
    adjusted = getattr(processor_factory, "adjusted", None)
    if adjusted is None:
        return
    (tools, choice, messages, stream), keywords = parser_request(chat)
    # The client's own constraint too: vLLM's parser may merge the calls into it (auto).
    keywords["fields"] = {**keywords["fields"], **_client_constraint(chat)}
    found = adjusted(ParserRequest(tools, choice, messages, stream, **keywords),
                     chat.skip_special_tokens)  # fmt: skip
    if found is None:
        return
    structured, chat.skip_special_tokens = found
    if not getattr(processor_factory, "forces_tool_calls", False):
        return
    if _forced(chat):
        field = "tool_choice"  # the library's constraint (or none) replaces the tools' schema
    elif structured is not None and chat.tools and chat.tool_choice in (None, "auto"):
        # tool_choice auto: the calls the model may write are constrained too (vLLM's
        # parsers: at most one with parallel_tool_calls false, a triggered structural tag;
        # with a constraint of the client's that xgrammar can join, either a call or that).
        field = chat.structured_field or (
            "parallel_tool_calls" if chat.parallel_tool_calls is False else "tools"
        )
    else:
        return
    if not isinstance(structured, StructuredOutputs):  # vLLM's StructuredOutputsParams
        structured = from_vllm(structured, field)
    chat.force_constraint(field, structured)


def decide_grammar_start(
    processor_factory: Any, chat: oai.ChatCompletionRequest, prompt_ids: Sequence[int]
) -> None:
    """Where the request's constraint (a forced call's, a response_format's) starts, once its
    prompt is rendered: the worker's engine holds the grammar back until the output ends its
    reasoning (its reasoning parser, from the worker's --dyn-reasoning-parser) unless told the
    reasoning has ended. The processor decides as its engine's server does (its factory's
    ``reasoning_ended``: vLLM's from the reasoning parser and the prompt, SGLang's from whether
    the request thinks); a processor that parses no reasoning (``hf``) has the grammar start
    at the first token, so the output it parses is the constraint's from the start."""
    if chat.structured_field is None:
        return  # no grammar
    decide = getattr(processor_factory, "reasoning_ended", None)
    if decide is None:
        chat.grammar_starts(True)
        return
    (tools, choice, messages, stream), keywords = parser_request(chat, prompt_ids)
    chat.grammar_starts(decide(ParserRequest(tools, choice, messages, stream, **keywords)))


def _client_constraint(chat: oai.ChatCompletionRequest) -> dict[str, Any]:
    """The client's ``response_format`` / ``structured_outputs``, as vLLM's request takes them."""
    return {
        name: value.model_dump(by_alias=True, exclude_none=True)
        for name in ("response_format", "structured_outputs")
        if (value := getattr(chat, name, None)) is not None
    }


def _forced(chat: oai.ChatCompletionRequest) -> bool:
    choice = chat.tool_choice
    return bool(chat.tools) and (choice == "required" or isinstance(choice, NamedToolChoice))


def _output_parser(
    processor_factory: Any, chat: oai.ChatCompletionRequest, prompt_ids: Sequence[int]
) -> OutputParser | None:
    """The request's parser from its model's factory, or None (nothing to parse). A ``tools``
    entry the parser's library cannot read is the client's 400 naming ``tools``. A forced call
    goes through the model's own parsers when they force calls as their engine does (vLLM's:
    the reasoning first, the call's arguments streamed), else through :mod:`.forced_tool_calls`
    (the engine forced the tools' JSON schema: no tool-call parser needed)."""
    if _forced(chat) and not getattr(processor_factory, "forces_tool_calls", False):
        return forced_tool_calls(_tool_choice(chat))
    args, keywords = parser_request(chat, prompt_ids)
    try:
        return processor_factory(*args, **keywords)
    except ValueError as exc:  # pydantic's ValidationError is one
        first = str(exc).splitlines()[0] if str(exc) else "invalid tool definition"
        raise oai.invalid_request(f"`tools` is not valid: {first}", param="tools") from None


logger = logging.getLogger(__name__)
_failures = CauseBudgets(logger, lines=1, interval_s=60.0)


class ParsedOutput:
    """One chat request's parsed output, in OpenAI's shapes (see the module docstring).

    The text parsed is the model's (a worker's answer: a peer's words), and a parser library
    can fail on text it did not expect: then the request goes on unparsed (what is fed from
    there on is content; what the parser held back is lost) with one WARNING per interval,
    never a 500 or a stream cut short.
    """

    def __init__(
        self,
        parser: OutputParser,
        responder: ChatResponder,
        index: int = 0,
        *,
        reasoning_field: str = "reasoning_content",
        vllm_message: bool = False,
        forced: bool = False,
    ) -> None:
        self._parser: OutputParser | None = parser
        # The reasoning's key in a message / delta: the processor's engine's name for it.
        self._reasoning_field = reasoning_field
        # A whole message as vLLM's server builds it (see whole_choice), and whether the
        # request forced its calls (tool_choice required or a named function).
        self._vllm_message = vllm_message
        self._forced = forced
        self._responder = responder
        self._index = index  # the choice's (n > 1)
        self._tool_calls = False
        # A named tool_choice's calls end with "stop" (OpenAI's and vLLM's rule).
        self._calls_reason = getattr(parser, "calls_finish_reason", "tool_calls")

    def _failed(self, exc: Exception) -> None:
        self._parser = None
        _failures.emit(
            type(exc).__name__,
            "Output parser failed on request %s (%s: %s); the rest of its answer is unparsed",
            self._responder.completion_id,
            type(exc).__name__,
            peer_text.escape(exc),
        )

    def _feed(self, text: str) -> ParsedDelta:
        if self._parser is not None:
            try:
                return self._parser.feed(text)
            except Exception as exc:  # noqa: BLE001 - any library error: see the class docstring
                self._failed(exc)
        return ParsedDelta(content=text)

    def _finish(self) -> ParsedDelta:
        if self._parser is not None:
            try:
                return self._parser.finish()
            except Exception as exc:  # noqa: BLE001 - any library error: see the class docstring
                self._failed(exc)
        return ParsedDelta()

    def chunk(self, text: str) -> dict | None:
        """The chunk for a piece of text, or None when the parser held it all back."""
        return self._chunk(self._feed(text))

    def closing_chunks(self) -> list[dict]:
        """What the parser held back, then the tool calls: the chunks before the finish."""
        end = self._finish()
        chunks = []
        held = ParsedDelta(content=end.content, reasoning_content=end.reasoning_content)
        held_chunk = self._chunk(held)
        if held_chunk is not None:
            chunks.append(held_chunk)
        calls = self._chunk(ParsedDelta(tool_calls=end.tool_calls))
        if calls is not None:
            chunks.append(calls)
        return chunks

    def finish_reason(self, reason: str) -> str:
        return self._calls_reason if self._tool_calls and reason == "stop" else reason

    def whole_choice(self, text: str, finish_reason: str) -> dict:
        """The non-streamed choice: the whole text through the parser."""
        fed = self._feed(text)
        end = self._finish()
        if self._parser is None:  # failed: the whole text, unparsed
            fed, end = ParsedDelta(content=text), ParsedDelta()
        content = fed.content + end.content
        reasoning = fed.reasoning_content + end.reasoning_content
        calls = fed.tool_calls + end.tool_calls
        self._tool_calls = bool(calls)
        message: dict[str, Any] = {"role": self._responder.role, "content": content or None}
        if not calls and not reasoning and message["content"] is None:
            # An answer that was all reasoning has no content (null), as vLLM's parsers leave it.
            message["content"] = ""
        if reasoning:
            message[self._reasoning_field] = reasoning
        if self._vllm_message:
            # vLLM's message: its ToolCall has no index, and a forced call's content is "".
            calls = [{k: v for k, v in call.items() if k != "index"} for call in calls]
            if self._forced and message["content"] is None:
                message["content"] = ""
        if calls:
            message["tool_calls"] = calls
        reason = self.finish_reason(finish_reason)
        return {"index": self._index, "message": message, "finish_reason": reason}

    def _chunk(self, parsed: ParsedDelta) -> dict | None:
        if not parsed:
            return None
        delta: dict[str, Any] = {}
        if parsed.reasoning_content:
            delta[self._reasoning_field] = parsed.reasoning_content
        if parsed.content:
            delta["content"] = parsed.content
        if parsed.tool_calls:
            delta["tool_calls"] = parsed.tool_calls
            self._tool_calls = True
        choice = {"index": self._index, "delta": delta, "finish_reason": None}
        return self._responder.envelope(self._responder.CHUNK_OBJECT, [choice])

"""The :class:`~dynamo.frontend.parsing.output_parser.OutputParser` of ``--dyn-chat-processor
vllm``:
vLLM's own tool-call and reasoning parsers, composed and driven as vLLM's OpenAI server does.

``vllm.parser.ParserManager.get_parser(tool_parser_name=, reasoning_parser_name=,
enable_auto_tools=True, tokenizer=)`` composes the two registries' parsers
(``ToolParserManager``, ``ReasoningParserManager``: their names are vLLM's, ``hermes``,
``qwen3``, ...) into one class, checked against the model's tokenizer; vLLM's
``OpenAIServingChat`` builds one per request (``parser_cls(tokenizer, request.tools)``) and
drives it the way this module does:

* a whole completion (``stream`` false): ``parser.parse(text, request, enable_auto_tools=True,
  model_output_token_ids=ids)`` -> ``(reasoning, content, tool_calls)`` at
  :meth:`VllmOutputParser.finish`;
* a stream: ``parser.parse_delta(delta_text, delta_token_ids, request, prompt_token_ids,
  finished=)`` for each delta (it keeps the previous / current text and ids itself and calls the
  reasoning parser's ``extract_reasoning_streaming``, then the tool parser's
  ``extract_tool_calls_streaming``), and once more, empty and ``finished``, at the end (what the
  parsers held back, a call's unstreamed arguments). :class:`VllmStreamingParser` turns each
  :class:`DeltaMessage` into content, reasoning and tool-call deltas in OpenAI's shape (a call's
  first delta carries its id, type and name; the next ones pieces of its arguments). Joined,
  they are what ``parse`` returns for the whole text (tests/vllm/test_vllm_streaming_parser.py).

The ids are an approximation. The frontend's output path hands a parser text only: each piece
the detokenized text of one or more whole tokens (vLLM hands its parser one step's text and the
ids that made it). So each piece is cut at the tokenizer's added tokens (``<think>``,
``<tool_call>``, ...: they arrive whole, encode to their own ids, and become a delta of their
own, as one token per step makes them in vLLM: some parsers only see a marker that is a delta's
only id) and each part is encoded again by the model's tokenizer. What that costs: the ordinary
text's ids are the re-encoding of a piece, not the ids the model sampled (a word split across
two pieces encodes as two tokens; a marker the model spelt out in ordinary tokens and that
arrives whole in one piece becomes the marker's id). Parsers that look for their markers' ids
or text, as vLLM's hermes, qwen3 and deepseek_r1 do, are unaffected; one that counted tokens
would count differently.

Each parser gets what vLLM's server gives its own: it is built with the request's template
variables (``chat_template_kwargs`` with ``reasoning_effort`` / ``enable_thinking`` merged in, as
the prompt was rendered: a reasoning parser reads them to know whether the model thinks), is
given the rendered prompt's ids (``set_prompt_token_ids`` before ``parse``; ``prompt_token_ids``
with each ``parse_delta``: a template that closed the reasoning in the prompt leaves the
output all content), and the request it parses for carries the client's
``chat_template_kwargs``, ``reasoning_effort``, ``include_reasoning`` and
``parallel_tool_calls``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dynamo.runtime import peer_text
from dynamo.runtime.log_budget import CauseBudgets

from .output_parser import OutputParser, OutputParsers, ParsedDelta, ParserRequest

logger = logging.getLogger(__name__)
# One budget for the line, not one per model: a model's name is a peer's to invent.
_unusable = CauseBudgets(logger, lines=5, interval_s=60.0)


def tool_call_parser_problem(name: str) -> str | None:
    from vllm.tool_parsers import ToolParserManager

    names = sorted(ToolParserManager.list_registered())
    if name in names:
        return None
    return f"vLLM has no tool-call parser {name!r}; its parsers are: {', '.join(names)}"


def reasoning_parser_problem(name: str) -> str | None:
    from vllm.reasoning import ReasoningParserManager

    names = sorted(ReasoningParserManager.list_registered())
    if name in names:
        return None
    return f"vLLM has no reasoning parser {name!r}; its parsers are: {', '.join(names)}"


def vllm_output_parsers(
    model: str, tokenizer: Any, tool_call_parser: str | None, reasoning_parser: str | None
) -> VllmOutputParsers | None:
    """The model's factory, or None: no parser named, or vLLM refuses the pair for this
    model's tokenizer (a parser that cannot find its tokens in it): logged, served without."""
    if tool_call_parser is None and reasoning_parser is None:
        return None
    from vllm.parser import ParserManager

    try:
        parser_cls = ParserManager.get_parser(
            tool_parser_name=tool_call_parser,
            reasoning_parser_name=reasoning_parser,
            enable_auto_tools=True,
            tokenizer=tokenizer,
        )
    except Exception as exc:  # noqa: BLE001 - vLLM raises TypeError, KeyError, ValueError
        _unusable.emit(
            "unusable parsers",
            "Model %s: vLLM's parsers (tool-call %s, reasoning %s) cannot be used with its "
            "tokenizer (%s); the model is served without parsing",
            peer_text.escape(model),
            tool_call_parser,
            reasoning_parser,
            peer_text.escape(exc),
        )
        return None
    return None if parser_cls is None else VllmOutputParsers(parser_cls, tokenizer)


class VllmOutputParsers(OutputParsers):
    """Builds each request's parser for one model: :class:`VllmStreamingParser` for a stream,
    :class:`VllmOutputParser` for a whole completion."""

    def __init__(self, parser_cls: Any, tokenizer: Any) -> None:
        self._parser_cls = parser_cls
        self._tokenizer = tokenizer
        self.parses_tool_calls = parser_cls.tool_parser_cls is not None
        self._parses_reasoning = parser_cls.reasoning_parser_cls is not None
        # vLLM's own parser parses a forced call (tool_choice required or named) after the
        # reasoning, as vLLM's server does; the frontend's ForcedToolCalls is then not used.
        self.forces_tool_calls = self.parses_tool_calls
        self._markers = _markers(tokenizer)

    def adjusted(
        self, request: ParserRequest, skip_special_tokens: bool | None
    ) -> tuple[Any, bool | None] | None:
        """What vLLM's server changes in a request before sampling it (its renderer calls the
        parser's ``adjust_request``): vLLM's ``StructuredOutputsParams`` forcing the calls (a
        tool parser with an xgrammar format, hermes' among them, forces ``required`` / a named
        function with a structural tag, the arguments free JSON) or None, and the
        ``skip_special_tokens`` to decode with (a reasoning parser that reads its markers in
        the text sets it false). The constraint is None when vLLM leaves the client's (or
        none) in place. None: vLLM leaves the request alone."""
        tools, tool_choice = request.tools, request.tool_choice
        if not (
            self._parser_cls.always_adjust_request
            or self._parses_reasoning
            or (tools and tool_choice != "none")
        ):
            return None
        chat, _, before = self._adjusted_request(request, skip_special_tokens)
        # vLLM replaces the object when it constrains the request; else the client's stands.
        changed = chat.structured_outputs is not before
        return (chat.structured_outputs if changed else None), chat.skip_special_tokens

    def reasoning_ended(self, request: ParserRequest) -> bool | None:
        """Where the request's grammar starts (the worker hands it to vLLM's ``generate``), as
        vLLM's server decides it after ``adjust_request``
        (``ChatCompletionRequest.resolve_reasoning_ended``): from the first token (True) when
        ``include_reasoning`` is false or the parser's grammar covers the reasoning itself;
        else whether the rendered prompt already ended the reasoning, by the reasoning parser
        built with the template's variables (so ``enable_thinking`` false ends it). False: the
        grammar starts once the output ends its reasoning. Without a reasoning parser here the
        output is parsed as content from the first token, and the grammar starts there too."""
        if not self._parses_reasoning:
            return True
        chat, parser, _ = self._adjusted_request(request, None)
        return chat.resolve_reasoning_ended(parser, list(request.prompt_ids))

    def _adjusted_request(
        self, request: ParserRequest, skip_special_tokens: bool | None
    ) -> tuple[Any, Any, Any]:
        """vLLM's request for ``request`` after its parser's ``adjust_request``, that parser,
        and the request's constraint before the adjustment."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        tools, tool_choice = request.tools, request.tool_choice
        body: dict[str, Any] = {"model": "model", "messages": [{"role": "user", "content": ""}]}
        if tools:
            body |= {"tools": list(tools), "tool_choice": tool_choice}
            if request.fields.get("parallel_tool_calls") is not None:
                body["parallel_tool_calls"] = request.fields["parallel_tool_calls"]
        if request.fields.get("include_reasoning") is not None:
            body["include_reasoning"] = request.fields["include_reasoning"]
        if skip_special_tokens is not None:
            body["skip_special_tokens"] = skip_special_tokens
        for name in ("response_format", "structured_outputs"):  # the client's own constraint
            if name in request.fields:
                body[name] = request.fields[name]
        chat = ChatCompletionRequest.model_validate(body)
        parser = self._parser_cls(
            self._tokenizer, chat.tools, chat_template_kwargs=dict(request.variables)
        )
        before = chat.structured_outputs
        return parser.adjust_request(chat), parser, before

    def build(self, request: ParserRequest) -> OutputParser | None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        tools, tool_choice = request.tools, request.tool_choice
        calls = bool(tools) and tool_choice not in ("none", None) and self.parses_tool_calls
        if not calls and not self._parses_reasoning:
            return None
        chat = ChatCompletionRequest.model_validate(
            {
                **request.fields,
                "model": "model",
                "messages": [_plain(message) for message in request.messages] or [{"role": "user"}],
                "tools": list(tools) if calls and tools else None,
                "tool_choice": tool_choice if calls else "none",
            }
        )
        # As OpenAIServingChat._make_parser: the template's variables as the prompt was
        # rendered with them (a reasoning parser reads enable_thinking & co. from them).
        variables = dict(request.variables)
        parser = self._parser_cls(self._tokenizer, chat.tools, chat_template_kwargs=variables)
        prompt = list(request.prompt_ids)
        built: VllmStreamingParser | VllmOutputParser
        if request.stream:
            built = VllmStreamingParser(parser, chat, self._tokenizer, self._markers, prompt)
        else:
            built = VllmOutputParser(parser, chat, self._tokenizer, calls, prompt)
        # A named function's calls end with "stop", required's with "tool_calls" (vLLM's rule).
        built.calls_finish_reason = "stop" if isinstance(tool_choice, Mapping) else "tool_calls"
        return built


def _plain(message: Mapping[str, Any]) -> dict[str, Any]:
    return {"role": message.get("role", "user"), "content": message.get("content") or ""}


def _markers(tokenizer: Any) -> dict[int, str]:
    """The tokenizer's added tokens (``<think>``, ``<tool_call>``, ...) by id, empty when it
    has none. A peer's tokenizer may add thousands: a piece is cut at them by the ids its
    encoding (the tokenizer's own linear matching) gives, not by a pattern of every one (an
    alternation costs each position of a piece a try of every token: seconds a piece)."""
    vocab = getattr(tokenizer, "get_added_vocab", None)  # transformers' tokenizers have it
    added = vocab() if vocab is not None else {}
    return {id_: text for text, id_ in added.items() if text}


def _cut(text: str, ids: list[int], markers: dict[int, str]) -> list[str]:
    """``text`` cut before and after each added token its encoding ``ids`` hold, in order;
    a token not found as written (an added token the tokenizer matches after normalising)
    ends the cutting, so each search starts where the last ended: linear in the text."""
    parts, start = [], 0
    for id_ in ids:
        marker = markers.get(id_)
        if marker is None:
            continue
        at = text.find(marker, start)
        if at < 0:
            break
        parts += [text[start:at], marker]
        start = at + len(marker)
    parts.append(text[start:])
    return [part for part in parts if part]


class VllmOutputParser:
    """One whole completion's vLLM parser: gathers the text, parses it at :meth:`finish`."""

    calls_finish_reason = "tool_calls"

    def __init__(
        self, parser: Any, request: Any, tokenizer: Any, calls: bool, prompt_ids: list[int]
    ) -> None:
        self._parser = parser
        self._request = request
        self._tokenizer = tokenizer
        self._calls = calls
        self._text: list[str] = []
        if prompt_ids:  # as chat_completion_full_generator, before parse
            parser.set_prompt_token_ids(prompt_ids)

    def feed(self, text: str) -> ParsedDelta:
        self._text.append(text)
        return ParsedDelta()

    def finish(self) -> ParsedDelta:
        text = "".join(self._text)
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        reasoning, content, calls = self._parser.parse(
            text, self._request, enable_auto_tools=self._calls, model_output_token_ids=ids
        )
        return ParsedDelta(
            content=content or "",
            reasoning_content=reasoning or "",
            tool_calls=[
                {
                    "index": index,
                    "id": call.id or _tool_call_id(),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for index, call in enumerate(calls or ())
                if self._calls
            ],
        )


class VllmStreamingParser:
    """One stream's vLLM parser: each piece through ``parse_delta`` as it comes (see the
    module docstring for the deltas and the ids they are given)."""

    calls_finish_reason = "tool_calls"

    def __init__(
        self,
        parser: Any,
        request: Any,
        tokenizer: Any,
        markers: dict[int, str],
        prompt_ids: list[int] | None = None,
    ) -> None:
        self._parser = parser
        self._request = request
        self._tokenizer = tokenizer
        self._markers = markers
        self._prompt: list[int] = list(prompt_ids or ())  # vLLM gives each delta the prompt
        self._started: set[int] = set()  # the indexes of the calls whose first delta is out

    def feed(self, text: str) -> ParsedDelta:
        parsed = ParsedDelta()
        if not text:
            return parsed
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        parts = _cut(text, ids, self._markers) if self._markers else [text]
        if len(parts) == 1:
            self._add(parsed, self._delta(text, ids, finished=False))
            return parsed
        for part in parts:
            part_ids = self._tokenizer.encode(part, add_special_tokens=False)
            self._add(parsed, self._delta(part, part_ids, finished=False))
        return parsed

    def finish(self) -> ParsedDelta:
        parsed = ParsedDelta()
        self._add(parsed, self._delta("", [], finished=True))
        return parsed

    def _delta(self, text: str, ids: list[int], *, finished: bool) -> Any:
        return self._parser.parse_delta(text, ids, self._request, self._prompt, finished=finished)

    def _add(self, parsed: ParsedDelta, delta: Any) -> None:
        if delta is None:
            return
        parsed.content += delta.content or ""
        parsed.reasoning_content += delta.reasoning or ""
        for call in delta.tool_calls or ():
            piece = self._tool_call(call)
            last = parsed.tool_calls[-1] if parsed.tool_calls else None
            if last is not None and last["index"] == piece["index"] and "id" not in piece:
                for key, text in piece["function"].items():  # one entry per call and chunk
                    last["function"][key] = last["function"].get(key, "") + text
            else:
                parsed.tool_calls.append(piece)

    def _tool_call(self, call: Any) -> dict[str, Any]:
        """A vLLM ``DeltaToolCall`` in OpenAI's shape; a call's first delta gets an id (vLLM's
        own, or one made as vLLM makes them) and its type."""
        out: dict[str, Any] = {"index": call.index}
        if call.index not in self._started:
            self._started.add(call.index)
            out["id"] = call.id or _tool_call_id()
            out["type"] = "function"
        function = call.function.model_dump(exclude_none=True) if call.function else {}
        out["function"] = {"arguments": "", **function}
        return out


def _tool_call_id() -> str:
    from vllm.renderers.chat_utils import make_tool_call_id  # vLLM's ids

    return make_tool_call_id()

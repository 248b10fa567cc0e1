"""The :class:`~dynamo.frontend.output_parser.OutputParser` of ``--dyn-chat-processor vllm``:
vLLM's own tool-call and reasoning parsers, composed and driven as vLLM's OpenAI server does.

``vllm.parser.ParserManager.get_parser(tool_parser_name=, reasoning_parser_name=,
enable_auto_tools=True, tokenizer=)`` composes the two registries' parsers
(``ToolParserManager``, ``ReasoningParserManager``: their names are vLLM's, ``hermes``,
``qwen3``, ...) into one class, checked against the model's tokenizer; vLLM's
``OpenAIServingChat`` builds one per request (``parser_cls(tokenizer, request.tools)``) and, for
a whole completion, calls ``parser.parse(text, request, enable_auto_tools=True,
model_output_token_ids=ids)`` -> ``(reasoning, content, tool_calls)``.

Both modes parse the whole completion at :meth:`VllmOutputParser.finish` with that call:
vLLM's streaming entry point (``parse_delta``) needs each delta's token ids, and the
frontend's output path hands a parser text only. A streamed request therefore gets its
reasoning, content and calls in the chunks before the finish rather than token by token (the
text of a call never leaks into ``content`` either way). The ids ``parse`` is given are the
text encoded again by the model's tokenizer (special tokens such as ``<think>`` encode to their
own ids).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dynamo.runtime import peer_text
from dynamo.runtime.log_budget import CauseBudgets

from .output_parser import Messages, OutputParser, ParsedDelta, Tools

logger = logging.getLogger(__name__)
_unusable = CauseBudgets(logger, lines=1, interval_s=60.0)


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
            (model, tool_call_parser, reasoning_parser),
            "Model %s: vLLM's parsers (tool-call %s, reasoning %s) cannot be used with its "
            "tokenizer (%s); the model is served without parsing",
            peer_text.escape(model),
            tool_call_parser,
            reasoning_parser,
            peer_text.escape(exc),
        )
        return None
    return None if parser_cls is None else VllmOutputParsers(parser_cls, tokenizer)


class VllmOutputParsers:
    """Builds each request's :class:`VllmOutputParser` for one model."""

    def __init__(self, parser_cls: Any, tokenizer: Any) -> None:
        self._parser_cls = parser_cls
        self._tokenizer = tokenizer
        self.parses_tool_calls = parser_cls.tool_parser_cls is not None
        self._parses_reasoning = parser_cls.reasoning_parser_cls is not None

    def __call__(
        self,
        tools: Tools = None,
        tool_choice: Any = "auto",
        messages: Messages = (),
        stream: bool = True,
    ) -> OutputParser | None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        calls = bool(tools) and tool_choice not in ("none", None) and self.parses_tool_calls
        if not calls and not self._parses_reasoning:
            return None
        request = ChatCompletionRequest.model_validate(
            {
                "model": "model",
                "messages": [_plain(message) for message in messages] or [{"role": "user"}],
                "tools": list(tools) if calls and tools else None,
                "tool_choice": tool_choice if calls else "none",
            }
        )
        parser = self._parser_cls(self._tokenizer, request.tools)
        return VllmOutputParser(parser, request, self._tokenizer, calls)


def _plain(message: Mapping[str, Any]) -> dict[str, Any]:
    return {"role": message.get("role", "user"), "content": message.get("content") or ""}


class VllmOutputParser:
    """One request's vLLM parser: gathers the text, parses it whole at :meth:`finish`."""

    def __init__(self, parser: Any, request: Any, tokenizer: Any, calls: bool) -> None:
        self._parser = parser
        self._request = request
        self._tokenizer = tokenizer
        self._calls = calls
        self._text: list[str] = []

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


def _tool_call_id() -> str:
    from vllm.renderers.chat_utils import make_tool_call_id  # vLLM's ids

    return make_tool_call_id()

"""The :class:`~dynamo.frontend.parsing.output_parser.OutputParser` of ``--dyn-chat-processor
sglang``: SGLang's own tool-call and reasoning parsers, one set per request.

Imported only where SGLang is (the processor imports this module when it builds a parser).
The parsers are SGLang's, used as SGLang's OpenAI server and upstream Dynamo's SGLang processor
use them:

* reasoning first: ``ReasoningParser.parse_stream_chunk`` splits each piece into reasoning and
  normal text, ``parse_stream_end`` flushes what its detector held back;
* then tool calls, on the normal text only: ``FunctionCallParser.parse_stream_chunk`` (the
  model's own format, for ``tool_choice`` ``auto``) or ``JsonArrayParser`` (``required`` or a
  named function: the JSON array that constrained decoding makes the model write), each with
  its ``parse_stream_end`` / ``finish`` at the end. Text that belongs to a call never reaches
  ``content``.

A parser built with ``stream=False`` (a non-streamed request) only gathers what it is fed and
parses the whole completion in :meth:`SglangOutputParser.finish` with SGLang's non-streaming
calls (``parse_non_stream`` of both parsers), as SGLang's server does for such a request: its
streaming detectors can drop text when a whole completion arrives in one piece.

Streamed calls are handed out whole by :meth:`SglangOutputParser.finish`, as upstream Dynamo
does: a streaming detector emits at most one event per piece (a name, or an argument
fragment), so a call that arrived in one piece can be left half-read. When a streamed call is
unknown, or its arguments are not complete JSON, the whole tool text is parsed again the way
SGLang parses a non-streamed completion (``parse_non_stream``; for the JSON array,
``json.loads`` as SGLang's ``_process_tool_calls`` does), and that result is authoritative.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from sglang.srt.entrypoints.openai.protocol import Tool
from sglang.srt.function_call.core_types import ToolCallItem
from sglang.srt.function_call.function_call_parser import FunctionCallParser
from sglang.srt.function_call.json_array_parser import JsonArrayParser
from sglang.srt.parser.reasoning_parser import ReasoningParser

from .output_parser import ParsedDelta


@dataclass
class _Call:
    name: str = ""
    arguments: list[str] = field(default_factory=list)


def tool_call_id(parser_name: str | None, name: str, index: int, history: int) -> str:
    """A call's id as SGLang's server makes it (``OpenAIServingChat._process_tool_call_id``):
    Kimi's templates refer to calls by a counter over the conversation, every other model gets
    a random ``call_`` id."""
    if parser_name == "kimi_k3":
        return f"{name}:{history + index}"
    if parser_name == "kimi_k2":
        return f"functions.{name}:{history + index}"
    return f"call_{uuid.uuid4().hex[:24]}"


def _json_array_calls(text: str) -> list[ToolCallItem]:
    """A ``required``/named completion parsed as SGLang's server parses it when not streaming:
    a JSON array (or one object) of ``{"name", "parameters"}``; anything else is no call."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        return []
    return [
        ToolCallItem(
            tool_index=index,
            name=item["name"],
            parameters=json.dumps(item.get("parameters", {}), ensure_ascii=False),
        )
        for index, item in enumerate(data)
        if isinstance(item, dict) and isinstance(item.get("name"), str)
    ]


def _start_of_call(parser: Any, text: str) -> int:
    """Where in ``text`` (after its first character) a tool call's start token, or the start
    of one, begins; 0 for nowhere. SGLang's streaming detectors drop the normal text in front
    of a start token when both come in one piece (an item of several tokens: ``"k.<"`` then
    ``"tool_call>"``), so the two are fed apart; with one token per piece they never meet."""
    start = getattr(getattr(parser, "detector", None), "bot_token", None)
    if not isinstance(start, str) or not start:
        return 0
    for index in range(1, len(text)):
        if start.startswith(text[index : index + len(start)]):
            return index
    return 0


class SglangOutputParser:
    """One request's parsers (see the module docstring); feed it text, then finish it once."""

    def __init__(
        self,
        *,
        tools: list[Tool],
        tool_parser: FunctionCallParser | JsonArrayParser | None,
        reasoning_parser: ReasoningParser | None,
        tool_call_parser_name: str | None = None,
        history_tool_calls: int = 0,
        stream: bool = True,
    ) -> None:
        self._tools = tools
        self._tool_parser = tool_parser
        self._reasoning_parser = reasoning_parser
        self._parser_name = tool_call_parser_name
        self._history = history_tool_calls
        self._stream = stream
        self._whole: list[str] = []  # stream=False: the completion, parsed at finish
        self._tool_text: list[str] = []  # the normal text the tool parser saw, for a re-parse
        self._calls: dict[int, _Call] = {}  # streamed, by SGLang's tool_index

    def feed(self, text: str) -> ParsedDelta:
        if not text:
            return ParsedDelta()
        if not self._stream:
            self._whole.append(text)
            return ParsedDelta()
        reasoning, normal = self._split_reasoning(text)
        return ParsedDelta(content=self._parse_tools(normal), reasoning_content=reasoning)

    def finish(self) -> ParsedDelta:
        if not self._stream:
            return self._parse_whole("".join(self._whole))
        reasoning = content = ""
        if self._reasoning_parser is not None:
            held_reasoning, held_normal = self._reasoning_parser.parse_stream_end()
            reasoning = held_reasoning or ""
            content = self._parse_tools(held_normal or "")
        if self._tool_parser is not None:
            if isinstance(self._tool_parser, JsonArrayParser):
                end = self._tool_parser.finish(self._tools)
                held, calls = end.normal_text, end.calls
            else:
                held, calls = self._tool_parser.parse_stream_end()
            self._collect(calls)
            content += held
        return ParsedDelta(content=content, reasoning_content=reasoning, tool_calls=self._result())

    def _parse_whole(self, text: str) -> ParsedDelta:
        reasoning, content = "", text
        if self._reasoning_parser is not None:
            found_reasoning, normal = self._reasoning_parser.parse_non_stream(text)
            reasoning, content = found_reasoning or "", normal or ""
        if self._tool_parser is not None and content:
            self._tool_text.append(content)
            if self._tool_parser.has_tool_call(content):
                if isinstance(self._tool_parser, JsonArrayParser):
                    calls = _json_array_calls(content)
                    content = "" if calls else content
                else:
                    content, calls = self._tool_parser.parse_non_stream(content)
                self._collect(calls)
        return ParsedDelta(content=content, reasoning_content=reasoning, tool_calls=self._result())

    def _split_reasoning(self, text: str) -> tuple[str, str]:
        if self._reasoning_parser is None:
            return "", text
        reasoning, normal = self._reasoning_parser.parse_stream_chunk(text)
        return reasoning or "", normal or ""

    def _parse_tools(self, text: str) -> str:
        """``text`` less what belongs to a tool call (collected for :meth:`finish`)."""
        if self._tool_parser is None or not text:
            return text
        cut = _start_of_call(self._tool_parser, text)
        if cut:  # normal text, then (perhaps) a call: feed them apart
            return self._parse_tools(text[:cut]) + self._parse_tools(text[cut:])
        self._tool_text.append(text)
        if isinstance(self._tool_parser, JsonArrayParser):
            result = self._tool_parser.parse_streaming_increment(text, self._tools)
            normal, calls = result.normal_text, result.calls
        else:
            normal, calls = self._tool_parser.parse_stream_chunk(text)
        self._collect(calls)
        return normal

    def _collect(self, calls: list[ToolCallItem]) -> None:
        for item in calls:
            call = self._calls.setdefault(item.tool_index, _Call())
            if item.name:
                call.name = item.name
            if item.parameters:
                call.arguments.append(item.parameters)

    def _known(self, name: str) -> bool:
        return any(tool.function.name == name for tool in self._tools)

    def _streamed_calls_complete(self) -> bool:
        for call in self._calls.values():
            if not self._known(call.name):
                return False
            try:
                json.loads("".join(call.arguments))
            except ValueError:
                return False
        return True

    def _reparse(self) -> list[ToolCallItem]:
        text = "".join(self._tool_text)
        if not text or self._tool_parser is None or not self._tool_parser.has_tool_call(text):
            return []
        if isinstance(self._tool_parser, JsonArrayParser):
            return _json_array_calls(text)
        return self._tool_parser.parse_non_stream(text)[1]

    def _result(self) -> list[dict[str, Any]]:
        if self._tool_parser is None:
            return []
        if self._calls and self._streamed_calls_complete():
            found = [(c.name, "".join(c.arguments)) for _, c in sorted(self._calls.items())]
        else:
            found = [(item.name or "", item.parameters) for item in self._reparse()]
        # Calls are numbered in the order written (SGLang's tool_index can be the tool's place
        # in the request instead); a call to a tool the request did not offer is not a call.
        found = [(name, arguments) for name, arguments in found if self._known(name)]
        return [
            {
                "index": index,
                "id": tool_call_id(self._parser_name, name, index, self._history),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            for index, (name, arguments) in enumerate(found)
        ]

"""What the response path asks of a tool-call / reasoning parser: one per request.

A chat processor that parses its model's output (``--dyn-chat-processor sglang`` today) builds
one :class:`OutputParser` per request from the request's ``tools`` / ``tool_choice`` and the
parser names in effect. The response path feeds it the completion's text as it is decoded and
turns what comes back into OpenAI deltas:

* ``content`` and ``reasoning_content`` go out as they come (streaming) or are joined (not);
* ``tool_calls`` in OpenAI's shape: whole from :meth:`OutputParser.finish` (SGLang's parsers
  here: a call's arguments are complete JSON only once the model has finished it), or as
  streaming deltas from :meth:`OutputParser.feed` (vLLM's: a call's first delta has its id and
  name, the next ones pieces of its arguments); a completion that ends with tool calls and
  ``finish_reason`` ``stop`` reports ``tool_calls``, as OpenAI, vLLM and SGLang do.

A non-streamed completion is fed the same way (its whole text in one :meth:`OutputParser.feed`,
then :meth:`OutputParser.finish`), so both modes go through the same parser state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

# A request's "tools" and "messages", in OpenAI's shapes.
Tools = Sequence[Mapping[str, Any]] | None
Messages = Sequence[Mapping[str, Any]]


@dataclass
class ParsedDelta:
    content: str = ""
    reasoning_content: str = ""
    # OpenAI's shape: {"index", "id", "type": "function", "function": {"name", "arguments"}}
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning_content or self.tool_calls)


class OutputParser(Protocol):
    def feed(self, text: str) -> ParsedDelta:
        """The text generated since the last call, split into content and reasoning."""
        ...

    def finish(self) -> ParsedDelta:
        """The end of the completion: what the parsers held back, and the tool calls."""
        ...


class FirstCallOnly:
    """A request's parser with ``parallel_tool_calls`` false: its first tool call only (the
    entries of index 0, a whole call or its streamed deltas), the rest dropped, as vLLM's
    ``maybe_filter_parallel_tool_calls`` filters them."""

    def __init__(self, parser: OutputParser) -> None:
        self._parser = parser
        # The wrapped parser's finish reason for its calls (see ParsedOutput), if it has one.
        self.calls_finish_reason = getattr(parser, "calls_finish_reason", "tool_calls")

    @staticmethod
    def _first(parsed: ParsedDelta) -> ParsedDelta:
        parsed.tool_calls = [call for call in parsed.tool_calls if call.get("index") == 0]
        return parsed

    def feed(self, text: str) -> ParsedDelta:
        return self._first(self._parser.feed(text))

    def finish(self) -> ParsedDelta:
        return self._first(self._parser.finish())


class WithoutReasoning:
    """A request's parser with ``include_reasoning`` false: its reasoning dropped, as vLLM's
    ``parse_delta`` / ``parse`` drop it (a streamed piece that was only reasoning is no chunk)."""

    def __init__(self, parser: OutputParser) -> None:
        self._parser = parser
        self.calls_finish_reason = getattr(parser, "calls_finish_reason", "tool_calls")

    @staticmethod
    def _drop(parsed: ParsedDelta) -> ParsedDelta:
        parsed.reasoning_content = ""
        return parsed

    def feed(self, text: str) -> ParsedDelta:
        return self._drop(self._parser.feed(text))

    def finish(self) -> ParsedDelta:
        return self._drop(self._parser.finish())


# One request's parser from its ``tools``, ``tool_choice`` and ``messages``, and whether it
# streams (a non-streamed completion is parsed whole at the end), with the keywords of
# :class:`ParserRequest` (``variables``, ``prompt_ids``, ``fields``); None: nothing to parse.
OutputParserFactory = Callable[..., OutputParser | None]


@dataclass(frozen=True)
class ParserRequest:
    """What a request's parser is built from: ``tools`` and ``tool_choice`` in OpenAI's shapes,
    its ``messages``, whether it streams, and what vLLM's server gives its parsers besides: the
    chat template's variables (``chat_template_kwargs`` with ``reasoning_effort`` and
    ``enable_thinking`` merged in, as the prompt was rendered: several reasoning parsers read
    them to know whether the model thinks at all), the rendered prompt's ids (a parser can see
    whether the template already opened or closed the reasoning), and the request's other
    fields that shape parsing (``parallel_tool_calls``, ``include_reasoning``, ...)."""

    tools: Tools = None
    tool_choice: Any = "auto"
    messages: Messages = ()
    stream: bool = True
    variables: Mapping[str, Any] = field(default_factory=dict)
    prompt_ids: Sequence[int] = ()
    fields: Mapping[str, Any] = field(default_factory=dict)


class OutputParsers:
    """A model's :data:`OutputParserFactory` as a class: the call's arguments, gathered in a
    :class:`ParserRequest`, go to :meth:`build`, which a chat processor's factory overrides."""

    def __call__(
        self,
        tools: Tools = None,
        tool_choice: Any = "auto",
        messages: Messages = (),
        stream: bool = True,
        *,
        variables: Mapping[str, Any] | None = None,
        prompt_ids: Sequence[int] = (),
        fields: Mapping[str, Any] | None = None,
    ) -> OutputParser | None:
        return self.build(
            ParserRequest(
                tools, tool_choice, messages, stream, dict(variables or {}), prompt_ids,
                dict(fields or {}),
            )
        )  # fmt: skip

    def build(self, request: ParserRequest) -> OutputParser | None:
        raise NotImplementedError


def no_output_parser(
    tools: Tools = None,
    tool_choice: Any = "auto",
    messages: Messages = (),
    stream: bool = True,
    **context: Any,
) -> OutputParser | None:
    """The factory of a processor that parses nothing (its output is all content)."""
    return None

"""The output of a ``tool_choice`` ``required`` or named function, parsed into OpenAI
``tool_calls`` as vLLM's OpenAI server parses it (its ``Parser.parse`` for required and named
choices), for the processors whose own parsers do not force calls (``hf``, ``sglang``, and
``vllm`` without a tool-call parser): with ``vllm`` and a tool-call parser, vLLM's parsers force
and parse them (:meth:`~.vllm_output_parser.VllmOutputParsers.adjusted`).

The worker's engine forced the output into a JSON schema built from the tools
(:func:`~dynamo.frontend.openai.structured_output.forced_tool_schema`): for ``required`` an array of
``{"name", "parameters"}`` objects, one per call; for a named function the arguments object of
that one call. The text is held back while it streams and becomes the calls at the end (a
call's arguments are complete JSON only then), the :class:`~.output_parser.OutputParser`
protocol. ``finish_reason`` as vLLM gives it: ``tool_calls`` for required, ``stop`` for a named
function (OpenAI's rule); :attr:`ForcedToolCalls.calls_finish_reason` tells the response path.

Where the text is not what the schema forces (the completion was cut at ``max_tokens``, or an
engine that did not apply the schema), vLLM returns no calls and no content; this parser returns
the text as content instead, so the client sees what the model wrote, with the engine's
``finish_reason``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from .output_parser import ParsedDelta


def tool_call_id() -> str:
    """vLLM's default tool-call id (``make_tool_call_id``)."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def _call(index: int, name: str, arguments: str) -> dict[str, Any]:
    return {
        "index": index,
        "id": tool_call_id(),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def parse_required(text: str) -> list[dict[str, Any]] | None:
    """The calls of a ``required`` output (a JSON array of ``{name, parameters}``), or None
    when the text is not one."""
    try:
        items = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(items, list):
        return None
    calls = []
    for index, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        parameters = item.get("parameters") or {}
        if not isinstance(parameters, dict):
            return None
        calls.append(_call(index, item["name"], json.dumps(parameters, ensure_ascii=False)))
    return calls


class ForcedToolCalls:
    """One request's parser (see the module docstring): ``tool_choice`` is ``"required"`` or
    the name of the function it forces."""

    def __init__(self, tool_choice: str, *, named: bool) -> None:
        self._name = tool_choice
        self._named = named
        self._text: list[str] = []
        self.calls_finish_reason = "stop" if named else "tool_calls"

    def feed(self, text: str) -> ParsedDelta:
        self._text.append(text)
        return ParsedDelta()

    def finish(self) -> ParsedDelta:
        text = "".join(self._text)
        self._text = []
        if self._named:
            if not text.strip():
                return ParsedDelta()
            return ParsedDelta(tool_calls=[_call(0, self._name, text)])
        calls = parse_required(text)
        return ParsedDelta(tool_calls=calls) if calls else ParsedDelta(content=text)


def forced_tool_calls(tool_choice: Any) -> ForcedToolCalls | None:
    """The parser for a request's ``tool_choice`` (as its model dumps it), or None when the
    choice does not force calls."""
    if tool_choice == "required":
        return ForcedToolCalls("required", named=False)
    if isinstance(tool_choice, dict):
        return ForcedToolCalls(tool_choice["function"]["name"], named=True)
    return None

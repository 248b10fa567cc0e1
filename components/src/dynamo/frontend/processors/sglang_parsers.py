"""``--dyn-chat-processor sglang``'s output parsers: each request's
:class:`~dynamo.frontend.parsing.output_parser.OutputParser` built from SGLang's own parsers as
SGLang's server builds them (its ``FunctionCallParser`` or, for a forced call, its
``JsonArrayParser``; its ``ReasoningParser`` by SGLang's rules for the request), and the
constraint SGLang's server puts on a forced call. SGLang's modules are imported at start-up
(:mod:`.sglang_processor`); the imports below are lookups."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from dynamo.frontend.openai.structured_output import from_json_schema
from dynamo.frontend.parsing.output_parser import OutputParser, OutputParsers, ParserRequest
from dynamo.runtime.sampling import StructuredOutputs

from .sglang_reasoning import ReasoningDefaults


def _is_named_tool_choice(tool_choice: Any) -> bool:
    return (
        isinstance(tool_choice, Mapping)
        and tool_choice.get("type") == "function"
        and isinstance(tool_choice.get("function"), Mapping)
        and bool(tool_choice["function"].get("name"))
    )


class SglangOutputParsers(OutputParsers):
    """Builds each request's :class:`~dynamo.frontend.parsing.output_parser.OutputParser` for one
    model."""

    def __init__(
        self,
        tokenizer: Any,
        template_text: str,
        tool_call_parser: str | None,
        reasoning_parser: str | None,
    ) -> None:
        self._tokenizer = tokenizer
        self._tool_call_parser = tool_call_parser
        self._reasoning_parser = reasoning_parser
        self._reasoning_defaults = (
            ReasoningDefaults.detect(reasoning_parser, template_text) if reasoning_parser else None
        )
        # SGLang's scheduler defers a grammar to the reasoning's end only when the parser's
        # think-end token encodes to ids (OpenAIServingChat._set_json_grammar_start).
        self._grammar_waits_for_reasoning = bool(
            reasoning_parser and _think_end_ids(reasoning_parser, tokenizer)
        )
        # A forced call (tool_choice required or named) is parsed here, as SGLang's server
        # parses it (its reasoning parser first, by SGLang's rule, then the JSON array the
        # schema constraint makes the model write): not by the frontend's ForcedToolCalls.
        self.forces_tool_calls = True

    def adjusted(
        self, request: ParserRequest, skip_special_tokens: bool | None
    ) -> tuple[StructuredOutputs, bool | None] | None:
        """The constraint SGLang's server puts on a forced call, which :meth:`build` parses: a
        JSON array of ``{"name", "parameters"}`` calls (``get_json_schema_constraint``), for a
        named function too (vLLM forces that one's arguments alone). None: not forced."""
        from sglang.srt.entrypoints.openai.protocol import Tool, ToolChoice
        from sglang.srt.function_call.utils import get_json_schema_constraint

        choice = request.tool_choice
        if not request.tools or not (choice == "required" or _is_named_tool_choice(choice)):
            return None
        tools = [Tool.model_validate(tool) for tool in request.tools]
        named = choice if choice == "required" else ToolChoice.model_validate(choice)
        parallel = request.fields.get("parallel_tool_calls") is not False
        schema = get_json_schema_constraint(tools, named, parallel_tool_calls=parallel)
        if schema is None:  # a name no tool has: refused before, as the client's 400
            return None
        return from_json_schema(schema, "tool_choice"), skip_special_tokens

    def reasoning_ended(self, request: ParserRequest) -> bool:
        """Where the request's grammar starts, as SGLang decides it: its grammar backend (with
        ``--reasoning-parser``) holds a grammar back until the think-end token when the request
        requires reasoning (``require_reasoning``: the template opens the reasoning, or the
        request's ``chat_template_kwargs`` / ``reasoning_effort`` turn thinking on, by SGLang's
        rules), else applies it from the first token. The worker's vLLM engine does the same
        with ``reasoning_ended`` False (after the reasoning) or True (from the start)."""
        if self._reasoning_defaults is None or not self._grammar_waits_for_reasoning:
            return True
        return not self._reasoning_defaults.force_reasoning(request.fields)

    def build(self, request: ParserRequest) -> OutputParser | None:
        """The request's parser, or None when it has nothing to parse (no reasoning parser, and
        no tools or ``tool_choice`` ``none``). ``tools`` and ``tool_choice`` in OpenAI's shape;
        ``messages`` for the number of earlier tool calls (Kimi's call ids count them);
        ``stream`` as the request asks (a non-streamed one is parsed whole at the end)."""
        tools, tool_choice, messages = request.tools, request.tool_choice, request.messages
        stream = request.stream
        from sglang.srt.entrypoints.openai.protocol import Tool
        from sglang.srt.function_call.function_call_parser import FunctionCallParser
        from sglang.srt.function_call.json_array_parser import JsonArrayParser
        from sglang.srt.parser.reasoning_parser import ReasoningParser

        from dynamo.frontend.parsing.sglang_output_parser import SglangOutputParser

        sglang_tools = [Tool.model_validate(tool) for tool in tools or ()]
        forced = tool_choice == "required" or _is_named_tool_choice(tool_choice)
        tool_parser: FunctionCallParser | JsonArrayParser | None = None
        if sglang_tools and tool_choice != "none":
            if forced:  # constrained decoding makes the model write a JSON array of calls
                tool_parser = JsonArrayParser()
            elif self._tool_call_parser:
                tool_parser = FunctionCallParser(
                    tools=sglang_tools,
                    tool_call_parser=self._tool_call_parser,
                    tokenizer=self._tokenizer,
                )
        reasoning_parser = None
        # Per request, as SGLang's server decides it: the client's template variables and
        # reasoning_effort turn a model's thinking on or off (SGLang reads them off the
        # request, not off the variables merged for the template).
        force_reasoning = (
            self._reasoning_defaults.force_reasoning(request.fields)
            if self._reasoning_defaults is not None
            else False
        )
        if self._reasoning_parser and not (forced and not force_reasoning):
            reasoning_parser = ReasoningParser(
                model_type=self._reasoning_parser,
                stream_reasoning=True,
                force_reasoning=force_reasoning,
                request=SimpleNamespace(  # what SGLang's parser reads off its request
                    chat_template_kwargs=dict(request.fields.get("chat_template_kwargs") or {}),
                    reasoning_effort=request.fields.get("reasoning_effort"),
                ),
                tokenizer=self._tokenizer,
                tool_call_parser_active=tool_parser is not None,
            )
        if tool_parser is None and reasoning_parser is None:
            return None
        return SglangOutputParser(
            tools=sglang_tools,
            tool_parser=tool_parser,
            reasoning_parser=reasoning_parser,
            tool_call_parser_name=self._tool_call_parser,
            history_tool_calls=_earlier_tool_calls(messages),
            stream=stream,
        )


def _think_end_ids(reasoning_parser: str, tokenizer: Any) -> list[int]:
    """The ids of SGLang's think-end token for this parser and tokenizer (its detector's
    ``get_think_end_token_ids``), as SGLang's server reads them."""
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    detector = ReasoningParser(model_type=reasoning_parser, tokenizer=tokenizer).detector
    return list(detector.get_think_end_token_ids(tokenizer))


def _earlier_tool_calls(messages: Sequence[Mapping[str, Any]]) -> int:
    return sum(
        len(m.get("tool_calls") or ())
        for m in messages
        if m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list)
    )

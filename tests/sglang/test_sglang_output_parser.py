"""The sglang processor's OutputParser against SGLang's own parsers, on known model outputs:
a qwen25 / hermes style tool call, a deepseek-r1 / qwen3 style ``<think>`` block, a JSON array
for ``tool_choice: required``; streamed piece by piece as the model's tokenizer decodes them,
and whole. The last test takes the output from the mock engine, which echoes its prompt."""

from __future__ import annotations

import json

import pytest

from dynamo.frontend.parsing.output_parser import ParsedDelta
from dynamo.frontend.processors.chat_processor import (
    build_chat_processor,
    import_processor_libraries,
)
from dynamo.runtime.sampling import SamplingOptions
from dynamo.vllm.mock_engine import mock_completion
from dynamo.vllm.mock_model import load_mock_model

pytestmark = pytest.mark.sglang

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL = {"name": "get_weather", "arguments": '{"city": "Paris"}'}


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    import_processor_libraries("sglang")
    return load_mock_model(tiny_tokenizer, served_model_name="tiny")


def processor(model, tool_call_parser=None, reasoning_parser=None):
    from dynamo.frontend.processors.sglang_processor import SglangSettings

    settings = SglangSettings(tool_call_parser, reasoning_parser)
    return build_chat_processor(model.card, "sglang", settings)


def pieces(chat_processor, text: str) -> list[str]:
    """``text`` as a stream delivers it: one piece per token, decoded by the model's tokenizer."""
    detokenizer = chat_processor.detokenizer()
    ids = chat_processor.tokenizer.encode(text, add_special_tokens=False)
    out = [detokenizer.add([token]) for token in ids] + [detokenizer.finish()]
    assert "".join(out) == text
    return [piece for piece in out if piece]


def run(parser, text_pieces: list[str]) -> tuple[ParsedDelta, ParsedDelta]:
    """Everything fed, joined; and what finish() returned."""
    fed = [parser.feed(piece) for piece in text_pieces]
    assert all(not delta.tool_calls for delta in fed)  # calls come whole, at the end
    end = parser.finish()
    joined = ParsedDelta(
        content="".join(d.content for d in fed) + end.content,
        reasoning_content="".join(d.reasoning_content for d in fed) + end.reasoning_content,
        tool_calls=end.tool_calls,
    )
    return joined, end


def assert_one_weather_call(tool_calls):
    assert len(tool_calls) == 1, tool_calls
    call = tool_calls[0]
    assert call["index"] == 0 and call["type"] == "function"
    assert call["id"].startswith("call_") and len(call["id"]) == len("call_") + 24
    assert call["function"]["name"] == CALL["name"]
    assert json.loads(call["function"]["arguments"]) == json.loads(CALL["arguments"])


@pytest.mark.parametrize("parser_name", ["qwen25", "hermes"])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_tool_call_in_the_models_format(model, parser_name, stream):
    chat = processor(model, tool_call_parser=parser_name)
    parser = chat.output_parser([WEATHER], "auto", stream=stream)
    text = "Let me check." + TOOL_CALL
    joined, _ = run(parser, pieces(chat, text) if stream else [text])
    assert joined.content.strip() == "Let me check."
    assert joined.reasoning_content == ""
    assert_one_weather_call(joined.tool_calls)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_plain_text_with_tools_offered_has_no_call(model, stream):
    chat = processor(model, tool_call_parser="qwen25")
    parser = chat.output_parser([WEATHER], "auto", stream=stream)
    text = "It is sunny in Paris."
    joined, _ = run(parser, pieces(chat, text) if stream else [text])
    assert joined == ParsedDelta(content=text)


def test_a_call_to_a_tool_the_request_did_not_offer_is_not_a_call(model):
    chat = processor(model, tool_call_parser="qwen25")
    other = {"type": "function", "function": {"name": "get_time", "parameters": {}}}
    joined, _ = run(chat.output_parser([other], "auto"), pieces(chat, TOOL_CALL))
    assert joined.tool_calls == []


@pytest.mark.parametrize("parser_name", ["deepseek-r1", "qwen3"])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_think_block_is_reasoning_content(model, parser_name, stream):
    chat = processor(model, reasoning_parser=parser_name)
    parser = chat.output_parser(stream=stream)
    text = "<think>The user wants a greeting.</think>Hello!"
    joined, _ = run(parser, pieces(chat, text) if stream else [text])
    assert joined.reasoning_content.strip() == "The user wants a greeting."
    assert joined.content.strip() == "Hello!"
    assert joined.tool_calls == []


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_reasoning_then_a_tool_call(model, stream):
    chat = processor(model, tool_call_parser="qwen25", reasoning_parser="qwen3")
    parser = chat.output_parser([WEATHER], "auto", stream=stream)
    text = "<think>Paris, so call the tool.</think>" + TOOL_CALL
    joined, _ = run(parser, pieces(chat, text) if stream else [text])
    assert joined.reasoning_content.strip() == "Paris, so call the tool."
    assert joined.content.strip() == ""
    assert_one_weather_call(joined.tool_calls)


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_required_and_named_tool_choice_read_the_json_array(model, tool_choice, stream):
    chat = processor(model, tool_call_parser="qwen25")
    parser = chat.output_parser([WEATHER], tool_choice, stream=stream)
    text = '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'
    joined, _ = run(parser, pieces(chat, text) if stream else [text])
    assert joined.content == ""
    assert_one_weather_call(joined.tool_calls)


def test_nothing_to_parse_gives_no_parser(model):
    assert processor(model).output_parser([WEATHER], "auto") is None
    assert processor(model, tool_call_parser="qwen25").output_parser([WEATHER], "none") is None
    assert processor(model, tool_call_parser="qwen25").output_parser(None, "auto") is None
    hf = build_chat_processor(model.card, "hf")
    assert hf.output_parser([WEATHER], "auto") is None


def test_kimi_k2_call_ids_count_the_earlier_calls(model):
    from dynamo.frontend.parsing.sglang_output_parser import tool_call_id

    assert tool_call_id("kimi_k2", "get_weather", 0, 2) == "functions.get_weather:2"
    assert tool_call_id("qwen25", "get_weather", 0, 2).startswith("call_")


def test_a_tool_call_echoed_by_the_mock_engine_comes_back_parsed(model):
    """The mock engine answers with its prompt: a user message carrying a tool call in the
    model's format comes back as the completion, decoded by the processor, then parsed."""
    chat = processor(model, tool_call_parser="qwen25", reasoning_parser="deepseek-r1")
    messages = [{"role": "user", "content": "<think>echo</think>" + TOOL_CALL}]
    prompt_ids = chat.encode_chat(chat.render(messages))
    options = SamplingOptions(max_tokens=512, stop_token_ids=model.card.eos_token_ids)
    completion_ids, _ = mock_completion(model, prompt_ids, options)
    detokenizer = chat.detokenizer()
    parser = chat.output_parser([WEATHER], "auto", messages)
    fed = [parser.feed(detokenizer.add([token])) for token in completion_ids]
    end = parser.feed(detokenizer.finish())
    finished = parser.finish()
    deltas = [*fed, end, finished]
    # deepseek-r1 reads a completion as reasoning until `</think>` (its template opens the
    # block in the prompt), so the echoed template turn `<|user|>` lands there too.
    assert "".join(d.reasoning_content for d in deltas) == "<|user|>\necho"
    assert "tool_call" not in "".join(d.content for d in deltas)
    assert_one_weather_call(finished.tool_calls)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize(
    "fields, thinks",
    [
        ({}, True),  # qwen3 thinks by default (its template opened the block)
        ({"chat_template_kwargs": {"enable_thinking": False}}, False),
        ({"chat_template_kwargs": {"enable_thinking": True}}, True),
    ],
    ids=["default", "told-not-to", "told-to"],
)
def test_the_requests_template_variables_decide_whether_it_thinks_as_sglang_does(
    model, fields, thinks, stream
):
    """SGLang's server decides per request whether the output starts in the reasoning
    (``_get_reasoning_from_request``: the client's chat_template_kwargs toggle): a model told
    not to think has its answer parsed as content, never as reasoning."""
    from dynamo.frontend.processors.sglang_reasoning import ReasoningDefaults

    chat = processor(model, reasoning_parser="qwen3")
    expected = ReasoningDefaults.detect("qwen3", "").force_reasoning(fields)
    assert expected is thinks  # the rule itself, as SGLang's table has it for qwen3
    parser = chat.output_parser(stream=stream, fields=fields)
    text = "Pondering the greeting.</think>Hello!"
    joined, _ = run(parser, pieces(chat, text) if stream else [text])
    if thinks:
        assert joined.reasoning_content.strip() == "Pondering the greeting."
        assert joined.content.strip() == "Hello!"
    else:
        assert joined.reasoning_content == ""
        assert "Hello!" in joined.content

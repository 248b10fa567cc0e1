"""Tool calls and reasoning come back parsed through the real response path: the frontend's
HTTP service (``--dyn-chat-processor sglang`` with SGLang's qwen25 tool-call parser and
deepseek-r1 reasoning parser) in front of a request-plane worker that streams a known output
(tests/support/frontend_fakes.py's echo engine, told what to emit: the tiny model cannot be
relied on to write a tool call, so the output is fixed and only the parsing is under test).
Streaming and not, read with the official ``openai`` client and as raw SSE."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

import pytest

from dynamo.frontend.processors.chat_processor import (
    build_chat_processor,
    import_processor_libraries,
)
from dynamo.frontend.routing.model_registry import ModelRegistry
from tests.sglang.test_sglang_output_parser import TOOL_CALL, WEATHER
from tests.support.answers import sse_events
from tests.support.frontend_fakes import MODEL, echo_worker, frontend
from tests.support.tiny_model import tiny_card

pytestmark = pytest.mark.sglang

THINKING = "The user wants the weather. "
SAID = "Let me look."
OUTPUT = f"<think>{THINKING}</think>{SAID}{TOOL_CALL}"
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def card(tiny_tokenizer):
    import_processor_libraries("sglang")
    return tiny_card(tiny_tokenizer, MODEL)


def sglang_registry(tool_call_parser="qwen25", reasoning_parser="deepseek-r1") -> ModelRegistry:
    from dynamo.frontend.processors.sglang_processor import SglangSettings

    settings = SglangSettings(tool_call_parser, reasoning_parser)
    return ModelRegistry(lambda card: build_chat_processor(card, "sglang", settings))


def output_ids(card, text: str) -> list[int]:
    # The model's tokenizer only (hf, no parser names: it would say it parses nothing).
    processor = build_chat_processor(
        card.model_copy(update={"tool_call_parser": None, "reasoning_parser": None})
    )
    ids = processor.tokenizer.encode(text, add_special_tokens=False)
    assert processor.tokenizer.decode(ids) == text
    return ids


def ask(card, body: dict, *, registry=None, output=None, seen=None):
    """The answer (status, body or SSE events); ``seen``: a list given the worker's requests."""

    async def scenario():
        async with (
            echo_worker(output=output or output_ids(card, OUTPUT), chunk=3) as (engine, endpoint),
            frontend(card, endpoint, registry=registry or sglang_registry()) as client,
        ):
            response = await client.post("/v1/chat/completions", json=body)
            answer = await (sse_events(response) if body.get("stream") else response.json())
            if seen is not None:
                seen.extend(engine.bodies)
            return response.status, answer

    return asyncio.run(scenario())


def chat(stream: bool, **extra) -> dict:
    return {"model": MODEL, "messages": MESSAGES, "stream": stream, **extra}


def assert_weather_call(calls: list[dict]) -> None:
    assert len(calls) == 1, calls
    call = calls[0]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_a_whole_answer_has_reasoning_content_and_tool_calls(card):
    n = len(output_ids(card, OUTPUT))
    status, body = ask(card, chat(False, tools=[WEATHER], max_tokens=n, ignore_eos=True))
    assert status == 200, body
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == THINKING
    assert message["content"] == SAID
    assert_weather_call(message["tool_calls"])
    # The echo engine would repeat its output: max_tokens ends it after one copy.
    assert body["choices"][0]["finish_reason"] == "length"


def test_a_stream_carries_reasoning_then_content_then_the_call_and_finish_reason(card):
    n = len(output_ids(card, OUTPUT))
    status, events = ask(card, chat(True, tools=[WEATHER], max_tokens=n, ignore_eos=True))
    assert status == 200
    assert events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert reasoning == THINKING
    assert content == SAID
    assert_weather_call(calls)
    assert "<tool_call>" not in content and "<think>" not in content
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_finish_reason_is_tool_calls_when_the_model_stopped_after_a_call(card):
    """The model's EOS right after the call ends the completion with "stop": with a call
    parsed, that is reported as "tool_calls" (OpenAI's, vLLM's, SGLang's)."""
    output = [*output_ids(card, OUTPUT), *card.eos_token_ids]
    for stream in (False, True):
        status, answer = ask(card, chat(stream, tools=[WEATHER], max_tokens=200), output=output)
        assert status == 200
        if stream:
            finish = answer[-2]["choices"][0]["finish_reason"]
        else:
            finish = answer["choices"][0]["finish_reason"]
            assert_weather_call(answer["choices"][0]["message"]["tool_calls"])
        assert finish == "tool_calls", answer
    # Without a call, "stop" stays "stop".
    status, answer = ask(card, chat(False, max_tokens=200), output=output)
    assert answer["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_forced_call_goes_through_the_reasoning_parser_first_as_sglang_does(
    card, tool_choice, stream
):
    """SGLang's server forces a call, named or not, into a JSON array of calls (its
    ``get_json_schema_constraint``: the engine is given that schema) and parses it after its
    reasoning parser, which deepseek-r1 always applies: the thoughts come back as
    reasoning_content, the call as tool_calls, nothing as content."""
    forced = (
        f'<think>{THINKING}</think>[{{"name": "get_weather", "parameters": {{"city": "Paris"}}}}]'
    )
    ids = output_ids(card, forced)
    body = chat(stream, tools=[WEATHER], tool_choice=tool_choice, max_tokens=len(ids))
    seen: list[dict] = []
    status, answer = ask(card, {**body, "ignore_eos": True}, output=ids, seen=seen)
    assert status == 200, answer
    (request,) = seen
    schema = json.loads(request["sampling"]["structured_outputs"]["json_schema"])
    assert schema["type"] == "array" and schema["minItems"] == 1, schema
    assert "get_weather" in json.dumps(schema["items"])
    if stream:
        deltas = [e["choices"][0]["delta"] for e in answer[:-1] if e["choices"]]
        reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
        content = "".join(d.get("content") or "" for d in deltas)
        calls = [c for d in deltas for c in d.get("tool_calls") or []]
    else:
        message = answer["choices"][0]["message"]
        reasoning, content = message.get("reasoning_content"), message.get("content") or ""
        calls = message["tool_calls"]
    assert reasoning == THINKING
    assert content == ""
    assert_weather_call(calls)


def test_without_tools_the_call_stays_text_and_reasoning_is_still_split(card):
    n = len(output_ids(card, OUTPUT))
    status, body = ask(card, chat(False, max_tokens=n, ignore_eos=True))
    assert status == 200, body
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == THINKING
    assert message["content"] == SAID + TOOL_CALL
    assert "tool_calls" not in message


def test_a_tool_the_parser_library_cannot_read_is_a_400_naming_tools(card):
    status, body = ask(card, chat(False, tools=[{"type": "function"}], max_tokens=4))
    assert status == 400, body
    assert body["error"]["param"].startswith("tools"), (
        body
    )  # tools[0].function: the request model's


def test_the_openai_client_reads_the_parsed_answer(card):
    openai = pytest.importorskip("openai")
    n = len(output_ids(card, OUTPUT))

    async def scenario():
        async with (
            echo_worker(output=output_ids(card, OUTPUT), chunk=2) as (_, endpoint),
            frontend(card, endpoint, registry=sglang_registry()) as client,
        ):
            base = str(client.make_url("/v1"))
            api = openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0)
            whole = await api.chat.completions.create(
                model=MODEL, messages=MESSAGES, tools=[WEATHER], max_tokens=n,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            streamed = await api.chat.completions.create(
                model=MODEL, messages=MESSAGES, tools=[WEATHER], max_tokens=n, stream=True,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            chunks = [chunk async for chunk in streamed]
            await api.close()
            return whole, chunks

    whole, chunks = asyncio.run(scenario())
    call = whole.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert whole.choices[0].message.content == SAID
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    streamed_calls = [call for delta in deltas for call in delta.tool_calls or []]
    assert [c.function.name for c in streamed_calls] == ["get_weather"]


def card_registry(settings_args=()) -> ModelRegistry:
    """The sglang processor as the frontend builds it; ``settings_args``: its own flags."""
    from dynamo.frontend.processors.sglang_processor import SglangSettings

    settings = SglangSettings(*settings_args)
    return ModelRegistry(lambda card: build_chat_processor(card, "sglang", settings))


def unique_model() -> str:
    # A model of its own: the card-name WARNING is budgeted per model and name, process-wide.
    return f"tiny-{uuid.uuid4().hex[:8]}"


def test_the_workers_parser_names_in_the_card_apply_without_frontend_flags(tiny_tokenizer):
    card = tiny_card(
        tiny_tokenizer, MODEL, tool_call_parser="qwen25", reasoning_parser="deepseek-r1"
    )
    n = len(output_ids(card, OUTPUT))
    status, body = ask(
        card,
        chat(False, tools=[WEATHER], max_tokens=n, ignore_eos=True),
        registry=card_registry(),
    )
    assert status == 200, body
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == THINKING
    assert_weather_call(message["tool_calls"])


def test_a_card_name_sglang_lacks_is_logged_and_the_model_served_without_it(tiny_tokenizer, caplog):
    model = unique_model()
    card = tiny_card(
        tiny_tokenizer, model, tool_call_parser="qwen99", reasoning_parser="deepseek-r1"
    )
    n = len(output_ids(card, OUTPUT))
    body = {"model": model, "messages": MESSAGES, "tools": [WEATHER], "max_tokens": n}
    registry = card_registry()  # one frontend: it warns once for the model, not per request
    with caplog.at_level(logging.WARNING, logger="dynamo.frontend.processors.card_parsers"):
        status, answer = ask(card, {**body, "ignore_eos": True}, registry=registry)
        # Served without a tool-call parser: tool_choice auto (the default with tools) would be
        # a quietly unparsed answer, so it is refused by name; "none" is served.
        assert status == 400 and answer["error"]["param"] == "tool_choice", answer
        status, answer = ask(
            card, {**body, "ignore_eos": True, "tool_choice": "none"}, registry=registry
        )
    assert status == 200, answer
    message = answer["choices"][0]["message"]
    assert message["reasoning_content"] == THINKING  # the name SGLang has still applies
    assert "tool_calls" not in message and message["content"] == SAID + TOOL_CALL
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.name == "dynamo.frontend.processors.card_parsers"
    ]
    assert len(warned) == 1 and "qwen99" in warned[0] and model in warned[0], warned


def test_the_frontends_flags_override_the_card(tiny_tokenizer, caplog):
    model = unique_model()
    card = tiny_card(tiny_tokenizer, model, tool_call_parser="qwen99", reasoning_parser="qwen99")
    n = len(output_ids(card, OUTPUT))
    body = {"model": model, "messages": MESSAGES, "tools": [WEATHER], "max_tokens": n}
    with caplog.at_level(logging.WARNING, logger="dynamo.frontend.processors.card_parsers"):
        status, answer = ask(
            card, {**body, "ignore_eos": True}, registry=card_registry(("qwen25", "deepseek-r1"))
        )
    assert status == 200, answer
    assert_weather_call(answer["choices"][0]["message"]["tool_calls"])
    assert not [r for r in caplog.records if r.name == "dynamo.frontend.processors.card_parsers"]

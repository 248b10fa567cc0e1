"""The chat response path with an output parser, in the default environment: parsers written
for the test stand in for SGLang's and vLLM's (tests/sglang and tests/vllm run those), so what
is checked here is the path itself: the OpenAI shapes whole and streamed, the finish reason,
and a parser that fails on the model's text (a worker's words) costing no 500 and no cut
stream."""

from __future__ import annotations

import asyncio
import logging

import pytest

from dynamo.frontend.parsing.output_parser import ParsedDelta
from dynamo.frontend.processors.chat_processor import build_chat_processor
from dynamo.frontend.routing.model_registry import ModelRegistry
from tests.support.answers import sse_events
from tests.support.frontend_fakes import MODEL, echo_worker, frontend
from tests.support.tiny_model import tiny_card

TEXT = "abcdefgh"
FUNCTION = {"name": "f", "arguments": "{}"}
CALL = {"index": 0, "id": "call_1", "type": "function", "function": FUNCTION}


class HoldsItAll:
    """Holds every piece; at the end says the text was reasoning and called ``f``."""

    def __init__(self) -> None:
        self.text: list[str] = []

    def feed(self, text: str) -> ParsedDelta:
        self.text.append(text)
        return ParsedDelta()

    def finish(self) -> ParsedDelta:
        return ParsedDelta(reasoning_content="".join(self.text), tool_calls=[dict(CALL)])


class Breaks:
    def feed(self, text: str) -> ParsedDelta:
        raise RuntimeError("parser\x1b broke")

    def finish(self) -> ParsedDelta:
        raise AssertionError("never reached once feed failed")


def registry(parser_class, reasoning_field: str | None = None) -> ModelRegistry:
    def build(card):
        processor = build_chat_processor(card)
        if reasoning_field is not None:  # as the vllm processor names it
            processor.reasoning_field = reasoning_field
        processor.output_parser = lambda *args, **context: parser_class()
        processor.parses_tool_calls = True  # as a processor with a tool-call parser
        return processor

    return ModelRegistry(build)


def ask(card, parser_class, stream: bool, *, eos: bool = True, field=None, **extra):
    ids = build_chat_processor(card).tokenizer.encode(TEXT, add_special_tokens=False)
    output = [*ids, *card.eos_token_ids] if eos else ids
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
        "max_tokens": 64 if eos else len(ids),
        **extra,
    }

    async def scenario():
        async with (
            echo_worker(output=output, chunk=2) as (_, endpoint),
            frontend(card, endpoint, registry=registry(parser_class, field)) as client,
        ):
            response = await client.post("/v1/chat/completions", json=body)
            if stream:
                return response.status, await sse_events(response)
            return response.status, await response.json()

    return asyncio.run(scenario())


@pytest.fixture
def card(tiny_tokenizer_dir):
    return tiny_card(tiny_tokenizer_dir, MODEL)


def test_a_whole_answer_carries_reasoning_and_calls_and_finishes_tool_calls(card):
    status, body = ask(card, HoldsItAll, stream=False)
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["message"] == {
        "role": "assistant",
        "content": None,
        "reasoning_content": TEXT,
        "tool_calls": [CALL],
    }
    assert choice["finish_reason"] == "tool_calls"


def test_a_stream_sends_what_was_held_then_the_calls_then_the_finish(card):
    status, events = ask(card, HoldsItAll, stream=True)
    assert status == 200 and events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert deltas[1:3] == [{"reasoning_content": TEXT}, {"tool_calls": [CALL]}]
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_the_hf_processor_names_the_reasoning_as_upstream_dynamo_and_sglang_do(card):
    assert build_chat_processor(card).reasoning_field == "reasoning_content"


@pytest.mark.parametrize("stream", [False, True])
def test_the_reasoning_goes_out_under_the_processors_field_name(card, stream):
    status, answer = ask(card, HoldsItAll, stream, field="reasoning")
    assert status == 200, answer
    if stream:
        deltas = [e["choices"][0]["delta"] for e in answer[:-1] if e["choices"]]
        assert {"reasoning": TEXT} in deltas, deltas
        assert not any("reasoning_content" in d for d in deltas), deltas
    else:
        message = answer["choices"][0]["message"]
        assert message["reasoning"] == TEXT and "reasoning_content" not in message


class CallsTwice(HoldsItAll):
    def finish(self) -> ParsedDelta:
        return ParsedDelta(tool_calls=[dict(CALL), {**CALL, "index": 1, "id": "call_2"}])


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_answers_the_first_call_only(card, stream):
    tools = [{"type": "function", "function": {"name": "f"}}]
    status, answer = ask(card, CallsTwice, stream, tools=tools, parallel_tool_calls=False)
    assert status == 200, answer
    if stream:
        deltas = [e["choices"][0]["delta"] for e in answer[:-1] if e["choices"]]
        calls = [c for d in deltas for c in d.get("tool_calls", ())]
    else:
        calls = answer["choices"][0]["message"]["tool_calls"]
    assert calls == [CALL]


class ThinksFirst:
    """The first four characters are reasoning, the rest content, piece by piece."""

    def __init__(self) -> None:
        self.seen = 0

    def feed(self, text: str) -> ParsedDelta:
        thought = text[: max(0, 4 - self.seen)]
        self.seen += len(text)
        return ParsedDelta(content=text[len(thought) :], reasoning_content=thought)

    def finish(self) -> ParsedDelta:
        return ParsedDelta()


@pytest.mark.parametrize("stream", [False, True])
def test_include_reasoning_false_drops_the_reasoning_and_its_logprobs_as_vllm(card, stream):
    answers = {
        include: ask(card, ThinksFirst, stream, logprobs=True, include_reasoning=include)
        for include in (True, False)
    }
    for include, (status, answer) in answers.items():
        assert status == 200, answer
        if stream:
            choices = [e["choices"][0] for e in answer[:-1] if e["choices"]]
            deltas = [c["delta"] for c in choices[1:] if c["finish_reason"] is None]
            reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
            content = "".join(d.get("content", "") for d in deltas)
            logprobs = [c.get("logprobs") for c in choices if c.get("logprobs")]
            if not include:  # a piece that was only reasoning is no chunk
                assert all(d.get("content") for d in deltas), deltas
        else:
            message = answer["choices"][0]["message"]
            reasoning, content = message.get("reasoning_content", ""), message["content"]
            logprobs = [answer["choices"][0].get("logprobs")] if include else []
            assert ("reasoning_content" in message) is include
            assert answer["choices"][0].get("logprobs") is None or include
        assert content == TEXT[4:] and reasoning == (TEXT[:4] if include else "")
        assert bool(logprobs) is include


@pytest.mark.parametrize("stream", [False, True])
def test_include_reasoning_false_hides_the_generated_ids_not_the_prompts(card, stream):
    status, answer = ask(card, ThinksFirst, stream, return_token_ids=True, include_reasoning=False)
    assert status == 200, answer
    bodies = [e for e in answer if isinstance(e, dict)] if stream else [answer]
    assert "prompt_token_ids" in bodies[0]
    assert not any("token_ids" in c for body in bodies for c in body["choices"])


def test_length_stays_length_with_calls(card):
    status, body = ask(card, HoldsItAll, stream=False, eos=False)
    assert status == 200 and body["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_a_parser_that_fails_leaves_the_answer_unparsed_not_broken(card, stream, caplog):
    with caplog.at_level(logging.WARNING, logger="dynamo.frontend.parsing.parsed_output"):
        status, answer = ask(card, Breaks, stream=stream)
    assert status == 200, answer
    if stream:
        assert answer[-1] == "[DONE]"
        deltas = [e["choices"][0]["delta"] for e in answer[:-1] if e["choices"]]
        assert "".join(d.get("content") or "" for d in deltas) == TEXT
        assert answer[-2]["choices"][0]["finish_reason"] == "stop"
    else:
        assert answer["choices"][0]["message"] == {"role": "assistant", "content": TEXT}
    assert all("\x1b" not in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("tool_choice", ["bogus", 3, ["auto"]])
def test_a_tool_choice_that_is_none_of_openais_is_a_400_naming_it(card, tool_choice):
    async def scenario():
        async with echo_worker() as (_, endpoint), frontend(card, endpoint) as client:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            response = await client.post(
                "/v1/chat/completions", json={**body, "tool_choice": tool_choice}
            )
            return response.status, await response.json()

    status, body = asyncio.run(scenario())
    assert status == 400 and body["error"]["param"] == "tool_choice", body


class ForcingParsers:
    """A processor's factory whose parsers force calls themselves (as the vllm processor's with
    a tool-call parser): its ``adjusted`` names the constraint and skip_special_tokens the
    worker must get; its parser sees the forced request with what vLLM's parsers are given."""

    TAG = '{"type": "structural_tag", "format": {"type": "const_string", "value": "x"}}'

    def __init__(self) -> None:
        self.built: list[tuple[tuple, dict]] = []
        self.forces_tool_calls = True

    def adjusted(self, request, skip_special_tokens):
        from types import SimpleNamespace

        return SimpleNamespace(structural_tag=self.TAG), False

    def __call__(self, *args, **context):
        self.built.append((args, context))
        return HoldsItAll()


def test_a_forced_call_is_forced_and_parsed_as_the_processors_parsers_say(card):
    parsers = ForcingParsers()

    def build(card_):
        processor = build_chat_processor(card_)
        processor.output_parser = parsers
        return processor

    tools = [{"type": "function", "function": {"name": "f"}}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": tools,
            "tool_choice": "required", "chat_template_kwargs": {"enable_thinking": False},
            "max_tokens": 8}  # fmt: skip

    async def scenario():
        async with (
            echo_worker(output=[5, 6, 7], chunk=2) as (engine, endpoint),
            frontend(card, endpoint, registry=ModelRegistry(build)) as client,
        ):
            response = await client.post("/v1/chat/completions", json=body)
            return response.status, await response.json(), engine.bodies

    status, answer, bodies = asyncio.run(scenario())
    assert status == 200, answer
    assert answer["choices"][0]["message"]["tool_calls"] == [CALL]  # the factory's parser
    (sent,) = bodies
    forced = sent["sampling"]["structured_outputs"]  # the factory's, not the tools' schema
    assert forced["structural_tag"] == ForcingParsers.TAG and forced["json_schema"] is None
    ((args, context),) = parsers.built
    assert args[1] == "required" and context["variables"] == {"enable_thinking": False}
    assert context["fields"]["chat_template_kwargs"] == {"enable_thinking": False}
    assert list(context["prompt_ids"]) == sent["token_ids"]  # the prompt's ids, as vLLM's

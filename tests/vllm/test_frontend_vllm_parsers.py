"""``--dyn-chat-processor vllm`` parses a model's output with vLLM's own parsers (hermes
tool calls, qwen3 reasoning: two that work with the tiny model's tokenizer), through the real
response path in front of a request-plane worker that streams a known output
(tests/support/frontend_fakes.py: the tiny model cannot be relied on to write a tool call, so
the output is fixed and only the parsing is under test). Whole and streamed; the parser names
from the frontend's settings or from the worker's model card."""

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
from dynamo.frontend.processors.sglang_processor import SglangSettings
from dynamo.frontend.routing.model_registry import ModelRegistry
from tests.support.answers import sse_events
from tests.support.frontend_fakes import MODEL, echo_worker, frontend
from tests.support.tiny_model import tiny_card

pytestmark = pytest.mark.vllm

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
THINKING = "The user wants the weather. "
SAID = "Let me look."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
OUTPUT = f"<think>{THINKING}</think>{SAID}{CALL}"
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module", autouse=True)
def vllm_imported():
    import_processor_libraries("vllm")


def registry(tool=None, reasoning=None) -> ModelRegistry:
    settings = SglangSettings(tool, reasoning)
    return ModelRegistry(lambda card: build_chat_processor(card, "vllm", settings))


def output_ids(card) -> list[int]:
    processor = build_chat_processor(card.model_copy(update={"tool_call_parser": None}))
    ids = processor.tokenizer.encode(OUTPUT, add_special_tokens=False)
    assert processor.tokenizer.decode(ids) == OUTPUT
    return ids


def ask(card, body: dict, models: ModelRegistry):
    """(status, answer): :func:`ask_recorded` without the worker's bodies."""
    status, answer, _ = ask_recorded(card, body, models)
    return status, answer


def body(model: str = MODEL, *, stream: bool = False, tools=(WEATHER,)) -> dict:
    request = {"model": model, "messages": MESSAGES, "stream": stream, "max_tokens": 200}
    if tools:
        request["tools"] = list(tools)
    return request


def assert_weather_call(calls) -> None:
    assert len(calls) == 1, calls
    assert calls[0]["type"] == "function" and calls[0]["id"]
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}


def test_a_whole_answer_is_split_by_vllms_parsers(tiny_tokenizer_dir):
    card = tiny_card(tiny_tokenizer_dir, MODEL)
    status, answer = ask(card, body(), registry("hermes", "qwen3"))
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["message"]["reasoning"] == THINKING
    assert choice["message"]["content"] == SAID
    assert_weather_call(choice["message"]["tool_calls"])
    assert choice["finish_reason"] == "tool_calls"


def test_a_stream_carries_the_parsed_answer_before_its_finish(tiny_tokenizer_dir):
    card = tiny_card(tiny_tokenizer_dir, MODEL)
    status, events = ask(card, body(stream=True), registry("hermes", "qwen3"))
    assert status == 200 and events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    assert "".join(d.get("reasoning", "") for d in deltas) == THINKING
    assert "".join(d.get("content") or "" for d in deltas) == SAID
    assert_weather_call(assembled([c for d in deltas for c in d.get("tool_calls", [])]))
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
def test_include_reasoning_false_drops_what_vllms_reasoning_parser_found(
    tiny_tokenizer_dir, stream
):
    card = tiny_card(tiny_tokenizer_dir, MODEL)
    request = {**body(stream=stream), "include_reasoning": False}
    status, answer = ask(card, request, registry("hermes", "qwen3"))
    assert status == 200, answer
    if stream:
        deltas = [e["choices"][0]["delta"] for e in answer[:-1] if e["choices"]]
        assert not any("reasoning" in d for d in deltas), deltas
        assert "".join(d.get("content") or "" for d in deltas) == SAID
        calls = assembled([c for d in deltas for c in d.get("tool_calls", [])])
    else:
        message = answer["choices"][0]["message"]
        assert "reasoning" not in message and message["content"] == SAID
        calls = message["tool_calls"]
    assert_weather_call(calls)


def assembled(pieces: list[dict]) -> list[dict]:
    """Streamed tool-call deltas joined by index, as a client joins them: the first carries the
    id, type and name, the next ones pieces of the arguments."""
    calls: dict[int, dict] = {}
    for piece in pieces:
        into = calls.setdefault(piece["index"], {"function": {"name": "", "arguments": ""}})
        into.update({k: piece[k] for k in ("id", "type") if k in piece})
        for key in ("name", "arguments"):
            into["function"][key] += piece["function"].get(key) or ""
    return list(calls.values())


def test_the_cards_names_apply_and_a_name_vllm_lacks_is_served_without(tiny_tokenizer_dir, caplog):
    card = tiny_card(tiny_tokenizer_dir, MODEL, tool_call_parser="hermes", reasoning_parser="qwen3")
    status, answer = ask(card, body(), registry())
    assert status == 200, answer
    assert_weather_call(answer["choices"][0]["message"]["tool_calls"])

    model = f"tiny-{uuid.uuid4().hex[:8]}"  # the WARNING is budgeted per model and name
    card = tiny_card(tiny_tokenizer_dir, model, tool_call_parser="qwen99")
    with caplog.at_level(logging.WARNING, logger="dynamo.frontend.processors.card_parsers"):
        status, answer = ask(card, body(model), registry())
    assert any("qwen99" in r.getMessage() for r in caplog.records)
    # Served without a tool-call parser: tools with tool_choice auto (the default) would be a
    # quietly unparsed answer, so they are refused by name; with "none" the text comes back whole.
    assert status == 400 and answer["error"]["param"] == "tool_choice", answer
    status, answer = ask(card, {**body(model), "tool_choice": "none"}, registry())
    assert status == 200, answer
    message = answer["choices"][0]["message"]
    assert "tool_calls" not in message and message["content"] == OUTPUT


@pytest.mark.integration
def test_the_workers_names_reach_a_real_frontend_through_the_card(tmp_path):
    """The real processes: a mock worker started with upstream's --dyn-tool-call-parser /
    --dyn-reasoning-parser, a frontend with --dyn-chat-processor vllm and no parser flags. The
    mock engine answers with its prompt, so a user message that carries a hermes tool call
    comes back as the completion (the tiny model never writes one itself), and vLLM's parser,
    named by the worker's card, turns it into tool_calls."""
    from tests.support.pair import request
    from tests.support.processes import listening_url, start_frontend, start_worker

    discovery = tmp_path / "discovery"
    worker = start_worker(
        "worker", tmp_path, discovery, MODEL,
        "--dyn-tool-call-parser", "hermes", "--dyn-reasoning-parser", "qwen3",
    )  # fmt: skip
    frontend_process = start_frontend(
        "frontend", tmp_path, discovery, "--dyn-chat-processor", "vllm"
    )
    try:
        url = listening_url(frontend_process, deadline_s=240.0)
        frontend_process.wait_for_log(rf"Model added: model={MODEL} ", deadline_s=120.0)
        messages = [{"role": "user", "content": SAID + CALL}]
        chat = {"model": MODEL, "messages": messages, "tools": [WEATHER], "max_tokens": 256}
        status, answer = request("POST", url + "/v1/chat/completions", chat)
        assert status == 200, answer
        message = answer["choices"][0]["message"]
        assert_weather_call(message["tool_calls"])
        assert "<tool_call>" not in (message["content"] or "")
    finally:
        frontend_process.stop()
        worker.stop()


def ask_recorded(card, request: dict, models: ModelRegistry):
    """(status, answer, the request-plane bodies the worker got)."""
    ids = output_ids(card)

    async def scenario():
        async with (
            echo_worker(output=[*ids, *card.eos_token_ids], chunk=3) as (engine, endpoint),
            frontend(card, endpoint, registry=models) as client,
        ):
            response = await client.post("/v1/chat/completions", json=request)
            if request.get("stream"):
                return response.status, await sse_events(response), engine.bodies
            return response.status, await response.json(), engine.bodies

    return asyncio.run(scenario())


NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_a_forced_call_goes_through_the_reasoning_parser_and_streams_its_arguments(
    tiny_tokenizer_dir, choice, stream
):
    """vLLM's server parses a forced call with its parsers, the reasoning first (hermes: the
    call as written in its own format), streams the arguments as they come, and forces it
    with hermes' ``<tool_call>`` structural tag (the arguments free JSON): what the worker
    gets, instead of the JSON schema of the tools. finish_reason: tool_calls for required,
    stop for a named function."""
    card = tiny_card(tiny_tokenizer_dir, MODEL)
    request = {**body(stream=stream), "tool_choice": choice}
    status, answer, bodies = ask_recorded(card, request, registry("hermes", "qwen3"))
    assert status == 200, answer
    if stream:
        deltas = [e["choices"][0]["delta"] for e in answer[:-1] if e["choices"]]
        reasoning = "".join(d.get("reasoning", "") for d in deltas)
        pieces = [c for d in deltas for c in d.get("tool_calls", [])]
        assert len([p for p in pieces if p["function"].get("arguments")]) > 1, pieces
        calls = assembled(pieces)
        finish = answer[-2]["choices"][0]["finish_reason"]
    else:
        message = answer["choices"][0]["message"]
        reasoning, calls = message.get("reasoning", ""), message["tool_calls"]
        finish = answer["choices"][0]["finish_reason"]
    assert reasoning == THINKING
    assert_weather_call(calls)
    assert finish == ("tool_calls" if choice == "required" else "stop")
    (sent,) = bodies
    tag = json.loads(sent["sampling"]["structured_outputs"]["structural_tag"])
    assert "<tool_call>" in json.dumps(tag)
    assert sent["sampling"]["structured_outputs"].get("json_schema") is None


@pytest.mark.parametrize(
    "extra, ended",
    [({}, False), ({"include_reasoning": False}, True)],
    ids=["thinking", "include-reasoning-false"],
)
def test_the_worker_is_told_whether_the_grammar_waits_for_the_reasoning(
    tiny_tokenizer_dir, extra, ended
):
    """As vLLM's server tells its engine (``resolve_reasoning_ended``): a prompt that leaves
    the model thinking has the forced call's grammar start once the reasoning ends (False);
    with ``include_reasoning`` false it starts at the first token (True). Without a reasoning
    parser the frontend parses none, and the grammar starts at once too."""
    card = tiny_card(tiny_tokenizer_dir, MODEL)
    request = {**body(), "tool_choice": "required", **extra}
    status, answer, bodies = ask_recorded(card, request, registry("hermes", "qwen3"))
    assert status == 200, answer
    (sent,) = bodies
    assert sent["sampling"]["reasoning_ended"] is ended
    status, answer, bodies = ask_recorded(card, request, registry("hermes", None))
    assert status == 200, answer
    (sent,) = bodies
    assert sent["sampling"]["reasoning_ended"] is True


def test_a_forced_call_without_a_tool_call_parser_keeps_the_tools_json_schema(
    tiny_tokenizer_dir,
):
    """With a reasoning parser only, a forced call is the tools' JSON schema, parsed by the
    frontend (nothing of vLLM's parses calls)."""
    card = tiny_card(tiny_tokenizer_dir, MODEL)
    request = {**body(), "tool_choice": "required"}
    status, answer, bodies = ask_recorded(card, request, registry(None, "qwen3"))
    assert status == 200, answer
    (sent,) = bodies
    assert sent["sampling"]["structured_outputs"]["json_schema"]


def test_auto_with_one_call_only_is_constrained_as_vllm_constrains_it(tiny_tokenizer_dir):
    """tool_choice auto with parallel_tool_calls false: vLLM's hermes parser lets the model
    write at most one call (a structural tag triggered by ``<tool_call>``), which the worker
    gets; the call is parsed as with auto. Without the flag, or with a constraint of the
    client's own (which vLLM keeps), nothing is added."""
    card = tiny_card(tiny_tokenizer_dir, MODEL)
    models = registry("hermes", "qwen3")
    one = {**body(), "parallel_tool_calls": False}
    status, answer, bodies = ask_recorded(card, one, models)
    assert status == 200, answer
    assert_weather_call(answer["choices"][0]["message"]["tool_calls"])
    (sent,) = bodies
    tag = json.loads(sent["sampling"]["structured_outputs"]["structural_tag"])
    assert tag["format"]["type"] == "triggered_tags" and tag["format"]["triggers"] == [
        "<tool_call>"
    ]
    for request in (body(), {**one, "structured_outputs": {"regex": "[a-z<>/]{1,200}"}}):
        status, answer, bodies = ask_recorded(card, request, models)
        assert status == 200, answer
        (sent,) = bodies
        constraint = sent["sampling"].get("structured_outputs") or {}
        assert constraint.get("structural_tag") is None, constraint

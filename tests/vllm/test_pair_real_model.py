"""The tiny model served by the real vLLM worker through the real frontend, end to end.

The worker publishes the tiny model's card; the frontend renders and tokenizes with the model's
own files and sends the request plane's v2 body.
"""

from __future__ import annotations

import contextlib
import json
import re
import urllib.error
import urllib.request
from collections.abc import Sequence

import pytest

from dynamo.frontend.processors.chat_processor import build_chat_processor
from dynamo.runtime.model_card import ModelCard
from tests.support.processes import LISTENING_LINE, start_frontend, start_worker

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

SERVED = "tiny-served"
START_DEADLINE_S = 360.0
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"},
        method="POST",
    )  # fmt: skip
    with _opener.open(request, timeout=120) as response:
        return json.load(response)


def tiny_processor(model: str):
    """The frontend's processor of the tiny model (its tokenizer, its template)."""
    card = ModelCard(served_model_name=SERVED, model_path=model, tokenizer_path=model,
                     context_length=256, eos_token_ids=(1,))  # fmt: skip
    return build_chat_processor(card)


@contextlib.contextmanager
def serving(model: str, directory, *worker_args: str, frontend_args: Sequence[str] = ()):
    """A real-vLLM worker on ``model`` (``worker_args`` after the starter's) and a frontend (with
    ``frontend_args``); yields the frontend's URL once it serves the model."""
    discovery = directory / "discovery"
    worker = start_worker("worker", directory, discovery, SERVED, *worker_args, vllm_model=model)
    frontend = start_frontend("frontend", directory, discovery, *frontend_args)
    try:
        url = frontend.wait_for_log(LISTENING_LINE, deadline_s=START_DEADLINE_S).group(1)
        frontend.wait_for_log(
            r"Model added: model=" + re.escape(SERVED), deadline_s=START_DEADLINE_S
        )
        yield url
    finally:
        frontend.stop()
        worker.stop(deadline_s=60)


@pytest.fixture(scope="module")
def pair(tiny_model, tmp_path_factory):
    with serving(tiny_model, tmp_path_factory.mktemp("real-pair")) as url:
        yield url, tiny_model


def test_the_served_name_is_the_one_in_v1_models(pair):
    url, _ = pair
    with _opener.open(url + "/v1/models", timeout=30) as response:
        assert [m["id"] for m in json.load(response)["data"]] == [SERVED]


def test_vllm_gets_the_tiny_tokenizers_ids_of_the_rendered_template(pair):
    url, model = pair
    messages = [{"role": "user", "content": "Hello 🧊, how are you?"}]
    processor = tiny_processor(model)
    ids = processor.encode_chat(processor.render(messages))
    greedy = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}
    chat = post(url + "/v1/chat/completions", {"model": SERVED, "messages": messages, **greedy})
    # The same ids sent as a prompt give the same greedy completion: vLLM got exactly those.
    completion = post(url + "/v1/completions", {"model": SERVED, "prompt": ids, **greedy})
    assert chat["usage"]["prompt_tokens"] == len(ids)
    assert chat["choices"][0]["message"]["content"] == completion["choices"][0]["text"]


def test_seed_and_temperature_give_the_same_output_twice_and_a_stop_string_ends_it(pair):
    url, _ = pair
    body = {"model": SERVED, "prompt": "The quick brown fox", "max_tokens": 24,
            "temperature": 1.0, "seed": 1234, "ignore_eos": True}  # fmt: skip
    first, second = post(url + "/v1/completions", body), post(url + "/v1/completions", body)
    text = first["choices"][0]["text"]
    assert text == second["choices"][0]["text"] and len(text) > 4
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    stopped = post(url + "/v1/completions", {**body, "stop": [stop]})
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["choices"][0]["text"] == text[: text.index(stop)]


def test_client_stop_token_ids_end_vllms_completion_without_the_tokens_text(pair):
    url, model = pair
    greedy = {"model": SERVED, "prompt": "The quick brown fox", "max_tokens": 16,
              "temperature": 0, "ignore_eos": True}  # fmt: skip
    text = post(url + "/v1/completions", greedy)["choices"][0]["text"]
    ids = tiny_processor(model).tokenizer.encode(text, add_special_tokens=False)
    stopped = post(url + "/v1/completions", {**greedy, "stop_token_ids": [ids[len(ids) // 2]]})
    choice = stopped["choices"][0]
    assert choice["finish_reason"] == "stop", (text, choice)
    assert text.startswith(choice["text"]) and len(choice["text"]) < len(text)
    assert stopped["usage"]["completion_tokens"] < 16


def test_logit_bias_reaches_vllms_sampler(pair):
    url, model = pair
    tokenizer = tiny_processor(model).tokenizer
    (favoured, *_) = tokenizer.encode(" fox", add_special_tokens=False)
    body = {"model": SERVED, "prompt": "The quick brown", "max_tokens": 8, "temperature": 0,
            "ignore_eos": True, "logit_bias": {str(favoured): 100}}  # fmt: skip
    completion = post(url + "/v1/completions", body)
    assert completion["choices"][0]["text"] == tokenizer.decode([favoured] * 8)


def test_allowed_token_ids_and_bad_words_reach_vllms_sampler(pair):
    url, model = pair
    tokenizer = tiny_processor(model).tokenizer
    (only, *_) = tokenizer.encode(" ice", add_special_tokens=False)
    body = {"model": SERVED, "prompt": "The quick brown", "max_tokens": 6, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    allowed = post(url + "/v1/completions", {**body, "allowed_token_ids": [only]})
    assert allowed["choices"][0]["text"] == tokenizer.decode([only] * 6)
    free = post(url + "/v1/completions", body)["choices"][0]["text"]
    first = tokenizer.decode(tokenizer.encode(free, add_special_tokens=False)[:1])
    banned = post(url + "/v1/completions", {**body, "bad_words": [first.strip() or first]})
    assert not banned["choices"][0]["text"].startswith(first), (free, banned)


# Structured outputs on vLLM's xgrammar backend. The tiny model is random: greedy decoding may
# spend its budget on the whitespace a JSON grammar allows, so a few seeds are tried and every
# answer that ended (stop) must be what was forced.
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}  # fmt: skip
SEEDS = (1, 2, 3, 4, 5)


def finished_answers(url: str, body: dict) -> list[dict]:
    answers = []
    for seed in SEEDS:
        answer = post(url + "/v1/chat/completions", {"model": SERVED, "max_tokens": 200,
                      "temperature": 1.0, "seed": seed, **body})  # fmt: skip
        if answer["choices"][0]["finish_reason"] != "length":
            answers.append(answer["choices"][0])
    assert answers, "no seed finished within max_tokens"
    return answers


MESSAGES = [{"role": "user", "content": "Is the sea blue?"}]


def test_a_json_schema_answer_parses_and_validates_against_the_schema(pair):
    import jsonschema

    url, _ = pair
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA,
                       "strict": True}}  # fmt: skip
    for choice in finished_answers(url, {"messages": MESSAGES, "response_format": response_format}):
        jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)


def test_a_json_object_answer_is_a_json_object(pair):
    url, _ = pair
    body = {"messages": MESSAGES, "response_format": {"type": "json_object"}}
    for choice in finished_answers(url, body):
        assert isinstance(json.loads(choice["message"]["content"]), dict)


def test_structured_outputs_regex_shapes_a_completion(pair):
    url, _ = pair
    body = {"model": SERVED, "prompt": "The number is", "max_tokens": 8, "temperature": 0,
            "structured_outputs": {"regex": "[0-9]{3}"}}  # fmt: skip
    completion = post(url + "/v1/completions", body)
    assert re.fullmatch("[0-9]{3}", completion["choices"][0]["text"]), completion


TOOLS = [{"type": "function", "function": {"name": "answer", "parameters": SCHEMA}}]


def test_a_named_tool_call_parses_into_tool_calls_with_arguments_valid_for_the_tool(pair):
    import jsonschema

    url, _ = pair
    body = {"messages": MESSAGES, "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "answer"}}}  # fmt: skip
    for choice in finished_answers(url, body):
        assert choice["finish_reason"] == "stop"  # OpenAI's and vLLM's rule for a named call
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "answer"
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMA)


def test_tool_choice_required_with_one_call_parses_into_tool_calls(pair):
    import jsonschema

    url, _ = pair
    body = {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "required",
            "parallel_tool_calls": False}  # fmt: skip
    for choice in finished_answers(url, body):
        assert choice["finish_reason"] == "tool_calls"
        (call,) = choice["message"]["tool_calls"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMA)


def test_an_invalid_schema_is_a_400_naming_response_format(pair):
    url, _ = pair
    bad = {"name": "bad", "schema": {"type": "no-such-type"}}
    response_format = {"type": "json_schema", "json_schema": bad}
    body = {"model": SERVED, "messages": MESSAGES, "max_tokens": 8,
            "response_format": response_format}  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as raised:
        post(url + "/v1/chat/completions", body)
    assert raised.value.code == 400
    error = json.load(raised.value)["error"]
    assert error["param"] == "response_format" and "no-such-type" not in error["message"]

"""A non-streamed response is built whole in the frontend's memory: with logprobs, each token
holds k + 1 entries of token text, logprob and bytes (about 450 bytes each while built), and n
choices hold n times as many. Asked for at the context's length (a client's ordinary fields:
``top_logprobs`` 20, ``n`` 16, no ``max_tokens``), that grows with the model's context: gigabytes
for one request. So a response that is not streamed holds at most
``prompt_budget.MAX_WHOLE_LOGPROBS`` entries, refused beforehand naming the logprobs field; a
stream sends them as they come and is not bounded so (docs/security.md, "Clients")."""

from __future__ import annotations

import asyncio

import pytest

from dynamo.frontend.openai import protocol as oai
from dynamo.frontend.openai.prompt_budget import MAX_WHOLE_LOGPROBS, completion_budget
from tests.support.answers import assert_openai_error
from tests.support.frontend_fakes import MODEL, echo_worker, frontend
from tests.support.tiny_model import tiny_card

CONTEXT = 1 << 17  # a long-context model's card (the echo worker samples nothing)
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": MODEL, "prompt": "hi"}


@pytest.fixture
def card(tiny_tokenizer_dir):
    return tiny_card(tiny_tokenizer_dir, MODEL, context_length=CONTEXT)


def budget(card, body: dict) -> int:
    parse = oai.parse_chat_request if "messages" in body else oai.parse_completion_request
    return completion_budget(parse(body), card, 8, "prompt")


@pytest.mark.parametrize(
    "body, param",
    [
        ({**CHAT, "logprobs": True, "top_logprobs": 20}, "top_logprobs"),  # max_tokens: the rest
        ({**CHAT, "logprobs": True, "top_logprobs": 20, "n": 16, "max_tokens": 3200},
         "top_logprobs"),
        ({**COMPLETION, "logprobs": 20, "max_tokens": 50000}, "logprobs"),
        ({**COMPLETION, "logprobs": 0, "max_tokens": 70000, "n": 16}, "logprobs"),
    ],
)  # fmt: skip
def test_a_whole_response_with_more_logprobs_than_the_bound_is_a_400_naming_the_field(
    card, body, param
):
    with pytest.raises(oai.ApiError) as raised:
        budget(card, body)
    assert raised.value.status == 400 and raised.value.param == param
    assert str(MAX_WHOLE_LOGPROBS) in raised.value.message


@pytest.mark.parametrize(
    "body",
    [
        {**CHAT, "logprobs": True, "top_logprobs": 20, "n": 16, "max_tokens": 3000},
        {**CHAT, "logprobs": True, "top_logprobs": 20, "stream": True},  # sent as it comes
        {**CHAT, "n": 16},  # no logprobs: the text alone
        {**COMPLETION, "logprobs": 20, "max_tokens": 40000},
    ],
)
def test_what_fits_the_bound_or_is_streamed_is_served(card, body):
    assert budget(card, body) > 0


def test_the_echoed_prompts_logprobs_count_too(card):
    body = {**COMPLETION, "logprobs": 20, "echo": True, "max_tokens": 49900}
    parse = oai.parse_completion_request
    assert completion_budget(parse(body), card, 10, "prompt") == 49900
    with pytest.raises(oai.ApiError):
        completion_budget(parse(body), card, 30000, "prompt")


def test_a_streams_echoed_prompt_logprobs_count_they_come_on_one_line(card):
    """Streamed, the completion's logprobs are sent as they come, but the prompt's arrive on
    the first line of each choice's stream, read whole."""
    body = {**COMPLETION, "logprobs": 20, "echo": True, "stream": True, "max_tokens": 8}
    parse = oai.parse_completion_request
    assert completion_budget(parse(body), card, 40000, "prompt") == 8
    with pytest.raises(oai.ApiError) as raised:
        completion_budget(parse({**body, "n": 2}), card, 40000, "prompt")
    assert raised.value.param == "logprobs"


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_prompt_logprobs_alone_count_too(card, endpoint):
    """``prompt_logprobs`` without ``logprobs``: the prompt's entries are held all the same."""
    base = CHAT if endpoint == "chat" else COMPLETION
    parse = oai.parse_chat_request if endpoint == "chat" else oai.parse_completion_request
    body = {**base, "prompt_logprobs": 20, "max_tokens": 8}
    assert completion_budget(parse(body), card, 40000, "prompt") == 8
    with pytest.raises(oai.ApiError) as raised:
        completion_budget(parse({**body, "n": 2}), card, 40000, "prompt")
    assert raised.value.status == 400 and raised.value.param == "prompt_logprobs"


def test_the_frontend_answers_the_400_before_asking_a_worker(card):
    async def scenario():
        async with echo_worker() as (engine, endpoint), frontend(card, endpoint) as client:
            body = {**CHAT, "logprobs": True, "top_logprobs": 20, "n": 16}
            response = await client.post("/v1/chat/completions", json=body)
            return response.status, await response.json(), engine.requests_started

    status, answer, started = asyncio.run(scenario())
    assert_openai_error(answer, status, 400, param="top_logprobs")
    assert started == 0

"""The tiny model served by the real vLLM worker through the real frontend, end to end.

The worker publishes the tiny model's card; the frontend renders and tokenizes with the model's
own files and sends the request plane's v2 body.
"""

from __future__ import annotations

import contextlib
import json
import re
import urllib.request

import pytest

from dynamo.frontend.chat_processor import build_chat_processor
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
def serving(tiny_model: str, directory, *worker_args: str):
    """A real-vLLM worker (``worker_args`` after the starter's) and a frontend; yields the
    frontend's URL once it serves the model."""
    discovery = directory / "discovery"
    worker = start_worker(
        "worker", directory, discovery, SERVED, *worker_args, vllm_model=tiny_model
    )
    frontend = start_frontend("frontend", directory, discovery)
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

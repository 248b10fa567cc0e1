"""Logprobs from the real vLLM engine through the real frontend (the tiny model, greedy): the
chat and completions shapes, whole and streamed, the count of alternatives, and vLLM's meaning
(under greedy decoding the sampled token is the most likely one: its logprob is its first
alternative's)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.support.answers import sse_payload
from tests.vllm.test_pair_real_model import (  # noqa: F401 - pair: the fixture
    SERVED,
    _opener,
    pair,
    post,
    serving,
    tiny_processor,
)

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

MESSAGES = [{"role": "user", "content": "Tell me about snow and ice."}]
GREEDY = {"model": SERVED, "max_tokens": 10, "temperature": 0, "ignore_eos": True}


def stream(url: str, body: dict) -> list[dict]:
    request = urllib.request.Request(
        url, data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"}, method="POST",
    )  # fmt: skip
    events = []
    with _opener.open(request, timeout=120) as response:
        for line in response:
            payload = sse_payload(line)
            if isinstance(payload, dict) and payload.get("choices"):
                events.append(payload["choices"][0])
    return events


def whole(text: str) -> str:
    """The text as its tokens' strings make it up: the random tiny model emits bytes of
    characters it never completes, which the text shows as U+FFFD and vLLM's token strings
    as "" (tests/vllm/test_token_strings_vllm.py)."""
    return text.replace("\ufffd", "")


def test_chat_logprobs_from_vllm(pair):  # noqa: F811 - the imported fixture
    url, _ = pair
    body = {**GREEDY, "messages": MESSAGES, "logprobs": True, "top_logprobs": 3}
    answer = post(url + "/v1/chat/completions", body)
    choice = answer["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == answer["usage"]["completion_tokens"] == 10
    assert "".join(entry["token"] for entry in content) == whole(choice["message"]["content"])
    for entry in content:
        assert -9999.0 <= entry["logprob"] <= 0.0
        assert entry["bytes"] == list(entry["token"].encode("utf-8", errors="replace"))
        assert len(entry["top_logprobs"]) == 3
        best = entry["top_logprobs"][0]  # greedy: the sampled token is the most likely
        assert (best["token"], best["logprob"]) == (entry["token"], entry["logprob"])
        ranked = [top["logprob"] for top in entry["top_logprobs"]]
        assert ranked == sorted(ranked, reverse=True)
    streamed = [
        e for chunk in stream(url + "/v1/chat/completions", body)
        if chunk.get("logprobs") for e in chunk["logprobs"]["content"]
    ]  # fmt: skip
    assert [e["token"] for e in streamed] == [e["token"] for e in content]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in content])


def test_completion_logprobs_from_vllm(pair):  # noqa: F811 - the imported fixture
    url, _ = pair
    body = {**GREEDY, "prompt": "The quick brown fox", "logprobs": 2}
    answer = post(url + "/v1/completions", body)
    choice = answer["choices"][0]
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == 10 and "".join(logprobs["tokens"]) == whole(choice["text"])
    for token, logprob, top in zip(
        logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        # logprobs + 1 entries (fewer only when two ids share a text), the sampled one among
        # them with its own logprob, the best of them (greedy).
        assert 1 <= len(top) <= 3 and top[token] == logprob == max(top.values())
    assert logprobs["text_offset"][0] == 0
    streamed = [c["logprobs"] for c in stream(url + "/v1/completions", body) if c["logprobs"]]
    assert [t for lp in streamed for t in lp["tokens"]] == logprobs["tokens"]
    assert [o for lp in streamed for o in lp["text_offset"]] == logprobs["text_offset"]


def test_echo_with_logprobs_from_vllm_puts_the_prompts_first(pair):  # noqa: F811
    url, model = pair
    prompt = "The quick brown fox"
    ids = tiny_processor(model).encode_completion(prompt)
    body = {**GREEDY, "prompt": prompt, "logprobs": 1, "echo": True}
    choice = post(url + "/v1/completions", body)["choices"][0]
    logprobs = choice["logprobs"]
    assert choice["text"].startswith(prompt)
    assert len(logprobs["tokens"]) == len(ids) + 10
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    for token, logprob, top in zip(
        logprobs["tokens"][1:], logprobs["token_logprobs"][1:], logprobs["top_logprobs"][1:],
        strict=True,
    ):  # fmt: skip
        assert top[token] == logprob and len(top) <= 2
    streamed = [c["logprobs"] for c in stream(url + "/v1/completions", body) if c["logprobs"]]
    assert [t for lp in streamed for t in lp["tokens"]] == logprobs["tokens"]
    assert [t for lp in streamed for t in lp["token_logprobs"]] == pytest.approx(
        logprobs["token_logprobs"]
    )


def test_return_tokens_as_token_ids_from_vllm(pair):  # noqa: F811 - the imported fixture
    url, _ = pair
    body = {**GREEDY, "prompt": "The quick brown fox", "logprobs": 0,
            "return_tokens_as_token_ids": True}  # fmt: skip
    tokens = post(url + "/v1/completions", body)["choices"][0]["logprobs"]["tokens"]
    assert len(tokens) == 10 and all(t.startswith("token_id:") for t in tokens)


def test_more_alternatives_than_vllms_max_logprobs_is_a_400(pair):  # noqa: F811
    url, _ = pair
    with pytest.raises(urllib.error.HTTPError) as raised:
        post(url + "/v1/completions", {**GREEDY, "prompt": "Hi", "logprobs": 21})
    error = json.load(raised.value)["error"]
    assert raised.value.code == 400 and error["param"] == "logprobs"
    assert "greater than max allowed: 20" in error["message"]


def test_n_choices_from_vllm_differ_and_are_vllms_children(pair):  # noqa: F811
    url, _ = pair
    body = {"model": SERVED, "prompt": "The quick brown fox", "max_tokens": 12,
            "temperature": 1.0, "seed": 7, "ignore_eos": True}  # fmt: skip
    answer = post(url + "/v1/completions", {**body, "n": 3})
    texts = [c["text"] for c in answer["choices"]]
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    assert len(set(texts)) > 1 and answer["usage"]["completion_tokens"] == 36
    assert [c["text"] for c in post(url + "/v1/completions", {**body, "n": 3})["choices"]] == texts
    # Choice i samples as vLLM's child i does: with the seed seed + i.
    for index, text in enumerate(texts):
        alone = post(url + "/v1/completions", {**body, "seed": 7 + index})
        assert alone["choices"][0]["text"] == text


def test_n_streamed_choices_with_logprobs_from_vllm(pair):  # noqa: F811
    url, _ = pair
    # Seeded (n > 1 under greedy sampling is refused, as vLLM refuses it): the same each time.
    body = {**GREEDY, "temperature": 1.0, "seed": 5, "messages": MESSAGES, "n": 2,
            "logprobs": True, "top_logprobs": 1}  # fmt: skip
    whole = post(url + "/v1/chat/completions", body)
    chunks = stream(url + "/v1/chat/completions", body)
    for index in (0, 1):
        mine = [c for c in chunks if c["index"] == index]
        text = "".join(c["delta"].get("content") or "" for c in mine)
        assert text == whole["choices"][index]["message"]["content"]
        tokens = [e["token"] for c in mine if c.get("logprobs") for e in c["logprobs"]["content"]]
        assert tokens == [e["token"] for e in whole["choices"][index]["logprobs"]["content"]]
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == ["length"]
        assert mine[-1]["finish_reason"] == "length"  # on the last token's chunk, as vLLM


def test_a_worker_whose_vllm_allows_fewer_logprobs_refuses_more_naming_the_field(
    tiny_model, tmp_path
):
    with serving(tiny_model, tmp_path, "--max-logprobs", "2") as url:
        body = {**GREEDY, "prompt": "Hi", "logprobs": 3}
        with pytest.raises(urllib.error.HTTPError) as raised:
            post(url + "/v1/completions", body)
        error = json.load(raised.value)["error"]
        assert raised.value.code == 400 and error["param"] == "logprobs", error
        allowed = post(url + "/v1/completions", {**body, "logprobs": 2})
        assert len(allowed["choices"][0]["logprobs"]["tokens"]) == 10


def _check_prompt_logprobs(positions: list, ids: list[int], k: int) -> None:
    """vLLM's prompt_logprobs: one per prompt id, the first null, then ``{id: {logprob, rank,
    decoded_token}}`` with the prompt's own id first and the k best ranked 1..k."""
    assert len(positions) == len(ids) and positions[0] is None
    for token_id, position in zip(ids[1:], positions[1:], strict=True):
        entries = list(position.items())
        assert entries[0][0] == str(token_id) and entries[0][1]["rank"] >= 1
        best = sorted(entries, key=lambda e: e[1]["rank"])
        ranks = [e[1]["rank"] for e in best if e[0] != str(token_id) or e[1]["rank"] <= k]
        assert sorted(set(ranks)) == list(range(1, k + 1))  # the k best, each once
        logprobs = [e[1]["logprob"] for e in best]
        assert logprobs == sorted(logprobs, reverse=True)  # rank order is logprob order
        assert all(-9999.0 <= e[1]["logprob"] <= 0.0 for e in entries)
        assert all(isinstance(e[1]["decoded_token"], str) for e in entries)


def test_prompt_logprobs_from_vllm_in_both_endpoints(pair):  # noqa: F811 - the fixture
    url, model = pair
    prompt = "The quick brown fox"
    ids = tiny_processor(model).encode_completion(prompt)
    body = {**GREEDY, "temperature": 1.0, "seed": 5, "prompt": prompt, "prompt_logprobs": 2,
            "n": 2}  # fmt: skip
    answer = post(url + "/v1/completions", body)
    assert "prompt_logprobs" not in answer
    first, second = (c["prompt_logprobs"] for c in answer["choices"])
    _check_prompt_logprobs(first, ids, 2)
    assert second == first  # vLLM: each choice's is the request's
    # The prompt's own logprobs are those echo with logprobs reports for the prompt's tokens.
    echo = post(url + "/v1/completions", {**GREEDY, "prompt": prompt, "logprobs": 0, "echo": True})
    echoed = echo["choices"][0]["logprobs"]["token_logprobs"][1 : len(ids)]
    own = [position[str(i)]["logprob"] for i, position in zip(ids[1:], first[1:], strict=True)]
    assert own == pytest.approx(echoed)
    chat = post(
        url + "/v1/chat/completions", {**GREEDY, "messages": MESSAGES, "prompt_logprobs": 0}
    )
    positions = chat["prompt_logprobs"]
    assert len(positions) == chat["usage"]["prompt_tokens"] and positions[0] is None
    assert all(len(p) == 1 and next(iter(p.values()))["rank"] >= 1 for p in positions[1:])
    assert all("prompt_logprobs" not in c for c in chat["choices"])


def test_prompt_logprobs_bounds_from_vllm_are_400s(pair):  # noqa: F811 - the fixture
    url, _ = pair
    for extra, words in (
        ({"prompt_logprobs": 21}, "greater than max allowed: 20"),
        ({"prompt_logprobs": 1, "stream": True}, "not available when `stream=True`"),
    ):
        with pytest.raises(urllib.error.HTTPError) as raised:
            post(url + "/v1/completions", {**GREEDY, "prompt": "Hi", **extra})
        error = json.load(raised.value)["error"]
        assert raised.value.code == 400 and error["param"] == "prompt_logprobs", error
        assert words in error["message"]

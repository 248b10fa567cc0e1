"""Logprobs end to end in the frontend: the request fields (vLLM's rules and limit), what the
worker is asked for, the OpenAI shapes built from the request plane's items (chat and
completions, whole and streamed), and what a hostile worker's logprobs get (a 502, never a
number passed on unchecked). The worker side is the echo engine of tests/support/frontend_fakes.py,
whose logprobs are fixed (the token at -0.25, the ids after it at -1, -2, ...); the real
engine's are checked in tests/vllm/test_logprobs_vllm.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from dynamo.frontend.openai.logprobs import prompt_logprobs
from dynamo.frontend.processors.chat_processor import build_chat_processor
from dynamo.runtime.request_plane import PromptLogprobs, WorkerProtocolError, parse_item
from dynamo.runtime.sampling import SamplingOptions
from tests.support.answers import assert_openai_error, sse_events
from tests.support.frontend_fakes import MODEL, echo_worker, frontend
from tests.support.hostile_worker import hostile_worker, raw
from tests.support.tiny_model import tiny_card

HELLO = [{"role": "user", "content": "hello"}]
OUTPUT = [5, 6, 7, 8]  # what the echo engine answers (ids well inside the tiny vocabulary)


@pytest.fixture
def card(tiny_tokenizer_dir):
    return tiny_card(tiny_tokenizer_dir, MODEL)


@pytest.fixture
def token(card):
    processor = build_chat_processor(card)

    def text(token_id: int) -> str:
        detokenizer = processor.detokenizer(skip_special_tokens=False)
        return detokenizer.add((token_id,)) + detokenizer.finish()

    return text


def post(card, path, body, *, stream=False):
    async def scenario():
        async with (
            echo_worker(output=OUTPUT) as (engine, endpoint),
            frontend(card, endpoint) as client,
        ):
            # A body's own "stream" wins (a refusal of it is parsed as the 400 it is).
            response = await client.post(path, json={"model": MODEL, "stream": stream, **body})
            answer = await sse_events(response) if stream else await response.json()
            return response.status, answer, engine.bodies

    return asyncio.run(scenario())


def chat(card, stream=False, **fields):
    body = {"messages": HELLO, "max_tokens": len(OUTPUT), "ignore_eos": True, **fields}
    return post(card, "/v1/chat/completions", body, stream=stream)


def completion(card, stream=False, **fields):
    body = {"prompt": "hello", "max_tokens": len(OUTPUT), "ignore_eos": True, **fields}
    return post(card, "/v1/completions", body, stream=stream)


# --- the request: what the worker is asked for, and vLLM's rules ------------------------------


def test_the_worker_is_asked_for_logprobs_only_when_the_client_asked(card):
    _, _, (plain,) = chat(card)
    _, _, (sampled,) = chat(card, logprobs=True)
    _, _, (top,) = chat(card, logprobs=True, top_logprobs=3)
    _, _, (zero,) = completion(card, logprobs=0)
    assert "logprobs" not in plain["sampling"]  # unset: not sent (an older worker takes it)
    assert sampled["sampling"]["logprobs"] == 0  # the sampled token's only, as vLLM asks
    assert top["sampling"]["logprobs"] == 3
    assert zero["sampling"]["logprobs"] == 0  # 0 asks for something: sent


@pytest.mark.parametrize(
    "kind, fields, param, words",
    [
        ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "max allowed: 20"),
        ("completion", {"logprobs": 21}, "logprobs", "max allowed: 20"),
        ("chat", {"top_logprobs": 2}, "top_logprobs", "`logprobs` must be set to true"),
        ("chat", {"logprobs": True, "top_logprobs": -1}, "top_logprobs", "greater than"),
        ("chat", {"logprobs": 1}, "logprobs", "boolean"),
        ("completion", {"logprobs": True}, "logprobs", "integer"),
    ],
)
def test_a_bad_logprobs_request_is_a_400_naming_its_field(card, kind, fields, param, words):
    status, body, bodies = (chat if kind == "chat" else completion)(card, **fields)
    error = assert_openai_error(body, status, 400, param=param)
    assert words in error["message"] and bodies == []


def test_vllms_limit_is_refused_in_vllms_words(card):
    status, body, _ = completion(card, logprobs=25)
    error = assert_openai_error(body, status, 400, param="logprobs")
    assert (
        "Requested sample logprobs of 25, which is greater than max allowed: 20"
        in (error["message"])
    )


# --- the shapes ---------------------------------------------------------------------------------


def test_chat_logprobs_have_openais_shape(card, token):
    status, body, _ = chat(card, logprobs=True, top_logprobs=2)
    assert status == 200, body
    content = body["choices"][0]["logprobs"]["content"]
    assert [entry["token"] for entry in content] == [token(i) for i in OUTPUT]
    for token_id, entry in zip(OUTPUT, content, strict=True):
        assert entry["logprob"] == -0.25
        assert entry["bytes"] == list(token(token_id).encode())
        # The first top_logprobs entries of the position, the sampled token first (vLLM's).
        assert [(top["token"], top["logprob"]) for top in entry["top_logprobs"]] == [
            (token(token_id), -0.25),
            (token(token_id + 1), -1.0),
        ]
    assert "".join(entry["token"] for entry in content) == body["choices"][0]["message"]["content"]


def test_chat_logprobs_false_or_absent_leaves_them_out(card):
    for fields in ({}, {"logprobs": False}):
        status, body, _ = chat(card, **fields)
        assert status == 200 and body["choices"][0].get("logprobs") is None


def test_chat_top_logprobs_zero_gives_the_sampled_tokens_logprob_and_no_alternatives(card):
    _, body, _ = chat(card, logprobs=True)
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == len(OUTPUT) and all(e["top_logprobs"] == [] for e in content)


def test_completion_logprobs_have_openais_shape(card, token):
    status, body, _ = completion(card, logprobs=1)
    assert status == 200, body
    logprobs = body["choices"][0]["logprobs"]
    texts = [token(i) for i in OUTPUT]
    assert logprobs["tokens"] == texts
    assert logprobs["token_logprobs"] == [-0.25] * len(OUTPUT)
    # logprobs + 1 entries keyed by their text, as vLLM (and OpenAI) build them.
    assert logprobs["top_logprobs"] == [{token(i): -0.25, token(i + 1): -1.0} for i in OUTPUT]
    offsets = [sum(len(t) for t in texts[:n]) for n in range(len(texts))]
    assert logprobs["text_offset"] == offsets


def test_echo_with_logprobs_puts_the_prompts_first_the_first_null(card, token):
    _, body, (sent,) = completion(card, logprobs=1, echo=True)
    assert sent["sampling"]["prompt_logprobs"] == 1  # vLLM: as many as logprobs
    prompt = sent["token_ids"]
    logprobs = body["choices"][0]["logprobs"]
    texts = [token(i) for i in [*prompt, *OUTPUT]]
    assert logprobs["tokens"] == texts
    assert logprobs["token_logprobs"] == [None] + [-0.25] * (len(texts) - 1)
    assert logprobs["top_logprobs"][0] is None
    assert logprobs["top_logprobs"][1] == {token(prompt[1]): -0.25, token(prompt[1] + 1): -1.0}
    assert logprobs["text_offset"] == [sum(len(t) for t in texts[:n]) for n in range(len(texts))]
    _, events, _ = completion(card, stream=True, logprobs=1, echo=True)
    chunks = [e["choices"][0]["logprobs"] for e in events if isinstance(e, dict) and e["choices"]]
    assert [t for lp in chunks if lp for t in lp["tokens"]] == texts


def test_the_prompts_logprobs_are_asked_for_only_with_echo(card):
    _, _, (sent,) = completion(card, logprobs=1)
    assert "prompt_logprobs" not in sent["sampling"]


def test_return_tokens_as_token_ids(card):
    _, body, _ = completion(card, logprobs=0, return_tokens_as_token_ids=True)
    assert body["choices"][0]["logprobs"]["tokens"] == [f"token_id:{i}" for i in OUTPUT]
    _, body, _ = chat(card, logprobs=True, top_logprobs=1, return_tokens_as_token_ids=True)
    content = body["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == [f"token_id:{i}" for i in OUTPUT]
    assert content[0]["top_logprobs"][0]["token"] == f"token_id:{OUTPUT[0]}"


def test_streamed_logprobs_cover_every_token_once_in_order(card, token):
    _, events, _ = chat(card, stream=True, logprobs=True, top_logprobs=1)
    chunks = [e for e in events if isinstance(e, dict) and e["choices"]]
    content = [
        entry for c in chunks if c["choices"][0].get("logprobs")
        for entry in c["choices"][0]["logprobs"]["content"]
    ]  # fmt: skip
    assert [entry["token"] for entry in content] == [token(i) for i in OUTPUT]
    _, events, _ = completion(card, stream=True, logprobs=0)
    chunks = [e["choices"][0]["logprobs"] for e in events if isinstance(e, dict) and e["choices"]]
    tokens = [t for lp in chunks if lp for t in lp["tokens"]]
    offsets = [o for lp in chunks if lp for o in lp["text_offset"]]
    texts = [token(i) for i in OUTPUT]
    assert tokens == texts  # text_offset counts on from one chunk to the next
    assert offsets == [sum(len(t) for t in texts[:n]) for n in range(len(texts))]


def test_a_stop_tokens_logprob_is_reported_as_vllm_reports_it(card, token):
    # The stop token ends the text (not shown), but was generated: its logprob is reported.
    _, body, _ = chat(card, logprobs=True, stop_token_ids=[7], ignore_eos=False)
    content = body["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == [token(5), token(6), token(7)]
    assert body["choices"][0]["finish_reason"] == "stop"


# --- a hostile worker's logprobs ------------------------------------------------------------


def _item(**fields) -> bytes:
    return json.dumps({"token_ids": [5], **fields}).encode()


@pytest.mark.parametrize(
    "line, words",
    [
        (_item(logprobs=[[[5, float("nan")]]]), "invalid item"),
        (_item(logprobs=[[[5, float("-inf")]]]), "invalid item"),
        (_item(logprobs=[[[5, 0.5]]]), "invalid item"),  # a probability above 1
        (_item(logprobs=[[[5, -10000.0]]]), "invalid item"),  # under vLLM's floor
        (_item(logprobs=[[[5, "-1"]]]), "invalid item"),
        (_item(logprobs=[[[5, -1.0], [6, -2.0], [7, -3.0]]]), "more than the 1 asked for"),
        (_item(logprobs=[[[6, -1.0]]]), "not the sampled id"),
        (_item(logprobs=[[[5, -1.0], [10**6, -2.0]]]), "outside the model's vocabulary"),
        # The frontend ranks alternatives by their order: vLLM's top k, best first, each once.
        (_item(logprobs=[[[5, -1.0], [5, -1.0]]]), "repeated or out of rank order"),
        (_item(logprobs=[[[5, -1.0]], [[5, -1.0]]]), "2 logprob position(s) for 1 id(s)"),
        (_item(), "without the logprobs asked for"),
        (_item(logprobs=[[[5, -1.0]] * 22]), "invalid item"),  # over MAX_LOGPROBS + 1
    ],
)
def test_a_worker_sending_bad_logprobs_breaks_the_wire_format(line, words):
    with pytest.raises(WorkerProtocolError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_item(line, max_token_id=1000, logprobs=1)


@pytest.mark.parametrize(
    "position",
    [
        [[5, -1.0], [7, -0.5], [7, -0.5]],  # an alternative twice
        [[5, -1.0], [7, -2.0], [8, -0.5]],  # the second alternative better than the first
    ],
)
def test_alternatives_repeated_or_out_of_rank_order_break_the_wire_format(position):
    with pytest.raises(WorkerProtocolError, match="repeated or out of rank order"):
        parse_item(_item(logprobs=[position]), max_token_id=1000, logprobs=2)


def test_alternatives_in_rank_order_ties_included_are_taken():
    for position in ([[5, -3.0], [7, -0.5], [8, -0.5], [9, -9999.0]], [[5, -0.1]]):
        assert parse_item(_item(logprobs=[position]), max_token_id=1000, logprobs=3)


PROMPT = PromptLogprobs(token_ids=(3, 4, 5), alternatives=1)


@pytest.mark.parametrize(
    "prompt_logprobs, words",
    [
        (None, "no prompt logprobs"),
        ([None, [[4, -1.0]]], "not one per prompt id"),
        ([[[3, -1.0]], [[4, -1.0]], [[5, -1.0]]], "for the first prompt id"),
        ([None, None, [[5, -1.0]]], "null prompt logprob after the first"),
        ([None, [[4, -1.0]], [[6, -1.0]]], "not the sampled id"),
        ([None, [[4, -1.0], [7, -2.0], [8, -3.0]], [[5, -1.0]]], "more than the 1 asked"),
        ([None, [[4, float("nan")]], [[5, -1.0]]], "invalid item"),
        ([None, [[4, -1.0]], [[5, -1.0]]], "no prompt ranks"),
    ],
)
def test_a_worker_sending_bad_prompt_logprobs_breaks_the_wire_format(prompt_logprobs, words):
    line = _item(logprobs=[[[5, -1.0]]], prompt_logprobs=prompt_logprobs)
    with pytest.raises(WorkerProtocolError, match=words):
        parse_item(line, max_token_id=1000, logprobs=1, prompt=PROMPT)


@pytest.mark.parametrize(
    "ranks, words",
    [
        ([None, 1], "not one per prompt logprob"),
        ([1, 1, 1], "not one per prompt logprob"),
        ([None, 0, 1], "invalid item"),
        ([None, 1, 2**31], "invalid item"),
        ([None, "1", 1], "invalid item"),
    ],
)
def test_a_worker_sending_bad_prompt_ranks_breaks_the_wire_format(ranks, words):
    good = [None, [[4, -1.0]], [[5, -1.0]]]
    line = _item(logprobs=[[[5, -1.0]]], prompt_logprobs=good, prompt_ranks=ranks)
    with pytest.raises(WorkerProtocolError, match=words):
        parse_item(line, max_token_id=1000, logprobs=1, prompt=PROMPT)


def test_prompt_logprobs_on_a_later_item_break_the_wire_format():
    line = _item(
        logprobs=[[[5, -1.0]]],
        prompt_logprobs=[None, [[4, -1.0]], [[5, -1.0]]],
        prompt_ranks=[None, 1, 3],
    )
    assert parse_item(line, max_token_id=1000, logprobs=1, prompt=PROMPT).token_ids == (5,)
    with pytest.raises(WorkerProtocolError, match="where none belong"):
        parse_item(line, max_token_id=1000, logprobs=1)


def test_logprobs_not_asked_for_break_the_wire_format():
    with pytest.raises(WorkerProtocolError, match="did not ask for"):
        parse_item(_item(logprobs=[[[5, -1.0]]]), max_token_id=1000)


def test_vllms_floor_and_a_full_position_are_accepted():
    position = [[5, -9999.0]] + [[i, -1.0] for i in range(6, 26)]
    item = parse_item(_item(logprobs=[position]), max_token_id=1000, logprobs=20)
    assert item.logprobs is not None and len(item.logprobs[0]) == 21


def test_a_hostile_workers_nan_logprob_is_a_502_never_a_number_passed_on(card):
    line = _item(logprobs=[[[5, float("nan")]]]) + b"\n"

    async def scenario():
        async with (
            hostile_worker(raw([line])) as worker,
            frontend(card, worker.endpoint) as client,
        ):
            response = await client.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": HELLO, "logprobs": True, "max_tokens": 4},
            )
            return response.status, await response.json()

    status, body = asyncio.run(scenario())
    error = assert_openai_error(body, status, 502)
    assert "nan" not in json.dumps(error).lower()


def test_the_wire_keeps_zero_logprobs_and_drops_none():
    assert SamplingOptions(max_tokens=1, logprobs=0).model_dump()["logprobs"] == 0
    assert "logprobs" not in SamplingOptions(max_tokens=1).model_dump()


def test_the_stream_budget_grows_with_the_logprobs_asked_for(card):
    # 20 alternatives for each of 64 tokens, ~40 bytes a pair: over the budget without
    # logprobs (64 KiB + 256 B a token), within the one that grows with them.
    position = [[5, -1.2345678901234567]] + [[i, -2.345678901234567] for i in range(6, 26)]
    steps = [_item(logprobs=[position]) + b"\n" for _ in range(64)]
    padding = [b" " * 60000 + b"\n"]  # blank lines count against the budget too
    finish = json.dumps({"finish_reason": "length", "prompt_tokens": 1, "completion_tokens": 64})

    async def scenario():
        async with (
            hostile_worker(raw(padding + steps + [finish.encode() + b"\n"])) as worker,
            frontend(card, worker.endpoint) as client,
        ):
            response = await client.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": "hi", "logprobs": 20, "max_tokens": 64},
            )
            return response.status, await response.json()

    status, body = asyncio.run(scenario())
    assert status == 200, body
    assert len(body["choices"][0]["logprobs"]["tokens"]) == 64


# --- prompt_logprobs: vLLM's shape and rules --------------------------------------------------


def _prompt_entries(token, prompt, k):
    """What vLLM returns for the echo engine's prompt logprobs: the prompt id at -0.25, rank 1,
    then the k ids after it at -1, -2, ..., ranks 2.. (the prompt's own rank left out)."""
    return [None] + [
        {
            str(p + i): {
                "logprob": -0.25 if i == 0 else -float(i),
                "rank": i + 1,
                "decoded_token": token(p + i),
            }
            for i in range(k + 1)
        }
        for p in prompt[1:]
    ]


def test_chat_prompt_logprobs_are_the_responses_in_vllms_shape(card, token):
    status, body, (sent,) = chat(card, prompt_logprobs=1)
    assert status == 200, body
    assert sent["sampling"]["prompt_logprobs"] == 1 and "logprobs" not in sent["sampling"]
    assert body["prompt_logprobs"] == _prompt_entries(token, sent["token_ids"], 1)
    assert all("prompt_logprobs" not in choice for choice in body["choices"])


def test_completion_prompt_logprobs_are_each_choices(card, token):
    status, body, sent = completion(card, prompt_logprobs=0, n=2)
    assert status == 200, body
    expected = _prompt_entries(token, sent[0]["token_ids"], 0)
    assert [c["prompt_logprobs"] for c in body["choices"]] == [expected, expected]
    assert "prompt_logprobs" not in body and body["choices"][0]["logprobs"] is None


def test_prompt_logprobs_say_how_many_alternatives_echo_with_logprobs_asks_for(card):
    _, body, (sent,) = completion(card, logprobs=1, echo=True, prompt_logprobs=2)
    assert sent["sampling"]["prompt_logprobs"] == 2  # vLLM: prompt_logprobs over logprobs
    assert len(body["choices"][0]["prompt_logprobs"][1]) == 3
    assert len(body["choices"][0]["logprobs"]["top_logprobs"][1]) == 2  # logprobs + 1 shown


def test_prompt_logprobs_zero_streams_without_them_as_vllm(card):
    status, events, (sent,) = chat(card, stream=True, prompt_logprobs=0)
    assert status == 200 and sent["sampling"]["prompt_logprobs"] == 0
    assert not any("prompt_logprobs" in json.dumps(e) for e in events)


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"prompt_logprobs": 21}, "Requested prompt logprobs of 21, which is greater than max"),
        ({"prompt_logprobs": -1}, "whole vocabulary (-1), which is greater than max allowed: 20"),
        ({"prompt_logprobs": -2}, "must be a positive value or -1"),
        ({"prompt_logprobs": 1, "stream": True}, "not available when `stream=True`"),
        ({"prompt_logprobs": -1, "stream": True}, "not available when `stream=True`"),
        ({"prompt_logprobs": "1"}, "prompt_logprobs"),
        ({"prompt_logprobs": 1.0}, "prompt_logprobs"),
        ({"prompt_logprobs": True}, "prompt_logprobs"),
    ],
)
def test_prompt_logprobs_bounds_are_vllms_400s_naming_the_field(card, fields, words):
    for path, base in (("/v1/chat/completions", {"messages": HELLO}), ("/v1/completions", {})):
        base = base or {"prompt": "hello"}
        status, body, sent = post(card, path, {**base, **fields})  # its "stream" as sent
        error = assert_openai_error(body, status, 400, param="prompt_logprobs")
        assert words in error["message"] and sent == []


def test_prompt_ranks_leave_the_prompts_own_rank_out_of_the_alternatives(card):
    processor = build_chat_processor(card)
    position = ((9, -1.5), (4, -0.5), (7, -2.0))  # the prompt's id 9 is second in the vocabulary
    (first, entries) = prompt_logprobs(processor, [None, position], [None, 2])
    assert first is None
    assert {k: v["rank"] for k, v in entries.items()} == {"9": 2, "4": 1, "7": 3}


@pytest.mark.parametrize(
    "extra",
    [
        {"prompt_ranks": [None, 0, 1]},  # ranks count from 1
        {"prompt_ranks": [None, 1, 2**31]},  # over any vocabulary
        {},  # logprobs without their ranks
        {"prompt_ranks": [None, 1]},  # not one per prompt id
        {"prompt_ranks": [None, 1, 1]},  # well-formed
    ],
)
def test_a_hostile_workers_prompt_ranks_are_a_502_never_passed_on(card, extra):
    prompt = [None, [[6, -1.0]], [[7, -1.0]]]
    line = json.dumps({"token_ids": [5], "prompt_logprobs": prompt, **extra}).encode() + b"\n"
    finish = b'{"finish_reason": "length", "prompt_tokens": 3, "completion_tokens": 1}\n'

    async def scenario():
        async with (
            hostile_worker(raw([line, finish])) as worker,
            frontend(card, worker.endpoint) as client,
        ):
            response = await client.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": [5, 6, 7], "prompt_logprobs": 0, "max_tokens": 4},
            )
            return response.status, await response.json()

    status, body = asyncio.run(scenario())
    if extra.get("prompt_ranks") == [None, 1, 1]:  # the control: a well-formed answer
        assert status == 200 and body["choices"][0]["prompt_logprobs"][2]["7"]["rank"] == 1
    else:
        assert_openai_error(body, status, 502)

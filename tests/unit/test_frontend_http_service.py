"""The frontend's HTTP service on aiohttp's test client, with the tiny model's real tokenizer and
template, routing to request-plane servers that speak wire format v2
(tests/support/frontend_fakes.py).

Only the mid-stream crash uses a hand-written generator, since a crash cannot be asked of an
engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import pytest

from dynamo.frontend.processors.chat_processor import build_chat_processor
from dynamo.frontend.processors.hf_processor import RenderOptions
from dynamo_gc import lifecycle
from tests.support import wait_until_async
from tests.support.answers import assert_openai_error, sse_events, streamed_pieces, streamed_text
from tests.support.frontend_fakes import (
    MODEL,
    echo_worker,
    frontend,
    refusing_worker,
    request_plane_server,
)
from tests.support.tiny_model import BOS, build_tiny_tokenizer, tiny_card

HELLO = [{"role": "user", "content": "héllo"}]
MULTI_BYTE = "Snow ❄ and ice 🧊 in 世界, done: 👩‍👩‍👧."


@pytest.fixture
def card(tiny_tokenizer_dir):
    return tiny_card(tiny_tokenizer_dir, MODEL)


@pytest.fixture
def processor(card):
    return build_chat_processor(card)


# Sockets that keep the dead endpoints' ports bound (never listening) until the process exits.
_DEAD_PORT_HOLDERS: list[socket.socket] = []


def dead_endpoint() -> str:
    """A loopback port nobody listens on: connections are refused.

    The port stays bound (without listening) for the rest of the run: closed, it could be
    handed to the next bind(0) (a test's own worker, or anything else on a shared CI machine)
    or picked as the client's own port, and the "dead" worker would answer.
    """
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _DEAD_PORT_HOLDERS.append(sock)
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


def chat(max_tokens: int | None = 12, stream: bool = False, **extra) -> dict:
    body = {"model": MODEL, "messages": HELLO, "stream": stream, **extra}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def prompt_ids(processor, messages=HELLO) -> list[int]:
    return processor.encode_chat(processor.render(messages))


def cycled(ids: list[int], max_tokens: int) -> list[int]:
    return (ids * (max_tokens // len(ids) + 1))[:max_tokens]


def echoed(processor, messages, max_tokens) -> str:
    """What the echo engine's completion decodes to with ignore_eos (the prompt, cycled, special
    tokens hidden); without it, the echo ends at the template's first EOS."""
    return processor.tokenizer.decode(cycled(prompt_ids(processor, messages), max_tokens))


def run(scenario):
    return asyncio.run(scenario())


async def whole_and_streamed(client, max_tokens: int, **fields) -> list[str]:
    """The content of one chat request (ignore_eos) answered whole, then streamed."""
    answers = []
    for stream in (False, True):
        body = chat(max_tokens, stream=stream, ignore_eos=True, **fields)
        response = await client.post("/v1/chat/completions", json=body)
        if stream:
            answers.append(streamed_text(await sse_events(response)))
        else:
            answers.append((await response.json())["choices"][0]["message"]["content"])
    return answers


BAD_BODIES = [
    (b"{not json", None),
    (b"\xff\xfe", None),
    (b"[1, 2]", None),
    (b'"text"', None),
    (json.dumps({"messages": HELLO}).encode(), "model"),
    (json.dumps({"model": "", "messages": HELLO}).encode(), "model"),
    (json.dumps({"model": 5, "messages": HELLO}).encode(), "model"),
    (json.dumps({"model": MODEL}).encode(), "messages"),
    (json.dumps({"model": MODEL, "messages": []}).encode(), "messages"),
    (json.dumps({"model": MODEL, "messages": "hi"}).encode(), "messages"),
    (json.dumps({"model": MODEL, "messages": ["hi"]}).encode(), "messages[0]"),
    (json.dumps({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}).encode(),
     "messages[0].role"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": 5}]}).encode(),
     "messages[0].content"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image"}]}]})
     .encode(), "messages[0].content"),
]  # fmt: skip

BAD_FIELDS: list[tuple[str, list]] = [
    ("max_tokens", [0, -3, "5", 1.5, True]),
    ("max_completion_tokens", [0, "7", False]),
    ("temperature", [-0.1, "1", True, [1]]),
    ("top_p", [0, 1.01, -1, "0.5"]),
    ("top_k", [-2, 1.5, "3"]),
    ("min_p", [-0.01, 1.5, "0"]),
    ("seed", [1.5, "7", 2**63, -(2**63) - 1]),
    ("presence_penalty", [-2.01, 2.5, "0"]),
    ("frequency_penalty", [3, -3, None and 0 or "x"]),
    ("repetition_penalty", [0, -1, "1"]),
    ("stop", [5, [""], "", [1, 2], ["a"] * 65, {"a": 1}]),
    ("n", [17, 0, "1", 1.0, True]),  # at most 16 (choice_fields.MAX_N)
    ("ignore_eos", ["yes", 1]),
    ("min_tokens", [-1, 1.5, "2"]),
    ("stream", ["yes", 1]),
    ("stream_options", ["x", {"include_usage": "y"}]),
]
BAD_FIELD_CASES = [(name, value) for name, values in BAD_FIELDS for value in values]


@pytest.mark.parametrize("raw, param", BAD_BODIES)
def test_bad_requests_are_400_in_the_openai_shape_and_reach_no_worker(card, raw, param):
    async def scenario():
        async with echo_worker() as (engine, endpoint), frontend(card, endpoint) as client:
            response = await client.post("/v1/chat/completions", data=raw)
            return response.status, await response.json(), engine.requests_started

    status, body, worker_requests = run(scenario)
    assert status == 400
    error = assert_openai_error(body, param=param)
    assert error["type"] == "invalid_request_error"
    assert worker_requests == 0


@pytest.mark.parametrize(
    "endpoint_path, name, value",
    [("/v1/chat/completions", name, value) for name, value in BAD_FIELD_CASES]
    + [  # max_completion_tokens is chat's only (/v1/completions ignores it, as vLLM does)
        ("/v1/completions", name, value)
        for name, value in BAD_FIELD_CASES
        if name != "max_completion_tokens"
    ],
)
def test_every_sampling_field_rejects_its_bad_values_naming_it(card, endpoint_path, name, value):
    body = chat(**{name: value})
    if endpoint_path == "/v1/completions":
        del body["messages"]
        body["prompt"] = "hello"

    async def scenario():
        async with echo_worker() as (engine, endpoint), frontend(card, endpoint) as client:
            response = await client.post(endpoint_path, json=body)
            return response.status, await response.json(), engine.requests_started

    status, body, worker_requests = run(scenario)
    assert status == 400, body
    error = assert_openai_error(body)
    assert error["param"] is not None and error["param"].split(".")[0] == name, error
    assert worker_requests == 0


BODY_DECODER_PROBLEMS = [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"model": "tiny", "messages": [], "temperature": NaN}', "NaN is not a JSON number"),
    (b'{"model": "tiny", "messages": [], "temperature": Infinity}', "Infinity"),
    (b'{"model": "tiny", "messages": [], "temperature": -Infinity}', "Infinity"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}', "surrogate"),
    (b'{"model": "tiny", "prompt": "a\\udfffb"}', "surrogate"),
    (b'{"model": "tiny", "max_tokens": 1' + b"0" * 5000 + b"}", "not valid JSON"),
    (b'{"model": "tiny", "messages": "caf\xe9"}', "not valid UTF-8"),
    (b"", "not valid JSON"),
]


@pytest.mark.parametrize("endpoint_path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("raw, message", BODY_DECODER_PROBLEMS)
def test_bodies_the_decoder_cannot_take_are_400_naming_the_problem(
    card, endpoint_path, raw, message
):
    async def scenario():
        async with echo_worker() as (_, endpoint), frontend(card, endpoint) as client:
            response = await client.post(endpoint_path, data=raw)
            return response.status, await response.json()

    status, body = run(scenario)
    assert status == 400, body
    assert message in assert_openai_error(body)["message"]


def test_unknown_fields_are_accepted_and_the_sampling_fields_reach_the_worker(card, processor):
    fields = dict(
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        seed=1234,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.1,
        stop=["zzz", "qqq"],
        min_tokens=2,
        metadata={"k": "v"},  # unknown to vLLM too: accepted and logged, as vLLM does
        logit_bias={},  # refused by name only when it asks for something (openai_fields)
        user="someone",  # accepted without effect
    )

    async def scenario():
        async with echo_worker() as (engine, endpoint), frontend(card, endpoint) as client:
            response = await client.post("/v1/chat/completions", json=chat(max_tokens=5, **fields))
            return response.status, engine.bodies

    status, (body,) = run(scenario)
    assert status == 200
    assert body["model"] == MODEL and body["token_ids"] == prompt_ids(processor)
    sampling = body["sampling"]
    for name in ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "min_tokens"):  # fmt: skip
        assert sampling[name] == fields[name], name
    assert sampling["stop"] == ["zzz", "qqq"] and sampling["max_tokens"] == 5
    assert sampling["stop_token_ids"] == list(card.eos_token_ids)
    assert sampling["ignore_eos"] is False


def test_ignore_eos_sends_no_stop_token_ids_and_runs_to_the_limit(card, processor):
    eos = card.eos_token_ids[0]
    output = processor.encode_completion("ok") + [eos]

    async def scenario():
        async with (
            echo_worker(output=output) as (engine, endpoint),
            frontend(card, endpoint) as client,
        ):
            normal = await (await client.post("/v1/chat/completions", json=chat(10))).json()
            ignoring = await (
                await client.post("/v1/chat/completions", json=chat(10, ignore_eos=True))
            ).json()
            return normal, ignoring, engine.bodies

    normal, ignoring, bodies = run(scenario)
    assert normal["choices"][0]["finish_reason"] == "stop"
    assert normal["choices"][0]["message"]["content"] == "ok"  # EOS itself never shows
    assert normal["usage"]["completion_tokens"] == len(output)
    assert bodies[1]["sampling"]["stop_token_ids"] == [] and bodies[1]["sampling"]["ignore_eos"]
    assert ignoring["choices"][0]["finish_reason"] == "length"
    assert ignoring["usage"]["completion_tokens"] == 10


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_client_stop_token_ids_end_the_completion_without_their_text(card, processor, ignore_eos):
    ids = processor.tokenizer.encode("one two three four", add_special_tokens=False)
    stop = ids[2]

    async def scenario():
        async with (
            echo_worker(output=ids) as (engine, endpoint),
            frontend(card, endpoint) as client,
        ):
            body = chat(10, stop_token_ids=[stop, stop], ignore_eos=ignore_eos)
            answer = await (await client.post("/v1/chat/completions", json=body)).json()
            return answer, engine.bodies

    answer, (body,) = run(scenario)
    eos = [] if ignore_eos else list(card.eos_token_ids)
    assert body["sampling"]["stop_token_ids"] == [*eos, stop]  # once, after the EOS ids
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["choices"][0]["message"]["content"] == processor.tokenizer.decode(ids[:2])
    assert answer["usage"]["completion_tokens"] == 3  # the stop token counts, as in vLLM


def test_skip_special_tokens_false_shows_them_in_the_text_as_vllm_does(card, processor):
    from pathlib import Path

    from tokenizers import Tokenizer

    eos = card.eos_token_ids[0]
    ok, go = (processor.tokenizer.encode(t, add_special_tokens=False) for t in ("ok", " go"))
    output = [*ok, eos, *go]
    reference = Tokenizer.from_file(str(Path(card.tokenizer_path) / "tokenizer.json"))

    async def scenario():
        async with (
            echo_worker(output=output) as (_, endpoint),
            frontend(card, endpoint) as client,
        ):
            answers = []
            for extra in ({}, {"skip_special_tokens": False}):
                answers += await whole_and_streamed(client, len(output), **extra)
            return answers

    skipped, skipped_streamed, shown, shown_streamed = run(scenario)
    assert skipped == skipped_streamed == reference.decode(output, skip_special_tokens=True)
    assert shown == shown_streamed == reference.decode(output, skip_special_tokens=False)
    assert shown != skipped


def test_logit_bias_reaches_the_worker_as_pairs_clamped_as_vllm_clamps(card, processor):
    async def scenario():
        async with echo_worker() as (engine, endpoint), frontend(card, endpoint) as client:
            plain = await client.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})
            bias = {"5": 250, "7": -3.5, "9": 0}
            biased = await client.post(
                "/v1/completions", json={"model": MODEL, "prompt": "hi", "logit_bias": bias}
            )
            return plain.status, biased.status, engine.bodies

    plain, biased, (plain_body, biased_body) = run(scenario)
    assert plain == biased == 200
    assert "logit_bias" not in plain_body["sampling"]  # unset: not sent (older workers)
    assert biased_body["sampling"]["logit_bias"] == [[5, 100.0], [7, -3.5], [9, 0.0]]


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"stop": ["thr"]}, "one two "),
        ({"stop": ["thr"], "include_stop_str_in_output": True}, "one two thr"),
        ({"stop": ["two", "two thr"], "include_stop_str_in_output": True}, "one two"),
        ({"stop_token_ids": "third"}, "one two"),
        ({"stop_token_ids": "third", "include_stop_str_in_output": True}, "one two three"),
    ],
)
def test_include_stop_str_in_output_keeps_the_stop_as_vllm_does(card, processor, fields, expected):
    ids = processor.tokenizer.encode("one two three four", add_special_tokens=False)
    if fields.get("stop_token_ids") == "third":  # the id whose text ends "three"
        third = next(k for k in range(len(ids)) if processor.tokenizer.decode(ids[: k + 1])
                     .endswith("three"))  # fmt: skip
        fields = {**fields, "stop_token_ids": [ids[third]]}
        expected = processor.tokenizer.decode(ids[: third + (expected.endswith("three"))])

    async def scenario():
        async with (
            echo_worker(output=ids) as (_, endpoint),
            frontend(card, endpoint) as client,
        ):
            return await whole_and_streamed(client, len(ids), **fields)

    assert run(scenario) == [expected, expected]


def test_a_stop_string_in_an_included_stop_tokens_text_ends_there_as_in_vllm(card, processor):
    """vLLM checks the text of a stop token it shows (include_stop_str_in_output) for stop
    strings: one found there ends the text after it and is the stop_reason, not the id. (The
    tiny tokenizer spells "three" " th", "re", "e": "ree" ends in the stop token's text.)"""
    ids = processor.tokenizer.encode("one two three four", add_special_tokens=False)
    third = next(k for k in range(len(ids)) if processor.tokenizer.decode(ids[: k + 1])
                 .endswith("three"))  # fmt: skip
    full = processor.tokenizer.decode(ids[: third + 1])
    fields = {"stop_token_ids": [ids[third]], "stop": ["ree"], "include_stop_str_in_output": True}

    async def scenario():
        async with (
            echo_worker(output=ids) as (_, endpoint),
            frontend(card, endpoint) as client,
        ):
            whole = await client.post(
                "/v1/chat/completions", json=chat(len(ids), ignore_eos=True, **fields)
            )
            streamed = await client.post(
                "/v1/chat/completions",
                json=chat(len(ids), stream=True, ignore_eos=True, **fields),
            )
            return await whole.json(), await sse_events(streamed)

    whole, events = run(scenario)
    expected = full[: full.index("ree") + len("ree")]
    assert whole["choices"][0]["message"]["content"] == expected
    assert whole["choices"][0]["stop_reason"] == "ree"
    assert streamed_text(events) == expected
    (ending,) = [e["choices"][0] for e in events if isinstance(e, dict) and e.get("choices")
                 and e["choices"][0]["finish_reason"]]  # fmt: skip
    assert (ending["finish_reason"], ending["stop_reason"]) == ("stop", "ree")


def test_a_stop_string_may_start_before_min_tokens_and_end_after_as_in_vllm(card, processor):
    """vLLM matches stop strings that end in text past min_tokens, looking back into the text
    before (" t" is the second token, "w" the third: with min_tokens 2, " tw" ends the
    output after "one"); one wholly before min_tokens does not stop it ("one")."""
    ids = processor.tokenizer.encode("one two three four", add_special_tokens=False)

    async def scenario():
        async with (
            echo_worker(output=ids) as (_, endpoint),
            frontend(card, endpoint) as client,
        ):
            straddling = await whole_and_streamed(client, len(ids), stop=[" tw"], min_tokens=2)
            before = await whole_and_streamed(client, len(ids), stop=["one"], min_tokens=2)
            return straddling, before

    straddling, before = run(scenario)
    assert straddling == ["one", "one"]
    assert before == ["one two three four"] * 2


def test_echo_puts_the_prompt_first_whole_and_streamed(card, processor):
    output = processor.tokenizer.encode(" and more", add_special_tokens=False)
    ids = processor.tokenizer.encode("Once upon", add_special_tokens=False)
    generated = processor.tokenizer.decode(output)
    cases = [
        ({"prompt": "Once upon ❄"}, "Once upon ❄" + generated),
        ({"prompt": ids}, processor.tokenizer.decode(ids) + generated),
        ({"prompt": "Once upon ❄", "truncate_prompt_tokens": 1},
         processor.tokenizer.decode(processor.encode_completion("Once upon ❄")[-1:]) + generated),
    ]  # fmt: skip

    async def scenario():
        async with (
            echo_worker(output=output) as (_, endpoint),
            frontend(card, endpoint) as client,
        ):
            answers = []
            for extra, _ in cases:
                for stream in (False, True):
                    body = {"model": MODEL, "max_tokens": len(output), "echo": True,
                            "stream": stream, **extra}  # fmt: skip
                    response = await client.post("/v1/completions", json=body)
                    if stream:
                        events = await sse_events(response)
                        chunks = [e for e in events if isinstance(e, dict) and e["choices"]]
                        answers.append("".join(e["choices"][0]["text"] for e in chunks))
                    else:
                        answers.append((await response.json())["choices"][0]["text"])
            return answers

    assert run(scenario) == [text for _, text in cases for _ in (False, True)]


def test_echo_with_max_tokens_0_answers_the_prompt_alone_as_vllm_does(card, processor):
    output = processor.tokenizer.encode(" and more", add_special_tokens=False)

    async def scenario():
        async with (
            echo_worker(output=output) as (_, endpoint),
            frontend(card, endpoint) as client,
        ):
            body = {"model": MODEL, "prompt": "Once upon", "max_tokens": 0, "echo": True}
            whole = await (await client.post("/v1/completions", json=body)).json()
            events = await sse_events(
                await client.post("/v1/completions", json={**body, "stream": True})
            )
            refused = await client.post("/v1/completions", json={**body, "echo": False})
            return whole, events, refused.status, (await refused.json())["error"]

    whole, events, status, error = run(scenario)
    # The engine generates one token (counted, as vLLM counts it), never shown.
    assert whole["choices"][0]["text"] == "Once upon"
    assert whole["usage"]["completion_tokens"] == 1
    chunks = [e for e in events if isinstance(e, dict) and e["choices"]]
    assert "".join(e["choices"][0]["text"] for e in chunks) == "Once upon"
    assert status == 400 and error["param"] == "max_tokens"


def test_continue_final_message_ends_the_prompt_inside_it(card, processor):
    messages = [*HELLO, {"role": "assistant", "content": "Once upon"}]

    async def scenario():
        async with echo_worker() as (engine, endpoint), frontend(card, endpoint) as client:
            body = {"model": MODEL, "messages": messages, "max_tokens": 1,
                    "continue_final_message": True}  # fmt: skip
            refused = await client.post("/v1/chat/completions", json=body)
            body["add_generation_prompt"] = False
            served = await client.post("/v1/chat/completions", json=body)
            return refused.status, await refused.json(), served.status, engine.bodies

    status, refused, served, (body,) = run(scenario)
    assert_openai_error(refused, status, 400, param="continue_final_message")
    assert served == 200
    options = RenderOptions(add_generation_prompt=False, continue_final_message=True)
    prompt = processor.render(messages, options)
    assert prompt.endswith("<|assistant|>\nOnce upon")
    assert body["token_ids"] == processor.encode_chat(prompt)


def test_add_special_tokens_follows_the_request_with_vllms_defaults(card, mocker):
    from dynamo.frontend.processors.hf_processor import HfTokenizer

    # The tiny tokenizer adds no special tokens either way: the flag the tokenizer got is the
    # observable (a spy: the real tokenizer still encodes).
    encode = mocker.spy(HfTokenizer, "encode")

    async def scenario():
        async with echo_worker() as (engine, endpoint), frontend(card, endpoint) as client:
            for extra in ({}, {"add_special_tokens": True}):
                await client.post("/v1/chat/completions", json=chat(1, **extra))
            for extra in ({}, {"add_special_tokens": False}):
                body = {"model": MODEL, "prompt": "hi", "max_tokens": 1, **extra}
                await client.post("/v1/completions", json=body)
            return len(engine.bodies)

    assert run(scenario) == 4
    flags = [call.kwargs["add_special_tokens"] for call in encode.call_args_list]
    assert flags == [False, True, True, False]


def test_truncate_prompt_tokens_keeps_the_side_asked_as_vllm_does(card):
    ids = list(range(10, 30))
    context = card.context_length
    long_ids = [5] * (context + 10)
    cases = [
        ({"truncate_prompt_tokens": 5}, ids, ids[-5:]),
        ({"truncate_prompt_tokens": 5, "truncation_side": "left"}, ids, ids[-5:]),
        ({"truncate_prompt_tokens": 5, "truncation_side": "right"}, ids, ids[:5]),
        ({"truncate_prompt_tokens": 50}, ids, ids),
        ({"truncate_prompt_tokens": -1}, long_ids, long_ids[: context - 1]),
    ]

    async def scenario():
        async with echo_worker() as (engine, endpoint), frontend(card, endpoint) as client:
            for extra, prompt, _ in cases:
                body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, **extra}
                response = await client.post("/v1/completions", json=body)
                assert response.status == 200, await response.text()
            over = await client.post("/v1/completions", json={
                "model": MODEL, "prompt": ids, "truncate_prompt_tokens": context})  # fmt: skip
            return engine.bodies, over.status, await over.json()

    bodies, status, over = run(scenario)
    assert [body["token_ids"] for body in bodies] == [kept for _, _, kept in cases]
    assert_openai_error(over, status, 400, param="truncate_prompt_tokens")


def test_allowed_token_ids_and_bad_words_reach_the_worker_only_when_set(card):
    async def scenario():
        async with echo_worker() as (engine, endpoint), frontend(card, endpoint) as client:
            for extra in ({}, {"allowed_token_ids": [], "bad_words": []},
                          {"allowed_token_ids": [5, 7], "bad_words": ["snow", "ice"]}):  # fmt: skip
                body = {"model": MODEL, "prompt": "hi", "max_tokens": 1, **extra}
                response = await client.post("/v1/completions", json=body)
                assert response.status == 200, await response.text()
            return [body["sampling"] for body in engine.bodies]

    plain, empty, steered = run(scenario)
    assert not {"allowed_token_ids", "bad_words"} & (set(plain) | set(empty))
    assert steered["allowed_token_ids"] == [5, 7] and steered["bad_words"] == ["snow", "ice"]


@pytest.mark.parametrize(
    "name, value, param",
    [("allowed_token_ids", [1, 10**9], "allowed_token_ids[1]"),
     ("allowed_token_ids", ["1"], "allowed_token_ids[0]"),
     ("bad_words", [""], "bad_words[0]"), ("bad_words", "snow", "bad_words"),
     ("logit_bias", {"x": 1}, "logit_bias.x"), ("logit_bias", {"5": "1"}, "logit_bias"),
     ("logit_bias", {"-1": 1}, "logit_bias"), ("logit_bias", {"5": True}, "logit_bias"),
     ("logit_bias", {"1000000000": 1}, "logit_bias"),
     ("logit_bias", {str(i): 1 for i in range(1025)}, "logit_bias"),
     ("stop_token_ids", ["1"], "stop_token_ids[0]"), ("stop_token_ids", [-1], "stop_token_ids[0]"),
     ("stop_token_ids", 5, "stop_token_ids"), ("stop_token_ids", [1] * 65, "stop_token_ids"),
     ("stop_token_ids", [1, 10**9], "stop_token_ids[1]")],
)  # fmt: skip
def test_bad_token_id_fields_are_400_naming_them(card, name, value, param):
    async def scenario():
        async with echo_worker() as (engine, endpoint), frontend(card, endpoint) as client:
            response = await client.post(
                "/v1/completions", json={"model": MODEL, "prompt": "hi", name: value}
            )
            return response.status, await response.json(), engine.bodies

    status, body, bodies = run(scenario)
    assert_openai_error(body, status, 400, param=param)
    assert bodies == []


def test_chat_completion_returns_the_engines_tokens_decoded_by_the_models_tokenizer(
    card, processor
):
    async def scenario():
        async with echo_worker() as (_, endpoint), frontend(card, endpoint) as client:
            response = await client.post(
                "/v1/chat/completions", json=chat(max_tokens=40, ignore_eos=True)
            )
            eos = await client.post("/v1/chat/completions", json=chat(max_tokens=40))
            return response.status, await response.json(), await eos.json()

    status, body, eos = run(scenario)
    assert status == 200
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    assert body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": echoed(processor, HELLO, 40)}
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": len(prompt_ids(processor)),
        "completion_tokens": 40,
        "total_tokens": len(prompt_ids(processor)) + 40,
    }
    # Without ignore_eos the echo reaches the template's EOS: "stop", EOS counted, not shown.
    ids = prompt_ids(processor)
    upto = ids.index(card.eos_token_ids[0]) + 1
    assert eos["choices"][0]["finish_reason"] == "stop"
    assert eos["choices"][0]["message"]["content"] == processor.tokenizer.decode(ids[:upto])
    assert eos["usage"]["completion_tokens"] == upto


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 8])
def test_multi_byte_text_streams_byte_exact_whatever_the_chunking(card, processor, chunk):
    output = processor.encode_completion(MULTI_BYTE)

    async def scenario():
        async with (
            echo_worker(output=output, chunk=chunk) as (_, endpoint),
            frontend(card, endpoint) as client,
        ):
            streamed = await client.post(
                "/v1/chat/completions", json=chat(len(output), stream=True)
            )
            whole = await client.post("/v1/completions", json={
                "model": MODEL, "prompt": "x", "max_tokens": len(output)})  # fmt: skip
            return await sse_events(streamed), await whole.json()

    events, whole = run(scenario)
    pieces = streamed_pieces(events)
    assert "".join(pieces) == MULTI_BYTE
    assert not any("\ufffd" in piece for piece in pieces)
    assert whole["choices"][0]["text"] == MULTI_BYTE


@pytest.mark.parametrize("chunk", [1, 2, 4, 7])
@pytest.mark.parametrize("stream", [True, False])
def test_a_stop_string_ends_the_completion_before_it_and_never_leaks(
    card, processor, chunk, stream
):
    text = "The quick brown fox jumps over the lazy dog."
    output = processor.encode_completion(text)

    async def scenario():
        async with (
            echo_worker(output=output, chunk=chunk, token_ms=1) as (
                engine,
                endpoint,
            ),
            frontend(card, endpoint) as client,
        ):
            response = await client.post(
                "/v1/chat/completions",
                json=chat(200, stream=stream, stop=["fox", "never"],
                          stream_options={"include_usage": True} if stream else None),
            )  # fmt: skip
            body = await sse_events(response) if stream else await response.json()

            # The frontend closed the stream: the worker stopped.
            await wait_until_async(
                lambda: engine.requests_aborted + engine.requests_finished, deadline_s=30
            )
            return body, engine.requests_aborted

    body, aborted = run(scenario)
    if stream:
        pieces = streamed_pieces(body)
        assert "".join(pieces) == "The quick brown "
        assert not any("f" in piece for piece in pieces)  # not even the start of "fox"
        finish = [e for e in body if isinstance(e, dict) and e["choices"]][-1]
        assert finish["choices"][0]["finish_reason"] == "stop"
        assert finish["choices"][0]["stop_reason"] == "fox"  # vLLM's: the stop string found
        usage = body[-2]["usage"]
    else:
        assert body["choices"][0]["message"]["content"] == "The quick brown "
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["choices"][0]["stop_reason"] == "fox"
        usage = body["usage"]
    # The model's tokens up to the one that completed "fox".
    upto = len(processor.encode_completion("The quick brown fox"))
    assert usage["completion_tokens"] == upto
    assert aborted == 1


def test_streaming_sends_chunks_then_usage_then_done(card, processor):
    async def scenario():
        async with echo_worker() as (_, endpoint), frontend(card, endpoint) as client:
            response = await client.post(
                "/v1/chat/completions",
                json=chat(
                    max_tokens=30,
                    stream=True,
                    stream_options={"include_usage": True},
                    ignore_eos=True,
                ),  # fmt: skip
            )
            return response.status, response.headers["Content-Type"], await sse_events(response)

    status, content_type, events = run(scenario)
    assert status == 200 and content_type.startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert streamed_text(events) == echoed(processor, HELLO, 30)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 30


def test_completions_take_text_or_token_ids(card, processor):
    async def scenario():
        async with echo_worker() as (engine, endpoint), frontend(card, endpoint) as client:
            text = await client.post(
                "/v1/completions", json={"model": MODEL, "prompt": "Hello world", "max_tokens": 4}
            )
            ids = await client.post(
                "/v1/completions", json={"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 3}
            )
            listed = await client.post(
                "/v1/completions", json={"model": MODEL, "prompt": ["Hi"], "max_tokens": 2}
            )
            streamed = await client.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": "Hello", "max_tokens": 3, "stream": True},
            )
            return (
                await text.json(), await ids.json(), await listed.json(),
                await sse_events(streamed), engine.bodies,
            )  # fmt: skip

    text, ids, listed, events, bodies = run(scenario)
    assert text["object"] == "text_completion" and text["id"].startswith("cmpl-")
    assert bodies[0]["token_ids"] == processor.encode_completion("Hello world")
    assert text["choices"][0]["text"] == processor.tokenizer.decode(
        cycled(bodies[0]["token_ids"], 4)
    )
    assert text["choices"][0]["finish_reason"] == "length"
    assert bodies[1]["token_ids"] == [5, 6, 7] and ids["usage"]["prompt_tokens"] == 3
    assert bodies[2]["token_ids"] == processor.encode_completion("Hi")
    assert events[-1] == "[DONE]" and all(e["object"] == "text_completion" for e in events[:-1])
    hello = processor.encode_completion("Hello")
    assert streamed_text(events) == processor.tokenizer.decode(cycled(hello, 3))


def test_a_token_id_outside_the_vocabulary_is_a_400_naming_the_prompt(card, processor):
    largest = processor.tokenizer.max_token_id
    assert largest == max(processor.tokenizer._tokenizer.get_vocab(with_added_tokens=True).values())

    async def scenario():
        async with echo_worker() as (engine, endpoint), frontend(card, endpoint) as client:
            results = []
            for ids in ([5, largest + 1, 7], [999_999], [largest]):
                response = await client.post(
                    "/v1/completions", json={"model": MODEL, "prompt": ids, "max_tokens": 2}
                )
                results.append((response.status, await response.json()))
            return results, engine.bodies

    (first, huge, edge), bodies = run(scenario)
    for (status, body), bad in ((first, largest + 1), (huge, 999_999)):
        assert status == 400
        error = assert_openai_error(body, param="prompt")
        assert error["message"].startswith(f"Token id {bad} is out of vocabulary")
    assert edge[0] == 200  # the largest id is in the vocabulary
    assert [b["token_ids"] for b in bodies] == [[largest]]  # the refused ones reached no worker


def test_the_context_length_bounds_prompt_and_completion(card, processor):
    context = card.context_length
    prompt_len = len(prompt_ids(processor))

    async def scenario():
        async with echo_worker() as (engine, endpoint), frontend(card, endpoint) as client:
            results = {}
            long_prompt = {"model": MODEL, "prompt": list(range(3, 3 + context))}
            results["prompt"] = await client.post("/v1/completions", json=long_prompt)
            results["sum"] = await client.post(
                "/v1/chat/completions", json=chat(max_tokens=context - prompt_len + 1)
            )
            results["completion_field"] = await client.post(
                "/v1/chat/completions",
                json={**chat(None), "max_completion_tokens": context, "max_tokens": 1},
            )
            results["min_tokens"] = await client.post(
                "/v1/chat/completions", json=chat(max_tokens=3, min_tokens=4)
            )
            results["fits"] = await client.post(
                "/v1/chat/completions", json=chat(max_tokens=context - prompt_len)
            )
            results["absent"] = await client.post(
                "/v1/chat/completions", json=chat(None, ignore_eos=True)
            )
            out = {k: (r.status, await r.json()) for k, r in results.items()}
            return out, [b["sampling"]["max_tokens"] for b in engine.bodies]

    results, sent_max_tokens = run(scenario)
    status, body = results["prompt"]
    error = assert_openai_error(body, param="prompt")
    assert status == 400 and error["code"] == "context_length_exceeded"
    assert f"maximum context length is {context} tokens" in error["message"]
    assert f"contains {context} input tokens" in error["message"]
    status, body = results["sum"]
    assert status == 400 and assert_openai_error(body, param="max_tokens")
    assert f"requested {context + 1} tokens" in body["error"]["message"]
    status, body = results["completion_field"]  # the newer name wins, and is named
    assert status == 400 and assert_openai_error(body, param="max_completion_tokens")
    assert results["min_tokens"][0] == 400
    assert assert_openai_error(results["min_tokens"][1], param="min_tokens")
    assert results["fits"][0] == 200 and results["absent"][0] == 200
    # Absent max_tokens: what is left of the context.
    assert sent_max_tokens == [context - prompt_len, context - prompt_len]
    assert results["absent"][1]["usage"]["completion_tokens"] == context - prompt_len


def test_a_model_without_a_chat_template_is_400_for_chat_and_serves_completions(tmp_path):
    directory = build_tiny_tokenizer(tmp_path / "plain", chat_template=False)
    card = tiny_card(directory, MODEL)

    async def scenario():
        async with echo_worker() as (_, endpoint), frontend(card, endpoint) as client:
            chat_response = await client.post("/v1/chat/completions", json=chat())
            completion = await client.post(
                "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}
            )
            return (chat_response.status, await chat_response.json()), completion.status

    (status, body), completion_status = run(scenario)
    assert status == 400
    error = assert_openai_error(body, param="messages")
    assert error["code"] == "no_chat_template" and "no chat template" in error["message"]
    assert completion_status == 200


def test_a_template_that_raises_is_a_400_with_its_message(tiny_tokenizer_dir, tmp_path):
    template = tmp_path / "strict.jinja"
    template.write_text(
        "{% if messages[0].role != 'system' %}{{ raise_exception('a system message comes "
        "first') }}{% endif %}ok",
        encoding="utf-8",
    )
    card = tiny_card(tiny_tokenizer_dir, MODEL, chat_template_path=str(template))

    async def scenario():
        async with echo_worker() as (engine, endpoint), frontend(card, endpoint) as client:
            response = await client.post("/v1/chat/completions", json=chat())
            return response.status, await response.json(), engine.requests_started

    status, body, started = run(scenario)
    assert status == 400 and started == 0
    error = assert_openai_error(body, param="messages")
    assert "a system message comes first" in error["message"]


def test_a_template_that_raises_a_megabyte_gets_a_bounded_escaped_400(tiny_tokenizer_dir, tmp_path):
    # The template is a peer's: what it raises reaches the client bounded and escaped, never
    # megabytes of text it computed (nor a forged line).
    template = tmp_path / "loud.jinja"
    template.write_text("{{ raise_exception('x\\n' + 'y' * 1000000) }}", encoding="utf-8")
    card = tiny_card(tiny_tokenizer_dir, MODEL, chat_template_path=str(template))

    async def scenario():
        async with echo_worker() as (engine, endpoint), frontend(card, endpoint) as client:
            response = await client.post("/v1/chat/completions", json=chat())
            return response.status, await response.json()

    status, body = run(scenario)
    assert status == 400
    message = assert_openai_error(body, param="messages")["message"]
    assert len(message) < 1000 and "more)" in message
    assert "\n" not in message and "x\\n" in message


def templated_prompts(tiny_tokenizer_dir, tmp_path, template_text, cases, bad_fields):
    """Each case's chat (its extra fields) through the frontend to a worker, with the model's
    template ``template_text``: the ids each prompt reached the worker as (checked against the
    case's expected prompt), then the status and body of a chat with ``bad_fields``."""
    template = tmp_path / "variables.jinja"
    template.write_text(template_text, encoding="utf-8")
    card = tiny_card(tiny_tokenizer_dir, MODEL, chat_template_path=str(template))
    processor = build_chat_processor(card)

    async def scenario():
        async with echo_worker() as (engine, endpoint), frontend(card, endpoint) as client:
            for extra, _ in cases:
                response = await client.post("/v1/chat/completions", json=chat(2, **extra))
                assert response.status == 200, await response.text()
            bad = await client.post("/v1/chat/completions", json=chat(2, **bad_fields))
            return engine.bodies, bad.status, await bad.json()

    bodies, status, bad = run(scenario)
    for body, (_, prompt) in zip(bodies, cases, strict=True):
        assert body["token_ids"] == processor.encode_chat(prompt.replace("<s>", BOS))
    return status, bad


def test_add_generation_prompt_chat_template_kwargs_and_tools_reach_the_template(
    tiny_tokenizer_dir, tmp_path
):
    template = (
        "{% for doc in documents or [] %}[{{ doc.title }}]{% endfor %}"
        "{% for tool in tools or [] %}{{ tool.function.name }}:{{ tool.function.parameters "
        "| tojson }};{% endfor %}{{ messages[0].content }}|{{ greeting | default('none') }}|"
        "{{ bos_token }}{% if add_generation_prompt %}|GEN{% endif %}"
    )
    cases = [
        ({}, "héllo|none|<s>|GEN"),
        ({"add_generation_prompt": False}, "héllo|none|<s>"),
        ({"chat_template_kwargs": {"greeting": "hi", "bos_token": "B"}}, "héllo|hi|B|GEN"),
        ({"chat_template_kwargs": {}, "add_generation_prompt": True}, "héllo|none|<s>|GEN"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"a": 1}}}],
             "tool_choice": "none"},
            'f:{"a": 1};héllo|none|<s>|GEN',
        ),
        ({"documents": [{"title": "T1", "text": "x"}, {"title": "T2"}]},
         "[T1][T2]héllo|none|<s>|GEN"),
    ]  # fmt: skip
    bad_fields = {"chat_template_kwargs": {"greeting": "x", "tools": [{"a": 1}]}}
    status, bad = templated_prompts(tiny_tokenizer_dir, tmp_path, template, cases, bad_fields)
    error = assert_openai_error(bad, status, 400, param="chat_template_kwargs")
    assert "`tools`" in error["message"]


def test_reasoning_effort_reaches_the_template_with_enable_thinking_as_vllm_renders_it(
    tiny_tokenizer_dir, tmp_path
):
    template = (
        "{{ messages[0].content }}|{{ reasoning_effort | default('unset') }}|"
        "{{ enable_thinking | default('unset') }}"
    )
    cases = [
        ({}, "héllo|unset|unset"),
        ({"reasoning_effort": "low"}, "héllo|low|True"),
        ({"reasoning_effort": "none"}, "héllo|none|False"),
        # The client's enable_thinking stays; the field wins over the same template variable.
        ({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}},
         "héllo|none|True"),
        ({"reasoning_effort": "max", "chat_template_kwargs": {"reasoning_effort": "low"}},
         "héllo|max|True"),
        ({"chat_template_kwargs": {"reasoning_effort": "low"}}, "héllo|low|unset"),
    ]  # fmt: skip
    bad_fields = {"reasoning_effort": "extreme"}  # not one of vLLM's values
    status, bad = templated_prompts(tiny_tokenizer_dir, tmp_path, template, cases, bad_fields)
    error = assert_openai_error(bad, status, 400, param="reasoning_effort")
    assert "'xhigh'" in error["message"]


def test_unknown_model_is_404_model_not_found(card):
    async def scenario():
        async with echo_worker() as (_, endpoint), frontend(card, endpoint) as client:
            chat_response = await client.post("/v1/chat/completions", json=chat(model="nope"))
            completion = await client.post("/v1/completions", json={"model": "n", "prompt": "x"})
            return [(r.status, await r.json()) for r in (chat_response, completion)]

    for status, body in run(scenario):
        assert status == 404
        assert assert_openai_error(body, param="model")["code"] == "model_not_found"


def test_dead_worker_is_503_fast_in_both_modes(card):
    async def scenario():
        async with frontend(card, dead_endpoint()) as client:
            whole = await client.post("/v1/chat/completions", json=chat())
            streamed = await client.post("/v1/chat/completions", json=chat(stream=True))
            return [(r.status, await r.json()) for r in (whole, streamed)]

    for status, body in run(scenario):
        assert status == 503
        error = assert_openai_error(body)
        assert error["code"] == "worker_unavailable" and "`tiny`" in error["message"]
        # Generic: no instance, no address, no library internals.
        for internal in ("127.0.0.1", "http://", "ssl", "Connect", "unreachable"):
            assert internal not in error["message"], error


def test_a_dead_instance_fails_over_to_a_live_one(card):
    async def scenario():
        async with echo_worker() as (engine, endpoint):
            async with frontend(card, dead_endpoint(), endpoint) as client:
                statuses = []
                for _ in range(4):  # round-robin puts the dead one first every other time
                    response = await client.post("/v1/chat/completions", json=chat())
                    statuses.append(response.status)
                return statuses, engine.requests_finished

    statuses, finished = run(scenario)
    assert statuses == [200] * 4 and finished == 4


def crashing_engine(processor):
    async def generate(request: dict):
        yield {"token_ids": processor.encode_completion("ok")}
        raise RuntimeError("engine crashed")

    return generate


def test_worker_failing_mid_stream_ends_the_stream_with_an_error_event(card, processor):
    async def scenario():
        async with (
            request_plane_server(crashing_engine(processor)) as endpoint,
            frontend(card, endpoint) as client,
        ):
            streamed = await client.post("/v1/chat/completions", json=chat(stream=True))
            events = await sse_events(streamed)
            whole = await client.post("/v1/chat/completions", json=chat())
            return streamed.status, events, whole.status, await whole.json()

    stream_status, events, whole_status, whole_body = run(scenario)
    assert stream_status == 200  # headers went out before the crash
    assert events[-1] == "[DONE]"
    assert events[1]["choices"][0]["delta"]["content"] == "ok"
    error = assert_openai_error(events[-2])
    assert error["code"] == "worker_unavailable" and error["type"] == "service_unavailable_error"
    assert whole_status == 503 and assert_openai_error(whole_body)["code"] == "worker_unavailable"
    # The worker's words are for the log, not the client.
    assert "engine crashed" not in error["message"] + whole_body["error"]["message"]


def test_client_disconnect_mid_stream_aborts_the_request_in_the_worker(card):
    async def scenario():
        async with (
            echo_worker(token_ms=5.0) as (engine, endpoint),
            frontend(card, endpoint) as client,
        ):
            response = await client.post(
                "/v1/chat/completions", json=chat(max_tokens=400, stream=True)
            )
            await response.content.readline()  # the stream has started
            response.close()  # the client hangs up

            await wait_until_async(lambda: engine.requests_aborted, deadline_s=30)
            return engine.requests_aborted, engine.requests_finished

    assert run(scenario) == (1, 0)


def test_live_answers_200_in_every_phase_while_health_follows_readiness(card):
    async def scenario():
        async with echo_worker() as (_, endpoint), frontend(card, endpoint) as client:
            answers = []
            for mark in (None, lifecycle.mark_serving, lifecycle.mark_draining):
                if mark is not None:
                    mark("test")
                live = await client.get("/live")
                health = await client.get("/health")
                answers.append((live.status, await live.json(), health.status))
            return answers

    assert run(scenario) == [
        (200, {"status": "live", "phase": "starting"}, 503),
        (200, {"status": "live", "phase": "serving"}, 200),
        (200, {"status": "live", "phase": "draining"}, 503),
    ]


def test_models_health_and_aiohttp_errors_in_openai_shape(card):
    async def scenario():
        async with echo_worker() as (_, endpoint), frontend(card, endpoint) as client:
            models = await (await client.get("/v1/models")).json()
            starting = await client.get("/health")
            lifecycle.mark_serving("test")
            serving = await client.get("/health")
            wrong_method = await client.get("/v1/chat/completions")
            unknown = await client.get("/v2/nothing")
            lifecycle.mark_draining("test")
            draining = await client.post("/v1/chat/completions", json=chat())
            draining_completion = await client.post("/v1/completions", json={})
            return (
                models,
                starting.status,
                (serving.status, await serving.json()),
                (wrong_method.status, await wrong_method.json()),
                (unknown.status, await unknown.json()),
                (draining.status, await draining.json()),
                draining_completion.status,
            )

    models, starting, serving, wrong_method, unknown, draining, draining2 = run(scenario)
    assert models["object"] == "list"
    assert [(m["id"], m["object"]) for m in models["data"]] == [(MODEL, "model")]
    assert starting == 503
    assert serving == (200, {"status": "ready", "phase": "serving", "models": 1})
    assert wrong_method[0] == 405 and assert_openai_error(wrong_method[1])
    assert unknown[0] == 404 and assert_openai_error(unknown[1])["code"] == "not_found"
    assert draining[0] == 503 and assert_openai_error(draining[1])["code"] == "draining"
    assert draining2 == 503


def _frontend_lines(caplog) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name.startswith("dynamo.frontend") and r.levelno >= logging.INFO
    ]


def test_failed_requests_log_one_warning_per_cause_naming_every_instance_tried(card, caplog):
    caplog.set_level(logging.INFO)
    dead = [dead_endpoint(), dead_endpoint()]

    async def scenario():
        async with frontend(card, *dead) as client:
            caplog.clear()  # the set-up's lines (model added) are not the requests'
            for stream in (False, True, False):
                response = await client.post("/v1/chat/completions", json=chat(stream=stream))
                assert response.status == 503

    run(scenario)
    lines = [r for r in _frontend_lines(caplog) if r.levelno == logging.WARNING]
    failed = [r.getMessage() for r in lines if "POST /v1/chat/completions -> 503" in r.getMessage()]
    # Three failed requests, one cause: one line, naming both instances tried.
    assert len(failed) == 1, [r.getMessage() for r in lines]
    assert all(endpoint in failed[0] for endpoint in dead)
    # Each instance going on the bench is a WARNING of its own cause (one per interval): the
    # first names its instance; the second was held back.
    benched = [r.getMessage() for r in lines if "not routed to for" in r.getMessage()]
    assert len(benched) == 1 and dead[0] in benched[0]
    assert len(lines) == 2


def test_a_worker_failing_mid_request_logs_one_line_each_way(card, processor, caplog):
    caplog.set_level(logging.INFO)

    async def scenario():
        async with (
            request_plane_server(crashing_engine(processor)) as endpoint,
            frontend(card, endpoint) as client,
        ):
            caplog.clear()
            whole = await client.post("/v1/chat/completions", json=chat())
            streamed = await client.post("/v1/chat/completions", json=chat(stream=True))
            await sse_events(streamed)
            return whole.status

    assert run(scenario) == 503
    lines = [r.getMessage() for r in _frontend_lines(caplog)]
    assert len(lines) == 2, lines  # the whole one (middleware), the streamed one (in-band)
    assert sum("-> 503 worker_unavailable" in line for line in lines) == 1
    assert sum("failed mid-stream" in line for line in lines) == 1
    assert all("engine crashed" in line for line in lines)  # the worker's words, logged


def test_a_failover_that_succeeds_logs_the_dead_instance_once(card, caplog):
    caplog.set_level(logging.INFO)
    dead = dead_endpoint()

    async def scenario():
        async with echo_worker() as (_, endpoint), frontend(card, dead, endpoint) as client:
            # Round-robin starts at the dead instance for the first request and the third; the
            # third skips it (benched), so it is tried, and logged, once.
            return [(await client.post("/v1/chat/completions", json=chat())).status
                    for _ in range(4)]  # fmt: skip

    assert run(scenario) == [200, 200, 200, 200]
    lines = [r for r in _frontend_lines(caplog) if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and dead in lines[0].getMessage()
    assert "unavailable" in lines[0].getMessage()
    assert "not routed to for 1 s" in lines[0].getMessage()


@pytest.mark.parametrize(
    ("field", "path", "param"),
    [
        ("sampling.top_k", "/v1/chat/completions", "top_k"),
        ("sampling", "/v1/completions", None),
        ("token_ids.2", "/v1/completions", "prompt"),
        ("token_ids", "/v1/chat/completions", "messages"),
    ],
)
def test_a_prompt_or_sampling_refused_by_the_engine_is_the_clients_400_without_failover(
    card, caplog, field, path, param
):
    message = f"{field}: refused by the engine's own check"

    async def scenario():
        async with (
            refusing_worker(field, message) as (first, first_calls),
            refusing_worker(field, message) as (second, second_calls),
            frontend(card, first, second) as client,
        ):
            body = chat() if path.endswith("chat/completions") else {
                "model": MODEL, "prompt": "Hello", "max_tokens": 3,
            }  # fmt: skip
            answers = []
            for stream in (False, True):
                response = await client.post(path, json={**body, "stream": stream})
                answers.append((response.status, await response.json()))
            return answers, len(first_calls) + len(second_calls)

    with caplog.at_level(logging.INFO, logger="dynamo"):
        answers, calls = run(scenario)
    for status, body in answers:
        assert status == 400, body
        error = assert_openai_error(body, param=param)
        assert error["code"] == "invalid_value" and "refused" in error["message"]
        assert "engine's own check" not in error["message"]  # the worker's words: logged only
    assert calls == 2  # one instance per request: another would refuse it too
    assert not [r for r in caplog.records if "unavailable" in r.getMessage()]
    refusals = [r.getMessage() for r in caplog.records if "refused by a worker" in r.getMessage()]
    assert len(refusals) == 1 and message in refusals[0]  # one per interval


def test_a_worker_refusing_the_model_name_is_still_the_workers_fault(card):
    """A 400 naming ``model`` means the two ends disagree about what the worker serves: the
    next instance is tried, and with none left it is a 503, not the client's error."""

    async def scenario():
        async with (
            refusing_worker("model", "model 'x' is not served here") as (
                endpoint,
                calls,
            ),
            echo_worker() as (engine, live),
            frontend(card, endpoint, live) as client,
        ):
            statuses = [
                (await client.post("/v1/chat/completions", json=chat())).status for _ in range(2)
            ]
            return statuses, len(calls), engine.requests_finished

    statuses, refused, served = run(scenario)
    assert statuses == [200, 200] and refused == 1 and served == 2


def test_a_dead_endpoint_stays_dead_while_the_run_lasts():
    """Its port can be neither bound by anyone else nor connected to."""
    port = int(dead_endpoint().rsplit(":", 1)[1])
    with socket.socket() as other:
        with pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()

"""A differential test: vLLM's own OpenAI server and our pair (frontend + ``dynamo.vllm`` worker
on real vLLM), both on the tiny model, get the same requests through the official ``openai``
client, and their answers must agree field by field, whole and streamed (the chunks joined).

Greedy decoding (temperature 0) makes the two answers one; a seed does where sampling matters
(``n`` > 1). What differs on purpose is named in :data:`IGNORED_KEYS` (with why) and checked
by the tests named "as documented"; a field our server refuses by name is
checked to be a 400 naming it (:data:`REFUSED`). Cost: one vLLM server and one pair for the
module, the suite's CPU settings (bench_common.VLLM_ARGS), about thirty short requests a side.
"""

from __future__ import annotations

import contextlib
import math
import re
import sys
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from typing import Any

import openai
import pytest
from bench_common import OFFLINE_ENV, VLLM_ARGS
from launcher_process import LauncherProcess, free_port, wait_until

from tests.vllm.test_pair_real_model import SERVED, serving

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

START_DEADLINE_S = 360.0
LOGPROB_TOLERANCE = 1e-3  # two engines, the same weights: float noise only

# Keys whose values differ between the two servers on purpose, at any depth of the answer
# (docs/openai-fields.md lists these differences under its field rules).
IGNORED_KEYS = {
    "id",  # a fresh id per request on each server (chatcmpl-/cmpl-<uuid>)
    "created",  # each server's clock
    "system_fingerprint",  # vLLM names its build (vllm-<version>-<hash>); ours sets none
    # vLLM's disaggregation parameters (kv_transfer_params is refused by name here).
    "kv_transfer_params",
    "service_tier",  # OpenAI's, accepted without effect (vLLM answers null)
}


def _chat(content: str = "Tell me about snow and ice.") -> dict:
    return {"messages": [{"role": "user", "content": content}]}


PROMPT = {"prompt": "The quick brown fox"}
CONTINUED = {  # a chat whose answer continues the assistant's last message
    "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well,"}],
    "add_generation_prompt": False, "continue_final_message": True,
}  # fmt: skip
GREEDY = {"temperature": 0, "max_tokens": 10}
CHAT, COMPLETION = "chat", "completion"


def _case(name: str, endpoint: str, body: dict, *marks) -> Any:
    return pytest.param(endpoint, body, id=name, marks=marks)


# Every case runs whole and streamed on both servers.
CASES = [
    _case("chat-plain", CHAT, {**_chat(), **GREEDY}),
    _case("completion-plain", COMPLETION, {**PROMPT, **GREEDY}),
    _case("chat-max-tokens-1", CHAT, {**_chat(), "temperature": 0, "max_tokens": 1}),
    _case("chat-logprobs", CHAT, {**_chat(), **GREEDY, "logprobs": True, "top_logprobs": 3}),
    _case("completion-prompt-logprobs-0", COMPLETION, {**PROMPT, **GREEDY, "prompt_logprobs": 0}),
    _case("chat-return-token-ids", CHAT, {**_chat(), **GREEDY, "return_token_ids": True}),
    _case("completion-return-token-ids", COMPLETION,
          {**PROMPT, **GREEDY, "return_token_ids": True}),
    _case("completion-logprobs", COMPLETION, {**PROMPT, **GREEDY, "logprobs": 3}),
    _case("completion-echo", COMPLETION, {**PROMPT, **GREEDY, "echo": True}),
    # echo with max_tokens 0: the prompt alone, with its logprobs (evaluation harnesses score
    # prompts this way).
    _case("completion-echo-only", COMPLETION,
          {**PROMPT, "temperature": 0, "max_tokens": 0, "echo": True, "logprobs": 1}),
    _case("completion-echo-logprobs", COMPLETION,
          {**PROMPT, **GREEDY, "echo": True, "logprobs": 1}),
    _case("chat-n-seed", CHAT, {**_chat(), "temperature": 1.0, "seed": 7, "n": 3, "max_tokens": 8}),
    _case("completion-n-seed", COMPLETION,
          {**PROMPT, "temperature": 1.0, "seed": 7, "n": 2, "max_tokens": 8}),
    # The trailing id of choice 1 (seed 4) is half a character: vLLM drops it from the text.
    _case("completion-n-best-of-seed", COMPLETION,
          {**PROMPT, "temperature": 1.0, "seed": 3, "n": 2, "best_of": 2, "max_tokens": 10}),
    # echo: the last message's content first, when the answer continues its role (vLLM then
    # returns the prompt's logprobs unasked: ours when asked, see the test below).
    _case("chat-echo", CHAT, {**CONTINUED, **GREEDY, "echo": True, "prompt_logprobs": 0}),
    # Without a generation prompt the answer takes the last message's role (vLLM's rule).
    _case("chat-no-generation-prompt", CHAT, {**_chat(), **GREEDY, "add_generation_prompt": False}),
    _case("chat-continue-final-message", CHAT,
          {"messages": [{"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "Well"}],
           **GREEDY, "add_generation_prompt": False, "continue_final_message": True}),
    _case("chat-json-object", CHAT,
          {**_chat(), "temperature": 0, "max_tokens": 30,
           "response_format": {"type": "json_object"}}),
    _case("completion-sampling-seed", COMPLETION,
          {**PROMPT, "temperature": 1.0, "seed": 3, "max_tokens": 10, "top_k": 5, "top_p": 0.9,
           "min_p": 0.05, "repetition_penalty": 1.3, "presence_penalty": 0.5,
           "frequency_penalty": 0.5}),
    _case("completion-token-ids-prompt", COMPLETION, {"prompt": [5, 6, 7, 8, 9], **GREEDY}),
    _case("chat-min-tokens", CHAT, {**_chat(), **GREEDY, "min_tokens": 6}),
    _case("completion-skip-special-false", COMPLETION,
          {**PROMPT, **GREEDY, "skip_special_tokens": False}),
    _case("completion-truncate-prompt", COMPLETION,
          {**PROMPT, **GREEDY, "truncate_prompt_tokens": 3}),
    _case("chat-json-schema", CHAT, {
        **_chat("Give me a JSON object."), "temperature": 0, "max_tokens": 40,
        "response_format": {"type": "json_schema", "json_schema": {"name": "pick", "schema": {
            "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
            "additionalProperties": False}}}}),
    _case("completion-regex", COMPLETION,
          {**PROMPT, "temperature": 0, "max_tokens": 12,
           "structured_outputs": {"regex": "[ab]{3}x"}}),
    _case("chat-choice", CHAT,
          {**_chat(), "temperature": 0, "max_tokens": 12,
           "structured_outputs": {"choice": ["snow", "ice", "water"]}}),
]  # fmt: skip

# Answered whole only: vLLM's prompt_logprobs above 0 are refused when streaming (by both).
WHOLE_ONLY = [
    _case("chat-prompt-logprobs", CHAT, {**_chat(), **GREEDY, "prompt_logprobs": 2}),
    _case("completion-prompt-logprobs", COMPLETION, {**PROMPT, **GREEDY, "prompt_logprobs": 1}),
    _case("completion-prompt-logprobs-echo", COMPLETION,
          {**PROMPT, **GREEDY, "prompt_logprobs": 2, "echo": True, "logprobs": 1}),
]  # fmt: skip

# Refused by name here, answered by vLLM: (endpoint, field, value) (docs/openai-fields.md says
# why for each).
REFUSED = [
    (COMPLETION, "use_beam_search", True),
    (COMPLETION, "kv_transfer_params", {"do_remote_prefill": False}),
]

# Refused by both servers: (endpoint, body, the field our 400 names).
REFUSED_BY_BOTH = [
    pytest.param(COMPLETION, {**PROMPT, "temperature": 0, "max_tokens": 300}, "max_tokens",
                 id="max-tokens-past-the-context"),
    pytest.param(COMPLETION, {**PROMPT, "temperature": 0, "max_tokens": 0}, "max_tokens",
                 id="max-tokens-0-without-echo"),
    # vLLM's SamplingParams: "n must be 1 when using greedy sampling".
    pytest.param(CHAT, {**_chat(), **GREEDY, "n": 2}, "n", id="n-greedy"),
    pytest.param(CHAT, {**_chat(), **GREEDY, "prompt_logprobs": 1, "stream": True},
                 "prompt_logprobs", id="prompt-logprobs-streamed"),
]  # fmt: skip

# The fields the client's create() takes as arguments, by endpoint; the rest go in extra_body.
CLIENT_ARGUMENTS = {
    CHAT: {"messages", "temperature", "max_tokens", "logprobs", "top_logprobs", "n", "seed",
           "stop", "logit_bias", "response_format"},
    COMPLETION: {"prompt", "temperature", "max_tokens", "logprobs", "n", "seed", "stop",
                 "logit_bias", "echo"},
}  # fmt: skip


def call(client: openai.OpenAI, endpoint: str, body: dict, *, stream: bool) -> Any:
    """The request through the official client: the fields its signature has as arguments,
    vLLM's own in ``extra_body`` (the client sends them in the JSON body)."""
    method = client.chat.completions.create if endpoint == CHAT else client.completions.create
    known = CLIENT_ARGUMENTS[endpoint]
    kwargs = {k: v for k, v in body.items() if k in known}
    extra = {k: v for k, v in body.items() if k not in known}
    if stream:
        kwargs["stream_options"] = {"include_usage": True}
    return method(model=SERVED, stream=stream, extra_body=extra or None, **kwargs)


def whole(client: openai.OpenAI, endpoint: str, body: dict) -> dict:
    return call(client, endpoint, body, stream=False).model_dump(exclude_unset=True)


def joined(client: openai.OpenAI, endpoint: str, body: dict) -> dict:
    """A streamed answer as the whole one would be: each choice's text, logprobs and finish
    reason from its chunks, usage from the last."""
    choices: dict[int, dict] = {}
    usage = None
    for chunk in call(client, endpoint, body, stream=True):
        event = chunk.model_dump(exclude_unset=True)
        usage = event.get("usage") or usage
        for part in event.get("choices") or []:
            choice = choices.setdefault(part["index"], {"index": part["index"], "text": ""})
            delta = part.get("delta", part)
            if delta.get("role"):
                choice["role"] = delta["role"]
            choice["text"] += delta.get("content") or delta.get("text") or ""
            for key in ("finish_reason", "stop_reason"):
                if part.get(key) is not None:
                    choice[key] = part[key]
            logprobs = part.get("logprobs")
            if logprobs:
                merged = choice.setdefault("logprobs", {})
                for key, values in logprobs.items():
                    if isinstance(values, list):
                        merged.setdefault(key, []).extend(values)
    return {"choices": [choices[i] for i in sorted(choices)], "usage": usage}


def comparable(value: Any, ignored: AbstractSet[str] = IGNORED_KEYS) -> Any:
    """``value`` without the ``ignored`` keys and without keys whose value is null (the client
    reads an absent field as null too)."""
    if isinstance(value, dict):
        return {
            k: comparable(v, ignored)
            for k, v in value.items()
            if k not in ignored and v is not None
        }
    if isinstance(value, list):
        return [comparable(v, ignored) for v in value]
    return value


def differences(ours: Any, theirs: Any, path: str = "") -> Iterator[str]:
    """Each place the two answers differ (floats within :data:`LOGPROB_TOLERANCE`)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(set(ours) | set(theirs)):
            if key not in ours or key not in theirs:
                side = "vLLM" if key in theirs else "ours"
                value = theirs.get(key, ours.get(key))
                yield f"{path}.{key}: only {side} has it ({str(value)[:80]})"
            else:
                yield from differences(ours[key], theirs[key], f"{path}.{key}")
    elif isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            yield from differences(a, b, f"{path}[{index}]")
    elif isinstance(ours, float) and isinstance(theirs, float | int):
        if not (math.isclose(ours, theirs, abs_tol=LOGPROB_TOLERANCE) or ours == theirs):
            yield f"{path}: ours {ours} vLLM {theirs}"
    elif ours != theirs:
        yield f"{path}: ours {str(ours)[:120]!r} vLLM {str(theirs)[:120]!r}"


def assert_same(ours: Any, theirs: Any, ignored: AbstractSet[str] = IGNORED_KEYS) -> None:
    found = list(differences(comparable(ours, ignored), comparable(theirs, ignored)))
    assert not found, "\n".join(found)


def start_vllm_server(
    model: str, log_dir, *server_args: str, name: str = "vllm-server"
) -> tuple[LauncherProcess, str]:
    """vLLM's own OpenAI server on ``model`` (``server_args`` before the suite's CPU settings),
    loopback, started (not yet waited for: see :func:`wait_started`); and its URL."""
    port = free_port()
    argv = ["--model", model, "--served-model-name", SERVED, "--host", "127.0.0.1",
            "--port", str(port), *server_args, *VLLM_ARGS]  # fmt: skip
    server = LauncherProcess(
        name, "vllm.entrypoints.openai.api_server", argv,
        log_dir=log_dir, env=OFFLINE_ENV, python=sys.executable,
    )  # fmt: skip
    return server, f"http://127.0.0.1:{port}"


def wait_started(server: LauncherProcess) -> None:
    server.wait_for_log(r"Application startup complete", deadline_s=START_DEADLINE_S)


@contextlib.contextmanager
def vllm_openai_server(model: str, log_dir, *server_args: str) -> Iterator[str]:
    """:func:`start_vllm_server`'s server; yields its URL once it has started."""
    server, url = start_vllm_server(model, log_dir, *server_args)
    try:
        wait_started(server)
        yield url
    finally:
        server.stop(deadline_s=60)


def official_client(url: str) -> openai.OpenAI:
    """The official client on the server at ``url`` (no retries: a failure shows as it is)."""
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def vllm_server(tiny_model, tmp_path_factory) -> Iterator[str]:
    """vLLM's own OpenAI server on the tiny model, the suite's CPU settings, loopback."""
    with vllm_openai_server(tiny_model, tmp_path_factory.mktemp("vllm-server")) as url:
        yield url


@pytest.fixture(scope="module")
def clients(vllm_server, tiny_model, tmp_path_factory):
    """(ours, vLLM's): official clients on our pair and on vLLM's server."""
    with serving(tiny_model, tmp_path_factory.mktemp("conformance-pair")) as url:
        yield official_client(url), official_client(vllm_server)


def test_the_two_servers_are_on_one_model(clients):
    ours, theirs = clients
    wait_until(lambda: [m.id for m in theirs.models.list()], deadline_s=30)
    assert [m.id for m in ours.models.list()] == [m.id for m in theirs.models.list()]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(("endpoint", "body"), CASES)
def test_the_same_answer_as_vllms_server(clients, endpoint, body, stream):
    ours, theirs = clients
    answer = joined if stream else whole
    assert_same(answer(ours, endpoint, body), answer(theirs, endpoint, body))


@pytest.mark.parametrize(("endpoint", "body"), WHOLE_ONLY)
def test_the_same_whole_answer_as_vllms_server(clients, endpoint, body):
    ours, theirs = clients
    assert_same(whole(ours, endpoint, body), whole(theirs, endpoint, body))


def test_a_chats_echo_returns_the_prompts_logprobs_only_when_asked_as_documented(clients):
    """On purpose (docs/openai-fields.md, echo): vLLM's chat echo also asks its engine for the
    prompt's logprobs (top_logprobs of them) and returns them unasked; ours returns them when
    prompt_logprobs asks (the case chat-echo above), not otherwise."""
    ours, theirs = clients
    body = {**CONTINUED, **GREEDY, "echo": True}
    assert whole(theirs, CHAT, body).get("prompt_logprobs")
    assert whole(ours, CHAT, body).get("prompt_logprobs") is None


def _middle(text: str) -> str:
    return text[len(text) // 2 : len(text) // 2 + 2]


def _word(text: str) -> str:
    """A word of ``text`` (ASCII letters if it has one: its tokens are then the text's own)."""
    words = text.split()
    return next((w for w in words if w.isascii() and w.isalpha()), words[0])


# Cases built from the greedy completion (its text, its token ids), and whether vLLM's answer
# must then end on a stop: a stop string and a stop token inside it, a bias and an allow-list
# that change it, a banned word of it.
DERIVED = [
    pytest.param(lambda text, ids: {"stop": [_middle(text)]}, True, id="stop"),
    pytest.param(lambda text, ids: {"stop": [_middle(text)], "include_stop_str_in_output": True},
                 True, id="stop-included"),
    pytest.param(lambda text, ids: {"stop_token_ids": [ids[len(ids) // 2]]}, True,
                 id="stop-token-ids"),
    pytest.param(lambda text, ids: {"logit_bias": {str(ids[0] + 1): 100}}, False,
                 id="logit-bias"),
    pytest.param(lambda text, ids: {"allowed_token_ids": [ids[-1], ids[-1] + 1, ids[-1] + 2]},
                 False, id="allowed-token-ids"),
    pytest.param(lambda text, ids: {"bad_words": [_word(text)]}, False, id="bad-words"),
]  # fmt: skip


@pytest.fixture(scope="module")
def greedy(clients) -> dict:
    """Per endpoint: the request body, vLLM's greedy text for it and the ids it generated
    (vLLM's return_token_ids: the text re-encoded need not give them back)."""
    _, theirs = clients
    found = {}
    for endpoint in (CHAT, COMPLETION):
        body = {**(_chat() if endpoint == CHAT else PROMPT), "temperature": 0, "max_tokens": 12}
        choice = whole(theirs, endpoint, {**body, "return_token_ids": True})["choices"][0]
        text = choice["message"]["content"] if endpoint == CHAT else choice["text"]
        assert choice["finish_reason"] == "length" and text.split(), choice  # room for stops
        found[endpoint] = (body, text, choice["token_ids"])
    return found


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("endpoint", [CHAT, COMPLETION])
@pytest.mark.parametrize(("control", "stops"), DERIVED)
def test_the_output_controls_give_vllms_answer(clients, greedy, control, stops, endpoint, stream):
    ours, theirs = clients
    base, text, ids = greedy[endpoint]
    body = {**base, **control(text, ids)}
    answer = joined if stream else whole
    expected = answer(theirs, endpoint, body)
    assert (expected["choices"][0]["finish_reason"] == "stop") == stops, expected
    assert_same(answer(ours, endpoint, body), expected)


@pytest.mark.parametrize(("endpoint", "field", "value"), REFUSED)
def test_a_field_we_refuse_is_a_400_naming_it_where_vllm_answers(clients, endpoint, field, value):
    ours, theirs = clients
    body = {**(_chat() if endpoint == CHAT else PROMPT), **GREEDY, field: value}
    whole(theirs, endpoint, body)  # vLLM takes it
    with pytest.raises(openai.BadRequestError) as raised:
        whole(ours, endpoint, body)
    error = raised.value.body
    assert isinstance(error, dict) and error.get("param") == field, error
    assert re.search(rf"\b{field}\b", error["message"]), error


@pytest.mark.parametrize(("endpoint", "body", "field"), REFUSED_BY_BOTH)
def test_what_vllm_refuses_is_a_400_naming_the_field(clients, endpoint, body, field):
    ours, theirs = clients
    body = dict(body)
    stream = body.pop("stream", False)
    with pytest.raises(openai.BadRequestError):
        call(theirs, endpoint, body, stream=stream)
    with pytest.raises(openai.BadRequestError) as raised:
        call(ours, endpoint, body, stream=stream)
    error = raised.value.body
    assert isinstance(error, dict) and error.get("param") == field, error


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETION])
def test_the_finish_reason_rides_the_last_tokens_chunk_as_in_vllm(clients, endpoint):
    """Chunk boundaries are otherwise free (the tests above join them): this is the one shape
    a client may read, the chunk that ends a choice also carrying its last text."""
    ours, theirs = clients
    body = {**(_chat() if endpoint == CHAT else PROMPT), **GREEDY}

    def last(client: openai.OpenAI) -> dict:
        chunks = [c.model_dump() for c in call(client, endpoint, body, stream=True)]
        (final,) = [c["choices"][0] for c in chunks if c["choices"] and
                    c["choices"][0]["finish_reason"]]  # fmt: skip
        return final.get("delta", final)

    assert bool(last(ours).get("content") or last(ours).get("text")) == bool(
        last(theirs).get("content") or last(theirs).get("text")
    )


def test_completions_without_max_tokens_run_past_vllms_16_as_documented(clients):
    """On purpose (docs/openai-fields.md, max_tokens): unset, our completions may use the rest
    of the context, where vLLM's completions stop at 16 tokens (its chat does as we do)."""
    ours, theirs = clients
    body = {**PROMPT, "temperature": 0, "ignore_eos": True}
    assert whole(theirs, COMPLETION, body)["usage"]["completion_tokens"] == 16
    assert whole(ours, COMPLETION, body)["usage"]["completion_tokens"] > 16

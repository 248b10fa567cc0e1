"""The official ``openai`` client against the pair on loopback (real frontend, real mock worker):
what clients send is served, what they parse parses, and a refused field is the client's
``BadRequestError`` naming it.

The frontend runs with ``--dyn-strict-request-fields``: the client's ordinary requests must
carry no field this server does not know, and an unknown one (``extra_body``) is refused.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import openai
import pytest

from tests.support.pair import CLIENT_TIMEOUT_S, expected_completion
from tests.support.processes import listening_url, run_python, start_frontend, start_worker

pytestmark = pytest.mark.integration

MODEL = "openai-client-mock"
README = Path(__file__).resolve().parents[2] / "README.md"
README_URL, README_MODEL = "http://127.0.0.1:8000/v1", "icebox-mock"
MESSAGES = [{"role": "user", "content": "Hello, frozen heap! ❄"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    directory = tmp_path_factory.mktemp("openai-client")
    discovery = directory / "discovery"
    worker = start_worker("worker", directory, discovery, MODEL, mock_token_ms=1)
    frontend = start_frontend("frontend", directory, discovery, "--dyn-strict-request-fields")
    try:
        url = listening_url(frontend)
        frontend.wait_for_log(rf"Model added: model={MODEL} ")
        # trust_env=False: no proxy from the environment ever sees loopback traffic.
        http = openai.DefaultHttpx2Client(trust_env=False, timeout=CLIENT_TIMEOUT_S)
        with openai.OpenAI(
            base_url=url + "/v1", api_key="unused", http_client=http, max_retries=0
        ) as api:
            yield api
    finally:
        codes = {"frontend": frontend.stop(), "worker": worker.stop()}
        assert codes == {"frontend": 0, "worker": 0}, (codes, frontend.log())


def test_models_lists_the_model(client):
    assert [model.id for model in client.models.list()] == [MODEL]


def test_chat_completion_parses_with_the_engines_answer(client):
    completion = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24)
    text, finish, tokens = expected_completion(
        {"model": MODEL, "messages": MESSAGES, "max_tokens": 24}
    )
    (choice,) = completion.choices
    assert choice.message.role == "assistant" and choice.message.content == text
    assert choice.finish_reason == finish and completion.model == MODEL
    assert completion.usage is not None and completion.usage.completion_tokens == tokens


def test_streamed_chat_completion_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    expected, finish, tokens = expected_completion(
        {"model": MODEL, "messages": MESSAGES, "max_tokens": 24}
    )
    assert text == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == finish
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == tokens


def test_text_completion(client):
    completion = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8)
    (choice,) = completion.choices
    assert isinstance(choice.text, str) and completion.usage is not None


def test_sampling_fields_the_client_sends_are_served(client):
    completion = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_completion_tokens=8,
        temperature=0.5,
        top_p=0.9,
        seed=7,
        presence_penalty=0.1,
        frequency_penalty=0.1,
        stop=["zzz"],
        n=1,
        logprobs=False,  # vLLM's default: asks for nothing, so it is served
        user="someone",
        extra_body={
            "top_k": 5,
            "min_p": 0.1,
            "repetition_penalty": 1.1,
            "min_tokens": 1,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
        },
    )
    assert completion.choices[0].message.content is not None


def test_reasoning_effort_is_served_and_a_value_vllm_lacks_is_a_bad_request_naming_it(client):
    # The tiny model's template reads neither reasoning_effort nor enable_thinking: same answer.
    # (That they reach a template that reads them: the unit and the vllm-marked tests.)
    completion = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, reasoning_effort="low"
    )
    text, _, _ = expected_completion({"model": MODEL, "messages": MESSAGES, "max_tokens": 8})
    assert completion.choices[0].message.content == text
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=4, extra_body={"reasoning_effort": "lots"}
        )
    assert raised.value.status_code == 400 and raised.value.param == "reasoning_effort"


def test_include_reasoning_false_is_served_whole_and_streamed(client):
    # The mock pair parses no reasoning: the answer is all content, as without the field
    # (its dropping is the unit tests' and the vllm-marked suite's).
    text, _, _ = expected_completion({"model": MODEL, "messages": MESSAGES, "max_tokens": 8})
    body = {"include_reasoning": False}
    whole = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, extra_body=body
    )
    assert whole.choices[0].message.content == text
    streamed = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, stream=True, extra_body=body
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text


def test_return_token_ids_reach_the_client_whole_and_streamed(client):
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 8}
    text, _, _ = expected_completion(body)
    extra = {"return_token_ids": True, "return_prompt_text": True}
    whole = client.chat.completions.create(**body, extra_body=extra)
    prompt_ids, prompt_text = (
        whole.model_extra["prompt_token_ids"],
        whole.model_extra["prompt_text"],
    )
    assert prompt_ids and MESSAGES[0]["content"] in prompt_text
    ids = whole.choices[0].model_extra["token_ids"]
    assert len(ids) == whole.usage.completion_tokens and whole.choices[0].message.content == text
    chunks = [c for c in client.chat.completions.create(**body, stream=True, extra_body=extra)]
    assert chunks[0].model_extra["prompt_token_ids"] == prompt_ids
    streamed = [
        i for c in chunks if c.choices for i in c.choices[0].model_extra.get("token_ids", [])
    ]
    assert streamed == ids
    completion = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=4, extra_body={"return_token_ids": True}
    )
    choice = completion.choices[0].model_extra
    assert (
        choice["prompt_token_ids"]
        and len(choice["token_ids"]) == completion.usage.completion_tokens
    )


def test_a_chats_echo_reaches_the_client_first_whole_and_streamed(client):
    messages = [*MESSAGES, {"role": "assistant", "content": "Frozen"}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 6}
    plain = client.chat.completions.create(**body).choices[0].message.content
    echo = {"echo": True}
    whole = client.chat.completions.create(**body, extra_body=echo).choices[0].message.content
    assert whole == "Frozen" + plain
    streamed = client.chat.completions.create(**body, stream=True, extra_body=echo)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == whole


def test_n_choices_reach_the_client_indexed_whole_and_streamed(client):
    completion = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, n=2, seed=3
    )
    assert [choice.index for choice in completion.choices] == [0, 1]
    assert completion.usage is not None and completion.usage.completion_tokens <= 8
    streamed = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, n=2, stream=True
    )
    finished = sorted(c.choices[0].index for c in streamed if c.choices[0].finish_reason)
    assert finished == [0, 1]


@pytest.mark.parametrize(
    "kwargs, param",
    [
        # The mock engine has no distribution: the worker refuses it, naming the field.
        ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),  # vLLM's max_logprobs
        ({"extra_body": {"prompt_logprobs": 0}}, "prompt_logprobs"),
        ({"n": 17}, "n"),  # at most 16 choices
        # The mock engine does not sample: a constraint is refused by name (vLLM applies it).
        ({"response_format": {"type": "json_object"}}, "response_format"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {}},
                }
            },
            "response_format",
        ),
        ({"extra_body": {"structured_outputs": {"choice": ["a", "b"]}}}, "structured_outputs"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
            "tool_choice",
        ),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                "tool_choice": "required",
            },
            "tool_choice",
        ),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        # Tools reach the template, but their calls are not parsed yet: auto is refused.
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
            "tool_choice",
        ),
        ({"extra_body": {"use_beam_search": True}}, "use_beam_search"),
        ({"extra_body": {"not_a_field": 1}}, "not_a_field"),  # strict mode: unknown refused
    ],
)
def test_a_refused_field_is_a_bad_request_naming_it(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, **kwargs)
    error = raised.value
    assert error.status_code == 400 and error.param == param, error.body
    assert param in str(error.message)


@pytest.mark.parametrize(
    "extra_body, param",
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"structured_outputs": {"regex": "[0-9]+"}}, "structured_outputs"),
        ({"response_format": {"type": "structural_tag", "format": {}}}, "response_format"),
    ],
)
def test_a_completions_constraint_the_mock_cannot_apply_is_a_bad_request_naming_it(
    client, extra_body, param
):
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, extra_body=extra_body)
    assert raised.value.status_code == 400 and raised.value.param == param, raised.value.body


def test_the_readmes_openai_example_runs_and_prints_what_it_says(client):
    (block,) = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert README_URL in block and f'"{README_MODEL}"' in block
    code = block.replace(README_URL, str(client.base_url).rstrip("/")).replace(
        f'"{README_MODEL}"', f'"{MODEL}"'
    )
    # The example's client reads proxies from the environment: none here (loopback only).
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    done = run_python("-c", code, env=env, timeout_s=60)
    assert done.returncode == 0, done.stderr
    expected, _, _ = expected_completion(
        {"model": MODEL, "messages": [{"role": "user", "content": "Hello! ❄"}],
         "max_tokens": 16, "stop": ["!"]}
    )  # fmt: skip
    assert done.stdout == expected + "\n" == "<|user|>\nHello\n"
    # What the README's comment says it prints: <|user|>, a newline, Hello.
    assert "# prints <|user|>, then Hello on the next line" in block

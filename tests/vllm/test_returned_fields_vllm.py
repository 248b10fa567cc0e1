"""vLLM's own request fields the frontend applies, on the real engine (the tiny model, greedy):
``return_token_ids`` (the prompt's ids are the ones vLLM was given, the generated ids decode to
the text), and ``reasoning_effort`` reaching the chat template (the worker's ``--chat-template``
prints the variables it sees, so the prompt's ids and text show them)."""

from __future__ import annotations

import pytest

from tests.vllm.test_logprobs_vllm import GREEDY, stream
from tests.vllm.test_pair_real_model import post, serving, tiny_processor

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "[effort={{ reasoning_effort | default('unset') }} "
    "thinking={{ enable_thinking | default('unset') }}]\nassistant:"
)
MESSAGES = [{"role": "user", "content": "Tell me about snow and ice."}]


@pytest.fixture(scope="module")
def effort_pair(tiny_model, tmp_path_factory):
    directory = tmp_path_factory.mktemp("effort-pair")
    template = directory / "effort.jinja"
    template.write_text(TEMPLATE, encoding="utf-8")
    with serving(tiny_model, directory, "--chat-template", str(template)) as url:
        yield url, tiny_model


def test_reasoning_effort_reaches_the_template_and_the_ids_are_vllms(effort_pair):
    url, model = effort_pair
    processor = tiny_processor(model)
    body = {**GREEDY, "messages": MESSAGES, "return_token_ids": True, "return_prompt_text": True}
    answers = {}
    for effort, shown in [
        (None, "[effort=unset thinking=unset]"),
        ("low", "[effort=low thinking=True]"),
        ("none", "[effort=none thinking=False]"),
    ]:
        fields = {} if effort is None else {"reasoning_effort": effort}
        answer = answers[effort] = post(url + "/v1/chat/completions", {**body, **fields})
        assert shown in answer["prompt_text"]
        assert answer["prompt_token_ids"] == processor.encode_chat(answer["prompt_text"])
        choice = answer["choices"][0]
        assert len(choice["token_ids"]) == answer["usage"]["completion_tokens"] == 10
        assert processor.tokenizer.decode(choice["token_ids"]) == choice["message"]["content"]
    streamed = stream(url + "/v1/chat/completions", {**body, "reasoning_effort": "low"})
    ids = [i for choice in streamed for i in choice.get("token_ids", [])]
    assert ids == answers["low"]["choices"][0]["token_ids"]  # greedy: the same answer

"""The differential test of tests/vllm/test_vllm_conformance.py for reasoning and tool calls:
vLLM's own server started as a reasoning model with tools is served (``--reasoning-parser qwen3
--tool-call-parser hermes --enable-auto-tool-choice``, a reasoning-style chat template that closes
the thinking in the prompt when ``enable_thinking`` is false, as Qwen3's does), and our pair on
the same model (the worker with ``--dyn-reasoning-parser qwen3 --dyn-tool-call-parser hermes`` and
vLLM's own ``--reasoning-parser``, the frontend with ``--dyn-chat-processor vllm``) get the same
requests through the official ``openai`` client; the answers must agree field by field, whole
and streamed (the reasoning, the content and the calls joined from the chunks).

The tiny model's random weights never write ``<think>`` or ``<tool_call>`` by themselves: the
synthetic outputs are forced by the engine on both sides alike (a regex that writes the
markers, the structural tag vLLM forces a call with). Both servers run the grammar from the
first token (``--structured-outputs-config`` ``enable_in_reasoning``), so that a grammar forces
the markers whether the reasoning parser is in its thinking phase or not; that takes the
question of where a grammar starts out of these cases, which the thinking model below answers.

Deliberate differences, listed here with their reasons:

* ``usage.completion_tokens_details`` (vLLM counts the reasoning's tokens there when a reasoning
  parser is set): ours reports no details; see :data:`IGNORED_KEYS`.

A model whose greedy output reasons before it calls (tests/support/thinking_model.py: the tiny
model's recipe with its weights set to write ``<think> the weather is sunny</think>``, then the
shortest call a grammar admits) shows forced calls after reasoning (issue 37): both servers with
their defaults (the grammar waits for the reasoning to end), ours given only the worker's
``--dyn-reasoning-parser``, ``tool_choice`` required and named, thinking or told not to think,
``include_reasoning`` false (vLLM's server then starts the grammar at the first token, and so
does ours), a ``response_format`` after the reasoning, whole and streamed alike
(:class:`TestForcedCallsAfterReasoning`).

What these cases do not show, and where it is shown instead:

* A call's arguments streamed piece by piece: streamed answers are compared joined here; the
  pieces are checked in tests/vllm/test_frontend_vllm_parsers.py.
* ``tool_choice`` auto without a constraint: the tiny model never writes ``<tool_call>`` by
  itself, so ``auto-plain`` and ``auto-one-call`` compare text only, though the second sends
  the worker vLLM's one-call structural tag (asserted in test_frontend_vllm_parsers.py).
* The ``sglang`` processor's forced calls after reasoning (no SGLang server runs here: SGLang's
  answer is the reference there): tests/sglang/test_sglang_forced_calls_vllm.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.thinking_model import REASONING
from tests.vllm.test_pair_real_model import serving
from tests.vllm.test_vllm_conformance import (
    CHAT,
    call,
    official_client,
    start_vllm_server,
    vllm_openai_server,
    wait_started,
)
from tests.vllm.test_vllm_conformance import IGNORED_KEYS as BASE_IGNORED
from tests.vllm.test_vllm_conformance import assert_same as base_assert_same

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

IGNORED_KEYS = BASE_IGNORED | {
    # vLLM's reasoning-token count (see the module docstring): not reported by ours.
    "completion_tokens_details",
}
# A reasoning-style template: the tools as JSON, each message on its role's line, and the
# thinking closed in the prompt when the client turns it off (Qwen3's rule).
TEMPLATE = (
    "{%- if tools %}<|tools|>{{ tools | map(attribute='function') | map(attribute='name') "
    "| join(',') }}\n{% endif %}"
    "{%- for m in messages %}<|{{ m['role'] }}|>{{ m['content'] or '' }}\n{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{%- endif %}{%- endif %}"
)
IN_REASONING = json.dumps({"enable_in_reasoning": True})
SHARED_ARGS = ["--reasoning-parser", "qwen3", "--structured-outputs-config", IN_REASONING]

WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
CHAT_BODY = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "temperature": 0}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
# The markers written by the engine (a regex): reasoning, then content.
THOUGHT = {"structured_outputs": {"regex": "<think>[a-z]{2,8}</think>[a-z ]{2,12}"}}
CALL_REGEX = {"structured_outputs": {"regex": (
    r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[a-z]{1,6}"\}\}\n</tool_call>'
)}}  # fmt: skip
# Thinking, then a hermes call.
THOUGHT_CALL = {
    "structured_outputs": {
        "regex": "<think>[a-z]{2,8}</think>" + CALL_REGEX["structured_outputs"]["regex"]
    }
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
# A structural tag of the client's own (structured_outputs.structural_tag): JSON in a tag.
TAG = {"structured_outputs": {"structural_tag": json.dumps({
    "type": "structural_tag", "format": {"type": "tag", "begin": "<a>", "end": "</a>",
    "content": {"type": "json_schema", "json_schema": {"type": "integer"}}}})}}  # fmt: skip


def _case(name: str, body: dict) -> Any:
    return pytest.param({**CHAT_BODY, **body}, id=name)


CASES = [
    # Thinking (the default): what the random model writes is the reasoning's.
    _case("thinking-plain", {"max_tokens": 8}),
    _case("thinking-markers", {**THOUGHT, "max_tokens": 30}),
    _case("thinking-markers-include-reasoning-false",
          {**THOUGHT, "max_tokens": 30, "include_reasoning": False}),
    # Told not to think (chat_template_kwargs, or reasoning_effort none): the reasoning parser
    # is given the template's variables, as vLLM's server gives them, and parses no thinking.
    _case("not-thinking-markers", {**THOUGHT, **NO_THINKING, "max_tokens": 30}),
    _case("reasoning-effort-none", {**THOUGHT, "reasoning_effort": "none", "max_tokens": 30}),
    # A hermes call written by the engine, tool_choice none: text, not a call.
    _case("tools-none", {**CALL_REGEX, **NO_THINKING, "tools": [WEATHER],
                         "tool_choice": "none", "max_tokens": 120}),
    # Forced calls: vLLM's structural tag (free JSON arguments), parsed after the reasoning.
    _case("required", {**NO_THINKING, "tools": [WEATHER], "tool_choice": "required",
                       "max_tokens": 120}),
    _case("named", {**NO_THINKING, "tools": [WEATHER], "tool_choice": NAMED, "max_tokens": 120}),
    _case("required-thinking", {"tools": [WEATHER], "tool_choice": "required",
                                "max_tokens": 120}),
    _case("required-one-call", {**NO_THINKING, "tools": [WEATHER], "tool_choice": "required",
                                "parallel_tool_calls": False, "max_tokens": 120}),
    _case("structural-tag", {**TAG, **NO_THINKING, "max_tokens": 12}),
    # tool_choice auto (the default with tools): a call the model writes is parsed; with
    # parallel_tool_calls false vLLM's parser constrains it to one (a triggered structural
    # tag); a constraint of the client's stands alone (hermes joins none into it).
    _case("auto-plain", {**NO_THINKING, "tools": [WEATHER], "max_tokens": 12}),
    _case("auto-call", {**CALL_REGEX, **NO_THINKING, "tools": [WEATHER], "max_tokens": 120}),
    _case("auto-thinking-call", {**THOUGHT_CALL, "tools": [WEATHER], "max_tokens": 150}),
    _case("auto-one-call", {**NO_THINKING, "tools": [WEATHER], "parallel_tool_calls": False,
                            "max_tokens": 12}),
    _case("auto-one-call-regex", {**CALL_REGEX, **NO_THINKING, "tools": [WEATHER],
                                  "parallel_tool_calls": False, "max_tokens": 120}),
]  # fmt: skip


def whole(client: openai.OpenAI, body: dict) -> dict:
    answer = call(client, CHAT, body, stream=False).model_dump(exclude_unset=True)
    for choice in answer["choices"]:
        for item in choice["message"].get("tool_calls") or ():
            item.pop("id", None)  # a fresh id per call on each server
    return answer


def joined(client: openai.OpenAI, body: dict) -> dict:
    """A streamed answer as the whole one would be: each choice's role, content, reasoning
    and calls (a call's deltas joined by index, as a client joins them), its finish reason;
    usage from the last chunk."""
    choices: dict[int, dict] = {}
    usage = None
    for chunk in call(client, CHAT, body, stream=True):
        event = chunk.model_dump(exclude_unset=True)
        usage = event.get("usage") or usage
        for part in event.get("choices") or []:
            choice = choices.setdefault(part["index"], {"index": part["index"], "calls": {}})
            delta = part.get("delta") or {}
            for key in ("role", "content", "reasoning", "reasoning_content"):
                if delta.get(key):
                    choice[key] = choice.get(key, "") + delta[key] if key != "role" else delta[key]
            for piece in delta.get("tool_calls") or ():
                into = choice["calls"].setdefault(piece["index"], {"name": "", "arguments": ""})
                if piece.get("type"):
                    into["type"] = piece["type"]
                function = piece.get("function") or {}
                into["name"] += function.get("name") or ""
                into["arguments"] += function.get("arguments") or ""
            if part.get("finish_reason") is not None:
                choice["finish_reason"] = part["finish_reason"]
    return {"choices": [choices[i] for i in sorted(choices)], "usage": usage}


def assert_same(ours: Any, theirs: Any) -> None:
    base_assert_same(ours, theirs, IGNORED_KEYS)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("reasoning-template") / "template.jinja"
    path.write_text(TEMPLATE, encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def vllm_server(tiny_model, template, tmp_path_factory) -> Iterator[str]:
    with vllm_openai_server(
        tiny_model, tmp_path_factory.mktemp("vllm-reasoning-server"),
        "--chat-template", template, "--tool-call-parser", "hermes",
        "--enable-auto-tool-choice", *SHARED_ARGS,
    ) as url:  # fmt: skip
        yield url


@pytest.fixture(scope="module")
def clients(vllm_server, tiny_model, template, tmp_path_factory):
    """(ours, vLLM's): official clients on our pair and on vLLM's server."""
    with serving(
        tiny_model, tmp_path_factory.mktemp("reasoning-pair"), "--chat-template", template,
        "--dyn-tool-call-parser", "hermes", "--dyn-reasoning-parser", "qwen3", *SHARED_ARGS,
        frontend_args=("--dyn-chat-processor", "vllm"),
    ) as url:  # fmt: skip
        yield official_client(url), official_client(vllm_server)


SCHEMA_ANSWER = {"response_format": {"type": "json_schema", "json_schema": {
    "name": "weather", "schema": {"type": "object",
                                  "properties": {"sky": {"type": "string"}}}}}}  # fmt: skip


def _thinking_case(name: str, body: dict) -> Any:
    return pytest.param({**CHAT_BODY, "max_tokens": 60, **body}, id=name)


THINKING_CASES = [
    _thinking_case("required", {"tools": [WEATHER], "tool_choice": "required"}),
    _thinking_case("named", {"tools": [WEATHER], "tool_choice": NAMED}),
    _thinking_case("required-one-call", {"tools": [WEATHER], "tool_choice": "required",
                                         "parallel_tool_calls": False}),
    _thinking_case("required-not-thinking",
                   {**NO_THINKING, "tools": [WEATHER], "tool_choice": "required"}),
    _thinking_case("named-not-thinking", {**NO_THINKING, "tools": [WEATHER], "tool_choice": NAMED}),
    _thinking_case("required-include-reasoning-false",
                   {"tools": [WEATHER], "tool_choice": "required", "include_reasoning": False}),
    _thinking_case("response-format", SCHEMA_ANSWER),
]  # fmt: skip


@pytest.fixture(scope="class")
def thinking_clients(thinking_model, tmp_path_factory):
    """(ours, vLLM's) on the thinking model (see :class:`TestForcedCallsAfterReasoning`); vLLM's
    server starts while our pair does."""
    server, server_url = start_vllm_server(
        thinking_model, tmp_path_factory.mktemp("vllm-thinking-server"),
        "--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--reasoning-parser", "qwen3",
        name="vllm-thinking-server",
    )  # fmt: skip
    try:
        with serving(
            thinking_model, tmp_path_factory.mktemp("thinking-pair"),
            "--dyn-tool-call-parser", "hermes", "--dyn-reasoning-parser", "qwen3",
            frontend_args=("--dyn-chat-processor", "vllm"),
        ) as url:  # fmt: skip
            wait_started(server)
            yield official_client(url), official_client(server_url)
    finally:
        server.stop(deadline_s=60)


class TestForcedCallsAfterReasoning:
    """``vllm serve --reasoning-parser qwen3 --tool-call-parser hermes --enable-auto-tool-choice``
    and our pair (the worker with ``--dyn-reasoning-parser qwen3 --dyn-tool-call-parser
    hermes`` and nothing of vLLM's reasoning flags, the frontend with ``--dyn-chat-processor
    vllm``) on the thinking model. First in the module, so its two engines are stopped before
    the others start (class-scoped)."""

    @pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
    @pytest.mark.parametrize("body", THINKING_CASES)
    def test_the_same_answer_as_vllms_server(self, thinking_clients, body, stream):
        ours, theirs = thinking_clients
        answer = joined if stream else whole
        assert_same(answer(ours, body), answer(theirs, body))

    def test_vllms_answers_reason_then_call(self, thinking_clients):
        """The cases above compare what they are for: vLLM's server answers the model's
        reasoning, then the call, and the call alone where the grammar starts at once."""
        _, theirs = thinking_clients
        tools = {"tools": [WEATHER], "tool_choice": "required"}
        for body, reasoning in [
            (tools, REASONING),
            ({**tools, **NO_THINKING}, None),
            ({**tools, "include_reasoning": False}, None),
        ]:
            answer = whole(theirs, {**CHAT_BODY, "max_tokens": 60, **body})
            message = answer["choices"][0]["message"]
            assert message.get("reasoning") == reasoning, answer
            calls = [(c["function"]["name"], c["function"]["arguments"])
                     for c in message["tool_calls"]]  # fmt: skip
            assert calls == [("get_weather", "{}")], answer
        answer = whole(theirs, {**CHAT_BODY, "max_tokens": 60, **SCHEMA_ANSWER})
        message = answer["choices"][0]["message"]
        assert message.get("reasoning") == REASONING and json.loads(message["content"]) == {}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("body", CASES)
def test_the_same_reasoning_and_calls_as_vllms_server(clients, body, stream):
    ours, theirs = clients
    answer = joined if stream else whole
    assert_same(answer(ours, body), answer(theirs, body))


def test_the_synthetic_outputs_exercise_the_parsers(clients):
    """The cases above compare something: vLLM's own answers carry reasoning, content without
    it when told not to think, and forced calls."""
    _, theirs = clients
    thinking = whole(theirs, {**CHAT_BODY, **THOUGHT, "max_tokens": 30})["choices"][0]
    assert thinking["message"].get("reasoning") and thinking["message"].get("content")
    told_not_to = whole(theirs, {**CHAT_BODY, **THOUGHT, **NO_THINKING, "max_tokens": 30})
    assert not told_not_to["choices"][0]["message"].get("reasoning")
    forced = whole(theirs, {**CHAT_BODY, **NO_THINKING, "tools": [WEATHER],
                            "tool_choice": "required", "max_tokens": 120})  # fmt: skip
    assert forced["choices"][0]["message"].get("tool_calls"), forced
    auto = whole(theirs, {**CHAT_BODY, **THOUGHT_CALL, "tools": [WEATHER], "max_tokens": 150})
    message = auto["choices"][0]["message"]
    assert message.get("reasoning") and message.get("tool_calls"), auto

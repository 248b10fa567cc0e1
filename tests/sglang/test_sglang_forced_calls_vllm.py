"""Forced tool calls on a reasoning model through ``--dyn-chat-processor sglang`` (issue 37), as
SGLang answers them: its grammar backend holds a forced call's JSON schema back until the
think-end token when the request requires reasoning, else applies it from the first token; its
reasoning parser then takes the reasoning and its JSON array parser the calls.

The real thing on both ends: this (SGLang) environment's frontend, and a worker on the real vLLM
engine from the vLLM environment (``.venv-vllm``; the worker's ``--dyn-reasoning-parser qwen3``
makes its engine's structured outputs wait for the reasoning when told to), serving the tiny
model built to reason before it calls (tests/support/thinking_model.py). The model's output is
known, so the answers are: the reasoning, then the call, for a thinking request; the call alone
when the request turns thinking off (its grammar starts at once). Without the vLLM environment
this is skipped with the set-up command (``DYNAMO_REQUIRE_VLLM=1``, CI: an error).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.pair import request, stream_events
from tests.support.processes import LISTENING_LINE, listening_url, start_frontend, start_worker
from tests.support.thinking_model import REASONING, build_with

pytestmark = [pytest.mark.sglang, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
MODEL = "thinker"
START_DEADLINE_S = 360.0
WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
NAMED = {"type": "function", "function": {"name": "get_weather"}}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def vllm_python() -> str:
    if VLLM_PYTHON.exists():
        return str(VLLM_PYTHON)
    reason = f"needs the vLLM environment ({VLLM_PYTHON}): scripts/setup_vllm_env.sh"
    if os.environ.get("DYNAMO_REQUIRE_VLLM") == "1":
        pytest.fail(f"DYNAMO_REQUIRE_VLLM=1 but this test {reason}")
    pytest.skip(reason)


@dataclass(frozen=True)
class Pair:
    url: str
    model: Path  # the thinking model's directory


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    python = vllm_python()
    directory = tmp_path_factory.mktemp("sglang-thinking")
    model = Path(build_with(python, directory / "model"))
    worker = start_worker(
        "worker", directory, directory / "discovery", MODEL,
        "--dyn-reasoning-parser", "qwen3", "--dyn-tool-call-parser", "hermes",
        vllm_model=str(model), python=python,
    )  # fmt: skip
    frontend = start_frontend(
        "frontend", directory, directory / "discovery", "--dyn-chat-processor", "sglang"
    )
    try:
        url = listening_url(frontend, LISTENING_LINE, deadline_s=START_DEADLINE_S)
        frontend.wait_for_log(r"Model added: model=" + MODEL, deadline_s=START_DEADLINE_S)
        yield Pair(url, model)
    finally:
        frontend.stop()
        worker.stop(deadline_s=60)


def answer(url: str, body: dict, stream: bool) -> tuple[str | None, list[tuple[str, str]], str]:
    """(reasoning_content, calls as (name, arguments), finish_reason), whole or streamed."""
    full = {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "temperature": 0, "max_tokens": 60, "tools": [WEATHER], **body}  # fmt: skip
    if not stream:
        status, reply = request("POST", url + "/v1/chat/completions", full)
        assert status == 200, reply
        message = reply["choices"][0]["message"]
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
        return message.get("reasoning_content"), calls, reply["choices"][0]["finish_reason"]
    events = list(stream_events(url, {**full, "stream": True}))
    deltas = [e["choices"][0] for e in events if isinstance(e, dict) and e.get("choices")]
    reasoning = "".join(d["delta"].get("reasoning_content") or "" for d in deltas) or None
    pieces = [c for d in deltas for c in d["delta"].get("tool_calls") or ()]
    joined: dict[int, list[str]] = {}
    for piece in pieces:
        into = joined.setdefault(piece["index"], ["", ""])
        into[0] += piece["function"].get("name") or ""
        into[1] += piece["function"].get("arguments") or ""
    finish = next(d["finish_reason"] for d in reversed(deltas) if d.get("finish_reason"))
    return reasoning, [(joined[i][0], joined[i][1]) for i in sorted(joined)], finish


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "not-thinking"])
def test_a_forced_call_comes_after_the_reasoning_as_sglang_answers_it(
    pair, choice, thinking, stream
):
    body = {"tool_choice": choice, **({} if thinking else NO_THINKING)}
    reasoning, calls, finish = answer(pair.url, body, stream)
    assert reasoning == (REASONING if thinking else None)
    assert [(name, json.loads(arguments)) for name, arguments in calls] == [("get_weather", {})]
    assert finish == "tool_calls"


def test_the_frontend_decides_where_the_grammar_starts_by_sglangs_rule(pair):
    """What the answers above rest on, in the frontend's own factory: a thinking request's
    grammar waits for the reasoning (False: not ended), one that turns thinking off starts at
    once, and so does any without a reasoning parser."""
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    from dynamo.frontend.parsing.output_parser import ParserRequest
    from dynamo.frontend.processors.sglang_parsers import SglangOutputParsers

    tokenizer = get_tokenizer(str(pair.model))
    template = (pair.model / "chat_template.jinja").read_text()
    parsers = SglangOutputParsers(tokenizer, template, "hermes", "qwen3")
    assert parsers.reasoning_ended(ParserRequest(tools=[WEATHER], tool_choice="required")) is False
    off = ParserRequest(tools=[WEATHER], tool_choice="required", fields=NO_THINKING)
    assert parsers.reasoning_ended(off) is True
    assert SglangOutputParsers(tokenizer, template, "hermes", None).reasoning_ended(off) is True

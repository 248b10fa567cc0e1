"""A template's output is bounded where it is used (issue 37): ``{{ 'a' * 2000000 }}`` stays
within the render processes' bound, and the frontend then tokenized it on the threads every
model shares. Now a prompt longer than its model's context could hold is a 400 before it is
tokenized, and what does get tokenized is shared fairly: while one model's template emits
prompts that take seconds to tokenize, another model's requests are answered before any of
them (asserted in order of answers, not in seconds)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from dynamo.frontend.openai.prompt_budget import MAX_CHARS_PER_TOKEN
from dynamo.frontend.processors.chat_processor import build_chat_processor
from dynamo.frontend.processors.hf_processor import HfTokenizer
from dynamo.frontend.processors.preprocessing import (
    HEAVY_PROMPT_CHARS,
    PREPROCESS_THREADS,
    Preprocessing,
)
from dynamo.frontend.processors.template_sandbox import TemplateSandbox
from dynamo.frontend.routing.model_registry import ModelRegistry
from tests.support import wait_until_async
from tests.support.frontend_fakes import echo_worker, frontend, record
from tests.support.tiny_model import tiny_card

ONE = [{"role": "user", "content": "hi"}]
DEADLINE_S = 300.0


def template_card(tokenizer_dir, tmp_path, name: str, source: str, **fields):
    path = tmp_path / f"{name}.jinja"
    path.write_text(source, encoding="utf-8")
    return tiny_card(tokenizer_dir, name, chat_template_path=str(path), **fields)


@pytest.mark.parametrize("processes", [2, 0], ids=["render processes", "threads"])
def test_a_prompt_longer_than_the_context_could_hold_is_a_400_before_tokenizing(
    tiny_tokenizer_dir, tmp_path, mocker, processes
):
    card = template_card(tiny_tokenizer_dir, tmp_path, "huge", "{{ 'a' * 2000000 }}")
    limit = card.context_length * MAX_CHARS_PER_TOKEN
    encode = mocker.spy(HfTokenizer, "encode")
    sandbox = None
    if processes:
        sandbox = TemplateSandbox(processes, timeout_s=30.0, memory_mb=256)
        sandbox.start()

    async def scenario():
        async with echo_worker() as (_, endpoint):
            async with frontend(card, endpoint, template_sandbox=sandbox) as client:
                chat = await client.post(
                    "/v1/chat/completions", json={"model": "huge", "messages": ONE}
                )
                text = await client.post(
                    "/v1/completions", json={"model": "huge", "prompt": "b" * (limit + 1)}
                )
                fits = await client.post(
                    "/v1/completions", json={"model": "huge", "prompt": "b" * 100, "max_tokens": 1}
                )
                return (
                    (chat.status, await chat.json()),
                    (text.status, await text.json()),
                    fits.status,
                )

    try:
        (status, chat), (text_status, text), fits = asyncio.run(
            asyncio.wait_for(scenario(), DEADLINE_S)
        )
    finally:
        if sandbox is not None:
            sandbox.close()
    assert status == 400 and chat["error"]["code"] == "context_length_exceeded", chat
    assert chat["error"]["param"] == "messages"
    message = chat["error"]["message"]
    assert "the model's chat template renders from your messages is 2000000 characters" in message
    assert text_status == 400 and text["error"]["param"] == "prompt", text
    assert fits == 200
    assert encode.call_count == 1  # the prompt that fits only


def test_one_models_huge_prompts_do_not_hold_up_another_models_requests(
    tiny_tokenizer_dir, tmp_path, mocker
):
    """A hostile model with a long context, whose template renders half a million characters
    from "hi" (seconds each to tokenize here, and within the context's bound): six of its
    requests at once. A healthy model's requests are answered while every one of them is still
    being tokenized: heavy prompts share all but one of the tokenizing threads."""
    hostile = template_card(
        tiny_tokenizer_dir, tmp_path, "hostile", "{{ 'a' * 500000 }}", context_length=1 << 17
    )
    healthy = template_card(tiny_tokenizer_dir, tmp_path, "healthy", "{{ messages[0].content }}")
    sandbox = TemplateSandbox(2, timeout_s=30.0, memory_mb=256)
    sandbox.start()
    huge_prompts_tokenizing: list[int] = []  # one entry per huge prompt the tokenizer has begun
    encode = HfTokenizer.encode

    def counted_encode(self, text: str, **kwargs):
        if len(text) > HEAVY_PROMPT_CHARS:
            huge_prompts_tokenizing.append(len(text))
        return encode(self, text, **kwargs)

    mocker.patch.object(HfTokenizer, "encode", counted_encode)

    async def scenario():
        async with echo_worker() as (_, endpoint):
            registry = ModelRegistry(build_chat_processor)
            for card in (hostile, healthy):
                registry.add_instance(record(card, endpoint, card.served_model_name))
            async with frontend(healthy, registry=registry, template_sandbox=sandbox) as client:

                async def ask(model: str) -> int:
                    body = {"model": model, "messages": ONE, "max_tokens": 1}
                    response = await client.post("/v1/chat/completions", json=body)
                    await response.read()
                    return response.status

                bombs = [asyncio.ensure_future(ask("hostile")) for _ in range(6)]
                # Until the tokenizer is busy with them (as many as it takes at once).
                await wait_until_async(
                    lambda: len(huge_prompts_tokenizing) >= PREPROCESS_THREADS - 1,
                    deadline_s=DEADLINE_S,
                )
                answered = [await ask("healthy") for _ in range(3)]
                bombs_done = sum(bomb.done() for bomb in bombs)
                return answered, bombs_done, await asyncio.gather(*bombs)

    try:
        answered, bombs_done, bomb_statuses = asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S))
    finally:
        sandbox.close()
    assert answered == [200, 200, 200]
    assert bombs_done == 0  # answered before any of the hostile model's requests
    assert bomb_statuses == [400] * 6  # 500000 tokens: over its context, once tokenized
    assert 500000 > HEAVY_PROMPT_CHARS


def test_the_tokenizing_share_is_the_pools_when_there_is_one():
    assert Preprocessing(None).tokenizing.slots == PREPROCESS_THREADS
    pool = SimpleNamespace(workers=3)
    assert Preprocessing(pool).tokenizing.slots == 3  # type: ignore[arg-type]

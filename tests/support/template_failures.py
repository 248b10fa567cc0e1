"""Chat templates that fail (issue 37), through the real HTTP service, shared by the ``hf`` tests
and the ``vllm`` and ``sglang`` processors' tests in their own environments: each failing
template is the model's 502 ``chat_template_failed`` and a template's own ``raise_exception``
the client's 400 ``chat_template_error``, with render processes and without, for every
processor; never a 500, never a traceback, one log line per cause."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

from dynamo.frontend.processors.chat_processor import build_chat_processor
from dynamo.frontend.processors.template_sandbox import TemplateSandbox
from dynamo.frontend.routing.model_registry import ModelRegistry
from dynamo.runtime.model_card import ModelCard
from tests.support.frontend_fakes import echo_worker, frontend, record

# Each template and what its 502 names: the issue's, and what the sandbox forbids.
FAILING = {
    "surrogate": ("{{ 'x\\ud800y' }}", "lone surrogate (U+D800)"),
    "percent-c": ("{{ '%c' % 56320 }}", "lone surrogate (U+DC00)"),
    "range": ("{% for i in range(10**9) %}{% endfor %}x", "OverflowError"),
    "division": ("{{ 1 // 0 }}", "ZeroDivisionError"),
    "truncate": ("{{ 'abc' | truncate(-5) }}", "AssertionError"),
    "power": ("{{ 10.0 ** 400 }}", "OverflowError"),
    "escape": ("{{ messages.__class__.__mro__ }}", "SecurityError"),
    "undefined": ("{{ messages[0].missing.deeper }}", "UndefinedError"),
}
REFUSING = "{{ raise_exception('this model takes one user message') }}"
ONE = [{"role": "user", "content": "hi"}]
DEADLINE_S = 120.0


def model_card(tokenizer_dir: str | Path, name: str, template_path: Path) -> ModelCard:
    return ModelCard(
        served_model_name=name,
        model_path=str(tokenizer_dir),
        tokenizer_path=str(tokenizer_dir),
        context_length=256,
        eos_token_ids=(1,),
        chat_template_path=str(template_path),
    )


def template_answers(
    tokenizer_dir: str | Path, tmp_path: Path, kind: str, *, processes: int, repeat: int = 1
) -> dict[str, list[tuple[int, dict]]]:
    """Every template of :data:`FAILING` and :data:`REFUSING` (as ``refusing``) as a model of
    the ``kind`` processor, each sent ``repeat`` chats through the real service, rendered in
    ``processes`` render processes (0: on the service's threads): the answers by model."""
    templates = {name: source for name, (source, _) in FAILING.items()}
    templates["refusing"] = REFUSING
    cards = []
    for name, source in templates.items():
        path = tmp_path / f"{name}.jinja"
        path.write_text(source, encoding="utf-8")
        cards.append(model_card(tokenizer_dir, name, path))
    sandbox = None
    if processes:
        sandbox = TemplateSandbox(processes, timeout_s=30.0, memory_mb=256)
        sandbox.start()

    async def scenario() -> dict[str, list[tuple[int, dict]]]:
        check = None if sandbox is None else sandbox.check_compiles
        factory = functools.partial(build_chat_processor, kind=kind, template_check=check)
        async with echo_worker() as (_, endpoint):
            registry = ModelRegistry(factory)
            for card in cards:
                registry.add_instance(record(card, endpoint, card.served_model_name))
            await registry.wait_idle()
            assert {entry.name for entry in registry.entries()} == set(templates)
            async with frontend(cards[0], registry=registry, template_sandbox=sandbox) as client:
                answers: dict[str, list[tuple[int, Any]]] = {}
                for name in templates:
                    for _ in range(repeat):
                        body = {"model": name, "messages": ONE, "max_tokens": 2}
                        response = await client.post("/v1/chat/completions", json=body)
                        answers.setdefault(name, []).append(
                            (response.status, await response.json())
                        )
                return answers

    try:
        return asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S))
    finally:
        if sandbox is not None:
            sandbox.close()


def check_template_answers(answers: dict[str, list[tuple[int, dict]]], log: str) -> None:
    """The issue's contract for :func:`template_answers`: a 502 naming the model and what its
    template failed with, a 400 quoting a refusal, no traceback and one log line per cause."""
    for name, (_, failure) in FAILING.items():
        for status, body in answers[name]:
            error = body["error"]
            assert (status, error["code"], error["type"]) == (
                502,
                "chat_template_failed",
                "server_error",
            ), (name, body)
            assert f"model `{name}` failed rendering these messages" in error["message"], body
            assert failure in error["message"], (name, body)
    for status, body in answers["refusing"]:
        assert (status, body["error"]["code"]) == (400, "chat_template_error"), body
        assert "this model takes one user message" in body["error"]["message"]
    assert "Traceback" not in log and "internal error" not in log
    # The service logs a 5xx once per (status, code) a minute, whichever model caused it.
    assert log.count("-> 502 chat_template_failed") == 1, log

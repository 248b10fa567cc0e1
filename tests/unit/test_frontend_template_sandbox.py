"""A peer's chat template is code the frontend runs, bounded (issue 29): the real service with
the real template render processes, and the issue's bombs as models' templates beside a healthy
model. Each bomb is a 503 in the OpenAI shape naming the model (never the template's text), one
rate-limited WARNING per cause, the model served on for requests that fit, and the healthy model
answers while the bombs are still running."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from dynamo.frontend.processors.chat_processor import ModelFilesError, build_chat_processor
from dynamo.frontend.processors.template_sandbox import TemplateSandbox
from dynamo.frontend.routing.model_registry import ModelRegistry
from tests.support.frontend_fakes import echo_worker, frontend, record
from tests.support.template_bombs import started_sandbox
from tests.support.tiny_model import tiny_card

# Each bomb goes off only for a conversation of two messages or more: one message fits.
FITS = "[{{ messages[0].content }}]"
BOMBS = {
    # Folded while compiling, before the fix: ~230 MB at registration.
    "folding": "{{ ('a' * 250000000) | length if messages|length > 1 else '' }}" + FITS,
    "conversation": (
        "{% if messages|length > 1 %}{% set x = 'a' * (messages|length * 300000000) %}"
        "{{ x|length }}{% endif %}" + FITS
    ),
    "loops": (
        "{% if messages|length > 1 %}{% for i in range(100000) %}{% for j in range(100000) %}"
        "{% endfor %}{% endfor %}{% endif %}" + FITS
    ),
    # Under the value bound each time, over the memory bound in all.
    "memory": (
        "{% if messages|length > 1 %}{% set ns = namespace(x=[]) %}{% for i in range(100000) %}"
        "{% set ns.x = ns.x + ['a' * 1000000 ~ i] %}{% endfor %}{% endif %}" + FITS
    ),
}
ONE = [{"role": "user", "content": "hi"}]
TWO = [*ONE, {"role": "user", "content": "again"}]
TIMEOUT_S = 3.0
DEADLINE_S = 120.0


@pytest.fixture
def sandbox():
    with started_sandbox(timeout_s=TIMEOUT_S) as sandbox:
        yield sandbox


def body(model: str, messages) -> dict:
    return {"model": model, "messages": messages, "max_tokens": 2}


async def post(client, model: str, messages) -> tuple[int, dict]:
    response = await client.post("/v1/chat/completions", json=body(model, messages))
    return response.status, await response.json()


def _cards(tokenizer_dir, tmp_path, templates: dict[str, str]) -> dict:
    """A model card per name, each with its template written to a file of its own."""
    cards = {}
    for name, source in templates.items():
        path = tmp_path / f"{name}.jinja"
        path.write_text(source, encoding="utf-8")
        cards[name] = tiny_card(tokenizer_dir, name, chat_template_path=str(path))
    return cards


@contextlib.asynccontextmanager
async def serving_cards(cards: dict, sandbox: TemplateSandbox):
    """(registry, client): a frontend on ``sandbox`` in front of one echo worker that serves every
    card of ``cards`` (each registered and built before the frontend starts; ``healthy`` is the
    frontend's own)."""
    async with echo_worker() as (_, endpoint):
        registry = ModelRegistry(build_chat_processor)
        for card in cards.values():
            registry.add_instance(record(card, endpoint, card.served_model_name))
        await registry.wait_idle()
        async with frontend(
            cards["healthy"], registry=registry, template_sandbox=sandbox
        ) as client:
            yield registry, client


def test_template_bombs_are_bounded_and_isolated(tiny_tokenizer_dir, tmp_path, sandbox, caplog):
    caplog.set_level(logging.INFO)
    cards = _cards(tiny_tokenizer_dir, tmp_path, {"healthy": FITS, **BOMBS})

    async def scenario():
        async with serving_cards(cards, sandbox) as (registry, client):
            assert {e.name for e in registry.entries()} == set(cards)  # every bomb registered
            answers = {name: await post(client, name, TWO) for name in BOMBS if name != "loops"}
            # The loops bomb six times at once; the healthy model answers meanwhile.
            bombs = [asyncio.ensure_future(post(client, "loops", TWO)) for _ in range(6)]
            healthy = await post(client, "healthy", TWO)
            bombs_running = not all(bomb.done() for bomb in bombs)
            answers["loops"] = (await asyncio.gather(*bombs))[0]
            loops_all = [status for status, _ in await asyncio.gather(*bombs)]
            # Every model is still served for a conversation that fits.
            fits = {name: (await post(client, name, ONE))[0] for name in cards}
            return answers, healthy, bombs_running, loops_all, fits

    answers, healthy, bombs_running, loops_all, fits = asyncio.run(
        asyncio.wait_for(scenario(), DEADLINE_S)
    )
    assert healthy[0] == 200 and bombs_running
    assert set(loops_all) == {503}
    for name, (status, answer) in answers.items():
        assert status == 503, (name, answer)
        error = answer["error"]
        assert error["code"] == "chat_template_limit" and f"`{name}`" in error["message"]
        assert "range" not in error["message"] and "300000000" not in error["message"]
    assert fits == dict.fromkeys(cards, 200)
    assert sandbox.replaced >= 2  # the loops' and the memory's processes
    warnings = [r.getMessage() for r in caplog.records if r.name.endswith("template_sandbox")]
    assert warnings and all(line.startswith("Chat template of model ") for line in warnings)
    # One line per cause per minute: value (folding, conversation), timeout, busy, memory.
    assert len(warnings) <= 4, warnings


def test_a_template_that_raises_is_still_the_clients_400(tiny_tokenizer_dir, tmp_path, sandbox):
    path = tmp_path / "strict.jinja"
    path.write_text("{{ raise_exception('only one message') if messages|length > 1 }}" + FITS)
    card = tiny_card(tiny_tokenizer_dir, "strict", chat_template_path=str(path))

    async def scenario():
        async with echo_worker() as (_, endpoint):
            async with frontend(card, endpoint, template_sandbox=sandbox) as client:
                return await post(client, "strict", TWO), await post(client, "strict", ONE)

    (status, answer), (fits, _) = asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S))
    assert status == 400 and answer["error"]["code"] == "chat_template_error"
    assert "only one message" in answer["error"]["message"] and fits == 200


def test_without_render_processes_a_value_bomb_is_still_a_503_naming_the_model(
    tiny_tokenizer_dir, tmp_path, caplog
):
    """--dyn-template-processes 0: rendered on the frontend's threads, the value bound holds."""
    path = tmp_path / "conversation.jinja"
    path.write_text(BOMBS["conversation"], encoding="utf-8")
    card = tiny_card(tiny_tokenizer_dir, "conversation", chat_template_path=str(path))

    async def scenario():
        async with echo_worker() as (_, endpoint):
            async with frontend(card, endpoint) as client:
                return await post(client, "conversation", TWO), await post(
                    client, "conversation", ONE
                )

    (status, answer), (fits, _) = asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S))
    assert status == 503 and answer["error"]["code"] == "chat_template_limit"
    assert "`conversation`" in answer["error"]["message"] and fits == 200
    assert "Chat template of model conversation was stopped" in caplog.text


@pytest.mark.parametrize("sandboxed", [True, False], ids=["render processes", "threads"])
def test_a_template_recursing_without_end_is_the_models_502(
    tiny_tokenizer_dir, tmp_path, sandbox, sandboxed
):
    """Python's depth bound stops it, in a render process as on a thread: the template failed
    on messages any template should take (issue 37: the model's fault, not the client's)."""
    path = tmp_path / "recursive.jinja"
    path.write_text("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", encoding="utf-8")
    card = tiny_card(tiny_tokenizer_dir, "recursive", chat_template_path=str(path))

    async def scenario():
        async with echo_worker() as (_, endpoint):
            used = sandbox if sandboxed else None
            async with frontend(card, endpoint, template_sandbox=used) as client:
                return await post(client, "recursive", ONE)

    status, answer = asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S))
    assert status == 502 and answer["error"]["code"] == "chat_template_failed"
    assert "RecursionError" in answer["error"]["message"]
    assert sandbox.replaced == 0


def test_a_template_whose_compiling_breaks_a_bound_is_refused_at_registration(
    tiny_tokenizer_dir, tmp_path, sandbox
):
    """Jinja's compiler is costly on a hostile source (a megabyte of ``{{ x }}``: 90 s and over
    1 GB in the frontend): with render processes, a card's template compiles in one, bounded,
    before its model is served; a real template still registers. Which bound the bomb breaks
    first, time or memory, depends on the machine and the CPython version (3.15 on a loaded
    machine reached 256 MiB first): either is the refusal."""
    bomb = tmp_path / "compile.jinja"
    bomb.write_text("{{ x }}" * 140_000, encoding="utf-8")
    card = tiny_card(tiny_tokenizer_dir, "compile", chat_template_path=str(bomb))
    with pytest.raises(
        ModelFilesError, match="took over 3 s to compile|went over 256 MiB compiling"
    ):
        build_chat_processor(card, template_check=sandbox.check_compiles)
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for %}", encoding="utf-8")
    card = tiny_card(tiny_tokenizer_dir, "broken", chat_template_path=str(broken))
    with pytest.raises(ModelFilesError, match="does not compile"):
        build_chat_processor(card, template_check=sandbox.check_compiles)
    good = tmp_path / "good.jinja"
    good.write_text(FITS, encoding="utf-8")
    card = tiny_card(tiny_tokenizer_dir, "good", chat_template_path=str(good))
    assert build_chat_processor(card, template_check=sandbox.check_compiles).template is not None


def test_many_hostile_models_leave_a_process_to_the_others(tiny_tokenizer_dir, tmp_path):
    """A peer may register many models with slow templates: once each has breached a bound, they
    share all but one process between them, so every other model keeps one."""
    sandbox = TemplateSandbox(3, timeout_s=TIMEOUT_S, memory_mb=256)
    sandbox.start()
    loops = {f"loops{i}": BOMBS["loops"] for i in range(3)}
    cards = _cards(tiny_tokenizer_dir, tmp_path, {"healthy": FITS, **loops})

    async def scenario():
        async with serving_cards(cards, sandbox) as (_, client):
            first = await post(client, "healthy", TWO)
            # Each hostile model's first slow render makes it a suspect.
            firsts = [post(client, f"loops{i}", TWO) for i in range(3)]
            assert {status for status, _ in await asyncio.gather(*firsts)} == {503}
            bombs = [
                asyncio.ensure_future(post(client, f"loops{i}", TWO))
                for i in range(3)
                for _ in range(2)
            ]
            healthy = await post(client, "healthy", TWO)
            bombs_running = not all(bomb.done() for bomb in bombs)
            statuses = [status for status, _ in await asyncio.gather(*bombs)]
            return first[0], healthy[0], bombs_running, statuses

    try:
        first, healthy, bombs_running, statuses = asyncio.run(
            asyncio.wait_for(scenario(), DEADLINE_S)
        )
    finally:
        sandbox.close()
    assert (first, healthy) == (200, 200) and bombs_running
    assert set(statuses) == {503}


def test_two_models_with_one_template_text_render_with_their_own_special_tokens():
    """A render process keeps compiled templates by source and variables: a model whose
    template text is another's but whose ``bos_token`` differs gets its own (one process, so
    both models' renders go through the same cache)."""
    from dynamo.frontend.processors.hf_processor import HfChatTemplate, RenderOptions

    source = "{{ bos_token }}{{ messages[0].content }}"
    first = HfChatTemplate(source, {"bos_token": "<s>"}, compiled=False)
    second = HfChatTemplate(source, {"bos_token": "<|begin|>"}, compiled=False)

    async def scenario():
        return [
            await sandbox.render(model, template, ONE, RenderOptions())
            for model, template in (("a", first), ("b", second), ("a", first))
        ]

    sandbox = TemplateSandbox(1, timeout_s=TIMEOUT_S, memory_mb=256)
    sandbox.start()
    try:
        assert asyncio.run(scenario()) == ["<s>hi", "<|begin|>hi", "<s>hi"]
    finally:
        sandbox.close()

"""Every line a peer can cause is rate limited per cause (docs/security.md; issue 37, item 8):
records by the thousand, with names new for ever, and requests to a worker's request plane by
the hundred, each make a bounded number of lines, the next line in the budget counting those
held back. Budgets run on a fake clock where the code takes one (no assertion on real time).

The causes are kinds of event (a refusal for the model limit, an instance added), never a
peer's text: a budget per model name would give every new name a line of its own.
"""

from __future__ import annotations

import asyncio
import logging
import types
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from dynamo.frontend.processors import card_parsers
from dynamo.frontend.routing.model_registry import (
    CHANGE_INTERVAL_S,
    CHANGE_LINES,
    REFUSAL_INTERVAL_S,
    REFUSAL_LINES,
    ModelRegistry,
)
from dynamo.frontend.serving.http_surface import openai_errors
from dynamo.runtime.discovery import ModelRecord
from dynamo.runtime.discovery.file_store import DiscoveryStore
from dynamo.runtime.discovery.periodic import notify
from dynamo.runtime.request_plane import BadGenerateRequest, validate_generate_request
from dynamo.vllm.engine import aborted
from tests.support.clock import FakeClock
from tests.support.tiny_model import tiny_card
from tests.support.watched import TTL_S, Watched, leased

HELD_BACK = "more like it were not logged"


def lines(caplog, text: str, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level and text in r.getMessage()]


def run(scenario):
    return asyncio.run(asyncio.wait_for(scenario(), 60))


def _processor(card):
    return types.SimpleNamespace(card=card)


# --- the model registry ------------------------------------------------------------------------


def test_a_thousand_records_over_the_model_limit_are_a_few_lines_a_minute(
    tiny_tokenizer_dir, caplog
):
    """Issue 37: 1,000 records over --dyn-max-models 16 wrote 985 WARNING lines in 8 s, and
    new names repeated it for ever."""
    caplog.set_level(logging.INFO)
    clock = FakeClock()
    card = tiny_card(tiny_tokenizer_dir, "m")

    def record(name: str) -> ModelRecord:
        served = card.model_copy(update={"served_model_name": name})
        return ModelRecord(model=name, endpoint="http://127.0.0.1:1", card=served)

    async def scenario():
        registry = ModelRegistry(_processor, max_models=16, clock=clock)
        for index in range(1000):
            registry.add_instance(record(f"model-{index}"))
        await registry.wait_idle()
        first_minute = lines(caplog, "--dyn-max-models", logging.WARNING)
        clock.advance(REFUSAL_INTERVAL_S)
        registry.add_instance(record("one-more"))
        return len(registry.entries()), first_minute

    served, first_minute = run(scenario)
    assert served == 16
    assert len(first_minute) == REFUSAL_LINES
    last = lines(caplog, "--dyn-max-models", logging.WARNING)[-1]
    assert "one-more" in last and f"{1000 - 16 - REFUSAL_LINES} {HELD_BACK}" in last


@pytest.mark.parametrize("kind", ["no card", "card differs", "processor failed"])
def test_every_kind_of_refusal_is_budgeted(tiny_tokenizer_dir, caplog, kind):
    caplog.set_level(logging.INFO)
    card = tiny_card(tiny_tokenizer_dir, "m")
    other = card.model_copy(update={"context_length": 64})

    def failing(card):
        raise ValueError("broken model files")

    async def scenario():
        registry = ModelRegistry(failing if kind == "processor failed" else _processor)
        if kind == "card differs":
            registry.add_instance(ModelRecord(model="m", endpoint="http://127.0.0.1:1", card=card))
            await registry.wait_idle()
        for index in range(200):
            if kind == "no card":
                registry.add_instance(ModelRecord(model=f"m{index}", endpoint="http://h:1"))
            elif kind == "card differs":
                registry.add_instance(ModelRecord(model="m", endpoint="http://h:1", card=other))
            else:
                named = card.model_copy(update={"served_model_name": f"m{index}"})
                record = ModelRecord(model=f"m{index}", endpoint="http://h:1", card=named)
                registry.add_instance(record)
            await registry.wait_idle()

    run(scenario)
    refusals = lines(caplog, "refused", logging.WARNING)
    assert 1 <= len(refusals) <= REFUSAL_LINES, refusals


def test_instances_coming_and_going_are_a_bounded_number_of_info_lines(tiny_tokenizer_dir, caplog):
    caplog.set_level(logging.INFO)
    clock = FakeClock()
    card = tiny_card(tiny_tokenizer_dir, "m")
    records = [
        ModelRecord(model="m", endpoint=f"http://127.0.0.1:{1000 + i}", card=card)
        for i in range(300)
    ]

    async def scenario():
        registry = ModelRegistry(_processor, clock=clock)
        for _ in range(3):  # a peer's churn: the same records, again and again
            for record in records:
                registry.add_instance(record)
            await registry.wait_idle()
            for record in records:
                registry.remove_instance(record)

    run(scenario)
    for text in ("Model instance added", "Model instance removed"):
        assert len(lines(caplog, text)) <= CHANGE_LINES, text
    assert 1 <= len(lines(caplog, "Model added")) <= CHANGE_LINES
    assert CHANGE_INTERVAL_S <= REFUSAL_INTERVAL_S


def test_a_cards_parser_names_cost_a_few_lines_whatever_the_model_names(tiny_tokenizer_dir, caplog):
    card = tiny_card(tiny_tokenizer_dir, "m", tool_call_parser="no-such-parser")
    for index in range(100):
        card_parsers.warn_unparsed(card.model_copy(update={"served_model_name": f"m{index}"}), "x")
    assert 1 <= len(lines(caplog, "parses no output", logging.WARNING)) <= 5


# --- discovery ---------------------------------------------------------------------------------


def test_records_expiring_renewing_and_deleted_are_bounded_lines(tmp_path: Path, caplog):
    """A peer's records that expire, come back, expire and are deleted: each kind of line a
    few times a minute, however many records do it."""
    caplog.set_level(logging.INFO)
    store = DiscoveryStore(tmp_path)
    records = [leased(f"i{index}", port=40000 + index) for index in range(100)]
    for record in records:
        store.register(record)
    seen = Watched(tmp_path, delete_after_ttls=2.0)
    seen.poll()
    seen.clock.advance(TTL_S + 1)
    seen.poll()  # every one expires
    for record in records:
        store.renew(record)
    seen.poll()  # every one renewed after it expired
    seen.clock.advance(3 * TTL_S + 1)
    seen.poll()  # expired again
    seen.clock.advance(3 * TTL_S + 1)
    seen.poll()  # and deleted
    for text in ("expired:", "renewed after it expired", "Deleted discovery record"):
        found = lines(caplog, text)
        assert 1 <= len(found) <= 10, (text, len(found))


def test_a_failing_discovery_callback_is_one_traceback_a_minute(caplog):
    def on_add(record):
        raise RuntimeError("bug")

    async def scenario():
        for index in range(50):
            await notify(on_add, ModelRecord(model=f"m\n{index}", endpoint="http://h:1"))

    run(scenario)
    (line,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert line.exc_info and "\n" not in line.getMessage()


# --- the frontend's own failures ---------------------------------------------------------------


def test_a_bug_a_client_can_repeat_is_one_traceback_a_minute(caplog):
    async def broken(request):
        raise KeyError("a bug")

    async def scenario():
        app = web.Application(middlewares=[openai_errors()])
        app.router.add_get("/{tail:.*}", broken)
        async with TestClient(TestServer(app)) as client:
            return [(await client.get(f"/x%1B[31mforged{i}")).status for i in range(30)]

    assert run(scenario) == [500] * 30
    (line,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert line.exc_info and "\x1b" not in line.getMessage()


# --- the worker's request plane ----------------------------------------------------------------


@pytest.mark.parametrize("request_id", ["", "a\nforged", "x" * 129, "é"])
def test_a_request_id_is_a_short_plain_name(request_id):
    body = {"request_id": request_id, "model": "m", "token_ids": [1], "sampling": {}}
    with pytest.raises(BadGenerateRequest) as refused:
        validate_generate_request(body)
    assert refused.value.field == "request_id"


def test_requests_aborted_by_the_hundred_are_a_bounded_number_of_lines(caplog):
    caplog.set_level(logging.INFO)
    for index in range(200):
        aborted("Mock engine:", f"r{index}", 3)
    found = lines(caplog, "aborted after")
    assert len(found) == 10 and HELD_BACK not in found[-1]

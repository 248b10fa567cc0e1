"""How long a chat request waits for a render process (issue 29): its turn (a model uses at most
all but one process) and then a free process are one wait, of at most the render timeout, and
each way of running out of it is a 503 naming the model and its own rate-limited WARNING.

The render processes are real; what keeps them busy is the test holding them (taken from the
idle queue, and a model's turn marked taken), released on a schedule, so the waits are exactly
the ones under test."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from dynamo.frontend.processors.hf_processor import HfChatTemplate, RenderOptions
from dynamo.frontend.processors.template_sandbox import TemplateLimitExceeded, TemplateSandbox
from tests.support import wait_until_async
from tests.support.template_bombs import started_sandbox

TIMEOUT_S = 2.0
ONE = [{"role": "user", "content": "hi"}]
TEMPLATE = HfChatTemplate("{{ messages[0].content }}", {}, compiled=False)


@pytest.fixture
def sandbox():
    with started_sandbox(timeout_s=TIMEOUT_S) as sandbox:
        yield sandbox


def sandbox_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.endswith("template_sandbox")]


async def render_timed(sandbox: TemplateSandbox, model: str) -> tuple[object, float]:
    """What ``sandbox.render`` gave (the text, or the exception) and how long it took."""
    started = time.monotonic()
    try:
        outcome: object = await sandbox.render(model, TEMPLATE, ONE, RenderOptions())
    except TemplateLimitExceeded as exc:
        outcome = exc
    return outcome, time.monotonic() - started


def test_waiting_for_a_turn_then_a_free_process_is_one_deadline(sandbox, caplog):
    """The model's turn comes after 0.75 of the timeout and a process after 1.5 of it: the
    request is a 503 at the timeout (it used to wait the timeout once more for the process,
    and render)."""
    caplog.set_level(logging.WARNING)

    async def scenario():
        idle = sandbox._queue()
        share = sandbox.share
        assert share is not None
        held = [idle.get_nowait() for _ in range(sandbox.processes)]  # every process busy
        for _ in range(sandbox.per_model):  # and model a's renders all taken
            await share.acquire("a")

        def give_the_turn_back() -> None:
            for _ in range(sandbox.per_model):
                share.release("a")

        loop = asyncio.get_running_loop()
        loop.call_later(0.75 * TIMEOUT_S, give_the_turn_back)
        loop.call_later(1.5 * TIMEOUT_S, lambda: [idle.put_nowait(p) for p in held])
        outcome = await render_timed(sandbox, "a")
        # The processes back before the fixture closes them.
        await wait_until_async(lambda: idle.qsize() == sandbox.processes, deadline_s=TIMEOUT_S)
        return outcome

    outcome, waited = asyncio.run(asyncio.wait_for(scenario(), 10 * TIMEOUT_S))
    assert isinstance(outcome, TemplateLimitExceeded), outcome
    assert "`a`" in str(outcome) and "renders are busy" in str(outcome)
    assert TIMEOUT_S <= waited < 1.25 * TIMEOUT_S, waited
    lines = sandbox_lines(caplog)
    assert len(lines) == 1 and "Chat template of model a no render process was free" in lines[0]


def test_a_model_whose_renders_all_stay_busy_is_a_503_logged_once(sandbox, caplog):
    caplog.set_level(logging.WARNING)

    async def scenario():
        sandbox._queue()
        share = sandbox.share
        assert share is not None
        for _ in range(sandbox.per_model):  # model a's renders all taken, for good
            await share.acquire("a")
        first = await render_timed(sandbox, "a")
        second = await render_timed(sandbox, "a")
        for _ in range(sandbox.per_model):
            share.release("a")
        return first, second, await render_timed(sandbox, "a")

    (first, waited), (second, _), (fits, _) = asyncio.run(scenario())
    for outcome in (first, second):
        assert isinstance(outcome, TemplateLimitExceeded), outcome
        assert "`a`" in str(outcome) and "its renders are all busy" in str(outcome)
    assert TIMEOUT_S <= waited < 1.25 * TIMEOUT_S, waited
    assert fits == "hi"
    lines = sandbox_lines(caplog)
    # One line per cause a minute: the second 503 is held back.
    assert len(lines) == 1, lines
    assert "Chat template of model a every render process it may use stayed busy" in lines[0]
    assert "--dyn-template-timeout 2 s" in lines[0]


def test_no_free_process_is_a_503_logged_once(sandbox, caplog):
    caplog.set_level(logging.WARNING)

    async def scenario():
        idle = sandbox._queue()
        held = [idle.get_nowait() for _ in range(sandbox.processes)]
        outcomes = [await render_timed(sandbox, "a"), await render_timed(sandbox, "b")]
        for process in held:
            idle.put_nowait(process)
        return outcomes, await render_timed(sandbox, "a")

    outcomes, (fits, _) = asyncio.run(scenario())
    for (outcome, waited), model in zip(outcomes, "ab", strict=True):
        assert isinstance(outcome, TemplateLimitExceeded), outcome
        assert f"`{model}`" in str(outcome) and "the frontend's renders are busy" in str(outcome)
        assert TIMEOUT_S <= waited < 1.25 * TIMEOUT_S, waited
    assert fits == "hi"
    lines = sandbox_lines(caplog)
    assert len(lines) == 1, lines
    assert "Chat template of model a no render process was free" in lines[0]

"""A model whose template breached a render bound stays a suspect (issue 37): a render within
the bounds in between does not wash the mark off. The issue's attack, with real render
processes: two hostile models alternate a fast render with one past the time bound; once each
has breached the bound, a third model's request always finds a process."""

from __future__ import annotations

import asyncio

import pytest

from dynamo.frontend.processors.hf_processor import HfChatTemplate, RenderOptions
from dynamo.frontend.processors.template_sandbox import (
    SuspectMemory,
    TemplateLimitExceeded,
    TemplateSandbox,
)
from tests.support import wait_until_async
from tests.support.clock import FakeClock
from tests.support.template_bombs import started_sandbox

TIMEOUT_S = 2.0
ONE = [{"role": "user", "content": "hi"}]
TWO = [*ONE, {"role": "user", "content": "again"}]
# Fast for one message, past any time bound for two.
HOSTILE = HfChatTemplate(
    "{% if messages|length > 1 %}{% for i in range(100000) %}{% for j in range(100000) %}"
    "{% endfor %}{% endfor %}{% endif %}[{{ messages[0].content }}]",
    {},
    compiled=False,
)
HEALTHY = HfChatTemplate("<{{ messages[-1].content }}>", {}, compiled=False)


def test_a_suspect_stays_one_until_its_memory_has_passed_since_its_last_breach():
    clock = FakeClock()
    suspects = SuspectMemory(memory_s=600.0, capacity=2, clock=clock)
    suspects.mark("a")
    clock.advance(599.0)
    assert "a" in suspects
    suspects.mark("a")  # breached again: remembered from now
    clock.advance(599.0)
    assert "a" in suspects and "b" not in suspects
    clock.advance(1.0)
    assert "a" not in suspects
    for model in "bcd":
        suspects.mark(model)
    assert "b" not in suspects and "c" in suspects and "d" in suspects  # at most 2 kept


async def render(sandbox: TemplateSandbox, model: str, template, messages) -> object:
    try:
        return await sandbox.render(model, template, messages, RenderOptions())
    except TemplateLimitExceeded as exc:
        return exc


@pytest.fixture
def sandbox():
    with started_sandbox(timeout_s=TIMEOUT_S) as sandbox:
        yield sandbox


def test_alternating_fast_and_slow_renders_does_not_wash_the_mark_off(sandbox):
    async def scenario() -> list[object]:
        sandbox._queue()
        share = sandbox.share
        assert share is not None
        # Each hostile model breaches the bound once, then renders fast (which used to clear
        # its mark).
        for model in ("hostile-a", "hostile-b"):
            assert isinstance(await render(sandbox, model, HOSTILE, TWO), TemplateLimitExceeded)
            assert await render(sandbox, model, HOSTILE, ONE) == "[hi]"
        healthy: list[object] = []
        for _ in range(2):  # the attack, twice: both slow at once, then fast again
            slow = [
                asyncio.ensure_future(render(sandbox, model, HOSTILE, TWO))
                for model in ("hostile-a", "hostile-b")
            ]
            # Both suspects share one process: one renders, the other waits its turn.
            await wait_until_async(
                lambda: share.busy == 1 and share.waiting == 1, deadline_s=TIMEOUT_S
            )
            healthy.append(await render(sandbox, "healthy", HEALTHY, ONE))
            assert not all(task.done() for task in slow)  # it did not wait for them
            assert all(isinstance(r, TemplateLimitExceeded) for r in await asyncio.gather(*slow))
            for model in ("hostile-a", "hostile-b"):
                assert await render(sandbox, model, HOSTILE, ONE) == "[hi]"
        return healthy

    healthy = asyncio.run(asyncio.wait_for(scenario(), 20 * TIMEOUT_S))
    assert healthy == ["<hi>", "<hi>"]
    assert "hostile-a" in sandbox.suspects and "hostile-b" in sandbox.suspects
    assert "healthy" not in sandbox.suspects
